"""The supervised fine-tuning rows and TRL settings that every SFT stage of rag_lab uses (the tiny LM's
stage 2, the cold start).

Hand-written, and why: ``sft_dataset`` tokenizes prompt and completion apart and joins them as ids,
an EOS after the completion, the prompt cut from the LEFT to fit ``max_length`` (TRL 1.16 only
truncates with ``keep_start``, which would cut the completion). TRL gets ``input_ids`` +
``completion_mask``, so it adds no second EOS and no BOS, and builds the labels (-100 on the prompt)
from our mask. The ids are exactly what the model sees at inference: a prompt tokenized alone, then
the generated tokens.
"""

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rag_lab.errors import RagLabError

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase
    from trl import SFTConfig

log = logging.getLogger(__name__)


def sft_dataset(
    pairs: Sequence[tuple[str, str]], tokenizer: "PreTrainedTokenizerBase", max_length: int
) -> "Dataset":
    """``input_ids`` (prompt ids + completion ids + EOS) and ``completion_mask`` (1 on the completion
    and its EOS), each at most ``max_length``: a long prompt loses its start, the completion stays."""
    from datasets import Dataset

    eos = tokenizer.eos_token_id
    prompts = tokenizer([p for p, _ in pairs], add_special_tokens=False).input_ids
    completions = tokenizer([c for _, c in pairs], add_special_tokens=False).input_ids
    rows: dict[str, list[list[int]]] = {"input_ids": [], "completion_mask": []}
    cut = 0
    for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
        if not completion or completion[-1] != eos:
            completion = completion + [eos]
        if len(completion) >= max_length:
            raise RagLabError(f"SFT: completion {i} has {len(completion)} tokens, max_length is {max_length}")
        keep = max_length - len(completion)
        cut += len(prompt) > keep
        prompt = prompt[max(len(prompt) - keep, 0) :]
        rows["input_ids"].append(prompt + completion)
        rows["completion_mask"].append([0] * len(prompt) + [1] * len(completion))
    if cut:
        log.warning(
            "SFT: %d of %d prompts lost their start to fit max_length=%d", cut, len(pairs), max_length
        )
    return Dataset.from_dict(rows)


def sft_config(
    output_dir: Path, steps: int, batch_size: int, lr: float, warmup_steps: int, seed: int, **settings
) -> "SFTConfig":
    """TRL's ``SFTConfig`` as rag_lab's SFT stages use it (the tiny LM's and the cold start's): cosine
    schedule, batches grouped by length, no reporting, seeded, no dataloader workers; ``settings``
    adds or overrides the rest (``completion_only_loss``, ``max_length``, saving, ``bf16``)."""
    from trl import SFTConfig

    shared = dict(
        output_dir=str(output_dir),
        # TRL's defaults: bf16 fails at init on CPU; gradient checkpointing only slows a small model.
        bf16=False,
        gradient_checkpointing=False,
        max_steps=steps,
        per_device_train_batch_size=batch_size,
        learning_rate=lr,
        lr_scheduler_type="cosine",
        warmup_steps=warmup_steps,
        # Batches of similar length (random otherwise) pad less; the demonstrations vary in length.
        train_sampling_strategy="group_by_length",
        report_to=[],
        seed=seed,
        data_seed=seed,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
    )
    return SFTConfig(**(shared | settings))
