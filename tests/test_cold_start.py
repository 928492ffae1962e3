"""The cold start: rejection-sampled teacher demonstrations, then TRL SFT of any causal LM (cached,
resumable).

Fast tests use the tiny world and a toy tiny LM (hidden 16, one layer, untrained) whose vocabulary covers
the world; the slow one runs two LoRA steps on SmolLM2-135M-Instruct.
"""

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from safetensors.torch import load_file
from transformers import TrainerCallback

from rag_lab.core.cache import plain as cache_plain
from rag_lab.core.config import ConfigError, build, compose
from rag_lab.core.errors import RagLabError
from rag_lab.env.protocols.base import ANSWER, Action, identify
from rag_lab.env.teacher.agent import Noise
from rag_lab.env.teacher.generator import TeacherGenerator
from rag_lab.generators.base import Completion, Sampling
from rag_lab.retrievers.bm25 import BM25Retriever
from rag_lab.train import cold_start as cs
from rag_lab.train import demonstrations as demos_module
from rag_lab.train.cold_start import ColdStartConfig, cold_start, load
from rag_lab.train.demonstrations import chosen_protocols, sample_demonstrations
from rag_lab.train.lora import LoRA

from conftest import TINY_DATA, untrained_tiny_lm

# APEX's plans (short rows) of four questions, a greedy and a sampled rollout each; six SFT steps of
# four rows, a checkpoint every two.
FAST = ColdStartConfig(
    protocols=("apex_plan",),
    limit=4,
    temperatures=(0.0, 1.0),
    max_steps=6,
    batch_size=4,
    lr=1e-3,
    warmup_steps=0,
    max_length=512,
    save_steps=2,
)
LORA = LoRA(r=4, alpha=8, dropout=0.0, target_modules=("q_proj", "v_proj"))


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def retriever(data):
    return BM25Retriever(data.corpus)


@pytest.fixture(scope="module")
def base(data, tmp_path_factory) -> Path:
    """An untrained toy tiny LM whose word-level vocabulary covers the corpus and the demonstrations."""
    from rag_lab.train.tiny.reading import TAGS

    return untrained_tiny_lm(data, ("r3rag", "apex_*"), tmp_path_factory.mktemp("base") / "lm", TAGS)


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(path / "model.safetensors")


class Spoiler:
    """The teacher, except on two questions: one gets a wrong final answer at once (well formed), the
    other a step that is no R3-RAG step."""

    def __init__(self, inner, wrong: str, broken: str):
        self.inner, self.wrong, self.broken = inner, wrong, broken

    def generate(self, prompts, sampling: Sampling) -> list[list[Completion]]:
        out = self.inner.generate(prompts, sampling)
        for prompt, completions in zip(prompts, out, strict=True):
            protocol, state = identify(prompt)
            if state.question == self.wrong:
                completions[0] = Completion(protocol.format(Action(ANSWER, answer="Zzyzx", thought="Sure.")))
            elif state.question == self.broken:
                completions[0] = Completion("I am not sure what to do next.")
        return out


def question_of(prompt) -> str:
    return identify(prompt)[1].question


def test_rejection_sampling_keeps_correct_well_formed_episodes_only(data, retriever):
    teacher = TeacherGenerator(data)
    config = replace(FAST, protocols=("r3rag",), limit=6, temperatures=(0.0,))
    clean = sample_demonstrations(data, config, retriever, teacher=teacher)
    c = clean.counts["r3rag"]
    assert list(clean.counts) == ["r3rag"] and c["episodes"] == 6
    assert c["kept"] + c["wrong"] + c["malformed"] == 6 and c["malformed"] == 0
    assert c["pairs"] == len(clean.pairs) > 0
    assert all(identify(p)[0].name == "r3rag" for p, _ in clean.pairs)
    # A repeated greedy rollout doubles the episodes, not the (identical) pairs.
    twice = sample_demonstrations(data, replace(config, temperatures=(0.0, 0.0)), retriever, teacher=teacher)
    assert twice.counts["r3rag"]["episodes"] == 12 and twice.pairs == clean.pairs

    wrong, broken = list(dict.fromkeys(question_of(p) for p, _ in clean.pairs))[:2]
    spoiled = sample_demonstrations(data, config, retriever, teacher=Spoiler(teacher, wrong, broken))
    s = spoiled.counts["r3rag"]
    assert (s["episodes"], s["kept"], s["wrong"], s["malformed"]) == (6, c["kept"] - 2, c["wrong"] + 1, 1)
    assert {question_of(p) for p, _ in spoiled.pairs} == {question_of(p) for p, _ in clean.pairs} - {
        wrong,
        broken,
    }
    assert set(spoiled.pairs) < set(clean.pairs)


def test_a_noisy_sampled_teacher_is_filtered_and_patterns_pick_protocols(data, retriever):
    assert chosen_protocols(["apex_*", "apex_plan"]) == ["apex_exec", "apex_final", "apex_plan"]
    with pytest.raises(RagLabError, match="'apexx' names no protocol"):
        chosen_protocols(["apexx"])
    # APEX's pipeline speaks three protocols; only the executor's steps are kept.
    demos = sample_demonstrations(data, replace(FAST, protocols=("apex_exec",)), retriever)
    c = demos.counts["apex_exec"]
    assert list(demos.counts) == ["apex_exec"] and c["episodes"] == 8  # 4 questions x 2 temperatures
    assert c["kept"] > 0 and c["kept"] + c["wrong"] + c["malformed"] == 8
    assert {identify(p)[0].name for p, _ in demos.pairs} == {"apex_exec"}
    # A teacher that mis-copies half the names it reads: its wrong episodes are counted and dropped.
    noisy = replace(FAST, protocols=("evorag",), limit=8, noise=Noise(miscopy=0.5))
    c = sample_demonstrations(data, noisy, retriever).counts["evorag"]
    assert c["episodes"] == 16 and c["wrong"] > 0 and c["kept"] > 0 and c["kept"] + c["wrong"] == 16


def test_sft_trains_publishes_and_reuses(base, data, tmp_path, monkeypatch):
    out = cold_start(base, data, FAST, tmp_path, tokenizer=base / "tokenizer")
    # published in one rename: no work dir or temp dir is left beside it
    assert out.parent == tmp_path / "cold_start" and {p.name for p in out.parent.iterdir()} == {
        out.name,
        "demos",
    }
    info = json.loads((out / "train.json").read_text())
    assert info["chat"] is False and info["tokenizer"] == "tokenizer" and info["sft"]["steps"] == 6
    losses = [row["loss"] for row in info["sft"]["losses"]]
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses)
    counts = info["demonstrations"]["counts"]["apex_plan"]
    assert counts["episodes"] == 8 and info["demonstrations"]["pairs"] == counts["pairs"] > 0
    before, after = weights(base), weights(out)
    assert before.keys() == after.keys() and all(not torch.equal(before[n], after[n]) for n in before)

    [[completion]] = load(out).generate(["Question: where?\n[apex_plan]\n"], Sampling(max_new_tokens=4))
    assert 1 <= len(completion.token_ids) <= 4

    def fail(*args, **kwargs):
        raise AssertionError("sampled or trained again")

    monkeypatch.setattr(demos_module, "sample_demonstrations", fail)
    monkeypatch.setattr(cs, "sft", fail)
    assert cold_start(base, data, FAST, tmp_path, tokenizer=base / "tokenizer") == out
    monkeypatch.undo()
    assert cold_start(base, data, replace(FAST, lr=5e-4), tmp_path, tokenizer=base / "tokenizer") != out


def test_a_shipped_cold_start_is_taken_untrained_and_checked(base, data, tmp_path, monkeypatch):
    monkeypatch.setattr(cs, "SHIPPED", tmp_path / "shipped")
    trained = cold_start(base, data, FAST, tmp_path / "a", tokenizer=base / "tokenizer")
    shipped = cs.ship(trained)
    card = json.loads((shipped / cs.SHIP_CARD).read_text())
    assert shipped.parent == tmp_path / "shipped" and card["key"] == shipped.name
    assert {"model.safetensors", "train.json", "tokenizer/tokenizer.json"} <= set(card["files"])

    def fail(*args, **kwargs):
        raise AssertionError("trained again")

    monkeypatch.setattr(cs, "sft", fail)
    # an empty cache takes the shipped weights; other settings do not match it and would train
    taken = cold_start(base, data, FAST, tmp_path / "b", tokenizer=base / "tokenizer")
    assert taken.parent == tmp_path / "b" / "cold_start" and taken.name == trained.name
    assert all(torch.equal(weights(trained)[n], w) for n, w in weights(taken).items())
    with pytest.raises(AssertionError, match="trained again"):
        cold_start(base, data, replace(FAST, lr=5e-4), tmp_path / "c", tokenizer=base / "tokenizer")
    # a shipped file that is not the card's: one line naming it, nothing published
    (shipped / "model.safetensors").write_bytes(b"not the weights")
    with pytest.raises(RagLabError, match=r"shipped/\w+/model\.safetensors: sha256 \w+… is not the card's"):
        cold_start(base, data, FAST, tmp_path / "d", tokenizer=base / "tokenizer")
    assert not [p for p in (tmp_path / "d" / "cold_start").iterdir() if p.name != "demos"]


def test_the_shipped_cold_start_fits_make_demo():
    """``make demo``'s shared cold start (compare_synth, seed 0) is shipped for the shipped default LM: its
    card's settings are the experiment's and its base is the checkpoint's files (else the demo pays 2.5 min
    of SFT: ``make tiny-lm`` ships it again)."""
    from rag_lab.core.cache import files_digest
    from rag_lab.train.tiny.generator import SHIPPED

    cfg = compose(["experiment=compare_synth", "seed=0"])
    settings = cache_plain(instantiate(cfg.experiment.cold_start))
    cards = [json.loads(p.read_text()) for p in sorted(cs.SHIPPED.glob(f"*/{cs.SHIP_CARD}"))]
    fits = [c for c in cards if cache_plain(c["settings"]) == settings]
    assert fits, f"no shipped cold start has compare_synth's settings {settings}"
    assert [c["base"] for c in fits] == [files_digest(SHIPPED, SHIPPED / "tokenizer")]


def test_lora_moves_only_the_adapted_weights(base, data, retriever, tmp_path):
    from transformers import AutoModelForCausalLM

    config = replace(FAST, max_steps=3, lora=LORA)
    out = cold_start(base, data, config, tmp_path, tokenizer=base / "tokenizer", retriever=retriever)
    info = json.loads((out / "train.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(base)
    adapted = [m for name, m in model.named_modules() if name.rsplit(".", 1)[-1] in LORA.target_modules]
    # an adapter is A (r x in) and B (out x r) per adapted linear layer
    assert info["sft"]["trainable_parameters"] == sum(
        LORA.r * (m.in_features + m.out_features) for m in adapted
    )
    before, after = weights(base), weights(out)  # the adapters merged into the saved model
    moved = {n for n in before if not torch.equal(before[n], after[n])}
    assert moved == {
        n for n in before if n.rsplit(".", 2)[-2] in LORA.target_modules and n.endswith(".weight")
    }


class Killed(Exception):
    pass


class KillAfterSave(TrainerCallback):
    def __init__(self, step: int):
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise Killed(f"killed after the checkpoint of step {self.step}")


class Steps(TrainerCallback):
    def __init__(self):
        self.done: list[int] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.done.append(state.global_step)


def test_a_killed_run_resumes_to_the_uninterrupted_weights(base, data, retriever, tmp_path):
    run = dict(tokenizer=base / "tokenizer", retriever=retriever)
    whole = cold_start(base, data, FAST, tmp_path / "a", **run)
    with pytest.raises(Killed):
        cold_start(base, data, FAST, tmp_path / "b", callbacks=[KillAfterSave(4)], **run)
    (work,) = [p for p in (tmp_path / "b" / "cold_start").iterdir() if p.name.endswith(".work")]
    assert sorted(p.name for p in work.iterdir() if p.name.startswith("checkpoint")) == [
        "checkpoint-2",
        "checkpoint-4",
    ]
    steps = Steps()
    resumed = cold_start(base, data, FAST, tmp_path / "b", callbacks=[steps], **run)
    assert steps.done == [5, 6]  # only the steps after the last checkpoint ran
    assert resumed.name == whole.name and not work.exists()
    info = json.loads((resumed / "train.json").read_text())
    assert info["sft"]["resumed_from"] == 4
    first, second = weights(whole), weights(resumed)
    assert all(torch.equal(first[n], second[n]) for n in first)


def test_config_group_and_command_line(base, tmp_path, capsys):
    cfg = compose([*TINY_DATA, "+cold_start=default", "cold_start.lora.r=8", "cold_start.protocols=[dapo]"])
    config = instantiate(cfg.cold_start)
    assert isinstance(config, ColdStartConfig) and config.lora == LoRA(r=8) and config.protocols == ("dapo",)
    assert config.noise.vague_query > 0
    with pytest.raises(ConfigError, match=r"cold_start\.samples' must be >= 1"):
        compose(["+cold_start=default", "cold_start.samples=0"])
    with pytest.raises(ConfigError, match=r"cold_start\.lora\.rank"):
        compose(["+cold_start=default", "+cold_start.lora.rank=8"])

    from rag_lab.train.cold_start.__main__ import main

    main(
        [
            *TINY_DATA,
            f"cache_dir={tmp_path}",
            "generator=hf",
            f"generator.model={base}",
            f"generator.tokenizer={base / 'tokenizer'}",
            "cold_start.protocols=[apex_plan]",
            "cold_start.limit=4",
            "cold_start.max_steps=2",
            "cold_start.batch_size=2",
        ]
    )
    out = Path(capsys.readouterr().out.strip().splitlines()[-1])
    assert out.parent == tmp_path / "cold_start" and (out / "train.json").exists()
    cfg = compose(
        [*TINY_DATA, "generator=hf", f"generator.model={out}", f"generator.tokenizer={out / 'tokenizer'}"]
    )
    generator = build(cfg.generator)
    assert generator.chat is False and generator.generate(
        ["Question: x\n[apex_plan]\n"], Sampling(max_new_tokens=2)
    )


@pytest.mark.slow
def test_smollm2_two_lora_steps(data, retriever, tmp_path):
    from rag_lab.generators.smollm2 import convert

    model_dir = convert(tmp_path / "cache")
    config = replace(
        FAST,
        protocols=("apex_plan",),
        limit=2,
        temperatures=(0.0,),
        max_steps=2,
        batch_size=2,
        lr=1e-3,
        lora=LoRA(r=8, alpha=16, dropout=0.0),
    )
    out = cold_start(model_dir, data, config, tmp_path / "cache", retriever=retriever)
    info = json.loads((out / "train.json").read_text())
    assert info["chat"] is True and info["tokenizer"] == "."
    assert len(info["sft"]["losses"]) == 2 and all(math.isfinite(r["loss"]) for r in info["sft"]["losses"])
    before, after = weights(model_dir), weights(out)
    moved = {n for n in before if not torch.equal(before[n], after[n])}
    targets = config.lora.target_modules
    assert moved and moved <= {n for n in before if n.rsplit(".", 2)[-2] in targets}


def test_the_world_teacher_on_questions_without_decompositions_says_why(data, retriever):
    from types import SimpleNamespace

    bare = [replace(ex, decomposition=()) for ex in data.split("train")[:4]]
    other = SimpleNamespace(name="nq", corpus=data.corpus, scorer="squad", split=lambda name: bare)
    with pytest.raises(
        RagLabError, match="the world teacher follows gold decompositions, and no train question of nq"
    ):
        sample_demonstrations(other, FAST, retriever)


def test_the_cold_start_command_runs_as_a_module(capfd, monkeypatch):
    """``python -m rag_lab.train.cold_start`` (the package's ``__main__``, a command above the policies)."""
    from conftest import cli

    rc, out = cli("train.cold_start", ["--help"], capfd, monkeypatch)
    assert rc == 0 and out.startswith("python -m rag_lab.train.cold_start: fine-tune the generator's model")
