"""The evidence sweep's figure, files and results page (``make evidence``; issue 74), and the Hydra callback
that writes them when ``experiment=evidence_synth`` ends (the tables: :mod:`.evidence_tables`).

Written into the sweep dir: ``evidence.md`` (the main table, the figure, the ranking, the controls and what
each column means), ``evidence.csv`` (the main table's numbers) and ``evidence.png`` / ``.svg`` (each
method's trained − start with its 95% CI against coverage, one panel per distractor level: matplotlib).
``python -m rag_lab.reporting.evidence SWEEP --page experiments/results/evidence_synth.md`` writes them
again from the sweep's runs and then the results page: its title, the main table, the stamp under it (commit,
date, machine, the command: :mod:`rag_lab.reporting.pages`), the figure (copied beside the page), the other
tables; the page it replaces moves under History (its figure section left out: the file is overwritten).
The command reads the callback's settings from the sweep's ``multirun.yaml``. Hand-written: the page's layout.
"""

import argparse
import json
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from rag_lab.core.errors import RagLabError, one_line_errors
from rag_lab.core.records import atomic_write_text
from rag_lab.eval.runs import distinct, find_runs, left_out, overrides_of, unfinished_runs
from rag_lab.reporting import evidence_tables as ev
from rag_lab.reporting import pages
from rag_lab.reporting.plots import _pyplot, _save

ROOT = Path(__file__).resolve().parents[2]
FIGURE = "evidence"
FIGURE_SECTION = "Gain against coverage"
TITLE = "evidence_synth: each method's gain against the evidence it was given"


@dataclass(frozen=True)
class Settings:
    """The callback's settings: the overrides naming rows and conditions, each trained row's start, the
    plain index's condition and the retriever controls'."""

    rows: str = ev.ROWS
    conditions: str = ev.CONDITIONS
    starts: dict[str, str] = field(default_factory=lambda: dict(ev.STARTS))
    reference: str = ev.REFERENCE
    controls: tuple[str, ...] = ev.CONTROLS
    title: str = TITLE


def check_settings(
    starts: Mapping[str, str] | None, controls: Sequence[str] | None, reference: str
) -> tuple[dict[str, str], tuple[str, ...]]:
    """``starts`` and ``controls`` as plain values; a malformed one is an error naming it (the callback checks
    before the sweep runs)."""
    starts = ev.STARTS if starts is None else starts
    if not isinstance(starts, Mapping) or not all(isinstance(v, str) for v in starts.values()):
        raise RagLabError(f"starts: expected {{trained row: its start row}}, got {starts}")
    controls = ev.CONTROLS if controls is None else controls
    if isinstance(controls, str) or not all(isinstance(c, str) for c in controls):
        raise RagLabError(f"controls: expected a list of conditions, got {controls}")
    if reference in controls:
        raise RagLabError(f"reference {reference}: a control too (controls: {', '.join(controls)})")
    return {str(k): v for k, v in starts.items()}, tuple(controls)


def gain_figure(table: pd.DataFrame, stem: Path, title: str) -> pd.DataFrame:
    """``stem``.png / .svg: per trained method, trained − start (points of Acc) with its 95% CI against
    coverage, one panel per distractor level, the methods side by side around each coverage; returns the
    lines of ``table`` drawn (none, and nothing written, where no grid cell has both rows)."""
    drawn = table[table["grid"]].dropna(subset=["s"]) if "s" in table else table.iloc[0:0]
    if drawn.empty:
        return drawn
    plt = _pyplot()
    levels = sorted(set(drawn["distractors"]))
    fig, axes = plt.subplots(1, len(levels), figsize=(4.4 * len(levels), 3.8), sharey=True, squeeze=False)
    methods = list(dict.fromkeys(table["method"]))
    coverages = sorted(set(drawn["coverage"]))
    step = 0.15 * (
        min(b - a for a, b in zip(coverages, coverages[1:], strict=False)) if len(coverages) > 1 else 0.1
    )
    for ax, level in zip(axes[0], levels, strict=True):
        for i, method in enumerate(methods):
            points = drawn[(drawn["distractors"] == level) & (drawn["method"] == method)].sort_values(
                "coverage"
            )
            if points.empty:
                continue
            # a small shift per method keeps the error bars at one coverage apart
            x = points["coverage"] + (i - (len(methods) - 1) / 2) * step / max(len(methods) - 1, 1)
            errors = [points["s"] - points["s_low"], points["s_high"] - points["s"]]
            ax.errorbar(x, points["s"], yerr=errors, marker="o", capsize=3, label=method)
        ax.axhline(0, color="grey", linewidth=0.8)
        ax.set_xticks(coverages)
        ax.set_xlim(max(coverages) + step, min(coverages) - step)  # full coverage on the left
        ax.set_title(f"{level:g} distractors per gold passage", fontsize=9)
        ax.set_xlabel("coverage (share of gold passages in the index)", fontsize=8)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("trained − start, Acc (points, 95% CI)", fontsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    for ax in axes[0][1:]:  # a method drawn in one panel only is in the legend too
        more = [
            (h, label)
            for h, label in zip(*ax.get_legend_handles_labels(), strict=True)
            if label not in labels
        ]
        handles, labels = handles + [h for h, _ in more], labels + [label for _, label in more]
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    _save(fig, stem)
    plt.close(fig)
    return drawn


@dataclass(frozen=True)
class Tables:
    """The report's tables, read from a sweep's runs once: the main one's numbers and its display, the
    ranking's and the controls' display, and the line above the main table."""

    main: pd.DataFrame
    shown: pd.DataFrame
    ranking: pd.DataFrame
    controls: pd.DataFrame
    summary: str
    provenance: str = ""


def _absent(cells: ev.Cells, settings: Settings) -> str:
    """The rows and conditions the settings name that the sweep has no run of (their cells are —)."""
    rows, conditions = {r for r, _ in cells.data}, {c for _, c in cells.data}
    named = dict.fromkeys(r for pair in settings.starts.items() for r in pair)
    notes = [
        f"{kind} {', '.join(gone)}"
        for kind, gone in (
            ("rows", [r for r in named if r not in rows]),
            ("conditions", [c for c in (settings.reference, *settings.controls) if c not in conditions]),
        )
        if gone
    ]
    return f" Not in the sweep (—): {'; '.join(notes)}." if notes else ""


def provenance(runs: list[Path], settings: Settings) -> str:
    """The provenance section: each cell's row hash (``row_config`` in its runs' ``provenance.json``: the
    composed config less the seed, :func:`rag_lab.eval.provenance.row_hash`), the conditions down and the rows
    across, and the runs' LM fingerprints and row-hash versions; "" where no run recorded one."""
    hashes: dict[tuple[str, str], set[str]] = {}
    lms, versions = set(), set()
    for run in distinct(runs):
        over, path = overrides_of(run), run / "provenance.json"
        if settings.rows not in over or settings.conditions not in over or not path.exists():
            continue
        prov = json.loads(path.read_text())
        if not prov.get("row_config"):
            continue
        cell = (over[settings.conditions].strip("'\""), over[settings.rows].strip("'\""))
        hashes.setdefault(cell, set()).add(prov["row_config"])
        lms.add(str(prov.get("lm")))
        versions.add(str(prov.get("row_hash_version", 1)))
    if not hashes:
        return ""
    conditions = list(dict.fromkeys(c for c, _ in hashes))
    rows = list(dict.fromkeys(r for _, r in hashes))
    table = pd.DataFrame(
        [[c, *(" ".join(sorted(hashes.get((c, r), ()))) or None for r in rows)] for c in conditions],
        columns=["condition", *rows],
    )
    plural = "s" if len(versions) > 1 else ""
    return (
        f"## Provenance\n\nEach cell's row hash (`row_config` in its runs' `provenance.json`: the composed "
        f"config less the seed, of version{plural} {', '.join(sorted(versions))}); the runs' LM: "
        f"{', '.join(f'`{lm}`' for lm in sorted(lms))}.\n\n{ev.markdown(table)}"
    )


def tables(dirs: list[Path], settings: Settings) -> Tables:
    """The tables of the finished runs under ``dirs`` (a run without metrics.json is named and left out)."""
    runs, missing = find_runs(dirs), unfinished_runs(dirs)
    if not runs:
        raise RagLabError(f"no run (a directory with metrics.json) under {', '.join(map(str, dirs))}")
    cells = ev.read_cells(runs, settings.rows, settings.conditions)
    main = ev.gains(cells, settings.starts, settings.controls)
    rank = ev.ranking(cells, list(settings.starts), settings.reference, settings.controls)
    controls = ev.controls_table(cells, settings.starts, settings.reference, settings.controls)
    seeds = max(cells.seeds.values())
    summary = (
        f"Each trained method against its start (the same loop before training) under each index: "
        f"{cells.runs} runs, up to {seeds} seed{'s' if seeds > 1 else ''} per cell{left_out(missing)}."
        f"{_absent(cells, settings)}"
    )
    return Tables(
        main,
        ev.show_gains(main),
        ev.show_ranking(rank, settings.reference),
        ev.show_controls(controls, settings.reference, settings.controls),
        summary,
        provenance(runs, settings),
    )


def sections(t: Tables, settings: Settings, figure: str | None) -> tuple[str, str]:
    """The report's text: the summary and the main table (what the stamp goes under), then the figure
    (``figure``: its file name; None: no figure section), the ranking, the controls and the legend."""
    rest = ""
    if figure is not None:
        rest += (
            f"## {FIGURE_SECTION}\n\nEach method's trained − start (Acc, points) with its 95% CI against the "
            f"share of gold passages kept in the index, one panel per distractor level:\n\n"
            f"![trained − start against coverage]({figure})\n\n"
        )
    rest += (
        f"## Ranking\n\nThe methods by trained Acc at each coverage × distractor level, best first, and "
        f"Kendall's τ-b between each level's ranking and {settings.reference}'s (the plain index; "
        f"scipy.stats.kendalltau, p its two-sided test; — with fewer than two methods in common):\n\n"
        f"{ev.markdown(t.ranking)}\n"
        f"## Controls\n\nAcc (%) and searches per question (RC) of each row under BM25 "
        f"({settings.reference}) and the retriever controls at full coverage, no distractors (random: pages "
        f"drawn at random; empty: no page; oracle: the gold passages first, then BM25's):\n\n"
        f"{ev.markdown(t.controls)}\n"
        f"## Columns\n\n{ev.legend(t.shown)}"
    )
    if t.provenance:
        rest += f"\n{t.provenance}"
    return f"{t.summary}\n\n{ev.markdown(t.shown)}", rest


def write_evidence(dirs: list[Path], settings: Settings, out: Path) -> tuple[Tables, bool]:
    """evidence.md / .csv and the figure (where it has a point) in ``out``; the tables, and whether the
    figure was drawn."""
    t = tables(dirs, settings)  # first: a sweep dir that is not there stays so
    out.mkdir(parents=True, exist_ok=True)
    drawn = not gain_figure(t.main, out / FIGURE, settings.title).empty
    head, rest = sections(t, settings, f"{FIGURE}.png" if drawn else None)
    atomic_write_text(out / "evidence.md", f"# {settings.title}\n\n{head}\n{rest}")
    atomic_write_text(out / "evidence.csv", t.main.to_csv(index=False))
    return t, drawn


def runs_commit(dirs: list[Path]) -> str | None:
    """The commit the sweep's runs recorded (their provenance.json), short: the first run's, "to" the last's
    where the checkout moved on while the sweep ran (one process: the code it loaded stays the same), "with
    uncommitted changes" where one ran from a tree that differed from its commit; None without provenance."""
    found = [json.loads(p.read_text()) for d in dirs for p in sorted(d.glob("*/provenance.json"))]
    found = sorted((f for f in found if f.get("commit")), key=lambda f: str(f.get("started", "")))
    if not found:
        return None
    first, last = str(found[0]["commit"])[:7], str(found[-1]["commit"])[:7]
    dirty = any(f.get("dirty") for f in found)
    return first + (f" to {last}" if last != first else "") + (" with uncommitted changes" if dirty else "")


def write_page(
    dirs: list[Path], settings: Settings, out: Path, page: Path, command: str, wall: int | None = None
) -> str:
    """The sweep's files (:func:`write_evidence`), then the results page ``page``: title, a line naming the
    command, the runs' commit, the machine (and the sweep's ``wall`` seconds), the main table, stamp, figure
    (copied to ``<page stem>.png`` beside it), the other tables; the page it replaces under History."""
    t, drawn = write_evidence(dirs, settings, out)
    figure = f"{page.stem}.png"
    page.parent.mkdir(parents=True, exist_ok=True)
    if drawn:
        shutil.copyfile(out / f"{FIGURE}.png", page.parent / figure)
    head, rest = sections(t, settings, figure if drawn else None)
    stamp = replace(pages.here(command, ROOT), commit=runs_commit(dirs) or pages.commit(ROOT))
    took = f", {wall // 60} min {wall % 60} s" if wall is not None else ""
    lead = f"{stamp.command} at commit `{stamp.commit}` on {stamp.date} · {stamp.machine}{took}."
    old = page.read_text() if page.exists() else None
    text = pages.publish(
        old, f"# {settings.title}\n\n{lead}\n\n{head}\n{stamp.line()}\n\n{rest}", drop=(FIGURE_SECTION,)
    )
    atomic_write_text(page, text)
    return text


class EvidenceCallback(Callback):
    """A Hydra callback: when the evidence multirun ends, write its tables and figure into the sweep dir."""

    def __init__(
        self,
        rows: str = ev.ROWS,
        conditions: str = ev.CONDITIONS,
        starts: Mapping[str, str] | None = None,
        reference: str = ev.REFERENCE,
        controls: Sequence[str] | None = None,
        title: str = "",
    ):
        starts, controls = check_settings(starts, controls, reference)
        self.settings = Settings(rows, conditions, starts, reference, controls, title or TITLE)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep = Path(config.hydra.sweep.dir)
        try:
            write_evidence([sweep], self.settings, sweep)
        except RagLabError as e:  # the jobs' outputs are written; only the report is not
            print(f"error: no evidence report for {sweep}: {e}", file=sys.stderr)
            return
        text = (sweep / "evidence.md").read_text()
        figure = sweep / f"{FIGURE}.png"
        shown = figure if figure.exists() else "none (no trained row beside its start on the grid)"
        sys.stdout.write(f"\n{text}\nreport: {sweep / 'evidence.md'}; figure: {shown}\n")


def settings_of(sweep: Path) -> Settings:
    """The settings of the :class:`EvidenceCallback` in the sweep's ``multirun.yaml`` (Hydra writes the
    sweep's config there), the defaults where it has none."""
    path = sweep / "multirun.yaml"
    try:
        config = yaml.safe_load(path.read_text()) if path.exists() else None
    except yaml.YAMLError as e:
        raise RagLabError(f"{path}: malformed yaml ({str(e).splitlines()[0]})") from None
    callbacks = ((config or {}).get("hydra") or {}).get("callbacks") or {}
    spec = next(
        (c for c in callbacks.values() if str(c.get("_target_", "")).endswith(".EvidenceCallback")), {}
    )
    kwargs = {k: v for k, v in spec.items() if k != "_target_"}
    if "${" in str(kwargs.get("title", "")):  # an interpolation of the run's config: not resolved here
        kwargs.pop("title")
    return EvidenceCallback(**kwargs).settings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m rag_lab.reporting.evidence", description=__doc__.replace("``", "")
    )
    parser.add_argument(
        "sweep", type=Path, help="the evidence sweep's dir (its multirun.yaml names the rows)"
    )
    parser.add_argument("--page", type=Path, help="also write this results page (experiments/results/...md)")
    parser.add_argument("--command", default="make evidence", help="the page's remake command (its stamp)")
    parser.add_argument("--wall", type=int, help="the sweep's wall time, seconds (the page's first line)")
    args = parser.parse_args(argv)
    with one_line_errors():
        settings = settings_of(args.sweep)
        if args.page is None:
            write_evidence([args.sweep], settings, args.sweep)
            sys.stdout.write((args.sweep / "evidence.md").read_text())
        else:
            write_page([args.sweep], settings, args.sweep, args.page, args.command, args.wall)
            sys.stdout.write(f"page: {args.page}\n")


if __name__ == "__main__":
    os.environ.setdefault("MPLBACKEND", "Agg")
    main()
