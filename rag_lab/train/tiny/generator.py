"""``generator=tiny``: the embedded default LM, shipped as a checkpoint that its recipe trained once.

``rag_lab/checkpoints/tiny_lm/`` holds the model, its tokenizer, ``recipe.json`` and a model card
(``README.md``: recipe, hardware, time, scores). ``recipe.json`` records two fingerprints: the recipe
(every setting of :class:`rag_lab.train.tiny.recipe.Recipe`, as conf/generator/tiny.yaml gives them)
and the world it was trained on (:func:`world_fingerprint`: the corpus and the training questions the
recipe reads). When both equal this run's, the shipped model is loaded (under a second). When either
differs (another world, another size of it, a changed setting), the recipe trains a model for this
run into ``cache_dir/tiny_lm/<key>`` (cached; the card says how long that took on 2 cores), and the
log says which one differs. ``make tiny-lm`` retrains the shipped checkpoint from the recipe
(:mod:`rag_lab.train.tiny.ship`).
"""

import dataclasses
import json
import logging
from collections.abc import Iterator
from pathlib import Path

from rag_lab.core import cache
from rag_lab.core.config import ConfigError, takes
from rag_lab.core.errors import RagLabError
from rag_lab.core.ranges import PositiveInt
from rag_lab.generators.hf import HFGenerator
from rag_lab.train.tiny.recipe import train
from rag_lab.train.tiny.settings import Recipe

log = logging.getLogger(__name__)

SHIPPED = Path(__file__).resolve().parents[2] / "checkpoints" / "tiny_lm"


def world_fingerprint(data) -> str:
    """A digest of what the recipe reads from ``data``: every corpus page and every training question
    (text, answers, decomposition). Equal fingerprints: the recipe would see the same world."""

    def chunks() -> Iterator[str]:
        for page in data.corpus:
            yield json.dumps([page.id, page.contents])
        for ex in data.split("train"):
            steps = [[s.question, s.answer] for s in ex.decomposition]
            yield json.dumps([ex.id, ex.question, list(ex.answers), steps])

    return cache.stream_digest(chunks())[:16]


def recipe_part(generator: dict) -> dict:
    """The recipe's keys of a ``generator=tiny`` config (the rest: where it runs, how it generates)."""
    names = {f.name for f in dataclasses.fields(Recipe)}
    return {k: v for k, v in generator.items() if k in names}


def recipe_settings(recipe: dict) -> dict:
    """Every setting of the recipe (:class:`Recipe`): ``recipe`` over the defaults, as plain data (so
    that settings compare equal to their JSON form in ``recipe.json``)."""
    names = {f.name for f in dataclasses.fields(Recipe)}
    unknown = sorted(set(recipe) - names)
    if unknown:
        raise ConfigError(f"config 'generator.{unknown[0]}': not a setting of the tiny LM's recipe")
    settings = cache.plain(dataclasses.asdict(Recipe(**recipe)))
    return dict(sorted(settings.items()))


# The card's files (recipe.json, README.md) aside, what a shipped checkpoint holds: each with its sha256 in
# recipe.json ("files"), checked on every load.
CARD_FILES = ("recipe.json", "README.md")
# recipe.json's model sizes -> config.json's fields
SIZES = {
    "hidden": "hidden_size",
    "layers": "num_hidden_layers",
    "heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "intermediate": "intermediate_size",
    "max_length": "max_position_embeddings",
}


def file_digests(folder: Path) -> dict[str, str]:
    """Every file of a checkpoint folder but its card (relative path -> sha256), in path order."""
    return cache.folder_digests(folder, skip=CARD_FILES)


def check_checkpoint(folder: Path, card: dict) -> None:
    """A one-line error naming the file when a shipped checkpoint's files are not the ones its card
    (``recipe.json``) fingerprints, or its config.json's sizes are not the card's recipe's."""
    where = Path(folder) / "recipe.json"
    cache.check_folder(folder, card.get("files"), where, "`make tiny-lm`")
    config = json.loads((Path(folder) / "config.json").read_text())
    for key, field in SIZES.items():
        if key in card.get("recipe", {}) and config.get(field) != card["recipe"][key]:
            raise RagLabError(
                f"{Path(folder) / 'config.json'}: {field} is {config.get(field)}, but the card {where} says "
                f"{key} {card['recipe'][key]}"
            )


def shipped_for(data, settings: dict, shipped: Path = SHIPPED) -> Path | None:
    """The shipped checkpoint when it was trained with ``settings`` on ``data``'s world, else None
    (logged: which fingerprint differs)."""
    card = shipped / "recipe.json"
    if not card.exists():
        log.info("tiny LM: no shipped checkpoint at %s; training with the recipe", shipped)
        return None
    recorded = json.loads(card.read_text())
    check_checkpoint(shipped, recorded)
    keys = settings.keys() | recorded["recipe"].keys()
    for steps, stage_keys in (("chain_steps", CHAIN_KEYS), ("generalist_steps", GENERALIST_KEYS)):
        if not settings.get(steps) and not recorded["recipe"].get(steps):
            keys -= set(stage_keys)  # no such stage on either side: its other settings train nothing
    changed = sorted(k for k in keys if settings.get(k) != recorded["recipe"].get(k))
    world = world_fingerprint(data)
    why = [f"settings {', '.join(changed)} differ"] if changed else []
    if world != recorded["world"]:
        why.append(f"the world differs (fingerprint {world}, shipped {recorded['world']})")
    if why:
        log.warning(
            "tiny LM: the shipped checkpoint does not fit this run (%s): training with the recipe into the "
            "cache (the shipped one took %s on 2 cores)",
            "; ".join(why),
            recorded.get("train_time", "?"),
        )
        return None
    log.info("tiny LM: the shipped checkpoint %s fits this run's world and recipe", shipped)
    return shipped


# A later stage's settings: a recipe that differs from a shipped one only in the keys of a stage and those
# after it (and whose shipped one has none of those stages) starts that stage from the shipped checkpoint.
CHAIN_KEYS = ("chain_steps", "chain_layout", "chain_lr")
GENERALIST_KEYS = (
    "generalist_steps",
    "generalist_layout",
    "generalist_lr",
    "generalist_searches",
    "generalist_jitter",
    "generalist_verbatim",
    "generalist_whole_plan",
)
LATER = {"chain": CHAIN_KEYS + GENERALIST_KEYS, "generalist": GENERALIST_KEYS}


def before_chain_for(data, settings: dict, shipped_root: Path = SHIPPED.parent) -> Path | None:
    """A shipped checkpoint of this recipe's stages before its chain stage (its recipe is ``settings`` but
    the chain and generalist keys, with neither stage, on ``data``'s world), checked against its card; None
    when the recipe has no chain stage or none is shipped."""
    return _before("chain", data, settings, shipped_root)


def before_generalist_for(data, settings: dict, shipped_root: Path = SHIPPED.parent) -> Path | None:
    """A shipped checkpoint of this recipe's stages before its generalist stage (its recipe is ``settings``
    but the generalist keys, with no generalist stage), checked against its card; None when the recipe has
    no generalist stage or none is shipped."""
    return _before("generalist", data, settings, shipped_root)


def _before(stage: str, data, settings: dict, shipped_root: Path) -> Path | None:
    if not settings.get(f"{stage}_steps"):
        return None
    later = LATER[stage]
    wanted = {k: v for k, v in settings.items() if k not in later}
    world = None
    for card in sorted(Path(shipped_root).glob("*/recipe.json")):
        recorded = json.loads(card.read_text())
        recipe = recorded.get("recipe", {})
        if (
            any(recipe.get(k) for k in later if k.endswith("_steps"))
            or {k: v for k, v in recipe.items() if k not in later} != wanted
        ):
            continue
        world = world or world_fingerprint(data)
        if recorded.get("world") == world:
            check_checkpoint(card.parent, recorded)
            log.info(
                "tiny LM: the %s stage starts from the shipped %s (its earlier stages)", stage, card.parent
            )
            return card.parent
    return None


def before(data, settings: dict) -> dict[str, Path]:
    """The shipped checkpoint the recipe continues from, as :func:`train`'s keyword: the latest stage's
    start that is shipped (the generalist stage's, else the chain stage's), or none."""
    if (path := before_generalist_for(data, settings)) is not None:
        return {"before_generalist": path}
    if (path := before_chain_for(data, settings)) is not None:
        return {"before_chain": path}
    return {}


def _check_trainable(data) -> None:
    """A one-line error unless ``data`` is the generated world: the tiny LM's word-level vocabulary is that
    world's, and its recipe needs the world teacher, who parses the world's pages and questions to write
    the demonstrations and the reading drills."""
    from rag_lab.data.synth import SynthDataset

    if not isinstance(data, SynthDataset):
        name = getattr(data, "name", None) or type(data).__name__
        raise RagLabError(
            f"generator=tiny on data={name}: the tiny LM reads the generated world's vocabulary only, and "
            "its recipe trains on that world alone (data=synth); on other data use generator=smollm2 (a "
            "pretrained LM, offline) or generator=hf generator.model=<dir>"
        )


def checkpoint_dir(name: str | None) -> Path:
    """A shipped checkpoint's folder: ``name`` under rag_lab/checkpoints/ (or a path); None: the default's."""
    if name is None:
        return SHIPPED
    path = Path(name).expanduser()
    return path if path.is_absolute() or len(path.parts) > 1 else SHIPPED.parent / path


def fitting_checkpoint(data, checkpoint: str | None, settings: dict) -> Path | None:
    """The shipped checkpoint ``checkpoint`` names when it fits ``data``'s world and the recipe's
    ``settings``, else None (the recipe trains); a checkpoint that does not exist, or data that is not the
    generated world, is one line. What :func:`tiny_lm` loads, and what tells the runner whether building
    the generator trains it (``launch``: :mod:`rag_lab.run`)."""
    folder = checkpoint_dir(checkpoint)
    if checkpoint is not None and not (folder / "recipe.json").exists():
        shipped = sorted(p.parent.name for p in SHIPPED.parent.glob("*/recipe.json"))
        raise ConfigError(
            f"generator.checkpoint: {folder} holds no shipped checkpoint (recipe.json); "
            f"shipped: {', '.join(shipped)}"
        )
    _check_trainable(data)
    return shipped_for(data, settings, folder)


@takes(train)
def tiny_lm(
    data,
    cache_dir: str,
    generate_batch_size: PositiveInt = 64,
    seed: int = 0,
    device: str = "auto",
    checkpoint: str | None = None,
    **recipe,
) -> HFGenerator:
    """The tiny LM for ``data`` (the run's dataset, handed over by the runner): the shipped checkpoint
    when it fits, else the recipe's (cached). ``recipe``: the settings of :func:`train` (:class:`Recipe`;
    :func:`rag_lab.core.config.takes` lists them in this signature, so the config schema checks every
    ``generator.*`` key). ``device``: HFGenerator's (``auto``: the CPU, where a model this small runs
    fastest even beside a GPU). ``checkpoint``: which shipped checkpoint (a folder name under
    rag_lab/checkpoints/, or a path; null: ``tiny_lm``, the default's)."""
    settings = recipe_settings(recipe)
    data = getattr(data, "world", data)  # data=synth_easy: the whole world, not its selection of questions
    path = fitting_checkpoint(data, checkpoint, settings) or train(
        data, cache_dir, **before(data, settings), **settings
    )
    return HFGenerator(
        str(path),
        str(path / "tokenizer"),
        batch_size=generate_batch_size,
        seed=seed,
        chat=False,
        dtype="float32",
        device=device,
    )
