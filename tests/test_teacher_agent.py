"""The teacher agent: hand-worked final-answer composition, and real runs on the tiny world."""

import pytest

from rag_lab.env.teacher.agent import combine, date_key
from rag_lab.run import run


@pytest.mark.parametrize(
    "question, answers, expected",
    [
        ("Who was born first, Ada Vale or Bo Stad?", ["3 May 1901", "12 March 1899"], "Bo Stad"),
        ("Which film came out first, The Kraf or The Pekes?", ["1975", "1960"], "The Pekes"),
        (
            "Which film has the director who was born first, The Kraf or The Pekes?",
            ["Ada Vale", "Bo Stad", "3 May 1901", "4 May 1901"],
            "The Kraf",
        ),
        ("Are Ada Vale and Bo Stad from the same country?", ["Veloria", "Veloria"], "yes"),
        (
            "Are the directors of The Kraf and The Pekes from the same country?",
            ["A", "B", "Veloria", "Kruia"],
            "no",
        ),
        ("Who was born first, Ada Vale or Bo Stad?", ["3 May 1901", "3 May 1901"], ""),  # a tie: no answer
        ("Where was the director of The Kraf born?", ["Ada Vale", "Laiburg"], "Laiburg"),
    ],
)
def test_combine(question, answers, expected):
    assert combine(question, answers) == expected


def test_date_key():
    assert (
        date_key("12 March 1943") == 19430312 and date_key("1975") == 19750000 and date_key("Paris") is None
    )


def test_teacher_runs_through_the_runner(tiny_cfg, tmp_path):
    clean = run(tiny_cfg("policy=teacher"), tmp_path / "clean")
    noisy = run(
        tiny_cfg("policy=teacher", "policy.miscopy=0.3", "policy.vague_query=0.3"), tmp_path / "noisy"
    )
    top_title = run(tiny_cfg(), tmp_path / "floor")
    assert clean["all"]["em"] > noisy["all"]["em"] > top_title["all"]["em"]
    assert clean["all"]["em"] > 0.5
    assert clean["all"]["n_steps"] > 1.5  # multi-hop: several retrievals per question
