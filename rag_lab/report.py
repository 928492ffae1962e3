"""Fold runs into one table: ``python -m rag_lab.report DIR [DIR ...] [--out report.csv]``.

Each DIR is a run directory or any folder above run directories (a Hydra multirun sweep dir,
``outputs/``): every directory below it holding a ``metrics.json`` is one row. Columns: the
run, the overrides that differ between runs (from Hydra's ``.hydra/overrides.yaml``), then every
metric of the chosen subset. Overrides shared by all runs are printed above the table.
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from rag_lab.eval.metrics import ANSWER_METRICS
from rag_lab.eval.stats import paired_bootstrap
from rag_lab.eval.table import format_metrics, to_markdown
from rag_lab.records import atomic_write_text, read_records


def find_runs(roots: list[Path]) -> list[Path]:
    runs: list[Path] = []
    for root in roots:
        if not root.exists():
            raise SystemExit(f"error: {root} does not exist")
        found = sorted(p.parent for p in root.rglob("metrics.json"))
        runs += sorted(found, key=lambda p: [int(s) if s.isdigit() else s for s in p.parts])
    return list(dict.fromkeys(runs))


def overrides_of(run: Path) -> dict[str, str]:
    path = run / ".hydra" / "overrides.yaml"
    items = yaml.safe_load(path.read_text()) if path.exists() else []
    return dict(item.split("=", 1) for item in items or [] if "=" in item)


def build_table(
    runs: list[Path], subset: str = "all", columns: list[str] | None = None
) -> tuple[pd.DataFrame, dict[str, str]]:
    """One row per run (metric ``columns`` only, when given); returns it and the overrides common to all."""
    overrides = [overrides_of(r) for r in runs]
    keys = list(dict.fromkeys(k for o in overrides for k in o))
    varying = [k for k in keys if len({o.get(k) for o in overrides}) > 1] if len(runs) > 1 else keys
    common = {k: overrides[0][k] for k in keys if k not in varying and k in overrides[0]}
    rows = []
    for run, over in zip(runs, overrides, strict=True):
        metrics = json.loads((run / "metrics.json").read_text())
        if subset not in metrics:
            raise SystemExit(
                f"error: {run}/metrics.json has no subset '{subset}' (has: {', '.join(metrics)})"
            )
        rows.append({"run": str(run)} | {k: over.get(k) for k in varying} | format_metrics(metrics[subset]))
    table = pd.DataFrame(rows).dropna(axis=1, how="all")
    if columns:
        unknown = [c for c in columns if c not in table.columns]
        if unknown:
            raise SystemExit(f"error: no column {', '.join(unknown)} (have: {', '.join(table.columns)})")
        table = table[["run", *varying, *columns]]
    return table, common


def compare(run_a: Path, run_b: Path, metrics: tuple[str, ...] = ANSWER_METRICS) -> pd.DataFrame:
    """Paired bootstrap of run A vs run B on the question ids both answered."""
    a, b = ({r["id"]: r for r in read_records(run / "records.jsonl")} for run in (run_a, run_b))
    shared = [qid for qid in a if qid in b]
    if not shared:
        raise SystemExit(f"error: {run_a} and {run_b} share no question id")
    rows = []
    for m in metrics:
        res = paired_bootstrap([a[q][m] for q in shared], [b[q][m] for q in shared])
        rows.append(
            {"metric": m} | {k: round(v, 4) if isinstance(v, float) else v for k, v in res.to_dict().items()}
        )
    return pd.DataFrame(rows)


class ReportCallback(Callback):
    """A Hydra callback: when a multirun ends, fold its runs into one table in the sweep dir."""

    def __init__(self, columns: list[str] | None = None):
        self.columns = list(columns) if columns else None

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep = Path(config.hydra.sweep.dir)
        runs = find_runs([sweep])
        if not runs:
            return
        table, common = build_table(runs, columns=self.columns)
        markdown = to_markdown(table)
        atomic_write_text(sweep / "report.csv", table.to_csv(index=False))
        atomic_write_text(sweep / "report.md", markdown)
        header = (
            "common overrides: " + " ".join(f"{k}={v}" for k, v in common.items()) + "\n" if common else ""
        )
        sys.stdout.write(f"\n{header}{markdown}\n{len(runs)} runs; table: {sweep / 'report.md'}\n")


def seed_tables(
    runs: list[Path],
    by: str,
    method: str,
    tables: dict[str, list[str]],
    metrics: tuple[str, ...] = ANSWER_METRICS,
) -> tuple[dict[str, pd.DataFrame], pd.DataFrame]:
    """A method against its baselines over seeds: one table per entry of ``tables`` (rows: the values
    of override ``by`` in sweep order; cells: mean ± sd over seeds), and the paired bootstrap of
    ``method`` against every other row on the per-question scores of all seeds pooled (pairs match
    on seed and question id)."""
    groups: dict[str, list[Path]] = {}
    for run in runs:
        groups.setdefault(overrides_of(run).get(by, "?"), []).append(run)
    if method not in groups:
        raise SystemExit(f"error: no run with {by}={method} (have: {', '.join(groups)})")
    out = {}
    for name, columns in tables.items():
        rows = []
        for value, members in groups.items():
            cells = [format_metrics(json.loads((r / "metrics.json").read_text())["all"]) for r in members]
            row = {by: value, "seeds": len(members)}
            for c in columns:
                xs = [cell[c] for cell in cells if cell.get(c) is not None]
                digits = 2 if c in ("RC", "Steps") else 1
                sd = f" ± {float(np.std(xs, ddof=1)):.{digits}f}" if len(xs) > 1 else ""
                row[c] = f"{np.mean(xs):.{digits}f}{sd}" if xs else ""
            rows.append(row)
        out[name] = pd.DataFrame(rows)

    def scores(members: list[Path]) -> dict[tuple[str, str], dict]:
        return {(overrides_of(r).get("seed", "0"), rec["id"]): rec for r in members
                for rec in read_records(r / "records.jsonl")}  # fmt: skip

    mine, tests = scores(groups[method]), []
    for value, members in groups.items():
        if value == method:
            continue
        theirs = scores(members)
        shared = [k for k in mine if k in theirs]
        for m in metrics:
            res = paired_bootstrap([mine[k][m] for k in shared], [theirs[k][m] for k in shared])
            tests.append({"A": method, "B": value, "metric": m} | {
                k: round(v, 4) if isinstance(v, float) else v for k, v in res.to_dict().items()})  # fmt: skip
    return out, pd.DataFrame(tests)


class SeedTablesCallback(Callback):
    """A Hydra callback: when a method-vs-baselines multirun (optionally over seeds) ends, write
    ``tables.md`` in the sweep dir: the paper's tables (mean ± sd over seeds) and the paired
    bootstrap of the method against each baseline."""

    def __init__(self, by: str, method: str, tables: dict[str, list[str]], title: str = ""):
        self.by, self.method, self.title = by, method, title
        self.tables = {k: list(v) for k, v in tables.items()}

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep = Path(config.hydra.sweep.dir)
        runs = find_runs([sweep])
        if not runs:
            return
        tables, tests = seed_tables(runs, self.by, self.method, self.tables)
        parts = [f"# {self.title or sweep.name}\n"]
        for name, table in tables.items():
            parts.append(f"## {name}\n\n{to_markdown(table)}")
        parts.append(f"## paired bootstrap ({self.method} - baseline, seeds pooled)\n\n{to_markdown(tests)}")
        text = "\n".join(parts)
        atomic_write_text(sweep / "tables.md", text)
        tests.to_csv(sweep / "bootstrap.csv", index=False)
        sys.stdout.write(f"\n{text}\ntables: {sweep / 'tables.md'}\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rag_lab.report", description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="run dirs, multirun dirs or folders above them")
    parser.add_argument("--subset", default="all", help="metrics subset: 'all' or 'type=<question type>'")
    parser.add_argument("--columns", nargs="+", help="only these metric columns (e.g. EM F1 'R@10')")
    parser.add_argument("--compare", action="store_true", help="paired bootstrap test of the first two runs")
    parser.add_argument(
        "--out", type=Path, help="csv path (default: report.csv in the single DIR given, else ./)"
    )
    args = parser.parse_args(argv)
    runs = find_runs(args.dirs)
    if not runs:
        raise SystemExit(
            f"error: no run (a directory with metrics.json) under {', '.join(map(str, args.dirs))}"
        )
    table, common = build_table(runs, args.subset, args.columns)
    out = args.out or (args.dirs[0] if len(args.dirs) == 1 else Path(".")) / "report.csv"
    atomic_write_text(out, table.to_csv(index=False))
    if common:
        print("common overrides: " + " ".join(f"{k}={v}" for k, v in common.items()))
    sys.stdout.write(to_markdown(table))
    print(f"\n{len(runs)} runs; csv: {out}")
    if args.compare:
        if len(runs) < 2:
            raise SystemExit("error: --compare needs two runs")
        print(f"\npaired bootstrap, A = {runs[0]} vs B = {runs[1]} (delta = A - B):")
        sys.stdout.write(to_markdown(compare(runs[0], runs[1])))


if __name__ == "__main__":
    main()
