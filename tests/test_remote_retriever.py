"""retriever=remote against rag_lab.serve's retrieval endpoint: the same hits as the in-process retriever,
and one line (never a traceback or a hang) when the server is not there, dies or hangs."""

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
from omegaconf import OmegaConf

from rag_lab.core.config import ConfigError, build
from rag_lab.core.errors import RagLabError
from rag_lab.retrievers.remote import RemoteRetriever

from conftest import TINY_DATA, cli, free_port, retrieval_server


def batch(data) -> tuple[list[str], list[set[str]]]:
    """Test questions, an empty and a whitespace query, a query of unknown words; the first question's
    exclusions hold one of its own hits (found by the local retriever in the test)."""
    questions = [ex.question for ex in data.split("test")[:6]]
    return [*questions, "", "   ", "zzqx vvwk"], [set() for _ in range(len(questions) + 3)]


def served(tiny_cfg, data, *overrides: str):
    """The local retriever of ``overrides`` (its config as the server resolves it) over the run's corpus."""
    cfg = tiny_cfg(*overrides)
    config = OmegaConf.to_container(cfg.retriever, resolve=True)
    return build(cfg.retriever, corpus=data.corpus), config


def assert_same_hits(tiny_cfg, data, local, config, *client_overrides: str) -> None:
    queries, exclude = batch(data)
    first = local.search(queries[:1], 3)[0]
    exclude[0] = {first[1].id}
    with retrieval_server(local, config, data.corpus) as (url, _):
        remote = build(tiny_cfg("retriever=remote", f"retriever.url={url}", *client_overrides).retriever,
                       corpus=data.corpus)  # fmt: skip
        assert isinstance(remote, RemoteRetriever)
        for k, skip in [(5, exclude), (3, None), (0, None)]:
            want = local.search(queries, k, skip)
            assert remote.search(queries, k, skip) == want  # ids, order and scores, exactly
        got = remote.search(queries, 5, exclude)
    assert [h.id for h in got[0]] == [h.id for h in local.search(queries[:1], 6)[0] if h.id != first[1].id]
    assert all(got[i] for i in range(6)) and got[6] == got[7] == []


def test_remote_bm25_gives_the_in_process_hits(tiny_cfg, data):
    local, config = served(tiny_cfg, data)
    assert_same_hits(tiny_cfg, data, local, config)


def test_remote_dense_gives_the_in_process_hits(tiny_cfg, data, tiny_encoder_dir):
    """The dense retriever (a tiny BERT, a faiss Flat index read with mmap from the cache), served; the run
    names it with retriever.serves."""
    encoder = f"retriever.encoder.model={tiny_encoder_dir}"
    # the tiny BERT reads 64 positions
    local, config = served(tiny_cfg, data, "retriever=minilm", encoder, "retriever.encoder.max_length=64",
                           "+retriever.show_progress=false")  # fmt: skip
    serves = ["retriever@retriever.serves=minilm", f"retriever.serves.encoder.model={tiny_encoder_dir}",
              "retriever.serves.encoder.max_length=64"]  # fmt: skip
    assert_same_hits(tiny_cfg, data, local, config, *serves)


def test_unreachable_server_stops_the_run_before_anything_in_one_line(capfd, monkeypatch, tmp_path, tiny_cfg):
    url = f"http://127.0.0.1:{free_port()}"
    line = rf"retriever.url'?: the retrieval server at {url} does not answer \(.*refused.*\): start it"
    with pytest.raises(ConfigError, match=line):  # at compose: before the runner launches anything
        tiny_cfg("retriever=remote", f"retriever.url={url}", "retriever.retries=0")
    args = [*TINY_DATA, "retriever=remote", f"retriever.url={url}", "retriever.backoff_s=0.01",
            "policy=standard_rag", "generator=teacher", f"hydra.run.dir={tmp_path / 'run'}"]  # fmt: skip
    rc, out = cli("run", args, capfd, monkeypatch)
    assert rc == 1 and "Traceback" not in out
    assert re.fullmatch(rf"error: config '{line}.*python -m rag_lab\.serve retriever=.*\n", out)
    assert not (tmp_path / "run" / "config.yaml").exists()  # the run dir was never prepared


def test_server_killed_mid_run_is_one_line(tiny_cfg, data):
    local, config = served(tiny_cfg, data)
    queries, _ = batch(data)
    with retrieval_server(local, config, data.corpus) as (url, server):
        remote = RemoteRetriever(data.corpus, url, serves=config, retries=1, backoff_s=0.01)
        assert remote.search(queries, 2) == local.search(queries, 2)
        server.shutdown()
        server.server_close()
        with pytest.raises(RagLabError) as e:
            remote.search(queries, 2)
    assert re.fullmatch(rf"retriever\.url: the retrieval server at {url} stopped answering \(.*\): start .*",
                        str(e.value))  # fmt: skip


def test_a_stuck_server_times_out():
    """A server that takes the connection and never answers: the timeout ends each try."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()  # the kernel completes the handshake; nobody reads or answers
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        start = time.monotonic()
        with pytest.raises(RagLabError, match=r"does not answer \(timed out; 1 retries, timeout 0.3 s\)"):
            RemoteRetriever(None, url, timeout_s=0.3, retries=1, backoff_s=0.01)
        assert time.monotonic() - start < 5


def test_another_retriever_or_corpus_on_the_server_is_refused(tiny_cfg, data):
    local, config = served(tiny_cfg, data, "retriever.k1=1.2")
    with retrieval_server(local, config, data.corpus) as (url, _):
        with pytest.raises(
            ConfigError, match=r"config 'retriever\.serves\.k1': the server has 1\.2, the run 1\.5"
        ):
            tiny_cfg("retriever=remote", f"retriever.url={url}")
        with pytest.raises(RagLabError, match=r"retriever\.serves\.k1: the server has 1\.2, the run 1\.5"):
            RemoteRetriever(data.corpus, url, serves={**config, "k1": 1.5})
        fewer = type(data.corpus)(data.corpus.ids[:-1], data.corpus.titles[:-1], data.corpus.texts[:-1])
        with pytest.raises(RagLabError, match=rf"searches another corpus \({len(fewer) + 1} passages"):
            RemoteRetriever(fewer, url, serves=config)
        # a cache dir of its own on the server (another machine) is the same retriever
        assert RemoteRetriever(data.corpus, url, serves={**config, "cache_dir": "/elsewhere"}).served


def test_bad_url_and_a_server_without_retrieval(data):
    with pytest.raises(RagLabError, match=r"retriever\.url: 'localhost:8000' is not an http\(s\) URL"):
        RemoteRetriever(data.corpus, "localhost:8000")
    with retrieval_server(None, {}, data.corpus) as (url, _):  # a generation-only server
        with pytest.raises(RagLabError, match=r"/v1/retriever answered 404: no route /v1/retriever on this"):
            RemoteRetriever(data.corpus, url)


def test_a_real_server_process_killed_mid_run(tiny_cfg, data, repo_root):
    """``python -m rag_lab.serve retriever=bm25`` as a process of its own, SIGKILLed."""
    cmd = [sys.executable, "-m", "rag_lab.serve", "retriever=bm25", *TINY_DATA, "serve.port=0"]
    proc = subprocess.Popen(cmd, cwd=repo_root, stderr=subprocess.PIPE, text=True, env=os.environ)
    try:
        url = None
        for line in proc.stderr:
            if m := re.search(
                r"serving retrieval \(BM25Retriever over \d+ passages\) at (http://\S+) ", line
            ):
                url = m.group(1)
                break
        assert url, "the server did not start"
        local, _ = served(tiny_cfg, data)
        remote = build(tiny_cfg("retriever=remote", f"retriever.url={url}").retriever, corpus=data.corpus)
        queries, _ = batch(data)
        assert remote.search(queries, 4) == local.search(queries, 4)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        remote.client.backoff_s = 0.01
        with pytest.raises(
            RagLabError, match=rf"^retriever\.url: the retrieval server at {url} stopped answer"
        ):
            remote.search(queries, 4)
    finally:
        proc.kill()
        proc.wait(timeout=30)
