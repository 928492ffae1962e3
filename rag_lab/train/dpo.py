"""TRL's ``DPOConfig`` as rag_lab's DPO trainers set it up (EVO-RAG's policy epochs): the shared arguments
(:mod:`rag_lab.train.trainer_args`), each method's own settings on top. Overridden from TRL's defaults:
bf16 (TRL turns it on, which fails on a CPU) and gradient checkpointing (off, as for every trainer here);
``precompute_ref_log_probs`` stays off (it writes a datasets cache file, and with a LoRA adapter the
reference is the adapter switched off: no second model in memory).
"""

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rag_lab.train.trainer_args import trainer_args

if TYPE_CHECKING:
    from trl import DPOConfig


def dpo_config(
    work: Path, device: str, seed: int, save_steps: int, bf16: bool | None = None, **method: Any
) -> "DPOConfig":
    """``DPOConfig`` checkpointing into ``work``, training on ``device``, seeded by ``seed``; ``method``:
    the method's own settings (beta, learning rate, batch, accumulation, epochs, lengths)."""
    from trl import DPOConfig

    shared = trainer_args(work, device, seed, save_steps, bf16) | {"precompute_ref_log_probs": False}
    return DPOConfig(**(shared | method))
