"""The multi-stage-reward DAPO rewards (rag_lab/rewards/dapo.py): every branch of eqs. (6)-(12), exact values
worked by hand next to each case. Rollouts are built by the real protocol (DAPOTagged.rollout_text)."""

import numpy as np
import pytest
from hydra.utils import instantiate

from rag_lab.core.config import compose
from rag_lab.core.errors import RagLabError
from rag_lab.data.base import Passage
from rag_lab.env.protocols.base import State, Turn
from rag_lab.env.protocols.tagged import DAPOTagged
from rag_lab.rewards.dapo import (
    SearchReward,
    answer_correct,
    concise,
    correctness,
    final_answer,
    format_reward,
    multistage_answer,
    retrieval_count,
    reward_terms,
    searches,
)

TAGGED = DAPOTagged()


def rollout(*turns: str | tuple[str, list[str]]) -> str:
    """The engine's rollout text: each turn is the policy's text, or (text, retrieved passage texts)."""
    state = State("q")
    for turn in turns:
        text, passages = turn if isinstance(turn, tuple) else (turn, [])
        state.turns.append(Turn(TAGGED.parse(text), [Passage("p", "T", p) for p in passages], text=text))
    return TAGGED.rollout_text(state)


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def searched(*queries: str, answer: str | None = "Paris") -> str:
    """think, then one search / information / reflect round per query, then the answer (None: none)."""
    leads = ["<think>t</think>", *["<reflect>r</reflect>"] * len(queries)][: len(queries)]
    turns = [
        (f"{lead}\n<search>{q}</search>", [f"passage {q}"]) for lead, q in zip(leads, queries, strict=True)
    ]
    end = "<reflect>r</reflect>\n" + (f"<answer>{answer}</answer>" if answer is not None else "")
    return rollout(*turns, end if queries else "<think>t</think>\n" + end)


DIRECT = "<think>a</think>\n<reflect>b</reflect>\n<answer>c</answer>"


# ---- helpers: the policy's own text only -----------------------------------------------------------
def test_information_blocks_are_the_engines_format():
    text = rollout(
        ("<think>t</think>\n<search>q</search>", ["x"]), "<reflect>r</reflect>\n<answer>a</answer>"
    )
    assert text == (
        "<think>t</think>\n<search>q</search>\n<information>\nT: x\n</information>\n"
        "<reflect>r</reflect>\n<answer>a</answer>"
    )


@pytest.mark.parametrize(
    "text, queries, answer",
    [
        (DIRECT, [], "c"),
        (searched(" a b ", "c"), ["a b", "c"], "Paris"),
        (searched("a", answer=None), ["a"], None),
        # tags inside a retrieved passage are the environment's, not the policy's
        (
            rollout(
                ("<think>t</think>\n<search>q</search>", ["<search>x</search> <answer>y</answer>"]),
                "<reflect>r</reflect>",
            ),
            ["q"],
            None,
        ),
        (
            rollout(
                ("<think>t</think>\n<search>q</search>", ["<answer>y</answer>"]),
                "<reflect>r</reflect>\n<answer> z </answer>",
            ),
            ["q"],
            "z",
        ),
        ("<answer>first</answer> <answer>last</answer>", [], "last"),
        ("<search></search><answer></answer>", [""], ""),
    ],
)
def test_searches_and_final_answer(text, queries, answer):
    assert searches(text) == queries and final_answer(text) == answer
    assert searches(chat(text)) == queries and final_answer(chat(text)) == answer


# ---- r_f, eq. (6) ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, reward",
    [
        (DIRECT, 1.0),  # no retrieval: think, reflect, answer
        (searched("a"), 1.0),  # think, (search, information, reflect), answer
        (searched("a", "b", "c"), 1.0),  # several rounds
        ("<reflect>b</reflect>\n<answer>c</answer>", -1.0),  # missing think
        ("<think>a</think>\nSo:\n<reflect>b</reflect>\n<answer>c</answer>", -1.0),  # text outside tags
        ("<think>a</think>\n<answer>c</answer>", -1.0),  # answer without reflect
        (rollout(("<think>t</think>\n<search>q</search>", ["x"]), "<answer>c</answer>"), -1.0),  # no reflect
        (searched("a", answer=None), -1.0),  # never answered
        (searched("a").replace("<answer>", "<reflect>again</reflect>\n<answer>"), -1.0),  # a second reflect
        ("<think>a</think>\n<reflect>b</reflect>\n<reflect>b</reflect>\n<answer>c</answer>", -1.0),
        (rollout("<think>t</think>\n<search>q</search>"), -1.0),  # search without information
        ("", -1.0),
    ],
)
def test_format_reward(text, reward):
    assert format_reward([text]) == [reward]
    assert format_reward([chat(text)]) == [reward]


# ---- concise, r_s, eqs. (7)-(9) -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "query, settings, ok",
    [
        ("Lia Kriaburg birthplace", {}, True),
        ("WHERE Lia Kriaburg born", {}, False),  # question word, any case
        ("Lia Kriaburg born?", {}, False),  # question mark
        ("birthplace of Lia Kriaburg", {}, False),  # a preposition (the paper names them)
        ("birthplace of Lia Kriaburg", {"prepositions": ()}, True),
        ("tell me Lia Kriaburg", {}, False),  # fillers
        ("very old Lia", {}, False),
        ("somewhere howard", {}, True),  # whole words only
        (" ".join("abcdefghij"), {}, True),  # 10 words
        (" ".join("abcdefghijk"), {}, False),  # 11
        ("a b c", {"max_words": 2}, False),
        ("how a", {"question_words": []}, True),
        ("Lia born", {"fillers": ["born"]}, False),
        ("", {}, False),
    ],
)
def test_concise(query, settings, ok):
    assert concise(query, **settings) is ok


class FakeEncoder:
    """Known 2-d vectors, c and d not unit length: cos(a, b) = 0.6, cos(a, c) = 0, cos(b, c) = 0.8,
    cos(a, d) = -1."""

    VECTORS = {"a": [1.0, 0.0], "b": [0.6, 0.8], "c": [0.0, 2.0], "d": [-3.0, 0.0], "where is b?": [0.6, 0.8]}

    def __init__(self):
        self.calls: list[list[str]] = []

    def encode(self, texts):
        self.calls.append(list(texts))
        return np.array([self.VECTORS[t] for t in texts], dtype=np.float32)


@pytest.mark.parametrize(
    "queries, mean, eq8",
    [
        ([], 0.0, 0.0),  # RC 0
        (["a"], 0.0, 0.0),  # RC 1, concise
        (["how is a?"], -1.0, -1.0),  # RC 1, not concise
        (["a", "b"], -0.6, -0.3),  # RC 2: one pair
        (["a", "where is b?"], -0.6, -0.3),  # RC > 1 ignores conciseness
        (["a", "a"], -1.0, -0.5),  # the same query twice
        (["a", "d"], 1.0, 0.5),  # opposite embeddings
        (["a", "b", "c"], -(0.6 + 0.0 + 0.8) / 3, -(0.6 + 0.0 + 0.8) / 6),  # RC 3: three pairs, N(N-1) = 6
    ],
)
def test_search_reward(queries, mean, eq8):
    text = searched(*queries)
    assert SearchReward(FakeEncoder())([text]) == pytest.approx([mean], abs=1e-6)
    assert SearchReward(FakeEncoder(), normalization="eq8")([chat(text)]) == pytest.approx([eq8], abs=1e-6)


def test_search_reward_embeds_a_batch_in_one_call_and_only_several_searches():
    encoder = FakeEncoder()
    reward = SearchReward(encoder, max_words=1)
    out = reward([searched("a", "b"), searched("a b"), searched("c", "a", "b"), searched()])
    assert out == pytest.approx([-0.6, -1.0, -1.4 / 3, 0.0], abs=1e-6)
    assert encoder.calls == [["a", "b", "c", "a", "b"]]
    assert reward.__name__ == "search"


def test_search_reward_embeds_queries_with_the_encoders_query_prefix():
    encoder = FakeEncoder()
    encoder.query_prefix = "query: "
    encoder.VECTORS = {"query: a": [1.0, 0.0], "query: b": [0.6, 0.8]}
    assert SearchReward(encoder)([searched("a", "b")]) == pytest.approx([-0.6], abs=1e-6)
    assert encoder.calls == [["query: a", "query: b"]]


def test_search_reward_default_encoder_is_minilm_built_on_first_need():
    reward = SearchReward()
    assert reward([searched("a"), searched()]) == [0.0, 0.0] and reward.encoder is None
    same, other = reward([searched("Paris France", "Paris France"), searched("Paris France", "enzymes")])
    assert same == pytest.approx(-1.0, abs=1e-5) and -1.0 < other < 0.0
    assert type(reward.encoder).__name__ == "Encoder"


def test_search_reward_rejects_an_unknown_normalization():
    with pytest.raises(RagLabError, match="normalization"):
        SearchReward(FakeEncoder(), normalization="sum")


# ---- r_a, eqs. (10)-(11) and table 2's unified reward ----------------------------------------------------
# beta 0.3; stage 1: right 1, wrong -1 + 0.3 RC; stage 2: right 1 - 0.3 RC, wrong -1; unified: both tied.
TABLE = [
    # stage, right?, [reward at RC 0, 1, 2, 3]
    (1, True, [1.0, 1.0, 1.0, 1.0]),
    (1, False, [-1.0, -0.7, -0.4, -0.1]),
    (2, True, [1.0, 0.7, 0.4, 0.1]),
    (2, False, [-1.0, -1.0, -1.0, -1.0]),
    ("unified", True, [1.0, 0.7, 0.4, 0.1]),
    ("unified", False, [-1.0, -0.7, -0.4, -0.1]),
]


@pytest.mark.parametrize("stage, right, rewards", TABLE)
def test_multistage_answer(stage, right, rewards):
    completions = [searched(*"abc"[:rc], answer="Paris" if right else "Rome") for rc in range(4)]
    assert multistage_answer(completions, [["Paris"]] * 4, stage=stage) == rewards
    assert multistage_answer([chat(c) for c in completions], [["Paris"]] * 4, stage=stage) == rewards


@pytest.mark.parametrize(
    "stage, right, beta, reward",
    [
        (1, False, 0.5, 0.5),  # -1 + 0.5 * 3
        (2, True, 0.5, -0.5),  # 1 - 0.5 * 3
        ("unified", False, 0.0, -1.0),
        ("unified", True, 0.0, 1.0),
    ],
)
def test_multistage_answer_beta(stage, right, beta, reward):
    completion = searched("a", "b", "c", answer="Paris" if right else "Rome")
    assert multistage_answer([completion], [["Paris"]], stage=stage, beta=beta) == [reward]


@pytest.mark.parametrize(
    "answer, em, acc",
    [
        ("Paris", True, True),
        ("the paris.", True, True),  # SQuAD normalisation
        ("in Paris", False, True),  # Acc: a gold occurs in the answer
        ("Rome", False, False),
        (None, False, False),  # no <answer>: wrong, even if the text names the gold
    ],
)
def test_correct_em_and_acc(answer, em, acc):
    completion = searched("Paris", answer=answer)
    golds = [["Lyon", "Paris"]]
    assert correctness([completion], golds, "em") == [em] and correctness([completion], golds, "acc") == [acc]
    assert multistage_answer([completion], golds, stage=2, correct="acc") == [0.7 if acc else -1.0]
    assert answer_correct([completion], golds) == [float(acc)]  # the monitor's default is Acc
    assert answer_correct([completion], golds, correct="em") == [float(em)]


def test_correct_by_judge_is_one_batched_call_over_the_answered():
    calls = []

    def judge(predictions, golds):
        calls.append((predictions, golds))
        return [1.0 if p == "the capital" else 0.0 for p in predictions]

    completions = [searched(answer="the capital"), searched("a", answer="Rome"), searched("a", answer=None)]
    golds = [["Paris"], ["Rome!"], ["Oslo"]]
    assert multistage_answer(completions, golds, stage=1, correct="judge", judge=judge) == [1.0, -0.7, -0.7]
    assert calls == [(["the capital", "Rome"], [["Paris"], ["Rome!"]])]
    assert multistage_answer([completions[2]], [golds[2]], correct="judge", judge=judge) == [-0.7]
    assert len(calls) == 1  # nothing answered: no call


@pytest.mark.parametrize(
    "settings, key",
    [
        ({"correct": "judge"}, "reward.correct"),  # no judge
        ({"correct": "f1"}, "reward.correct"),
        ({"stage": 3}, "reward.stage"),
        ({"stage": "2"}, "reward.stage"),
    ],
)
def test_multistage_answer_bad_settings_are_one_line_errors(settings, key):
    with pytest.raises(RagLabError, match=key) as e:
        multistage_answer([DIRECT], [["c"]], **settings)
    assert "\n" not in str(e.value)


# ---- monitors and the composite, eq. (12) ------------------------------------------------------------
def test_retrieval_count():
    texts = [searched(), searched("a"), searched("a", "b", "c"), "<search>x</search>"]
    assert retrieval_count(texts) == [0.0, 1.0, 3.0, 1.0]
    assert retrieval_count([chat(t) for t in texts]) == [0.0, 1.0, 3.0, 1.0]


def test_reward_dapo_composes_the_three_terms():
    cfg = compose(["reward=dapo"])
    targets = {name: cfg.reward[name]._target_.rsplit(".", 1)[-1] for name in ("answer", "search", "format")}
    assert targets == {"answer": "multistage_answer", "search": "SearchReward", "format": "format_reward"}
    rewards = instantiate(cfg.reward)
    assert list(rewards) == ["answer", "search", "format"]
    # right answer after one concise search: r_a 1 (stage 1) + r_s 0 + r_f 1
    completion = searched("Paris", answer="Paris")
    assert sum(fn([completion], answers=[["Paris"]])[0] for fn in rewards.values()) == 2.0
    # a wrong direct answer with a broken format, stage 2: -1 + 0 - 1
    rewards["answer"] = instantiate(cfg.reward.answer, stage=2)
    assert sum(fn(["<answer>Rome</answer>"], answers=[["Paris"]])[0] for fn in rewards.values()) == -2.0
    assert list(instantiate(compose(["reward=dapo", "reward.search=null"]).reward)) == ["answer", "format"]
    assert compose(["reward=unified_answer"]).reward.stage == "unified"
    assert reward_terms(answer=None) == {}


@pytest.mark.parametrize(
    "change, problems",
    [
        ({}, []),
        ({"stage": 2}, []),
        ({"stage": "unified"}, []),
        ({"stage": 3}, [("stage", "3 is not one of 1, 2, unified")]),
        ({"correct": "acc"}, []),
        ({"correct": "f1"}, [("correct", "'f1' is not one of em, acc, judge")]),
        (
            {"correct": "judge"},
            [("judge", "correct=judge needs a judge (a judge config, e.g. rag_lab.eval.judge.LLMJudge)")],
        ),
        ({"correct": "judge", "judge": {"_target_": "x"}}, []),
        ({"beta": 0.0}, []),
        ({"beta": -0.1}, [("beta", "must be >= 0, got -0.1")]),
        (
            {"stage": 0, "beta": -1.0},
            [("stage", "0 is not one of 1, 2, unified"), ("beta", "must be >= 0, got -1.0")],
        ),
    ],
)
def test_answer_reward_settings_are_checked_with_the_config(change, problems):
    from rag_lab.rewards.dapo import check_answer_settings

    settings = {"stage": 1, "beta": 0.3, "correct": "em", "judge": None} | change
    assert check_answer_settings(settings, None) == problems


def test_a_reward_group_reaches_a_policy_as_named_terms():
    """reward=dapo is a dict of terms; a single reward (reward=format, a partial; reward=sepr, an object)
    becomes one term under its function's or its class's name; null terms and no reward are none."""
    from functools import partial

    from rag_lab.rewards.base import named
    from rag_lab.rewards.dapo import format_reward

    class PlanReward:
        def __call__(self, completions, **_):
            return [0.0] * len(completions)

    plan, bound = PlanReward(), partial(format_reward)
    assert named(bound) == {"format_reward": bound}
    assert (
        list(named(format_reward)) == ["format_reward"]
        and named(format_reward)["format_reward"] is format_reward
    )
    assert named(plan) == {"planreward": plan}
    assert named({"answer": format_reward, "search": None}) == {"answer": format_reward}
    assert named(None) == {}


def test_rewards_refuse_columns_of_other_lengths_and_default_to_the_papers_choices():
    from rag_lab.rewards.answer import answer_score
    from rag_lab.rewards.dapo import correctness

    assert answer_score(["Paris France"], answers=[["Paris"]]) == [pytest.approx(2 / 3)]  # F1 by default
    assert correctness(["<answer>the Paris</answer>"], [["Paris"]]) == [
        True
    ]  # EM by default: the article drops
    assert correctness(["<answer>in Paris</answer>"], [["Paris"]]) == [False]
    with pytest.raises(ValueError):
        answer_score(["a", "b"], answers=[["a"]])
    with pytest.raises(
        RagLabError, match=r"^reward.correct: judge needs reward.judge \(an LLM judge, e.g. judge=llm's\)$"
    ):
        correctness(["<answer>a</answer>"], [["a"]], "judge")
    with pytest.raises(ValueError):
        correctness(
            ["<answer>a</answer>", "<answer>b</answer>"], [["a"], ["b"]], "judge", judge=lambda p, g: [1.0]
        )
