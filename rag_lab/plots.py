"""The comparison's figures (matplotlib, png + svg): accuracy against retrieval count with the Pareto
front (:func:`pareto`) and the methods' training curves side by side (:func:`curves_side_by_side`)."""

import json
import os
from pathlib import Path

import pandas as pd


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
    """Each row of a :func:`rag_lab.compare.compare_table` at (mean ``x``, mean ``y``) with its 95%
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
    for (px, py), members in names.items():
        ax.annotate(" = ".join(members), (px, py), textcoords="offset points", xytext=(5, 5), fontsize=8)
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
    fig.tight_layout()
    _save(fig, stem)
    plt.close(fig)


# What each training log is plotted by, the first of these it has: the held-out curve (the policy's Acc on
# held-out questions as it trains: rag_lab/train/heldout.py), EVO-RAG's dev EM per cycle, else the training
# signal (the reward: DAPO, R3-RAG's per step, APEX's SEPR; Stop-RAG's Q-network loss).
CURVE_KEYS = ("heldout/acc", "dev_em", "reward", "reward/step", "rewards/sepr/mean", "val_loss", "loss")


def curves_side_by_side(logs: dict[str, Path], stem: Path, title: str) -> list[str]:
    """One panel per method: its training log (``train_log.jsonl`` rows), by the first of
    :data:`CURVE_KEYS` it has, against the step; returns the methods drawn."""
    plt = _pyplot()
    series, texts = {}, set()
    for method, path in logs.items():
        text = path.read_text()
        if text in texts:  # the same training as a row before (a stopper row reuses its method's model)
            continue
        texts.add(text)
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        key = next((k for k in CURVE_KEYS if any(k in r for r in rows)), None)
        points = [(r.get("step", i), r[key]) for i, r in enumerate(rows) if key and key in r]
        if points:
            series[method] = (key, points)
    if not series:
        return []
    columns = min(len(series), 3)
    lines = -(-len(series) // columns)
    fig, axes = plt.subplots(lines, columns, figsize=(3.6 * columns, 3.0 * lines), squeeze=False)
    for ax in axes.flat[len(series) :]:
        ax.axis("off")
    for ax, (method, (key, points)) in zip(axes.flat, series.items(), strict=False):
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="." if len(points) < 20 else None)
        ax.set_title(method, fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel(key, fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    _save(fig, stem)
    plt.close(fig)
    return list(series)
