"""Our own claim, kind E (evidence; issue 74), judged by ``python -m rag_lab.claims`` beside the papers' H
and M claims: "corpus coverage moves Acc more than the choice among the five trained methods".

Its spec (``conf/claims.yaml``, an entry with ``kind: E``) names the experiment whose runs judge it, the
override naming the methods (``by``, ``rows``), the override naming the coverage levels (``across``,
``levels``, the first at full coverage), the metric and the claim's own judge seeds (``seeds``:
:data:`rag_lab.eval.provenance.EVIDENCE_SEEDS`, which no other run may have). Its one line is
``S_cov − S_meth`` (:mod:`rag_lab.eval.spreads`: the statistic, its bootstrap over questions and the bias
of a max − min) with the 95% CI, p and each seed's own spreads, and the provenance every line carries:
commit, code, the row hashes (config A: the methods at full coverage, in the spec's order; config B: the
lower levels', level by level), the LM, split and seeds. It holds when the CI lies above 0, is reversed
when it lies below, and is not shown when it holds 0 (the words of :func:`rag_lab.claims.verdict`).

The line is refused, in one line naming the run or the cell, when a run's config has no
``corpus.coverage`` / ``corpus.distractors``, has distractors, the first level is not at coverage 1.0, two
levels share a coverage, or two cells did not answer the same (seed, question) pairs. Hand-written: the
claim is ours.
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from rag_lab.core.errors import RagLabError
from rag_lab.eval.paired import scored
from rag_lab.eval.provenance import EVIDENCE_SEEDS, row_scores
from rag_lab.eval.runs import overrides_of
from rag_lab.eval.spreads import spread_test

KIND = "E"
# the line's "A − B": the same words on every judgement, so that --keep finds the line again
ROWS = "S_cov − S_meth"
FIELDS = ("paper", "claim", "experiment", "by", "rows", "across", "levels", "metric", "seeds")


@dataclass(frozen=True)
class SpreadClaim:
    paper: str
    claim: str
    experiment: str
    # the override naming the methods, and the methods
    by: str
    rows: tuple[str, ...]
    # the override naming the coverage levels, and the levels (the first at full coverage)
    across: str
    levels: tuple[str, ...]
    metric: str = "acc"
    seeds: tuple[int, ...] = EVIDENCE_SEEDS
    environment: str = ""
    kind: str = KIND


def read_claim(entry: dict, where: str) -> SpreadClaim:
    """The E claim of a spec entry; a malformed one is one line naming ``where`` (the file and claim) and
    the field."""
    missing = [k for k in FIELDS if k not in entry]
    if missing:
        raise RagLabError(f"{where}: missing field '{missing[0]}'")
    for key in ("rows", "levels"):
        values = entry[key] if isinstance(entry[key], list) else []
        if len(values) < 2 or len(set(map(str, values))) != len(values):
            raise RagLabError(f"{where}: field '{key}' needs two or more, each once, got {entry[key]}")
    seeds = tuple(entry["seeds"] or ())
    if seeds != EVIDENCE_SEEDS:
        raise RagLabError(
            f"{where}: field 'seeds' must be {list(EVIDENCE_SEEDS)} (the E claim's own judge seeds, which no"
            f" other run has: rag_lab.eval.provenance), got {list(seeds)}"
        )
    return SpreadClaim(
        str(entry["paper"]),
        str(entry["claim"]),
        str(entry["experiment"]),
        str(entry["by"]),
        tuple(map(str, entry["rows"])),
        str(entry["across"]),
        tuple(map(str, entry["levels"])),
        str(entry["metric"]),
        seeds,
        entry.get("environment") or "",
    )


def seeds_for(claims: list, experiment: str, default: tuple[int, ...]) -> tuple[int, ...]:
    """The seeds the runs of ``experiment`` must have: its E claim's own, else the spec's ``default``."""
    return next((c.seeds for c in claims if c.kind == KIND and c.experiment == experiment), default)


def side(low: float, high: float) -> str:
    """holds / reversed / not shown for a CI [low, high] of S_cov − S_meth: :func:`rag_lab.claims.verdict`'s
    words for a test ">" against 0.

    >>> side(0.5, 3.0), side(-3.0, -0.5), side(-0.5, 3.0), side(0.0, 1.0)
    ('holds', 'reversed', 'not shown', 'not shown')
    """
    return "holds" if low > 0 else "reversed" if high < 0 else "not shown"


def judge_claim(claim: SpreadClaim, runs: list[Path], found: dict[Path, dict], percent: set[str]) -> dict:
    """The claim's line of the claims table (:func:`rag_lab.claims.judge`'s columns, and ``s_cov`` and
    ``s_meth``) from ``runs``, the runs of its experiment (``found``: their checked provenance,
    :func:`rag_lab.eval.provenance.check_runs`); "no runs" while a (level, method) cell has none. A metric
    in ``percent`` is in points."""
    line = {"paper": claim.paper, "kind": KIND, "claim": claim.claim, "rows": ROWS}
    line |= {"environment": claim.environment or "default LM and world of make demo", "metric": claim.metric}
    cells = cells_of(claim, runs)
    wanted = [(level, method) for level in claim.levels for method in claim.rows]
    if missing := [f"{m} at {level}" for level, m in wanted if (level, m) not in cells]:
        note = (
            f"{claim.experiment} has no runs of {len(missing)} of {len(wanted)} cells: {', '.join(missing)}"
        )
        return line | {"verdict": "no runs", "note": note, "claim verdict": "no runs"}
    cells = {cell: cells[cell] for cell in wanted}
    check_corpus(claim, cells)
    scores, seeds = score_array(claim, cells, found)
    r = spread_test(scores)
    scale = 100.0 if claim.metric in percent else 1.0
    low, high = scale * r.ci_low, scale * r.ci_high
    line |= {"delta": scale * r.delta, "ci_low": low, "ci_high": high, "p": r.p_value}
    line |= {"s_cov": scale * r.s_cov, "s_meth": scale * r.s_meth, "seeds": " ".join(seeds), "questions": r.n}
    line["seed deltas"] = " / ".join(
        f"{s}: {scale * (c - m):+.2f} ({scale * c:.2f} − {scale * m:.2f})"
        for s, (c, m) in zip(seeds, r.seed_spreads, strict=True)
    )
    line |= provenance(claim, cells, found)
    return line | {"verdict": side(low, high), "claim verdict": side(low, high)}


def cells_of(claim: SpreadClaim, runs: list[Path]) -> dict[tuple[str, str], list[Path]]:
    """``runs`` by (level, method): the values of the claim's ``across`` and ``by`` overrides."""
    cells: dict[tuple[str, str], list[Path]] = {}
    for run in runs:
        given = overrides_of(run)
        cells.setdefault((given.get(claim.across, "?"), given.get(claim.by, "?")), []).append(run)
    return cells


def provenance(claim: SpreadClaim, cells: dict[tuple[str, str], list[Path]], found: dict[Path, dict]) -> dict:
    """The line's provenance columns from its cells' runs (or their committed copies): config A the row
    hashes at full coverage, config B those of the other levels, method by method."""
    judged = [run for level in claim.levels for m in claim.rows for run in cells.get((level, m), [])]
    starts = sorted(s for run in judged if (s := found[run].get("started")))
    first = found[judged[0]]

    def hashes(levels: tuple[str, ...]) -> str:
        return " ".join(
            str(found[cells[(level, m)][0]].get("row_config")) for level in levels for m in claim.rows
        )

    return {
        "started": f"{starts[0]} {starts[-1]}" if starts else None,
        "commit": first.get("commit"),
        "code": first.get("code"),
        "config A": hashes(claim.levels[:1]),
        "config B": hashes(claim.levels[1:]),
        "lm": " ".join(sorted({str(found[run].get("lm")) for run in judged})),
        "split": first.get("split"),
        "seeds": " ".join(sorted({str(found[run].get("seed")) for run in judged}, key=int)),
    }


def check_corpus(claim: SpreadClaim, cells: dict[tuple[str, str], list[Path]]) -> None:
    """Refuse, in one line naming the run or the level: a run whose config has no ``corpus.coverage`` /
    ``corpus.distractors`` or has distractors, a level whose runs differ in coverage, a first level not at
    coverage 1.0 (the method spread is taken there), two levels at one coverage."""
    coverage: dict[str, set[float]] = {}
    for (level, _), runs in cells.items():
        for run in runs:
            path = run / "config.yaml"
            corpus = ((yaml.safe_load(path.read_text()) if path.exists() else None) or {}).get("corpus") or {}
            if "coverage" not in corpus or "distractors" not in corpus:
                raise RagLabError(
                    f"run {run}: config.yaml has no corpus.coverage and corpus.distractors (claim"
                    f" '{claim.claim}' compares coverage levels)"
                )
            if corpus["distractors"] != 0:
                raise RagLabError(
                    f"run {run}: corpus.distractors {corpus['distractors']}, not 0 (claim '{claim.claim}')"
                )
            coverage.setdefault(level, set()).add(float(corpus["coverage"]))
    for level, values in coverage.items():
        if len(values) > 1:
            raise RagLabError(f"level {level}: runs at corpus.coverage {', '.join(map(str, sorted(values)))}")
    full = coverage[claim.levels[0]]
    if full != {1.0}:
        raise RagLabError(
            f"level {claim.levels[0]}: corpus.coverage {full.pop()}, not 1.0 (the first level is full"
            f" coverage, where claim '{claim.claim}' takes the method spread)"
        )
    if len({v for values in coverage.values() for v in values}) < len(coverage):
        raise RagLabError(
            f"claim '{claim.claim}': two of its levels {list(claim.levels)} at one corpus.coverage"
        )


def score_array(
    claim: SpreadClaim, cells: dict[tuple[str, str], list[Path]], found: dict[Path, dict]
) -> tuple[np.ndarray, list[str]]:
    """The metric of every cell's records as (questions, seeds, levels, methods), and the seeds; every cell
    must hold the same (seed, question) pairs, each seed every question, each record the metric scored
    (a cell's runs: one config, no pair twice: :func:`rag_lab.eval.provenance.row_scores`)."""
    keyed = {cell: row_scores(f"{cell[1]} at {cell[0]}", runs, found) for cell, runs in cells.items()}
    (level0, method0), pairs = next(iter(keyed.items()))
    for (level, method), scores in keyed.items():
        if odd := sorted(set(scores) ^ set(pairs)):
            raise RagLabError(
                f"row {method} at {level}: not the questions of {method0} at {level0} (seed {odd[0][0]},"
                f" question {odd[0][1]} is in one of them only): the spreads need every cell on the same ones"
            )
    seeds = sorted({s for s, _ in pairs}, key=int)
    questions = sorted({q for _, q in pairs})
    if len(pairs) != len(seeds) * len(questions):
        raise RagLabError(
            f"row {method0} at {level0}: seeds {', '.join(seeds)} did not all answer the same"
            f" {len(questions)} questions"
        )
    at_q, at_s = {q: i for i, q in enumerate(questions)}, {s: i for i, s in enumerate(seeds)}
    out = np.empty((len(questions), len(seeds), len(claim.levels), len(claim.rows)))
    for (level, method), scores in keyed.items():
        li, mi = claim.levels.index(level), claim.rows.index(method)
        for (seed, question), record in scores.items():
            value = record.get(claim.metric)
            if not scored(value):
                raise RagLabError(
                    f"row {method} at {level}: seed {seed}, question {question} has no {claim.metric}"
                )
            out[at_q[question], at_s[seed], li, mi] = float(value)
    return out, seeds


def spread_cell(line) -> str:
    """`` (S_cov x, S_meth y)`` after an E line's Δ in the rendered table (a row of ``itertuples``); ""
    for the other lines (no spreads, or NaN: a kept H or M line beside it)."""
    try:
        s_cov, s_meth = float(getattr(line, "s_cov", None)), float(getattr(line, "s_meth", None))
    except (TypeError, ValueError):
        return ""
    return "" if s_cov != s_cov else f" (S_cov {s_cov:.2f}, S_meth {s_meth:.2f})"
