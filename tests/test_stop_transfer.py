"""Stop-RAG's stopping rule on R3-RAG's turns and APEX's sub-questions (rag_lab/policies/stoprag/transfer.py),
on the tiny world, the world teacher acting in both loops (untrained: it speaks every protocol) and Stop-RAG
trained on it. τ far beyond any margin makes the rule's decision certain: -100 stops every question at its
first chance, +100 never."""

import pytest
from hydra.utils import instantiate

from rag_lab.core.config import build
from rag_lab.env import Env
from rag_lab.env.engine import run_agent
from rag_lab.env.protocols.r3rag import R3RAGStep
from rag_lab.generators.base import Sampling
from rag_lab.policies.apex.pipeline import APEXPipeline
from rag_lab.policies.stoprag.policy import QStopper
from rag_lab.run import run

SHORT = [
    "generator=teacher",
    "experiment.cold_start=null",
    "policy.stopper.train_limit=4",
    "policy.stopper.samples=2",
    "policy.stopper.iterations=2",
    "policy.stopper.epochs=1",
    "eval.limit=20",
]
APEX = ["experiment/compare_synth=apex_stop", "policy.plan_rl=false", "experiment.apex_executor_sft=false"]


class Always:
    """Stops every question at its first chance (after its first search)."""

    def should_stop(self, env, states, episodes):
        return [bool(s.turns) for s in states]


def test_a_stopped_r3rag_episode_answers_from_the_prefix(tiny_cfg):
    cfg = tiny_cfg("generator=teacher")
    data = instantiate(cfg.data)
    env = Env(data.corpus, build(cfg.retriever, corpus=data.corpus), build(cfg.generator, data=data))
    questions, greedy = data.split("test")[:20], Sampling(max_new_tokens=128)
    free = run_agent(R3RAGStep(), questions, env, greedy, k=3, max_turns=5)
    stopped = run_agent(R3RAGStep(), questions, env, greedy, k=3, max_turns=5, stopper=Always())
    assert max(len(e.steps) for e in free) > 2  # without the rule the teacher searches more than once
    for ep in stopped:
        assert [s.action for s in ep.steps] == ["search", "answer"] and ep.stop_reason == "stopper"
        assert ep.steps[1].text.startswith(R3RAGStep.answer_prefix)


def test_a_stopped_apex_question_goes_to_synthesis(tiny_cfg):
    cfg = tiny_cfg("generator=teacher")
    data = instantiate(cfg.data)
    env = Env(data.corpus, build(cfg.retriever, corpus=data.corpus), build(cfg.generator, data=data))
    questions = data.split("test")[:20]
    free = APEXPipeline().rollout(env, questions)
    pipeline = APEXPipeline()
    pipeline.stopper = Always()
    stopped = pipeline.rollout(env, questions)
    for a, b in zip(free, stopped, strict=True):
        # the same plan and first sub-question (its steps end with its answer), then straight to synthesis
        actions = [s.action for s in a.steps]
        first = actions[: actions.index("answer") + 1]
        assert [s.action for s in b.steps] == [*first, "answer"]
        assert [s.query for s in b.steps[: len(first)]] == [s.query for s in a.steps[: len(first)]]
        assert b.stop_reason == ("stopper" if len(actions) > len(first) + 1 else a.stop_reason)
    assert any(b.stop_reason == "stopper" for b in stopped)


@pytest.mark.parametrize(
    "row",
    [
        ["experiment/compare_synth=r3rag_stop", "policy.ppo.iterations=0", "experiment.cold_start=null"],
        ["experiment/compare_synth=apex_stop", "policy.plan_rl=false", "experiment.apex_executor_sft=false"],
    ],
    ids=["r3rag", "apex"],
)
def test_a_method_trains_its_stopper_and_acts_with_it(row, tiny_cfg, tiny_lm, tmp_path):
    # Both methods train a transformers model: the conftest's untrained one (words only; its rollouts are what
    # the stopper trains on, whatever they say), not a tiny LM trained for this world
    lm = ["generator=hf", f"generator.model={tiny_lm}", f"generator.tokenizer={tiny_lm}/tokenizer"]
    cfg = tiny_cfg("experiment=compare_synth", *row, *SHORT[2:], "policy.stopper.tau=-100", *lm)
    data = instantiate(cfg.data)
    env = Env(data.corpus, build(cfg.retriever, corpus=data.corpus), build(cfg.generator, data=data))
    policy = build(cfg.policy, train_data=data, reward=build(cfg.reward), run_config={})
    policy.fit(env, data.split("train"), data.split("dev"), tmp_path)
    assert isinstance(policy.stopper, QStopper) and policy.stopper.tau == -100
    assert (tmp_path / "stopper" / "qnet.pt").exists()


def test_a_stopper_reuses_the_stoprag_rows_fit(tiny_cfg, tiny_lm, tmp_path):
    """The stoprag row and a stopper with its settings: one fit, cached; the stopper trains nothing."""
    settings = [s.removeprefix("policy.stopper.") for s in SHORT[2:] if s.startswith("policy.stopper.")]
    mine = [f"policy.{s}" for s in settings]
    lm = ["generator=hf", f"generator.model={tiny_lm}", f"generator.tokenizer={tiny_lm}/tokenizer"]
    row = tiny_cfg("experiment=compare_synth", "experiment/compare_synth=stoprag", *mine, *lm, "eval.limit=2")
    run(row, tmp_path / "stoprag")
    stop = ["experiment=compare_synth", "experiment/compare_synth=apex_stop", "policy.plan_rl=false"]
    cfg = tiny_cfg(*stop, "experiment.apex_executor_sft=false", *SHORT[2:], *lm, "eval.limit=2")
    run(cfg, tmp_path / "apex_stop")
    mine, theirs = tmp_path / "apex_stop" / "checkpoints" / "stopper", tmp_path / "stoprag" / "checkpoints"
    assert (mine / "qnet.pt").read_bytes() == (theirs / "qnet.pt").read_bytes()
    assert not (mine / "dev_trajectories.jsonl").exists()  # τ was not tuned again
