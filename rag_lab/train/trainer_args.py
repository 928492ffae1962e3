"""The ``transformers`` / TRL training arguments every RL trainer of rag_lab shares (DAPO's and APEX's
GRPO, EVO-RAG's DPO): what must stay the same across methods in one place, each method's own settings on
top (:func:`rag_lab.train.grpo.grpo_config`, :func:`rag_lab.train.dpo.dpo_config`).

Shared: no gradient accumulation unless the method asks, a constant learning rate without warm-up,
dropout off (the log-probs of sampling and of the update then agree), a log row every step, a checkpoint
every ``save_steps`` (the newest two kept: a kill while one is written leaves the one before), no reporting
(the curves go through :mod:`rag_lab.train.curves`), no gradient checkpointing (it only slows a small
model). The device is the generator's (:func:`rag_lab.generators.hf.default_device`: a small model trains
on the CPU even beside a GPU), and bf16 mixed precision is used where that device is a GPU that has it,
unless ``bf16`` says otherwise.
"""

from pathlib import Path
from typing import Any

import torch

from rag_lab.train.parallel import gradient_checkpointing
from rag_lab.train.sharded import accelerator_config


def trainer_args(
    work: Path, device: str, seed: int, save_steps: int, bf16: bool | None = None
) -> dict[str, Any]:
    """The shared arguments, checkpointing into ``work``, training on ``device``, seeded by ``seed``."""
    cuda = str(device).startswith("cuda")
    return dict(
        output_dir=str(work),
        seed=seed,
        data_seed=seed,
        gradient_accumulation_steps=1,
        lr_scheduler_type="constant",
        warmup_steps=0,
        disable_dropout=True,
        logging_steps=1,
        save_strategy="steps",
        save_steps=save_steps,
        save_total_limit=2,
        bf16=(cuda and torch.cuda.is_bf16_supported()) if bf16 is None else bf16,
        use_cpu=not cuda,
        report_to="none",
        accelerator_config=accelerator_config(),
        **gradient_checkpointing(),
    )
