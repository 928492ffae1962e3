"""Supervised fine-tuning as rag_lab's SFT stages do it (the tiny LM's stage 2, the cold start): the rows,
TRL's settings, and (:func:`sft`) a resumable TRL ``SFTTrainer`` run on (prompt, completion) pairs.

Hand-written, and why: ``sft_dataset`` tokenizes prompt and completion apart and joins them as ids,
an EOS after the completion, the prompt cut from the LEFT to fit ``max_length`` (TRL 1.16 only
truncates with ``keep_start``, which would cut the completion). TRL gets ``input_ids`` +
``completion_mask``, so it adds no second EOS and no BOS, and builds the labels (-100 on the prompt)
from our mask. The ids are exactly what the model sees at inference, token in, token out: :func:`sft`
gives each prompt as the engine gives it (:func:`rag_lab.env.fit.prompt_as_ids`: rendered and tokenized
alone, or for a continued rollout, DAPO's, its first prompt, earlier turns and information blocks each
tokenized alone), then the generated tokens.

Data-parallel (``launch``, :mod:`rag_lab.train.parallel`): ``batch_size`` is the global batch; each of N
processes takes ``batch_size / N`` rows of it (``per_device_train_batch_size``), and the length-grouped
order is drawn over the global batch (:func:`trainer_class`: transformers groups by the per-process batch,
so N processes would see other batches than one), so N processes make the updates of one. TRL averages the
loss over the global batch's completion tokens (``average_tokens_across_devices``).
"""

import functools
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import torch

from rag_lab.core.config import AtLeast, NonNegative, Positive, PositiveInt
from rag_lab.core.errors import RagLabError
from rag_lab.core.loading import trained_loading
from rag_lab.env.fit import prompt_as_ids
from rag_lab.generators.base import Prompt, text_ids
from rag_lab.generators.hf import default_device
from rag_lab.train.lora import LoRA, peft_config
from rag_lab.train.parallel import gradient_checkpointing, processes, share
from rag_lab.train.resume import last_good_checkpoint, stopped_early
from rag_lab.train.sharded import accelerator_config

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase, TrainerCallback
    from trl import SFTConfig, SFTTrainer

log = logging.getLogger(__name__)


def sft_dataset(
    pairs: Sequence[tuple[str | list[int], str]], tokenizer: "PreTrainedTokenizerBase", max_length: int
) -> "Dataset":
    """``input_ids`` (prompt ids + completion ids + EOS) and ``completion_mask`` (1 on the completion
    and its EOS), each at most ``max_length``: a long prompt loses its start, the completion stays. A
    prompt is text (tokenized alone) or its ids (taken as they are)."""
    from datasets import Dataset

    eos = tokenizer.eos_token_id
    texts = [p for p, _ in pairs if isinstance(p, str)]
    tokenized = iter(text_ids(tokenizer, texts))
    prompts = [next(tokenized) if isinstance(p, str) else list(p) for p, _ in pairs]
    completions = text_ids(tokenizer, [c for _, c in pairs])
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


def sft_rows(
    pairs: Sequence[tuple[Prompt, str]], tokenizer: "PreTrainedTokenizerBase", max_length: int
) -> "Dataset":
    """:func:`sft_dataset` of (prompt, completion) pairs, each prompt as the engine gives it to the model at
    inference (:func:`rag_lab.env.fit.prompt_as_ids`: token in, token out)."""
    return sft_dataset([(prompt_as_ids(tokenizer, p), c) for p, c in pairs], tokenizer, max_length)


def sft_config(
    output_dir: Path, steps: int, batch_size: int, lr: float, warmup_steps: int, seed: int, **settings
) -> "SFTConfig":
    """TRL's ``SFTConfig`` as rag_lab's SFT stages use it (the tiny LM's and the cold start's): cosine
    schedule, batches grouped by length, no reporting, seeded, no dataloader workers; ``settings``
    adds or overrides the rest (``completion_only_loss``, ``max_length``, saving, ``bf16``)."""
    from trl import SFTConfig

    shared = dict(
        output_dir=str(output_dir),
        # TRL's defaults: bf16 fails at init on CPU; gradient checkpointing only slows a small model (on
        # where launch.gradient_checkpointing says)
        bf16=False,
        **gradient_checkpointing(),
        max_steps=steps,
        # batch_size is the global batch: this process's share of it
        per_device_train_batch_size=share(batch_size, "batch_size"),
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
        # said even where no GPU is: under `accelerate launch`, transformers takes CPU processes for
        # data-parallel ones only when told they are on the CPU
        use_cpu=not torch.cuda.is_available(),
        accelerator_config=accelerator_config(),
    )
    return SFTConfig(**(shared | settings))


@functools.cache
def trainer_class() -> type["SFTTrainer"]:
    """TRL's ``SFTTrainer`` whose ``group_by_length`` order is drawn over the global batch (per-process
    batch x processes x accumulation): transformers' ``LengthGroupedSampler`` groups by the per-process
    batch, so under N processes its megabatches, and so the batches, would differ from one process's.
    Every process draws the same order (the same seed); accelerate's loader hands each its share."""
    from transformers.trainer_pt_utils import LengthGroupedSampler
    from trl import SFTTrainer

    class GlobalBatchSFTTrainer(SFTTrainer):
        def _get_train_sampler(self, train_dataset=None):
            dataset = self.train_dataset if train_dataset is None else train_dataset
            if self.args.train_sampling_strategy != "group_by_length" or processes() == 1:
                return super()._get_train_sampler(train_dataset)
            batch = self.args.train_batch_size * self.args.gradient_accumulation_steps * processes()
            return LengthGroupedSampler(batch, dataset=dataset, model_input_name="input_ids")

    return GlobalBatchSFTTrainer


@dataclass(frozen=True)
class SFTSettings:
    """How :func:`sft` trains (the cold start's training keys, ``conf/cold_start/default.yaml``)."""

    # passes over the pairs, or a fixed step count (max_steps > 0 wins)
    epochs: NonNegative = 1.0
    max_steps: Annotated[int, AtLeast(0)] = 0
    batch_size: PositiveInt = 8
    lr: Positive = 1e-4
    warmup_steps: Annotated[int, AtLeast(0)] = 10
    # rows longer than this lose the start of their prompt, never the completion
    max_length: PositiveInt = 1024
    completion_only_loss: bool = True
    # LoRA adapters, merged into the saved model (null or r 0: every weight trains)
    lora: LoRA | None = None
    # a Trainer checkpoint every save_steps (a killed run resumes from the last)
    save_steps: PositiveInt = 50
    # mixed precision (null: bf16 where a GPU supports it, float32 on CPU)
    bf16: bool | None = None
    # seeds the training (and, in the cold start, the teacher's samples)
    seed: int = 0


def log_last_step() -> "TrainerCallback":
    """A callback that logs the final step too: the Trainer logs every ``logging_steps`` only."""
    from transformers import TrainerCallback

    class LogLastStep(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_log = control.should_log or state.global_step >= state.max_steps

    return LogLastStep()


def sft(
    model_dir: str | Path,
    tokenizer_dir: str | Path,
    pairs: Sequence[tuple[Prompt, str]],
    settings: SFTSettings,
    work_dir: Path,
    callbacks: Sequence["TrainerCallback"] = (),
) -> tuple["SFTTrainer", dict]:
    """TRL's ``SFTTrainer`` on ``pairs`` (chat prompts rendered by the tokenizer's chat template),
    checkpointing into ``work_dir`` every ``settings.save_steps`` and resuming from its last checkpoint;
    the trainer (its ``model`` a PEFT model with LoRA) and the run's stats. A run stopped early (a
    callback's ``should_training_stop``) raises, so that no partial model is taken for a finished one."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    # each prompt as the engine gives it to the model at inference (token in, token out)
    dataset = sft_rows(pairs, tokenizer, settings.max_length)
    steps = settings.max_steps or math.ceil(settings.epochs * len(pairs) / settings.batch_size)
    with trained_loading():  # ZeRO-3's init / FSDP's efficient loading: the trainer prepares it next
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    # where the model runs fastest (a small one on the CPU, even beside a GPU); bf16 where that is a GPU
    on_gpu = default_device(model).startswith("cuda")
    placement = {"use_cpu": not on_gpu}
    args = sft_config(
        work_dir,
        steps,
        settings.batch_size,
        settings.lr,
        settings.warmup_steps,
        settings.seed,
        bf16=(on_gpu and torch.cuda.is_bf16_supported()) if settings.bf16 is None else settings.bf16,
        completion_only_loss=settings.completion_only_loss,
        # rows are already cut to max_length from the prompt's left; this only guards
        max_length=settings.max_length,
        # group_by_length draws megabatches of 50 batches, each sorted longest first: a log every 50
        # steps averages whole megabatches (every 25 would alternate long and short halves)
        logging_steps=max(1, min(50, steps // 10)),
        save_strategy="steps",
        save_steps=settings.save_steps,
        # the newest two: a kill while one is written leaves the one before
        save_total_limit=2,
        **placement,
    )
    trainer = trainer_class()(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config(settings.lora),
        callbacks=[log_last_step(), *callbacks],
    )
    last = last_good_checkpoint(work_dir)
    if last:
        log.info("SFT: resuming from %s", last)
    start = time.perf_counter()
    result = trainer.train(resume_from_checkpoint=last)
    if trainer.state.global_step < steps:
        raise stopped_early("SFT", trainer.state.global_step, steps, work_dir)
    return trainer, sft_stats(trainer, result, dataset, steps, last, time.perf_counter() - start)


def sft_stats(
    trainer: "SFTTrainer", result, dataset: "Dataset", steps: int, last: str | None, seconds: float
) -> dict:
    """What train.json records of an SFT run: steps, time, rows, the loss curve, the trainable size."""
    logs = [row for row in trainer.state.log_history if "loss" in row]
    lengths = [len(ids) for ids in dataset["input_ids"]]
    return {
        "steps": steps,
        "resumed_from": int(Path(last).name.split("-")[-1]) if last else None,
        "seconds": seconds,
        "rows": len(lengths),
        "mean_length": sum(lengths) / len(lengths),
        "final_loss": logs[-1]["loss"],
        "mean_loss": result.training_loss,
        "losses": [{"step": row["step"], "loss": row["loss"]} for row in logs],
        "trainable_parameters": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
    }
