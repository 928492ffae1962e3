"""SQuAD v1.1 rules, hand-worked."""

import math

import pytest

from rag_lab.eval.metrics import accuracy, exact_match, f1_score, normalize_answer, retrieval_pr
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


def test_answer_reward_reads_conversational_completions():
    completions = [[{"role": "assistant", "content": "Paris"}], "Rome"]
    assert answer_score(completions, answers=[["paris"], ["Paris"]], metric="em") == [1.0, 0.0]
