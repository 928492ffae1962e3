"""Generalised advantage estimation for R3-RAG's PPO (arXiv:2505.23794 appendix B, eq. 8; every step of an
episode is one PPO sample with a scalar reward, appendix A; GAE with γ = λ = 1 in the authors' code:
docs/methods/r3rag.md#formulas-as-implemented).

For an episode of T steps with rewards r_t and value estimates V_t (the critic's, at each step's state):

    δ_t = r_t + γ V_{t+1} − V_t          (V_T = 0: the episode ends)
    A_t = δ_t + γ λ A_{t+1}              (A_T = 0)
    R_t = A_t + V_t                      (the critic's regression target)

(Schulman et al. 2016, "High-dimensional continuous control using generalized advantage estimation", eq. 16.)
Episodes of a batch are rows of a [B, T] tensor padded on the right; ``mask`` marks their real steps, and a
padded step has advantage and return 0.

Hand-written: TRL 1.16 has no PPO trainer (its GRPO has no critic), and this recursion is ten lines.
"""

import torch


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), each [B, T], of the episodes in the rows of ``rewards`` and ``values`` ([B, T],
    ``mask`` 1 on each episode's steps, which come first).

    >>> a, r = gae(torch.tensor([[1.0, 2.0]]), torch.tensor([[0.5, 1.0]]), torch.ones(1, 2), 0.5, 0.5)
    >>> a.tolist(), r.tolist()  # δ1 = 2 - 1 = 1; δ0 = 1 + 0.5·1 - 0.5 = 1, A0 = 1 + 0.25·1
    ([[1.25, 1.0]], [[1.75, 2.0]])
    """
    if not rewards.shape == values.shape == mask.shape:
        raise ValueError(
            f"gae: rewards {tuple(rewards.shape)}, values {tuple(values.shape)}, mask {tuple(mask.shape)}"
        )
    mask = mask.to(rewards.dtype)
    advantages = torch.zeros_like(rewards)
    following = torch.zeros_like(rewards[:, 0])  # A_{t+1}
    next_value = torch.zeros_like(rewards[:, 0])  # V_{t+1}
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        following = (delta + gamma * lam * following) * mask[:, t]
        advantages[:, t] = following
        next_value = values[:, t] * mask[:, t]
    return advantages, (advantages + values) * mask
