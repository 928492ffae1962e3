"""The comparison's figures (matplotlib, png + svg): accuracy against retrieval count with the Pareto
front (:func:`pareto`, its labels kept apart by :func:`place_labels`) and the methods' held-out curves side
by side on one scale, each from its own first point on the same questions (:func:`curves_side_by_side`)."""

import json
import os
import textwrap
from pathlib import Path

import pandas as pd

from rag_lab.eval.stats import wilson_ci

# between a label and its point, and between two labels (points)
GAP = 3.0


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, stem: Path) -> None:
    """``stem``.png and ``stem``.svg, each written whole (a temporary file, then renamed)."""
    for ext in ("png", "svg"):
        path = stem.with_suffix(f".{ext}")
        tmp = path.with_name(f".{path.name}.tmp.{ext}")
        fig.savefig(tmp, dpi=130)
        os.replace(tmp, path)


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats (fewer or equal retrievals and higher or equal accuracy,
    one of them strictly), by retrieval count.

    >>> pareto_front([(1.0, 10.0), (2.0, 9.0), (2.0, 20.0), (0.0, 5.0)])
    [3, 0, 2]
    """
    front = []
    for i, (x, y) in enumerate(points):
        beaten = any(
            (x2 <= x and y2 >= y) and (x2 < x or y2 > y) for j, (x2, y2) in enumerate(points) if j != i
        )
        if not beaten:
            front.append(i)
    return sorted(front, key=lambda i: points[i])


def pareto(
    table: pd.DataFrame,
    stem: Path,
    title: str,
    x: str = "retrieval_count",
    y: str = "acc",
    ceiling: str | None = None,
) -> None:
    """Each row of a :func:`rag_lab.reporting.compare.compare_table` at (mean ``x``, mean ``y``) with its 95%
    intervals, named, and the Pareto front as a dashed step line. The ``ceiling`` row (the oracle: gold
    passages, no search) is a horizontal line with its interval as a band, not a point: its retrieval count
    of 0 is not a cost it saved, so it stays off the front."""
    plt = _pyplot()
    rows = table.dropna(subset=[x, y]).reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    for _, r in rows[rows["method"] == ceiling].iterrows():
        ax.axhline(r[y], color="tab:green", linestyle=":", label=f"{ceiling}: gold passages, no search")
        ax.axhspan(r[f"{y}_low"], r[f"{y}_high"], color="tab:green", alpha=0.1)
    rows = rows[rows["method"] != ceiling].reset_index(drop=True)
    names: dict[tuple[float, float], list[str]] = {}  # rows at one point share one label
    for _, r in rows.iterrows():
        names.setdefault((round(r[x], 6), round(r[y], 6)), []).append(r["method"])
    for _, r in rows.iterrows():
        ax.errorbar(
            r[x],
            r[y],
            xerr=[[r[x] - r[f"{x}_low"]], [r[f"{x}_high"] - r[x]]],
            yerr=[[r[y] - r[f"{y}_low"]], [r[f"{y}_high"] - r[y]]],
            fmt="o",
            capsize=3,
        )
    front = pareto_front(list(zip(rows[x], rows[y], strict=True)))
    if len(front) > 1:
        ax.step(
            rows[x][front], rows[y][front], where="post", linestyle="--", color="grey", label="Pareto front"
        )
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    ax.set_xlabel("retrieval count (searches per question)")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.set_xlim(ax.get_xlim())  # the limits as drawn, fixed: the labels are placed against them
    ax.set_ylim(ax.get_ylim())
    fig.tight_layout()
    _label_points(ax, list(names), [" = ".join(members) for members in names.values()])
    _save(fig, stem)
    plt.close(fig)


def _label_points(ax, points: list[tuple[float, float]], labels: list[str], tries: int = 4) -> None:
    """:func:`place_labels`; where the labels reach above the axes, its top is raised by that much and the
    labels placed again (the points move down, the labels keep their size)."""
    renderer = ax.figure.canvas.get_renderer()
    for _ in range(tries):
        placed = place_labels(ax, points, labels)
        frame = ax.get_window_extent(renderer)
        over = max((text_box(a, renderer).y1 for a in placed), default=frame.y1) - frame.y1
        if over <= 0:
            return
        low, high = ax.get_ylim()
        ax.set_ylim(low, high + 1.2 * over * (high - low) / frame.height)
        for a in placed:
            a.remove()
    place_labels(ax, points, labels)


def text_box(annotation, renderer):
    """An annotation's text box, in display pixels (its ``get_window_extent`` adds the leader line)."""
    from matplotlib.text import Text

    annotation.update_positions(renderer)
    return Text.get_window_extent(annotation, renderer)


def place_labels(ax, points: list[tuple[float, float]], labels: list[str], fontsize: float = 8) -> list:
    """Each label beside its point (to the right and a little above; to the left in the axes' right
    quarter), placed in the order of the points' y (lowest first): a label that would overlap one placed
    before moves to the nearest free height (just above or just below a placed label, not below the axes)
    and gets a grey leader line to its point. Deterministic and greedy (a label keeps the slot it got; the
    slot above every placed label is always free), so no two labels' boxes overlap. Call it once the axes'
    limits and the figure's layout are final: offsets are in points, so they hold at any saving dpi."""
    renderer = ax.figure.canvas.get_renderer()
    scale = 72.0 / ax.figure.dpi  # display pixels -> points
    right_quarter, floor = ax.transAxes.transform((0.75, 0.0)) * scale
    placed: list[tuple[float, float, float, float]] = []  # left, bottom, right, top (points)
    out = [None] * len(points)
    for i in sorted(range(len(points)), key=lambda i: (points[i][1], points[i][0])):
        px, py = ax.transData.transform(points[i]) * scale
        probe = ax.text(0, 0, labels[i], fontsize=fontsize)
        box = probe.get_window_extent(renderer)
        probe.remove()
        width, height = box.width * scale, box.height * scale
        left = px - GAP - width if px > right_quarter else px + GAP
        wanted = py + GAP
        heights = {wanted, *(b[3] + GAP for b in placed), *(b[1] - GAP - height for b in placed)}
        free = [
            h for h in heights if h >= floor and not _overlapping((left, h, left + width, h + height), placed)
        ]
        bottom = min(free, key=lambda h: (abs(h - wanted), h))
        placed.append((left, bottom, left + width, bottom + height))
        leader = {"arrowstyle": "-", "color": "grey", "linewidth": 0.6} if bottom != wanted else None
        out[i] = ax.annotate(
            labels[i],
            points[i],
            xytext=(left - px, bottom - py),
            textcoords="offset points",
            ha="left",
            va="bottom",
            fontsize=fontsize,
            arrowprops=leader,
            annotation_clip=False,
        )
    return out


def _overlapping(box: tuple[float, ...], placed: list[tuple[float, ...]]) -> bool:
    """Whether ``box`` overlaps a box of ``placed`` or comes within :data:`GAP` of one."""
    left, bottom, right, top = box
    near = GAP - 1e-6  # a label exactly GAP away is clear (the sums that place it round)
    return any(
        b[0] < right + near and left < b[2] + near and b[1] < top + near and bottom < b[3] + near
        for b in placed
    )


# What each training log is plotted by, the first of these it has: the held-out curve (the policy's Acc on
# held-out questions as it trains: rag_lab/train/heldout.py), EVO-RAG's dev EM per cycle, else the training
# signal (the reward: DAPO, R3-RAG's per step, APEX's SEPR; Stop-RAG's Q-network loss).
CURVE_KEYS = ("heldout/acc", "dev_em", "reward", "reward/step", "rewards/sepr/mean", "val_loss", "loss")
# The curves that are a share of questions (a fraction in the log), drawn in % on one y scale shared by all
# their panels, from their own first point.
PERCENT_KEYS = {"heldout/acc": "held-out Acc", "dev_em": "dev EM"}
# How many questions a held-out point was measured on (rag_lab/train/heldout.py; Stop-RAG's held-out rows
# and EVO-RAG's dev EM too): the 95% band.
N_KEY = "heldout/n"
# The fewest steps a curve is measured at to get a panel: fewer show no trend (R3-RAG's two PPO iterations
# gave three points); a curve left out is named under the figure with the reason.
MIN_POINTS = 4
# A point of a curve: step, value (in the log's unit), the questions it was measured on (None: not known)
Point = tuple[float, float, int | None]


def _curves(logs: dict[str, Path]) -> tuple[dict[str, tuple[str, list[Point]]], dict[str, str]]:
    """method -> (the first of :data:`CURVE_KEYS` its log has, its points) for each curve drawn, and method ->
    why for each left out: one that repeats another's first points (:func:`_repeated_in`), or one measured at
    fewer than :data:`MIN_POINTS` steps."""
    series: dict[str, tuple[str, list[Point]]] = {}
    for method, path in logs.items():
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        key = next((k for k in CURVE_KEYS if any(k in r for r in rows)), None)
        points = [(r.get("step", i), r[key], r.get(N_KEY)) for i, r in enumerate(rows) if key and key in r]
        if points:
            series[method] = (key, points)
    left: dict[str, str] = {}
    for method, (_, points) in series.items():
        steps = len({p[0] for p in points})
        if other := _repeated_in(method, series):
            left[method] = f"the first points of {other}'s"
        elif steps < MIN_POINTS:
            left[method] = f"{steps} steps measured, fewer than {MIN_POINTS}"
    return {m: c for m, c in series.items() if m not in left}, left


def _repeated_in(method: str, series: dict[str, tuple[str, list[Point]]]) -> str | None:
    """The curve whose first points are all of ``method``'s: a longer one (dapo_stage1's stage is the dapo
    row's first), or the same one earlier (a stopper row reuses its method's model and log); None if none.

    >>> a, b = ("k", [(0, 0.1, 8), (1, 0.2, 8)]), ("k", [(0, 0.1, 8)])
    >>> _repeated_in("b", {"a": a, "b": b}), _repeated_in("a", {"a": a, "b": b})
    ('a', None)
    >>> _repeated_in("c", {"a": a, "c": a}), _repeated_in("a", {"a": a, "c": a})
    ('a', None)
    """
    key, points = series[method]
    order = list(series)
    for other, (other_key, others) in series.items():
        longer = len(others) > len(points) or (
            len(others) == len(points) and order.index(other) < order.index(method)
        )
        if other != method and other_key == key and longer and others[: len(points)] == points:
            return other
    return None


def band(points: list[Point]) -> list[tuple[float, float]]:
    """Each point's 95% interval in %: the Wilson score interval of round(value x n) right of n questions
    (:func:`rag_lab.eval.stats.wilson_ci`); NaN where n is not known.

    >>> band([(0, 0.5, 64), (2, 0.25, None)])[1]
    (nan, nan)
    """
    nan = float("nan")
    out = []
    for _, value, n in points:
        low, high = wilson_ci(round(value * n), n) if n else (nan, nan)
        out.append((100 * low, 100 * high))
    return out


def curves_side_by_side(
    logs: dict[str, Path], stem: Path, title: str, tests: dict[str, tuple[str, float, float]] | None = None
) -> list[str]:
    """One panel per method: its training log (``train_log.jsonl`` rows), by the first of :data:`CURVE_KEYS`
    it has, against the step; returns the methods drawn (:func:`_curves` leaves out a repeat and a curve of
    too few steps, and the figure names them). A curve of :data:`PERCENT_KEYS` is drawn in %, with a 95% band
    (:func:`band`) where its log says how many questions each point was measured on, and its start as a line:
    its own first point, on the same questions. The table's rows, measured on other questions (the test
    split), are not drawn on it: ``tests[method]`` (its start row, that row's test Acc and the method's, in %)
    goes into the panel's title. All the % panels share one y range, so they show how far each method moved
    from its start. A curve of another signal (a reward, a loss) keeps its own scale."""
    plt = _pyplot()
    series, left = _curves(logs)
    if not series:
        return []
    tests = tests or {}
    # method -> its values in % and their bands, for the curves drawn on the shared scale
    percent = {
        m: ([100 * v for _, v, _ in pts], band(pts)) for m, (k, pts) in series.items() if k in PERCENT_KEYS
    }
    limits = _range(
        [v for values, bounds in percent.values() for v in [*values, *(x for b in bounds for x in b)]]
    )
    columns = min(len(series), 3)
    lines = -(-len(series) // columns)
    fig, axes = plt.subplots(lines, columns, figsize=(3.8 * columns, 3.2 * lines + 0.4), squeeze=False)
    for ax in axes.flat[len(series) :]:
        ax.axis("off")
    for ax, (method, (key, points)) in zip(axes.flat, series.items(), strict=False):
        steps = [p[0] for p in points]
        if method in percent:
            _percent_panel(ax, PERCENT_KEYS[key], steps, *percent[method], points[0])
            ax.set_ylim(limits)
        else:
            ax.plot(steps, [p[1] for p in points], marker="." if len(points) < 20 else None)
        test = tests.get(method)
        table = f"\ntest Acc: {test[0]} {test[1]:.1f}, {method} {test[2]:.1f}" if test else ""
        ax.set_title(method + table, fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylabel(f"{PERCENT_KEYS[key]} (%)" if key in PERCENT_KEYS else key, fontsize=8)
        ax.grid(alpha=0.3)
    # the title and the note wrapped to the figure's width (about 13 characters an inch at 10 points, 19 at 7)
    fig.suptitle(textwrap.fill(title, int(13 * fig.get_figwidth())), fontsize=10)
    bottom = 0.0
    if left:
        notes = "left out: " + "; ".join(f"{m} ({why})" for m, why in left.items())
        notes = textwrap.fill(notes, int(19 * fig.get_figwidth()))
        fig.text(0.01, 0.005, notes, fontsize=7, va="bottom")
        bottom = (0.12 * (notes.count("\n") + 1) + 0.05) / fig.get_figheight()
    fig.tight_layout(rect=(0, bottom, 1, 1))
    _save(fig, stem)
    plt.close(fig)
    return list(series)


def _range(values: list[float]) -> tuple[float, float]:
    """The shared y limits (%): the values (NaN left out) with a margin of 5% of their span (at least one
    point), within [0, 100]."""
    values = [v for v in values if v == v]
    low, high = min(values, default=0.0), max(values, default=100.0)
    margin = max(1.0, 0.05 * (high - low))
    return max(0.0, low - margin), min(100.0, high + margin)


def _percent_panel(ax, name: str, steps, values, bounds, first: Point) -> None:
    """A held-out curve in %, its 95% band where known, and its start: the first point's value as a line (the
    same questions as every later point)."""
    ax.plot(steps, values, marker="." if len(values) < 20 else None, label=name)
    if any(b[0] == b[0] for b in bounds):
        ax.fill_between(
            steps, [b[0] for b in bounds], [b[1] for b in bounds], alpha=0.2, label="95% band (Wilson)"
        )
    step, _, n = first
    questions = f", {n} questions" if n else ""
    ax.axhline(values[0], color="tab:orange", linestyle="--", label=f"start (step {step:g}{questions})")
    ax.legend(fontsize=6)
