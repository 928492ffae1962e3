"""EVO-RAG's multi-head preference model: the pairs, the loss by hand, training on separable pairs."""

import math

import numpy as np
import pytest
import torch

from rag_lab.core.errors import RagLabError
from rag_lab.policies.evorag.preference import Branch, PreferenceModel, pairwise_loss, preference_pairs

pytestmark = pytest.mark.usefixtures("one_thread")


class OneHot:
    """Each known text is its own axis: pairs are linearly separable, and every call is recorded."""

    def __init__(self, texts):
        self.index = {t: i for i, t in enumerate(texts)}
        self.dim = len(texts)
        self.calls = []

    def encode(self, texts):
        self.calls.append(list(texts))
        return np.eye(self.dim, dtype=np.float32)[[self.index[t] for t in texts]]


def test_the_loss_by_hand():
    # σ(ln 3) = 3/4 on every head: −log(3/4).
    diff = torch.full((2, 7), math.log(3))
    assert pairwise_loss(diff, torch.zeros(2, 7)).item() == pytest.approx(-math.log(0.75))
    # Two heads, margins 0 and ln 3: the mean of log 2 and −log(3/4).
    loss = pairwise_loss(torch.tensor([[0.0, math.log(3)]]), torch.zeros(1, 2))
    assert loss.item() == pytest.approx((math.log(2) - math.log(0.75)) / 2)


def test_pairs_need_different_actions_and_a_margin_of_delta():
    branches = [
        Branch("search A", "search", 0.9),
        Branch("search B", "search", 0.0),  # same action as the first: never paired with it
        Branch("answer", "answer", 0.7),  # 0.2 from the first: under Δ = 0.3
        Branch("refuse", "refuse", -0.5),
    ]
    pairs = [(p.text, n.text) for p, n in preference_pairs(branches)]
    # Margins 1.4, 1.2, 0.7, 0.5, widest first.
    expected = [("search A", "refuse"), ("answer", "refuse"), ("answer", "search B"), ("search B", "refuse")]
    assert pairs == expected
    assert [(p.text, n.text) for p, n in preference_pairs(branches, delta=0.1, per_state=2)] == pairs[:2]


def test_training_ranks_every_pair_and_is_seeded():
    texts = [f"t{i}" for i in range(8)]
    pairs = [(Branch(texts[i], "search", 1.0), Branch(texts[i + 4], "answer", 0.0)) for i in range(4)]
    encoder = OneHot(texts)
    model = PreferenceModel(encoder, seed=3)
    before = model.accuracy(pairs)
    losses = model.fit(pairs, epochs=60, lr=0.05, batch_size=2, seed=3)
    assert losses[-1] < losses[0] and model.accuracy(pairs) == 1.0 and before < 1.0
    assert sorted(t for call in encoder.calls for t in call) == texts  # each text embedded once
    again = PreferenceModel(OneHot(texts), seed=3)
    again.fit(pairs, epochs=60, lr=0.05, batch_size=2, seed=3)
    assert torch.equal(again.heads.weight, model.heads.weight)
    assert model(texts).shape == (8, 7) and PreferenceModel(encoder, heads=1)(texts).shape == (8, 1)


def test_with_minilm_the_heads_learn_to_prefer_grounded_answers():
    good = [
        "Question: Where was Ada born?\nSEARCH: Ada birthplace\nANSWER: Velmora",
        "Question: Who founded Kaltane?\nSEARCH: Kaltane founder\nANSWER: Zorbu",
    ]
    bad = ["Question: Where was Ada born?\nREFUSE", "Question: Who founded Kaltane?\nREFUSE"]
    pairs = [(Branch(g, "answer", 1.0), Branch(b, "refuse", -0.5)) for g, b in zip(good, bad, strict=True)]
    model = PreferenceModel()
    model.fit(pairs, epochs=30, lr=0.01)
    assert model.accuracy(pairs) == 1.0


@pytest.mark.parametrize(
    ("call", "key"),
    [
        (lambda: PreferenceModel(OneHot(["a"]), heads=0), "policy.preference.heads"),
        (lambda: PreferenceModel(OneHot(["a"])).fit([]), "no pairs"),
    ],
)
def test_bad_settings_are_one_line_errors(call, key):
    with pytest.raises(RagLabError, match=key):
        call()
