"""Answer rewards: the score of a final answer against the gold answers (Stop-RAG's S, R3-RAG's
outcome match, EVO-RAG's r_ans)."""

from typing import Any

from rag_lab.eval.metrics import SCORERS


def completion_text(completion: Any) -> str:
    """A completion's text: TRL passes conversational ones as ``[{"role": "assistant", "content": ...}]``.

    >>> completion_text([{"role": "assistant", "content": "Paris"}]), completion_text("Rome")
    ('Paris', 'Rome')
    """
    if isinstance(completion, list):
        return completion[-1]["content"] if completion else ""
    return str(completion)


def answer_score(
    completions: list[Any],
    answers: list[list[str]],
    # em | f1 | acc (SQuAD rules), the best over the gold answers
    metric: str = "f1",
    **_: Any,
) -> list[float]:
    """The best ``metric`` (em / f1 / acc, SQuAD rules) of each completion over its golds.

    >>> answer_score(["the Paris", "Rome"], answers=[["Paris"], ["Paris", "Roma"]], metric="em")
    [1.0, 0.0]
    >>> answer_score(["Paris France"], answers=[["Paris"]], metric="f1")
    [0.6666666666666666]
    """
    score = SCORERS["squad"][metric]
    return [score(completion_text(c), list(golds)) for c, golds in zip(completions, answers, strict=True)]
