"""Metrics as the table people read: percentages for EM / F1 / Acc / P / R, counts as means."""

import pandas as pd

# metrics.json field -> table column; scaled fields are shown as percentages.
COLUMNS = {
    "n": "N",
    "em": "EM",
    "f1": "F1",
    "acc": "Acc",
    "retrieval_count": "RC",
    "n_steps": "Steps",
    "tokens_total": "Tokens",
    "ret_precision": "Ret P",
    "ret_recall": "Ret R",
    "answer_recall": "Ans R",
    "judge_acc": "Judge",
}
PERCENT = {"em", "f1", "acc", "ret_precision", "ret_recall", "answer_recall", "judge_acc"}


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


def to_markdown(df: pd.DataFrame) -> str:
    return df.to_markdown(index=False, floatfmt="g") + "\n"
