"""SQuAD v1.1 rules, hand-worked."""

import math

import pytest

from rag_lab.eval.metrics import (
    SCORERS,
    accuracy,
    answer_recall,
    exact_match,
    f1_score,
    normalize_answer,
    retrieval_pr,
)
from rag_lab.rewards.answer import answer_score


@pytest.mark.parametrize(
    "raw, normalized",
    [
        ("The Eiffel Tower", "eiffel tower"),
        ("  an apple,  a pear! ", "apple pear"),
        ("Theater", "theater"),  # 'the' only as a whole word
        ("U.S.A.", "usa"),
        ("", ""),
    ],
)
def test_normalize(raw, normalized):
    assert normalize_answer(raw) == normalized


@pytest.mark.parametrize(
    "pred, golds, em, f1, acc",
    [
        ("Paris", ["paris"], 1.0, 1.0, 1.0),
        ("the city of Paris", ["Paris"], 0.0, 2 * (1 / 3) * 1 / (1 / 3 + 1), 1.0),  # P=1/3, R=1
        ("Paris France", ["Paris", "Paris, France"], 1.0, 1.0, 1.0),  # best over golds
        ("London", ["Paris"], 0.0, 0.0, 0.0),
        ("", ["Paris"], 0.0, 0.0, 0.0),
        ("a b b", ["b b c"], 0.0, 2 * (2 / 2) * (2 / 3) / (1 + 2 / 3), 0.0),  # 'a' is an article: pred = b b
    ],
)
def test_em_f1_acc(pred, golds, em, f1, acc):
    assert exact_match(pred, golds) == em
    assert math.isclose(f1_score(pred, golds), f1)
    assert accuracy(pred, golds) == acc


def test_retrieval_precision_recall():
    assert retrieval_pr(["a", "b", "b", "c"], ["a", "d"]) == (1 / 3, 1 / 2)
    assert retrieval_pr([], ["a"]) == (0.0, 0.0)
    assert all(math.isnan(x) for x in retrieval_pr(["a"], []))


def test_answer_recall_is_any_normalised_gold_in_any_passage():
    passages = ["Paris\nParis is the capital of France.", "The Eiffel Tower"]
    assert answer_recall(passages, ["france"]) == 1.0  # normalised: case
    assert (
        answer_recall(passages, ["Berlin", "the  EIFFEL tower!"]) == 1.0
    )  # any gold, any passage, articles/punct.
    assert answer_recall(passages, ["Berlin"]) == 0.0
    assert answer_recall([], ["France"]) == answer_recall(passages, []) == 0.0
    assert answer_recall(passages, ["The", "!"]) == 0.0  # a gold that normalises to nothing matches nothing
    assert isinstance(answer_recall(passages, ["Berlin"]), float)


def test_answer_reward_reads_conversational_completions():
    completions = [[{"role": "assistant", "content": "Paris"}], "Rome"]
    assert answer_score(completions, answers=[["paris"], ["Paris"]], metric="em") == [1.0, 0.0]


# Official-rule cases, worked by hand: (scorer, prediction, golds, em, f1, precision, recall).
OFFICIAL_CASES = [
    # HotpotQA: yes/no/noanswer on either side and different -> F1 = P = R = 0, even with token overlap.
    ("hotpotqa", "yes", ["no"], 0.0, 0.0, 0.0, 0.0),
    ("hotpotqa", "yes it is", ["yes"], 0.0, 0.0, 0.0, 0.0),  # gold 'yes', pred differs
    ("hotpotqa", "no", ["no"], 1.0, 1.0, 1.0, 1.0),
    ("hotpotqa", "noanswer", ["the noanswer"], 1.0, 1.0, 1.0, 1.0),  # both normalise to 'noanswer'
    # HotpotQA scores against the single gold only: the alias is ignored.
    ("hotpotqa", "NYC", ["New York City", "NYC"], 0.0, 0.0, 0.0, 0.0),
    ("hotpotqa", "New York", ["New York City"], 0.0, 0.8, 1.0, 2 / 3),  # P=2/2, R=2/3, F1=0.8
    # SQuAD v1.1: best over golds; empty prediction scores 0 (no empty rule).
    ("squad", "NYC", ["New York City", "NYC"], 1.0, 1.0, 1.0, 1.0),
    ("squad", "", [""], 1.0, 0.0, 0.0, 0.0),
    ("squad", "yes", ["no"], 0.0, 0.0, 0.0, 0.0),
    # 2Wiki: the yes/no rule AND each of EM, F1, P, R maximised separately over golds.
    ("2wiki", "yes", ["no", "yes"], 1.0, 1.0, 1.0, 1.0),
    ("2wiki", "yes sir", ["yes"], 0.0, 0.0, 0.0, 0.0),
    # gold 1 'x b c d' -> P=2/2 R=2/4 F1=2/3; gold 2 'b' -> P=1/2 R=1 F1=2/3: P from gold 1, R from gold 2.
    ("2wiki", "b c", ["x b c d", "b"], 0.0, 2 / 3, 1.0, 1.0),
    # MuSiQue: an empty token list on either side -> F1 = 1 iff both are empty.
    ("musique", "", [""], 1.0, 1.0, 1.0, 1.0),
    ("musique", "the", [""], 1.0, 1.0, 1.0, 1.0),  # 'the' normalises to nothing
    ("musique", "", ["Paris"], 0.0, 0.0, 0.0, 0.0),
    ("musique", "Paris", ["", "Paris"], 1.0, 1.0, 1.0, 1.0),
    ("musique", "yes", ["no"], 0.0, 0.0, 0.0, 0.0),
    ("musique", "Paris France", ["Lyon", "Paris"], 0.0, 2 / 3, 0.5, 1.0),
]


@pytest.mark.parametrize("scorer, pred, golds, em, f1, precision, recall", OFFICIAL_CASES)
def test_official_rules(scorer, pred, golds, em, f1, precision, recall):
    metrics = SCORERS[scorer]
    got = [metrics[m](pred, golds) for m in ["em", "f1", "precision", "recall"]]
    assert got == pytest.approx([em, f1, precision, recall])


@pytest.mark.parametrize("scorer", sorted(SCORERS))
def test_acc_is_substring_of_normalised_prediction(scorer):
    acc = SCORERS[scorer]["acc"]
    assert acc("It was the city of Paris, France.", ["paris"]) == 1.0
    assert acc("Parisian", ["Paris"]) == 1.0  # substring, not token match: FlashRAG's rule
    assert acc("Lyon", ["Paris"]) == 0.0


def test_the_rules_each_scorer_applies():
    """What mutation testing found unpinned: the rules' defaults, the first-gold rule on Acc, no gold."""
    from rag_lab.eval.metrics import token_prf

    # SQuAD's token F1 has no yes/no rule: "yes it is" against "yes" is 2PR/(P+R) = 2(1/3)(1)/(4/3) = 0.5
    assert token_prf("yes it is", "yes")[0] == 0.5
    assert token_prf("yes it is", "yes", yes_no_rule=True)[0] == 0.0
    assert SCORERS["hotpotqa"]["acc"]("Paris", ["London", "Paris"]) == 0.0  # HotpotQA scores the first gold
    assert SCORERS["squad"]["acc"]("Paris", ["London", "Paris"]) == 1.0
    assert all(SCORERS[name][m]("x", []) == 0.0 for name in SCORERS for m in ("em", "f1", "acc"))
    assert list(SCORERS) == ["squad", "hotpotqa", "2wiki", "musique"] and len(SCORERS) == 4
