"""The batched rollout engine and the policies built on it, with the world teacher, a scripted
generator (format failures, backtracking) and the tiny random LM (token masks)."""

import pytest
from hydra.utils import instantiate

from rag_lab.env import Env
from rag_lab.env.engine import run_agent
from rag_lab.env.protocols import PROTOCOLS
from rag_lab.env.teacher.generator import TeacherGenerator
from rag_lab.generators.base import Completion, Sampling
from rag_lab.generators.hf import HFGenerator
from rag_lab.policies.stoprag.pipeline import IterativePipeline, LLMStop
from rag_lab.run import run


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from rag_lab.core.config import compose

    from conftest import TINY_DATA

    cfg = compose([*TINY_DATA, f"cache_dir={tmp_path_factory.mktemp('cache')}"])
    data = instantiate(cfg.data)
    return data, instantiate(cfg.retriever, corpus=data.corpus)


@pytest.fixture
def env(world):
    data, retriever = world
    return Env(data.corpus, retriever, TeacherGenerator(data))


def answerable(world, n=12):
    return [ex for ex in world[0].split("dev") if ex.answerable and ex.hops >= 2][:n]


class Scripted:
    """Replies with the next scripted text for each prompt, in order; records the prompts."""

    def __init__(self, *replies: str):
        self.replies, self.prompts = list(replies), []

    def generate(self, prompts, sampling):
        self.prompts.append(list(prompts))
        return [[Completion(self.replies.pop(0) if self.replies else "")] for _ in prompts]


@pytest.mark.parametrize("name", ["dapo", "evorag", "r3rag"])
def test_teacher_solves_answerable_questions_in_every_agent_protocol(world, env, name):
    examples = answerable(world)
    episodes = run_agent(PROTOCOLS[name](), examples, env, Sampling(), k=3, max_turns=10)
    right = [ep.prediction in ex.answers for ep, ex in zip(episodes, examples, strict=True)]
    assert sum(right) >= 0.8 * len(examples)
    assert not any(ep.format_failure for ep in episodes)
    for ep in episodes:  # every search step brought back passages
        assert all(s.retrieved_ids for s in ep.steps if s.action == "search")


def test_turn_limit_ends_episodes(world, env):
    examples = answerable(world)
    episodes = run_agent(PROTOCOLS["r3rag"](), examples, env, Sampling(), k=3, max_turns=1)
    assert all(
        len(ep.steps) == 1 and ep.stop_reason == "max_turns" and ep.prediction == "" for ep in episodes
    )


def test_exclusion_of_seen_passages(world, env):
    examples = answerable(world)
    for exclude in (False, True):
        episodes = run_agent(
            PROTOCOLS["dapo"](), examples, env, Sampling(), k=2, max_turns=8, exclude_seen=exclude
        )
        repeats = [len(ep.retrieved_ids) - len(set(ep.retrieved_ids)) for ep in episodes]
        assert (sum(repeats) == 0) if exclude else (sum(repeats) > 0)


def test_format_failures_are_counted_not_raised(world):
    data, retriever = world
    examples = answerable(world, 3)
    # episode 0 breaks the format at once; 1 searches then answers; 2 searches then breaks
    gen = Scripted(
        "no tags at all", "<search>x</search>", "<search>y</search>", "<answer>a</answer>", "<search"
    )
    episodes = run_agent(
        PROTOCOLS["dapo"](), examples, Env(data.corpus, retriever, gen), Sampling(), max_turns=3
    )
    assert [ep.format_failure for ep in episodes] == [True, False, True]
    assert [ep.stop_reason for ep in episodes] == ["format_error", "answer", "format_error"]
    assert episodes[1].prediction == "a" and episodes[0].steps[0].error
    assert len(gen.prompts[1]) == 2  # the broken episode left the batch


def test_backtrack_hides_the_last_evidence(world):
    data, retriever = world
    (ex,) = answerable(world, 1)
    gen = Scripted("SEARCH: " + ex.decomposition[0].question, "BACKTRACK", "ANSWER: x")
    (ep,) = run_agent(PROTOCOLS["evorag"](), [ex], Env(data.corpus, retriever, gen), Sampling(), k=2)
    second, third = gen.prompts[1][0], gen.prompts[2][0]
    assert "Documents:" in second and "Documents:" not in third and "(abandoned)" in third
    assert [s.action for s in ep.steps] == ["search", "backtrack", "answer"] and ep.prediction == "x"


def test_policy_tokens_and_logprobs_are_recorded(world, tiny_lm):
    data, retriever = world
    gen = HFGenerator(tiny_lm, tokenizer=f"{tiny_lm}/tokenizer", batch_size=4)
    examples = answerable(world, 3)
    episodes = run_agent(
        PROTOCOLS["dapo"](),
        examples,
        Env(data.corpus, retriever, gen),
        Sampling(max_new_tokens=6),
        max_turns=2,
    )
    steps = [s for ep in episodes for s in ep.steps]
    assert steps and all(len(s.token_ids) == len(s.logprobs) > 0 for s in steps)
    for s in steps:  # only what the policy produced: decoding its tokens gives its text, no passages
        assert gen.tokenizer.decode(s.token_ids, skip_special_tokens=True).startswith(s.text.strip()[:5])
    assert all(ep.completion_tokens == sum(len(s.token_ids) for s in ep.steps) for ep in episodes)
    assert all(ep.prompt_tokens > 0 for ep in episodes)


def test_fixed_iteration_pipeline_and_llm_stop(world, env):
    examples = answerable(world)
    fixed = IterativePipeline(iterations=4).rollout(env, examples)
    stopped = IterativePipeline(LLMStop(), iterations=4).rollout(env, examples)
    assert all(len(ep.queries) == 4 for ep in fixed)
    assert all(len(set(ep.retrieved_ids)) == 4 for ep in fixed)  # seen passages dropped, keep 1
    assert sum(len(ep.queries) for ep in stopped) < sum(len(ep.queries) for ep in fixed)
    assert any(ep.stop_reason == "stop" for ep in stopped)
    for a, b, ex in zip(fixed, stopped, examples, strict=True):
        assert (b.prediction in ex.answers) >= (a.prediction in ex.answers) or b.stop_reason == "max_steps"
        assert all(s.answer is not None for s in a.steps if s.action == "search")


@pytest.mark.parametrize(
    "policy", ["direct", "standard_rag", "cot", "ircot", "iter_retgen", "fixed_iter", "llm_stop", "agent"]
)
def test_every_baseline_runs_with_the_teacher(tiny_cfg, tmp_path, policy):
    cfg = tiny_cfg(f"policy={policy}", "generator=teacher", "eval.limit=8", f"cache_dir={tmp_path}/c")
    metrics = run(cfg, tmp_path / "run")
    assert 0 <= metrics["all"]["em"] <= 100
