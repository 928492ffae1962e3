"""R3-RAG's PPO terms against hand computations: the clipped surrogate (eq. 7) on both signs of the advantage,
its clip fraction, masked tokens that carry nothing, the KL to the initial model (eq. 9), the critic's
loss."""

import math

import pytest
import torch

from rag_lab.policies.r3rag.losses import explained_variance, kl_to_initial, policy_loss, value_loss


def test_the_clipped_surrogate_by_hand_and_masked_tokens_count_for_nothing():
    ratios = torch.tensor([[1.5, 0.5, 1.1, 0.7, 9.0]])
    advantages = torch.tensor([[2.0, 2.0, -1.0, -1.0, 5.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])  # the last token is a retrieved one: no loss
    loss, clipped = policy_loss(ratios.log(), torch.zeros(1, 5), advantages, mask, epsilon=0.2)
    # min(ρA, clip(ρ)A): 1.5·2 vs 1.2·2 → 2.4 (clipped); 0.5·2 vs 0.8·2 → 1.0; 1.1·−1 vs 1.1·−1 → −1.1;
    # 0.7·−1 vs 0.8·−1 → −0.8 (clipped)
    assert loss.item() == pytest.approx(-(2.4 + 1.0 - 1.1 - 0.8) / 4)
    assert clipped.item() == pytest.approx(2 / 4)


def test_the_kl_to_the_initial_model_by_hand():
    logprobs = torch.tensor([[math.log(0.5), math.log(0.25), 0.0]])
    init = torch.tensor([[math.log(0.25), math.log(0.25), 5.0]])
    kl = kl_to_initial(logprobs, init, torch.tensor([[1, 1, 0]]))
    # r = π_init / π_θ: 0.5 then 1 → r log r − (r − 1) = 0.5·log 0.5 + 0.5 = 0.153426, then 0
    assert kl.item() == pytest.approx((0.5 * math.log(0.5) + 0.5) / 2)
    assert kl_to_initial(init, init, torch.ones(1, 3)).item() == 0.0


def test_the_critics_loss_and_explained_variance_by_hand():
    values, old, returns = torch.tensor([[2.0, 1.0]]), torch.tensor([[0.0, 1.0]]), torch.tensor([[3.0, 0.0]])
    mask = torch.ones(1, 2)
    assert value_loss(values, old, returns, mask).item() == pytest.approx((1.0 + 1.0) / 4)
    # clipped at 0.5: the first old value moves to 0.5, (0.5 − 3)² = 6.25 > 1; the second does not move
    assert value_loss(values, old, returns, mask, 0.5).item() == pytest.approx((6.25 + 1.0) / 4)
    # Var(R) = 2.25, Var(R − V) = Var([1, −1]) = 1
    assert explained_variance(values, returns, mask) == pytest.approx(1 - 1 / 2.25)
    assert math.isnan(explained_variance(values, torch.ones(1, 2), mask))
