"""EVO-RAG's training on a toy tiny LM: DPO with LoRA moves only the adapters' weights and raises the
preferred action's log-ratio; a killed cycle resumes to the uninterrupted numbers; the curriculum's stall
rule; the cycle's cache key; bad settings; the paper setup."""

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from test_evorag_rewards import Toy

from rag_lab.core.config import ConfigError, compose
from rag_lab.core.errors import RagLabError
from rag_lab.core.records import read_records
from rag_lab.env import Env
from rag_lab.env.protocols.base import State
from rag_lab.env.protocols.evorag import EVORAGStep
from rag_lab.generators.hf import HFGenerator
from rag_lab.policies.evorag.curriculum import best, stalled
from rag_lab.policies.evorag.dpo import dpo_epoch, sequence_logprob
from rag_lab.policies.evorag.policy import EvoRAG, PreferenceSettings
from rag_lab.retrievers.bm25 import BM25Retriever
from rag_lab.rewards.evorag import EvoRAGReward
from rag_lab.train.lora import LoRA
from rag_lab.train.resume import load_model

from conftest import Killed, kill_at, undocumented_metrics, untrained_tiny_lm

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def base(data, tmp_path_factory) -> Path:
    """An untrained toy tiny LM whose word-level vocabulary covers the corpus and the evorag protocol."""
    return untrained_tiny_lm(data, ("evorag",), tmp_path_factory.mktemp("b") / "lm")


def generator_of(base: Path) -> HFGenerator:
    return HFGenerator(str(base), str(base / "tokenizer"), chat=False, dtype="float32", batch_size=64)


class AnyQuery(Toy):
    """The toy encoder for any text: its length and its first letter, as a 2-d vector."""

    def encode(self, texts):
        return [[float(len(t)), float(ord(t[0]) if t else 0)] for t in texts]


def policy(**overrides) -> EvoRAG:
    """An EVO-RAG of toy sizes; ``run_config={}`` (as the runner hands one) caches its cycles in cache_dir."""
    settings = dict(
        reward=EvoRAGReward(encoder=AnyQuery()),
        stages=[1],
        max_cycles=2,
        patience=2,
        questions_per_cycle=2,
        states_per_episode=1,
        dev_limit=2,
        preference=PreferenceSettings(encoder="unused"),
        lr=1e-2,
        batch_size=1,
        lora=LoRA(r=4, alpha=8, dropout=0.0),
        save_steps=1,
        k=2,
        max_turns=3,
        max_new_tokens=8,
        seed=0,
        run_config={},
    )
    settings |= overrides
    return EvoRAG(**settings)


@pytest.fixture(autouse=True)
def toy_preference_encoder(monkeypatch):
    """The preference model reads the toy encoder (MiniLM is not needed to test the loop)."""
    from rag_lab.policies.evorag import policy as module
    from rag_lab.policies.evorag.preference import PreferenceModel

    class Small(PreferenceModel):
        def __init__(self, encoder, heads, seed=0):
            encoder = AnyQuery()
            encoder.dim = 2
            super().__init__(encoder, heads, seed)

    monkeypatch.setattr(module, "PreferenceModel", Small)


def test_two_dpo_steps_with_lora_move_only_the_adapted_weights_and_prefer_the_chosen(data, base, tmp_path):
    generator, protocol = generator_of(base), EVORAGStep()
    questions = data.split("train")[:4]
    rows = [
        {
            "prompt": protocol.prompt(State(q.question)),
            "chosen": f"SEARCH: {q.question}",
            "rejected": "REFUSE",
        }
        for q in questions
    ]
    settings = SimpleNamespace(
        lora=LoRA(r=4, alpha=8, dropout=0.0),
        save_steps=10,
        bf16=None,
        beta=0.1,
        lr=5e-2,
        batch_size=2,
        grad_accum=1,
        dpo_epochs=1,
    )
    start = load_model(base, like=generator.model)
    before = {k: v.clone() for k, v in start.state_dict().items()}
    trained, stats = dpo_epoch(start, generator, rows, settings, tmp_path / "dpo", seed=0, what="test")
    losses = [r["loss"] for r in read_records(tmp_path / "dpo" / "log.jsonl")]
    assert stats["steps"] == 2 and len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
    after = trained.state_dict()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all(k.rsplit(".", 2)[-2] in ("q_proj", "k_proj", "v_proj", "o_proj") for k in moved)
    reference = load_model(base, like=generator.model)

    def log_ratio(row, side):
        prompt = row["prompt"]
        return sequence_logprob(trained, generator.tokenizer, prompt, row[side]) - sequence_logprob(
            reference, generator.tokenizer, prompt, row[side]
        )

    chosen = [log_ratio(r, "chosen") for r in rows]
    rejected = [log_ratio(r, "rejected") for r in rows]
    # measured: chosen +0.25 to +1.14, rejected -0.04 to -0.01 (the preferred log-ratio rises, well clear)
    assert all(c > 0.1 for c in chosen) and all(c - r > 0.1 for c, r in zip(chosen, rejected, strict=True))


def env_for(data, base: Path) -> Env:
    return Env(data.corpus, BM25Retriever(data.corpus), generator_of(base))


def cycle_dirs(root: Path) -> list[Path]:
    """The published cycles under ``root``, in training order (their keys are hashes)."""
    done = [p for p in (root / "evorag").iterdir() if (p / "cycle.json").exists()]
    return sorted(
        done, key=lambda p: [json.loads((p / "cycle.json").read_text())[k] for k in ("stage", "cycle")]
    )


def test_a_killed_cycle_resumes_to_the_uninterrupted_numbers(data, base, tmp_path, monkeypatch):
    train, dev = data.split("train"), data.split("dev")
    straight = tmp_path / "straight"
    policy(cache_dir=str(straight)).fit(env_for(data, base), train, dev, tmp_path / "a")
    from trl import DPOTrainer

    init = DPOTrainer.__init__

    def with_kill(self, *args, callbacks=(), **kwargs):
        init(self, *args, callbacks=[*callbacks, kill_at(1)], **kwargs)

    killed = tmp_path / "killed"
    with monkeypatch.context() as patched, pytest.raises(Killed):
        patched.setattr(DPOTrainer, "__init__", with_kill)
        policy(cache_dir=str(killed)).fit(env_for(data, base), train, dev, tmp_path / "b")
    policy(cache_dir=str(killed)).fit(env_for(data, base), train, dev, tmp_path / "b")
    a, b = cycle_dirs(straight), cycle_dirs(killed)
    assert len(a) == 2 and [p.name for p in a] == [p.name for p in b]  # the same cycle keys
    for x, y in zip(a, b, strict=True):
        wa, wb = load_file(x / "model.safetensors"), load_file(y / "model.safetensors")
        assert all(torch.equal(wa[n], wb[n]) for n in wa)
        assert (x / "pairs.jsonl").read_text() == (y / "pairs.jsonl").read_text()
        assert torch.equal(torch.load(x / "pm.pt")["weight"], torch.load(y / "pm.pt")["weight"])
        steps = [r["step"] for r in read_records(y / "log.jsonl")]
        assert steps == sorted(set(steps)) and steps  # every DPO step logged once
    summaries = [json.loads((p / "cycle.json").read_text()) for p in b]
    assert summaries[0]["dpo/resumed_from"] == 1 and summaries[1]["dpo/resumed_from"] is None
    assert [s["dev_em"] for s in summaries] == [
        json.loads((p / "cycle.json").read_text())["dev_em"] for p in a
    ]
    chosen = json.loads((tmp_path / "b" / "evorag.json").read_text())["1"]["chosen"]
    assert Path(chosen).name in {p.name for p in b} and (tmp_path / "b" / "curves.png").exists()
    # the held-out curve: the start's dev EM at step 0, then each cycle's at its last step
    logged = read_records(tmp_path / "b" / "train_log.jsonl")
    assert not undocumented_metrics("evorag", logged)  # every logged key is on docs/methods/evorag.md
    curve = [(r["step"], r["dev_em"]) for r in logged if "dev_em" in r]
    start = json.loads(next((killed / "evorag").glob("*.json")).read_text())["dev_em"]
    assert curve[0] == (0, start) and [em for _, em in curve[1:]] == [s["dev_em"] for s in summaries]


def test_bad_settings_are_one_line_errors():
    with pytest.raises(RagLabError, match=r"policy.margin: must be >= 0, got -0.1"):
        policy(margin=-0.1)
    with pytest.raises(RagLabError, match=r"policy.max_turns: \(T_max\) must be >= 1, got 0"):
        policy(max_turns=0)
    with pytest.raises(RagLabError, match=r"policy.stages: \[2, 1\]"):
        policy(stages=[2, 1])
    with pytest.raises(RagLabError, match="reward.schedule: 'cosine' is not a schedule"):
        EvoRAGReward(schedule="cosine", encoder=Toy())
    with pytest.raises(RagLabError, match="reward: policy=evorag needs reward=evorag"):
        policy(reward=None).fit(SimpleNamespace(generator=None), [], [], Path("unused"))
    for override, key in [
        ("policy.margin=-0.1", "policy.margin"),
        ("policy.max_turns=0", "policy.max_turns"),
        ("reward.schedule=cosine", "reward.schedule"),
        ("reward.components=[ans,speed]", "reward.components"),
    ]:
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            compose(["policy=evorag", override])


@pytest.mark.parametrize(
    "history, patience, min_delta, expected",
    [
        ([0.10, 0.12, 0.12, 0.11], 2, 0.0, True),  # two cycles without beating 0.12
        ([0.10, 0.12, 0.11, 0.13], 2, 0.0, False),  # the last one beat it
        ([0.10, 0.12, 0.11], 1, 0.0, True),
        ([0.10, 0.12, 0.13], 1, 0.02, True),  # +0.01 is not more than min_delta
        ([0.10, 0.12], 2, 0.0, False),  # too few cycles to tell
    ],
)
def test_a_stage_stops_when_dev_em_stalls(history, patience, min_delta, expected):
    assert stalled(history, patience, min_delta) is expected


def test_the_best_cycle_is_the_earliest_of_ties():
    assert best([0.2, 0.3, 0.3, 0.1]) == 1 and best([0.4]) == 0 and best([0.1, 0.2]) == 1


def test_the_cycle_key_is_the_runs_config_but_the_stopping_rule(data, base, tmp_path):
    env, questions, dev = env_for(data, base), data.split("train")[:3], data.split("dev")[:2]

    def key(dev=dev, **config) -> str:
        return policy(run_config=config).cycle_dir("start", 1, 1, questions, dev, env, tmp_path).name

    assert key(policy={"stages": [1], "margin": 0.2}) == key(policy={"stages": [1, 2], "margin": 0.2})
    assert key(policy={"max_cycles": 3, "patience": 1}) == key() == key(eval={"limit": 5})
    assert key(policy={"margin": 0.2}) != key(policy={"margin": 0.3}) != key()
    assert key(reward={"schedule": "fixed"}) != key() != key(reward={"components": ["ans"]})
    assert key(dev=dev[:1]) != key()


def test_the_paper_setup_is_its_section_3_4():
    """evorag_hotpotqa: DPO with beta 0.1, lr 5e-6 and an effective batch of 64 by 8-fold accumulation,
    T_max 20, the margins δ 0.2 (DPO) and Δ 0.3 (preference model), a verifier for r_ref."""
    from rag_lab.train.dpo import dpo_config

    cfg = compose(["experiment=evorag_hotpotqa"])
    p = cfg.policy
    assert (p.batch_size * p.grad_accum, p.lr, p.beta, p.max_turns) == (64, 5e-6, 0.1, 20)
    assert (p.margin, p.preference.margin, cfg.reward.refusal, p.stages) == (0.2, 0.3, "verifier", [1, 2])
    args = dpo_config(Path("unused"), "cpu", 0, 25, gradient_accumulation_steps=p.grad_accum, beta=p.beta)
    assert (args.gradient_accumulation_steps, args.beta, args.bf16, args.gradient_checkpointing) == (
        8,
        0.1,
        False,
        False,
    )


def test_each_processs_share_of_the_rollouts_is_its_slice_of_one_processs(data, base, tmp_path, monkeypatch):
    """The sharding rule in one process (the fast side of test_evorag_data_parallel): 5 questions in rollout
    batches of 2; process r of 2 plays batches r, r+2, ... (a fresh process: nothing played before), and its
    nodes are the whole cycle's nodes of those batches; its share of dev EM adds up to the whole's."""
    from rag_lab.policies.evorag import trainer
    from rag_lab.train.parallel import my_units

    env, evorag = env_for(data, base), policy(questions_per_cycle=5, rollout_batch=2, dev_limit=3)
    train, dev = data.split("train")[:20], data.split("dev")[:3]
    dev = [replace(q, answers=("",)) if i % 2 else q for i, q in enumerate(dev)]  # EM 1/3 untrained
    shares, ems = [], []
    for rank in (1, 0):
        monkeypatch.setattr(trainer, "spread", lambda n, work, finish, r=rank: work(my_units(n, 2, r)))
        shares.append(
            trainer.collect(evorag, env.generator, env, 1, 1, train, tmp_path / f"r{rank}")["nodes"]
        )
        ems.append(trainer.dev_em(evorag, env.generator, env, dev))
    monkeypatch.undo()
    whole = trainer.collect(evorag, env.generator, env, 1, 1, train, tmp_path / "whole")
    mine = {1: [2, 3], 0: [0, 1, 4]}  # the episodes of batches 1, and 0 and 2
    for rank, nodes in zip((1, 0), shares, strict=True):
        expected = [
            n | {"index": mine[rank].index(n["index"])} for n in whole["nodes"] if n["index"] in mine[rank]
        ]
        assert nodes == expected and nodes
    assert sum(ems) == trainer.dev_em(evorag, env.generator, env, dev) == pytest.approx(1 / 3)
