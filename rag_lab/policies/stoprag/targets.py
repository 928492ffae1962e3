"""Stop-RAG's regression targets (arXiv:2510.14337 sec. 4.2, appendix C; docs/methods/stoprag.md), vectorised
over a batch.

Hand-written: no RL library has the full-width forward-view Q(λ) of a two-action stopping MDP.

A trajectory of horizon T has states s_1 .. s_T (s_t = the question and t iterations of
evidence); decisions are taken at s_1 .. s_{T-1}. Per trajectory the inputs are one row of

- ``rewards[:, t]`` = r(s_t, STOP) for t = 1 .. T (eq. 13), column 0 unused; r(s_T, STOP) is
  r(s_{T-1}, CONT) (eq. 14);
- ``q_stop[:, t]``, ``q_cont[:, t]`` = Q_θ(s_t, ·) for t = 1 .. T-1, computed under no-grad
  (stop-gradient ⟦·⟧ of eq. 9; the authors bootstrap from the current network, no target net).

Target types (the paper's table 3): ``qlambda`` (eqs. 8-12), ``mc`` (λ = 1), ``q0`` (λ = 0),
``binary`` (label 1[MC_STOP ≥ MC_CONT] for a BCE on Q_STOP - Q_CONT).
"""

import math

import torch

from rag_lab.core.errors import RagLabError

TARGETS = ("qlambda", "mc", "q0", "binary")
SCHEDULES = ("cosine", "linear", "constant")


def lambda_at(progress: float, start: float = 1.0, end: float = 0.1, schedule: str = "cosine") -> float:
    """λ after ``progress`` ∈ [0, 1] of training: cosine (default) or linear decay, or constant ``start``."""
    if schedule not in SCHEDULES:
        raise RagLabError(f"policy.lambda_schedule must be one of {SCHEDULES}, got {schedule!r}")
    p = min(max(progress, 0.0), 1.0)
    if schedule == "constant":
        return start
    if schedule == "linear":
        return start + (end - start) * p
    return end + (start - end) * 0.5 * (1 + math.cos(math.pi * p))


def _future(rewards: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For n = 1 .. T-1: the index t+n, whether n ≤ T-t-1 (eq. 9 applies), and
    max_{k=1..n-1} r(s_{t+k}, STOP) (-inf for n = 1)."""
    horizon = rewards.shape[1] - 1
    n = torch.arange(1, horizon, device=rewards.device)
    idx = t[:, None] + n[None, :]
    valid = idx <= horizon - 1
    r_next = rewards.gather(1, idx.clamp(max=horizon))  # r(s_{t+n}, STOP)
    first = torch.full_like(r_next[:, :1], -math.inf)
    before = torch.cat([first, r_next[:, :-1]], dim=1).cummax(dim=1).values
    return idx.clamp(max=horizon - 1), valid, before


def mc_cont(rewards: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Q̂^(T-t)(s_t, CONT), eq. 10: the best STOP reward after t, or r(s_{T-1}, CONT)."""
    horizon = rewards.shape[1] - 1
    _, _, before = _future(rewards, t)
    best = before.gather(1, (horizon - t - 1)[:, None])[:, 0]  # max over k = 1 .. T-t-1
    return torch.maximum(best, rewards[:, horizon])


def qlambda_cont(
    rewards: torch.Tensor, q_stop: torch.Tensor, q_cont: torch.Tensor, t: torch.Tensor, lam: float
) -> torch.Tensor:
    """Q̂λ(s_t, CONT), eq. 11 (eq. 12 at t = T-1), for each row's state index ``t`` (1 .. T-1)."""
    horizon = rewards.shape[1] - 1
    idx, valid, before = _future(rewards, t)
    boot = torch.maximum(q_stop.gather(1, idx), q_cont.gather(1, idx))  # ⟦Q_θ(s_{t+n}, ·)⟧
    q_n = torch.maximum(before, boot)  # eq. 9, n = 1 .. T-t-1
    n = torch.arange(1, horizon, device=rewards.device, dtype=rewards.dtype)
    weights = (1 - lam) * torch.pow(torch.tensor(lam, dtype=rewards.dtype), n - 1)
    partial = (weights * q_n).masked_fill(~valid, 0.0).sum(dim=1)
    tail = torch.pow(torch.tensor(lam, dtype=rewards.dtype), (horizon - t - 1).to(rewards.dtype))
    return partial + tail * mc_cont(rewards, t)


def targets(
    kind: str,
    rewards: torch.Tensor,
    t: torch.Tensor,
    q_stop: torch.Tensor | None = None,
    q_cont: torch.Tensor | None = None,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(STOP target, CONT target) per row; for ``binary`` the CONT slot holds the BCE label."""
    if kind not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {kind!r}")
    stop = rewards.gather(1, t[:, None])[:, 0]  # eq. 8
    if kind in ("mc", "binary"):
        cont = mc_cont(rewards, t)
        return (stop, (stop >= cont).to(rewards.dtype)) if kind == "binary" else (stop, cont)
    if q_stop is None or q_cont is None:
        raise ValueError(f"target {kind!r} bootstraps: pass q_stop and q_cont")
    return stop, qlambda_cont(rewards, q_stop, q_cont, t, 0.0 if kind == "q0" else lam)


def keep(rewards: torch.Tensor) -> torch.Tensor:
    """[N, T] mask of decision states s_1 .. s_{T-1} worth training on (column 0 and T false): the
    filter drops a state when r(s_t, STOP) = 0 and Q̂^(T-t)(s_t, CONT) = 0 (step 4 of sec. 4.2)."""
    n, width = rewards.shape
    horizon = width - 1
    mask = torch.zeros(n, width, dtype=torch.bool)
    for t in range(1, horizon):
        ts = torch.full((n,), t, dtype=torch.long)
        mask[:, t] = (rewards[:, t] > 0) | (mc_cont(rewards, ts) > 0)
    return mask
