"""The openai backend against a real ``rag_lab.serve`` subprocess around the tiny hf model."""

import json
import re
import subprocess
import sys
import urllib.request

import pytest

from rag_lab.core.errors import RagLabError
from rag_lab.generators.base import Sampling
from rag_lab.generators.hf import HFGenerator
from rag_lab.generators.openai import OpenAIGenerator


@pytest.fixture(scope="module")
def server(tiny_lm, repo_root_module):
    cmd = [
        sys.executable,
        "-m",
        "rag_lab.serve",
        "generator=hf",
        f"generator.model={tiny_lm}",
        f"generator.tokenizer={tiny_lm}/tokenizer",
        "serve.port=0",
        "serve.model_name=tiny",
    ]
    proc = subprocess.Popen(cmd, cwd=repo_root_module, stderr=subprocess.PIPE, text=True)
    url = None
    for line in proc.stderr:
        if m := re.search(r"serving tiny on (http://\S+/v1)", line):
            url = m.group(1)
            break
    assert url, "the server did not start"
    yield url
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def repo_root_module():
    from pathlib import Path

    return Path(__file__).resolve().parent.parent


def test_models_endpoint(server):
    with urllib.request.urlopen(server + "/models", timeout=10) as r:
        assert json.loads(r.read())["data"][0]["id"] == "tiny"


def test_openai_backend_matches_the_local_backend(server, tiny_lm):
    local = HFGenerator(tiny_lm, tokenizer=f"{tiny_lm}/tokenizer")
    remote = OpenAIGenerator(base_url=server, model="tiny", concurrency=2)
    prompts = ["Q : where was ada born", [{"role": "user", "content": "paris"}], "Q : paris"]
    greedy = Sampling(max_new_tokens=8)
    assert [[c.text for c in cs] for cs in remote.generate(prompts, greedy)] == [
        [c.text for c in cs] for cs in local.generate(prompts, greedy)
    ]
    sampled = remote.generate(["Q : paris"], Sampling(n=3, temperature=1.0, max_new_tokens=5, seed=2))
    assert len(sampled[0]) == 3


def test_refused_connection_is_one_error_after_retries():
    import socket

    with socket.socket() as s:  # a port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gen = OpenAIGenerator(base_url=f"http://127.0.0.1:{port}/v1", max_retries=2, backoff=0.01, timeout=5)
    with pytest.raises(
        RagLabError, match=rf"endpoint http://127.0.0.1:{port}/v1/completions unreachable after 2 retries"
    ):
        gen.generate(["hello"], Sampling())
