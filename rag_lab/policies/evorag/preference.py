"""EVO-RAG's multi-head preference model (arXiv:2505.17391 sec. 3.3; docs/methods/evorag.md).

At each visited state, sibling branches (the same prefix, then different actions, each rolled out)
are scored by their weighted return R(x) = Σ_t w(t)·r_t (``rag_lab.rewards.evorag``); two branches
ending in different actions make a pair (x⁺, x⁻) when |R(x⁺) − R(x⁻)| ≥ Δ = 0.3
(:func:`preference_pairs`). A frozen encoder embeds each trajectory's text and seven parallel linear
heads f⁽ᵏ⁾ score it, one per reward component, trained on

    L_RM = −1/7 Σ_k log σ(f⁽ᵏ⁾(x⁺) − f⁽ᵏ⁾(x⁻))                        (sec. 3.3)

averaged over the pairs (:func:`pairwise_loss`). ``heads=1`` is the paper's single-head comparison.

Deviations, written down:

- The paper's encoder is a frozen LLM (e.g. Llama-3.1-8B); any encoder of the retriever registry plugs
  in (``encoder``), all-MiniLM-L6-v2 by default (offline, 2 CPU cores). The encoder never trains, so
  each text is embedded once (memoised) and only the heads see gradients.
- The paper does not say how many pairs a state gives; every qualifying pair of branches with
  different actions at the state is kept (``per_state=None``), or the ``per_state`` widest ones.

Hand-written: a multi-head Bradley-Terry model over a frozen encoder is a linear layer and a loss,
which no library packages; TRL's ``RewardTrainer`` trains a single-score sequence classifier.
"""

import functools
import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from rag_lab.core.errors import RagLabError
from rag_lab.rewards.evorag import COMPONENTS
from rag_lab.train.parallel import shared_backward

# |R(x+) − R(x−)| at least this for a pair (sec. 3.3's Δ).
DELTA = 0.3
MINILM = "sentence-transformers/all-MiniLM-L6-v2"


@dataclass(frozen=True)
class Branch:
    """One rolled-out branch from a state: its trajectory text (what the preference model reads), its
    action at the state, its return R(x), and the action's own text and token ids (what DPO trains on:
    the ids the policy wrote, :func:`rag_lab.policies.evorag.branches.action_ids`)."""

    text: str
    action: str
    value: float
    completion: str = ""
    completion_ids: list[int] = field(default_factory=list)


def preference_pairs(
    branches: Sequence[Branch], delta: float = DELTA, per_state: int | None = None
) -> list[tuple[Branch, Branch]]:
    """(x⁺, x⁻) pairs among one state's sibling ``branches``: different actions, |ΔR| ≥ ``delta``,
    the better first; widest margin first (ties: the branches' order).

    >>> b = [Branch("s", "search", 1.0), Branch("a", "answer", 0.5), Branch("r", "refuse", 0.9)]
    >>> [(p.text, n.text) for p, n in preference_pairs(b)]
    [('s', 'a'), ('r', 'a')]
    >>> [(p.text, n.text) for p, n in preference_pairs(b, per_state=1)]
    [('s', 'a')]
    """
    pairs = []
    for a, b in itertools.combinations(branches, 2):
        if a.action != b.action and abs(a.value - b.value) >= delta:
            pairs.append((a, b) if a.value > b.value else (b, a))
    pairs.sort(key=lambda pair: -(pair[0].value - pair[1].value))
    return pairs[:per_state] if per_state is not None else pairs


def pairwise_loss(positive: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
    """L_RM: −1/K Σ_k log σ(f_k(x⁺) − f_k(x⁻)) for [N, K] head scores, averaged over the N pairs.

    >>> round(pairwise_loss(torch.zeros(2, 7), torch.zeros(2, 7)).item(), 6) == round(math.log(2), 6)
    True
    """
    return -F.logsigmoid(positive - negative).mean()


class PreferenceModel(nn.Module):
    """A frozen ``encoder`` (a registry name, or any object with ``encode(texts)`` and ``dim``) and
    ``heads`` linear heads, seeded by ``seed``."""

    def __init__(self, encoder: str | Any = MINILM, heads: int = len(COMPONENTS), seed: int = 0):
        super().__init__()
        if heads < 1:
            raise RagLabError(f"policy.preference.heads must be at least 1, got {heads}")
        if isinstance(encoder, str):
            from rag_lab.retrievers.dense import Encoder

            encoder = Encoder(encoder)
        self.encoder = encoder
        generator = torch.Generator().manual_seed(seed)
        self.heads = nn.Linear(encoder.dim, heads)
        with torch.no_grad():
            bound = 1 / math.sqrt(encoder.dim)  # nn.Linear's own init, from a seeded generator
            self.heads.weight.uniform_(-bound, bound, generator=generator)
            self.heads.bias.uniform_(-bound, bound, generator=generator)
        self._memo: dict[str, torch.Tensor] = {}

    def forget(self) -> None:
        """Drop the memoised embeddings (the encoder pads per batch, so a text's embedding depends a little
        on the batch it came in: a resumed cycle must embed as an uninterrupted one)."""
        self._memo.clear()

    def embed(self, texts: Sequence[str]) -> torch.Tensor:
        """[N, d] the frozen encoder's embeddings, each distinct text encoded once."""
        new = [t for t in dict.fromkeys(texts) if t not in self._memo]
        if new:
            rows = torch.as_tensor(self.encoder.encode(new), dtype=torch.float32)
            self._memo.update(zip(new, rows, strict=True))
        return torch.stack([self._memo[t] for t in texts]).to(self.heads.weight.device)

    def forward(self, texts: Sequence[str]) -> torch.Tensor:
        """[N, K] the heads' scores of each trajectory text."""
        return self.heads(self.embed(texts))

    def fit(
        self,
        pairs: Sequence[tuple[Branch, Branch]],
        epochs: int = 1,
        lr: float = 1e-3,
        batch_size: int = 64,
        seed: int = 0,
    ) -> list[float]:
        """Minimise L_RM over ``pairs`` with AdamW, the data order seeded; each epoch's mean loss."""
        if not pairs:
            raise RagLabError("preference model: no pairs to train on (no branches differed by Δ)")
        params = list(self.heads.parameters())
        opt = torch.optim.AdamW(params, lr=lr)
        rng, order, losses = random.Random(seed), list(range(len(pairs))), []
        self.embed([b.text for pair in pairs for b in pair])  # one encoder pass over every text
        for _ in range(epochs):
            rng.shuffle(order)
            total = 0.0
            for start in range(0, len(order), batch_size):
                batch = [pairs[i] for i in order[start : start + batch_size]]
                opt.zero_grad()
                # the batch's mean loss; under launch each process its share (rag_lab.train.parallel)
                loss = shared_backward(batch, functools.partial(self.loss, of=len(batch)), params)
                opt.step()
                total += loss.item() * len(batch)
            losses.append(total / len(pairs))
        return losses

    def loss(self, pairs: Sequence[tuple[Branch, Branch]], of: int | None = None):
        """L_RM's mean over ``pairs`` (:func:`pairwise_loss`); ``of``: over a batch of that many, of which
        ``pairs`` is a share (its sum over the shares is the batch's mean)."""
        loss = pairwise_loss(self([p.text for p, _ in pairs]), self([n.text for _, n in pairs]))
        return loss if of is None or of == len(pairs) else loss * len(pairs) / of

    @torch.no_grad()
    def accuracy(self, pairs: Sequence[tuple[Branch, Branch]]) -> float:
        """The share of ``pairs`` whose x⁺ the heads' mean scores above x⁻ (table 5's "internal accuracy")."""
        if not pairs:
            return float("nan")
        pos = self([p.text for p, _ in pairs]).mean(1)
        neg = self([n.text for _, n in pairs]).mean(1)
        return (pos > neg).float().mean().item()
