"""The recipe of ``generator=tiny`` (the embedded default LM) on the world: :func:`train`, with the
settings of :class:`Recipe` (their defaults are the shipped checkpoint's).

Data: reading items built from the corpus pages (:mod:`rag_lab.train.tiny.reading`) and the world
teacher's demonstrations of every protocol on the *training* questions (:mod:`rag_lab.train.
demonstrations`: BM25 retrieval, ``k`` passages per search, Stop-RAG pipelines of ``iterations``).
Stages (:mod:`rag_lab.train.tiny.model`): reading over renamed pages and demonstrations, SFT on the
demonstrations (and single-page drills), then a protocol stage on the finished model. Each model lives
under ``cache_dir/tiny_lm/<key>`` (:func:`rag_lab.cache.path`: its config, its data's fingerprint, this
code), the protocol stage's apart, so the first run trains them and every later run with the same
world and settings reuses them; ``train_seed`` (not the run's seed) seeds training, so runs over
several seeds share one LM. The shipped one: :mod:`rag_lab.train.tiny.ship`; loading it:
:mod:`rag_lab.train.tiny.generator`. experiments/results/tiny_lm.md says how the recipe was found (and
what the switches it no longer has measured).
"""

import json
import logging
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from rag_lab import cache
from rag_lab.config import takes
from rag_lab.env.protocols.base import PROTOCOLS, identify
from rag_lab.env.teacher.generator import TeacherGenerator
from rag_lab.errors import RagLabError
from rag_lab.ranges import NonNegative, NonNegativeInt, Positive, PositiveInt
from rag_lab.retrievers.bm25 import BM25Retriever
from rag_lab.train.demonstrations import sample, teacher_demonstrations
from rag_lab.train.parallel import main_first
from rag_lab.train.tiny.model import TinyConfig, TinySizes
from rag_lab.train.tiny.reading import (
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
from rag_lab.train.tiny.trainer import fingerprint, train_tiny_lm, tune_tiny_lm

log = logging.getLogger(__name__)

TUNE_LAYOUT = (
    "demos:stoprag_query",
    "demos:stoprag_query",
    "demos:stoprag_final",
    "demos:stoprag_final",
    "stoprag_intermediate",
    "qa",
    "demos:dapo",
    "demos:evorag",
    "demos:r3rag",
    "demos:apex_plan",
    "demos:apex_exec",
    "demos:apex_final",
)
# The chain stage's layouts (issue 48: experiments/results/tiny_lm.md, "On a GPU"): the teacher's
# chain-of-thought over gold passages (demos:cot) beside the reading layouts, so that reading is kept, and
# every method loop's demonstrations, so that learning to chain does not unlearn the loops (with reading
# layouts alone beside cot, APEX's loop lost 5.6 Acc and EVO-RAG's 4.2).
CHAIN_LAYOUT = tuple(
    "demos:cot demos:cot demos:cot qa qa stoprag_intermediate demos:stoprag_query demos:stoprag_final"
    " demos:dapo demos:evorag demos:r3rag demos:apex_plan demos:apex_exec demos:apex_final".split()
)


@dataclass(frozen=True)
class Recipe(TinySizes):
    """The recipe's settings (``generator.*`` of conf/generator/tiny.yaml); the defaults are the shipped
    checkpoint's. The model's sizes (hidden, layers, heads, kv_heads, intermediate, max_length) are
    :class:`~rag_lab.train.tiny.model.TinySizes`'."""

    # demonstrations per protocol, in words (sampled from the teacher's rollouts on the training split)
    words_per_protocol: PositiveInt = 60_000
    k: PositiveInt = 3
    iterations: PositiveInt = 6
    # the protocols to demonstrate (null: every protocol)
    protocols: list[str] | None = None
    # the reading stage first: reading_steps batches of reading_batch_size items (0: none)
    reading_steps: NonNegativeInt = 6000
    reading_batch_size: PositiveInt = 32
    # the reading items' layout, or a list of layouts taking turns batch by batch: "drill" (reading_pages),
    # "qa" (qa_reading_item, up to reading_max_pages), "stoprag_intermediate" (one page, one question,
    # Stop-RAG's question-first prompt), "demos" (every teacher demonstration, renamed)
    reading_layout: str | Sequence[str] = ("qa", "stoprag_intermediate", "demos")
    reading_max_pages: PositiveInt = 5
    # questions per qa reading item, at most (about any of its pages)
    reading_max_questions: PositiveInt = 6
    # a protocol stage last, cached apart (the model before it is reused): tune_steps batches of
    # reading_batch_size in tune_layout (the reading layouts; "demos:<protocol>" weights a protocol), at
    # tune_lr, each completion ending with its protocol's stop (0: none)
    tune_steps: NonNegativeInt = 2000
    tune_layout: str | Sequence[str] = TUNE_LAYOUT
    tune_lr: Positive = 1e-3
    # a chain stage after it, cached apart: chain_steps batches of reading_batch_size in chain_layout at
    # chain_lr, where demos:cot draws the teacher's chain-of-thought over each training question's gold
    # passages (policy=oracle_rag policy.reader=cot) as well as over retrieved ones (IRCoT's) (0: none)
    chain_steps: NonNegativeInt = 5000
    chain_layout: str | Sequence[str] = CHAIN_LAYOUT
    chain_lr: Positive = 1e-3
    # the vocabulary (its token ids follow the counts) is counted over the corpus, the training items and
    # every demonstration of up to this many words (0: none); these texts train nothing
    vocab_demo_words: NonNegativeInt = 80
    # passes over the demonstrations (the SFT step count follows from it and the batch size)
    epochs: NonNegative = 1.0
    batch_size: PositiveInt = 16
    lr: Positive = 3e-3
    warmup_steps: NonNegativeInt = 50
    completion_only_loss: bool = True
    # the names' words as their syllables (Lia ##kria ##burg: build_tokenizer's pieces), not one token each
    name_pieces: bool = True
    # SFT also on single-page reading drills from the corpus, in each reading layout (DRILLS)
    drills: bool = True
    # each SFT example gets its entities renamed at random (renamer), a fresh renaming per epoch
    rename_entities: bool = True
    train_seed: int = 0


@dataclass
class Reading:
    """What the reading and protocol stages draw their items from (:meth:`items`)."""

    facts: list
    # each page's BM25 neighbours (the qa layout's other pages) and the drill layout's whole pages
    neighbours: list[list[int]]
    pages: list[tuple[str, ...]]
    # protocol -> the teacher's (prompt, completion) pairs (the demos layouts)
    demo_pools: dict[str, list[tuple[str, str]]]
    rename: Callable
    max_pages: int
    max_questions: int

    def items(
        self,
        layouts: Sequence[str],
        steps: int,
        size: int,
        rng: random.Random,
        seed: int,
        stops: bool = False,
    ) -> list[tuple[str, ...]]:
        """``steps`` batches of ``size`` items in ``layouts`` (:func:`draw_reading`), drawn with ``rng``."""
        facts = self.facts
        draws = {
            "drill": lambda: shuffle_questions(rng.choice(self.pages), rng),
            "qa": lambda: qa_reading_item(
                facts, rng.randrange(len(facts)), self.neighbours, rng, self.max_pages, self.max_questions
            ),
            "stoprag_intermediate": lambda: intermediate_reading_item(facts, rng.randrange(len(facts)), rng),
        }
        return draw_reading(layouts, steps, size, draws, self.demo_pools, self.rename, rng, seed, stops)


@takes(Recipe)
def train(data, cache_dir: str, before_chain: Path | None = None, **settings) -> Path:
    """The recipe: the tiny LM trained on ``data`` (cached under ``cache_dir/tiny_lm/<key>``); its path.
    ``settings``: :class:`Recipe`'s. ``before_chain``: a model of this recipe's stages before the chain
    stage (a shipped checkpoint whose recipe is this one with ``chain_steps=0``): the chain stage starts
    from it instead of training those stages again."""
    recipe = Recipe(**settings)
    layouts = _layouts(recipe.reading_layout, recipe.protocols, "reading_layout")
    tune_layouts = _layouts(recipe.tune_layout, recipe.protocols, "tune_layout") if recipe.tune_steps else []
    chain_layouts = (
        _layouts(recipe.chain_layout, recipe.protocols, "chain_layout") if recipe.chain_steps else []
    )
    with main_first():  # under launch: the main process builds the cache, the others read it
        by_protocol, retriever = teacher_demonstrations(data, cache_dir, recipe.k, recipe.iterations)
    needs_facts = recipe.drills or recipe.rename_entities or recipe.reading_steps or recipe.tune_steps
    facts = page_facts(data) if needs_facts or recipe.chain_steps else []
    entities = sorted(set(data.corpus.titles))
    # Renaming keeps each entity's kind (a country becomes another country), as the world does.
    rename = renamer(entities, page_kinds(facts))
    if before_chain is not None and recipe.chain_steps:
        return _chain_stage(
            before_chain, data, facts, retriever, by_protocol, rename, chain_layouts, cache_dir, recipe
        )
    wanted = sorted(name for name in by_protocol if recipe.protocols is None or name in recipe.protocols)
    chosen = {name: by_protocol[name] for name in wanted}
    rng = random.Random(recipe.train_seed)
    demos = sample(by_protocol, recipe.words_per_protocol, recipe.protocols, seed=recipe.train_seed)
    pairs, sft_steps = _sft_pairs(demos, facts, layouts, rename, rng, recipe)
    running = [*(layouts if recipe.reading_steps else []), *tune_layouts]
    source = _reading(facts, retriever, chosen, rename, running, recipe)
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
        path = _protocol_stage(path, source, tune_layouts, config, entities, cache_dir, recipe)
    if recipe.chain_steps:
        path = _chain_stage(
            path, data, facts, retriever, by_protocol, rename, chain_layouts, cache_dir, recipe
        )
    return path


def _chain_stage(
    base: Path,
    data,
    facts: list,
    retriever: BM25Retriever,
    by_protocol: dict[str, dict[str, str]],
    rename: Callable,
    layouts: list[str],
    cache_dir: str,
    recipe: Recipe,
) -> Path:
    """The chain stage, cached apart: the ``base`` model trained on ``layouts`` (the protocol stage's loop),
    its ``demos:cot`` pool the teacher's chain-of-thought over gold passages and IRCoT's over retrieved
    ones. Its own random stream (seed + 2), so its items do not depend on the stages before."""
    pools = dict(by_protocol)
    pools["cot"] = {**pools.get("cot", {}), **oracle_chains(data, data.split("train"))}
    source = _reading(facts, retriever, pools, rename, layouts, recipe)
    rng, size = random.Random(recipe.train_seed + 2), recipe.reading_batch_size
    items = source.items(layouts, recipe.chain_steps, size, rng, recipe.train_seed, stops=True)
    base_info = json.loads((Path(base) / "config.json").read_text())
    sizes = TinySizes(
        hidden=base_info["hidden_size"],
        layers=base_info["num_hidden_layers"],
        heads=base_info["num_attention_heads"],
        kv_heads=base_info["num_key_value_heads"],
        intermediate=base_info["intermediate_size"],
        max_length=base_info["max_position_embeddings"],
    )
    config = TinyConfig(
        **asdict(sizes),
        reading_steps=recipe.chain_steps,
        reading_batch_size=size,
        lr=recipe.chain_lr,
        warmup_steps=recipe.warmup_steps,
        seed=recipe.train_seed,
    )
    entities = sorted(set(data.corpus.titles))
    chain_hash = fingerprint([], [], (), reading=items, entities=entities)
    out = cache.path(cache_dir, "tiny_lm", cache.files_digest(base), config, chain_hash, code=__name__)
    if not out.exists():
        log.info("training the tiny LM's chain stage (%d steps) on %s into %s", recipe.chain_steps, base, out)
    return tune_tiny_lm(base, items, config, out, chain_hash, entities)


def oracle_chains(data, questions) -> dict[str, str]:
    """The world teacher's chain-of-thought over each question's gold passages (``policy=oracle_rag
    policy.reader=cot`` behind it): {cot prompt: the next sentence}."""
    from rag_lab.env import Env
    from rag_lab.policies.oracle import OracleRAG
    from rag_lab.train.demonstrations import Recorder

    recorder = Recorder(TeacherGenerator(data))
    env, policy = Env(data.corpus, None, recorder), OracleRAG(reader="cot")
    for start in range(0, len(questions), 256):
        policy.rollout(env, list(questions[start : start + 256]))
    return {
        p: t for p, t in recorder.pairs if isinstance(p, str) and (f := identify(p)) and f[0].name == "cot"
    }


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


def _reading(
    facts: list,
    retriever: BM25Retriever,
    chosen: dict[str, dict[str, str]],
    rename: Callable,
    layouts: Sequence[str],
    recipe: Recipe,
) -> Reading:
    """The reading items' sources for the stages that run in ``layouts``: each page's neighbours for
    "qa", whole pages for "drill" and, for "demos", every demonstration the teacher gave (not only the
    SFT sample), one protocol per batch (a random one, or the one the layout names)."""
    bases = {layout.partition(":")[0] for layout in layouts}
    demo_pools = {name: sorted(d.items()) for name, d in chosen.items()} if "demos" in bases else {}
    for layout in layouts:
        if ":" in layout and demo_pools and layout.partition(":")[2] not in demo_pools:
            raise RagLabError(
                f"generator: layout {layout!r}: the teacher gave no demonstrations of that protocol"
                f" (it gave {', '.join(demo_pools)})"
            )
    return Reading(
        facts,
        page_neighbours(facts, retriever, 4) if "qa" in bases else [],
        reading_pages(facts) if "drill" in bases else [],
        demo_pools,
        rename,
        recipe.reading_max_pages,
        recipe.reading_max_questions,
    )


def vocabulary_texts(data, chosen: dict[str, dict[str, str]], max_words: int) -> list[str]:
    """The texts the vocabulary is counted over besides the training items: every corpus page and every
    demonstration (prompt + completion) of up to ``max_words`` words. They train nothing; they count
    because the tokenizer orders its ids by frequency (the shipped checkpoint's vocabulary was counted
    so; they were once a pretraining stage's data, experiments/results/tiny_lm.md)."""
    texts = [p.contents for p in data.corpus]
    for demos in chosen.values():
        texts += [p + c for p, c in sorted(demos.items()) if len((p + c).split()) <= max_words]
    return texts


def _protocol_stage(
    base: Path,
    source: Reading,
    layouts: list[str],
    config: TinyConfig,
    entities: list[str],
    cache_dir: str,
    recipe: Recipe,
) -> Path:
    """The protocol stage, cached apart: the ``base`` model (reused when cached) trained on. Its own
    random stream, so its items do not depend on the stages before; they end with the protocol's stop
    (nothing after it teaches where a completion ends)."""
    rng, size = random.Random(recipe.train_seed + 1), recipe.reading_batch_size
    items = source.items(layouts, recipe.tune_steps, size, rng, recipe.train_seed, stops=True)
    tune_config = replace(config, reading_steps=recipe.tune_steps, lr=recipe.tune_lr)
    tune_hash = fingerprint([], [], (), reading=items, entities=entities)
    out = cache.path(cache_dir, "tiny_lm", base.name, tune_config, tune_hash, code=__name__)
    if not out.exists():
        log.info(
            "training the tiny LM's protocol stage (%d steps) on %s into %s", recipe.tune_steps, base, out
        )
    return tune_tiny_lm(base, items, tune_config, out, tune_hash, entities)


def _layouts(value: str | Sequence[str], protocols: list[str] | None, field: str) -> list[str]:
    """generator.<field> as a list of layouts, each checked: a one-line error names a bad one."""
    layouts = [value] if isinstance(value, str) else list(value)
    for layout in layouts:
        base, named, protocol = layout.partition(":")
        if base not in READING_LAYOUTS or (named and base != "demos"):
            raise RagLabError(
                f"generator.{field}: {layout!r} is not one of {', '.join(READING_LAYOUTS)}"
                " (or demos:<protocol>)"
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
