"""Config schemas: the top-level run schema, and component schemas derived from signatures.

Every config group is a registry: a yaml's ``_target_`` names the class (or function) that builds it. The
*schema* of such a node is the target's own signature: :func:`schema_for` turns ``__init__``'s parameters,
type hints and defaults into an OmegaConf structured config, so there is exactly one place where a
component's options are declared. :func:`validate` merges every ``_target_`` node of a composed config into
its schema right after Hydra composes it and before anything is built, so an unknown key (a yaml typo, a
``+group.key=`` that the component does not take) or a wrong type fails at once with OmegaConf's message,
naming the key and the full path. Overrides of keys that exist nowhere already fail inside Hydra's compose
(configs are in struct mode); keys *appended* with ``+key=value`` bypass that check, so :func:`validate`
also merges the whole config into its top-level schema (:class:`RunConfig`, :class:`ScoreConfig`,
:class:`ServeConfig`).

A setting's valid range rides in the same place, once, beside its declaration: a parameter typed
``Annotated[float, Range(0, 1)]`` (or one of the aliases: :data:`PositiveInt`, :data:`Positive`,
:data:`NonNegative`, :data:`Probability`, :data:`OpenUnit`, :data:`Dropout`), or
``Annotated[str, OneOf("a", "b")]`` for a choice, is checked too (a list's items one by one; ``None``
passes where the hint allows it), so ``policy.k=0`` fails naming ``policy.k``. A dataclass field may say
it with ``metadata={"min": 1}``. A component built outside a config checks the same declarations with
:func:`check_ranges`. What a declaration cannot say (a switch that contradicts another, a name that must
exist elsewhere in the config) a target says in its ``check_settings(settings, run)``: called here with
its settings (defaults filled) and the whole config, it returns ``(key, why)`` pairs, the first of which
fails the config like any other bad key.

A component that passes settings on to another (SmolLM2's to ``HFGenerator``, Stop-RAG's to its
Q-network and pipeline) declares them there only: :func:`takes` gives its ``**settings`` the other's
parameters, defaults and hints, so the schema (and ``help``) lists them as its own.

What the runner builds once and hands down (:func:`build`) is not a config key: a constructor parameter
named in :data:`INJECTED` is filled by name (the run's corpus, dataset, training dataset, reward
functions, resolved config), and a config that sets it fails like any unknown key.
"""

import dataclasses
import functools
import importlib
import inspect
import types
import typing
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rag_lab import CONF_DIR
from rag_lab.core.errors import RagLabError
from rag_lab.core.fastyaml import use_libyaml
from rag_lab.core.ranges import (  # noqa: F401 - re-exported: components declare their ranges from here
    CHECKS,
    AtLeast,
    Dropout,
    NonNegative,
    NonNegativeInt,
    OneOf,
    OpenUnit,
    Positive,
    PositiveInt,
    Probability,
    Range,
    check_ranges,
    field_checks,
    problems,
    strip_annotated,
)
from rag_lab.core.run_settings import CorpusConfig, EvalConfig

use_libyaml()


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
    # How training is launched: null (in this process) or an accelerate config (rag_lab/runner/launch.py).
    launch: Any = None
    # Supervised cold start on teacher demonstrations (+cold_start=default; rag_lab/train/cold_start/).
    cold_start: Any = None
    # The dataset a training policy trains on (a data config; null: the run's data), e.g. dapo_2wiki's
    # 2Wiki while it evaluates on seven datasets: ``- /data@train_data: 2wiki`` in an experiment.
    train_data: Any = None
    seed: int = 0
    cache_dir: str = "~/.cache/rag_lab"
    # The split a training policy fits on.
    train_split: str = "train"
    eval: EvalConfig = field(default_factory=EvalConfig)
    # What the index holds of the data's corpus (evidence as a controlled variable; default: all of it).
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    # Free-form experiment metadata (name, paper, notes) copied into the records.
    experiment: dict[str, Any] = field(default_factory=dict)


@dataclass
class ScoreConfig:
    """The schema of ``conf/score.yaml`` (``python -m rag_lab.score``)."""

    data: Any = MISSING
    # jsonl, one {"id", "prediction", "support_ids" (optional)} per line
    predictions: str = MISSING
    split: str = "test"
    cache_dir: str = "~/.cache/rag_lab"


@dataclass
class ServeSettings:
    host: str = "127.0.0.1"
    port: int = field(default=8000, metadata={"min": 0})
    model_name: str | None = None
    max_batch: int = field(default=256, metadata={"min": 1})
    max_queue: int = field(default=8192, metadata={"min": 1})


@dataclass
class ServeConfig:
    """The schema of ``conf/serve.yaml`` (``python -m rag_lab.serve``): a generator, a retriever, or both."""

    generator: Any = None
    data: Any = None
    retriever: Any = None
    serve: ServeSettings = field(default_factory=ServeSettings)
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    seed: int = 0
    cache_dir: str = "~/.cache/rag_lab"


ConfigStore.instance().store(name="run_schema", node=RunConfig)
ConfigStore.instance().store(name="score_schema", node=ScoreConfig)
ConfigStore.instance().store(name="serve_schema", node=ServeConfig)
# Which schema a config file validates against, by its name under conf/.
TOP_SCHEMAS: dict[str, type] = {"config": RunConfig, "score": ScoreConfig, "serve": ServeConfig}

_PRIMITIVES = (int, float, bool, str, Path)
# Constructor parameters the runner fills (rag_lab/run.py): the run's corpus (retrievers), its dataset
# (generator=tiny, teacher), the dataset a policy trains on, the reward group built, the resolved config.
INJECTED = ("corpus", "data", "train_data", "reward", "run_config")


def takes(*sources: Callable, drop: Collection[str] = ()) -> Callable:
    """Decorator: the decorated function's ``**settings`` are the keyword parameters of ``sources`` (a
    class, for its ``__init__``, or a function), declared there once. Its signature, which the config
    schema reads, lists them after its own with their defaults and type hints; ``drop`` leaves some out.

    >>> def inner(k: int = 5, depth: int = 20): ...
    >>> @takes(inner, drop=["depth"])
    ... def outer(name: str, **settings): ...
    >>> import inspect; str(inspect.signature(outer))
    '(name: str, *, k: int = 5)'
    """

    def decorate(fn: Callable) -> Callable:
        own = inspect.signature(fn)
        params = [p for p in own.parameters.values() if p.kind is not p.VAR_KEYWORD]
        names, hints = {p.name for p in params} | set(drop), {}
        for source in sources:
            target = source.__init__ if inspect.isclass(source) else source
            hints |= typing.get_type_hints(target, include_extras=True)
            for p in inspect.signature(target).parameters.values():
                variadic = p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                if p.name != "self" and not variadic and p.name not in names:
                    params.append(p.replace(kind=p.KEYWORD_ONLY))
                    names.add(p.name)
        fn.__signature__ = own.replace(parameters=params)
        fn.__takes__ = sources  # (help: reporting/docs)
        fn.__annotations__ = {k: v for k, v in hints.items() if k != "return"} | fn.__annotations__
        return fn

    return decorate


def settings_for(source: Callable, settings: dict[str, Any]) -> dict[str, Any]:
    """Every keyword parameter of ``source`` (a class or function) that has a value: its value in
    ``settings``, else its default.

    >>> def inner(k: int = 5, depth: int = 20): ...
    >>> settings_for(inner, {"k": 3, "other": 1})
    {'k': 3, 'depth': 20}
    """
    target = source.__init__ if inspect.isclass(source) else source
    params = inspect.signature(target).parameters.items()
    return {n: settings.get(n, p.default) for n, p in params if n in settings or p.default is not p.empty}


def build(node: Any, **shared: Any) -> Any:
    """``instantiate(node)``, handing its target those of ``shared`` (:data:`INJECTED` names) that its
    constructor takes; None for a null node."""
    from hydra.utils import instantiate

    if node is None:
        return None
    target = locate(node._target_)
    fn = target.__init__ if inspect.isclass(target) else target
    params = inspect.signature(fn).parameters
    required = [k for k in INJECTED if k in params and params[k].default is params[k].empty]
    missing = [k for k in required if k not in shared]
    if missing:
        raise ConfigError(f"{node._target_} needs the run's {missing[0]}, which this command does not build")
    wanted = {k: v for k, v in shared.items() if k in params}
    if not wanted:
        return instantiate(node)
    # handed over as they are: instantiate() would turn a dict into a config (and build its _target_s)
    return instantiate(node, _partial_=True)(**wanted)


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
    ``dict``; except ``**_`` (a reward's "any other dataset column", which no config key reaches).
    Hydra's ``_target_``, ``_partial_``, ``_recursive_`` and ``_convert_`` are allowed.
    """
    obj = locate(target)
    fn = obj.__init__ if inspect.isclass(obj) else obj
    signature = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception:  # unresolvable forward references: fall back to unchecked types
        hints = {}
    fields: list[tuple] = []
    for name, p in signature.parameters.items():
        if name == "self" or p.kind is p.VAR_POSITIONAL or name in INJECTED:
            continue
        if p.kind is p.VAR_KEYWORD:
            if name == "_":
                continue
            return dict
        hint, bounds = strip_annotated(hints.get(name, Any))
        hint = _omegaconf_type(hint)
        default = MISSING if p.default is p.empty else p.default
        if isinstance(default, list | dict | tuple):
            default = dataclasses.field(default_factory=lambda d=default: type(d)(d))
        elif not isinstance(default, (*_PRIMITIVES, type(None))) and default is not MISSING:
            hint, default = Any, dataclasses.field(default_factory=lambda d=default: d)
        if bounds:
            kwargs = (
                {"default_factory": default.default_factory}
                if isinstance(default, dataclasses.Field)
                else {"default": default}
            )
            default = dataclasses.field(**kwargs, metadata={"checks": tuple(bounds)})
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
        raise ConfigError(f"_target_ '{target}' cannot be imported ({type(e).__name__}: {e})") from None


def _check_bounds(schema: type, node: DictConfig, path: str) -> None:
    """Every dataclass field of ``schema`` with declared checks (a range, choices) holds a value they
    accept."""
    for f in dataclasses.fields(schema):
        checks = field_checks(f)
        if not checks or f.name not in node:
            continue
        if why := problems(checks, node[f.name]):
            key = f"{path}.{f.name}" if path else f.name
            raise ConfigError(f"config '{key}' {why}" if why.startswith("must") else f"config '{key}': {why}")


@functools.cache
def _structured(schema: type) -> DictConfig:
    """``OmegaConf.structured(schema)``, built once per schema (a third of a compose's time otherwise):
    ``OmegaConf.merge`` copies its first config, so the one kept here is never changed."""
    return OmegaConf.structured(schema)


def validate(cfg: DictConfig, schema: type | None = RunConfig) -> None:
    """Check ``cfg`` against its top-level ``schema`` (appended keys included) and every ``_target_``
    node against its component's schema; raise ConfigError naming the first bad key."""
    if schema is not None:
        try:
            # as plain containers: a node already typed by the schema would carry an appended key along
            plain = OmegaConf.to_container(cfg, resolve=False)
            plain.pop("hydra", None)
            OmegaConf.merge(_structured(schema), plain)
        except OmegaConfBaseException as e:
            key = getattr(e, "full_key", None)
            raise ConfigError(
                f"config '{key}': {str(e).splitlines()[0]}" if key else f"config: {str(e).splitlines()[0]}"
            ) from None
        missing = sorted(k for k in OmegaConf.missing_keys(cfg) if not k.startswith("hydra."))
        if missing:
            raise ConfigError(f"config '{missing[0]}' is required: set {missing[0]}=...")
        _check_bounds(schema, cfg, "")
        for f in dataclasses.fields(schema):
            if dataclasses.is_dataclass(f.type) and f.name in cfg and isinstance(cfg[f.name], DictConfig):
                _check_bounds(f.type, cfg[f.name], f.name)
    for path, node in _target_nodes(cfg, ""):
        try:
            component = schema_for(node._target_)
        except ConfigError as e:
            raise ConfigError(f"config '{path}': {e}") from None
        if component is dict:
            continue
        try:
            OmegaConf.merge(_structured(component), node)
        except OmegaConfBaseException as e:
            key = f"{path}.{e.full_key}" if getattr(e, "full_key", None) else path
            raise ConfigError(f"config '{key}' ({node._target_}): {str(e).splitlines()[0]}") from None
        _check_bounds(component, node, path)
        _check_relations(component, node, path, cfg)


def _check_relations(component: type, node: DictConfig, path: str, cfg: DictConfig) -> None:
    """The target's ``check_settings`` (module docstring), where it has one."""
    check = getattr(locate(node._target_), "check_settings", None)
    if check is None:
        return
    # the node's own values resolved where it stands (its interpolations), over the signature's defaults
    settings = OmegaConf.to_container(_structured(component)) | OmegaConf.to_container(node, resolve=True)
    for key, why in check(settings, cfg):
        raise ConfigError(f"config '{path}.{key}': {why}")


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
    validate(cfg, TOP_SCHEMAS.get(config_name))
    return cfg


def group_options(group: str) -> list[str]:
    """The options of a config group, read from the config tree (the only registry)."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
