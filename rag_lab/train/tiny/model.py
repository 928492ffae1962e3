"""The tiny LM: a small Qwen2-style causal LM (:class:`TinyConfig`, :func:`build_model`) trained from
scratch on CPU, in stages.

Stage 1 (optional) is reading (:func:`read`: a page, then questions about it, each with its answer,
loss on the answers only); stage 2 is TRL's ``SFTTrainer`` on (prompt, completion) demonstrations
(:func:`sft_stage`); stage 3 (optional) is the protocol stage: the :func:`read` loop again, on the
finished model. :mod:`rag_lab.train.tiny.trainer` runs them into cached model directories (a normal
transformers model directory: ``generator=hf`` loads it, with ``tokenizer=<dir>/tokenizer``); the
recipe that feeds them from the world is :mod:`rag_lab.train.tiny.recipe`. STACK.md ("A tiny agent LM
from scratch on 2 cores") and experiments/results/tiny_lm.md have the measurements behind it.

Hand-written, and why:

- The tokenizer: :mod:`rag_lab.train.tiny.tokenizer`.
- :func:`read`: a plain loop over padded reading batches with the loss on the answers, as the probe
  that measured reading trains (TRL's length-grouped batches differ, and its per-step extras cost
  time). :func:`train_loop` copies the Trainer's optimiser defaults (AdamW, no weight decay, grad-norm
  clip 1.0, linear warm-up then cosine) so that every stage trains alike.
- :func:`target_loss`: the causal-LM loss with the LM head applied at the labelled positions only (a
  reading item has a few answer tokens among hundreds; transformers' ``logits_to_keep`` keeps a
  suffix, not a set of positions): 1.3x the steps/s on ``qa`` reading batches.
- The SFT rows and TRL's settings: :mod:`rag_lab.train.sft` (shared with the cold start).

Speed, measured on our 2-core CPU machine (torch 2.13, float32, 2 threads; ``torch.set_num_threads``
is the caller's) for the embedded default's size (hidden 64, 4 layers, 349k parameters, vocabulary
1.6k), inside ``rag_lab.run`` (deterministic mode on, without its NaN fill of new tensors: with
it, every stage ran 2.4x slower):

- reading drills (:func:`read`), batch 32 of ~86 tokens: 7.7 steps/s, 21k tokens/s;
- SFT (TRL, rows grouped by length), batch 16 of ~120 tokens: 6.6 steps/s, 12.8k non-padding
  tokens/s. TRL's step costs more per token than the plain loops: its fused LM head scores every
  position on CPU (it skips the prompt positions only where Triton runs) and it computes entropy
  and accuracy each step.

``train.json`` records the rates of every stage of every run.
"""

import logging
import shutil
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tqdm.auto import tqdm

from rag_lab.core.errors import RagLabError
from rag_lab.core.ranges import PositiveInt
from rag_lab.train.parallel import processes, shared_backward
from rag_lab.train.sft import log_last_step, sft_config, sft_dataset, trainer_class

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM
    from trl import SFTTrainer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TinySizes:
    """The model's sizes, declared once: the recipe's settings (:class:`~rag_lab.train.tiny.recipe.Recipe`)
    and the stages' config (:class:`TinyConfig`) both have them; the defaults are the shipped model's."""

    hidden: PositiveInt = 64
    layers: PositiveInt = 4
    heads: PositiveInt = 4
    kv_heads: PositiveInt = 2
    intermediate: PositiveInt = 256
    # Positions. Longer demonstrations lose the start of their prompt, never the completion.
    max_length: PositiveInt = 1024


@dataclass(frozen=True)
class TinyConfig(TinySizes):
    """The model's sizes and its stages' settings (the recipe fills them: rag_lab.train.tiny.recipe)."""

    # Stage 1: reading (``reading`` items: a page, then questions about it each followed by the value
    # the page states), answer-only loss, in batches of reading_batch_size: it teaches finding the one
    # fact a question asks for (experiments/results/tiny_lm.md).
    reading_steps: int = 0
    reading_batch_size: int = 32
    # Stage 2: TRL SFT on prompt/completion pairs, loss on the completion only.
    sft_steps: int = 1500
    batch_size: int = 32
    lr: float = 1e-3
    warmup_steps: int = 50
    seed: int = 0
    # False: the SFT loss covers the prompt too.
    completion_only_loss: bool = True

    def __post_init__(self) -> None:
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise RagLabError(
                f"tiny LM: hidden ({self.hidden}) % heads ({self.heads}) and heads % kv_heads "
                f"({self.kv_heads}) must be 0"
            )


def build_model(tokenizer: "PreTrainedTokenizerFast", config: TinyConfig) -> "Qwen2ForCausalLM":
    """A freshly initialised ``Qwen2ForCausalLM`` (tied embeddings), seeded by ``config.seed``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(config.seed)
    return Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=len(tokenizer),
            hidden_size=config.hidden,
            intermediate_size=config.intermediate,
            num_hidden_layers=config.layers,
            num_attention_heads=config.heads,
            num_key_value_heads=config.kv_heads,
            max_position_embeddings=config.max_length,
            tie_word_embeddings=True,
            bos_token_id=None,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    )


def _log_every(steps: int) -> int:
    return min(25, max(1, steps // 10))


def target_loss(
    model: "Qwen2ForCausalLM", batch: dict[str, torch.Tensor], over: int | None = None
) -> torch.Tensor:
    """The causal-LM loss of ``model(**batch).loss`` (next-token cross-entropy, mean over the labelled
    positions), with the LM head applied at the labelled positions only. A reading batch has an answer
    or two per row of a few hundred tokens, so scoring every position against the whole vocabulary
    (what ``model(**batch)`` does) is most of the head's cost for nothing; this is the same number
    (tests/test_tiny_lm.py) at a fraction of the cost (experiments/bench_tiny_training.py). ``over``: the
    labelled positions to divide by (a share of a global batch: the whole batch's count; else this one's)."""
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    hidden = model.model(**inputs).last_hidden_state[:, :-1]
    targets = batch["labels"][:, 1:]
    keep = targets != -100
    logits = model.lm_head(hidden[keep])
    if over is None:
        return torch.nn.functional.cross_entropy(logits.float(), targets[keep])
    return torch.nn.functional.cross_entropy(logits.float(), targets[keep], reduction="sum") / over


def step_loss(model: "Qwen2ForCausalLM", batch: dict[str, torch.Tensor], device) -> torch.Tensor:
    """One step's :func:`target_loss` with its gradient in the parameters. Under ``launch`` each process takes
    every N-th row of the (global) batch, its loss divided by the whole batch's labelled positions, and the
    gradients are summed across the processes (:func:`rag_lab.train.parallel.shared_backward`): the update
    of one process on the whole batch."""
    if processes() == 1:
        loss = target_loss(model, {k: v.to(device) for k, v in batch.items()})
        loss.backward()
        return loss
    over = int((batch["labels"][:, 1:] != -100).sum())

    def loss_of(rows: list[int]) -> torch.Tensor:
        return target_loss(model, {k: v[rows].to(device) for k, v in batch.items()}, over)

    return shared_backward(list(range(len(batch["input_ids"]))), loss_of, list(model.parameters()))


def train_loop(
    model: "Qwen2ForCausalLM",
    batches: Iterable[dict],
    steps: int,
    config: TinyConfig,
    stage: str,
    on_step: Callable[[int], None] | None = None,
) -> dict:
    """The plain loop of the hand-written stages: AdamW without weight decay, grad-norm clip 1.0,
    linear warm-up then cosine (the Trainer's defaults, so every stage trains alike). ``batches``
    yields model inputs (with ``labels``); ``on_step(step)`` runs after each step (a probe's
    evaluation); returns the stats for train.json."""
    from transformers import get_cosine_schedule_with_warmup

    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
    schedule = get_cosine_schedule_with_warmup(optimizer, min(config.warmup_steps, steps), steps)
    device = next(model.parameters()).device
    model.train()
    losses, history, tokens, start, every = [], [], 0, time.perf_counter(), _log_every(steps)
    bar = tqdm(range(steps), desc=stage, unit="step")
    for step, batch in zip(bar, batches, strict=False):
        loss = step_loss(model, batch, device)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if on_step is not None:
            on_step(step + 1)
        tokens += (
            int(batch["attention_mask"].sum()) if "attention_mask" in batch else batch["input_ids"].numel()
        )
        if (step + 1) % every == 0 or step + 1 == steps:
            window = losses[-every:]
            history.append({"step": step + 1, "loss": sum(window) / len(window)})
            bar.set_postfix(loss=f"{history[-1]['loss']:.3f}")
            log.info("%s step %d loss %.4f", stage, step + 1, history[-1]["loss"])
    seconds = time.perf_counter() - start
    return {
        "steps": steps,
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "steps_per_s": steps / seconds,
        # The mean of the last logging window: one batch's loss is noisy.
        "final_loss": history[-1]["loss"],
        "log": history,
    }


def reading_example(
    tokenizer: "PreTrainedTokenizerFast",
    item: Sequence[str],
    max_length: int,
    entities: Collection[int] = frozenset(),
) -> tuple[list[int], list[int]]:
    """A reading item's token ids and labels: its pieces tokenized apart (as at inference: a prompt,
    then what the model generates), labels on the answer pieces (odd positions) only, -100 elsewhere;
    cut to ``max_length`` from the left. An entity token (``entities``: the ids of the world's names)
    is a target only where it repeats one earlier in the (cut) item: with renamed entities a first
    mention cannot be read or predicted from anything (a demonstration whose completion names an
    entity that its prompt does not, or whose prompt was cut), so it must not teach name guessing."""
    return _example(tokenizer(list(item), add_special_tokens=False).input_ids, max_length, entities)


def _example(
    pieces: Sequence[list[int]], max_length: int, entities: Collection[int]
) -> tuple[list[int], list[int]]:
    """:func:`reading_example` on an item's pieces already tokenized."""
    ids, labels = [], []
    for i, piece in enumerate(pieces):
        ids += piece
        labels += piece if i % 2 else [-100] * len(piece)
    ids, labels, seen = ids[-max_length:], labels[-max_length:], set()
    for j, token in enumerate(ids):
        if token in entities and token not in seen:
            labels[j] = -100
        seen.add(token)
    return ids, labels


def read(
    model: "Qwen2ForCausalLM",
    tokenizer: "PreTrainedTokenizerFast",
    items: Sequence[tuple[str, ...]],
    config: TinyConfig,
    entities: Collection[int] = frozenset(),
    stage: str = "reading",
) -> dict:
    """Stage 1: reading items in order, ``reading_batch_size`` per step. An item alternates context
    and answer pieces (``page + question 1``, ``answer 1``, ``question 2``, ``answer 2``, ...); the loss
    is on the answers only (and on ``entities`` only where they repeat: :func:`reading_example`;
    right-padded batches, cut to max_length on the left; :func:`train_loop`'s optimiser and schedule).
    A plain loop, not TRL: the probe that measured reading (experiments/results/tiny_lm.md) trains this
    way, and TRL's length-grouped batches and per-step extras measured slower to learn and to run here."""
    steps, size = config.reading_steps, config.reading_batch_size
    if len(items) < steps * size:
        raise RagLabError(
            f"tiny LM: {steps} reading steps of {size} need {steps * size} items, got {len(items)}"
        )

    batches = _ReadingBatches(tokenizer, items, size, config.max_length, entities)
    # On a GPU the batches are built by worker processes (in order, ahead of the step): built in the
    # training process they bound its steps/s. On the CPU they would take the cores the step uses.
    workers = 4 if next(model.parameters()).device.type == "cuda" else 0
    loader = torch.utils.data.DataLoader(
        batches, batch_size=None, num_workers=workers, prefetch_factor=8 if workers else None
    )
    return train_loop(model, loader, steps, config, stage)


class _ReadingBatches(torch.utils.data.Dataset):
    """Step ``i``'s reading batch (:func:`reading_batch` of items ``i * size`` to ``(i + 1) * size``)."""

    def __init__(self, tokenizer, items, size: int, max_length: int, entities: Collection[int]) -> None:
        self.tokenizer = tokenizer
        self.items = items
        self.size = size
        self.max_length = max_length
        self.entities = entities

    def __len__(self) -> int:
        return len(self.items) // self.size

    def __getitem__(self, step: int) -> dict[str, torch.Tensor]:
        items = self.items[step * self.size : (step + 1) * self.size]
        return reading_batch(self.tokenizer, items, self.max_length, self.entities)


def reading_batch(
    tokenizer: "PreTrainedTokenizerFast",
    items: Sequence[tuple[str, ...]],
    max_length: int,
    entities: Collection[int] = frozenset(),
) -> dict[str, torch.Tensor]:
    """Reading items (:func:`reading_example`) as one right-padded batch of model inputs with labels."""
    # One tokenizer call for every piece of the batch (the same ids as one call per item, in a third of
    # the time: the building of a batch is what bounds a GPU's steps/s).
    flat = tokenizer([piece for item in items for piece in item], add_special_tokens=False).input_ids
    rows, start = [], 0
    for item in items:
        rows.append(_example(flat[start : start + len(item)], max_length, entities))
        start += len(item)
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (row, target) in enumerate(rows):
        ids[i, : len(row)], labels[i, : len(row)], mask[i, : len(row)] = (
            torch.tensor(row),
            torch.tensor(target),
            1,
        )
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def sft_trainer(
    model: "Qwen2ForCausalLM",
    tokenizer: "PreTrainedTokenizerFast",
    dataset: "Dataset",
    config: TinyConfig,
    output_dir: Path,
) -> "SFTTrainer":
    """Stage 2: TRL's ``SFTTrainer`` on ``sft_dataset`` rows, set up for a tiny model on CPU (under
    ``launch``: each process its share of every batch, length groups drawn over the global batch)."""

    args = sft_config(
        output_dir,
        config.sft_steps,
        config.batch_size,
        config.lr,
        config.warmup_steps,
        config.seed,
        completion_only_loss=config.completion_only_loss,
        max_length=config.max_length,
        logging_steps=_log_every(config.sft_steps),
        save_strategy="no",
    )
    return trainer_class()(
        model=model, args=args, train_dataset=dataset, processing_class=tokenizer, callbacks=[log_last_step()]
    )


def sft_stage(
    model: "Qwen2ForCausalLM",
    tokenizer: "PreTrainedTokenizerFast",
    pairs: Sequence[tuple[str, str]],
    config: TinyConfig,
    output_dir: Path,
) -> dict:
    """Stage 2: :func:`sft_trainer` run on ``pairs`` (its scratch dir ``output_dir`` removed after);
    the stats for train.json."""
    dataset = sft_dataset(pairs, tokenizer, config.max_length)
    trainer = sft_trainer(model, tokenizer, dataset, config, output_dir)
    result = trainer.train()
    shutil.rmtree(output_dir, ignore_errors=True)
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    seconds, tokens = result.metrics["train_runtime"], int(logs[-1]["num_tokens"])
    lengths = [len(ids) for ids in dataset["input_ids"]]
    return {
        "steps": trainer.state.global_step,
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "steps_per_s": trainer.state.global_step / seconds,
        "mean_length": sum(lengths) / len(lengths),
        "max_length": max(lengths),
        # The last logging window's mean, and the mean over the whole run.
        "final_loss": logs[-1]["loss"],
        "mean_loss": result.training_loss,
        "final_token_accuracy": logs[-1]["mean_token_accuracy"],
        "log": logs,
    }
