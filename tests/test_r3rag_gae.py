"""R3-RAG's GAE against a hand computation: a 4-step episode with γ and λ not 1, and a shorter padded one."""

import pytest
import torch

from rag_lab.policies.r3rag.gae import gae


def test_gae_of_a_four_step_episode_and_a_padded_one_by_hand():
    rewards = torch.tensor([[1.0, 0.0, 0.5, 2.0], [1.0, 1.0, 7.0, 7.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 0.4, 0.3, 0.2], [0.0, 0.5, 9.0, 9.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    advantages, returns = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    # episode 1, γλ = 0.72: δ3 = 2 − 0.2 = 1.8; δ2 = 0.5 + 0.9·0.2 − 0.3 = 0.38; δ1 = 0.9·0.3 − 0.4
    # = −0.13; δ0 = 1 + 0.9·0.4 − 0.5 = 0.86. A3 = 1.8, A2 = 0.38 + 0.72·1.8 = 1.676,
    # A1 = −0.13 + 0.72·1.676 = 1.07672, A0 = 0.86 + 0.72·1.07672 = 1.6352384
    first = [1.6352384, 1.07672, 1.676, 1.8]
    # episode 2 ends after two steps (its padding's rewards and values count for nothing): δ1 = 1 − 0.5,
    # δ0 = 1 + 0.9·0.5 − 0 = 1.45; A1 = 0.5, A0 = 1.45 + 0.72·0.5 = 1.81
    second = [1.81, 0.5, 0.0, 0.0]
    assert advantages.tolist() == [pytest.approx(first, abs=1e-12), pytest.approx(second, abs=1e-12)]
    assert returns.tolist() == [
        pytest.approx([1.6352384 + 0.5, 1.07672 + 0.4, 1.676 + 0.3, 1.8 + 0.2], abs=1e-12),
        pytest.approx([1.81, 1.0, 0.0, 0.0], abs=1e-12),
    ]


def test_with_gamma_and_lambda_one_the_advantage_is_the_reward_to_go_less_the_value():
    rewards, values = torch.tensor([[0.3, -0.9, 2.0]]), torch.tensor([[1.0, 0.5, 0.25]])
    advantages, _ = gae(rewards, values, torch.ones(1, 3))
    assert advantages.tolist() == [pytest.approx([1.4 - 1.0, 1.1 - 0.5, 2.0 - 0.25])]


def test_mismatched_shapes_are_named():
    with pytest.raises(ValueError, match=r"rewards \(1, 2\), values \(1, 3\)"):
        gae(torch.zeros(1, 2), torch.zeros(1, 3), torch.ones(1, 2))
