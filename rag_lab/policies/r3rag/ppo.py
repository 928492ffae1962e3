"""R3-RAG's reinforcement learning: PPO with GAE, a value head and a KL penalty to the initial model
(arXiv:2505.23794 sec. 3.3, eqs. 5-7, and appendix B, eqs. 8-9; docs/methods/r3rag.md), data-parallel
under ``accelerate``.

One iteration:

1. **Rollouts** (:mod:`.samples`): ``batch_size`` training questions (a seeded draw per iteration), one
   episode each at every temperature of ``temperatures`` (the official code's four), documents cut to
   ``max_doc_chars``; each process rolls out its share of the questions.
2. **Rewards** (``reward=r3rag``, :class:`rag_lab.rewards.r3rag_judges.R3RAGReward`): one scalar per step;
   normalised over the global batch (``normalize_rewards``, the official code's choice).
3. **Old values and log-probs**: the policy's, the critic's and the initial model's, one no-grad pass.
4. **GAE** over each episode's steps (:mod:`.gae`; γ = λ = 1 the official code's; γ = 0 makes each step its
   own sample, A = r − V); advantages whitened over the global batch (``whiten_advantages``).
5. **Update**: ``ppo_epochs`` passes over the batch, each in ``minibatches`` optimizer steps (so the ratio
   leaves 1 and the clip can bind: the clip fraction is logged); loss = eq. 7's clipped surrogate
   + ``kl_coef`` · eq. 9's KL + ``vf_coef`` · the critic's loss (:mod:`.losses`); AdamW with the actor's and
   the critic's learning rates (paper 5e-7 / 9e-6); gradients clipped to ``max_grad_norm``.

Data parallel: each process holds its share of a minibatch and the losses are sums over its tokens (samples,
for the critic) divided by the global count, times the number of processes: DDP's gradient average is then
exactly the 1-process gradient of the same global batch. The same script runs on 1 process, N GPUs or N CPU
processes (gloo): ``accelerate launch --multi_gpu --num_processes N``.

Resume: a checkpoint (``checkpoint-<iteration>/``: the policy, value head, optimizer, log rows) after every
``save_steps`` iterations; a killed run restarts from the last good one. Every draw is seeded by (seed,
iteration), so it ends with the weights of an uninterrupted run.

The loop, its checkpoints and its log: :mod:`.trainer`; this module is the batch's math.

Hand-written, and why: TRL 1.16 has no PPO trainer (its GRPO has no critic and no per-step samples).
The policy trains in float32 (on a GPU too: bf16 weights would round the paper's 5e-7 steps away) and
computes without dropout, as RLHF implementations do, so the first ratio is exactly 1: in eval mode, or under
``launch.gradient_checkpointing`` in train mode with its trunks checkpointed and every dropout off
(:func:`checkpointed`; transformers checkpoints in train mode only).
Deviations, written down: the paper gives neither the number of PPO epochs nor the clip ε; ours are the
common 4 and 0.2 (the embedded default takes 2 epochs, for time).
"""

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Annotated

import torch

from rag_lab.core.batches import ppo_minibatches, processes_of
from rag_lab.core.config import (
    NonNegative,
    NonNegativeInt,
    OneOf,
    Positive,
    PositiveInt,
    Probability,
    Range,
    check_ranges,
)
from rag_lab.core.errors import RagLabError
from rag_lab.policies.r3rag.gae import gae
from rag_lab.policies.r3rag.losses import kl_to_initial, policy_loss, value_loss
from rag_lab.policies.r3rag.model import CRITICS, ActorCritic, no_dropout, token_logprobs
from rag_lab.train.sharded import reshard, sharded, zero3

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PPOSettings:
    """``policy.ppo`` (module docstring). The defaults are the embedded default's; the paper's are in
    ``conf/experiment/r3rag_hotpotqa.yaml``."""

    iterations: NonNegativeInt = 8
    # questions per iteration (global), one episode each at every temperature
    batch_size: PositiveInt = 16
    temperatures: tuple[NonNegative, ...] = (0.1, 0.4, 0.7, 1.0)
    ppo_epochs: PositiveInt = 2
    minibatches: PositiveInt = 4
    # samples per forward pass (gradients accumulate over a minibatch)
    micro_batch: PositiveInt = 32
    # the ratio's clip ε and the value clip (null: none)
    clip: Annotated[float, Range(0, 1, open_min=True, open_max=True)] = 0.2
    value_clip: Positive | None = 0.2
    kl_coef: NonNegative = 0.01
    # GAE's discount γ and λ
    gamma: Probability = 1.0
    lam: Probability = 1.0
    vf_coef: NonNegative = 0.5
    actor_lr: Positive = 1e-4
    critic_lr: Positive = 1e-3
    max_grad_norm: Positive = 1.0
    normalize_rewards: bool = True
    whiten_advantages: bool = True
    # the value head on the policy's trunk (shared) or on a copy of the initial model (separate)
    critic: Annotated[str, OneOf(*CRITICS)] = "shared"
    max_doc_chars: PositiveInt | None = 512
    save_steps: PositiveInt = 1

    def __post_init__(self):
        object.__setattr__(self, "temperatures", tuple(self.temperatures))
        for key, why in [*check_ranges(PPOSettings, asdict(self)), *self.check_settings(asdict(self), None)]:
            raise RagLabError(f"policy.ppo.{key}: {why}")

    @staticmethod
    def check_settings(s: dict, run) -> list[tuple[str, str]]:
        """What the declarations cannot say (:mod:`rag_lab.core.config`): a temperature at least, and a sample
        in every PPO minibatch of each process (:mod:`rag_lab.core.batches`)."""
        if not list(s["temperatures"]):
            return [("temperatures", "[]: one temperature or more (an episode each)")]
        return ppo_minibatches(s, processes_of(run))


def make_accelerator():
    """accelerate's ``Accelerator``, on the CPU where no GPU is (gloo between CPU processes)."""
    from accelerate import Accelerator

    return Accelerator(cpu=not torch.cuda.is_available())


def build(lm, settings: PPOSettings, accelerator):
    """(the actor-critic prepared for data parallel, the frozen initial model, the prepared optimizer)."""
    deepspeed = accelerator.state.deepspeed_plugin
    if deepspeed is not None:  # no data loader to read it from: DeepSpeed's micro-batch is PPO's forward pass
        deepspeed.deepspeed_config.update(
            train_micro_batch_size_per_gpu=settings.micro_batch,
            gradient_accumulation_steps=1,  # PPO accumulates its micro-batches itself (update)
            train_batch_size=settings.micro_batch * accelerator.num_processes,
        )
    # sharded before the critic's copy is made: at most two whole copies of the LM at once
    reference = initial_model(lm, accelerator)
    model = checkpointed(ActorCritic(lm, settings.critic))
    optimizer = torch.optim.AdamW(
        [
            {"params": model.actor_parameters(), "lr": settings.actor_lr},
            {"params": model.critic_parameters(), "lr": settings.critic_lr},
        ]
    )
    model, optimizer = accelerator.prepare(model, optimizer)
    return model, reference, optimizer


def checkpointed(model: ActorCritic) -> ActorCritic:
    """The actor-critic in eval mode (no dropout: the first ratio is exactly 1); or, where the launch asks for
    gradient checkpointing (``launch.gradient_checkpointing``: a 7B actor-critic's activations do not fit a
    GPU otherwise, ``python -m rag_lab.plan``), in train mode with its trunks checkpointed and every dropout
    off (:func:`rag_lab.policies.r3rag.model.no_dropout`), which computes the same as eval mode."""
    from rag_lab.train.parallel import gradient_checkpointing

    keys = gradient_checkpointing()
    if not keys["gradient_checkpointing"]:
        return model.eval()
    model.gradient_checkpointing_enable(keys["gradient_checkpointing_kwargs"])
    return no_dropout(model).train()


def initial_model(lm, accelerator):
    """The frozen initial model of eq. 9's KL, a copy of ``lm``; under FSDP or ZeRO-3 sharded like the policy
    (no process holds it whole): FSDP2 through accelerate's own preparation (each layer its own unit, and
    where the launch loads RAM-efficiently rank 0's weights broadcast to the others), ZeRO-3 through TRL's
    ``prepare_deepspeed`` (what TRL's trainers do with their reference models). Its forward is then a
    collective, which :func:`score` makes in every process alike. R3-RAG trains every weight (no LoRA
    setting), so the initial model is a copy, not the policy with its adapter disabled."""
    import copy

    from accelerate.utils import DistributedType

    reference = copy.deepcopy(lm).eval().requires_grad_(False)
    if accelerator.distributed_type == DistributedType.FSDP:
        return accelerator.prepare(reference).eval()
    if zero3(accelerator):
        from trl.models.utils import prepare_deepspeed

        return prepare_deepspeed(reference, accelerator)
    return reference


@torch.no_grad()
def score(model, reference, batch: dict, micro: int, accelerator=None) -> dict:
    """``old_logprobs`` / ``init_logprobs`` [N, L-1] and ``old_values`` [N], added to ``batch`` (forward
    passes over rows of like length; as many in every process when the model is sharded: :func:`passes`)."""
    n, width = batch["input_ids"].shape
    device = batch["input_ids"].device
    lengths = batch["attention_mask"].sum(1)
    old, init = torch.zeros(n, width - 1, device=device), torch.zeros(n, width - 1, device=device)
    values = torch.zeros(n, device=device)
    groups = list(torch.argsort(lengths, descending=True, stable=True).split(micro))
    for q in range(passes(len(groups), accelerator)):
        rows = groups[min(q, len(groups) - 1)]  # past its own: a pass that keeps nothing (sharded models)
        w = int(lengths[rows].max())
        ids, attention = batch["input_ids"][rows, :w], batch["attention_mask"][rows, :w]
        logprobs, value = model(ids, attention, batch["value_at"][rows])
        logits = reference(input_ids=ids, attention_mask=attention).logits  # sharded too: every pass
        if q < len(groups):
            old[rows, : w - 1], values[rows] = logprobs, value
            init[rows, : w - 1] = token_logprobs(logits, ids)
    reshard(reference)  # no backward follows: its last unit's gathered weights let go
    return batch | {"old_logprobs": old, "init_logprobs": init, "old_values": values}


def passes(count: int, accelerator) -> int:
    """How many forward passes this process makes where it has ``count`` of them: its own count, or under
    FSDP / ZeRO-3 the largest over the processes (a sharded forward gathers each layer from every process,
    so a process that stopped early would leave the others waiting; its extra passes weigh 0)."""
    if accelerator is None or accelerator.num_processes == 1 or not sharded(accelerator):
        return count
    counts = accelerator.gather(torch.tensor([count], device=accelerator.device))
    return int(counts.max())


def global_stats(values: Sequence[float], accelerator) -> tuple[float, float]:
    """(mean, standard deviation) of ``values`` over every process (1.0 as the deviation of fewer than 2)."""
    values = [float(v) for v in values]
    if accelerator.num_processes > 1:
        from accelerate.utils import gather_object

        values = [v for part in gather_object([values]) for v in part]
    flat = torch.tensor(values, dtype=torch.float64)
    if flat.numel() < 2:
        return (flat.mean().item() if flat.numel() else 0.0), 1.0
    return flat.mean().item(), flat.std(unbiased=False).item()


def global_sum(value: float, accelerator) -> float:
    """``value`` summed over every process."""
    if accelerator.num_processes == 1:
        return float(value)
    return accelerator.reduce(
        torch.tensor(float(value), dtype=torch.float64, device=accelerator.device), "sum"
    ).item()


def advantages(
    samples: Sequence, rewards: Sequence[Sequence[float]], batch: dict, settings: PPOSettings, accelerator
) -> dict:
    """``advantages`` and ``returns`` [N] of the samples, added to ``batch`` (GAE over each episode's steps;
    a step without a sample, whose prompt did not fit, has value 0)."""
    width = max(len(r) for r in rewards)
    r, v, m = (torch.zeros(len(rewards), width, dtype=torch.float64) for _ in range(3))
    mean, std = (
        global_stats([x for ep in rewards for x in ep], accelerator) if settings.normalize_rewards else (0, 1)
    )
    for i, ep in enumerate(rewards):
        r[i, : len(ep)] = (torch.tensor(ep, dtype=torch.float64) - mean) / (std + 1e-8)
        m[i, : len(ep)] = 1
    episode = torch.tensor([s.episode for s in samples])
    step = torch.tensor([s.step for s in samples])
    v[episode, step] = batch["old_values"].double().cpu()
    a, ret = gae(r, v, m, settings.gamma, settings.lam)
    adv, ret = a[episode, step], ret[episode, step]
    if settings.whiten_advantages:
        mean, std = global_stats(adv.tolist(), accelerator)
        adv = (adv - mean) / (std + 1e-8)
    device = batch["old_values"].device
    return batch | {"advantages": adv.float().to(device), "returns": ret.float().to(device)}


def minibatch_loss(
    model, batch: dict, rows: torch.Tensor, totals: tuple[float, float], settings, scale: float
):
    """The loss of ``rows`` as a share of the global minibatch (module docstring) and its sums for the log."""
    tokens, count = totals
    width = int(batch["attention_mask"][rows].sum(1).max())
    ids, attention = batch["input_ids"][rows, :width], batch["attention_mask"][rows, :width]
    mask = batch["mask"][rows, : width - 1]
    logprobs, values = model(ids, attention, batch["value_at"][rows])
    old, init = batch["old_logprobs"][rows, : width - 1], batch["init_logprobs"][rows, : width - 1]
    adv = batch["advantages"][rows, None].expand_as(logprobs)
    pg, clipped = policy_loss(logprobs, old, adv, mask, settings.clip)
    kl = kl_to_initial(logprobs, init, mask)
    one = torch.ones(len(rows), 1, device=values.device)
    old_v, ret = batch["old_values"][rows, None], batch["returns"][rows, None]
    vl = value_loss(values[:, None], old_v, ret, one, settings.value_clip)
    n_tokens, n = mask.sum(), len(rows)
    loss = (pg + settings.kl_coef * kl) * n_tokens / max(tokens, 1) + settings.vf_coef * vl * n / max(
        count, 1
    )
    ratio = masked_sum(torch.exp(logprobs - old).detach(), mask)
    sums = {"pg": pg.item() * n_tokens.item(), "kl": kl.item() * n_tokens.item(), "vl": vl.item() * n}
    sums |= {"clipped": clipped.item() * n_tokens.item(), "ratio": ratio, "tokens": n_tokens.item(), "n": n}
    return loss * scale, sums


def masked_sum(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float((x * mask).sum())


def check_samples(n: int, accelerator) -> None:
    """Every process has a sample to train on, or every process raises the same one line, together (a
    collective): a process that raised alone would leave the others waiting in the next collective until
    the process group's timeout."""
    empty = global_sum(float(n == 0), accelerator)
    if empty:
        raise RagLabError(
            f"r3rag PPO: {int(empty)} of {accelerator.num_processes} process(es) have no sample (every"
            " prompt was too long for the model)"
        )


def update(model, optimizer, batch: dict, settings: PPOSettings, accelerator, seed: int) -> dict:
    """``ppo_epochs`` passes of ``minibatches`` optimizer steps over the local batch; the global means of the
    policy loss, KL, value loss, clip fraction and ratio over every pass."""
    from contextlib import nullcontext

    n = len(batch["value_at"])
    check_samples(n, accelerator)
    draw, world = torch.Generator().manual_seed(seed), accelerator.num_processes
    lengths = batch["attention_mask"].sum(1).cpu()
    sums: dict[str, float] = {}
    for _ in range(settings.ppo_epochs):
        order = torch.randperm(n, generator=draw)
        for m in range(settings.minibatches):
            rows = order[m * n // settings.minibatches : (m + 1) * n // settings.minibatches]
            totals = (
                global_sum(float(batch["mask"][rows].sum()), accelerator),
                global_sum(len(rows), accelerator),
            )
            # forward passes over rows of like length (little padding); a process with no row in this
            # minibatch still takes part in the gradient sync, with weight 0
            rows = rows[torch.argsort(lengths[rows], descending=True, stable=True)]
            pieces = list(rows.split(settings.micro_batch)) if len(rows) else []
            weights = [1.0] * len(pieces)
            extra = passes(max(len(pieces), 1), accelerator) - len(pieces)
            pieces, weights = pieces + [pieces[0] if pieces else order[:1]] * extra, weights + [0.0] * extra
            optimizer.zero_grad()
            for q, (piece, weight) in enumerate(zip(pieces, weights, strict=True)):
                with accelerator.no_sync(model) if q < len(pieces) - 1 else nullcontext():
                    loss, part = minibatch_loss(model, batch, piece, totals, settings, world * weight)
                    accelerator.backward(loss)
                for key, value in part.items():
                    sums[key] = sums.get(key, 0.0) + value * weight
            accelerator.clip_grad_norm_(model.parameters(), settings.max_grad_norm)
            optimizer.step()
    sums = {k: global_sum(v, accelerator) for k, v in sums.items()}
    tokens, count = max(sums["tokens"], 1), max(sums["n"], 1)
    return {
        "loss/policy": sums["pg"] / tokens,
        "kl": sums["kl"] / tokens,
        "loss/value": sums["vl"] / count,
        "clip_fraction": sums["clipped"] / tokens,
        "ratio": sums["ratio"] / tokens,
    }
