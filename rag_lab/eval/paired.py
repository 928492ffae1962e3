"""Paired tests between runs, on their records (``rag_lab.report --compare``, ``rag_lab.claims``,
``rag_lab.reporting.compare``): each record keyed by (seed, question id), rows of a sweep grouped by an
override, and the paired bootstrap over questions of A − B per metric (each draw a question with all its
seeds: :func:`rag_lab.eval.stats.paired_bootstrap`) over a metrics.json subset's questions; for the
comparison's table, the records by question then seed, a metric's mean over questions with its CI and a
metric's paired difference between two rows."""

from pathlib import Path

import numpy as np
import pandas as pd

from rag_lab.core.errors import RagLabError
from rag_lab.eval.metrics import ANSWER_METRICS
from rag_lab.eval.runs import overrides_of, records_of
from rag_lab.eval.stats import PairedResult, bootstrap_ci, paired_bootstrap


def in_subset(record: dict, subset: str) -> bool:
    """Whether a record belongs to a metrics.json subset: 'all', 'type=<question type>' or
    'answerable=true|false'."""
    if subset == "all":
        return True
    if subset in ("answerable=true", "answerable=false"):
        return f"answerable={str(record.get('answerable', True)).lower()}" == subset
    if not subset.startswith("type="):
        raise RagLabError(
            f"unknown subset '{subset}' (use 'all', 'type=<question type>' or 'answerable=true|false')"
        )
    return f"type={record.get('type')}" == subset


def scores_of(runs: list[Path], seeded: bool = True) -> dict[tuple[str, str], dict]:
    """Each run's records keyed by (seed, question id): the pairs a bootstrap matches (seed "" when
    ``seeded`` is off: two single runs pair on the question id alone)."""
    return {
        (overrides_of(r).get("seed", "0") if seeded else "", rec["id"]): rec
        for r in runs
        for rec in records_of(r)
    }


def scored(value) -> bool:
    """Whether a record's field holds a score (not None, not NaN: retrieval precision with no retrieval; a
    bool is a 0/1 score: ``format_failure``)."""
    return value is not None and value == value


def by_question(runs: list[Path]) -> dict[str, dict[str, dict]]:
    """question id -> seed -> record, over ``runs`` (one run per seed)."""
    out: dict[str, dict[str, dict]] = {}
    for run in runs:
        seed = overrides_of(run).get("seed", "0")
        for rec in records_of(run):
            out.setdefault(rec["id"], {})[seed] = rec
    return out


def metric_ci(questions: dict[str, dict[str, dict]], field: str) -> tuple[float, float, float] | None:
    """Mean of ``field`` over questions (each question's mean over its seeds first) and its 95% CI,
    resampling questions; None when no record has it."""
    per_question = []
    for seeds in questions.values():
        values = [float(r[field]) for r in seeds.values() if scored(r.get(field))]
        if values:
            per_question.append(float(np.mean(values)))
    if not per_question:
        return None
    low, high = bootstrap_ci(per_question)
    return float(np.mean(per_question)), low, high


def paired_delta(mine: dict, theirs: dict, field: str) -> PairedResult | None:
    """The paired bootstrap of ``field`` (``mine`` − ``theirs``, each :func:`by_question`) over the
    (question, seed) pairs both scored; None when they share none."""
    pairs = [(q, s) for q in mine for s in mine[q] if s in theirs.get(q, {})]
    pairs = [(q, s) for q, s in pairs if scored(mine[q][s].get(field)) and scored(theirs[q][s].get(field))]
    if not pairs:
        return None
    return paired_bootstrap(
        [float(mine[q][s][field]) for q, s in pairs],
        [float(theirs[q][s][field]) for q, s in pairs],
        questions=[q for q, _ in pairs],
        seeds=[s for _, s in pairs],
    )


def bootstrap_rows(
    mine: dict[tuple[str, str], dict],
    theirs: dict[tuple[str, str], dict],
    metrics: tuple[str, ...],
    subset: str = "all",
    null: float = 0.0,
) -> list[dict]:
    """The paired bootstrap (each draw a question with all its seeds: :func:`paired_bootstrap`) of
    ``mine`` − ``theirs`` per metric, over the pairs of ``subset`` both scored (APEX's SEPR: those with a
    plan; retrieval precision: those with a retrieval); column ``n``: how many pairs. ``p_value``: against
    a difference of ``null`` (in the metric's own unit)."""
    rows, fields = [], {f for rec in mine.values() for f in rec}
    if unknown := [m for m in metrics if m not in fields]:
        raise RagLabError(
            f"--metrics: no record has {', '.join(unknown)} (fields: {', '.join(sorted(fields))})"
        )
    for m in metrics:
        both = [k for k in mine if k in theirs and in_subset(mine[k], subset)]
        shared = [k for k in both if scored(mine[k].get(m)) and scored(theirs[k].get(m))]
        if shared:
            res = paired_bootstrap(
                [mine[k][m] for k in shared],
                [theirs[k][m] for k in shared],
                questions=[k[1] for k in shared],
                seeds=[k[0] for k in shared],
                null=null,
            )
            rows.append({"metric": m} | result_row(res))
    return rows


def compare(
    run_a: Path, run_b: Path, subset: str = "all", metrics: tuple[str, ...] = ANSWER_METRICS
) -> pd.DataFrame:
    """Paired bootstrap of run A vs run B on the question ids of ``subset`` that both answered
    (column ``n``: how many)."""
    rows = bootstrap_rows(scores_of([run_a], False), scores_of([run_b], False), metrics, subset)
    if not rows:
        raise RagLabError(f"{run_a} and {run_b} share no question id of subset '{subset}'")
    return pd.DataFrame(rows)


def compare_rows(
    runs: list[Path],
    by: str | None,
    a: str,
    b: str,
    subset: str = "all",
    metrics: tuple[str, ...] = ANSWER_METRICS,
) -> pd.DataFrame:
    """Row ``by=a`` vs row ``by=b`` over their seeds (pairs match on seed and question id); with ``by``
    None, ``a`` and ``b`` are each ``KEY=VALUE``: rows named by different overrides (two sweeps)."""
    picked = []
    for side in (a, b):
        key, value = (by, side) if by else side.split("=", 1)
        side = f"{key}={value}"
        groups = groups_by(runs, key)
        if value not in groups:
            have = ", ".join(v for v in groups if v != "?") or "none"
            raise RagLabError(f"--compare: no run with {key}={value} (the runs have {key}: {have})")
        picked.append((side, groups[value]))
    (label_a, runs_a), (label_b, runs_b) = picked
    rows = bootstrap_rows(scores_of(runs_a), scores_of(runs_b), metrics, subset)
    if not rows:
        raise RagLabError(f"{label_a} and {label_b} share no (seed, question id) of subset '{subset}'")
    return pd.DataFrame([{"A": a, "B": b} | row for row in rows])


def groups_by(runs: list[Path], by: str) -> dict[str, list[Path]]:
    """Runs grouped by the value of override ``by`` (in sweep order)."""
    groups: dict[str, list[Path]] = {}
    for run in runs:
        groups.setdefault(overrides_of(run).get(by, "?"), []).append(run)
    return groups


def result_row(res) -> dict:
    """A paired bootstrap's result as a table row: floats to 4 places, the per-seed deltas as one cell."""
    row = {k: round(v, 4) if isinstance(v, float) else v for k, v in res.to_dict().items()}
    row["seed_deltas"] = " / ".join(f"{d:+.4f}" for d in res.seed_deltas)
    return row
