"""policy=oracle_rag: each question's gold supporting passages in the prompt, no search; both readers."""

import random
from dataclasses import replace

import pytest
from hydra.utils import instantiate

from rag_lab.core.config import ConfigError
from rag_lab.env import Env
from rag_lab.env.protocols.simple import QA, CoT
from rag_lab.env.teacher.generator import TeacherGenerator
from rag_lab.generators.base import Completion
from rag_lab.policies.oracle import OracleRAG, check_supports


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from rag_lab.core.config import compose

    from conftest import TINY_DATA

    cfg = compose([*TINY_DATA, f"cache_dir={tmp_path_factory.mktemp('cache')}"])
    return instantiate(cfg.data)


class Echo:
    """Answers every prompt with ``reply``; keeps the prompts."""

    def __init__(self, reply: str = "x"):
        self.reply, self.prompts = reply, []

    def generate(self, prompts, sampling):
        self.prompts += list(prompts)
        return [[Completion(self.reply)] for _ in prompts]


def titles_in(prompt: str) -> list[str]:
    """The titles of the documents a qa / cot prompt shows, in order."""
    state = (QA().read(prompt) or CoT().read(prompt)) if isinstance(prompt, str) else None
    assert state is not None, prompt
    return [p.title for turn in state.turns for p in turn.passages]


@pytest.mark.parametrize("order", ["shuffled", "gold"])
def test_the_prompt_holds_exactly_the_gold_passages_and_nothing_is_searched(world, order):
    examples = [ex for ex in world.split("test") if ex.answerable and ex.hops >= 2][:8]
    echo = Echo()
    env = Env(world.corpus, None, echo)  # no retriever: a search would raise
    episodes = OracleRAG(reader="qa", order=order).rollout(env, examples)
    for ex, prompt, ep in zip(examples, echo.prompts, episodes, strict=True):
        expected = [world.corpus.get(pid).title for pid in ex.supporting_ids]
        shown = titles_in(prompt)
        assert sorted(shown) == sorted(expected)
        if order == "gold":
            assert shown == expected
        else:  # the question id seeds the order
            rng_order = list(expected)
            random.Random(ex.id).shuffle(rng_order)
            assert shown == rng_order
        assert ep.queries == [] and ep.retrieved_ids == [] and ep.prediction == "x"


def test_a_support_the_corpus_lacks_is_left_out(world):
    """A withheld page (synth's unanswerable questions) or a support outside a sampled corpus: the prompt
    holds the supports that exist, as a perfect search would find them."""
    ex = next(ex for ex in world.split("test") if ex.hops >= 2)
    held = list(ex.supporting_ids)
    ex = replace(ex, supporting_ids=(held[0], "not-in-the-corpus", *held[1:]))
    echo = Echo()
    OracleRAG(reader="qa", order="gold").rollout(Env(world.corpus, None, echo), [ex])
    assert titles_in(echo.prompts[0]) == [world.corpus.get(pid).title for pid in held]


def test_the_teacher_reads_gold_chains_with_both_readers(world):
    """The world teacher (a rule-based reader) answers every answerable question from its gold passages;
    with cot it writes one sentence a hop, then the answer."""
    examples = [
        ex for ex in world.split("test") if ex.answerable and ex.type in ("single_hop", "compositional")
    ]
    env = Env(world.corpus, None, TeacherGenerator(world))
    for reader in ("qa", "cot"):
        episodes = OracleRAG(reader=reader).rollout(env, examples)
        right = [ep.prediction in ex.answers for ex, ep in zip(examples, episodes, strict=True)]
        assert sum(right) >= 0.9 * len(examples), reader
    hops = [len(ep.steps) - 1 for ep in episodes]  # the last step is "So the answer is: ..."
    assert hops == [ex.hops for ex in examples]


def test_the_hops_reader_asks_each_gold_sub_question_with_its_own_passage(world):
    """reader=hops: APEX's executor once a hop, its sub-question the gold one with the earlier answers filled
    in and its evidence that hop's gold passage alone, then APEX's synthesis; nothing is searched."""
    examples = [ex for ex in world.split("test") if ex.answerable and ex.type in ("3hop", "comparison")][:6]
    echo = Echo()
    OracleRAG(reader="hops").rollout(Env(world.corpus, None, echo), examples[:1])
    from rag_lab.env.protocols.apex import APEXExecute

    first, shown = examples[0].decomposition[0], APEXExecute().read(echo.prompts[0])
    assert shown.focus == first.question
    assert [p.title for t in shown.turns for p in t.passages] == [world.corpus.get(first.support_id).title]
    assert len(echo.prompts) == examples[0].hops + 1  # a call a hop, then the synthesis
    episodes = OracleRAG(reader="hops").rollout(Env(world.corpus, None, TeacherGenerator(world)), examples)
    for ex, ep in zip(examples, episodes, strict=True):
        assert ep.prediction in ex.answers and ep.queries == [] and len(ep.steps) == ex.hops + 1


def test_bad_settings_name_the_key(world):
    with pytest.raises(ConfigError, match=r"policy\.reader: 'rag' is not one of qa, cot, hops"):
        OracleRAG(reader="rag")
    with pytest.raises(ConfigError, match=r"policy\.order: 'random'"):
        OracleRAG(order="random")


def test_a_dataset_without_supports_is_named(world):
    class NoSupports:
        name, path = "nq", "data/nq"

        def split(self, name):
            return [
                ex.__class__(id=ex.id, question=ex.question, answers=ex.answers) for ex in world.split(name)
            ]

    with pytest.raises(
        ConfigError, match=r"data=nq \(data/nq, split dev\) names no gold supporting passages"
    ):
        check_supports(NoSupports(), "dev")
    check_supports(world, "dev")  # synth names them: no error
