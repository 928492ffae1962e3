"""TRL's ``GRPOConfig`` as every GRPO trainer of rag_lab sets it up (DAPO's stages, APEX's planner): the
shared arguments (:mod:`rag_lab.train.trainer_args`: one optimiser update per generated batch, constant
learning rate, dropout off, checkpoints, device and precision), each method's own settings on top.

A step's batch (questions x group size, each process its share) is generated at once and trains one
optimiser update. :func:`passes` splits that update's forward and backward into micro-batches where the
batch does not fit in memory (TRL's gradient accumulation over one generated batch). Under the "dapo" loss
(DAPO's, and the planner's default), which divides by the generated batch's tokens, and under "grpo" and
"dr_grpo", whose passes are of equal size, the update is the one of a single pass up to float summation
order; "bnpo" averages the tokens of each pass, so its passes weigh tokens slightly differently.
"""

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rag_lab.core.errors import RagLabError
from rag_lab.train.trainer_args import trainer_args

if TYPE_CHECKING:
    from trl import GRPOConfig


def grpo_config(
    work: Path, device: str, seed: int, save_steps: int, bf16: bool | None = None, **method: Any
) -> "GRPOConfig":
    """``GRPOConfig`` checkpointing into ``work``, training on ``device``, seeded by ``seed``; ``method``:
    the method's own settings (batch, group, loss, clipping, KL, lengths, steps or epochs)."""
    from trl import GRPOConfig

    return GRPOConfig(**(trainer_args(work, device, seed, save_steps, bf16) | method))


def passes(per_process: int, micro_batch: int | None, key: str) -> dict[str, int]:
    """TRL's batch keys for one update over a process's ``per_process`` generated sequences in passes of
    ``micro_batch`` sequences (null, or more than there are: one pass); a one-line error naming ``key``
    where it does not divide them.

    >>> passes(32, 8, "policy.micro_batch")
    {'per_device_train_batch_size': 8, 'gradient_accumulation_steps': 4, 'steps_per_generation': 4}
    >>> passes(4, 8, "policy.micro_batch")["per_device_train_batch_size"]
    4
    """
    micro = min(micro_batch or per_process, per_process)
    if per_process % micro:
        raise RagLabError(
            f"{key}={micro} does not divide a process's batch of {per_process} sequences (questions per step "
            "x group size / processes)"
        )
    n = per_process // micro
    return dict(per_device_train_batch_size=micro, gradient_accumulation_steps=n, steps_per_generation=n)
