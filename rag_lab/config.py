"""Config schemas: the top-level run schema, and component schemas derived from signatures.

Every config group is a registry: a yaml's ``_target_`` names the class (or function) that
builds it. The *schema* of such a node is the target's own signature: :func:`schema_for`
turns ``__init__``'s parameters, type hints and defaults into an OmegaConf structured config,
so there is exactly one place where a component's options are declared. :func:`validate`
merges every ``_target_`` node of a composed config into its schema right after Hydra
composes it and before anything is built, so an unknown key (a yaml typo, a ``+group.key=``
that the component does not take) or a wrong type fails at once with OmegaConf's message,
naming the key and the full path. Overrides of keys that exist nowhere already fail inside
Hydra's compose (configs are in struct mode).
"""

import dataclasses
import functools
import importlib
import inspect
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rag_lab import CONF_DIR
from rag_lab.errors import RagLabError


@dataclass
class EvalConfig:
    # The split of the dataset to evaluate on.
    split: str = "test"
    # Questions per batch: one batched rollout, then one flushed append to records.jsonl.
    batch_size: int = 64
    # Evaluate only the first `limit` questions of the split (null: all).
    limit: int | None = None
    # Skip question ids already in this run dir's records.jsonl (resume after a kill).
    resume: bool = True
    # Cut-offs for recall@k / precision@k of gold supports over the retrieved passages, in order.
    recall_at: list[int] = field(default_factory=list)


@dataclass
class RunConfig:
    """The top-level schema of ``conf/config.yaml``; the groups are validated by :func:`validate`."""

    data: Any = MISSING
    retriever: Any = None
    generator: Any = None
    policy: Any = MISSING
    reward: Any = None
    logger: Any = MISSING
    judge: Any = None
    seed: int = 0
    cache_dir: str = "~/.cache/rag_lab"
    # The split a training policy fits on.
    train_split: str = "train"
    eval: EvalConfig = field(default_factory=EvalConfig)
    # Free-form experiment metadata (name, paper, notes) copied into the records.
    experiment: dict[str, Any] = field(default_factory=dict)


ConfigStore.instance().store(name="run_schema", node=RunConfig)

_PRIMITIVES = (int, float, bool, str, Path)


def _omegaconf_type(hint: Any) -> Any:
    """Map a Python type hint to one OmegaConf can check; anything richer becomes ``Any``."""
    if hint in _PRIMITIVES:
        return hint
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1 and len(args) == 2:
            mapped = _omegaconf_type(inner[0])
            return Any if mapped is Any else mapped | None
        return Any
    if origin in (list, tuple, typing.Sequence) and args and args[0] in _PRIMITIVES and len(set(args)) == 1:
        return list[args[0]]
    return Any


@functools.cache
def schema_for(target: str) -> type:
    """A structured-config dataclass whose fields are the keyword parameters of ``target``.

    A target that takes ``**kwargs`` has an open schema (every key accepted), so it returns
    ``dict``; Hydra's ``_target_``, ``_partial_``, ``_recursive_`` and ``_convert_`` are allowed.
    """
    obj = locate(target)
    fn = obj.__init__ if inspect.isclass(obj) else obj
    signature = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolvable forward references: fall back to unchecked types
        hints = {}
    fields: list[tuple] = []
    for name, p in signature.parameters.items():
        if name == "self" or p.kind is p.VAR_POSITIONAL:
            continue
        if p.kind is p.VAR_KEYWORD:
            return dict
        hint = _omegaconf_type(hints.get(name, Any))
        default = MISSING if p.default is p.empty else p.default
        if isinstance(default, list | dict | tuple):
            default = dataclasses.field(default_factory=lambda d=default: type(d)(d))
        elif not isinstance(default, (*_PRIMITIVES, type(None))) and default is not MISSING:
            hint, default = Any, dataclasses.field(default_factory=lambda d=default: d)
        fields.append((name, hint, default))
    for meta in ("_target_", "_partial_", "_recursive_", "_convert_", "_args_"):
        fields.append((meta, Any, None))
    return dataclasses.make_dataclass(target.rsplit(".", 1)[-1] + "Schema", fields)


def locate(target: str) -> Any:
    """Import ``pkg.module.Name`` with an error that names the target."""
    module_name, _, attr = target.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"_target_ '{target}' cannot be imported: {e}") from None


def validate(cfg: DictConfig) -> None:
    """Check every ``_target_`` node of ``cfg`` against its schema; raise ConfigError on the first bad key."""
    for path, node in _target_nodes(cfg, ""):
        schema = schema_for(node._target_)
        if schema is dict:
            continue
        try:
            OmegaConf.merge(OmegaConf.structured(schema), node)
        except OmegaConfBaseException as e:
            msg = str(e).splitlines()[0]
            raise ConfigError(f"config '{path}' ({node._target_}): {msg}") from None


class ConfigError(RagLabError):
    """A composed config that does not match its components' schemas."""


def _target_nodes(node: Any, path: str):
    if isinstance(node, DictConfig):
        if "_target_" in node:
            yield path or "<root>", node
        for key in node:
            if key == "hydra":
                continue
            child = node._get_node(key)
            if child is None or (hasattr(child, "_is_interpolation") and child._is_interpolation()):
                continue
            yield from _target_nodes(node[key], f"{path}.{key}" if path else str(key))
    elif isinstance(node, ListConfig):
        for i, item in enumerate(node):
            yield from _target_nodes(item, f"{path}[{i}]")


def compose(overrides: list[str] | None = None, config_name: str = "config") -> DictConfig:
    """Compose the shipped config tree outside ``@hydra.main`` (tests, notebooks) and validate it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose(config_name=config_name, overrides=overrides or [], return_hydra_config=False)
    validate(cfg)
    return cfg


def check_yaml_files(conf_dir: Path = CONF_DIR) -> None:
    """Parse every yaml of the config tree; a syntax error becomes one line naming file, line, column.

    Hydra would report it too, but deep inside a long traceback.
    """
    import yaml

    for path in sorted(conf_dir.rglob("*.yaml")):
        try:
            yaml.safe_load(path.read_text())
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise ConfigError(f"{where}: malformed yaml ({problem})") from None


def group_options(group: str) -> list[str]:
    """The options of a config group, read from the config tree (the only registry)."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
