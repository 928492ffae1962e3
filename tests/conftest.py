"""Shared fixtures: every cache, wandb and matplotlib file goes under pytest's tmp dirs; offline."""

import contextlib
import logging
import os
import re
import runpy
import sys
import threading
import warnings
from pathlib import Path

import pytest
import torch

import rag_lab.policies  # noqa: F401  (registers the demonstration policies, as every command does)
from rag_lab.core.config import compose

# A world small enough for a sub-second end-to-end run.
TINY_DATA = [
    "data.n_people=60",
    "data.n_cities=12",
    "data.n_countries=4",
    "data.n_films=20",
    "data.dev_size=20",
    "data.test_size=40",
    "data.judge_size=40",
]


@pytest.fixture(scope="session", autouse=True)
def _isolated_env(tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("env")
    os.environ["RAG_LAB_CACHE"] = str(root / "cache")
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ["MPLCONFIGDIR"] = str(root / "mpl")
    # every test's run runs (eval.reuse would copy an identical earlier run's results); tests of reuse set it
    os.environ["RAG_LAB_REUSE"] = "false"
    os.environ.pop("WANDB_API_KEY", None)
    for var in ["WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR"]:
        os.environ[var] = str(root / var.lower())


@pytest.fixture(scope="session", autouse=True)
def _teacher_demonstrations_once_per_world():
    """The world teacher's and the generalist's demonstrations (:func:`rag_lab.train.demonstrations.collect`:
    a deterministic function of the world, the questions, ``k``, ``iterations``, the habits and the seed)
    rolled out once per worker and world:
    every test that trains the tiny LM into its own ``cache_dir`` would otherwise roll them out again
    (~11 s each on the tiny world). The first call runs the real rollouts; a test's recipe still writes
    and reads its own demonstrations cache."""
    import copy
    import json

    from rag_lab.env.teacher.generalist import GeneralistTeacher
    from rag_lab.env.teacher.generator import TeacherGenerator
    from rag_lab.train import demonstrations

    real, memo = demonstrations.collect, {}

    def collect(teacher, corpus, retriever, questions, k=3, iterations=6, batch_size=256):
        if type(teacher) not in (TeacherGenerator, GeneralistTeacher) or any(teacher.noise.__dict__.values()):
            return real(teacher, corpus, retriever, questions, k, iterations, batch_size)
        key = (corpus.fingerprint, json.dumps(demonstrations.question_keys(questions)), k, iterations,
               type(retriever).__name__, repr(getattr(teacher, "habits", None)), teacher.seed)  # fmt: skip
        if key not in memo:
            memo[key] = real(teacher, corpus, retriever, questions, k, iterations, batch_size)
        return copy.deepcopy(memo[key])

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(demonstrations, "collect", collect)
        yield


# A tiny LM that trains in seconds (generator=tiny's real code path, toy sizes).
TINY_LM = [
    "generator.hidden=16",
    "generator.layers=1",
    "generator.heads=2",
    "generator.kv_heads=1",
    "generator.intermediate=32",
    "generator.max_length=512",
    "generator.epochs=0.1",
    "generator.batch_size=4",
    "generator.warmup_steps=1",
    "generator.words_per_protocol=300",
    "generator.reading_batch_size=4",
    # no chain stage unless a test asks for one (it rolls the teacher out over every training question)
    "generator.chain_steps=0",
    "generator.generalist_steps=0",
]


@pytest.fixture
def tiny_cfg():
    """Compose the real config tree on the tiny world (and the toy tiny LM when the config uses
    generator=tiny); extra overrides as arguments."""

    def make(*overrides: str):
        other_data = any(o.startswith("data=") and o != "data=synth" for o in overrides)
        cfg = compose([*([] if other_data else TINY_DATA), *overrides])
        toy = []
        if cfg.generator and cfg.generator._target_ == "rag_lab.train.tiny.generator.tiny_lm":
            # The recipe's reading and protocol stages shrink too; what the test sets wins.
            toy = [*TINY_LM, *(["generator.reading_steps=4"] if cfg.generator.reading_steps else []),
                   *(["generator.tune_steps=2"] if cfg.generator.get("tune_steps") else [])]  # fmt: skip
        if cfg.get("policy") and cfg.policy.get("heldout"):
            # a trained policy's held-out curve on 4 dev questions, not 64 (tests of it set their own)
            toy.append("policy.heldout.n=4")
        keys = {o.split("=", 1)[0] for o in overrides}
        toy = [o for o in toy if o.split("=", 1)[0] not in keys]
        if toy:
            cfg = compose([*([] if other_data else TINY_DATA), *toy, *overrides])
        return cfg

    return make


WORDS = "Q : A S D where was ada born paris london city <search> </search> <answer> </answer> user assistant"
WORDS = WORDS.split()
CHAT = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant : {% endif %}"
)


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    path = tmp_path_factory.mktemp("tiny-lm")
    vocab = {w: i for i, w in enumerate(["<pad>", "<eos>", "<unk>", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    fast.chat_template = CHAT
    # Saved apart from the model: next to a qwen2 config, AutoTokenizer would pick Qwen2's byte-level
    # tokenizer class and lose this word-level decoder.
    fast.save_pretrained(path / "tokenizer")
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
                         eos_token_id=1, pad_token_id=0, tie_word_embeddings=True)  # fmt: skip
    Qwen2ForCausalLM(config).save_pretrained(path)
    return str(path)


# The tiny BERT encoder's vocabulary (tests/test_dense.py, tests/test_remote_retriever.py).
ENCODER_WORDS = (
    "ada paris london city born film directed by was is a the in of query passage : who where".split()
)


@pytest.fixture(scope="session")
def tiny_encoder_dir(tmp_path_factory):
    """A tiny BERT encoder (16 wide, 2 layers, 64 positions) and its word-level vocabulary."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    path = tmp_path_factory.mktemp("tiny-bert")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *ENCODER_WORDS]
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tokenizer = BertTokenizerFast(vocab=str(path / "vocab.txt"))
    # transformers 5 ignores `vocab_file=`: every word became [UNK] and the encoder saw only lengths
    assert tokenizer.tokenize("Ada was born in London.") == ["ada", "was", "born", "in", "london", "[UNK]"]
    tokenizer.save_pretrained(path)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=64)  # fmt: skip
    BertModel(config).save_pretrained(path)
    return str(path)


@pytest.fixture
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def one_thread():
    """Toy models train 50x faster on one thread than on two when another job holds a core (OpenMP's
    threads wait on each other). Modules that train take it with ``pytestmark``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def data():
    """The tiny world (``TINY_DATA``), loaded once per module (a module may define its own)."""
    from hydra.utils import instantiate

    return instantiate(compose(TINY_DATA).data)


def untrained_tiny_lm(data, protocols: tuple[str, ...], path: Path, special_tokens=()) -> Path:
    """An untrained toy tiny LM (16 wide, 1 layer) whose word-level vocabulary covers the corpus and the
    teacher's demonstrations of ``protocols``."""
    from rag_lab.retrievers.bm25 import BM25Retriever
    from rag_lab.train.cold_start import ColdStartConfig
    from rag_lab.train.demonstrations import sample_demonstrations
    from rag_lab.train.tiny.model import TinyConfig
    from rag_lab.train.tiny.trainer import train_tiny_lm

    demos = ColdStartConfig(protocols=protocols, limit=4, temperatures=(0.0,))
    pairs = sample_demonstrations(data, demos, BM25Retriever(data.corpus)).pairs
    config = TinyConfig(hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32, max_length=512,
                        sft_steps=0)  # fmt: skip
    return train_tiny_lm([p.contents for p in data.corpus], pairs, config, path, special_tokens)


class Killed(Exception):
    """A training killed on purpose (by :class:`KillAt`), to test the resume."""


def kill_at(step: int = 1):
    """A Trainer callback that raises :class:`Killed` when the checkpoint of ``step`` was saved."""
    from transformers import TrainerCallback

    class KillAt(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.global_step == step:
                raise Killed

    return KillAt()


def killed_run(overrides: list[str], run_dir: Path, ready: str, root: Path, timeout_s: float = 600) -> None:
    """``python -m rag_lab.run *overrides`` in a process of its own, killed with SIGKILL (it, ``accelerate
    launch`` and every training process under it: torch's elastic agent starts each in a session of its own,
    so the runner's process group does not hold them) once a file matching the glob ``ready`` exists under
    ``root``; returns when all are gone."""
    import signal
    import subprocess
    import time

    import psutil

    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parent.parent),
                        "CUDA_VISIBLE_DEVICES": ""}  # fmt: skip
    command = [sys.executable, "-m", "rag_lab.run", *overrides, f"hydra.run.dir={run_dir}"]
    job = subprocess.Popen(command, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.time() + timeout_s
    while not list(root.glob(ready)):
        assert job.poll() is None and time.time() < deadline, f"the run ended before {ready} was written"
        time.sleep(0.2)
    tree = [psutil.Process(job.pid), *psutil.Process(job.pid).children(recursive=True)]
    for process in tree:
        process.send_signal(signal.SIGKILL)
    job.wait()
    _, alive = psutil.wait_procs(tree, timeout=30)
    assert all(p.status() == psutil.STATUS_ZOMBIE for p in alive), alive


def cli(module: str, args: list[str], capfd, monkeypatch, cwd=None, env=None) -> tuple[int, str]:
    """Run ``python -m rag_lab.<module> *args`` in this process, ``__main__`` and all, in ``cwd`` with
    ``env``'s variables set; (exit status, stdout + stderr). The same command as a subprocess, less the
    interpreter's start and its imports (5 s each); tests that need a process of their own (a kill, two
    processes at once) start one."""
    with monkeypatch.context() as patch:
        patch.setattr(sys, "argv", [f"rag_lab.{module}", *args])
        patch.delenv("HYDRA_FULL_ERROR", raising=False)
        for key, value in (env or {}).items():
            patch.setenv(key, str(value))
        if cwd is not None:
            patch.chdir(cwd)
        # each command starts with the logging of a fresh process: a Hydra run's handlers hold the stream
        # of the row that made them, closed once that row ends
        patch.setattr(logging.root, "handlers", [])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # runpy: the module is imported already
            try:
                runpy.run_module(f"rag_lab.{module}", run_name="__main__", alter_sys=False)
                rc = 0
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    out, err = capfd.readouterr()
    return rc, out + err


# Tests of 5 s or more (pytest --durations), started first: xdist's workers then share the short ones that
# remain, and the suite does not end waiting on one long test that started last.
LONG_FIRST = [
    "test_data_parallel.py",
    "test_launch_settings.py::test_every_launch_setting_reaches_the_launched_processes",
    "test_launchers.py",
    "test_tiny_world.py::test_tiny_lm_trains_once_and_runs_a_policy",
    "test_stoprag.py::test_a_killed_fit_resumes_to_the_uninterrupted_numbers",
    "test_serve_openai.py",
    "test_tiny_world.py",
    "test_stop_transfer.py",
    "test_evorag.py::test_a_killed_cycle_resumes_to_the_uninterrupted_numbers",
]


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        name = item.nodeid.rsplit("/", 1)[-1]
        return next((i for i, first in enumerate(LONG_FIRST) if name.startswith(first)), len(LONG_FIRST))

    items.sort(key=rank)  # stable: the rest keep their order


@contextlib.contextmanager
def retrieval_server(retriever, config: dict, corpus):
    """``rag_lab.serve``'s retrieval server over a built ``retriever`` (its resolved ``config``) on a free
    port, served from a thread of this process: (its URL, the server)."""
    from rag_lab.serve import Server, retriever_info

    server = Server(None, "", "127.0.0.1", 0, retriever, retriever_info(config, corpus))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def free_port() -> int:
    """A port of 127.0.0.1 with nobody listening."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def launch_port() -> int:
    """A free port for a launched job's rendezvous, where a test must name one (the nodes of a Slurm job
    meet at node 0's). A launch on one machine that names none takes a free port of its own
    (``rag_lab.runner.launch.Launch.write_config``: accelerate's ``main_process_port: 0``), so no launched or
    sharded test fixes a port: two test runs at once on one machine never meet on one."""
    return free_port()


METHOD_PAGES = Path(__file__).resolve().parents[1] / "docs" / "methods"


def logged_metrics(page: str) -> list[str]:
    """The keys that a method page's "Logged metrics" section documents: the backquoted names in the first
    cell of each row of its tables (``<name>`` stands for one path segment: ``rewards/<name>/mean``)."""
    section = (
        page.split("\n## Logged metrics\n", 1)[-1].split("\n## ", 1)[0]
        if "\n## Logged metrics\n" in page
        else ""
    )
    keys = []
    for line in section.splitlines():
        cells = line.split("|")
        if line.startswith("|") and len(cells) > 2 and not set(cells[1].strip()) <= set("-: "):
            keys += re.findall(r"`([^`]+)`", cells[1])
    return keys


def undocumented_metrics(method: str, rows: list[dict], page: str | None = None) -> list[str]:
    """The keys of ``rows`` (a training log: ``train_log.jsonl``'s rows, what the logger gets) that the
    "Logged metrics" section of ``docs/methods/<method>.md`` (or ``page``, its text) does not document."""
    text = page if page is not None else (METHOD_PAGES / f"{method}.md").read_text()
    patterns = [
        re.compile("[^/]+".join(map(re.escape, re.split(r"<[^>]+>", k))) + "$") for k in logged_metrics(text)
    ]
    keys = sorted({k for row in rows for k in row})
    return [k for k in keys if not any(p.match(k) for p in patterns)]
