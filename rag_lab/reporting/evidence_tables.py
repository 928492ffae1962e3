"""The evidence sweep's tables (``experiment=evidence_synth``, ``make evidence``; issue 74): each trained
method against its start under each condition of the index, the methods ranked at each level and the
retriever controls beside BM25.

The sweep's runs are one cell per (row, condition): the rows are the values of
``experiment/evidence_synth`` (the five trained methods and their starts), the conditions those of
``experiment/evidence`` (``corpus.coverage`` × ``corpus.distractors``, read from each run's ``config.yaml``,
and the retriever controls at full coverage).
A cell's numbers are means over questions, each question's mean over its seeds first; trained − start is the
paired bootstrap over questions with all their seeds (:func:`rag_lab.eval.paired.paired_delta`), the seed
spread beside it. Per record, ``reachable`` says whether the question's gold evidence is all in the index
under the run's condition and ``own_reward`` is the method's own training reward of the episode: the table
shows that reward on the questions the index cannot answer (a reward earned there is earned without the
evidence) and the searches spent on each kind. Kendall's τ is scipy's (τ-b). Hand-written: the tables'
layout, which no library keeps. The figure, the files, the results page and the Hydra callback:
:mod:`rag_lab.reporting.evidence`.
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from scipy import stats

from rag_lab.core.errors import RagLabError
from rag_lab.eval.paired import by_question, paired_delta, scored
from rag_lab.eval.runs import distinct, overrides_of
from rag_lab.eval.table import DESCRIPTIONS, MISSING

ROWS = "experiment/evidence_synth"
CONDITIONS = "experiment/evidence"
# each trained row -> its start (the same loop before training; Stop-RAG's is fixed T)
STARTS = {
    "stoprag": "fixed_iter",
    "dapo": "dapo_start",
    "evorag": "evorag_start",
    "r3rag": "r3rag_start",
    "apex": "apex_start",
}
# the plain BM25 index (full coverage, no distractors): the ranking's reference and the controls' baseline
REFERENCE = "cov100_d0"
CONTROLS = ("random", "empty", "oracle")
GAIN = "trained − start [95% CI]"


@dataclass(frozen=True)
class Cells:
    """A sweep's runs by (row, condition): each cell's records by question, then seed
    (:func:`rag_lab.eval.paired.by_question`), how many seeds it has, and each condition's
    (coverage, distractors) where its runs' config says (None where it does not)."""

    data: dict[tuple[str, str], dict[str, dict[str, dict]]]
    seeds: dict[tuple[str, str], int]
    levels: dict[str, tuple[float, int] | None]
    runs: int

    def get(self, row: str, condition: str) -> dict[str, dict[str, dict]] | None:
        return self.data.get((row, condition))

    def grid(self, controls: tuple[str, ...] = CONTROLS) -> list[str]:
        """The conditions with a coverage and a distractor level (not the controls), by distractors, then
        coverage from full down: cov100_d0, cov80_d0, ..., cov60_d2."""
        placed = [c for c, level in self.levels.items() if level is not None and c not in controls]
        return sorted(placed, key=lambda c: (self.levels[c][1], -self.levels[c][0]))


def _label(value: str) -> str:
    return value.strip("'\"")


def corpus_level(run: Path) -> tuple[float, int] | None:
    """``(corpus.coverage, corpus.distractors)`` of a run's resolved ``config.yaml``; None without either."""
    path = run / "config.yaml"
    try:
        config = yaml.safe_load(path.read_text()) if path.exists() else None
    except yaml.YAMLError as e:
        raise RagLabError(f"{path}: malformed yaml ({str(e).splitlines()[0]})") from None
    corpus = (config or {}).get("corpus") or {}
    if corpus.get("coverage") is None or corpus.get("distractors") is None:
        return None
    return float(corpus["coverage"]), int(corpus["distractors"])


def read_cells(runs: list[Path], rows: str = ROWS, conditions: str = CONDITIONS) -> Cells:
    """The runs grouped by the values of overrides ``rows`` and ``conditions`` (a run repeating another
    counts once: :func:`rag_lab.eval.runs.distinct`); an error naming both keys when no run has them."""
    groups: dict[tuple[str, str], list[Path]] = {}
    levels: dict[str, tuple[float, int] | None] = {}
    for run in distinct(runs):
        over = overrides_of(run)
        if rows not in over or conditions not in over:
            continue
        key = (_label(over[rows]), _label(over[conditions]))
        groups.setdefault(key, []).append(run)
        if levels.get(key[1]) is None:
            levels[key[1]] = corpus_level(run)
    if not groups:
        raise RagLabError(
            f"no run has both overrides {rows} and {conditions} (see a run's .hydra/overrides.yaml)"
        )
    data = {key: by_question(members) for key, members in groups.items()}
    return Cells(data, {k: len(v) for k, v in groups.items()}, levels, sum(map(len, groups.values())))


def mean(
    questions: dict[str, dict[str, dict]] | None, field: str, reachable: bool | None = None
) -> float | None:
    """Mean of ``field`` over questions, each question's mean over its seeds first; with ``reachable``, over
    the records whose ``reachable`` is that (a record without the field is in neither). None where no
    record counts: no cell, no such question, or a field nobody scored (fixed T has no reward of its own)."""
    per_question = []
    for seeds in (questions or {}).values():
        values = [
            float(r[field])
            for r in seeds.values()
            if scored(r.get(field)) and (reachable is None or r.get("reachable") in (reachable,))
        ]
        if values:
            per_question.append(np.mean(values))
    return float(np.mean(per_question)) if per_question else None


def _percent(value: float | None) -> float | None:
    return None if value is None else 100.0 * value


def gain_row(cells: Cells, method: str, start: str, condition: str) -> dict:
    """One (condition, method) line of the main table: both rows' Acc (%), trained − start in points with its
    CI, p and seed spread, the share of reachable questions (%), the own reward and the searches on
    reachable and unreachable questions (trained and start)."""
    trained, before = cells.get(method, condition), cells.get(start, condition)
    level = cells.levels.get(condition)
    row = {
        "condition": condition,
        "coverage": None if level is None else level[0],
        "distractors": None if level is None else level[1],
        "method": method,
        "start": start,
        "seeds": cells.seeds.get((method, condition)),
        "start_acc": _percent(mean(before, "acc")),
        "acc": _percent(mean(trained, "acc")),
        "reachable": _percent(mean(trained if trained is not None else before, "reachable")),
    }
    res = paired_delta(trained, before, "acc") if trained is not None and before is not None else None
    if res is not None:
        row |= {"s": 100 * res.delta, "s_low": 100 * res.ci_low, "s_high": 100 * res.ci_high}
        row |= {"s_p": res.p_value, "seed_sd": None if res.seed_sd is None else 100 * res.seed_sd}
    for name, flag in (("unreachable", False), ("reachable", True)):
        row[f"reward_{name}"] = mean(trained, "own_reward", flag)
        row[f"start_reward_{name}"] = mean(before, "own_reward", flag)
        row[f"rc_{name}"] = mean(trained, "retrieval_count", flag)
        row[f"start_rc_{name}"] = mean(before, "retrieval_count", flag)
    return row


def gains(
    cells: Cells, starts: dict[str, str] = STARTS, controls: tuple[str, ...] = CONTROLS
) -> pd.DataFrame:
    """The main table: a line per (condition, trained method), the grid first, then the controls and any
    other condition of the sweep; a method missing from a condition is a line of Nones (shown as —)."""
    grid = cells.grid(controls)
    others = [c for c in dict.fromkeys(c for _, c in cells.data) if c not in grid]
    order = grid + sorted(
        others, key=lambda c: (c not in controls, controls.index(c) if c in controls else 0)
    )
    # a control's config says full coverage, no distractors too: "grid" keeps it off the figure's points
    rows = [gain_row(cells, m, s, c) | {"grid": c in grid} for c in order for m, s in starts.items()]
    return pd.DataFrame(rows)


def kendall(reference: dict[str, float], other: dict[str, float]) -> tuple[float, float] | None:
    """Kendall's τ (τ-b, scipy) between two rankings given as method -> score, over the methods both hold,
    and its p-value; None with fewer than two in common or where a ranking is all ties.

    >>> tau, p = kendall({"a": 3.0, "b": 2.0, "c": 1.0}, {"a": 1.0, "b": 2.0, "c": 3.0, "d": 0.0})
    >>> round(tau, 3), round(p, 3)
    (-1.0, 0.333)
    """
    common = [m for m in reference if m in other]
    if len(common) < 2:
        return None
    res = stats.kendalltau([reference[m] for m in common], [other[m] for m in common])
    if res.statistic != res.statistic:
        return None
    return float(res.statistic), float(res.pvalue)


def ranking(
    cells: Cells, methods: list[str], reference: str = REFERENCE, controls: tuple[str, ...] = CONTROLS
) -> pd.DataFrame:
    """A line per grid level: the methods by trained Acc, best first (ties in ``methods``' order), and
    Kendall's τ of that ranking against ``reference``'s (the plain index) with its p-value."""
    accs = {
        c: {m: a for m in methods if (a := mean(cells.get(m, c), "acc")) is not None}
        for c in cells.grid(controls)
    }
    rows = []
    for condition, acc in accs.items():
        order = sorted(acc, key=lambda m: -acc[m])
        tau = kendall(accs.get(reference, {}), acc)
        coverage, distractors = cells.levels[condition]
        row = {"condition": condition, "coverage": coverage, "distractors": distractors}
        row |= {str(i + 1): f"{m} {100 * acc[m]:.1f}" for i, m in enumerate(order)}
        rows.append(row | {"tau": None if tau is None else tau[0], "tau_p": None if tau is None else tau[1]})
    return pd.DataFrame(rows)


def controls_table(
    cells: Cells, starts: dict[str, str] = STARTS, reference: str = REFERENCE, controls=CONTROLS
) -> pd.DataFrame:
    """A line per row (each trained method, then its start): its Acc (%) and searches per question under
    BM25 (``reference``) and under each control; None where the sweep has no such run."""
    rows = []
    for name in dict.fromkeys(r for pair in starts.items() for r in pair):
        row: dict = {"row": name}
        for condition in (reference, *controls):
            questions = cells.get(name, condition)
            row[f"{condition}_acc"] = _percent(mean(questions, "acc"))
            row[f"{condition}_rc"] = mean(questions, "retrieval_count")
        rows.append(row)
    return pd.DataFrame(rows)


def _num(value, digits: int, sign: str = "") -> str | None:
    if value is None or value != value:
        return None
    return f"{value:{sign}.{digits}f}"


def _p(p) -> str | None:
    if p is None or p != p:
        return None
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _arrow(before, after, digits: int) -> str | None:
    """``0.120 → 0.410``: a start's value and the trained row's (— for one that is missing)."""
    if _num(before, digits) is None and _num(after, digits) is None:
        return None
    return f"{_num(before, digits) or '—'} → {_num(after, digits) or '—'}"


def show_gains(table: pd.DataFrame) -> pd.DataFrame:
    """The main table as people read it (one cell per column of :data:`LEGEND`)."""
    out = []
    for _, r in table.iterrows():
        gain = _num(r.get("s"), 1, "+")
        if gain is not None:
            gain += f" [{r['s_low']:+.1f}, {r['s_high']:+.1f}]"
        row = {"condition": r["condition"], "method": r["method"], "start": _num(r["start_acc"], 1)}
        row |= {"trained": _num(r["acc"], 1), GAIN: gain, "p": _p(r.get("s_p"))}
        if (table["seeds"].fillna(0) > 1).any():
            row["seed sd"] = _num(r.get("seed_sd"), 1)
        row["reachable"] = _num(r["reachable"], 1)
        for name in ("unreachable", "reachable"):
            row[f"own reward, {name}"] = _arrow(r[f"start_reward_{name}"], r[f"reward_{name}"], 3)
        row |= {"RC, reachable": _num(r["rc_reachable"], 2), "RC, unreachable": _num(r["rc_unreachable"], 2)}
        out.append(row)
    return pd.DataFrame(out)


def show_ranking(table: pd.DataFrame, reference: str = REFERENCE) -> pd.DataFrame:
    if table.empty:
        return pd.DataFrame({"condition": []})
    places = [c for c in table.columns if c.isdigit()]
    out = table[["condition", "coverage", "distractors", *places]].astype(object).copy()
    out[f"τ vs {reference}"] = [_num(t, 2, "+") for t in table["tau"]]
    out["p (τ)"] = [_p(p) for p in table["tau_p"]]
    return out


def show_controls(table: pd.DataFrame, reference: str = REFERENCE, controls=CONTROLS) -> pd.DataFrame:
    out = table[["row"]].copy()
    for condition in (reference, *controls):
        name = "BM25" if condition == reference else condition
        out[f"{name} Acc"] = [_num(v, 1) for v in table[f"{condition}_acc"]]
        out[f"{name} RC"] = [_num(v, 2) for v in table[f"{condition}_rc"]]
    return out


LEGEND = {
    "condition": "the index: `covNN_dK` keeps NN% of the gold passages (`corpus.coverage`) and adds K "
    "conflicting near-duplicates per gold passage (`corpus.distractors`); random, empty, oracle: the "
    "retriever controls at full coverage, no distractors",
    "start": "Acc of the method's start (the same loop before training), %",
    "trained": "Acc of the trained method, %",
    GAIN: "trained − start in points on the questions and seeds both answered: a paired bootstrap over "
    "questions (each draw a question with all its seeds), 95% CI",
    "p": "two-sided p-value of that difference",
    "seed sd": "the difference's standard deviation over seeds",
    "reachable": "questions whose gold evidence is all in the index under the condition, %",
    "own reward, unreachable": "the method's own training reward on the questions the index cannot answer, "
    "start → trained",
    "own reward, reachable": "the same on the questions it can answer",
    "RC, reachable": "the trained method's searches per question on reachable questions",
    "RC, unreachable": "the same on unreachable questions",
}


def legend(shown: pd.DataFrame) -> str:
    """What each column of the main table means (and Acc, RC as rag_lab's other tables say)."""
    notes = LEGEND | {"Acc": DESCRIPTIONS["Acc"], "RC": DESCRIPTIONS["RC"]}
    return "".join(f"- **{c}**: {notes[c]}\n" for c in [*shown.columns, "Acc", "RC"] if c in notes)


def markdown(table: pd.DataFrame) -> str:
    """The table as markdown, its cells as written here (tabulate would read "10.0" as a number and print
    10), a missing one as —."""
    cells = table.astype(object).where(table.notna(), None)
    return cells.to_markdown(index=False, disable_numparse=True, missingval=MISSING) + "\n"
