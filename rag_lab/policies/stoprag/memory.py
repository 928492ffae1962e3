"""Stop-RAG's memory plan (:mod:`rag_lab.train.memory`; :func:`plan` is :attr:`~.policy.StopRAG.memory_plan`):
one step of its Q-network's training (:mod:`.trainer`) on fake weights, with its own heads.

The encoder and its two heads (:func:`~.qnet.head`) prepared by accelerate; the no-gradient pass over every
state of the batch's trajectories (the Q(λ) targets' bootstrap), then the batch's states with gradient under
bf16 autocast, backward, AdamW (weight decay; ``torch.optim.AdamW`` with torch's defaults on a GPU,
``foreach``).
"""

from dataclasses import dataclass

import torch
from torch import nn

from rag_lab.policies.stoprag.qnet import head
from rag_lab.train.memory import fake
from rag_lab.train.memory.context import Context
from rag_lab.train.memory.ledger import Phase
from rag_lab.train.memory.measure import tracking
from rag_lab.train.memory.phases import Bench, Rollout, ready_optimizer, save_phase, tokens, update_phase


class QNet(nn.Module):
    """The modules of Stop-RAG's :class:`~rag_lab.policies.stoprag.qnet.QNetwork` (which loads its encoder's
    weights and tokenizer itself): the encoder, its first token pooled, the two heads."""

    def __init__(self, encoder: nn.Module, head_hidden: int | None, dropout: float = 0.1):
        super().__init__()
        self.encoder, width = encoder, encoder.config.hidden_size
        self.stop_head = head(width, head_hidden or width, dropout)
        self.cont_head = head(width, head_hidden or width, dropout)
        self._no_split_modules = list(getattr(encoder, "_no_split_modules", None) or [])

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pooled = self.encoder(input_ids=input_ids).last_hidden_state[:, 0]
        return self.stop_head(pooled)[:, 0], self.cont_head(pooled)[:, 0]


@dataclass(frozen=True)
class QShapes:
    """States a process trains on in a step (its share of ``batch_size``), each with ``bootstrap`` states of
    its trajectory scored without gradient; tokens a state."""

    states: int
    bootstrap: int
    length: int
    head_hidden: int | None = 4096
    frozen_encoder: bool = False


def qnet(bench: Bench, config, s: QShapes, rollout: Rollout, name: str = "Q-network") -> list[Phase]:
    encoder = fake.encoder(config, torch.float32)
    encoder.requires_grad_(not s.frozen_encoder).train(not s.frozen_encoder)
    with fake.on_meta():
        model = QNet(encoder, s.head_hidden).train()
    model = fake.prepare(model, bench.mesh, bench.mixed_precision)
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], weight_decay=0.01, foreach=True
    )
    ready_optimizer(optimizer)
    vocab = config.vocab_size
    with tracking(model, optimizer) as phase:
        phase.begin()
        with torch.no_grad():
            phase.forward()
            model(tokens(s.states * s.bootstrap, s.length, vocab))
        phase.forward()
        with torch.autocast(fake.DEVICE.type, dtype=torch.bfloat16, enabled=bench.mixed_precision != "no"):
            stop, cont = model(tokens(s.states, s.length, vocab))
        (stop.float() ** 2 + cont.float() ** 2).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        update = update_phase(phase, name, rollout, {}, {})
        return [update, save_phase(phase, name, model, rollout, {}, {})]


def plan(ctx: Context, s: dict) -> list[Phase]:
    """The Q-network trains beside the run's generator, a black box (vLLM's engine at its
    ``gpu_memory_utilization``, or the HF model), which the offline rollouts generated with."""
    states = ctx.share(s["batch_size"], "policy.batch_size")
    bootstrap = s["iterations"] - 1 if s.get("target", "qlambda") in ("qlambda", "q0") else 0
    config = ctx.architecture(s["encoder"], "policy.encoder")
    shapes = QShapes(
        states, max(bootstrap, 1), s["max_length"], s.get("head_hidden"), s.get("freeze_encoder", False)
    )
    rollout = ctx.black_box()
    return [Phase("offline rollouts", "rollout", rollout.outside("rollout"), list(rollout.notes))] + qnet(
        ctx.bench, config, shapes, rollout, "Stop-RAG (Q-network)"
    )
