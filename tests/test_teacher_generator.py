"""generator=teacher: reads prompts of every protocol, answers only from the evidence in them,
deterministic when greedy, varied when sampled, noisier with noise."""

import pytest
from hydra.utils import instantiate

from rag_lab.core.config import compose
from rag_lab.env.protocols import PROTOCOLS, Action, State, Turn, identify
from rag_lab.env.protocols.base import SEARCH
from rag_lab.env.teacher.generator import TeacherGenerator
from rag_lab.generators.base import Sampling
from rag_lab.train.demonstrations import collect, sample

from conftest import TINY_DATA


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    cfg = compose([*TINY_DATA, f"cache_dir={tmp_path_factory.mktemp('cache')}"])
    return instantiate(cfg.data)


def chain(data):
    return next(
        ex for ex in data.split("dev") if ex.answerable and ex.hops == 2 and ex.type == "compositional"
    )


def support(data, ex, hop):
    return data.corpus.get(ex.decomposition[hop].support_id)


def test_final_answer_needs_the_evidence_in_the_prompt(data):
    ex, teacher, qa = chain(data), TeacherGenerator(data), PROTOCOLS["qa"]()
    turns = [Turn(Action(SEARCH), [support(data, ex, 0), support(data, ex, 1)])]
    with_evidence = teacher.generate([qa.prompt(State(ex.question, turns))], Sampling())[0][0].text
    half = teacher.generate([qa.prompt(State(ex.question, turns[:0]))], Sampling())[0][0].text
    assert with_evidence in ex.answers
    assert half not in ex.answers  # no passages, no answer: it never sees the gold answer


def test_follow_up_query_is_the_next_sub_question(data):
    ex, teacher, query = chain(data), TeacherGenerator(data), PROTOCOLS["stoprag_query"]()
    first = teacher.generate([query.prompt(State(ex.question))], Sampling())[0][0].text
    assert first == ex.decomposition[0].question
    turn = Turn(Action(SEARCH, query=first), [support(data, ex, 0)], answer=ex.decomposition[0].answer)
    second = teacher.generate([query.prompt(State(ex.question, [turn]))], Sampling())[0][0].text
    assert second == ex.decomposition[1].question.replace("#1", ex.decomposition[0].answer)


def test_greedy_is_deterministic_and_sampling_varies(data):
    ex = chain(data)
    teacher, final = TeacherGenerator(data), PROTOCOLS["stoprag_final"]()
    # only the first hop's passage: the answer must be guessed among the entities in view
    turns = [Turn(Action(SEARCH, query="q"), [support(data, ex, 0), *data.corpus[:4]], answer="x")]
    prompt = final.prompt(State(ex.question, turns))
    greedy = [c.text for c in teacher.generate([prompt] * 2, Sampling(n=3))[0]]
    sampled = [c.text for c in teacher.generate([prompt], Sampling(n=16, temperature=0.7))[0]]
    assert len(set(greedy)) == 1 and len(set(sampled)) > 1


def test_noise_lowers_accuracy(data):
    from rag_lab.env import Env
    from rag_lab.policies.stoprag.pipeline import IterativePipeline

    retriever = instantiate(compose([*TINY_DATA]).retriever, corpus=data.corpus)
    examples = [ex for ex in data.split("dev") if ex.answerable]
    scores = []
    for noise in (0.0, 0.5):
        gen = TeacherGenerator(data, vague_query=noise, miscopy=noise, seed=1)
        episodes = IterativePipeline(iterations=5).rollout(Env(data.corpus, retriever, gen), examples)
        scores.append(sum(ep.prediction in ex.answers for ep, ex in zip(episodes, examples, strict=True)))
    assert scores[1] < scores[0]


def test_demonstrations_cover_every_protocol(data):
    retriever = instantiate(compose([*TINY_DATA]).retriever, corpus=data.corpus)
    pairs = sample(collect(TeacherGenerator(data), data.corpus, retriever, data.split("train")[:40]), 20)
    names = {identify(prompt)[0].name for prompt, _ in pairs}
    assert names == set(PROTOCOLS)
    assert all(isinstance(p, str) and c for p, c in pairs)
    assert len(pairs) <= 20 * len(PROTOCOLS)
