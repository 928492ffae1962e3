"""Metrics as the table people read: percentages for EM / F1 / Acc / P / R, counts as means, and the
legend that explains every column (one dict, :data:`DESCRIPTIONS`, for report.md and ``--help``)."""

import re
from collections.abc import Iterable

import pandas as pd

# metrics.json field -> table column; scaled fields are shown as percentages.
COLUMNS = {
    "n": "N",
    "em": "EM",
    "f1": "F1",
    "acc": "Acc",
    "retrieval_count": "RC",
    "n_steps": "Steps",
    "backtracks": "BT",
    "refused": "Refused",
    "refusal_recall": "Ref R",
    "refusal_precision": "Ref P",
    "tokens_total": "Tokens",
    "tokens_per_correct": "Tok/correct",
    "ret_precision": "Ret P",
    "ret_recall": "Ret R",
    "answer_recall": "Ans R",
    "judge_acc": "Judge",
    "sepr": "SEPR",
    "format_failure_rate": "Fmt",
    "prompt_cut_rate": "Cut",
    "mixed_groups": "Mixed",
    "solved_groups": "Solved",
}
PERCENT = {
    "em",
    "f1",
    "acc",
    "ret_precision",
    "ret_recall",
    "answer_recall",
    "judge_acc",
    "sepr",
    "refused",
    "refusal_recall",
    "refusal_precision",
    "format_failure_rate",
    "prompt_cut_rate",
    "mixed_groups",
    "solved_groups",
}
# Shown in a table cell whose metric was not measured (e.g. tokens of a generator that counts none).
MISSING = "—"

# Table column -> what it means. Means are over the questions of the subset; a question without a
# value (no gold supporting passage, no token count) is left out of that column's mean.
DESCRIPTIONS = {
    "N": "questions scored",
    "EM": "exact match: the normalised prediction equals a normalised gold answer (%; the dataset's "
    "official rule, rag_lab/eval/metrics.py)",
    "F1": "token F1 of prediction and gold answer (%; the dataset's official rule)",
    "Acc": "a normalised gold answer occurs in the normalised prediction (%; FlashRAG's official `acc`, "
    "a character-substring rule, so a prediction 'unknown' counts as containing the gold 'no')",
    "RC": "retrieval count: searches issued per question",
    "Steps": "episode steps per question (the policy's searches and generator turns)",
    "BT": "EVO-RAG's BACKTRACK steps per question (a search and its documents abandoned)",
    "Refused": "questions the policy refused to answer (%; EVO-RAG's REFUSE, predicting nothing)",
    "Ref R": "refusal recall: the questions marked unanswerable that were refused (%; where some are)",
    "Ref P": "refusal precision: the refusals of questions marked unanswerable (%; where some were refused)",
    "Tokens": f"prompt + completion tokens per question; {MISSING} where the generator reports no token "
    "counts (the teacher)",
    "Tok/correct": "every question's tokens over the questions right by Acc (R3-RAG's tokens per correct "
    "answer)",
    "Ret P": "retrieval precision: the share of the distinct retrieved passages that are gold supporting "
    "passages (%)",
    "Ret R": "retrieval recall: the share of the gold supporting passages that were retrieved (%)",
    "Ans R": "answer recall: a normalised gold answer occurs in a retrieved passage (%; FlashRAG's rule)",
    "Judge": "LLM-as-judge accuracy (%; DAPO paper B.4 prompt)",
    "SEPR": "APEX's plan reward: F1 of the plan's sub-questions matched to the gold plan's (%; "
    "rag_lab/rewards/sepr.py), over questions with a gold plan",
    "Fmt": "format failures: episodes the protocol could not parse a step of (%; scored as wrong)",
    "Cut": "questions with a prompt cut to fit the model's positions: passages cut, the question kept (%; "
    "rag_lab/env/fit.py; a column only where some prompt was cut)",
    "Mixed": "with eval.samples=n: questions whose n samples are neither all right nor all wrong by EM (%; "
    "the groups GRPO / DAPO learn from)",
    "Solved": "with eval.samples=n: questions with at least one right sample (%; pass@n by EM)",
    "R@k": "recall of the gold supporting passages within the first k distinct passages retrieved (%)",
    "P@k": "the share of the first k retrieved slots holding a gold supporting passage (%)",
    "run": "the run's output dir",
}


def format_metrics(summary: dict) -> dict:
    """One table row from one summary of metrics.json (fractions → percentages, 1 decimal)."""
    at_k = sorted(
        (f for f in summary if "@" in f), key=lambda f: (not f.startswith("recall"), int(f.split("@")[1]))
    )
    columns = COLUMNS | {f: f.replace("recall", "R").replace("precision", "P") for f in at_k}
    row = {}
    for field, column in columns.items():
        value = summary.get(field)
        if value is None:
            row[column] = None
        elif field in PERCENT or "@" in field:
            row[column] = round(100 * value, 1)
        elif field == "n":
            row[column] = int(value)
        else:
            row[column] = round(value, 2)
    return row


def metrics_table(metrics: dict[str, dict]) -> pd.DataFrame:
    """Rows: 'all' and one per question type; columns no question has a value for are dropped."""
    table = pd.DataFrame([{"subset": name} | format_metrics(m) for name, m in metrics.items()])
    return table.dropna(axis=1, how="all")


def legend(columns: Iterable[str], bold: bool = True) -> str:
    """A markdown list saying what each of ``columns`` means (columns without a description are skipped).

    >>> print(legend(["policy", "RC", "R@5"]), end="")
    - **RC**: retrieval count: searches issued per question
    - **R@5**: recall of the gold supporting passages within the first 5 distinct passages retrieved (%)
    """
    lines = []
    for column in columns:
        at_k = re.fullmatch(r"([RP])@(\d+)", column)
        if at_k:
            text = DESCRIPTIONS[f"{at_k[1]}@k"].replace(" k ", f" {at_k[2]} ")
        else:
            text = DESCRIPTIONS.get(column)
        if text:
            lines.append(f"- **{column}**: {text}" if bold else f"  {column}: {text}")
    return "".join(line + "\n" for line in lines)


def to_markdown(df: pd.DataFrame) -> str:
    """The table as markdown; a metric that was not measured shows as ``MISSING``, not ``nan``."""
    # tabulate only treats None as missing; pandas holds a missing number as NaN.
    cells = df.astype(object).where(df.notna(), None)
    return cells.to_markdown(index=False, floatfmt="g", missingval=MISSING) + "\n"
