"""Generated documentation: the config reference (every key of every config group with its default, valid
values and help text) and the config-group table, both read from the config tree and the code.

A key of ``conf/<group>/<option>.yaml`` is a key the yaml sets or a keyword parameter of its ``_target_``
(the schema :func:`rag_lab.core.config.schema_for` reads; the runner's :data:`~rag_lab.core.config.INJECTED`
objects and, for a ``_partial_`` node, the call's own arguments left out). Its default is the yaml's value,
else the signature's; its valid values are the ``Range`` / ``OneOf`` of its type hint
(:mod:`rag_lab.core.ranges`).

**Help text** is a comment, written where the key is: the comment block that heads the run of lines the
key is in, a run being consecutive lines with no blank line and no other comment between them (the
house style: one comment above a key, or above a few keys that go together), or a comment at the end of
the key's own line. In the yaml that sets the key (its own level of the mapping), else in the Python
source that declares it: the target's parameter list, a dataclass's fields, and for a target whose
``**settings`` come from :func:`rag_lab.core.config.takes`, the sources named there. A yaml file's opening
comment (its lines above the first line that is not a comment) describes the option, not a key: it heads
no run, so the keys right below it need a comment of their own (or one at their declaration); a nested
block read on its own (``serve:``'s keys) is not a file, and its first comment is a key's.
``tests/test_docs.py`` fails naming every key without help (:func:`keys_without_help`).

The site's config reference pages (the group table, :func:`config_groups_table`, and each option's keys)
are rendered from :func:`option_keys` and :func:`schema_keys` by its build hook
(``docs/hooks/reference.py``, ``make docs``).
"""

import ast
import dataclasses
import inspect
import re
import textwrap
import typing
from typing import Any

import yaml

from rag_lab import CONF_DIR
from rag_lab.core.cli import flat_keys  # noqa: F401 - the site's experiment page (docs/hooks/reference.py)
from rag_lab.core.config import INJECTED, RunConfig, ScoreConfig, ServeConfig, group_options, locate
from rag_lab.core.errors import RagLabError
from rag_lab.core.ranges import field_checks, strip_annotated

# Config group -> the package column: the package that mirrors it and what it holds.
PACKAGES = {
    "data": "`data/` — `QAExample`, `Passage`, `Corpus`, loaders, `synth/` (the generated world)",
    "retriever": "`retrievers/` — batched `search(queries, k, exclude)`, on-disk index cache",
    "generator": "`generators/` — `generate(prompts, sampling)`; `env/teacher/`, `train/tiny/`",
    "policy": "`policies/` — `rollout(env, batch)`; a method per package (`fit(...)`: trained policies)",
    "reward": "`rewards/` — pure functions with TRL's signature; a method's policy selects its own",
    "logger": "`loggers/`",
    "judge": "`eval/judge.py` — LLM-as-judge accuracy (DAPO paper B.4 prompt) through any generator",
    "cold_start": "`train/cold_start/` — SFT on rejection-sampled teacher demonstrations",
    "launch": "`runner/launch.py` — training data-parallel under `accelerate launch` (an accelerate config)",
    "experiment": "— `# @package _global_` deltas over the defaults",
}
# Config folders whose yaml are not one component each: experiments (deltas over the whole config, listed
# with what they set) and Hydra's own nodes (hydra/launcher: keys of Hydra's plugins, help from the yaml).
NOT_COMPONENTS = ("experiment", "hydra")


@dataclasses.dataclass
class Key:
    """One config key: its name, default, type, valid values and help text (None: it has none)."""

    name: str
    default: Any
    type: str
    valid: str
    help: str | None


def comment_help(lines: list[str], first: int = 0) -> dict[int, str]:
    """Line index -> the help text of the key on that line (module docstring: the comment heading its
    run, or its own trailing comment), for the non-comment lines of ``lines[first:]``.

    >>> comment_help(["# a and b", "a: 1", "b: 2", "", "c: 3  # c's own", "# d", "d: 4"])
    {1: 'a and b', 2: 'a and b', 4: "c's own", 6: 'd'}
    """
    out, block, heading = {}, [], None
    for i, line in enumerate(lines[first:], first):
        text = line.strip()
        if not text:
            block, heading = [], None
        elif text.startswith("#"):
            block.append(text.lstrip("#").strip())
        else:
            if block:
                heading, block = " ".join(block), []
            if help_text := _trailing(line) or heading:
                out[i] = help_text
    return out


def _trailing(line: str) -> str | None:
    """The comment at the end of a line of code, not a ``#`` inside a quoted string."""
    head, sep, tail = line.partition(" #")
    while sep and (head.count("'") % 2 or head.count('"') % 2):
        more, sep, tail = tail.partition(" #")
        head += " #" + more
    return tail.strip() or None if sep else None


def yaml_help(text: str, file: bool = True) -> dict[str, str]:
    """The help text of each top-level key of a yaml mapping (nested lines belong to their key's run). A
    whole file's (``file``) opening comment describes the option, not the keys below it: no key's help.

    >>> yaml_help("# BM25\\nk1: 1.5  # saturation\\nb: 0.75\\n# the stemmer\\nstemmer: null")
    {'k1': 'saturation', 'stemmer': 'the stemmer'}
    """
    lines = text.splitlines()
    opening = next((i for i, line in enumerate(lines) if not line.strip().startswith("#")), len(lines))
    # the opening comment blanked out: the keys right below it start a run with no heading
    comments = comment_help([""] * opening + lines[opening:] if file else lines)
    out = {}
    for i, line in enumerate(lines):
        # a top-level key, or a group the defaults list picks (``  - data: synth  # questions``)
        match = re.match(r"(\w+):|\s+- (\w+)(@\w+)?:", line)
        if match and i in comments:
            out.setdefault(match[1] or match[2], comments[i])
    return out


def own_dataclass(cls: type) -> bool:
    """Whether ``cls`` is itself a dataclass, its settings its fields: not a class that inherits a settings
    dataclass's fields and takes them, among others, in an ``__init__`` of its own (DAPO, EVO-RAG,
    Stop-RAG)."""
    return "__dataclass_fields__" in vars(cls)


def source_help(obj: Any) -> dict[str, str]:
    """Parameter (or dataclass field) -> its help text in the source of ``obj``, a function or a class
    (a dataclass: its fields; another class: its ``__init__``'s parameters)."""
    if inspect.isclass(obj) and not own_dataclass(obj):
        obj = obj.__init__
    try:
        lines, _ = inspect.getsourcelines(inspect.unwrap(obj))
    except (OSError, TypeError):  # a builtin, a generated __init__
        return {}
    lines = textwrap.dedent("".join(lines)).splitlines()
    tree = ast.parse("\n".join(lines)).body[0]
    if isinstance(tree, ast.ClassDef):
        items = [(s.target.id, s.lineno) for s in tree.body if isinstance(s, ast.AnnAssign)]
    else:
        a = tree.args
        items = [(x.arg, x.lineno) for x in a.posonlyargs + a.args + a.kwonlyargs]
    comments = comment_help(lines, first=tree.lineno)
    return {name: comments[line - 1] for name, line in items if line - 1 in comments}


def declared_help(target: Any) -> dict[str, str]:
    """The help text of every setting of ``target`` in the code: its own source first, then the sources of
    its :func:`~rag_lab.core.config.takes` (recursively)."""
    fn = target.__init__ if inspect.isclass(target) and not own_dataclass(target) else target
    out = source_help(target)
    for source in getattr(fn, "__takes__", ()):
        out = declared_help(source) | out
    return out


def _hint_text(hint: Any) -> tuple[str, str]:
    """(type, valid values) of a type hint, e.g. ``('int', '>= 1')``."""
    base, checks = strip_annotated(hint)
    name = getattr(base, "__name__", None) if not typing.get_args(base) else None
    text = name or str(base).replace("typing.", "")
    valid = "; ".join(
        str(c) if hasattr(c, "min") else "one of " + ", ".join(map(str, c.choices)) for c in checks
    )
    return text, valid


def target_keys(node: dict, text: str) -> list[Key]:
    """The keys of a component node (module docstring), in declaration order, the yaml's own after."""
    own = {k: v for k, v in node.items() if k not in ("defaults", "_target_", "_partial_")}
    helps = yaml_help(text)
    keys: dict[str, Key] = {}
    if "_target_" in node:
        target = locate(node["_target_"])
        fn = target.__init__ if inspect.isclass(target) else target
        hints = typing.get_type_hints(fn, include_extras=True)
        code_help = declared_help(target)
        for name, p in inspect.signature(fn).parameters.items():
            variadic = p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            call_argument = node.get("_partial_") and p.default is p.empty and name not in own
            if name == "self" or variadic or name in INJECTED or call_argument:
                continue
            default = own.get(name, "(required)" if p.default is p.empty else p.default)
            kind, valid = _hint_text(hints.get(name, Any))
            keys[name] = Key(name, default, kind, valid, helps.get(name) or code_help.get(name))
    for name, value in own.items():
        keys.setdefault(name, Key(name, value, "", "", helps.get(name)))
    return list(keys.values())


def schema_keys(schema: type, text: str, prefix: str = "") -> list[Key]:
    """The keys of a top-level schema (a dataclass of :mod:`rag_lab.core.config`) and of its nested
    dataclasses, the defaults as ``text`` (its yaml) sets them; help from the yaml, else the fields'
    comments."""
    node = yaml.safe_load(text) or {}
    for part in prefix.split(".")[:-1]:
        node = node.get(part) or {}
    block = textwrap.dedent("\n".join(_block(text, prefix)))
    helps = yaml_help(block, file=False) if prefix else yaml_help(text)
    code_help, keys = source_help(schema), []
    hints = typing.get_type_hints(schema, include_extras=True)
    for f in dataclasses.fields(schema):
        if dataclasses.is_dataclass(f.type):
            keys += schema_keys(f.type, text, f"{prefix}{f.name}.")
            continue
        default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        default = node.get(f.name, "(required)" if str(default) == "???" else default)
        kind, valid = _hint_text(hints[f.name])
        valid = valid or "; ".join(map(str, field_checks(f)))
        keys.append(Key(prefix + f.name, default, kind, valid, helps.get(f.name) or code_help.get(f.name)))
    return keys


def _block(text: str, prefix: str) -> list[str]:
    """The indented lines under the top-level key ``prefix`` (``eval.``) of a yaml text."""
    lines, out, inside = text.splitlines(), [], False
    for line in lines:
        if line[:1].strip():
            inside = line.startswith(prefix[:-1] + ":")
        elif inside:
            out.append(line)
    return out


TOP_LEVEL = {"config": RunConfig, "score": ScoreConfig, "serve": ServeConfig}


def option_keys(group: str, option: str) -> list[Key]:
    path = CONF_DIR / group / f"{option}.yaml"
    text = path.read_text()
    return target_keys(yaml.safe_load(text) or {}, text)


def component_groups() -> list[str]:
    """The config groups of components: the folders of ``conf/`` holding yaml, experiments aside."""
    return sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir() and any(p.glob("*.yaml")))


def keys_without_help() -> list[str]:
    """``conf/<group>/<option>.yaml: key`` (and ``conf/<name>.yaml: key`` for the top-level configs) for
    every key without help text (module docstring)."""
    missing = []
    for name, schema in TOP_LEVEL.items():
        text = (CONF_DIR / f"{name}.yaml").read_text()
        missing += [f"conf/{name}.yaml: {k.name}" for k in schema_keys(schema, text) if not k.help]
    for group in component_groups():
        if group in NOT_COMPONENTS:
            continue
        for option in group_options(group):
            keys = option_keys(group, option)
            missing += [f"conf/{group}/{option}.yaml: {k.name}" for k in keys if not k.help]
    return missing


def defaults() -> dict[str, str | None]:
    """Group -> the option ``config.yaml``'s defaults list picks (None for ``null``)."""
    entries = yaml.safe_load((CONF_DIR / "config.yaml").read_text())["defaults"]
    return {k: v for entry in entries if isinstance(entry, dict) for k, v in entry.items()}


def config_groups_table() -> str:
    """The markdown table: one row per folder of ``conf/``, in :data:`PACKAGES` order."""
    groups = sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir() and any(p.glob("*.yaml")))
    unknown, gone = sorted(set(groups) - set(PACKAGES)), sorted(set(PACKAGES) - set(groups))
    if unknown or gone:
        raise RagLabError(
            f"rag_lab/reporting/docs.py PACKAGES is out of step with conf/: add {unknown or 'nothing'}, "
            f"remove {gone or 'nothing'}"
        )
    chosen = defaults()
    rows = ["| group (`conf/…`) | package (`rag_lab/…`) | options (default) |", "| --- | --- | --- |"]
    for group, package in PACKAGES.items():
        options = ", ".join(f"`{option}`" for option in group_options(group))
        if group in chosen:
            options += f" (default: `{chosen[group]}`)" if chosen[group] else " (default: none)"
        rows.append(f"| `{group}` | {package} | {options} |")
    return "\n".join(rows) + "\n"
