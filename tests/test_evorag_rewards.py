"""EVO-RAG's seven step rewards and table 1's weights on hand-made episodes, against values by hand."""

import pytest

from rag_lab.core.errors import RagLabError
from rag_lab.data.base import QAExample
from rag_lab.env.episode import Episode, Step
from rag_lab.rewards import evorag
from rag_lab.rewards.evorag import COMPONENTS, action_penalty, answer_reward, step_rewards, weighted, weights


class Toy:
    """Exact unit vectors: a and c are the same direction, b is at cosine 0.6 to them."""

    vectors = {"a": [1.0, 0.0], "b": [0.6, 0.8], "c": [2.0, 0.0]}

    def __init__(self):
        self.calls = []

    def encode(self, texts):
        self.calls.append(list(texts))
        return [self.vectors[t] for t in texts]


def search(query, ids):
    return Step(action="search", query=query, retrieved_ids=list(ids))


EXAMPLE = QAExample("q1", "Where?", ("Paris",), supporting_ids=("p2",))


def test_every_component_of_a_hand_made_episode():
    episode = Episode(
        "q1",
        "Where?",
        prediction="Paris",
        steps=[
            search("a", ["p1"]),  # t=1: no gold → ret −1; first query → dup 0
            search("b", ["p2", "p9"]),  # t=2: gold → ret +1; cos(b, a) = 0.6; p = 0.2 < 0.3: no act
            Step(action="backtrack"),  # t=3: bt −1
            search("c", ["p3"]),  # t=4: p = 0.4; cos(c, a) = 1 → dup −1, act −1
            Step(action="answer"),  # t=5: EM 1, F1 1
        ],
    )
    encoder = Toy()
    (rows,) = step_rewards([episode], [EXAMPLE], encoder, t_max=10)
    assert encoder.calls == [["a", "b", "c"]]
    expected = [
        {"ret": -1.0, "act": 0.0, "dup": 0.0, "bt": 0.0, "ref": 0.0, "step": -1.0, "ans": 0.0},
        {"ret": 1.0, "act": 0.0, "dup": -0.6, "bt": 0.0, "ref": 0.0, "step": -1.0, "ans": 0.0},
        {"ret": 0.0, "act": 0.0, "dup": 0.0, "bt": -1.0, "ref": 0.0, "step": -1.0, "ans": 0.0},
        {"ret": -1.0, "act": -1.0, "dup": -1.0, "bt": 0.0, "ref": 0.0, "step": -1.0, "ans": 0.0},
        {"ret": 0.0, "act": 0.0, "dup": 0.0, "bt": 0.0, "ref": 0.0, "step": -1.0, "ans": 1.0},
    ]
    assert [{k: pytest.approx(v) for k, v in row.items()} for row in rows] == expected
    # Stage 1, T_max 10. t=2 (p 0.2): β 1.8 · 1 + γ 0.18 · −0.6 + η 0.026 · −1 = 1.666.
    # t=5 (p 0.5): κ 0.075 · 1 + η 0.035 · −1 = 0.04.
    totals = weighted(rows, stage=1, t_max=10)
    assert totals[1] == pytest.approx(1.8 - 0.108 - 0.026)
    assert totals[4] == pytest.approx(0.075 - 0.035)
    # Stage 2, t=4 (p 0.4): β 0.8 · −1 + λ 0.64 · −1 + γ 0.78 · −1 + η 0.07 · −1.
    assert weighted(rows, stage=2, t_max=10)[3] == pytest.approx(-0.8 - 0.64 - 0.78 - 0.07)
    # T_max defaults to the paper's 20
    assert weighted(rows, stage=1) == weighted(rows, stage=1, t_max=20) != weighted(rows, stage=1, t_max=21)


@pytest.mark.parametrize(("answerable", "ref"), [(False, 1.0), (True, -1.0)])
def test_refusal_is_scored_against_the_answerable_flag(answerable, ref):
    example = QAExample("q2", "Who?", ("Ada",), answerable=answerable)
    episode = Episode("q2", "Who?", steps=[Step(action="refuse")])
    (rows,) = step_rewards([episode], [example], Toy())
    assert rows == [{"ret": 0.0, "act": 0.0, "dup": 0.0, "bt": 0.0, "ref": ref, "step": -1.0, "ans": 0.0}]


def test_a_broken_step_pays_only_the_step_cost_and_nothing_is_embedded():
    episode = Episode("q1", "Where?", format_failure=True, steps=[Step(action="invalid", error="no action")])
    encoder = Toy()
    (rows,) = step_rewards([episode], [EXAMPLE], encoder)
    assert rows == [dict.fromkeys(COMPONENTS, 0.0) | {"step": -1.0}] and encoder.calls == []


def test_sub_queries_of_other_episodes_do_not_count_as_earlier():
    first = Episode("q1", "Where?", steps=[search("a", ["p2"])])
    second = Episode("q1", "Where?", steps=[search("c", ["p2"])])
    rows = step_rewards([first, second], [EXAMPLE, EXAMPLE], Toy())
    assert rows[1][0]["dup"] == 0.0


def test_the_schedule_interpolates_table_1_within_each_stage():
    assert weights(1, 0)["ret"] == 2.0 and weights(1, 20)["ret"] == 1.0  # Start → Mid
    assert weights(2, 0)["ret"] == 1.0 and weights(2, 20)["ret"] == 0.5  # Mid → End
    assert weights(2, 40)["ans"] == pytest.approx(1.0)  # p capped at 1
    assert weights(1, 3, schedule="fixed") == weights(1, 17, schedule="fixed") == weights(1, 10)


@pytest.mark.parametrize(
    ("call", "key"),
    [
        (lambda: weights(3, 1), "reward.stage"),
        (lambda: weights(1, 1, schedule="cosine"), "reward.schedule"),
        (
            lambda: weighted([], stage=1, components=["retrieval"]),
            r"\['retrieval'\] \(known: ret, act, dup, bt",
        ),
        (lambda: step_rewards([], [EXAMPLE], Toy()), "step_rewards"),
    ],
)
def test_bad_settings_are_one_line_errors(call, key):
    with pytest.raises(RagLabError, match=key):
        call()


def test_the_late_search_penalty_starts_at_p_0_3_and_needs_an_overlap():
    assert action_penalty("search", 0.3, -0.4) == -1.0 and action_penalty("search", 0.29, -0.4) == 0.0
    assert action_penalty("search", 0.9, -0.5) == -1.0 and action_penalty("search", 0.9, 0.0) == 0.0
    assert action_penalty("backtrack", 0.9, -1.0) == 0.0


def test_positions_count_from_one_over_the_default_t_max_20():
    # six searches of the same direction: the sixth (p = 6 / 20) is the first past 0.3
    episode = Episode("q1", "Where?", steps=[search("a", ["p1"]) for _ in range(6)])
    (rows,) = step_rewards([episode], [EXAMPLE], Toy())
    assert [row["act"] for row in rows] == [0.0] * 5 + [-1.0]


def test_without_an_encoder_the_default_one_embeds(monkeypatch):
    toy = Toy()
    monkeypatch.setattr(evorag, "default_encoder", lambda: toy)
    step_rewards([Episode("q1", "Where?", steps=[search("a", ["p1"])])], [EXAMPLE])
    assert toy.calls == [["a"]]


def test_the_answer_is_scored_with_the_chosen_rules():
    # SQuAD's F1 gives "yes" against "yes sir" 2/3; HotpotQA's rule scores a yes/no that differs 0
    example = QAExample("q3", "Is it?", ("yes sir",))
    episode = Episode("q3", "Is it?", prediction="yes", steps=[Step(action="answer")])
    assert answer_reward("answer", "yes", ["yes sir"]) == pytest.approx(1 / 3)  # the default: SQuAD
    ((squad,),) = step_rewards([episode], [example], Toy())
    ((hotpot,),) = step_rewards([episode], [example], Toy(), scorer="hotpotqa")
    assert squad["ans"] == pytest.approx(1 / 3) and hotpot["ans"] == 0.0


def test_the_fixed_schedule_is_not_the_dynamic_one():
    rows = [dict.fromkeys(COMPONENTS, 1.0)] * 4
    assert weighted(rows, stage=1, t_max=4, schedule="fixed") != weighted(rows, stage=1, t_max=4)
