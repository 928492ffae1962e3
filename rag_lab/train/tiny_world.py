"""The recipe of ``generator=tiny`` (the embedded default LM) on the world: :func:`train`.

Data: the corpus (pretraining texts, ``title\\ntext``), reading items built from its pages
(:mod:`rag_lab.train.tiny_reading`) and the world teacher's demonstrations of every protocol on the
*training* questions (rag_lab.train.demonstrations; BM25 retrieval, ``k`` passages per search,
Stop-RAG pipelines of ``iterations``). Training: ``train_tiny_lm`` (rag_lab.train.tiny_lm). The
checkpoint lives under ``cache_dir/tiny_lm/<hash of config and data>``, so the first run trains it and
every later run with the same world and sizes reuses it; ``train_seed`` (not the run's seed) seeds
training, so runs over several seeds share one LM. The shipped one: :mod:`rag_lab.train.ship`; loading
it: :mod:`rag_lab.generators.tiny`. The result is an ordinary ``HFGenerator`` with plain-text prompts
(no chat template).
"""

import hashlib
import json
import logging
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path

from rag_lab.env.protocols.base import PROTOCOLS
from rag_lab.errors import RagLabError
from rag_lab.train.demonstrations import collect, sample
from rag_lab.env.teacher.generator import TeacherGenerator
from rag_lab.retrievers.bm25 import BM25Retriever
from rag_lab.train.tiny_lm import TinyConfig, fingerprint, train_tiny_lm, tune_tiny_lm
from rag_lab.train.tiny_reading import (
    DRILLS,
    READING_LAYOUTS,
    TAGS,
    draw_reading,
    intermediate_reading_item,
    name_words,
    page_facts,
    page_kinds,
    page_neighbours,
    qa_reading_item,
    reading_pages,
    renamer,
    shuffle_questions,
)

log = logging.getLogger(__name__)


def train(
    data,
    cache_dir: str,
    # demonstrations per protocol, in words (sampled from the teacher's rollouts on the training split)
    words_per_protocol: int = 60_000,
    k: int = 3,
    iterations: int = 6,
    # the protocols to demonstrate (null: every protocol)
    protocols: list[str] | None = None,
    hidden: int = 64,
    layers: int = 4,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 256,
    max_length: int = 1024,
    copy_steps: int = 2000,
    # a reading stage first: renamed pages with all their questions, answer-only loss (0: none)
    reading_steps: int = 0,
    reading_batch_size: int = 32,
    # the reading items' layout, or a list of layouts taking turns batch by batch: "drill"
    # (reading_pages), "qa" (qa_reading_item, up to reading_max_pages), "stoprag_intermediate" (one page,
    # one question, Stop-RAG's question-first prompt), "demos" (every teacher demonstration, renamed),
    # "traces" (the same, loss on every token: trace_item)
    reading_layout: str | Sequence[str] = "drill",
    reading_max_pages: int = 3,
    # questions per qa reading item, at most (about any of its pages)
    reading_max_questions: int = 6,
    # qa reading items ask one relation of every page that states it first (qa_reading_item's contrast)
    reading_contrast: bool = False,
    # a protocol stage last, cached apart (the model before it is reused): tune_steps batches of
    # reading_batch_size in tune_layout (the reading layouts; "demos:<protocol>" weights a protocol), at
    # tune_lr, each completion ending with its protocol's stop (0: none)
    tune_steps: int = 0,
    tune_layout: str | Sequence[str] = "demos",
    tune_lr: float = 1e-3,
    pretrain_steps: int = 500,
    pretrain_length: int = 256,
    # demonstrations up to this many words also go into pretraining (0: the corpus only)
    pretrain_demo_words: int = 80,
    # passes over the demonstrations (the SFT step count follows from it and the batch size)
    epochs: float = 1.0,
    batch_size: int = 8,
    lr: float = 1e-3,
    warmup_steps: int = 50,
    completion_only_loss: bool = False,
    # multi-word entity names (titles) as one token each (true), or as their words (false: each name part
    # is a frequent word; copied far sooner, experiments/results/tiny_lm.md)
    whole_names: bool = True,
    # the names' embeddings: drawn at this std (0: the model's init) and kept frozen (TinyConfig)
    name_std: float = 0.0,
    freeze_names: bool = False,
    # the names' words as their syllables (Lia ##kria ##burg: build_tokenizer's pieces), not one token each
    name_pieces: bool = False,
    # SFT also on single-page reading drills from the corpus (reading_drills)
    drills: bool = False,
    # each SFT example gets its entities renamed at random (renamer), a fresh renaming per epoch
    rename_entities: bool = False,
    train_seed: int = 0,
) -> Path:
    """The recipe: the tiny LM trained on ``data`` (cached under ``cache_dir/tiny_lm/<hash>``); its path."""
    layouts = _layouts(reading_layout, protocols, "reading_layout")
    tune_layouts = _layouts(tune_layout, protocols, "tune_layout") if tune_steps else []
    # the layouts of the stages that run
    bases = {layout.partition(":")[0] for layout in [*(layouts if reading_steps else []), *tune_layouts]}
    texts = [p.contents for p in data.corpus]
    retriever = BM25Retriever(data.corpus, cache_dir=cache_dir)
    by_protocol = collect(TeacherGenerator(data), data.corpus, retriever, data.split("train"), k, iterations)
    pairs = sample(by_protocol, words_per_protocol, protocols, seed=train_seed)
    facts = page_facts(data) if drills or rename_entities or reading_steps or tune_steps else []
    if drills:
        pairs += [pair for layout in layouts if layout in DRILLS for pair in DRILLS[layout](facts)]
    n_pairs = len(pairs)
    # Renaming keeps each entity's kind (a country becomes another country), as the world does.
    entities = sorted(set(data.corpus.titles))
    rename, rng = renamer(entities, page_kinds(facts)), random.Random(train_seed)
    if rename_entities:
        pairs = [rename(pair, rng) for _ in range(math.ceil(epochs)) for pair in pairs]
    # The reading stage always renames: its drills are the corpus's own facts, so with real names a
    # model memorises them (held-out 0.36 vs train 0.75, experiments/results/tiny_lm.md) instead of
    # reading.
    neighbours = page_neighbours(facts, retriever, 4) if "qa" in bases else []
    pool = reading_pages(facts) if "drill" in bases else []
    chosen = {
        name: demos for name, demos in sorted(by_protocol.items()) if protocols is None or name in protocols
    }
    # "demos"/"traces": every demonstration the teacher gave (not only the SFT sample), one protocol per
    # batch (a random one, or the one the layout names).
    wanted = {"demos", "traces"} & bases
    demo_pools = {name: sorted(d.items()) for name, d in chosen.items()} if wanted else {}
    for layout in [*layouts, *tune_layouts]:
        if ":" in layout and demo_pools and layout.partition(":")[2] not in demo_pools:
            raise RagLabError(
                f"generator: layout {layout!r}: the teacher gave no demonstrations of that protocol"
                f" (it gave {', '.join(demo_pools)})"
            )

    def draws(rng: random.Random) -> dict[str, Callable[[], tuple[str, ...]]]:
        return {
            "drill": lambda: shuffle_questions(rng.choice(pool), rng),
            "qa": lambda: qa_reading_item(
                facts,
                rng.randrange(len(facts)),
                neighbours,
                rng,
                reading_max_pages,
                reading_max_questions,
                reading_contrast,
            ),
            "stoprag_intermediate": lambda: intermediate_reading_item(facts, rng.randrange(len(facts)), rng),
        }

    reading = draw_reading(
        layouts, reading_steps, reading_batch_size, draws(rng), demo_pools, rename, rng, train_seed
    )
    # Short demonstrations (all of them, prompt + completion) join the corpus in pretraining: packed
    # and cheap, they are where the model first learns to copy a name from its context.
    for demos in chosen.values():
        texts += [p + c for p, c in sorted(demos.items()) if len((p + c).split()) <= pretrain_demo_words]
    config = TinyConfig(
        hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, intermediate=intermediate,
        max_length=max_length, copy_steps=copy_steps, reading_steps=reading_steps,
        reading_batch_size=reading_batch_size, pretrain_steps=pretrain_steps,
        pretrain_length=pretrain_length,
        sft_steps=math.ceil(epochs * n_pairs / batch_size), batch_size=batch_size, lr=lr,
        warmup_steps=warmup_steps, seed=train_seed, completion_only_loss=completion_only_loss,
        name_std=name_std, freeze_names=freeze_names,
    )  # fmt: skip
    # whole_names: entity names (multi-word titles) become single tokens, so copying one is a one-token
    # act; but each is then a rare token, and under renaming the names of a kind are interchangeable.
    names = sorted({title for title in data.corpus.titles if " " in title}) if whole_names else []
    pieces = name_words(entities, texts) if name_pieces else set()
    data_hash = fingerprint(texts, pairs, TAGS, names, reading, entities, config.anchored, pieces)
    key = json.dumps([asdict(config), data_hash])
    out = Path(cache_dir).expanduser() / "tiny_lm" / hashlib.sha256(key.encode()).hexdigest()[:16]
    if not out.exists():
        log.info("training the tiny LM (%d texts, %d demonstrations) into %s", len(texts), len(pairs), out)
    path = train_tiny_lm(texts, pairs, config, out, TAGS, names, reading, entities, pieces)
    if tune_steps:
        # The protocol stage, cached apart: the model above (reused when cached) trained on. Its own
        # random stream, so its items do not depend on the stages before; they end with the protocol's
        # stop (nothing after it teaches where a completion ends).
        tune_rng = random.Random(train_seed + 1)
        tuning = draw_reading(
            tune_layouts, tune_steps, reading_batch_size, draws(tune_rng), demo_pools, rename, tune_rng,
            train_seed, stops=True,
        )  # fmt: skip
        tune_config = replace(config, reading_steps=tune_steps, lr=tune_lr)
        tune_hash = fingerprint([], [], (), reading=tuning, entities=entities)
        key = json.dumps([path.name, asdict(tune_config), tune_hash])
        out = Path(cache_dir).expanduser() / "tiny_lm" / hashlib.sha256(key.encode()).hexdigest()[:16]
        if not out.exists():
            log.info("training the tiny LM's protocol stage (%d steps) on %s into %s", tune_steps, path, out)
        path = tune_tiny_lm(path, tuning, tune_config, out, tune_hash, entities)
    return path


def _layouts(value: str | Sequence[str], protocols: list[str] | None, field: str) -> list[str]:
    """generator.<field> as a list of layouts, each checked: a one-line error names a bad one."""
    layouts = [value] if isinstance(value, str) else list(value)
    for layout in layouts:
        base, named, protocol = layout.partition(":")
        if base not in READING_LAYOUTS or (named and base not in ("demos", "traces")):
            raise RagLabError(
                f"generator.{field}: {layout!r} is not one of {', '.join(READING_LAYOUTS)}"
                " (or demos:<protocol>, traces:<protocol>)"
            )
        if named and protocol not in PROTOCOLS:
            raise RagLabError(
                f"generator.{field}: {layout!r} names no protocol (known: {', '.join(sorted(PROTOCOLS))})"
            )
        if named and protocols is not None and protocol not in protocols:
            raise RagLabError(
                f"generator.{field}: {layout!r} names a protocol that generator.protocols"
                f" ({', '.join(protocols)}) leaves out"
            )
    return layouts
