"""The recipe of ``generator=tiny`` (the embedded default LM) on the world: :func:`train`, with the
settings of :class:`Recipe` (their defaults are the shipped checkpoint's).

Data: reading items built from the corpus pages (:mod:`rag_lab.train.tiny.reading`) and the world
teacher's demonstrations of every protocol on the *training* questions (:mod:`rag_lab.train.
demonstrations`: BM25 retrieval, ``k`` passages per search, Stop-RAG pipelines of ``iterations``).
Stages (:mod:`rag_lab.train.tiny.model`): reading over renamed pages and demonstrations, SFT on the
demonstrations (and single-page drills), then, on the finished model (:mod:`rag_lab.train.tiny.later`), a
protocol stage, a chain stage (chain-of-thought over gold passages) and a generalist stage (issue 64: every
protocol's demonstrations the generalist's, ``generator=generalist``: the world teacher's reading without
the answer key's plans and searches, so that the methods start where the papers' instruct models do).
Each model lives under ``cache_dir/tiny_lm/<key>`` (:func:`rag_lab.core.cache.path`: its config, its data's
fingerprint, this code), each later stage's apart, so the first run trains them and every later run with
the same world and settings reuses them; ``train_seed`` (not the run's seed) seeds training, so runs over
several seeds share one LM. The shipped one: :mod:`rag_lab.train.tiny.ship`; loading it:
:mod:`rag_lab.train.tiny.generator`. experiments/results/tiny_lm.md says how the recipe was found (and
what the switches it no longer has measured).
"""

import logging
import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path

from rag_lab.core import cache
from rag_lab.core.config import takes
from rag_lab.train.demonstrations import sample, teacher_demonstrations
from rag_lab.train.parallel import main_first
from rag_lab.train.tiny.later import (
    chain_stage,
    check_layouts,
    generalist_stage,
    oracle_chains,  # noqa: F401 (part of this module's interface: the chain stage's cot pool)
    protocol_stage,
    reading_source,
)
from rag_lab.train.tiny.model import TinyConfig
from rag_lab.train.tiny.reading import (
    DRILLS,
    TAGS,
    name_words,
    page_facts,
    page_kinds,
    renamer,
)
from rag_lab.train.tiny.settings import Recipe
from rag_lab.train.tiny.trainer import fingerprint, train_tiny_lm

log = logging.getLogger(__name__)


@takes(Recipe)
def train(
    data,
    cache_dir: str,
    # a shipped model of this recipe before that stage, to start the stages from there on from (found by
    # generator=tiny itself when one fits; null: train every stage)
    before_chain: Path | None = None,
    before_generalist: Path | None = None,
    **settings,
) -> Path:
    """The recipe: the tiny LM trained on ``data`` (cached under ``cache_dir/tiny_lm/<key>``); its path.
    ``settings``: :class:`Recipe`'s. ``before_chain`` / ``before_generalist``: a model of this recipe's
    stages before the chain / generalist stage (a shipped checkpoint whose recipe is this one without that
    stage and the ones after it): the stages from there on start from it instead of training the earlier
    ones again."""
    recipe = Recipe(**settings)
    if before_generalist is not None and recipe.generalist_steps:
        return generalist_stage(before_generalist, data, cache_dir, recipe)
    layouts = check_layouts(recipe.reading_layout, recipe.protocols, "reading_layout")
    tune_layouts = (
        check_layouts(recipe.tune_layout, recipe.protocols, "tune_layout") if recipe.tune_steps else []
    )
    chain_layouts = (
        check_layouts(recipe.chain_layout, recipe.protocols, "chain_layout") if recipe.chain_steps else []
    )
    with main_first():  # under launch: the main process builds the cache, the others read it
        by_protocol, retriever = teacher_demonstrations(data, cache_dir, recipe.k, recipe.iterations)
    needs_facts = recipe.drills or recipe.rename_entities or recipe.reading_steps or recipe.tune_steps
    facts = page_facts(data) if needs_facts or recipe.chain_steps else []
    entities = sorted(set(data.corpus.titles))
    # Renaming keeps each entity's kind (a country becomes another country), as the world does.
    rename = renamer(entities, page_kinds(facts))
    if before_chain is not None and recipe.chain_steps:
        path = chain_stage(
            before_chain, data, facts, retriever, by_protocol, rename, chain_layouts, cache_dir, recipe
        )
        return generalist_stage(path, data, cache_dir, recipe) if recipe.generalist_steps else path
    wanted = sorted(name for name in by_protocol if recipe.protocols is None or name in recipe.protocols)
    chosen = {name: by_protocol[name] for name in wanted}
    rng = random.Random(recipe.train_seed)
    demos = sample(by_protocol, recipe.words_per_protocol, recipe.protocols, seed=recipe.train_seed)
    pairs, sft_steps = _sft_pairs(demos, facts, layouts, rename, rng, recipe)
    running = [*(layouts if recipe.reading_steps else []), *tune_layouts]
    source = reading_source(facts, retriever, chosen, rename, running, recipe)
    # The reading stage always renames: its drills are the corpus's own facts, so with real names a
    # model memorises them (held-out 0.36 vs train 0.75, experiments/results/tiny_lm.md) instead of
    # reading.
    reading = source.items(layouts, recipe.reading_steps, recipe.reading_batch_size, rng, recipe.train_seed)
    texts = vocabulary_texts(data, chosen, recipe.vocab_demo_words)
    config = TinyConfig(
        hidden=recipe.hidden,
        layers=recipe.layers,
        heads=recipe.heads,
        kv_heads=recipe.kv_heads,
        intermediate=recipe.intermediate,
        max_length=recipe.max_length,
        reading_steps=recipe.reading_steps,
        reading_batch_size=recipe.reading_batch_size,
        sft_steps=sft_steps,
        batch_size=recipe.batch_size,
        lr=recipe.lr,
        warmup_steps=recipe.warmup_steps,
        seed=recipe.train_seed,
        completion_only_loss=recipe.completion_only_loss,
    )
    pieces = name_words(entities, texts) if recipe.name_pieces else set()
    data_hash = fingerprint(texts, pairs, TAGS, reading, entities, pieces)
    out = cache.path(cache_dir, "tiny_lm", config, data_hash, code=__name__)
    if not out.exists():
        log.info("training the tiny LM (%d texts, %d demonstrations) into %s", len(texts), len(pairs), out)
    path = train_tiny_lm(texts, pairs, config, out, TAGS, reading, entities, pieces)
    if recipe.tune_steps:
        path = protocol_stage(path, source, tune_layouts, config, entities, cache_dir, recipe)
    if recipe.chain_steps:
        path = chain_stage(
            path, data, facts, retriever, by_protocol, rename, chain_layouts, cache_dir, recipe
        )
    if recipe.generalist_steps:
        path = generalist_stage(path, data, cache_dir, recipe)
    return path


def _sft_pairs(
    pairs: list[tuple[str, str]],
    facts: list,
    layouts: Sequence[str],
    rename: Callable,
    rng: random.Random,
    recipe: Recipe,
) -> tuple[list[tuple[str, ...]], int]:
    """The SFT stage's pairs (the sampled demonstrations, the drills of each reading layout, renamed
    afresh for each epoch) and its step count (``epochs`` passes over them)."""
    if recipe.drills:
        pairs = pairs + [pair for layout in layouts if layout in DRILLS for pair in DRILLS[layout](facts)]
    steps = math.ceil(recipe.epochs * len(pairs) / recipe.batch_size)
    if recipe.rename_entities:
        pairs = [rename(pair, rng) for _ in range(math.ceil(recipe.epochs)) for pair in pairs]
    return pairs, steps


def vocabulary_texts(data, chosen: dict[str, dict[str, str]], max_words: int) -> list[str]:
    """The texts the vocabulary is counted over besides the training items: every corpus page and every
    demonstration (prompt + completion) of up to ``max_words`` words. They train nothing; they count
    because the tokenizer orders its ids by frequency (the shipped checkpoint's vocabulary was counted
    so; they were once a pretraining stage's data, experiments/results/tiny_lm.md)."""
    texts = [p.contents for p in data.corpus]
    for demos in chosen.values():
        texts += [p + c for p, c in sorted(demos.items()) if len((p + c).split()) <= max_words]
    return texts
