"""R3-RAG's PPO objective (arXiv:2505.23794 eq. 7 and appendix B eq. 9; docs/methods/r3rag.md), token by
token over the policy's own tokens (``mask``: 1 on tokens the policy wrote, 0 on the prompt, retrieved
documents and padding, which carry no loss):

- the clipped surrogate, eq. 7: −min(ρ A, clip(ρ, 1 − ε, 1 + ε) A), ρ = π_θ / π_old per token, A the step's
  advantage (:mod:`.gae`) on each of its tokens; with the share of tokens where the clip binds;
- the KL penalty to the initial model, eq. 9, D_KL[π_init ‖ π_θ]. Sampled from π_θ, its per-token estimate is
  r log r − (r − 1) with r = π_init / π_θ: unbiased (E_θ[r] = 1) and never negative;
- the critic's loss: ½ (V − R)², or clipped around the old values as PPO implementations do
  (``value_clip``; None: not clipped).

Means are over the masked tokens of the batch. Hand-written: TRL 1.16 has no PPO trainer.
"""

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of ``x`` over the positions where ``mask`` is 1 (0 when there are none)."""
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1)


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    epsilon: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(eq. 7's clipped surrogate as a loss, the share of tokens where the clip binds: the clipped term is the
    smaller, so the token gives no gradient), all [B, L].

    >>> lp, old, adv = torch.log(torch.tensor([[1.5, 0.5]])), torch.zeros(1, 2), torch.tensor([[1.0, 1.0]])
    >>> loss, clipped = policy_loss(lp, old, adv, torch.ones(1, 2), 0.2)
    >>> round(loss.item(), 6), clipped.item()  # -(min(1.5, 1.2) + min(0.5, 0.8)) / 2
    (-0.85, 0.5)
    """
    ratio = torch.exp(logprobs - old_logprobs)
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + epsilon)
    surrogate = torch.minimum(ratio * advantages, clipped * advantages)
    binds = (clipped * advantages < ratio * advantages).to(logprobs.dtype)  # the clipped term is the min
    return -masked_mean(surrogate, mask), masked_mean(binds, mask)


def kl_to_initial(logprobs: torch.Tensor, init_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Eq. 9, D_KL[π_init ‖ π_θ], estimated on tokens sampled from π_θ (module docstring).

    >>> kl_to_initial(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2)).item()
    0.0
    """
    log_r = init_logprobs - logprobs
    r = torch.exp(log_r)
    return masked_mean(r * log_r - (r - 1), mask)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    value_clip: float | None = None,
) -> torch.Tensor:
    """The critic's loss, ½ (V − R)², or with ``value_clip`` the larger of that and the same for the old
    value moved at most ``value_clip`` towards V.

    >>> v, old, ret, one = torch.tensor([[2.0]]), torch.zeros(1, 1), torch.tensor([[3.0]]), torch.ones(1, 1)
    >>> value_loss(v, old, ret, one).item(), value_loss(v, old, ret, one, 0.5).item()  # (0.5 - 3)² / 2
    (0.5, 3.125)
    """
    loss = (values - returns) ** 2
    if value_clip is not None:
        moved = old_values + torch.clamp(values - old_values, -value_clip, value_clip)
        loss = torch.maximum(loss, (moved - returns) ** 2)
    return 0.5 * masked_mean(loss, mask)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 − Var(R − V) / Var(R) over the masked positions: 1 when the critic predicts the returns, 0 when it
    predicts their mean, NaN when the returns do not vary.

    >>> explained_variance(torch.tensor([[1.0, 2.0]]), torch.tensor([[1.0, 2.0]]), torch.ones(1, 2))
    1.0
    """
    keep = mask.bool()
    r, v = returns[keep].double(), values[keep].double()
    spread = r.var(unbiased=False)
    return float("nan") if spread == 0 else (1 - (r - v).var(unbiased=False) / spread).item()
