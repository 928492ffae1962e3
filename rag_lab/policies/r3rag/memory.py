"""R3-RAG's memory plan (:mod:`rag_lab.train.memory`; :func:`plan` is :attr:`~.policy.R3RAG.memory_plan`): one
step of its PPO on fake weights, with its own modules and losses.

The actor-critic (:class:`~.model.ActorCritic`: the policy and a value head, ``critic: separate`` a second
trunk), prepared by accelerate as one FSDP2 model, the trained weights in float32; the frozen initial model
prepared by accelerate as well (sharded like the policy); the score pass of one micro-batch without gradient
(the initial model's log-probabilities, then the actor-critic's and its values), then one micro-batch of the
update (eq. 7's surrogate, eq. 9's KL, the value loss: :mod:`.losses`), backward, clipping, AdamW over both
(``torch.optim.AdamW`` with torch's defaults on a GPU, ``foreach``). Its trunks checkpoint under
``launch.gradient_checkpointing`` (:data:`PPO_CHECKPOINTS`).
"""

import copy
import math
from dataclasses import dataclass

import torch
from torch import nn

from rag_lab.policies.r3rag.losses import kl_to_initial, policy_loss, value_loss
from rag_lab.policies.r3rag.model import ActorCritic, token_logprobs
from rag_lab.train.memory import fake
from rag_lab.train.memory.context import Context
from rag_lab.train.memory.ledger import Phase
from rag_lab.train.memory.measure import tracking
from rag_lab.train.memory.methods import CHARS_PER_TOKEN, cold_start, multi_turn
from rag_lab.train.memory.phases import (
    Bench,
    Rollout,
    beside,
    ready_optimizer,
    reference_phase,
    rollout_phase,
    save_phase,
    shard_bytes,
    tokens,
    update_phase,
)

# R3-RAG's PPO checkpoints both trunks under launch.gradient_checkpointing, in train mode, every dropout off
# (rag_lab.policies.r3rag.ppo.checkpointed)
PPO_CHECKPOINTS = True


@dataclass(frozen=True)
class PPOShapes:
    """Samples a forward pass (``ppo.micro_batch``) and a sample's tokens; the loss's settings."""

    micro: int
    length: int
    critic: str = "shared"
    clip: float = 0.2
    value_clip: float | None = 0.2
    kl_coef: float = 0.01
    vf_coef: float = 0.5


def ppo(bench: Bench, config, s: PPOShapes, rollout: Rollout, name: str = "PPO") -> list[Phase]:
    checkpoints = bench.checkpointing and PPO_CHECKPOINTS
    lm = fake.causal_lm(config, bench.dtype, trains=True, checkpointing=checkpoints)
    # the initial model copied from the policy (ppo.initial_model), then the actor-critic
    with fake.on_meta():
        reference = copy.deepcopy(lm).requires_grad_(False).eval()
        model = ActorCritic(lm, s.critic).train(checkpoints)
    reference = initial_model(reference, bench)
    model = fake.prepare(model, bench.mesh, bench.mixed_precision)
    groups = [{"params": model.actor_parameters()}, {"params": model.critic_parameters()}]
    optimizer = torch.optim.AdamW(groups, lr=1e-6, foreach=True)
    ready_optimizer(optimizer)
    roles = shard_bytes(critic=model.critic_lm, **{"value head": model.head})
    frozen = shard_bytes(reference=reference)
    ids, at = tokens(s.micro, s.length, config.vocab_size), torch.full((s.micro,), s.length - 1)
    # the score pass: the initial model's log-probs, then the actor-critic's old log-probs and values
    initial = lambda: token_logprobs(reference(input_ids=ids).logits, ids)  # noqa: E731
    phases = [reference_phase(name, reference, initial, beside(model, optimizer, roles), rollout)]
    with tracking(model, optimizer) as phase:
        phases.insert(
            0, rollout_phase(phase, name, model, rollout, roles, frozen, generate=_generate_unsharded)
        )
        phase.begin()
        with torch.no_grad():
            phase.forward()
            model(ids, None, at)
        phases.append(Phase(name, "score", phase.lines(roles, rollout.outside("score") | frozen)))
        phase.begin()
        phase.forward()
        logprobs, values = model(ids, None, at)
        old, mask = torch.zeros_like(logprobs), torch.ones_like(logprobs)
        pg, _ = policy_loss(logprobs, old, old + 1, mask, s.clip)
        one = torch.ones(s.micro, 1)
        vl = value_loss(values[:, None], one, one, one, s.value_clip)
        (pg + s.kl_coef * kl_to_initial(logprobs, old, mask) + s.vf_coef * vl).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        phases.append(update_phase(phase, name, rollout, roles, frozen))
        return phases + [save_phase(phase, name, model, rollout, roles, frozen)]


def initial_model(reference: nn.Module, bench: Bench) -> nn.Module:
    """PPO's frozen initial model as R3-RAG prepares it under FSDP: through accelerate, sharded like the
    policy."""
    return fake.prepare(reference, bench.mesh, bench.mixed_precision)


def _generate_unsharded(model, rows: int, length: int) -> None:
    """HF generate's prefill on the actor-critic's policy, through the actor-critic's own forward (its FSDP
    hooks gather the weights the root unit holds: embeddings, heads), as R3-RAG generates under FSDP."""
    model(input_ids=tokens(rows, length, model.lm.config.vocab_size), use_cache=True, logits_to_keep=1)


def plan(ctx: Context, s: dict) -> list[Phase]:
    """R3-RAG's PPO: ``ppo.micro_batch`` samples a pass, a sample a step with its history (documents cut to
    ``max_doc_chars``), after its cold start where it has one."""
    p = s["ppo"]
    doc = ctx.memory.passage_tokens
    if p.get("max_doc_chars"):
        doc = min(doc, math.ceil(p["max_doc_chars"] / CHARS_PER_TOKEN))
    length = multi_turn(ctx, s["max_turns"], s["max_new_tokens"], s["k"], doc)
    shapes = PPOShapes(
        p["micro_batch"], length, p["critic"], p["clip"], p["value_clip"], p["kl_coef"], p["vf_coef"]
    )
    episodes = ctx.share(p["batch_size"], "policy.ppo.batch_size") * len(p["temperatures"])
    rollout = ctx.rollout(episodes, length)
    return cold_start(ctx, s.get("cold_start")) + ppo(ctx.bench, ctx.model, shapes, rollout, "R3-RAG (PPO)")
