"""The tiny LM's checkpoints: :func:`train_tiny_lm` runs the stages of :mod:`rag_lab.train.tiny.model`
into a model directory, :func:`tune_tiny_lm` adds the protocol stage to a trained one.

Each directory is published in one rename when training has finished (:func:`rag_lab.core.cache.publish`;
under ``launch`` every process trains the same model on its share of each batch and the main one publishes:
:func:`publishing`),
and records in ``train.json`` the config, the data's fingerprint (:func:`fingerprint`), the stats of
every stage and the library versions; one that exists is reused only when its config and data match.
Hand-written: transformers' ``Trainer`` checkpoints a run, not a recipe's stages.
"""

import json
import tempfile
import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from itertools import chain
from pathlib import Path

import torch

from rag_lab.core import cache
from rag_lab.core.devices import local_gpu
from rag_lab.core.errors import RagLabError
from rag_lab.train.parallel import barrier, is_main, processes
from rag_lab.train.sharded import saveable
from rag_lab.train.tiny.model import TinyConfig, build_model, read, sft_stage
from rag_lab.train.tiny.tokenizer import build_tokenizer, one_token_names


def fingerprint(
    texts: Sequence[str],
    pairs: Sequence[tuple[str, ...]],
    special_tokens: Sequence[str],
    reading: Sequence[tuple[str, ...]] = (),
    entities: Sequence[str] = (),
    pieces: Collection[str] = (),
) -> str:
    """The training data's digest (:func:`rag_lab.core.cache.text_digest`). The entities change the reading
    labels only, so they count only with reading items; ``pieces`` (build_tokenizer's) only when there
    are some."""
    held = [*pairs, *reading, *([tuple(entities)] if reading else [])]
    tokenizer = [list(special_tokens), *([sorted(pieces)] if pieces else [])]
    return cache.text_digest(json.dumps([list(texts), [list(p) for p in held], *tokenizer]))[:16]


@contextmanager
def publishing(out_dir: Path) -> Iterator[Path]:
    """:func:`rag_lab.core.cache.publish` in the main process; in the others of a launched run (which train
    the same model beside it) a scratch dir that is dropped. Every process leaves once the main one
    published."""
    if is_main():
        with cache.publish(out_dir) as tmp:
            yield tmp
    else:
        with tempfile.TemporaryDirectory() as tmp:
            yield Path(tmp)
    barrier()


def train_tiny_lm(
    texts: Sequence[str],
    pairs: Sequence[tuple[str, str]],
    config: TinyConfig,
    out_dir: Path,
    special_tokens: Sequence[str] = (),
    reading: Sequence[tuple[str, ...]] = (),
    entities: Sequence[str] = (),
    pieces: Collection[str] = (),
) -> Path:
    """Train the tiny LM into ``out_dir`` (model, ``tokenizer/``, ``train.json``), or reuse it.

    Stages, each skipped at 0 steps: reading (one pass over ``reading``; ``entities``, the world's
    names, are reading targets only where they repeat), then SFT on ``pairs``. The vocabulary is every
    piece of ``texts`` (text that trains nothing but is counted: token ids follow the counts), ``pairs``
    and ``reading``, plus ``special_tokens`` (``pieces`` cut into syllables). ``out_dir`` appears in
    one rename when training has finished (a killed run leaves only a ``.name.*`` temp dir beside it);
    one that exists is returned as is, after checking that ``train.json`` names the same config and
    data (else ``RagLabError``: a stale model is never served).
    """
    out_dir = Path(out_dir)
    data = fingerprint(texts, pairs, special_tokens, reading, entities, pieces)
    if out_dir.exists():
        _check_reuse(out_dir, config, data)
        return out_dir
    if config.sft_steps and not pairs:
        raise RagLabError("tiny LM: SFT needs pairs (or set sft_steps=0)")
    if config.reading_steps and not reading:
        raise RagLabError("tiny LM: reading_steps needs reading items (or set reading_steps=0)")
    start = time.perf_counter()
    with publishing(out_dir) as tmp:
        texts_seen = chain(texts, chain.from_iterable(pairs), chain.from_iterable(reading))
        tokenizer = build_tokenizer(texts_seen, special_tokens, pieces)
        tokenizer.save_pretrained(tmp / "tokenizer")
        model = build_model(tokenizer, config).to(training_device())
        stats: dict = {
            "config": asdict(config),
            "data": data,
            "texts": len(texts),
            "pairs": len(pairs),
            "special_tokens": list(special_tokens),
            "vocab_size": len(tokenizer),
            "parameters": sum(p.numel() for p in model.parameters()),
            "device": device_name(),
            "processes": processes(),
        }
        if config.reading_steps:
            stats["reading"] = read(model, tokenizer, reading, config, one_token_names(tokenizer, entities))
        if config.sft_steps:
            stats["sft"] = sft_stage(model, tokenizer, pairs, config, tmp / "trainer")
        saved = saveable(model)  # under FSDP the SFT stage sharded it: its full weights, on the main process
        if saved is not None:
            saved.save_pretrained(tmp)
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
    with publishing(out_dir) as tmp:
        torch.manual_seed(config.seed)
        tokenizer = AutoTokenizer.from_pretrained(base_dir / "tokenizer")
        model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).to(training_device())
        known = one_token_names(tokenizer, entities)
        stats = {
            "config": asdict(config),
            "data": data,
            "base": base_dir.name,
            "base_wall_s": base.get("total_wall_s", base["wall_s"]),
            "parameters": base["parameters"],
            "vocab_size": len(tokenizer),
            "device": device_name(),
            "processes": processes(),
        }
        stats["tune"] = read(model, tokenizer, items, config, known, "protocol stage")
        tokenizer.save_pretrained(tmp / "tokenizer")
        model.save_pretrained(tmp)
        stats["wall_s"] = time.perf_counter() - start
        stats["total_wall_s"] = stats["base_wall_s"] + stats["wall_s"]
        stats["versions"] = _versions()
        (tmp / "train.json").write_text(json.dumps(stats, indent=1) + "\n")
    return out_dir


def training_device() -> torch.device:
    """Where the recipe trains: the GPU when there is one (minutes there, hours on 2 cores; the
    numbers then differ from a CPU run's in the last bits, as float sums do), else the CPU. Inference
    stays on the CPU (generator=tiny's ``device: auto``)."""
    return torch.device(local_gpu() if torch.cuda.is_available() else "cpu")


def device_name() -> str:
    """The training device in words, for train.json and the model card."""
    if training_device().type == "cuda":
        return torch.cuda.get_device_name()
    return "cpu"


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
