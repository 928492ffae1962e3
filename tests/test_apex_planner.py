"""APEX's planner RL (policies/apex/planner.py) on a toy tiny LM: two GRPO steps through TRL with the gold
plans reaching the reward, the weights moving, and a killed run resuming to the same weights."""

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

from rag_lab.core.errors import RagLabError
from rag_lab.env import Episode
from rag_lab.generators.base import Sampling
from rag_lab.generators.hf import HFGenerator
from rag_lab.policies.apex.planner import PlannerRL, plan_steps, train_planner
from rag_lab.rewards.sepr import gold_plan
from rag_lab.train.heldout import HeldOut, HeldOutCallback

from conftest import undocumented_metrics, untrained_tiny_lm

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def base(data, tmp_path_factory) -> Path:
    """An untrained toy tiny LM whose word-level vocabulary covers the corpus and APEX's formats."""
    return untrained_tiny_lm(data, ("apex_*",), tmp_path_factory.mktemp("b") / "lm")


class Recorded:
    """A reward that tells plans apart by length and records each prompt with the gold plan it was given."""

    def __init__(self):
        self.pairs = []

    def __call__(self, completions, gold_plans, prompts, **_):
        self.pairs.extend((p, tuple(g)) for p, g in zip(prompts, gold_plans, strict=True))
        return [float(len(c)) for c in completions]


class StopAt(TrainerCallback):
    """Ends training after ``step`` steps, as a kill would (the checkpoint of that step is on disk)."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = state.global_step >= self.step


CONFIG = PlannerRL(
    group_size=4, questions_per_step=2, epochs=1.0, train_limit=4, lr=1e-2, max_new_tokens=12, save_steps=1
)


def planner(base: Path) -> HFGenerator:
    return HFGenerator(str(base), str(base / "tokenizer"), chat=False, dtype="float32", batch_size=64)


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(path / "model.safetensors")


def test_two_planner_steps_train_on_the_gold_plans(data, base, tmp_path):
    questions = [q for q in data.split("train") if q.decomposition][:4]
    reward, generator = Recorded(), planner(base)
    stats = train_planner(generator, questions, reward, CONFIG, tmp_path / "planner")
    assert stats["steps"] == 2 and stats["questions"] == 4
    # every plan is scored against its own question's gold plan (2 steps x 2 questions x 4 plans)
    plans = {q.question: tuple(gold_plan(q)) for q in questions}
    assert len(reward.pairs) == 16
    for prompt, gold in reward.pairs:
        [asked] = [question for question in plans if question in prompt]
        assert gold == plans[asked]
    rows = [line for line in (tmp_path / "planner" / "log.jsonl").read_text().splitlines() if line]
    assert len(rows) == 2 and all(math.isfinite(json.loads(r)["loss"]) for r in rows)
    before, after = weights(base), weights(tmp_path / "planner")
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert not (tmp_path / "planner.work").exists()


def test_a_killed_planner_run_resumes_to_the_same_weights(data, base, tmp_path):
    questions = [q for q in data.split("train") if q.decomposition][:4]
    train_planner(planner(base), questions, Recorded(), CONFIG, tmp_path / "whole")
    with pytest.raises(RagLabError, match="stopped at step 1 of 2; the next run resumes from .*checkpoint-1"):
        train_planner(
            planner(base), questions, Recorded(), CONFIG, tmp_path / "killed", callbacks=[StopAt(1)]
        )
    stats = train_planner(planner(base), questions, Recorded(), CONFIG, tmp_path / "killed")
    assert stats["resumed_from"].endswith("checkpoint-1")
    whole, resumed = weights(tmp_path / "whole"), weights(tmp_path / "killed")
    assert all(torch.allclose(whole[k], resumed[k], atol=1e-6) for k in whole)


def test_plan_steps_counts_parsed_steps():
    assert plan_steps(["1. Who directed X?\n2. Where was #1 born?", "", "1."]) == [2.0, 0.0, 0.0]


def test_the_planner_loss_is_a_token_mean_as_verls():
    from rag_lab.core.config import compose
    from rag_lab.policies.apex.planner import planner_config

    assert PlannerRL().loss_type == compose(["policy=apex"]).policy.planner.loss_type == "dapo"
    assert planner_config(PlannerRL(), Path("unused"), "cpu").loss_type == "dapo"
    assert planner_config(PlannerRL(loss_type="grpo"), Path("unused"), "cpu").loss_type == "grpo"
    with pytest.raises(RagLabError, match="policy.planner.loss_type"):
        PlannerRL(loss_type="mean")


def test_the_planners_micro_batches_accumulate_into_one_update_a_step():
    """``policy.planner.micro_batch``: a step's 4 x 8 plans in passes of 8, one update per generated batch
    (the same TRL keys as DAPO's, whose update tests/test_dapo.py checks against one pass)."""
    from rag_lab.policies.apex.planner import planner_config

    config = planner_config(PlannerRL(micro_batch=8), Path("unused"), "cpu")
    assert (config.per_device_train_batch_size, config.gradient_accumulation_steps) == (8, 4)
    assert config.generation_batch_size == 32
    whole = planner_config(PlannerRL(), Path("unused"), "cpu")
    assert (
        whole.per_device_train_batch_size,
        whole.gradient_accumulation_steps,
        whole.generation_batch_size,
    ) == (
        32,
        1,
        32,
    )
    with pytest.raises(
        RagLabError,
        match=r"policy\.planner\.micro_batch: 5 does not divide each process's 32 plans of a step",
    ):
        PlannerRL(micro_batch=5)


def test_the_heldout_curve_joins_the_planners_log_once_across_a_kill(data, base, tmp_path):
    """A held-out callback (every step): the planner's log holds its rows at steps 0, 1, 2 beside the
    training rows, each once after a kill at step 1; each row measured with the planner of that step."""
    questions = [q for q in data.split("train") if q.decomposition][:4]
    held = data.split("dev")[:2]
    seen = []

    def rollout(generator, share):  # the greedy plans of the held-out questions with the planner as it is now
        plans = generator.generate([q.question for q in share], Sampling(max_new_tokens=8))
        seen.append([c[0].text for c in plans])
        return [Episode(q.id, q.question, prediction=c[0].text) for q, c in zip(share, plans, strict=True)]

    def callback():
        return HeldOutCallback(HeldOut(n=2, every=1), held, rollout, generator=planner(base))

    with pytest.raises(RagLabError, match="stopped at step 1 of 2"):
        train_planner(
            planner(base),
            questions,
            Recorded(),
            CONFIG,
            tmp_path / "p",
            callbacks=[StopAt(1)],
            heldout=callback(),
        )
    train_planner(planner(base), questions, Recorded(), CONFIG, tmp_path / "p", heldout=callback())
    rows = [json.loads(line) for line in (tmp_path / "p" / "log.jsonl").read_text().splitlines() if line]
    assert [r["step"] for r in rows if "heldout/acc" in r] == [0, 1, 2]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2]
    assert not undocumented_metrics("apex", rows)  # every logged key is on docs/methods/apex.md
    assert seen[0] != seen[-1]  # the plans changed as the planner trained
    final = HFGenerator(str(tmp_path / "p"), str(base / "tokenizer"), chat=False, dtype="float32")
    assert seen[-1] == [
        c[0].text for c in final.generate([q.question for q in held], Sampling(max_new_tokens=8))
    ]
