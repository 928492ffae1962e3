"""Cold start: supervised fine-tuning of any causal LM on rejection-sampled teacher demonstrations.

Follows R3-RAG's cold start (arXiv:2505.23794 sec. 3.2, algorithms 1 and 2): a strong teacher rolls out
several trajectories per training question at varied temperature; a trajectory is kept only when
its final answer is correct and every step is well formed; each kept trajectory of L steps gives L
(prompt = question + the steps so far, completion = the next step) SFT pairs. APEX's executor SFT
on filtered teacher traces is the same recipe on the ``apex_exec`` protocol (``protocols`` picks the
formats; ``cold_start=r3rag_cs`` and ``cold_start=apex_executor`` are the comparison's). DAPO and EVO-RAG
can start from one too (``policy.cold_start``), though their papers start from instruct models, as
``compare_synth`` does.

- The pairs: :mod:`rag_lab.train.demonstrations` (the teacher, the rejection, their cache).
- SFT is TRL's ``SFTTrainer`` (:func:`rag_lab.train.sft.sft`; optionally with a PEFT LoRA adapter, merged
  into the saved model), loss on the completion only, float32 unless bf16 is asked for or a GPU has it.
- The config (:class:`ColdStartConfig`) is the demonstrations' settings and SFT's, each declared once
  (:class:`~rag_lab.train.demonstrations.DemoSettings`, :class:`~rag_lab.train.sft.SFTSettings`).

Hand-written, and why:

- The SFT rows (``rag_lab.train.sft.sft_dataset``): prompt and completion are tokenized apart
  and joined as ids, EOS after the completion, a long prompt cut from the left. Each prompt is given as
  the engine gives it at inference (:func:`rag_lab.env.fit.prompt_as_ids`, token in, token out): rendered
  by :func:`rag_lab.generators.base.render` (a chat's template) and tokenized; DAPO's later turns as the
  first prompt's ids, then each earlier turn's and each information block's, tokenized alone, as the
  engine appends them. Deviation from TRL's conversational prompt-completion format, on purpose:
  DAPO's later turns are a partial assistant message the model continues
  (``continue_final_message``); TRL would close that message and open a new assistant turn, so the
  model would train on a context it never sees.
- The cache (``<cache_dir>/cold_start/<key>``, :mod:`rag_lab.core.cache`: the base model's files, the pairs,
  the settings, the code; published in one rename) and the resume (Trainer checkpoints every
  ``save_steps`` in a ``.work`` dir beside it; a killed run resumes from the last one, and ends with
  the weights an uninterrupted run of the same seed gives). With the demonstrations' cache, a second
  call neither samples nor trains.
- Shipped cold starts (``rag_lab/checkpoints/cold_start/<key>``, written by ``--ship``): a run whose cache has
  no entry takes the shipped one whose key matches its own, then trains nothing (``make demo``'s two
  cold starts are shipped, so the demo does not pay their 3 min of SFT). That key is the cache key without
  the code: the base model's files, the demonstrations (their content), the settings and the chat flag.
  The SFT code is not in it on purpose (a shipped file cannot follow every edit); ``ship.json`` records
  the code digest that made it and each file's sha256, checked before it is used. ``make tiny-lm``
  rebuilds it.

``python -m rag_lab.train.cold_start generator=tiny cold_start.protocols=[dapo]`` prints the model's
directory; ``generator=hf generator.model=<dir>`` loads it (with ``generator.tokenizer=<dir>/tokenizer``
for a base whose tokenizer lived in its own folder, as the tiny LM's does: :func:`load` knows which).
"""

import json
import logging
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from rag_lab.core import cache
from rag_lab.core.errors import RagLabError
from rag_lab.train.demonstrations import DemoSettings, chosen_protocols, demonstrations
from rag_lab.train.lora import lora_settings
from rag_lab.train.parallel import processes, publish_on_main
from rag_lab.train.resume import readable
from rag_lab.train.sft import SFTSettings, sft
from rag_lab.train.sharded import saveable

if TYPE_CHECKING:
    from transformers import TrainerCallback

    from rag_lab.generators.hf import HFGenerator

log = logging.getLogger(__name__)

# The shipped cold starts, one folder each (their key: :func:`shipped_key`), and each one's card.
SHIPPED = cache.PACKAGE_DIR / "checkpoints" / "cold_start"
SHIP_CARD = "ship.json"


@dataclass(frozen=True)
class ColdStartConfig(SFTSettings, DemoSettings):
    """``conf/cold_start/default.yaml``: which demonstrations (:class:`DemoSettings`), then how SFT trains on
    them (:class:`SFTSettings`); ``seed`` seeds both."""

    @staticmethod
    def check_settings(s: dict, run) -> list[tuple[str, str]]:
        """Training that would not train (:mod:`rag_lab.core.config`)."""
        problems = []
        try:
            chosen_protocols(list(s["protocols"]))
        except RagLabError as e:
            problems.append(("protocols", str(e).removeprefix("cold_start.protocols: ")))
        if s["epochs"] <= 0 and not s["max_steps"]:
            problems.append(("epochs", f"{s['epochs']} with max_steps 0: no training step"))
        problems += lora_settings(s.get("lora"))
        return problems


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
    # under launch every process samples its share of the episodes and gets them all (demonstrations)
    demos = demonstrations(data, config, cache_dir, chat, retriever, teacher)
    if not demos.pairs:
        raise RagLabError(
            f"cold start: the teacher kept no episode of {', '.join(config.protocols)}: {demos.counts}"
        )
    base = cache.files_digest(model_dir, tokenizer_dir)
    out = cache.path(
        cache_dir, "cold_start", base, demos.fingerprint, config, chat, code="rag_lab.train.cold_start"
    )
    if (out / "train.json").exists():
        log.info("cold start: reusing %s", out)
        return out
    shipped = SHIPPED / shipped_key(base, demos.fingerprint, config, chat)
    if (shipped / SHIP_CARD).exists():
        card = json.loads((shipped / SHIP_CARD).read_text())
        cache.check_folder(shipped, card.get("files"), shipped / SHIP_CARD, "`make tiny-lm`")
        with cache.publish(out) as tmp:
            shutil.copytree(shipped, tmp, dirs_exist_ok=True)
        log.info("cold start: the shipped %s fits this run (base model, demonstrations, settings)", shipped)
        return out
    work = out.with_name(f"{out.name}.work")
    # A tokenizer kept apart from its model stays apart (next to a qwen2 config, AutoTokenizer would
    # load another tokenizer class: the tiny LM's word-level one lives in <model>/tokenizer).
    tokenizer_sub = "." if tokenizer_dir == model_dir else "tokenizer"
    start = time.perf_counter()
    log.info("cold start: %d pairs into %s", len(demos.pairs), out)
    # every process trains (its share of each batch); the main one publishes the result
    trainer, stats = sft(model_dir, tokenizer_dir, demos.pairs, config, work, callbacks)
    trained = saveable(trainer.model, trainer.accelerator)  # LoRA merged; a collective under FSDP / ZeRO-3

    def write() -> None:
        with cache.publish(out) as tmp:
            trained.save_pretrained(tmp)
            trainer.processing_class.save_pretrained(tmp / tokenizer_sub)
            info = {
                "base": {"model": str(model_dir), "tokenizer": str(tokenizer_dir), "hash": base},
                "chat": chat,
                "tokenizer": tokenizer_sub,
                "settings": asdict(config),
                "demonstrations": {
                    "hash": demos.fingerprint,
                    "pairs": len(demos.pairs),
                    "counts": demos.counts,
                },
                "sft": stats | {"processes": processes()},
                "wall_s": time.perf_counter() - start,
                "versions": _versions(),
            }
            (tmp / "train.json").write_text(json.dumps(info, indent=1) + "\n")
        shutil.rmtree(work, ignore_errors=True)

    publish_on_main(write)
    return out


def shipped_key(base: str, demos: str, config: ColdStartConfig, chat: bool) -> str:
    """The key of a shipped cold start: the cache key's parts (the base model's files digest ``base``,
    the demonstrations' fingerprint ``demos``, the settings, ``chat``) without the code digest."""
    return cache.key(base, demos, config, chat)


def ship(trained: Path) -> Path:
    """Copy the cold start ``trained`` (a cache entry :func:`cold_start` returned) into :data:`SHIPPED`, with
    a card (``ship.json``: its key's parts, the code digest that made it, each file's sha256); the folder."""
    info = json.loads((trained / "train.json").read_text())
    config = ColdStartConfig(**info["settings"])
    key = shipped_key(info["base"]["hash"], info["demonstrations"]["hash"], config, info["chat"])
    out = SHIPPED / key
    with cache.publish(out.with_name(f"{key}.new")) as tmp:
        for item in trained.iterdir():
            copy = shutil.copytree if item.is_dir() else shutil.copy2
            copy(item, tmp / item.name)
        card = {
            "key": key,
            "base": info["base"]["hash"],
            "demonstrations": info["demonstrations"]["hash"],
            "settings": info["settings"],
            "chat": info["chat"],
            "code": cache.code_digest("rag_lab.train.cold_start"),
            "files": cache.folder_digests(tmp),
        }
        (tmp / SHIP_CARD).write_text(json.dumps(card, indent=1) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    out.with_name(f"{key}.new").rename(out)
    return out


def load(path: str | Path, **settings) -> "HFGenerator":
    """A cold-started model as an ``HFGenerator`` (its tokenizer and chat setting as trained);
    ``settings``: HFGenerator's others (batch_size, seed, ...)."""
    from rag_lab.generators.hf import HFGenerator

    path = readable(Path(path), "cold start")
    info = json.loads((path / "train.json").read_text())
    return HFGenerator(str(path), str(path / info["tokenizer"]), chat=info["chat"], **settings)


def _versions() -> dict[str, str]:
    import peft
    import transformers
    import trl

    return {m.__name__: m.__version__ for m in (torch, transformers, trl, peft)}
