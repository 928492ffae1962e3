"""What every trainer's plan shares: the bench it runs on, its rollout phase and its save phase.

- **rollout**: the trained model resident between updates (its shards and the optimizer's state; no gradients:
  they are set to None after each step), with, by the run's generator: a colocated vLLM engine awake (its
  reservation, ``generator.train_memory`` of the GPU) and TRL's weight sync into it (each weight gathered
  whole, one at a time); or HF generate on the sharded model itself (one generate call's prefill: every layer
  gathered in turn, the KV cache of the call's rows); plus the encoders' forward (retrieval, rewards).
- **save**: the model gathered once on rank 0 with CPU offload (torch's full state dict, one weight at a time
  whole on the GPU, then copied out); checkpoints for resume are sharded (torch's distributed checkpoint), so
  nothing else is gathered.

The engine outside its rollouts: asleep (``generator.sleep``: vLLM's level-2 sleep, its weights and KV cache
given back; TRL's ``vllm_enable_sleep_mode``) or holding its reservation.
"""

from dataclasses import dataclass, field

import torch
from torch import nn

from rag_lab.train.memory.fake import DEVICE, module_bytes
from rag_lab.train.memory.ledger import Phase
from rag_lab.train.memory.measure import tracking


@dataclass(frozen=True)
class Bench:
    """The launch a plan runs under: its mesh, mixed precision, gradient checkpointing (TRL's trainers), and
    the dtype the weights load in (bf16 on a GPU: ``generator.dtype: auto``)."""

    mesh: object
    mixed_precision: str = "bf16"
    checkpointing: bool = True
    dtype: torch.dtype = torch.bfloat16


@dataclass
class Rollout:
    """How a trainer's rollouts use this GPU (module docstring); bytes."""

    # a colocated engine's reservation while awake (0: none on this GPU)
    engine: int = 0
    # the engine sleeps outside its rollouts
    asleep: bool = False
    # HF generate on the sharded policy: rows of one generate call (0: vLLM, or no rollouts)
    hf_rows: int = 0
    # TRL syncs the trained weights into a vLLM engine (colocated or a server) before the rollouts
    syncs: bool = False
    # the longest sequence a rollout holds (prompt and completion)
    length: int = 0
    # encoders resident on this GPU (retriever, rewards), and their forward's peak during rollouts
    encoders: int = 0
    encoding: int = 0
    notes: list[str] = field(default_factory=list)

    def outside(self, phase: str) -> dict[str, int]:
        """The lines this GPU holds outside the trained model in ``phase``."""
        awake = phase == "rollout" or not self.asleep
        engine = self.engine if awake else 0
        return {
            "generation engine": engine,
            "retriever / encoders": self.encoders + (self.encoding if phase == "rollout" else 0),
        }


def tokens(rows: int, length: int, vocab: int) -> torch.Tensor:
    """A batch of token ids (fake: only its shape counts)."""
    return torch.randint(0, vocab, (rows, length), device=DEVICE)


def ready_optimizer(optimizer: torch.optim.Optimizer) -> None:
    """The optimizer's state made (it is made at the first step), so that the tracked step is a later one, as
    torchtitan's estimator measures its second iteration; the gradients set to None after."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def gather_each(model: nn.Module) -> None:
    """Every weight of ``model`` gathered whole, one at a time, and let go (TRL's FSDP2 sync into vLLM;
    torch's full state dict with CPU offload)."""
    from torch.distributed.tensor import DTensor

    for p in model.parameters():
        if isinstance(p, DTensor):
            whole = p.full_tensor()
            del whole


def rollout_phase(
    phase, trainer: str, root: nn.Module, rollout: Rollout, roles: dict, frozen: dict, generate=None
) -> Phase:
    """The rollout phase (module docstring) on ``phase`` (the trainer's tracker); ``roles``: bytes of
    ``root``'s shards that are not the policy's; ``frozen``: lines of sharded models outside the root (a
    reference); ``generate(root, rows, length)``: HF generate's prefill where the policy is not ``root``
    itself."""
    phase.begin()
    if rollout.hf_rows:  # generate's longest call, its prefill in eval mode filling the KV cache
        was = root.training
        root.eval()
        with torch.no_grad():
            phase.forward()
            (generate or _prefill)(root, rollout.hf_rows, rollout.length)
        root.train(was)
    elif rollout.syncs:
        gather_each(root)
    lines = phase.lines(roles, rollout.outside("rollout") | frozen, passes=bool(rollout.hf_rows))
    return Phase(trainer, "rollout", lines, list(rollout.notes))


def _prefill(model: nn.Module, rows: int, length: int) -> None:
    model(input_ids=tokens(rows, length, model.config.vocab_size), use_cache=True, logits_to_keep=1)


def update_phase(phase, trainer: str, rollout: Rollout, roles: dict, frozen: dict) -> Phase:
    """The update phase's ledger, read after its step ran on ``phase``."""
    return Phase(
        trainer, "update", phase.lines(roles, rollout.outside("update") | frozen), asleep_note(rollout)
    )


def save_phase(phase, trainer: str, root: nn.Module, rollout: Rollout, roles: dict, frozen: dict) -> Phase:
    """The final model gathered on rank 0 with CPU offload (module docstring)."""
    phase.begin()
    gather_each(root)
    return Phase(
        trainer,
        "save",
        phase.lines(roles, rollout.outside("save") | frozen, passes=False),
        asleep_note(rollout),
    )


def reference_phase(trainer: str, reference: nn.Module, run, beside: dict, rollout: Rollout) -> Phase:
    """A frozen reference's pass without gradient (``run()``), under a tracker of its own (its gathers are
    then its temporaries); ``beside``: the trained model's lines (its shards, optimizer state), held
    meanwhile."""
    with tracking(reference) as phase, torch.no_grad():
        phase.begin()
        phase.forward()
        run()
        own = phase.lines(passes=False)
    lines = {"reference": own.pop("policy shards", 0), **own}
    for line, size in (rollout.outside("score") | beside).items():
        if size:
            lines[line] = lines.get(line, 0) + size
    return Phase(trainer, "reference pass", lines, asleep_note(rollout))


def beside(model: nn.Module, optimizer, roles: dict) -> dict:
    """The trained model's lines while another model runs: its shards (less ``roles``' bytes, on their own
    lines) and its optimizer's state."""
    return {
        "policy shards": module_bytes(model) - sum(roles.values()),
        **roles,
        "optimizer state": optimizer_bytes(optimizer),
    }


def optimizer_bytes(optimizer) -> int:
    """The bytes of ``optimizer``'s state on this rank."""
    from rag_lab.train.memory.fake import held_bytes

    return held_bytes(t for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t))


def asleep_note(rollout: Rollout) -> list[str]:
    if rollout.engine and rollout.asleep:
        return ["the engine asleep (level 2: weights and KV cache released)"]
    return []


def shard_bytes(**modules: nn.Module | None) -> dict[str, int]:
    """Each named module's bytes on this rank (its shards when sharded)."""
    return {name: module_bytes(m) for name, m in modules.items() if m is not None}
