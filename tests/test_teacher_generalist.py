"""generator=generalist: the world teacher's reading with a general model's searching and planning — its
queries come from the question's surface, its searches are a fixed number, its plans are the question whole
or split once at its surface, and none of them is the gold decomposition."""

import pytest
from hydra.utils import instantiate

from rag_lab.core.config import compose
from rag_lab.env import Env
from rag_lab.env.protocols import PROTOCOLS, Action, State, Turn
from rag_lab.env.protocols.base import PLAN, SEARCH
from rag_lab.env.teacher.generalist import GeneralistTeacher, Habits, keywords, surface_plan
from rag_lab.generators.base import Sampling
from rag_lab.policies.agent import Agent
from rag_lab.policies.apex.pipeline import APEXPipeline

from conftest import TINY_DATA


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    cfg = compose([*TINY_DATA, f"cache_dir={tmp_path_factory.mktemp('cache')}"])
    return instantiate(cfg.data)


@pytest.fixture(scope="module")
def env(data):
    retriever = instantiate(compose([*TINY_DATA]).retriever, corpus=data.corpus)
    return Env(data.corpus, retriever, None)


def first(data, kind: str, hops: int | None = None):
    return next(
        ex for ex in data.split("train") if ex.type == kind and ex.answerable and hops in (None, ex.hops)
    )


@pytest.mark.parametrize(
    ("question", "plan"),
    [
        (
            "Where was the director of The Kulier born?",
            ("Who is the director of The Kulier?", "Where was #1 born?"),
        ),
        (
            "What is the nationality of the mother of the mother of Geoo Krowick?",
            ("Who is the mother of the mother of Geoo Krowick?", "What is the nationality of #1?"),
        ),
        (
            "Are Dreine Ziadorf and Beoo Drastad from the same country?",
            ("Are Dreine Ziadorf from the same country?", "Are Beoo Drastad from the same country?"),
        ),
        (
            "Which film came out first, The Siabiaer or The Padru?",
            ("Which film came out first, The Siabiaer?", "Which film came out first, The Padru?"),
        ),
        (
            "Who is the maternal grandfather of Viao Vaton?",
            ("Who is the maternal grandfather of Viao Vaton?",),
        ),
        ("Who directed The Mufais?", ("Who directed The Mufais?",)),
        ("What is the meaning of life?", ("What is the meaning of life?",)),
    ],
)
def test_surface_plan_splits_once_at_the_surface(question, plan):
    assert surface_plan(question) == plan


def test_keywords_drop_question_words_and_keep_names():
    assert keywords("Who was born first, Riia Vale or Bo Stad?") == "born first Riia Vale Bo Stad"
    assert keywords("Who is the?") == "Who is the?"  # nothing left: the question itself


def decide(teacher, name: str, state: State, temperature: float = 0.0, n: int = 1) -> list:
    protocol = PROTOCOLS[name]()
    out = teacher.generate([protocol.prompt(state)], Sampling(n=n, temperature=temperature, seed=3))[0]
    return [protocol.parse(c.text) for c in out]


def test_queries_come_from_the_question_never_the_gold_sub_questions(data):
    ex = first(data, "3hop")
    support = data.corpus.get(ex.decomposition[0].support_id)
    turn = Turn(Action(SEARCH, query=ex.question), [support])
    gold = {s.question for s in ex.decomposition} | {
        s.question.replace("#1", ex.decomposition[0].answer) for s in ex.decomposition
    }
    verbatim = GeneralistTeacher(data, verbatim=1.0)
    rephrase = GeneralistTeacher(data, verbatim=0.0, jitter=0.0)
    for name in ("dapo", "evorag", "r3rag", "stoprag_query"):
        assert decide(verbatim, name, State(ex.question))[0].query == ex.question
        # after the first hop's page: the entity read, then the question's keywords
        (again,) = decide(rephrase, name, State(ex.question, [turn]))
        assert again.query == f"{ex.decomposition[0].answer} {keywords(ex.question)}"
        assert again.query not in gold


def test_verbatim_is_drawn_per_prompt_at_its_rate(data):
    teacher = GeneralistTeacher(data, verbatim=0.6)
    states = [State(ex.question) for ex in data.split("train")[:200]]
    prompts = [PROTOCOLS["evorag"]().prompt(s) for s in states]
    queries = [c[0].text for c in teacher.generate(prompts, Sampling())]
    share = sum(q.endswith(s.question) for q, s in zip(queries, states, strict=True)) / len(states)
    assert 0.45 < share < 0.75  # 200 draws at 0.6: a 95% range of about +-0.07
    # greedy is one draw per prompt; samples draw again
    assert teacher.generate(prompts[:1], Sampling())[0][0].text == queries[0]
    sampled = {c.text for c in teacher.generate(prompts[:1], Sampling(n=16, temperature=1.0))[0]}
    assert len(sampled) == 2


@pytest.mark.parametrize("name", ["dapo", "evorag", "r3rag"])
@pytest.mark.parametrize("searches", [1, 3])
def test_it_searches_a_fixed_number_of_times_whatever_it_found(data, env, name, searches):
    teacher = GeneralistTeacher(data, searches=searches, jitter=0.0)
    questions = data.split("dev")[:12]
    episodes = Agent(name, k=3, max_turns=8).rollout(env.with_generator(teacher), questions)
    assert [len(ep.queries) for ep in episodes] == [searches] * len(questions)
    assert all(ep.prediction and not ep.format_failure for ep in episodes)


def test_jitter_searches_one_fewer_or_one_more(data, env):
    teacher = GeneralistTeacher(data, searches=2, jitter=0.5)
    episodes = Agent("evorag", k=3, max_turns=8).rollout(env.with_generator(teacher), data.split("dev"))
    counts = {len(ep.queries) for ep in episodes}
    assert counts == {1, 2, 3}


def test_plans_are_the_question_whole_or_its_surface_split(data):
    ex = first(data, "compositional", hops=2)
    whole = decide(GeneralistTeacher(data, whole_plan=1.0), "apex_plan", State(ex.question))[0]
    split = decide(GeneralistTeacher(data, whole_plan=0.0), "apex_plan", State(ex.question))[0]
    assert (whole.kind, whole.plan) == (PLAN, (ex.question,))
    assert split.plan == surface_plan(ex.question) and len(split.plan) == 2


def test_the_executor_searches_its_sub_question_once_then_answers(data, env):
    ex = first(data, "single_hop")
    teacher = GeneralistTeacher(data, whole_plan=1.0)
    (episode,) = APEXPipeline(k=3, hops=3).rollout(env.with_generator(teacher), [ex])
    assert len(episode.queries) == 1
    assert episode.queries == [ex.question]
    assert episode.prediction in ex.answers


def test_habits_are_checked_when_composed():
    from rag_lab.core.config import ConfigError

    with pytest.raises(ConfigError, match="generator.verbatim"):
        compose(["generator=generalist", "generator.verbatim=2"])
    assert Habits().searches == compose(["generator=generalist"]).generator.searches


def test_ircot_asks_with_its_own_query_and_answers_when_the_ask_finds_nothing(data, env):
    from rag_lab.policies.prompting import ChainOfThought

    questions = [ex for ex in data.split("dev") if ex.hops >= 2][:8]
    teacher = GeneralistTeacher(data, verbatim=1.0)
    episodes = ChainOfThought(retrieve=True, k=1).rollout(env.with_generator(teacher), questions)
    asked = 0
    for ex, ep in zip(questions, episodes, strict=True):
        # IRCoT retrieves with every sentence: the facts it states ("sub-question? answer.": reading) and its
        # asks for a missing fact, which are the question itself, never the next gold sub-question
        asks = [q for q in ep.queries if "? " not in q]
        assert asks and set(asks) == {ex.question}
        asked += len(asks) > 1
        assert ep.prediction and not ep.format_failure
    assert asked  # some chains asked again after the first retrieval
