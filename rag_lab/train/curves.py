"""Training curves, as every trainer of rag_lab writes them: one row per logged step (a ``transformers``
trainer's logs, and whatever the method adds) to a ``log.jsonl`` while it trains (:class:`CurveLog`), then
to the run (:func:`write_curves`: ``checkpoints/train_log.jsonl``, the logger, a png of chosen panels)."""

import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from transformers import TrainerCallback

from rag_lab.core.records import RecordWriter, atomic_write_text, read_records
from rag_lab.train.parallel import is_main

# (title, the row keys it plots) per panel of the png
Panels = list[tuple[str, list[str]]]


class CurveLog(TrainerCallback):
    """Appends each logged step (its finite numbers; ``finish(row)`` renames or adds keys) to ``path``; on
    a resume, first drops the rows after the checkpoint (a killed run's steps are trained again and logged
    once). Under ``launch`` the main process writes (the rows are the whole batch's: TRL gathers them)."""

    def __init__(self, path: Path, resumed_at: int = 0, finish: Callable[[dict], dict] | None = None):
        self.path = Path(path)
        self.resumed_at = resumed_at
        self.finish = finish or (lambda row: row)
        if self.path.exists() and is_main():
            kept = [r for r in read_records(self.path) if r["step"] <= resumed_at]
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        self.writer = RecordWriter(self.path)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs or not state.is_world_process_zero:
            return
        row = {"step": state.global_step, "time": time.time()}
        row |= {k: v for k, v in logs.items() if isinstance(v, int | float) and math.isfinite(v)}
        self.writer.write([self.finish(row)])


def write_curves(
    rows: list[dict], out_dir: Path, logger, panels: Panels, title: str, sharex: bool = True
) -> None:
    """The run's curve (every stage, steps numbered on): ``train_log.jsonl``, ``curves.png`` (``panels``:
    (title, row keys) per plot), and the logger's metrics once per run (a resumed run that finds them
    logged does not log them twice)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    atomic_write_text(out_dir / "train_log.jsonl", text)
    plot(rows, out_dir / "curves.png", panels, title, sharex)
    log_once(rows, out_dir, logger)


def log_once(rows: list[dict], out_dir: Path, logger) -> None:
    """``rows`` (a training log's, each with its ``step``) to the run's logger, once: ``out_dir/.logged``
    counts the rows logged, so a resumed or reused fit that finds them logged does not log them twice."""
    marker = out_dir / ".logged"
    if logger is not None and not (marker.exists() and marker.read_text() == str(len(rows))):
        for r in rows:
            logger.log_metrics({k: v for k, v in r.items() if k not in ("step", "time")}, step=r["step"])
        atomic_write_text(marker, str(len(rows)))


def plot(rows: list[dict], path: Path, panels: Panels, title: str, sharex: bool = True) -> None:
    """``panels`` in a 2-row grid; ``sharex``: one step axis (stages that follow each other), else each
    panel its own (stages of different lengths whose panels do not overlap)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = math.ceil(len(panels) / 2)
    fig, axes = plt.subplots(2, columns, figsize=(4.4 * columns, 6.5), sharex=sharex, squeeze=False)
    boundaries = [b["step"] - 0.5 for a, b in zip(rows, rows[1:], strict=False) if a["stage"] != b["stage"]]
    for ax, (name, keys) in zip(axes.flat, panels, strict=False):
        for key in keys:
            points = [(r["step"], r[key], r["stage"]) for r in rows if key in r]
            if not points:
                continue
            label = key.removeprefix("rewards/").removesuffix("/mean")
            window = len(points) // 15
            if window < 2:
                ax.plot([p[0] for p in points], [p[1] for p in points], label=label)
                continue
            # a noisy per-step curve: faint, with its moving average (within each stage) on top
            line = ax.plot([p[0] for p in points], [p[1] for p in points], alpha=0.3, linewidth=0.8)[0]
            for i, stage in enumerate(dict.fromkeys(p[2] for p in points)):
                steps, values = zip(*[(p[0], p[1]) for p in points if p[2] == stage], strict=True)
                if len(values) >= window:
                    smooth = np.convolve(values, np.ones(window) / window, mode="valid")
                    ax.plot(
                        steps[window - 1 :],
                        smooth,
                        color=line.get_color(),
                        label=f"{label} (mean of {window})" if i == 0 else None,
                    )
        for x in boundaries if sharex else []:
            ax.axvline(x, color="grey", linestyle="--", linewidth=1)
        ax.set_title(name)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    for ax in axes[-1] if sharex else axes.flat:
        ax.set_xlabel("step (dashed: next stage)" if sharex else "step")
    stages = " → ".join(dict.fromkeys(r["stage"] for r in rows))
    fig.suptitle(f"{title}, stages {stages}")
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
