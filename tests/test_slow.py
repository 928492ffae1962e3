"""The slow set (`make test-slow`): every experiment smoke-run on the tiny world; notebooks executed. The
paper setups' two training steps on SmolLM2 are also the ``gpu`` set's (``make test-gpu``): on CUDA they
train there in bf16."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from rag_lab.core.config import compose, group_options
from rag_lab.run import run

from conftest import TINY_DATA, TINY_LM

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


# A trained policy's smallest run: a couple of steps, a few questions (DAPO: cold start and RL; APEX:
# planner RL and executor SFT).
SHORT_TRAINING = {
    "rag_lab.policies.dapo.policy.DAPO": [
        "policy.steps=1",
        "policy.questions_per_step=1",
        "policy.group_size=2",
        "policy.max_new_tokens=16",
        "policy.cold_start.limit=4",
        "policy.cold_start.max_steps=2",
        "eval.limit=4",
    ],
    "rag_lab.policies.evorag.policy.EvoRAG": [
        "policy.max_cycles=1",
        "policy.questions_per_cycle=2",
        "policy.states_per_episode=1",
        "policy.dev_limit=2",
        "policy.max_turns=3",
        "policy.max_new_tokens=16",
        "policy.cold_start.limit=4",
        "policy.cold_start.max_steps=2",
        "eval.limit=4",
    ],
    "rag_lab.policies.r3rag.policy.R3RAG": [
        "policy.ppo.iterations=1",
        "policy.ppo.batch_size=2",
        "policy.ppo.temperatures=[1.0]",
        "policy.ppo.minibatches=1",
        "policy.max_new_tokens=16",
        "policy.cold_start.limit=4",
        "policy.cold_start.max_steps=2",
        "eval.limit=4",
    ],
    "rag_lab.policies.apex.policy.APEX": [
        "policy.planner.train_limit=2",
        "policy.planner.questions_per_step=1",
        "policy.planner.group_size=2",
        "policy.planner.epochs=1",
        "policy.planner.max_new_tokens=16",
        "policy.executor.limit=4",
        "policy.executor.max_steps=2",
        "eval.limit=4",
    ],
}


def to_target(cfg, override: str) -> str | None:
    """``policy.cold_start.limit=4`` as ``experiment.cold_start.limit=4`` where the experiment sets
    ``policy.cold_start: ${experiment.cold_start}`` (an override below the interpolation would replace it)."""
    key, _, value = override.partition("=")
    parent, _, rest = key.rpartition(".")
    node, _, name = parent.rpartition(".")
    if OmegaConf.select(cfg, parent, default="absent") is None:
        return None  # the experiment sets the node to null (dapo_synth: no cold start): nothing to shorten
    holder = OmegaConf.select(cfg, node) if node else cfg
    if holder is None or name not in holder or not OmegaConf.is_interpolation(holder, name):
        return override
    target = holder._get_node(name)._value().removeprefix("${").removesuffix("}")
    return f"{target}.{rest}={value}"


@pytest.mark.slow
@pytest.mark.parametrize("name", group_options("experiment"))
def test_experiment_smoke(name, tiny_cfg, tmp_path):
    cfg = compose([f"experiment={name}"])
    if cfg.generator and cfg.generator._target_.endswith("VLLMGenerator"):
        pytest.skip("the paper's configuration: needs a GPU, vLLM and the dataset files")
    if not cfg.data._target_.endswith("SynthDataset"):
        pytest.skip("the paper's configuration: needs the dataset files and the hub models")
    if cfg.eval.split == "judge":
        pytest.skip("the claims' judgement: only make claims touches the judge split")
    cfg = tiny_cfg(
        f"experiment={name}",
        *filter(None, [to_target(cfg, o) for o in SHORT_TRAINING.get(cfg.policy._target_, [])]),
    )
    metrics = run(cfg, tmp_path)
    assert metrics["all"]["n"] > 0


# A paper experiment run here: the world for its data set, SmolLM2 with transformers for its hub model on
# vLLM (smollm2 takes neither the model nor the engine's keys), BM25 for its dense retriever, the world's
# train split.
PAPER_SETUP_ON_SMOLLM2 = [
    "data=synth",
    *TINY_DATA,
    "generator=smollm2",
    "~generator.model",
    "~generator.train_mode",
    "~generator.train_memory",
    "~generator.sleep",
    "retriever=bm25",
    "train_data=null",
]


def trained_where_it_should(train_json: Path) -> None:
    """On CUDA a stage trains there in bf16 (the trainers' default where a GPU has it); on CPU in float32."""
    stats = json.loads(train_json.read_text())
    cuda = torch.cuda.is_available()
    assert stats["device"].startswith("cuda" if cuda else "cpu") and stats["bf16"] == (
        cuda and torch.cuda.is_bf16_supported()
    )


@pytest.mark.slow
@pytest.mark.gpu
def test_dapo_paper_setup_trains_smollm2(tmp_path):
    """dapo_2wiki's trainer (G, lr, stages, rewards) on SmolLM2, the world for 2Wiki, BM25 for E5 and
    MiniLM for Qwen3-Embedding (no downloads here): two DAPO steps, then an evaluation."""
    cfg = compose(
        [
            "experiment=dapo_2wiki",
            *PAPER_SETUP_ON_SMOLLM2,
            "reward.search.encoder.model=sentence-transformers/all-MiniLM-L6-v2",
            "policy.stages=[1]",
            "policy.steps=2",
            "policy.questions_per_step=1",
            "policy.group_size=2",
            "policy.max_new_tokens=24",
            "policy.max_turns=2",
            "eval.limit=2",
            f"cache_dir={tmp_path / 'cache'}",
        ]
    )
    assert cfg.policy.group_size == 2 and cfg.policy.lr == 1e-6 and cfg.policy.cold_start is None
    metrics = run(cfg, tmp_path / "run")
    assert metrics["all"]["n"] == 2
    rows = [json.loads(line) for line in (tmp_path / "run" / "checkpoints" / "train_log.jsonl").open()]
    assert [r["step"] for r in rows] == [1, 2] and all(math.isfinite(r["loss"]) for r in rows)
    [stage] = (tmp_path / "cache" / "dapo").glob("*/train.json")
    trained_where_it_should(stage)


@pytest.mark.slow
@pytest.mark.gpu
def test_apex_paper_setup_trains_smollm2_planner(tmp_path):
    """apex_musique's planner RL (SEPR, KL, entropy bonus) on SmolLM2, the world's gold plans for
    MuSiQue's, BM25 for E5 (no downloads here): two GRPO steps on plans, then an evaluation with SEPR."""
    cfg = compose(
        [
            "experiment=apex_musique",
            *PAPER_SETUP_ON_SMOLLM2,
            "policy.teacher=null",
            "policy.executor_sft=false",
            "policy.planner.train_limit=2",
            "policy.planner.questions_per_step=1",
            "policy.planner.group_size=2",
            "policy.planner.max_new_tokens=32",
            "policy.planner.epochs=1",
            "policy.max_new_tokens=32",
            "policy.hops=1",
            "eval.limit=2",
            f"cache_dir={tmp_path / 'cache'}",
        ]
    )
    assert cfg.policy.planner.beta == 0.001 and cfg.policy.planner.entropy_coef == 0.001
    metrics = run(cfg, tmp_path / "run")
    assert metrics["all"]["n"] == 2 and metrics["all"]["sepr"] is not None
    rows = [json.loads(line) for line in (tmp_path / "run" / "checkpoints" / "train_log.jsonl").open()]
    assert [r["step"] for r in rows] == [1, 2] and all(math.isfinite(r["loss"]) for r in rows)
    [planner] = (tmp_path / "cache" / "apex_planner").glob("*/train.json")
    trained_where_it_should(planner)


@pytest.mark.slow
@pytest.mark.gpu
def test_evorag_paper_setup_trains_smollm2(tmp_path):
    """evorag_hotpotqa's trainer (DPO beta, lr, accumulation, LoRA, T_max, margins) on SmolLM2, the world
    for HotpotQA, BM25 for the RRF of BM25 and BGE, MiniLM for the preference model's encoder and the
    data set's flag for the verifier (no downloads, no endpoint here): one Discovery cycle of a few DPO
    steps, then an evaluation."""
    cfg = compose(
        [
            "experiment=evorag_hotpotqa",
            *PAPER_SETUP_ON_SMOLLM2,
            "reward.refusal=flag",
            "reward.verifier=null",
            "policy.preference.encoder=sentence-transformers/all-MiniLM-L6-v2",
            "policy.stages=[1]",
            "policy.max_cycles=1",
            "policy.questions_per_cycle=2",
            "policy.states_per_episode=1",
            "policy.dev_limit=2",
            "policy.batch_size=1",
            "policy.grad_accum=1",
            "policy.max_turns=2",
            "policy.max_new_tokens=24",
            "eval.limit=2",
            f"cache_dir={tmp_path / 'cache'}",
        ]
    )
    assert cfg.policy.lr == 5e-6 and cfg.policy.beta == 0.1 and cfg.policy.cold_start is None
    metrics = run(cfg, tmp_path / "run")
    assert metrics["all"]["n"] == 2
    rows = [json.loads(line) for line in (tmp_path / "run" / "checkpoints" / "train_log.jsonl").open()]
    losses = [r["loss"] for r in rows if "loss" in r]
    assert losses and all(math.isfinite(x) for x in losses)
    [cycle] = (tmp_path / "cache" / "evorag").glob("*/cycle.json")
    assert json.loads(cycle.read_text())["branch/pairs_dpo"] > 0
    trained_where_it_should(cycle)


@pytest.mark.slow
@pytest.mark.gpu
def test_r3rag_paper_setup_trains_smollm2(tmp_path):
    """r3rag_hotpotqa's PPO (lrs, batch, a separate critic, KL, GAE, documents cut to 512 characters) on
    SmolLM2, the world for HotpotQA, BM25 for E5 and the gold-support overlap and exact match for the
    Qwen2.5-14B judges (no downloads, no endpoint here): two PPO iterations, then an evaluation."""
    cfg = compose(
        [
            "experiment=r3rag_hotpotqa",
            *PAPER_SETUP_ON_SMOLLM2,
            "reward.process=support",
            "reward.outcome_judge=false",
            "reward.judge_generator=null",
            "policy.ppo.iterations=2",
            "policy.ppo.batch_size=2",
            "policy.ppo.temperatures=[1.0]",
            "policy.ppo.micro_batch=2",
            "policy.max_turns=2",
            "policy.max_new_tokens=24",
            "eval.limit=2",
            f"cache_dir={tmp_path / 'cache'}",
        ]
    )
    ppo = cfg.policy.ppo
    assert (ppo.actor_lr, ppo.critic_lr, ppo.critic, ppo.max_doc_chars) == (5e-7, 9e-6, "separate", 512)
    metrics = run(cfg, tmp_path / "run")
    assert metrics["all"]["n"] == 2
    rows = [json.loads(line) for line in (tmp_path / "run" / "checkpoints" / "train_log.jsonl").open()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r[k]) for r in rows for k in ("loss/policy", "loss/value", "kl"))
    [trained] = (tmp_path / "cache" / "r3rag").glob("*/ppo.json")
    info = json.loads(trained.read_text())
    assert info["device"].startswith("cuda" if torch.cuda.is_available() else "cpu")
    assert info["dtype"] == "torch.float32"


@pytest.mark.slow
@pytest.mark.parametrize("generator", ["tiny", "teacher"])
def test_demo_sweep_points_run(generator, tmp_path):
    """One point of each of the demo's swept generators (its sweep is a Hydra multirun)."""
    extra = TINY_LM if generator == "tiny" else []
    cfg = compose(
        [
            "experiment=demo",
            *TINY_DATA,
            *extra,
            f"generator={generator}",
            "policy=llm_stop",
            "policy.iterations=2",
            "eval.limit=6",
            f"cache_dir={tmp_path}/cache",
        ]
    )
    assert run(cfg, tmp_path / "run")["all"]["n"] == 6


def toy_lm() -> list[str]:
    """generator=tiny's toy recipe (what the tiny_cfg fixture adds), for a sweep run as a subprocess."""
    generator = compose(["generator=tiny"]).generator
    return [
        *TINY_LM,
        *(["generator.reading_steps=4"] if generator.reading_steps else []),
        *(["generator.tune_steps=2"] if generator.get("tune_steps") else []),
    ]


COMPARE_SHORT = [
    "experiment.cold_start.limit=4",
    "experiment.cold_start.max_steps=2",
    "policy.iterations=2",
    "policy.max_new_tokens=16",
    "policy.questions_per_step=1",
    "policy.group_size=2",
    "policy.states_per_episode=1",
    "policy.max_turns=3",
    "policy.ppo.batch_size=2",
    "policy.ppo.temperatures=[1.0]",
    "policy.planner.questions_per_step=1",
    "policy.planner.group_size=2",
    "eval.limit=4",
]


# notebook -> (the variable naming its sweep, the sweep's overrides on the tiny world)
SWEEPS = {
    "stoprag.ipynb": ("RAG_LAB_STOPRAG", ["experiment=stoprag_synth", "policy.iterations=3", "seed=0,1"]),
    "dapo.ipynb": (
        "RAG_LAB_DAPO",
        ["experiment=dapo_synth", *toy_lm(), *SHORT_TRAINING["rag_lab.policies.dapo.policy.DAPO"]],
    ),
    "evorag.ipynb": (
        "RAG_LAB_EVORAG",
        ["experiment=evorag_synth", *toy_lm(), *SHORT_TRAINING["rag_lab.policies.evorag.policy.EvoRAG"]],
    ),
    "r3rag.ipynb": (
        "RAG_LAB_R3RAG",
        [
            "experiment=r3rag_synth",
            *toy_lm(),
            # the rows set ppo.iterations themselves (the ppo row: the default 8, on 2 questions each)
            *[o for o in SHORT_TRAINING["rag_lab.policies.r3rag.policy.R3RAG"] if "iterations" not in o],
            "experiment/r3rag_synth=cold_start,ppo",
        ],
    ),
    "apex.ipynb": (
        "RAG_LAB_APEX",
        ["experiment=apex_synth", *toy_lm(), *SHORT_TRAINING["rag_lab.policies.apex.policy.APEX"]],
    ),
    # every row of the comparison, each trained briefly: the rows set their own training lengths, and a
    # method's setting reaches only the rows whose policy has it (rag_lab/runner/sweeps.py)
    "compare.ipynb": ("RAG_LAB_COMPARE", ["experiment=compare_synth", *toy_lm(), *COMPARE_SHORT]),
}


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path, tmp_path, monkeypatch):
    run(compose(TINY_DATA), tmp_path / "runs" / "a")
    run(compose([*TINY_DATA, "policy.k=1"]), tmp_path / "runs" / "b")
    monkeypatch.setenv("RAG_LAB_RUNS", str(tmp_path / "runs"))
    if path.name in SWEEPS:  # a real (tiny) sweep of the paper's experiment for it to read
        variable, overrides = SWEEPS[path.name]
        sweep = tmp_path / "sweep"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "rag_lab.run",
                *TINY_DATA,
                *overrides,
                f"hydra.sweep.dir={sweep}",
                f"cache_dir={tmp_path / 'cache'}",
            ],
            check=True,
            cwd=path.parent.parent,
        )
        monkeypatch.setenv(variable, str(sweep))
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(path, as_version=4)
    assert all(not cell.get("outputs") for cell in nb.cells if cell.cell_type == "code"), (
        "stored with outputs"
    )
    nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    ).execute()
    assert os.environ["RAG_LAB_RUNS"]
