"""R3-RAG's step rewards, the paper's eqs. (5)-(6) and the official code's form, on every branch by hand."""

import pytest

from rag_lab.core.errors import RagLabError
from rag_lab.rewards.r3rag import official_rewards, paper_rewards, process_score, step_reward


@pytest.mark.parametrize(
    ("valid", "final", "correct", "relevance", "reward"),
    [
        (True, False, False, 0.3, 0.3),  # intermediate: Rel only
        (True, False, True, 0.3, 0.3),  # Acc does not count before the final step
        (True, True, True, 0.8, 1.0),  # final: Acc only, Rel is 0
        (True, True, False, 0.8, 0.0),
        (False, False, False, 1.0, -1.0),  # Val 0: −1 whatever the rest
        (False, True, True, 0.0, -1.0),
    ],
)
def test_eq5(valid, final, correct, relevance, reward):
    assert step_reward(valid, final, correct, relevance) == pytest.approx(reward)


@pytest.mark.parametrize(
    ("outcome", "rewards"),
    [
        ("correct", [0.2 * 1.6, 0.6 * 1.6, 1.0 * 1.6]),
        ("incorrect", [0.2 * 0.8, 0.6 * 0.8, 0.0]),
        ("no_answer", [0.2 * 0.8, 0.6 * 0.8]),  # the paper's form: wrong, no final step
        ("format_error", [0.2, 0.6, -1.0]),  # λ_T = 1; the broken step has Val 0
    ],
)
def test_paper_form(outcome, rewards):
    assert paper_rewards([0.2, 0.6], outcome) == pytest.approx(rewards)


def test_paper_form_takes_other_factors():
    assert paper_rewards([0.5], "correct", {"correct": 2.0}) == pytest.approx([1.0, 2.0])
    assert paper_rewards([0.5], "no_answer", {"no_answer": 0.5}) == pytest.approx([0.25])


@pytest.mark.parametrize(
    ("outcome", "rewards"),
    [
        ("correct", [0.4 * 1.6, 0.9 * 1.6, 2.0]),
        ("incorrect", [0.4 * 0.8, 0.9 * 0.8, 0.0]),
        ("no_answer", [0.4 * 0.9, 0.9 * 0.9]),
        ("format_error", [0.4, 0.9, -0.9]),
    ],
)
def test_official_form(outcome, rewards):
    assert official_rewards([0.4, 0.9], outcome) == pytest.approx(rewards)


def test_process_score():
    assert process_score(0.5, 1.0, 0.25) == pytest.approx(0.15 + 0.3 + 0.1)
    assert process_score(1.0, 0.5, 0.0) == pytest.approx(0.3 + 0.15)
    assert process_score(0.0, 0.0, 0.0) == 0.0 and process_score(1.0, 1.0, 1.0) == pytest.approx(1.0)
    assert process_score(0.5, 1.0, 0.25, fatal=True) == 0.0
    assert process_score(0.5, 1.0, 0.25, documents=False) == pytest.approx(0.45)


@pytest.mark.parametrize(
    ("call", "key"),
    [
        (lambda: step_reward(True, False, relevance=1.5), "relevance"),
        (lambda: process_score(0.5, -0.1, 0.5), "process scores"),
        (lambda: process_score(0.5, 1.5, 0.5), "process scores"),
        (
            lambda: paper_rewards([0.5], "timeout"),
            "one of correct, incorrect, no_answer, format_error, got 'timeout'",
        ),
        (
            lambda: official_rewards([0.5], "correct", {"right": 2.0}),
            r"\['right'\] \(settable: correct, incorrect, no_",
        ),
        (
            lambda: paper_rewards([0.5], "format_error", {"format_error": 0.5}),
            "reward.factors: unknown outcomes",
        ),
    ],
)
def test_bad_inputs_are_one_line_errors(call, key):
    with pytest.raises(RagLabError, match=key):
        call()
