"""The comparison's figures (matplotlib, png + svg): accuracy against retrieval count with the Pareto
front (:func:`pareto`, its labels kept apart by :func:`place_labels`) and the methods' held-out curves side
by side on one scale, between each one's start and the oracle (:func:`curves_side_by_side`)."""

import json
import os
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
# their panels, with the start's and the oracle's test Acc as lines.
PERCENT_KEYS = {"heldout/acc": "held-out Acc", "dev_em": "dev EM"}
# How many questions a held-out point was measured on (rag_lab/train/heldout.py; Stop-RAG's held-out rows
# and EVO-RAG's dev EM do not say, and are drawn without a band).
N_KEY = "heldout/n"
# A point of a curve: step, value (in the log's unit), the questions it was measured on (None: not known)
Point = tuple[float, float, int | None]


def _curves(logs: dict[str, Path]) -> dict[str, tuple[str, list[Point]]]:
    """method -> (the first of :data:`CURVE_KEYS` its log has, its points); a log that repeats one before
    (a stopper row reuses its method's model) is left out."""
    series, texts = {}, set()
    for method, path in logs.items():
        text = path.read_text()
        if text in texts:
            continue
        texts.add(text)
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        key = next((k for k in CURVE_KEYS if any(k in r for r in rows)), None)
        points = [(r.get("step", i), r[key], r.get(N_KEY)) for i, r in enumerate(rows) if key and key in r]
        if points:
            series[method] = (key, points)
    return series


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
    logs: dict[str, Path],
    stem: Path,
    title: str,
    starts: dict[str, tuple[str, float]] | None = None,
    ceiling: tuple[str, float] | None = None,
) -> list[str]:
    """One panel per method: its training log (``train_log.jsonl`` rows), by the first of
    :data:`CURVE_KEYS` it has, against the step; returns the methods drawn. A curve of
    :data:`PERCENT_KEYS` is drawn in %, with a 95% band (:func:`band`) where its log says how many questions
    each point was measured on, and two lines: ``starts[method]`` (its start row and that row's test Acc, %)
    and ``ceiling`` (the oracle row and its test Acc, %). All those panels share one y range, from the lowest
    start (or point) to the oracle (or the highest point), so the panels show how far each method moved
    between its start and the ceiling. A curve of another signal (a reward, a loss) keeps its own scale."""
    plt = _pyplot()
    series = _curves(logs)
    if not series:
        return []
    starts = starts or {}
    # method -> its values in % and their bands, for the curves drawn on the shared scale
    percent = {
        m: ([100 * v for _, v, _ in pts], band(pts)) for m, (k, pts) in series.items() if k in PERCENT_KEYS
    }
    drawn = [v for values, bounds in percent.values() for v in [*values, *(x for b in bounds for x in b)]]
    lines_at = [starts[m][1] for m in percent if m in starts] + ([ceiling[1]] if ceiling else [])
    limits = _range(drawn + lines_at)
    columns = min(len(series), 3)
    lines = -(-len(series) // columns)
    fig, axes = plt.subplots(lines, columns, figsize=(3.8 * columns, 3.2 * lines), squeeze=False)
    for ax in axes.flat[len(series) :]:
        ax.axis("off")
    for ax, (method, (key, points)) in zip(axes.flat, series.items(), strict=False):
        steps = [p[0] for p in points]
        if method in percent:
            _percent_panel(ax, PERCENT_KEYS[key], steps, *percent[method], starts.get(method), ceiling)
            ax.set_ylim(limits)
        else:
            ax.plot(steps, [p[1] for p in points], marker="." if len(points) < 20 else None)
        ax.set_title(method, fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel(f"{PERCENT_KEYS[key]} (%)" if key in PERCENT_KEYS else key, fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
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


def _percent_panel(ax, name: str, steps, values, bounds, start: tuple[str, float] | None, ceiling) -> None:
    """A held-out curve in %, its 95% band where known, the start's and the ceiling's test Acc as lines."""
    ax.plot(steps, values, marker="." if len(values) < 20 else None, label=name)
    if any(b[0] == b[0] for b in bounds):
        ax.fill_between(
            steps, [b[0] for b in bounds], [b[1] for b in bounds], alpha=0.2, label="95% band (Wilson)"
        )
    if start is not None:
        ax.axhline(start[1], color="tab:orange", linestyle="--", label=f"start: {start[0]}, test Acc")
    if ceiling is not None:
        ax.axhline(ceiling[1], color="tab:green", linestyle=":", label=f"{ceiling[0]}, test Acc")
    ax.legend(fontsize=6)
