"""Each judgement's provenance, committed: ``experiments/results/judgements/<commit>/<run>/`` (issue 74).

A claim is judged once (``make claims``); its runs' outputs (records, checkpoints: megabytes a run) stay
in ``outputs/``, uncommitted, so "judged once, by these runs" rested on convention. What shows which runs
made a judgement is small (about 10 kB a run): each judged run's ``provenance.json`` (commit, code, row
hash, LM, split, seed, start), the config it was composed with (``.hydra/config.yaml`` and
``.hydra/overrides.yaml``: its row) and the config as it resolved (``config.yaml``). :func:`record` copies
those into ``<commit>/`` (the runs' commit, 7 digits), each run under its path below the runs' common
folder; the folder's git history dates the judgement.

Who reads what, and why: the verdicts need every question's record (the paired bootstrap over questions),
so :func:`rag_lab.claims.judge` judges from the run dirs. Once it has, it records the copies and
:func:`check` reads them back: every line's provenance columns (commit, code, config A / B, LM, split,
seeds) must be what the committed copies give, else the table is refused. ``python -m rag_lab.claims
--check`` does the same for the committed ``claims.csv``, without the runs (:func:`check_committed`). The
copies pass the runs' own checks there too (:func:`rag_lab.eval.provenance.check_runs`: the judge split
and seeds, one commit and code, each recorded row hash its composed config's). :func:`kept` carries a
line of an earlier table only with its provenance. Hand-written: a folder layout and a comparison.
"""

import shutil
import tempfile
from os.path import commonpath
from pathlib import Path

import pandas as pd
import yaml

from rag_lab.core.errors import RagLabError
from rag_lab.eval.paired import groups_by
from rag_lab.eval.provenance import check_runs, line_provenance
from rag_lab.reporting import claims_evidence

# What is copied of each judged run: its provenance and the config it was composed with (small files).
FILES = ("provenance.json", "config.yaml", ".hydra/config.yaml", ".hydra/overrides.yaml")
# What every claims line records of its runs (provenance.json), what --keep needs to keep a line, and what
# check compares.
PROVENANCE = ("commit", "code", "config A", "config B", "lm", "split", "seeds")
README = "README.md"
# a judgement folder holding only this note: its runs were not kept (the first, 8993ad5); nothing is checked
NOT_KEPT = "NOT_KEPT.md"


def experiment_of(run: Path) -> str | None:
    """The ``experiment.name`` of a run's resolved config (None where it has none)."""
    path = run / "config.yaml"
    config = yaml.safe_load(path.read_text()) if path.exists() else None
    return ((config or {}).get("experiment") or {}).get("name")


def folder_of(root: Path, commit: str | None) -> Path:
    """Where the judgement of runs at ``commit`` is committed: ``root/<7 digits>``."""
    return root / (str(commit)[:7] if commit else "unknown")


def record(found: dict[Path, dict], root: Path) -> Path:
    """Copy each judged run's :data:`FILES` (``found``: run -> its provenance, one commit) into
    ``root/<commit>/<run's path below the runs' common folder>/``; the folder replaces an earlier recording
    of the same commit whole (built beside it, then renamed). Returns the folder."""
    runs = list(found)
    base = Path(commonpath([str(r.resolve().parent) for r in runs]))
    target = folder_of(root, found[runs[0]].get("commit"))
    root.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=root))
    try:
        for run in runs:
            copy = staged / run.resolve().relative_to(base)
            for name in FILES:
                if (run / name).exists():
                    (copy / name).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(run / name, copy / name)
        if target.exists():
            shutil.rmtree(target)
        staged.rename(target)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    return target


def _text(value) -> str:
    return "" if value is None or (isinstance(value, float) and value != value) else str(value)


def check(folder: Path, table: pd.DataFrame, claims: list, split: str, seeds: tuple[int, ...]) -> None:
    """Refuse ``table`` (claims.csv's lines of one judgement) in one line naming the claim, the column and
    both values where a line with runs has other provenance than the committed copies in ``folder`` give;
    ``claims``: the spec's (``rag_lab.claims.Claim``)."""
    copies = sorted(p.parent for p in folder.rglob("provenance.json"))
    if not copies:
        raise RagLabError(f"{folder}: no committed provenance.json ({folder.parent / README})")
    by_experiment: dict[str, list[Path]] = {}
    for copy in copies:
        by_experiment.setdefault(experiment_of(copy) or "?", []).append(copy)
    found: dict[Path, dict] = {}
    for name, runs in by_experiment.items():  # each experiment on its claims' seeds (an E claim has its own)
        found |= check_runs(runs, split, claims_evidence.seeds_for(claims, name, seeds))
    judged = table[table["verdict"] != "no runs"]
    for claim in claims:
        if claim.kind == claims_evidence.KIND:
            _check_spread(folder, claim, judged, by_experiment.get(claim.experiment, []), found)
            continue
        groups = groups_by(by_experiment.get(claim.experiment, []), claim.by)
        for test in claim.tests:
            b_row = test.against or claim.rows[1]
            rows = f"{claim.rows[0]} − {b_row}"
            lines = judged[(judged["paper"] == claim.paper) & (judged["kind"] == claim.kind)]
            for _, line in lines[lines["rows"] == rows].iterrows():
                a, b = groups.get(claim.rows[0], []), groups.get(b_row, [])
                if not a or not b:
                    raise RagLabError(
                        f"{folder}: no committed run of row {claim.rows[0] if not a else b_row} of"
                        f" {claim.experiment}, but the table judged {claim.paper} ({claim.kind}) {rows}"
                    )
                given = line_provenance(a, b, found)
                for column in PROVENANCE:
                    if _text(line.get(column)) != _text(given[column]):
                        raise RagLabError(
                            f"{claim.paper} ({claim.kind}) {rows}: {column} {_text(line.get(column))} in the"
                            f" table, but {_text(given[column])} in the committed provenance ({folder})"
                        )


def _check_spread(folder: Path, claim, judged: pd.DataFrame, runs: list[Path], found: dict) -> None:
    """:func:`check` of an E claim's line (:mod:`rag_lab.reporting.claims_evidence`)."""
    for _, line in judged[(judged["paper"] == claim.paper) & (judged["kind"] == claim.kind)].iterrows():
        cells = claims_evidence.cells_of(claim, runs)
        if missing := [(lv, m) for lv in claim.levels for m in claim.rows if (lv, m) not in cells]:
            raise RagLabError(
                f"{folder}: no committed run of {missing[0][1]} at {missing[0][0]} of {claim.experiment},"
                f" but the table judged {claim.paper} ({claim.kind})"
            )
        given = claims_evidence.provenance(claim, cells, found)
        for column in PROVENANCE:
            if _text(line.get(column)) != _text(given[column]):
                raise RagLabError(
                    f"{claim.paper} ({claim.kind}): {column} {_text(line.get(column))} in the table, but"
                    f" {_text(given[column])} in the committed provenance ({folder})"
                )


def check_committed(csv: Path, root: Path, claims: list, split: str, seeds: tuple[int, ...]) -> str:
    """``python -m rag_lab.claims --check``: :func:`check` of the committed ``csv`` against the recordings
    under ``root`` of each commit its lines were judged at; returns what was checked, in one line."""
    try:
        table = pd.read_csv(csv, dtype=str)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise RagLabError(f"{csv}: cannot read the claims table ({e})") from None
    missing = {"paper", "kind", "rows", "verdict", *PROVENANCE} - set(table.columns)
    if missing:
        raise RagLabError(
            f"{csv}: not a claims table with provenance (no column {', '.join(sorted(missing))})"
        )
    judged = table[table["verdict"] != "no runs"]
    commits, unkept = list(dict.fromkeys(judged["commit"].dropna())), []
    for commit in commits:
        folder = folder_of(root, commit)
        if (folder / NOT_KEPT).exists():  # judged before runs were recorded: its note says so
            unkept.append(commit[:7])
            continue
        if not folder.is_dir():
            raise RagLabError(
                f"{csv}: the judgement at commit {commit[:7]} has no committed provenance ({folder};"
                f" {root / README})"
            )
        check(folder, judged[judged["commit"] == commit], claims, split, seeds)
    lines = judged["commit"].map(lambda c: str(c)[:7] not in unkept).sum()
    note = ""
    if unkept:
        note = f"; unchecked: the judgement at {', '.join(unkept)}, whose runs were not kept ({NOT_KEPT})"
    return f"{csv}: {lines} lines, their provenance that of the runs committed under {root}{note}"


def kept(table: pd.DataFrame, earlier: Path) -> pd.DataFrame:
    """``table`` with each claim that has no runs taken from ``earlier`` (a claims.csv), where that table
    judged it with its provenance (:data:`PROVENANCE`); its lines' ``source`` names the file (the line is
    marked kept). A claim is matched on its kind, words, rows and metrics; an earlier line without
    provenance is refused in one line, naming it."""
    try:
        old = pd.read_csv(earlier, dtype=str)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise RagLabError(f"{earlier}: cannot read the earlier claims table ({e})") from None
    missing = {"claim", "rows", "metric", "verdict"} - set(old.columns)
    if missing:
        raise RagLabError(f"{earlier}: not a claims table (no column {', '.join(sorted(missing))})")
    old = old[old["verdict"] != "no runs"]
    numeric = ["delta", "ci_low", "ci_high", "p", "questions"]
    for column in numeric:
        if column in old:
            old[column] = pd.to_numeric(old[column])
    out = []
    for _, lines in table.groupby(["claim", "rows"], sort=False):
        if (lines["verdict"] == "no runs").all():
            before = old.merge(lines[["claim", "rows", "metric"]], on=["claim", "rows", "metric"])
            if len(before) == len(lines):
                lacking = [k for k in PROVENANCE if k not in before or before[k].isna().any()]
                if lacking:
                    raise RagLabError(
                        f"{earlier}: claim '{lines['claim'].iloc[0]}' ({lines['rows'].iloc[0]}) has no"
                        f" {lacking[0]}:"
                        " a line is kept only with its provenance"
                    )
                first = before.get("source", pd.Series(None, index=before.index)).astype(object)
                lines = before.assign(source=first.fillna(str(earlier)), kind=lines["kind"].values)
        out.append(lines)
    table = pd.concat(out, ignore_index=True)
    # counts stay whole numbers beside a judged line that came out float (next to a "no runs" line)
    return table.astype({"questions": "Int64"}) if "questions" in table else table
