"""All methods in one table: ``python -m rag_lab.reporting.compare SWEEP_DIR`` (and the callback of the
``compare_*`` experiments).

One row per method (the values of the override that names the rows, over all its seeds). Each cell is
the mean over questions with its 95% confidence interval, a cluster bootstrap over questions (a question
with all its seeds, :mod:`rag_lab.eval.stats`: seeds are not extra questions); beside the rows, the paired
bootstrap of each row's accuracy against a reference row (``fixed_iter`` by default) and the spread of that
difference over seeds, each trained row's accuracy against its start (the same loop before training) and the
one number that shows the method's own mechanism, start → trained (APEX's plan SEPR, DAPO's searches after
its second stage against after its first, ...: ``mechanisms``). Written into the sweep dir: ``compare.md``
(title, table, legend), ``compare.csv`` (the numbers: mean, low, high per metric), ``compare.tex`` (LaTeX,
booktabs), ``pareto.png`` / ``pareto.svg`` (accuracy against retrieval count, every method with its
intervals and the Pareto front: the DAPO paper's figure 1 view) and ``curves.png`` / ``.svg`` (each trained
method's held-out curve, side by side on one scale, from its own first point on the same questions).
"""

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from rag_lab.core.errors import RagLabError, one_line_errors
from rag_lab.core.records import atomic_write_text
from rag_lab.eval.paired import by_question, metric_ci, paired_delta
from rag_lab.eval.runs import distinct, find_runs, left_out, overrides_of, unfinished_runs
from rag_lab.eval.table import DESCRIPTIONS, to_markdown

# records.jsonl field -> column; the percentage ones are scaled by 100.
METRICS = {
    "em": "EM",
    "f1": "F1",
    "acc": "Acc",
    "judge_acc": "Judge",
    "retrieval_count": "RC",
    "n_steps": "Steps",
    "tokens_total": "Tokens",
    "ret_precision": "Ret P",
    "ret_recall": "Ret R",
}
# the mechanism column's metrics: the table's and two more records fields (APEX's plan reward; a format
# failure, the per-question flag whose rate is the report's Fmt)
MECHANISM_METRICS = METRICS | {"sepr": "SEPR", "format_failure": "Fmt"}
PERCENT = {"em", "f1", "acc", "judge_acc", "ret_precision", "ret_recall", "sepr", "format_failure"}
DIGITS = {"retrieval_count": 2, "n_steps": 2, "tokens_total": 0}
MECHANISM = "mechanism (trained − against)"


def _paired(mine: dict, theirs: dict | None, field: str, prefix: str) -> dict[str, float]:
    """``prefix``, ``prefix_low``, ``prefix_high``, ``prefix_p``: :func:`paired_delta` of ``field`` in the
    table's unit (percentage points for a % metric); nothing where ``theirs`` is None or shares no pair."""
    res = paired_delta(mine, theirs, field) if theirs is not None else None
    if res is None:
        return {}
    scale = 100.0 if field in PERCENT else 1.0
    cells = {prefix: res.delta, f"{prefix}_low": res.ci_low, f"{prefix}_high": res.ci_high}
    return {k: scale * v for k, v in cells.items()} | {f"{prefix}_p": res.p_value}


def check_mechanisms(mechanisms: Mapping[str, Mapping[str, str]] | None) -> dict[str, dict[str, str]]:
    """``mechanisms`` (trained row -> ``{metric: FIELD, against: ROW}``) as plain dicts; a malformed entry or
    a metric the table has no unit for is an error naming it (the callback checks before the sweep runs)."""
    out = {}
    for row, spec in (mechanisms or {}).items():
        if not isinstance(spec, Mapping) or set(spec) != {"metric", "against"}:
            raise RagLabError(f"mechanisms.{row}: expected {{metric: FIELD, against: ROW}}, got {spec}")
        if spec["metric"] not in MECHANISM_METRICS:
            known = ", ".join(MECHANISM_METRICS)
            raise RagLabError(f"mechanisms.{row}.metric {spec['metric']}: not a records field of ({known})")
        out[str(row)] = {"metric": str(spec["metric"]), "against": str(spec["against"])}
    return out


def _label(value: str) -> str:
    return value.strip("'\"")


def compare_table(
    runs: list[Path],
    by: str,
    reference: str,
    delta: str = "acc",
    starts: dict[str, str] | None = None,
    mechanisms: Mapping[str, Mapping[str, str]] | None = None,
) -> pd.DataFrame:
    """One row per value of override ``by`` (sweep order): seeds, N, per metric mean / low / high,
    ``delta``'s paired difference to row ``reference`` (d, d_low, d_high, p, seed_sd), for a trained row
    that ``starts`` maps to the row of its start (the same loop before training), the paired difference to
    that row (s, s_low, s_high, s_p: trained − start), and for one that ``mechanisms`` maps to ``{metric,
    against}``, that metric's paired difference to row ``against`` (mech_metric, mech_against; mech,
    mech_low, mech_high, mech_p: none where the sweep has no row ``against``)."""
    mechanisms = check_mechanisms(mechanisms)
    groups: dict[str, list[Path]] = {}
    for run in distinct(runs):  # a run that repeats another (copied, or the same config again) counts once
        groups.setdefault(_label(overrides_of(run).get(by, "?")), []).append(run)
    if list(groups) == ["?"]:
        raise RagLabError(f"--by {by}: no run has that override (see a run's .hydra/overrides.yaml)")
    data = {name: by_question(members) for name, members in groups.items()}
    ref = data.get(reference)
    rows = []
    for name, questions in data.items():
        row: dict[str, Any] = {"method": name, "seeds": len(groups[name]), "N": len(questions)}
        for field in METRICS:
            stats = metric_ci(questions, field)
            scale = 100.0 if field in PERCENT else 1.0
            for suffix, value in zip(("", "_low", "_high"), stats or (None,) * 3, strict=True):
                row[field + suffix] = None if value is None else scale * value
        res = paired_delta(questions, ref, delta) if ref is not None and name != reference else None
        if res is not None:
            scale = 100.0 if delta in PERCENT else 1.0
            row |= {"d": scale * res.delta, "d_low": scale * res.ci_low, "d_high": scale * res.ci_high}
            row |= {"p": res.p_value, "seed_sd": None if res.seed_sd is None else scale * res.seed_sd}
        row |= _paired(questions, data.get((starts or {}).get(name, "")), delta, "s")
        if name in mechanisms:
            metric, against = mechanisms[name]["metric"], mechanisms[name]["against"]
            row |= {"mech_metric": metric, "mech_against": against, "mech": None}
            row |= _paired(questions, data.get(against), metric, "mech")
        rows.append(row)
    table = pd.DataFrame(rows)
    shown = {k: v for k, v in (starts or {}).items() if k in data and v in data}
    table.attrs.update(by=by, reference=reference if ref is not None else None, delta=delta, starts=shown)
    table.attrs["mechanisms"] = {k: v for k, v in mechanisms.items() if k in data}
    return table


def _cell(mean, low, high, digits: int) -> str | None:
    if mean is None or mean != mean:
        return None
    if low == high:
        return f"{mean:,.{digits}f}"
    return f"{mean:,.{digits}f} [{low:,.{digits}f}, {high:,.{digits}f}]"


def _p(p: float | None) -> str | None:
    """A p-value as a string the table keeps as written (``<0.001``: below the bootstrap's resolution)."""
    if p is None or p != p:
        return None
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _mechanism_cell(row: pd.Series) -> str | None:
    """``SEPR +12.3 pp [+8.1, +16.5]``: the metric, trained − against and its CI, in percentage points for a
    % metric and raw for a count; None (shown as —) for a row without one or whose ``against`` is missing."""
    metric, value = row.get("mech_metric"), row.get("mech")
    if not isinstance(metric, str) or value is None or value != value:
        return None
    unit, digits = (" pp", 1) if metric in PERCENT else ("", DIGITS.get(metric, 2))
    low, high = row["mech_low"], row["mech_high"]
    return f"{MECHANISM_METRICS[metric]} {value:+.{digits}f}{unit} [{low:+.{digits}f}, {high:+.{digits}f}]"


def display_table(table: pd.DataFrame) -> pd.DataFrame:
    """The table people read: ``mean [low, high]`` per metric (columns nobody measured dropped) and the
    difference to the reference as ``+d [low, high]`` with its p-value."""
    out = table[["method", "seeds", "N"]].copy()
    for field, column in METRICS.items():
        digits = DIGITS.get(field, 1)
        cells = [_cell(r[field], r[field + "_low"], r[field + "_high"], digits) for _, r in table.iterrows()]
        if any(c is not None for c in cells):
            out[column] = cells
    reference, delta = table.attrs.get("reference"), table.attrs.get("delta", "acc")
    if reference is not None and "d" in table:
        name = f"Δ {METRICS.get(delta, delta)} vs {reference}"
        out[name] = [
            None if r["d"] != r["d"] else f"{r['d']:+.1f} [{r['d_low']:+.1f}, {r['d_high']:+.1f}]"
            for _, r in table.iterrows()
        ]
        out["p"] = [_p(r["p"]) for _, r in table.iterrows()]
        if table["seeds"].max() > 1:
            out["seed sd"] = [
                None if r["seed_sd"] != r["seed_sd"] else f"{r['seed_sd']:.1f}" for _, r in table.iterrows()
            ]
    if "s" in table:
        out[f"trained − start ({METRICS.get(delta, delta)})"] = [
            None if r["s"] != r["s"] else f"{r['s']:+.1f} [{r['s_low']:+.1f}, {r['s_high']:+.1f}]"
            for _, r in table.iterrows()
        ]
        out["p (start)"] = [_p(r["s_p"]) for _, r in table.iterrows()]
    if "mech_metric" in table:
        out[MECHANISM] = [_mechanism_cell(r) for _, r in table.iterrows()]
        out["p (mechanism)"] = [_p(r.get("mech_p")) for _, r in table.iterrows()]
    return out


def render(
    title: str, shown: pd.DataFrame, table: pd.DataFrame, summary: str, ceiling: str | None = None
) -> str:
    """compare.md: title, table, the summary line and what each column means (and the ceiling row, when
    the table has it)."""
    reference, delta = table.attrs.get("reference"), table.attrs.get("delta", "acc")
    notes = {
        "method": f"the row: the value of `{table.attrs.get('by')}`",
        "seeds": "runs (seeds) of the row; cells average each question over its seeds first",
    }
    if reference is not None:
        notes[f"Δ {METRICS.get(delta, delta)} vs {reference}"] = (
            f"this row − {reference} on the questions and seeds both answered: a paired bootstrap over "
            "questions (each draw a question with all its seeds), 95% CI"
        )
        notes["p"] = (
            "two-sided p-value of that difference (twice the share of resamples on the other side of 0)"
        )
        notes["seed sd"] = "the difference's standard deviation over seeds (each seed's own difference)"
    if starts := table.attrs.get("starts"):
        pairs = ", ".join(f"{row} − {start}" for row, start in starts.items())
        notes[f"trained − start ({METRICS.get(delta, delta)})"] = (
            f"each trained row against its own start, the same loop before training ({pairs}): the paired "
            "bootstrap over questions, 95% CI"
        )
        notes["p (start)"] = "two-sided p-value of that difference"
    mechanisms = table.attrs.get("mechanisms", {})
    names = {row: MECHANISM_METRICS[m["metric"]] for row, m in mechanisms.items()}
    if mechanisms:
        gone = {m["against"] for m in mechanisms.values()} - set(table["method"])
        pairs = "; ".join(
            f"{row}: {names[row]}, {row} − {m['against']}"
            + (" (not in the sweep)" if m["against"] in gone else "")
            for row, m in mechanisms.items()
        )
        notes[MECHANISM] = (
            f"the number that shows each trained method's own mechanism, start → trained ({pairs}): the "
            "same paired bootstrap over questions, 95% CI; in percentage points (pp) for a % metric, raw for "
            "a count; — where the sweep has no `against` row"
        )
        notes["p (mechanism)"] = "two-sided p-value of that difference"
    described = {c: DESCRIPTIONS[c] for c in shown.columns if c in DESCRIPTIONS} | notes
    lines = "".join(f"- **{c}**: {described[c]}\n" for c in shown.columns if c in described)
    # a mechanism's metric that is no column of its own (SEPR, Fmt) is described too
    extra = sorted(set(names.values()) - set(shown.columns))
    lines += "".join(f"- **{c}** (in the mechanism column): {DESCRIPTIONS[c]}\n" for c in extra)
    if ceiling is not None and ceiling in set(table["method"]):
        lines += (
            f"\nRow **{ceiling}**: the gold supporting passages in the prompt and no search, what the reader "
            "does when search is perfect: the ceiling of the rows that learn to search (a line on the Pareto "
            "plot, not a point of its front).\n"
        )
    return (
        f"# {title}\n\n{to_markdown(shown)}\n{summary}\n\n"
        f"Cells: the mean over questions [95% CI, a bootstrap over questions]. Columns:\n\n{lines}"
    )


def write_compare(
    dirs: list[Path],
    by: str,
    reference: str,
    title: str,
    out: Path,
    ceiling: str | None = "oracle_rag",
    starts: dict[str, str] | None = None,
    named: Sequence[tuple[str, str]] = (),
    mechanisms: Mapping[str, Mapping[str, str]] | None = None,
) -> str:
    """compare.md / .csv / .tex, pareto.png / .svg and curves.png / .svg in ``out``; returns the markdown.
    ``ceiling``: the row drawn as a line on the Pareto plot, not a point (the oracle row: gold passages, no
    search); ``starts``: trained row -> the row of its start (both rows' test Acc title the row's curve);
    ``mechanisms``: trained row -> ``{metric, against}`` (:func:`compare_table`). ``named``: (option, row)
    pairs a user typed: a row that is not in the table is an error naming the option, before anything is
    written (a sweep of some rows only leaves the defaults' missing rows out instead)."""
    runs, missing = find_runs(dirs), unfinished_runs(dirs)
    if not runs:
        raise RagLabError(f"no run (a directory with metrics.json) under {', '.join(map(str, dirs))}")
    table = compare_table(runs, by, reference, starts=starts, mechanisms=mechanisms)
    rows = list(table["method"])
    for option, name in named:
        if name not in rows:
            raise RagLabError(f"{option} {name}: no such row (the rows by {by}: {', '.join(rows)})")
    shown = display_table(table)
    out.mkdir(parents=True, exist_ok=True)
    summary = f"{len(runs)} runs{left_out(missing)} under {', '.join(map(str, dirs))}"
    text = render(title, shown, table, summary, ceiling)
    atomic_write_text(out / "compare.md", text)
    atomic_write_text(out / "compare.csv", table.to_csv(index=False))
    cells = shown.astype(object).where(shown.notna(), "--")
    latex = cells.to_latex(index=False, caption=title, label="tab:compare", escape=True)
    atomic_write_text(out / "compare.tex", latex.replace("Δ", r"$\Delta$"))
    from rag_lab.reporting.plots import curves_side_by_side, pareto

    pareto(table, out / "pareto", title, ceiling=ceiling)
    acc = {r["method"]: r["acc"] for _, r in table.iterrows() if pd.notna(r["acc"])}
    # each trained row's start and both rows' test Acc: its panel's title (its curve is on held-out questions)
    tests = {r: (s, acc[s], acc[r]) for r, s in table.attrs["starts"].items() if s in acc and r in acc}
    curves_side_by_side(training_logs(runs, by), out / "curves", f"{title}: training", tests)
    return text


def training_logs(runs: list[Path], by: str) -> dict[str, Path]:
    """Each trained row's training log (``checkpoints/train_log.jsonl``), from its first run."""
    logs: dict[str, Path] = {}
    for run in runs:
        name = _label(overrides_of(run).get(by, "?"))
        if name not in logs and (run / "checkpoints" / "train_log.jsonl").exists():
            logs[name] = run / "checkpoints" / "train_log.jsonl"
    return logs


class CompareCallback(Callback):
    """A Hydra callback: when the comparison multirun ends, write its table and plot into the sweep dir."""

    def __init__(
        self,
        by: str,
        reference: str = "fixed_iter",
        title: str = "",
        ceiling: str | None = "oracle_rag",
        starts: dict[str, str] | None = None,
        mechanisms: Mapping[str, Mapping[str, str]] | None = None,
    ):
        self.by = by
        self.reference = reference
        self.title = title
        self.ceiling = ceiling
        self.starts = dict(starts or {})
        self.mechanisms = check_mechanisms(mechanisms)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep = Path(config.hydra.sweep.dir)
        try:
            title = self.title or sweep.name
            text = write_compare(
                [sweep], self.by, self.reference, title, sweep, self.ceiling, self.starts, (), self.mechanisms
            )
        except RagLabError as e:  # the jobs' outputs are written; only the table is not
            print(f"error: no comparison table for {sweep}: {e}", file=sys.stderr)
            return
        sys.stdout.write(f"\n{text}\ntable: {sweep / 'compare.md'}; plot: {sweep / 'pareto.png'}\n")
        if str(OmegaConf.select(config, "logger._target_", default="")).endswith("WandbLogger"):
            log_to_wandb(config, sweep)


def log_to_wandb(config: DictConfig, sweep: Path) -> None:
    """The comparison as one more wandb run of the experiment's group, named ``compare``: the table and the
    Pareto plot."""
    from hydra.utils import instantiate

    experiment = OmegaConf.to_container(config.experiment, resolve=True) if "experiment" in config else {}
    logger = instantiate(config.logger, run_dir=str(sweep), run_config={"experiment": experiment})
    if logger.run.name != "compare":
        logger.run.name = "compare"
    logger.log_table("compare", pd.read_csv(sweep / "compare.csv"))
    logger.log_image("pareto", sweep / "pareto.png")
    logger.finish()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m rag_lab.reporting.compare", description=__doc__.replace("``", "")
    )
    parser.add_argument("dirs", nargs="+", type=Path, help="sweep dirs (or run dirs) of the rows")
    parser.add_argument("--by", default="experiment/compare_synth", help="the override naming the rows")
    parser.add_argument("--reference", help="the row the others are tested against (default: fixed_iter)")
    parser.add_argument("--title", default="All methods")
    parser.add_argument(
        "--ceiling", help="the row drawn as a line, not a point (default: oracle_rag, the oracle)"
    )
    parser.add_argument(
        "--start",
        action="append",
        default=[],
        metavar="ROW=START",
        help="a trained row and the row of its start (repeatable): the 'trained − start' column",
    )
    parser.add_argument(
        "--mechanism",
        action="append",
        default=[],
        metavar="ROW=METRIC:AGAINST",
        help="a trained row, the records field that shows its mechanism and the row before it (repeatable)",
    )
    parser.add_argument("--out", type=Path, help="where the files go (default: the first DIR)")
    args = parser.parse_args(argv)
    with one_line_errors():
        bad = [pair for pair in args.start if "=" not in pair]
        if bad:
            raise RagLabError(
                f"--start {bad[0]}: expected ROW=START (a trained row and the row of its start)"
            )
        starts = dict(pair.split("=", 1) for pair in args.start)
        spec = [(row, *rest.split(":", 1)) for row, _, rest in (m.partition("=") for m in args.mechanism)]
        if bad := [m for m, part in zip(args.mechanism, spec, strict=True) if len(part) != 3 or "" in part]:
            raise RagLabError(f"--mechanism {bad[0]}: expected ROW=METRIC:AGAINST (apex=sepr:apex_start)")
        mechanisms = {row: {"metric": metric, "against": against} for row, metric, against in spec}
        named = [("--start", row) for pair in starts.items() for row in pair]
        named += [(f"--{k}", v) for k, v in (("reference", args.reference), ("ceiling", args.ceiling)) if v]
        out = args.out or args.dirs[0]
        reference, ceiling = args.reference or "fixed_iter", args.ceiling or "oracle_rag"
        text = write_compare(
            args.dirs, args.by, reference, args.title, out, ceiling, starts, named, mechanisms
        )
        sys.stdout.write(text)


if __name__ == "__main__":
    os.environ.setdefault("MPLBACKEND", "Agg")
    main()
