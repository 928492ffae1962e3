"""``generator=tiny``: the embedded default LM, shipped as a checkpoint that its recipe trained once.

``rag_lab/checkpoints/tiny_lm/`` holds the model, its tokenizer, ``recipe.json`` and a model card
(``README.md``: recipe, hardware, time, scores). ``recipe.json`` records two fingerprints: the recipe
(every training setting of ``rag_lab.train.tiny_world.train``, as conf/generator/tiny.yaml gives them)
and the world it was trained on (:func:`world_fingerprint`: the corpus and the training questions the
recipe reads). When both equal this run's, the shipped model is loaded (under a second). When either
differs (another world, another size of it, a changed setting), the recipe trains a model for this
run into ``cache_dir/tiny_lm/<hash>`` (cached; the card says how long that took on 2 cores), and the
log says which one differs. ``make tiny-lm`` retrains the shipped checkpoint from the recipe
(:func:`rag_lab.train.ship.ship`).
"""

import hashlib
import inspect
import json
import logging
from pathlib import Path

from rag_lab.generators.hf import HFGenerator

log = logging.getLogger(__name__)

SHIPPED = Path(__file__).resolve().parent.parent / "checkpoints" / "tiny_lm"


def world_fingerprint(data) -> str:
    """A hash of what the recipe reads from ``data``: every corpus page and every training question
    (text, answers, decomposition). Equal fingerprints: the recipe would see the same world."""
    digest = hashlib.sha256()
    for page in data.corpus:
        digest.update(json.dumps([page.id, page.contents]).encode())
    for ex in data.split("train"):
        steps = [[s.question, s.answer] for s in ex.decomposition]
        digest.update(json.dumps([ex.id, ex.question, list(ex.answers), steps]).encode())
    return digest.hexdigest()[:16]


def recipe_settings(recipe: dict) -> dict:
    """Every setting of the recipe: ``recipe`` over the defaults of ``train``'s signature."""
    from rag_lab.train.tiny_world import train

    defaults = {
        name: p.default
        for name, p in inspect.signature(train).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    unknown = sorted(set(recipe) - set(defaults))
    if unknown:
        from rag_lab.config import ConfigError

        raise ConfigError(f"config 'generator.{unknown[0]}': not a setting of the tiny LM's recipe")
    return {name: _plain(recipe.get(name, default)) for name, default in sorted(defaults.items())}


def _plain(value):
    """OmegaConf lists and tuples as lists, so that settings compare equal to their JSON form."""
    if isinstance(value, str) or not hasattr(value, "__iter__"):
        return value
    return [_plain(v) for v in value]


def shipped_for(data, settings: dict, shipped: Path = SHIPPED) -> Path | None:
    """The shipped checkpoint when it was trained with ``settings`` on ``data``'s world, else None
    (logged: which fingerprint differs)."""
    card = shipped / "recipe.json"
    if not card.exists():
        log.info("tiny LM: no shipped checkpoint at %s; training with the recipe", shipped)
        return None
    recorded = json.loads(card.read_text())
    changed = sorted(
        k for k in settings.keys() | recorded["recipe"].keys() if settings.get(k) != recorded["recipe"].get(k)
    )
    world = world_fingerprint(data)
    if changed or world != recorded["world"]:
        why = f"settings {', '.join(changed)} differ" if changed else ""
        if world != recorded["world"]:
            why += (
                "; " if why else ""
            ) + f"the world differs (fingerprint {world}, shipped {recorded['world']})"
        log.warning(
            "tiny LM: the shipped checkpoint does not fit this run (%s): training with the recipe into the "
            "cache (the shipped one took %s on 2 cores)",
            why,
            recorded.get("train_time", "?"),
        )
        return None
    return shipped


def tiny_lm(data, cache_dir: str, generate_batch_size: int = 64, seed: int = 0, **recipe) -> HFGenerator:
    """The tiny LM for ``data``: the shipped checkpoint when it fits, else the recipe's (cached).
    ``recipe``: the settings of ``rag_lab.train.tiny_world.train`` (its signature is this one's, so a
    config key that is not a setting fails when the config is checked)."""
    from rag_lab.train.tiny_world import train

    settings = recipe_settings(recipe)
    path = shipped_for(data, settings) or train(data, cache_dir, **settings)
    return HFGenerator(
        str(path), str(path / "tokenizer"), batch_size=generate_batch_size, seed=seed, chat=False,
        dtype="float32",
    )  # fmt: skip


def _recipe_signature() -> None:
    """Give :func:`tiny_lm` the recipe's keyword parameters (and their hints), so the config schema that
    ``rag_lab.config.schema_for`` builds from it checks every ``generator.*`` key and bound."""
    from rag_lab.train.tiny_world import train

    own = inspect.signature(tiny_lm).parameters
    keep = [p for name, p in own.items() if name != "recipe"]
    extra = [p for name, p in inspect.signature(train).parameters.items() if name not in own]
    tiny_lm.__signature__ = inspect.Signature(keep[:2] + extra + keep[2:], return_annotation=HFGenerator)
    tiny_lm.__annotations__ = {**train.__annotations__, **tiny_lm.__annotations__}


_recipe_signature()
