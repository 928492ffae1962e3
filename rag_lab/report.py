"""Fold runs into one table and print it (``python -m rag_lab.report DIR [DIR ...]``).

Each DIR is a run directory or any folder above run directories (a Hydra multirun sweep dir,
``outputs/``): every directory below it holding a ``metrics.json`` is one row. A run directory
without one (a ``.hydra/`` or ``records.jsonl`` but no ``metrics.json``: a job that was killed,
failed or is still running) is left out, and a notice and the summary line name it. Columns: the
overrides that differ between runs (from Hydra's ``.hydra/overrides.yaml``; they name the rows),
every metric of the chosen subset, then the run dir. Overrides shared by all runs are printed above
the table.
"""

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from rag_lab.core.errors import RagLabError, one_line_errors
from rag_lab.core.records import atomic_write_text
from rag_lab.eval.metrics import ANSWER_METRICS
from rag_lab.eval.paired import bootstrap_rows, compare, compare_rows, scores_of
from rag_lab.eval.runs import (
    applies,
    distinct,
    find_runs,
    left_out,
    overrides_of,
    read_metrics,
    row_labels,
    unfinished_runs,
)
from rag_lab.eval.table import DESCRIPTIONS, format_metrics, legend, to_markdown


def build_table(
    runs: list[Path], subset: str = "all", columns: list[str] | None = None
) -> tuple[pd.DataFrame, dict[str, str]]:
    """One row per run: the overrides that differ between runs (all of them for one run), the metrics
    (``columns`` only, when given), then the run dir; returns it and the overrides common to all."""
    overrides = [overrides_of(r) for r in runs]
    keys = list(dict.fromkeys(k for o in overrides for k in o))
    varying = [k for k in keys if len({o.get(k) for o in overrides}) > 1] if len(runs) > 1 else keys
    common = {k: overrides[0][k] for k in keys if k not in varying and k in overrides[0]}
    rows = []
    for run, over in zip(runs, overrides, strict=True):
        metrics = read_metrics(run)
        if subset not in metrics:
            raise RagLabError(f"{run}/metrics.json has no subset '{subset}' (has: {', '.join(metrics)})")
        named = {k: over.get(k) if applies(run, k) else None for k in varying}  # λ on fixed T's row: —
        rows.append(named | format_metrics(metrics[subset]) | {"run": str(run)})
    table = pd.DataFrame(rows)
    if not columns:  # every metric that some run has
        return table.dropna(axis=1, how="all"), common
    unknown = [c for c in columns if c not in table.columns]
    if unknown:
        raise RagLabError(f"no column {', '.join(unknown)} (have: {', '.join(table.columns)})")
    # A column asked for stays even when no run has it (all teacher: no Tokens), shown as missing.
    return table[[*varying, *columns, "run"]], common


def type_table(runs: list[Path], column: str) -> tuple[pd.DataFrame, dict[str, str]]:
    """:func:`build_table` with ``column`` (a metric column, e.g. Acc) over all questions, then one column
    per question type (the ``type=`` subsets of metrics.json)."""
    table, common = build_table(runs, "all", [column])
    table = table.rename(columns={column: "all"})
    for subset in sorted({s for r in runs for s in read_metrics(r) if s.startswith("type=")}):
        table[subset[5:]] = [format_metrics(read_metrics(r).get(subset, {})).get(column) for r in runs]
    return table[[c for c in table.columns if c != "run"] + ["run"]], common


def render_report(title: str, table: pd.DataFrame, common: dict[str, str], summary: str) -> str:
    """report.md: a title, the common overrides, the table, a summary line and the columns' legend."""
    shared = " ".join(f"`{k}={v}`" for k, v in common.items())
    return (
        f"# {title}\n\n"
        + (f"Common overrides: {shared}\n\n" if common else "")
        + to_markdown(table)
        + f"\n{summary}\n\nColumns (per-question means, except N):\n\n{legend(table.columns)}"
    )


class ReportCallback(Callback):
    """A Hydra callback: when a multirun ends, fold its runs into one table in the sweep dir
    (``report.csv`` and ``report.md``, titled by ``experiment.name``, with a legend)."""

    def __init__(self, columns: list[str] | None = None):
        self.columns = list(columns) if columns else None

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep = Path(config.hydra.sweep.dir)
        try:
            runs, missing = find_runs([sweep]), unfinished_runs([sweep])
            if not runs:
                return
            table, common = build_table(runs, columns=self.columns)
        except RagLabError as e:  # the jobs' own outputs are written; only the report is not
            print(f"error: no report for {sweep}: {e}", file=sys.stderr)
            return
        title = OmegaConf.select(config, "experiment.name", default=None) or sweep.name
        summary = f"{len(runs)} runs{left_out(missing)} in {sweep}"
        text = render_report(title, table, common, summary)
        atomic_write_text(sweep / "report.csv", table.to_csv(index=False))
        atomic_write_text(sweep / "report.md", text)
        sys.stdout.write(f"\n{text}\ntable: {sweep / 'report.md'}\n")


def seed_tables(
    runs: list[Path],
    by: str,
    method: str,
    tables: dict[str, list[str]],
    metrics: tuple[str, ...] = ANSWER_METRICS,
) -> tuple[dict[str, pd.DataFrame], pd.DataFrame]:
    """A method against its baselines over seeds: one table per entry of ``tables`` (rows: the values
    of override ``by`` in sweep order; cells: mean ± sd over seeds), and the paired bootstrap of
    ``method`` against every other row over questions (pairs match on seed and question id; each draw
    takes a question with all its seeds, :func:`rag_lab.eval.stats.paired_bootstrap`), with the
    difference within each seed beside it. A sweep without ``method``'s row (a partial ablation) is compared
    against its last row instead; the table's caption says so (``tests.attrs["method"]``)."""
    runs = distinct(runs)
    groups: dict[str, list[Path]] = {}
    for run, label in zip(runs, row_labels(runs, by), strict=True):
        groups.setdefault(label, []).append(run)
    if not groups:
        raise RagLabError(f"no runs to tabulate by {by}")
    methods = [g for g in groups if g == method or g.startswith(f"{method} (")]
    if not methods:
        methods = [list(groups)[-1]]
        method = methods[0]
    out = {}
    for name, columns in tables.items():
        rows = []
        for value, members in groups.items():
            cells = [format_metrics(read_metrics(r)["all"]) for r in members]
            row = {by: value, "seeds": len(members)}
            for c in columns:
                xs = [cell[c] for cell in cells if cell.get(c) is not None]
                digits = 2 if c in ("RC", "Steps") else 1
                sd = f" ± {float(np.std(xs, ddof=1)):.{digits}f}" if len(xs) > 1 else ""
                row[c] = f"{np.mean(xs):.{digits}f}{sd}" if xs else ""
            rows.append(row)
        out[name] = pd.DataFrame(rows)

    tests = []
    for mine in methods:  # each of the method's rows (a swept setting of it) against every other row
        for value, members in groups.items():
            if value not in methods:
                scores = bootstrap_rows(scores_of(groups[mine]), scores_of(members), metrics)
                tests += [{"A": mine, "B": value} | row for row in scores]
    tests = pd.DataFrame(tests)
    tests.attrs["method"] = method
    return out, tests


class SeedTablesCallback(Callback):
    """A Hydra callback: when a method-vs-baselines multirun (optionally over seeds) ends, write
    ``tables.md`` in the sweep dir: the paper's tables (mean ± sd over seeds) and the paired
    bootstrap of the method against each baseline."""

    def __init__(
        self,
        by: str,
        method: str,
        tables: dict[str, list[str]],
        title: str = "",
        metrics: list[str] | None = None,
    ):
        self.by = by
        self.method = method
        self.title = title
        self.tables = {k: list(v) for k, v in tables.items()}
        # the per-question record fields the bootstrap compares (default: em, f1, acc)
        self.metrics = tuple(metrics) if metrics else ANSWER_METRICS

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep = Path(config.hydra.sweep.dir)
        runs = find_runs([sweep])
        if not runs:
            return
        tables, tests = seed_tables(runs, self.by, self.method, self.tables, self.metrics)
        parts = [f"# {self.title or sweep.name}\n"]
        for name, table in tables.items():
            parts.append(f"## {name}\n\n{to_markdown(table)}")
        method = tests.attrs["method"]
        note = "" if method == self.method else f" ({self.by}={self.method} is not in this sweep)"
        heading = (
            f"## paired bootstrap over questions ({method} - baseline; each seed's delta beside it){note}"
        )
        parts.append(f"{heading}\n\n{to_markdown(tests)}")
        text = "\n".join(parts)
        atomic_write_text(sweep / "tables.md", text)
        tests.to_csv(sweep / "bootstrap.csv", index=False)
        sys.stdout.write(f"\n{text}\ntables: {sweep / 'tables.md'}\n")


EPILOG = """\
The csv goes to --out: by default DIR/report.csv when one DIR is given, else ./report.csv (with --by-type
COLUMN: report_by_type_COLUMN.csv).
Errors are one line, "error: ...", with exit status 1.

examples:
  python -m rag_lab.report multirun/2026-11-21/10-00-00
  python -m rag_lab.report outputs/a outputs/b --subset type=compositional --compare --out ab.csv
  python -m rag_lab.report multirun/dapo_synth --by policy.stages --compare '[1]' '[]'
  python -m rag_lab.report multirun/dapo_ablation multirun/dapo_synth \
      --compare experiment/dapo_ablation=no_search 'policy.stages=[1]' --metrics acc retrieval_count

columns (per-question means over the subset, except N):
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m rag_lab.report",
        description=__doc__.replace("``", ""),
        epilog=EPILOG + legend(DESCRIPTIONS, bold=False),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("dirs", nargs="+", type=Path, help="run dirs, multirun dirs or folders above them")
    parser.add_argument(
        "--subset",
        default="all",
        help="metrics subset: 'all', 'type=<question type>' or 'answerable=true|false'",
    )
    parser.add_argument("--columns", nargs="+", help="only these metric columns (e.g. EM F1 'R@10')")
    parser.add_argument(
        "--by-type",
        metavar="COLUMN",
        help="one metric column (e.g. Acc) over all questions and per question type",
    )
    parser.add_argument(
        "--compare",
        nargs="*",
        metavar="VALUE",
        help="paired bootstrap over --subset's questions: of the first two runs, or, with --by KEY and two "
        "values A B, of row KEY=A vs row KEY=B over their seeds, or of two rows KEY=A KEY2=B (two sweeps)",
    )
    parser.add_argument("--by", help="the override naming a sweep's rows (for --compare A B)")
    parser.add_argument(
        "--metrics",
        nargs="+",
        default=list(ANSWER_METRICS),
        help="the records.jsonl fields --compare tests (default: em f1 acc; e.g. retrieval_count sepr)",
    )
    parser.add_argument(
        "--out", type=Path, help="csv path (default: DIR/report.csv for one DIR, else ./report.csv)"
    )
    args = parser.parse_args(argv)
    with one_line_errors():
        print_report(
            args.dirs,
            args.subset,
            args.columns,
            args.compare,
            args.out,
            args.by,
            tuple(args.metrics),
            args.by_type,
        )


def print_report(
    dirs: list[Path],
    subset: str,
    columns: list[str] | None,
    paired: list[str] | None,
    out: Path | None,
    by: str | None = None,
    metrics: tuple[str, ...] = ANSWER_METRICS,
    by_type: str | None = None,
) -> None:
    """Write the csv and print the table (and the paired test) for ``main``'s arguments (``by_type``: one
    column per question type instead, :func:`type_table`)."""
    runs, missing = find_runs(dirs), unfinished_runs(dirs)
    note = left_out(missing)
    if not runs:
        raise RagLabError(f"no run (a directory with metrics.json) under {', '.join(map(str, dirs))}{note}")
    table, common = type_table(runs, by_type) if by_type else build_table(runs, subset, columns)
    # a by-type table has a name of its own: it must not replace the sweep's report.csv
    name = f"report_by_type_{by_type}.csv" if by_type else "report.csv"
    out = out or (dirs[0] if len(dirs) == 1 else Path(".")) / name
    atomic_write_text(out, table.to_csv(index=False))
    if common:
        print("common overrides: " + " ".join(f"{k}={v}" for k, v in common.items()))
    sys.stdout.write(to_markdown(table))
    what = f"{by_type} by question type" if by_type else f"subset {subset}"
    print(f"\n{len(runs)} runs{note}; {what}; csv: {out}")
    if paired is None:
        return
    if by or paired:
        selectors = not by and len(paired) == 2 and all("=" in v for v in paired)
        if not selectors and (not by or len(paired) != 2):
            raise RagLabError(
                "--compare A B needs --by KEY or two KEY=VALUE (and --by needs --compare with two values)"
            )
        tests = compare_rows(runs, by, paired[0], paired[1], subset, metrics)
        a, b = (paired[0], paired[1]) if selectors else (f"{by}={paired[0]}", f"{by}={paired[1]}")
        what = f"row {a} (A) vs row {b} (B), pairs matched on seed and question id"
    else:
        if len(runs) < 2:
            raise RagLabError("--compare needs two runs")
        tests = compare(runs[0], runs[1], subset, metrics)
        what = f"A = {runs[0]} vs B = {runs[1]}"
    print(
        f"\npaired bootstrap over the {tests['n'].iloc[0]} question ids of subset {subset} that both runs "
        f"answered, {what} (delta = A - B):"
    )
    sys.stdout.write(to_markdown(tests))


if __name__ == "__main__":
    main()
