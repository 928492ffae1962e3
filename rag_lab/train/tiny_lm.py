"""The tiny LM: a small Qwen2-style causal LM trained from scratch on CPU, in stages.

Stage 0 (optional) is a copy warm-up and/or reading (``read``: a page, then questions about it,
each with its answer, loss on the answers only); stage 1 is plain causal-LM pretraining on the
corpus (``texts``); stage 2 is TRL's ``SFTTrainer`` on (prompt, completion) demonstrations; stage 3
(``tune_tiny_lm``, optional) trains the finished model on more reading items, cached apart so that a
recipe's earlier stages are reused. The
result is a normal transformers model directory (``generator=hf`` loads it, with
``tokenizer=<dir>/tokenizer``). STACK.md ("A tiny agent LM from scratch on 2 cores") has the
measurements behind the defaults.

Hand-written, and why:

- The tokenizer: :mod:`rag_lab.train.tiny_tokenizer`.
- ``read``: a plain loop over padded reading batches with the loss on the answers, as the probe that
  measured reading trains (TRL's length-grouped batches differ, and its per-step extras cost time).
- ``target_loss``: the causal-LM loss with the LM head applied at the labelled positions only (a
  reading item has a few answer tokens among hundreds; transformers' ``logits_to_keep`` keeps a
  suffix, not a set of positions): 1.3x the steps/s on ``qa`` reading batches.
- ``pretrain``: a 20-line loop over packed, equal-length blocks (texts joined by EOS), which need no
  collator, padding or mask; transformers' ``Trainer`` would add a dataset wrapper for no gain. It
  copies the Trainer's optimiser defaults (AdamW, no weight decay, grad-norm clip 1.0, linear warm-up
  then cosine) so the two stages train alike.
- The SFT rows and TRL's settings: :mod:`rag_lab.train.sft` (shared with the cold start).

Speed, measured on our 2-core CPU machine (torch 2.13, float32, 2 threads; ``torch.set_num_threads``
is the caller's) for the embedded default's size (hidden 64, 4 layers, 349k parameters, vocabulary
1.6k), inside ``rag_lab.run`` (deterministic mode on, without its NaN fill of new tensors: with
it, every stage ran 2.4x slower):

- reading drills (``read``), batch 32 of ~86 tokens: 7.7 steps/s, 21k tokens/s;
- SFT (TRL, rows grouped by length), batch 16 of ~120 tokens: 6.6 steps/s, 12.8k non-padding
  tokens/s. TRL's step costs more per token than the plain loops: its fused LM head scores every
  position on CPU (it skips the prompt positions only where Triton runs) and it computes entropy
  and accuracy each step.

``train.json`` records the rates of every stage of every run.
"""

import hashlib
import json
import logging
import random
import shutil
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tqdm.auto import tqdm

from rag_lab.errors import RagLabError
from rag_lab.retrievers.cache import publish
from rag_lab.train.sft import sft_config, sft_dataset
from rag_lab.train.tiny_tokenizer import build_tokenizer, one_token_names

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM
    from trl import SFTTrainer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TinyConfig:
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 512
    # Positions. Longer demonstrations lose the start of their prompt, never the completion.
    max_length: int = 1024
    # Stage 1: causal LM on the corpus, in packed blocks of pretrain_length tokens.
    pretrain_steps: int = 300
    pretrain_length: int = 256
    # Stage 0: a copy warm-up (random sequences of names, then the same sequence again) so that the
    # copying mechanism (induction heads) forms: measured on 2 cores, hidden 64, batch 8 x 256
    # tokens, copy accuracy of such sequences is 0.0 after 400 steps and 1.0 after 2,000, and without
    # it 1,200-3,000 steps of corpus + demonstrations never learned to copy a name from the prompt.
    copy_steps: int = 0
    # Stage 0b: reading (``reading`` items: a page, then questions about it each followed by the value
    # the page states), answer-only loss, in batches of reading_batch_size. Where the copy warm-up
    # teaches copying a sequence, this teaches finding the one fact a question asks for; the
    # measurements are in experiments/results/tiny_lm.md.
    reading_steps: int = 0
    reading_batch_size: int = 32
    # Stage 2: TRL SFT on prompt/completion pairs, loss on the completion only.
    sft_steps: int = 1500
    batch_size: int = 32
    lr: float = 1e-3
    warmup_steps: int = 50
    seed: int = 0
    # False: the SFT loss covers the prompt too (the traces' own follow-ups and answers are the same
    # copying skill, so a dense loss teaches it with far fewer steps).
    completion_only_loss: bool = True
    # The world's names (``entities``) get embeddings drawn at this std (0: the model's own init, 0.02)
    # and, with freeze_names, keep them through every stage. At 0.02 the names of one kind end up
    # nearly one vector, so the model can tell which kind to write but not which name: reading renamed
    # pages, held-out 0.375 after 1,000 steps at 0.02 and 0.645 at std 1.0 (frozen),
    # experiments/results/tiny_lm.md.
    name_std: float = 0.0
    freeze_names: bool = False

    @property
    def anchored(self) -> bool:
        """Whether the name embeddings are set apart (``name_std`` / ``freeze_names``)."""
        return bool(self.name_std or self.freeze_names)

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


def anchor_names(model: "Qwen2ForCausalLM", ids: Sequence[int], config: TinyConfig) -> None:
    """Draw the embeddings of the name tokens ``ids`` at ``config.name_std`` (seeded), and with
    ``config.freeze_names`` zero their gradient (a hook on the tied embedding matrix: no optimiser or
    trainer needs to know; with no weight decay AdamW then leaves them as drawn)."""
    weight = model.get_input_embeddings().weight
    rows = torch.tensor(sorted(ids), dtype=torch.long, device=weight.device)
    if config.name_std and len(rows):
        draw = torch.Generator().manual_seed(config.seed + 1)
        with torch.no_grad():
            drawn = torch.randn(len(rows), weight.shape[1], generator=draw) * config.name_std
            weight[rows] = drawn.to(weight)
    if config.freeze_names and len(rows):
        keep = torch.ones(weight.shape[0], 1, device=weight.device)
        keep[rows] = 0.0
        weight.register_hook(lambda grad: grad * keep)


def _log_every(steps: int) -> int:
    return min(25, max(1, steps // 10))


def _blocks(docs: list[list[int]], length: int, batch_size: int, seed: int) -> Iterator[torch.Tensor]:
    """Batches of ``length``-token blocks cut from the documents joined in a fresh order each epoch."""
    rng, docs = random.Random(seed), list(docs)
    while True:
        rng.shuffle(docs)
        stream = torch.tensor(list(chain.from_iterable(docs)))
        blocks = stream[: len(stream) // length * length].view(-1, length)
        order = torch.randperm(len(blocks), generator=torch.Generator().manual_seed(rng.getrandbits(63)))
        # Full batches only, unless the corpus holds less than one batch.
        for start in range(0, max(len(blocks) - batch_size + 1, 1), batch_size):
            yield blocks[order[start : start + batch_size]]


def target_loss(model: "Qwen2ForCausalLM", batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The causal-LM loss of ``model(**batch).loss`` (next-token cross-entropy, mean over the labelled
    positions), with the LM head applied at the labelled positions only. A reading batch has an answer
    or two per row of a few hundred tokens, so scoring every position against the whole vocabulary
    (what ``model(**batch)`` does) is most of the head's cost for nothing; this is the same number
    (tests/test_tiny_lm.py) at a fraction of the cost (experiments/bench_tiny_training.py)."""
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    hidden = model.model(**inputs).last_hidden_state[:, :-1]
    targets = batch["labels"][:, 1:]
    keep = targets != -100
    logits = model.lm_head(hidden[keep])
    return torch.nn.functional.cross_entropy(logits.float(), targets[keep])


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
        loss = target_loss(model, {k: v.to(device) for k, v in batch.items()})
        loss.backward()
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


def pretrain(
    model: "Qwen2ForCausalLM", tokenizer: "PreTrainedTokenizerFast", texts: Sequence[str], config: TinyConfig
) -> dict:
    """Stage 1: next-token loss on every token of ``texts``, packed; returns the stats for train.json."""
    eos = tokenizer.eos_token_id
    docs = [ids + [eos] for ids in tokenizer(list(texts), add_special_tokens=False).input_ids]
    length = min(config.pretrain_length, config.max_length, sum(map(len, docs)))
    blocks = ({"input_ids": b, "labels": b} for b in _blocks(docs, length, config.batch_size, config.seed))
    return {"block_length": length, **train_loop(model, blocks, config.pretrain_steps, config, "pretrain")}


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
    mention cannot be read or predicted from anything. This matters only for items with the loss on
    their context too (``traces``); every other layout's answers are in its context. (It was meant to
    keep such items from teaching name guessing; it did not bring copying back:
    experiments/results/tiny_lm.md, t11 and t12.)"""
    ids, labels = [], []
    for i, piece in enumerate(tokenizer(list(item), add_special_tokens=False).input_ids):
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
    """Stage 0b: reading items in order, ``reading_batch_size`` per step. An item alternates context
    and answer pieces (``page + question 1``, ``answer 1``, ``question 2``, ``answer 2``, ...); the loss
    is on the answers only (and on ``entities`` only where they repeat: :func:`reading_example`;
    right-padded batches, cut to max_length on the left; the same optimiser
    and schedule as ``pretrain``). A plain loop, not TRL: the probe that measured reading
    (the reading probe, experiments/results/tiny_lm.md) trains this way, and TRL's length-grouped batches and
    per-step extras measured slower to learn and to run here."""
    steps, size = config.reading_steps, config.reading_batch_size
    if len(items) < steps * size:
        raise RagLabError(
            f"tiny LM: {steps} reading steps of {size} need {steps * size} items, got {len(items)}"
        )

    batches = (
        reading_batch(tokenizer, items[step * size : (step + 1) * size], config.max_length, entities)
        for step in range(steps)
    )
    return train_loop(model, batches, steps, config, stage)


def reading_batch(
    tokenizer: "PreTrainedTokenizerFast",
    items: Sequence[tuple[str, ...]],
    max_length: int,
    entities: Collection[int] = frozenset(),
) -> dict[str, torch.Tensor]:
    """Reading items (:func:`reading_example`) as one right-padded batch of model inputs with labels."""
    rows = [reading_example(tokenizer, item, max_length, entities) for item in items]
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (row, target) in enumerate(rows):
        ids[i, : len(row)], labels[i, : len(row)], mask[i, : len(row)] = (
            torch.tensor(row), torch.tensor(target), 1
        )  # fmt: skip
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def sft_trainer(
    model: "Qwen2ForCausalLM",
    tokenizer: "PreTrainedTokenizerFast",
    dataset: "Dataset",
    config: TinyConfig,
    output_dir: Path,
) -> "SFTTrainer":
    """Stage 2: TRL's ``SFTTrainer`` on ``sft_dataset`` rows, set up for a tiny model on CPU."""
    from transformers import TrainerCallback
    from trl import SFTTrainer

    class LogLastStep(TrainerCallback):
        """The Trainer logs every ``logging_steps`` only; the final loss should be logged too."""

        def on_step_end(self, args, state, control, **kwargs):
            control.should_log = control.should_log or state.global_step >= state.max_steps

    args = sft_config(
        output_dir, config.sft_steps, config.batch_size, config.lr, config.warmup_steps, config.seed,
        completion_only_loss=config.completion_only_loss, max_length=config.max_length,
        logging_steps=_log_every(config.sft_steps), save_strategy="no",
    )  # fmt: skip
    return SFTTrainer(
        model=model, args=args, train_dataset=dataset, processing_class=tokenizer, callbacks=[LogLastStep()]
    )


def fingerprint(
    texts: Sequence[str],
    pairs: Sequence[tuple[str, ...]],
    special_tokens: Sequence[str],
    names: Sequence[str] = (),
    reading: Sequence[tuple[str, ...]] = (),
    entities: Sequence[str] = (),
    anchored: bool = False,
    pieces: Collection[str] = (),
) -> str:
    """The training data's hash. The entities change the reading labels and the ``anchored`` name
    embeddings (``TinyConfig.name_std`` / ``freeze_names``), so they count only then (a model with
    neither keeps its hash); ``pieces`` (build_tokenizer's) likewise only when there are some."""
    held = [*pairs, *reading, *([tuple(entities)] if reading or anchored else [])]
    tokenizer = [list(special_tokens), list(names), *([sorted(pieces)] if pieces else [])]
    payload = json.dumps([list(texts), [list(p) for p in held], *tokenizer])
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def copy_texts(names: Sequence[str], seed: int, n: int = 20_000, length: int = 6) -> list[str]:
    """Stage 0's data: ``copy: a b c | a b c`` over random names (every name is in the vocabulary)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        picked = rng.sample(list(names), min(length, len(names)))
        out.append("copy: " + " ".join(picked) + " | " + " ".join(picked))
    return out


def train_tiny_lm(
    texts: Sequence[str],
    pairs: Sequence[tuple[str, str]],
    config: TinyConfig,
    out_dir: Path,
    special_tokens: Sequence[str] = (),
    names: Sequence[str] = (),
    reading: Sequence[tuple[str, ...]] = (),
    entities: Sequence[str] = (),
    pieces: Collection[str] = (),
) -> Path:
    """Train the tiny LM into ``out_dir`` (model, ``tokenizer/``, ``train.json``), or reuse it.

    Stages, each skipped at 0 steps: copy warm-up, reading (one pass over ``reading``; ``entities``,
    the world's names, are reading targets only where they repeat), pretraining on ``texts``, SFT on
    ``pairs``. The vocabulary is every piece of ``texts``, ``pairs`` and ``reading`` plus
    ``special_tokens`` (``names`` one token each, ``pieces`` cut into syllables). ``out_dir``
    appears in one rename when training has finished (a killed run leaves only a ``.name.*`` temp
    dir beside it); one that exists is returned as is, after checking that ``train.json`` names the
    same config and data (else ``RagLabError``: a stale model is never served).
    """
    out_dir = Path(out_dir)
    data = fingerprint(texts, pairs, special_tokens, names, reading, entities, config.anchored, pieces)
    if out_dir.exists():
        _check_reuse(out_dir, config, data)
        return out_dir
    if (config.pretrain_steps and not texts) or (config.sft_steps and not pairs):
        raise RagLabError("tiny LM: pretraining needs texts and SFT needs pairs (or set their steps to 0)")
    if config.reading_steps and not reading:
        raise RagLabError("tiny LM: reading_steps needs reading items (or set reading_steps=0)")
    start = time.perf_counter()
    with publish(out_dir) as tmp:
        pool = names or sorted({w for t in texts for w in t.split() if w.isalpha() and w.istitle()})
        copies = copy_texts(pool, config.seed) if config.copy_steps else []
        tokenizer = build_tokenizer(
            chain(texts, chain.from_iterable(pairs), chain.from_iterable(reading), copies[:1]),
            special_tokens,
            names,
            pieces,
        )
        tokenizer.save_pretrained(tmp / "tokenizer")
        model = build_model(tokenizer, config)
        stats: dict = {
            "config": asdict(config),
            "data": data,
            "texts": len(texts),
            "pairs": len(pairs),
            "special_tokens": list(special_tokens),
            "vocab_size": len(tokenizer),
            "parameters": sum(p.numel() for p in model.parameters()),
        }
        if config.copy_steps:
            stats["copy"] = pretrain(
                model, tokenizer, copies, replace(config, pretrain_steps=config.copy_steps)
            )
        known = one_token_names(tokenizer, entities)
        anchor_names(model, known, config)
        if config.reading_steps:
            stats["reading"] = read(model, tokenizer, reading, config, known)
        if config.pretrain_steps:
            stats["pretrain"] = pretrain(model, tokenizer, texts, config)
        if config.sft_steps:
            stats["sft"] = _sft(model, tokenizer, pairs, config, tmp / "trainer")
        model.save_pretrained(tmp)
        stats["wall_s"] = time.perf_counter() - start
        stats["versions"] = _versions()
        (tmp / "train.json").write_text(json.dumps(stats, indent=1) + "\n")
    return out_dir


def tune_tiny_lm(
    base_dir: Path,
    items: Sequence[tuple[str, ...]],
    config: TinyConfig,
    out_dir: Path,
    data: str,
    entities: Sequence[str] = (),
) -> Path:
    """A protocol stage on a trained tiny LM: ``base_dir``'s model and tokenizer, trained on reading
    items (``config.reading_steps`` batches of ``config.reading_batch_size``, the :func:`read` loop at
    ``config.lr``) into ``out_dir``, or reused as :func:`train_tiny_lm` does (``data``: the items'
    fingerprint). Words the base vocabulary lacks become ``<unk>``. ``train.json`` keeps the base's
    name and training time next to the stage's own, so a recipe's cost is the sum of its stages."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base_dir, out_dir = Path(base_dir), Path(out_dir)
    if out_dir.exists():
        _check_reuse(out_dir, config, data)
        return out_dir
    base = json.loads((base_dir / "train.json").read_text())
    start = time.perf_counter()
    with publish(out_dir) as tmp:
        torch.manual_seed(config.seed)
        tokenizer = AutoTokenizer.from_pretrained(base_dir / "tokenizer")
        model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
        known = one_token_names(tokenizer, entities)
        stats = {"config": asdict(config), "data": data, "base": base_dir.name,
                 "base_wall_s": base.get("total_wall_s", base["wall_s"]),
                 "parameters": base["parameters"], "vocab_size": len(tokenizer)}  # fmt: skip
        stats["tune"] = read(model, tokenizer, items, config, known, "protocol stage")
        tokenizer.save_pretrained(tmp / "tokenizer")
        model.save_pretrained(tmp)
        stats["wall_s"] = time.perf_counter() - start
        stats["total_wall_s"] = stats["base_wall_s"] + stats["wall_s"]
        stats["versions"] = _versions()
        (tmp / "train.json").write_text(json.dumps(stats, indent=1) + "\n")
    return out_dir


def _sft(
    model: "Qwen2ForCausalLM",
    tokenizer: "PreTrainedTokenizerFast",
    pairs: Sequence[tuple[str, str]],
    config: TinyConfig,
    output_dir: Path,
) -> dict:
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


def _check_reuse(out_dir: Path, config: TinyConfig, data: str) -> None:
    info = out_dir / "train.json"
    if not info.exists():
        raise RagLabError(f"tiny LM: {out_dir} exists without train.json; remove it or pick another out_dir")
    stats = json.loads(info.read_text())
    if stats["config"] != asdict(config) or stats["data"] != data:
        raise RagLabError(
            f"tiny LM: {out_dir} holds a model of another config or data; remove it or pick another"
        )


def _versions() -> dict[str, str]:
    import tokenizers
    import transformers
    import trl

    return {m.__name__: m.__version__ for m in (torch, transformers, trl, tokenizers)}
