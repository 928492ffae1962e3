"""TRL's ``GRPOConfig`` as every GRPO trainer of rag_lab sets it up (DAPO's stages, APEX's planner): the
shared arguments (:mod:`rag_lab.train.trainer_args`: one optimiser update per generated batch, constant
learning rate, dropout off, checkpoints, device and precision), each method's own settings on top.
"""

from pathlib import Path
from typing import TYPE_CHECKING, Any

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
