"""The stages of the tiny LM's recipe that continue a trained model (:mod:`rag_lab.train.tiny.recipe` runs
them in order): the protocol stage, the chain stage and the generalist stage, each the protocol stage's loop
(:func:`rag_lab.train.tiny.trainer.tune_tiny_lm`) over items of its own layouts, each cached apart under
``cache_dir/tiny_lm/`` (:func:`continue_stage`), and what their items are drawn from (:class:`Reading`).
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from rag_lab.core import cache
from rag_lab.core.errors import RagLabError
from rag_lab.env.protocols.base import PROTOCOLS, identify
from rag_lab.env.teacher.generator import TeacherGenerator
from rag_lab.retrievers.bm25 import BM25Retriever
from rag_lab.train import demonstrators
from rag_lab.train.demonstrations import Recorder, generalist_demonstrations
from rag_lab.train.parallel import main_first
from rag_lab.train.tiny.model import TinyConfig, TinySizes
from rag_lab.train.tiny.reading import (
    READING_LAYOUTS,
    draw_reading,
    intermediate_reading_item,
    page_facts,
    page_kinds,
    page_neighbours,
    qa_reading_item,
    reading_pages,
    renamer,
    shuffle_questions,
)
from rag_lab.train.tiny.settings import Recipe
from rag_lab.train.tiny.trainer import fingerprint, tune_tiny_lm

log = logging.getLogger(__name__)


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


def chain_stage(
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
    source = reading_source(facts, retriever, pools, rename, layouts, recipe)
    steps = (recipe.chain_steps, recipe.chain_lr, recipe.train_seed + 2)
    return continue_stage(base, data, source, layouts, steps, cache_dir, recipe, "chain")


def generalist_stage(base: Path, data, cache_dir: str, recipe: Recipe) -> Path:
    """The generalist stage, cached apart: the ``base`` model trained on the generalist layouts (the chain
    stage's loop), every protocol's pool the generalist's demonstrations (:func:`generalist_demonstrations`,
    acting by ``recipe.habits``), ``demos:cot`` the chain stage's (the world teacher's chains over
    gold passages, and the generalist's IRCoT chains over retrieved ones). Its own random stream
    (seed + 3)."""
    layouts = check_layouts(recipe.generalist_layout, recipe.protocols, "generalist_layout")
    with main_first():
        by_protocol, retriever = generalist_demonstrations(
            data, cache_dir, recipe.k, recipe.iterations, asdict(recipe.habits)
        )
    facts = page_facts(data)
    rename = renamer(sorted(set(data.corpus.titles)), page_kinds(facts))
    wanted = {n: d for n, d in by_protocol.items() if recipe.protocols is None or n in recipe.protocols}
    wanted["cot"] = {**wanted.get("cot", {}), **oracle_chains(data, data.split("train"))}
    source = reading_source(facts, retriever, wanted, rename, layouts, recipe)
    steps = (recipe.generalist_steps, recipe.generalist_lr, recipe.train_seed + 3)
    return continue_stage(base, data, source, layouts, steps, cache_dir, recipe, "generalist")


def continue_stage(
    base: Path,
    data,
    source: Reading,
    layouts: list[str],
    steps: tuple[int, float, int],
    cache_dir: str,
    recipe: Recipe,
    stage: str,
) -> Path:
    """``base`` trained on by ``steps`` = (batches, learning rate, the items' seed) of ``source``'s items
    in ``layouts`` (the protocol stage's loop, each completion ending with its protocol's stop), cached
    under ``cache_dir/tiny_lm/`` by the base model's files, the settings and the items."""
    count, lr, seed = steps
    rng, size = random.Random(seed), recipe.reading_batch_size
    items = source.items(layouts, count, size, rng, recipe.train_seed, stops=True)
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
        reading_steps=count,
        reading_batch_size=size,
        lr=lr,
        warmup_steps=recipe.warmup_steps,
        seed=recipe.train_seed,
    )
    entities = sorted(set(data.corpus.titles))
    items_hash = fingerprint([], [], (), reading=items, entities=entities)
    out = cache.path(cache_dir, "tiny_lm", cache.files_digest(base), config, items_hash, code=__name__)
    if not out.exists():
        log.info("training the tiny LM's %s stage (%d steps) on %s into %s", stage, count, base, out)
    return tune_tiny_lm(base, items, config, out, items_hash, entities)


def oracle_chains(data, questions) -> dict[str, str]:
    """The world teacher's chain-of-thought over each question's gold passages (the registered gold-passage
    reader, :mod:`rag_lab.train.demonstrators`, behind it): {cot prompt: the next sentence}."""
    from rag_lab.env import Env

    recorder = Recorder(TeacherGenerator(data))
    env, policy = Env(data.corpus, None, recorder), demonstrators.registered().gold_chains()
    for start in range(0, len(questions), 256):
        policy.rollout(env, list(questions[start : start + 256]))
    return {
        p: t for p, t in recorder.pairs if isinstance(p, str) and (f := identify(p)) and f[0].name == "cot"
    }


def reading_source(
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


def protocol_stage(
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


def check_layouts(value: str | Sequence[str], protocols: list[str] | None, field: str) -> list[str]:
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
