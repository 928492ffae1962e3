"""Stop-RAG's Q-network (arXiv:2510.14337 sec. 5.3; docs/methods/stoprag.md): an HF encoder and two heads.

Input: ``question [SEP] d_1 [SEP] … [SEP] d_t`` (queries and intermediate answers are not in the
state, as in the paper), pooled (``cls`` for DeBERTa, ``mean`` for sentence encoders such as
MiniLM). Heads, one per action: Dropout → Linear(H, h) → SiLU → Linear(h, 1) (the authors' code;
h = ``head_hidden``, the paper's 4096, or the encoder width when null).

Deviation, written down: when the text does not fit ``max_length`` the paper's tokenizer cuts the
end (the newest evidence); ``truncation="per_passage"`` (our default) instead gives every passage
an equal share of the budget, so each state still shows all of its documents' openings.

``freeze_encoder=True`` (the CPU default) trains the heads only, on pooled encodings computed once
per state text and kept in memory (:meth:`QNetwork.encode`).
"""

from typing import Annotated

import torch
from torch import nn

from rag_lab.core.config import Dropout, OneOf, PositiveInt, check_ranges
from rag_lab.core.errors import RagLabError
from rag_lab.retrievers.dense import resolve_model


def head(width: int, hidden: int, dropout: float) -> nn.Sequential:
    return nn.Sequential(nn.Dropout(dropout), nn.Linear(width, hidden), nn.SiLU(), nn.Linear(hidden, 1))


class QNetwork(nn.Module):
    def __init__(
        self,
        # the state encoder: a hub name (in the local HF cache) or a local model directory
        encoder: str = "sentence-transformers/all-MiniLM-L6-v2",
        # the state's vector: the first token's (cls, DeBERTa) or the tokens' mean (sentence encoders)
        pooling: Annotated[str, OneOf("mean", "cls")] = "mean",
        # each head's hidden width h (null: the encoder's width)
        head_hidden: PositiveInt | None = None,
        # dropout before each head's first layer
        dropout: Dropout = 0.1,
        # tokens of the state text the encoder reads, at most
        max_length: PositiveInt = 512,
        # over max_length: per_passage gives each passage an equal share, end cuts the end (the paper's)
        truncation: Annotated[str, OneOf("per_passage", "end")] = "per_passage",
        # train the heads only, on encodings computed once (false: fine-tune the encoder too)
        freeze_encoder: bool = False,
    ):
        super().__init__()
        from transformers import AutoModel, AutoTokenizer

        settings = dict(pooling=pooling, truncation=truncation, dropout=dropout, max_length=max_length)
        for key, why in check_ranges(QNetwork, settings):  # the declarations above, built outside a config
            raise RagLabError(f"policy.{key}: {why}")
        path = resolve_model(encoder)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.encoder = AutoModel.from_pretrained(path)
        self.pooling = pooling
        self.max_length = max_length
        self.truncation = truncation
        self.frozen = freeze_encoder
        if freeze_encoder:
            self.encoder.requires_grad_(False).eval()
        width = self.encoder.config.hidden_size
        self.stop_head = head(width, head_hidden or width, dropout)
        self.cont_head = head(width, head_hidden or width, dropout)
        self._cache: dict[tuple[str, tuple[str, ...]], torch.Tensor] = {}
        # FSDP's transformer-based wrap shards each encoder layer on its own (accelerate reads this)
        self._no_split_modules = list(getattr(self.encoder, "_no_split_modules", None) or [])

    def inputs(self, question: str, passages: list[str]) -> list[int]:
        """Token ids of ``[CLS] question [SEP] d_1 [SEP] … [SEP] d_t [SEP]`` within ``max_length``."""
        tok = self.tokenizer
        cls = tok.cls_token_id if tok.cls_token_id is not None else tok.bos_token_id
        sep = tok.sep_token_id if tok.sep_token_id is not None else tok.eos_token_id
        q = tok(question, add_special_tokens=False).input_ids
        docs = [tok(p, add_special_tokens=False).input_ids for p in passages]
        if self.truncation == "per_passage" and docs:
            budget = max(1, (self.max_length - len(q) - len(docs) - 2) // len(docs))
            docs = [d[:budget] for d in docs]
        ids = [cls, *q]
        for d in docs:
            ids += [sep, *d]
        return ids[: self.max_length - 1] + [sep]

    def pool(self, batch: list[list[int]]) -> torch.Tensor:
        width = max(len(ids) for ids in batch)
        pad = self.tokenizer.pad_token_id or 0
        device = self.stop_head[1].weight.device
        input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids in batch], device=device)
        mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in batch], device=device)
        hidden = self.encoder(input_ids=input_ids, attention_mask=mask).last_hidden_state
        if self.pooling == "cls":
            return hidden[:, 0]
        m = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * m).sum(1) / m.sum(1).clamp(min=1)

    @torch.no_grad()
    def encode(self, states: list[tuple[str, list[str]]], batch_size: int = 64) -> torch.Tensor:
        """Pooled encodings of (question, passages) states under the frozen encoder, memoised."""
        keys = [(q, tuple(ps)) for q, ps in states]
        missing = list(dict.fromkeys(k for k in keys if k not in self._cache))
        for start in range(0, len(missing), batch_size):
            chunk = missing[start : start + batch_size]
            pooled = self.pool([self.inputs(q, list(ps)) for q, ps in chunk])
            self._cache.update(zip(chunk, pooled, strict=True))
        return torch.stack([self._cache[k] for k in keys]) if keys else torch.zeros(0)

    def clear_cache(self) -> None:
        """Forget the memoised encodings: an encoding differs in the last bit with the other states of
        its forward pass, so a memo carried from one stage into the next would make the next stage's
        numbers depend on what ran before it in this process (policy.py's module doc)."""
        self._cache.clear()

    def heads(self, pooled: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pooled = pooled.to(self.stop_head[1].weight.device)
        return self.stop_head(pooled)[:, 0], self.cont_head(pooled)[:, 0]

    def forward(
        self, states: list[tuple[str, list[str]]] | None = None, pooled: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(Q(s, STOP), Q(s, CONT)) per state, or per ``pooled`` encoding (the frozen encoder's, kept: a
        call through ``forward``, so that a sharded network gathers its heads first)."""
        if pooled is not None:
            return self.heads(pooled)
        if self.frozen:
            return self.heads(self.encode(states))
        return self.heads(self.pool([self.inputs(q, ps) for q, ps in states]))
