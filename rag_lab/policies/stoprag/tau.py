"""Stop-RAG's threshold τ (arXiv:2510.14337 sec. 5.3: stop when Q(s, STOP) − Q(s, CONT) > τ), tuned on the
validation split.

Every dev question has run once to the horizon with its greedy final answer kept at every state
(``offline.collect(..., greedy_answers=True)``). The pipeline is deterministic and a stop only cuts
the trace, so the F1 and the average steps of *any* τ follow from those runs exactly: one forward pass
of the Q-network per state gives the margins, and each τ of the grid is a column scan. The best-F1 τ
is kept (ties: fewer steps); the whole curve goes to ``tau_curve.csv`` and ``tau_curve.png`` / ``.svg``.
"""

import csv
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import torch

from rag_lab.data.base import QAExample
from rag_lab.eval.metrics import SCORERS
from rag_lab.policies.stoprag.offline import Trajectory, states_of
from rag_lab.policies.stoprag.qnet import QNetwork

log = logging.getLogger(__name__)


def stop_times(margins: torch.Tensor, tau: float) -> torch.Tensor:
    """[N] the first t in 1 .. T-1 with margin > τ, else T, from ``margins[:, t]`` (column 0 unused).

    >>> stop_times(torch.tensor([[0.0, -1.0, 0.5, 0.9], [0.0, -1.0, -1.0, -1.0]]), 0.4).tolist()
    [2, 4]
    """
    horizon = margins.shape[1]
    hit = margins[:, 1:] > tau
    first = hit.float().argmax(dim=1) + 1
    return torch.where(hit.any(dim=1), first, torch.full_like(first, horizon))


def margins_of(qnet: QNetwork, trajs: Sequence[Trajectory], horizon: int) -> torch.Tensor:
    """[N, T] Q(s_t, STOP) − Q(s_t, CONT) for t = 1 .. T-1 (column 0 unused), 8 questions a pass."""
    margins = torch.zeros(len(trajs), horizon)
    with torch.no_grad():
        for i in range(0, len(trajs), 8):
            chunk = trajs[i : i + 8]
            stop, cont = qnet([s for t in chunk for s in states_of(t, horizon - 1)])
            margins[i : i + len(chunk), 1:] = (stop - cont).float().cpu().view(len(chunk), horizon - 1)
    return margins


def heldout_at(
    qnet: QNetwork | None,
    trajs: Sequence[Trajectory],
    dev: Sequence[QAExample],
    horizon: int,
    tau: float = 0.0,
) -> dict[str, float]:
    """The held-out curve's values (:mod:`rag_lab.train.heldout`) from the dev trajectories: Acc and steps
    of the pipeline stopped by ``qnet`` at ``tau`` (0: stop where Q(s, STOP) > Q(s, CONT), no τ tuned), or
    with no ``qnet`` at the horizon (fixed T: Stop-RAG's start)."""
    if qnet is None:
        ts = [horizon] * len(trajs)
    else:
        was_training = qnet.training
        qnet.eval()
        ts = stop_times(margins_of(qnet, trajs, horizon), tau).tolist()
        qnet.train(was_training)
    acc = SCORERS["squad"]["acc"]
    gold = {ex.id: list(ex.answers) for ex in dev}
    right = [acc(t.answers[s - 1], gold[t.question_id]) for t, s in zip(trajs, ts, strict=True)]
    return {
        "heldout/acc": sum(right) / len(right),
        "heldout/steps": sum(ts) / len(ts),
        "heldout/n": len(right),
    }


def tune_tau(
    qnet: QNetwork,
    trajs: Sequence[Trajectory],
    dev: Sequence[QAExample],
    horizon: int,
    grid: Sequence[float],
    out_dir: Path,
) -> tuple[float, dict]:
    """The best-F1 τ of ``grid`` on the dev trajectories, and its row (τ, F1, EM, steps); the curve
    goes to ``out_dir``."""
    margins = margins_of(qnet, trajs, horizon)
    f1, em = SCORERS["squad"]["f1"], SCORERS["squad"]["em"]
    gold = {ex.id: list(ex.answers) for ex in dev}
    golds = [gold[t.question_id] for t in trajs]
    curve = []
    for tau in grid:
        ts = stop_times(margins, tau).tolist()
        answers = [t.answers[s - 1] for t, s in zip(trajs, ts, strict=True)]
        curve.append(
            {
                "tau": tau,
                "f1": 100 * sum(map(f1, answers, golds)) / len(trajs),
                "em": 100 * sum(map(em, answers, golds)) / len(trajs),
                "steps": sum(ts) / len(ts),
            }
        )
    best = max(curve, key=lambda r: (round(r["f1"], 6), -r["steps"]))
    with (out_dir / "tau_curve.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["tau", "f1", "em", "steps"])
        writer.writeheader()
        writer.writerows(curve)
    plot_tau_curve(curve, best["tau"], out_dir / "tau_curve.png")
    log.info(
        "Stop-RAG: τ = %.2f on %d validation questions (F1 %.1f, %.2f steps)",
        best["tau"],
        len(trajs),
        best["f1"],
        best["steps"],
    )
    return best["tau"], best


def plot_tau_curve(curve: list[dict], tau: float, path: Path) -> None:
    """Validation F1 and average iterations against τ, the chosen τ dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    taus = [r["tau"] for r in curve]
    ax.plot(taus, [r["f1"] for r in curve], color="tab:blue", label="F1")
    ax.set_xlabel("τ (stop when Q(STOP) − Q(CONT) > τ)")
    ax.set_ylabel("validation F1", color="tab:blue")
    ax.axvline(tau, color="grey", linestyle="--", linewidth=1)
    twin = ax.twinx()
    twin.plot(taus, [r["steps"] for r in curve], color="tab:orange", label="steps")
    twin.set_ylabel("average iterations", color="tab:orange")
    ax.set_title(f"Stop-RAG τ curve (chosen τ = {tau:.2f})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    for out in (path, path.with_suffix(".svg")):  # png to look at, svg for papers
        tmp = out.with_name(f".{out.name}.tmp{out.suffix}")
        fig.savefig(tmp, dpi=120)
        os.replace(tmp, out)
    plt.close(fig)
