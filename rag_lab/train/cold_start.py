"""Cold start: supervised fine-tuning of any causal LM on rejection-sampled teacher demonstrations.

Follows R3-RAG's cold start (papers/r3-rag.txt, algorithms 1 and 2): a strong teacher rolls out
several trajectories per training question at varied temperature; a trajectory is kept only when
its final answer is correct and every step is well formed; each kept trajectory of L steps gives L
(prompt = question + the steps so far, completion = the next step) SFT pairs. APEX's executor SFT
on filtered teacher traces is the same recipe on the ``apex_exec`` protocol, and DAPO and EVO-RAG
start from it on the embedded world (``protocols`` picks the formats).

- The pairs: :mod:`rag_lab.train.demonstrations` (the teacher, the rejection, their cache).
- SFT is TRL's ``SFTTrainer`` (optionally with a PEFT LoRA adapter, merged into the saved model), loss
  on the completion only, float32 unless bf16 is asked for or a GPU has it.

Hand-written, and why:

- The SFT rows (``rag_lab.train.sft.sft_dataset``): prompt and completion are tokenized apart
  and joined as ids, EOS after the completion, a long prompt cut from the left. A chat prompt is
  first rendered by :func:`rag_lab.generators.base.render`, the function ``HFGenerator`` renders it
  with at inference. Deviation from TRL's conversational prompt-completion format, on purpose:
  DAPO's later turns are a partial assistant message the model continues
  (``continue_final_message``); TRL would close that message and open a new assistant turn, so the
  model would train on a context it never sees.
- The cache (``<cache_dir>/cold_start/<hash of the base model's files, the pairs, the settings>``,
  published in one rename) and the resume (Trainer checkpoints every ``save_steps`` in a ``.work``
  dir beside it; a killed run resumes from the last one, and ends with the weights an uninterrupted
  run of the same seed gives). With the demonstrations' cache, a second call neither
  samples nor trains.

``python -m rag_lab.train.cold_start generator=tiny cold_start.protocols=[dapo]`` prints the model's
directory; ``generator=hf generator.model=<dir>`` loads it (with ``generator.tokenizer=<dir>/tokenizer``
for a base whose tokenizer lived in its own folder, as the tiny LM's does: :func:`load` knows which).
"""

import hashlib
import json
import logging
import math
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import torch

from rag_lab.config import AtLeast, PositiveInt
from rag_lab.errors import RagLabError
from rag_lab.generators.base import Prompt, render
from rag_lab.generators.teacher.agent import Noise
from rag_lab.retrievers.cache import publish
from rag_lab.train.demonstrations import demonstrations

if TYPE_CHECKING:
    from transformers import TrainerCallback
    from trl import SFTTrainer

    from rag_lab.generators.hf import HFGenerator

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoRA:
    # adapter rank; 0: no adapter (every weight trains)
    r: Annotated[int, AtLeast(0)] = 0
    alpha: PositiveInt = 16
    dropout: float = 0.05
    # names of the modules that get an adapter (the last part of their dotted name)
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_modules", tuple(self.target_modules))


@dataclass(frozen=True)
class ColdStartConfig:
    # the protocols to demonstrate: names of rag_lab/env/protocols, or patterns (apex_*, stoprag_*)
    protocols: tuple[str, ...] = ("dapo", "evorag", "r3rag", "apex_*")
    split: str = "train"
    # the first `limit` questions of the split (null: all)
    limit: Annotated[int | None, AtLeast(1)] = None
    # one rollout per question at each temperature (0: greedy), `samples` of them above 0
    temperatures: tuple[float, ...] = (0.0, 0.7, 1.0)
    samples: PositiveInt = 1
    # the teacher's mistakes, each a probability per decision (null: none; the yaml sets some, for
    # rejection sampling to filter out)
    noise: Noise | None = None
    # passages per search, and the Stop-RAG pipelines' iterations (demonstration_policies)
    k: PositiveInt = 3
    iterations: PositiveInt = 6
    # SFT: passes over the kept pairs, or a fixed step count (max_steps > 0 wins)
    epochs: float = 1.0
    max_steps: Annotated[int, AtLeast(0)] = 0
    batch_size: PositiveInt = 8
    lr: float = 1e-4
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
    # seeds the teacher's samples and the training
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("protocols", "temperatures"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if not self.protocols or not self.temperatures or min(self.temperatures) < 0:
            raise RagLabError(
                "cold_start: protocols and temperatures must be non-empty lists, temperatures >= 0 "
                f"(got {list(self.protocols)}, {list(self.temperatures)})"
            )


# ---- SFT (TRL) ---------------------------------------------------------------------------------------


def sft(
    model_dir: str | Path,
    tokenizer_dir: str | Path,
    pairs: Sequence[tuple[Prompt, str]],
    config: ColdStartConfig,
    work_dir: Path,
    callbacks: Sequence["TrainerCallback"] = (),
) -> tuple["SFTTrainer", dict]:
    """TRL's ``SFTTrainer`` on ``pairs`` (chat prompts rendered by the tokenizer's chat template),
    checkpointing into ``work_dir`` every ``config.save_steps`` and resuming from its last checkpoint;
    the trainer (its ``model`` a PEFT model with LoRA) and the run's stats. A run stopped early (a
    callback's ``should_training_stop``) raises, so that no partial model is taken for a finished one."""
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_utils import get_last_checkpoint
    from trl import SFTTrainer

    from rag_lab.train.sft import sft_config, sft_dataset

    class LogLastStep(TrainerCallback):
        """The Trainer logs every ``logging_steps`` only; the final loss should be logged too."""

        def on_step_end(self, args, state, control, **kwargs):
            control.should_log = control.should_log or state.global_step >= state.max_steps

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    dataset = sft_dataset([(render(tokenizer, p), c) for p, c in pairs], tokenizer, config.max_length)
    steps = config.max_steps or math.ceil(config.epochs * len(pairs) / config.batch_size)
    gpu_bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    args = sft_config(
        work_dir, steps, config.batch_size, config.lr, config.warmup_steps, config.seed,
        bf16=gpu_bf16 if config.bf16 is None else config.bf16,
        completion_only_loss=config.completion_only_loss,
        # rows are already cut to max_length from the prompt's left; this only guards
        max_length=config.max_length,
        # group_by_length draws megabatches of 50 batches, each sorted longest first: a log every 50
        # steps averages whole megabatches (every 25 would alternate long and short halves)
        logging_steps=max(1, min(50, steps // 10)),
        save_strategy="steps",
        save_steps=config.save_steps,
        # the newest two: a kill while one is written leaves the one before
        save_total_limit=2,
    )  # fmt: skip
    lora, peft = config.lora or LoRA(), None
    if lora.r:
        peft = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                          target_modules=list(lora.target_modules), task_type="CAUSAL_LM")  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                         peft_config=peft, callbacks=[LogLastStep(), *callbacks])  # fmt: skip
    last = get_last_checkpoint(str(work_dir)) if work_dir.is_dir() else None
    if last:
        log.info("cold start: resuming from %s", last)
    start = time.perf_counter()
    result = trainer.train(resume_from_checkpoint=last)
    if trainer.state.global_step < steps:
        raise RagLabError(
            f"cold start: training stopped at step {trainer.state.global_step} of {steps}; the next call "
            f"resumes from the last checkpoint in {work_dir}"
        )
    logs = [row for row in trainer.state.log_history if "loss" in row]
    lengths = [len(ids) for ids in dataset["input_ids"]]
    return trainer, {
        "steps": steps,
        "resumed_from": int(Path(last).name.split("-")[-1]) if last else None,
        "seconds": time.perf_counter() - start,
        "rows": len(lengths),
        "mean_length": sum(lengths) / len(lengths),
        "final_loss": logs[-1]["loss"],
        "mean_loss": result.training_loss,
        "losses": [{"step": row["step"], "loss": row["loss"]} for row in logs],
        "trainable_parameters": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
    }


# ---- cached, resumable cold start ----------------------------------------------------------------------


def content_hash(*dirs: str | Path) -> str:
    """A hash of every file under ``dirs`` (relative path and bytes; a folder inside another counts once):
    the base model's identity, wherever it lies."""
    roots = sorted({Path(d).resolve() for d in dirs})
    roots = [r for r in roots if not any(o != r and o in r.parents for o in roots)]
    digest = hashlib.sha256()
    for root in roots:
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            digest.update(f"{path.relative_to(root)}\0".encode())
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
    return digest.hexdigest()


def cold_start(
    model: str | Path,
    data,
    config: ColdStartConfig,
    cache_dir: str | Path,
    tokenizer: str | Path | None = None,
    chat: bool | None = None,
    retriever=None,
    teacher=None,
    callbacks: Sequence["TrainerCallback"] = (),
) -> Path:
    """The base causal LM ``model`` (a directory or a cached hub name; ``tokenizer``: its tokenizer's
    directory, default the model's) fine-tuned on rejection-sampled demonstrations of
    ``config.protocols`` on ``data``; the directory of the result. ``chat``: chat prompts (null: when
    the tokenizer has a chat template, as ``HFGenerator`` decides). ``retriever``: the one the
    demonstrations search with (default BM25). A finished result is returned without training; a
    killed one resumes. ``callbacks``: extra ``TrainerCallback``s."""
    from transformers import AutoTokenizer

    from rag_lab.retrievers.dense import resolve_model

    model_dir = Path(resolve_model(str(model)))
    tokenizer_dir = Path(resolve_model(str(tokenizer))) if tokenizer else model_dir
    if chat is None:
        chat = bool(AutoTokenizer.from_pretrained(tokenizer_dir).chat_template)
    demos = demonstrations(data, config, cache_dir, chat, retriever, teacher)
    if not demos.pairs:
        raise RagLabError(
            f"cold start: the teacher kept no episode of {', '.join(config.protocols)}: {demos.counts}"
        )
    base = content_hash(model_dir, tokenizer_dir)
    settings = asdict(config)
    key = hashlib.sha256(json.dumps([base, demos.fingerprint, settings, chat]).encode()).hexdigest()[:16]
    out = Path(cache_dir).expanduser() / "cold_start" / key
    if (out / "train.json").exists():
        log.info("cold start: reusing %s", out)
        return out
    work = out.with_name(f"{key}.work")
    # A tokenizer kept apart from its model stays apart (next to a qwen2 config, AutoTokenizer would
    # load another tokenizer class: the tiny LM's word-level one lives in <model>/tokenizer).
    tokenizer_sub = "." if tokenizer_dir == model_dir else "tokenizer"
    start = time.perf_counter()
    log.info("cold start: %d pairs into %s", len(demos.pairs), out)
    with publish(out) as tmp:
        trainer, stats = sft(model_dir, tokenizer_dir, demos.pairs, config, work, callbacks)
        trained = trainer.model.merge_and_unload() if config.lora and config.lora.r else trainer.model
        trained.save_pretrained(tmp)
        trainer.processing_class.save_pretrained(tmp / tokenizer_sub)
        info = {
            "base": {"model": str(model_dir), "tokenizer": str(tokenizer_dir), "hash": base},
            "chat": chat,
            "tokenizer": tokenizer_sub,
            "settings": settings,
            "demonstrations": {"hash": demos.fingerprint, "pairs": len(demos.pairs), "counts": demos.counts},
            "sft": stats,
            "wall_s": time.perf_counter() - start,
            "versions": _versions(),
        }
        (tmp / "train.json").write_text(json.dumps(info, indent=1) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    return out


def load(path: str | Path, **settings) -> "HFGenerator":
    """A cold-started model as an ``HFGenerator`` (its tokenizer and chat setting as trained);
    ``settings``: HFGenerator's others (batch_size, seed, ...)."""
    from rag_lab.generators.hf import HFGenerator

    path = Path(path)
    info = json.loads((path / "train.json").read_text())
    return HFGenerator(str(path), str(path / info["tokenizer"]), chat=info["chat"], **settings)


def _versions() -> dict[str, str]:
    import peft
    import transformers
    import trl

    return {m.__name__: m.__version__ for m in (torch, transformers, trl, peft)}


HELP = """python -m rag_lab.train.cold_start: fine-tune the generator's model (generator=tiny, smollm2, or hf
generator.model=<dir>) on the world teacher's rejection-sampled demonstrations (data=synth), cached under
cache_dir/cold_start/; print the result's directory (load it with generator=hf generator.model=<dir>).

Examples:
  python -m rag_lab.train.cold_start generator=tiny cold_start.protocols=[dapo]
  python -m rag_lab.train.cold_start generator=smollm2 cold_start.protocols=[apex_exec] cold_start.lora.r=16

The options below are set as cold_start.<key>=<value>; any key of the run config too (data.*, cache_dir,
seed). The defaults go to the whole training split: about 100 s of teacher rollouts on 2 cores, cached."""


def main(argv: list[str] | None = None) -> None:
    """The command line (:data:`HELP`)."""
    from hydra.utils import instantiate

    from rag_lab.config import cli_overrides, compose
    from rag_lab.errors import one_line_errors

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with one_line_errors():
        overrides = cli_overrides(list(sys.argv[1:] if argv is None else argv), HELP, "cold_start/default")
        picked = any(o.lstrip("+").startswith("cold_start=") for o in overrides)
        overrides = [f"+{o}" if o.startswith("cold_start=") else o for o in overrides]
        cfg = compose(([] if picked else ["+cold_start=default"]) + overrides)
        if not cfg.generator:
            raise RagLabError(
                "cold start: set generator=<the base LM> (tiny, smollm2, hf generator.model=...)"
            )
        data = instantiate(cfg.data)
        base = instantiate(cfg.generator, **({"data": data} if "data" in cfg.generator else {}))
        if not hasattr(base, "model") or not hasattr(base, "tokenizer"):
            raise RagLabError(f"cold start: generator {cfg.generator._target_} is not a transformers model")
        out = cold_start(base.model.name_or_path, data, instantiate(cfg.cold_start), cfg.cache_dir,
                         tokenizer=base.tokenizer.name_or_path, chat=base.chat)  # fmt: skip
    tokenizer = json.loads((out / "train.json").read_text())["tokenizer"]
    hint = f" generator.tokenizer={out / tokenizer}" if tokenizer != "." else ""
    log.info("load it with: generator=hf generator.model=%s%s", out, hint)
    print(out)


if __name__ == "__main__":
    main()
