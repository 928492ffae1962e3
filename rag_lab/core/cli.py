"""What the command lines (``python -m rag_lab.run``, ``.score``, ``.serve``, ``.index``, the cold start)
share: the config tree's yaml checked before Hydra reads it, the config folders a command line adds, the
``key=value`` overrides of the commands that compose a config outside ``@hydra.main``, and a job's
overrides checked against the rows of an experiment's sweep (:func:`check_row_overrides`) and against the
nodes the config sets by interpolation (:func:`check_below_interpolations`)."""

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from rag_lab import CONF_DIR
from rag_lab.core.config import ConfigError, group_options


def run_as_main(module: str, args: Sequence[str]) -> None:
    """``python -m <module> <args>`` inside this process: the module run as ``__main__`` by
    :func:`runpy.run_module` (what ``python -m`` does), with ``sys.argv`` as ``python -m`` sets it, restored
    after (``rag-lab <command>``, ``python -m rag_lab.quickstart``)."""
    import runpy
    import sys

    saved = sys.argv[:]
    sys.argv[1:] = list(args)
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        sys.argv[:] = saved


def check_yaml_files(conf_dirs: list[Path] | None = None) -> None:
    """Parse every yaml of the config tree(s); a syntax error becomes one line naming file, line, column.

    Hydra would report it too, but deep inside a long traceback. ``conf_dirs`` defaults to the shipped
    tree; :func:`user_config_dirs` adds the folders a command line puts on Hydra's search path.
    """
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser: 8x faster, same checks
    for conf_dir in conf_dirs or [CONF_DIR]:
        for path in sorted(Path(conf_dir).rglob("*.yaml")):
            try:
                yaml.load(path.read_text(), Loader=loader)
            except yaml.YAMLError as e:
                mark = getattr(e, "problem_mark", None)
                where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
                problem = getattr(e, "problem", None) or str(e).splitlines()[0]
                raise ConfigError(f"{where}: malformed yaml ({problem})") from None


def user_config_dirs(argv: list[str]) -> list[Path]:
    """The config folders a command line adds: ``--config-dir`` / ``-cd`` and ``hydra.searchpath``.

    >>> user_config_dirs(["-cd", "/a", "hydra.searchpath=[file:///b,pkg://x]", "seed=1"])
    [PosixPath('/a'), PosixPath('/b')]
    """
    dirs: list[str] = []
    for i, arg in enumerate(argv):
        if arg in ("--config-dir", "-cd") and i + 1 < len(argv):
            dirs.append(argv[i + 1])
        elif arg.startswith("--config-dir="):
            dirs.append(arg.split("=", 1)[1])
        elif arg.lstrip("+").startswith("hydra.searchpath="):
            items = arg.split("=", 1)[1].strip("[]")
            dirs += [item.strip().strip("'\"") for item in items.split(",") if item.strip()]
    paths = [d.removeprefix("file://") for d in dirs if not d.startswith("pkg://")]
    return [Path(d).expanduser() for d in paths]


def cli_overrides(argv: list[str], doc: str, config_name: str) -> list[str]:
    """The ``key=value`` overrides of a command line that composes ``conf/<config_name>.yaml``.

    ``-h`` / ``--help`` prints ``doc`` (what the command does, an example), that yaml (the options,
    with their comments) and the options of its config groups, then exits; another ``-flag`` is an
    error, since these commands take Hydra overrides only.
    """
    if any(a in ("-h", "--help") for a in argv):
        path = CONF_DIR / f"{config_name}.yaml"
        text = path.read_text()
        groups = [g for g in (CONF_DIR.iterdir()) if g.is_dir() and f"- {g.name}:" in text]
        listing = "".join(f"  {g.name}: {', '.join(group_options(g.name))}\n" for g in sorted(groups))
        print(
            f"{doc.strip()}\n\nConfig groups (group=option):\n{listing}\nOptions (key=value), {path}:\n{text}"
        )
        raise SystemExit(0)
    flags = [a for a in argv if a.startswith("-")]
    if flags:
        raise ConfigError(f"unknown option '{flags[0]}': this command takes key=value overrides (see --help)")
    check_experiment_overrides(argv)
    return argv


def check_experiment_overrides(argv: Sequence[str]) -> None:
    """``experiment`` is a group of the defaults list (``experiment: null``), and an experiment's rows are a
    group of its own defaults (``/experiment/compare_synth: null``): ``experiment=<name>`` selects one. The
    ``+`` that 0.1.0 wrote (``+experiment=<name>``, ``+experiment/<group>=<row>``) is refused in one line
    naming the form to write, instead of Hydra's "Multiple values for experiment"."""
    for arg in argv:
        key, eq, value = arg.partition("=")
        if eq and key.startswith("+") and not key.startswith("++"):
            name = key[1:]
            if name == "experiment" or name.startswith("experiment/"):
                raise ConfigError(
                    f"override '{arg}': write {name}={value} (no '+': experiment is a default of the config, "
                    "and an experiment's rows are a default of the experiment)"
                )


def flat_keys(node: Any, prefix: str = "") -> set[str]:
    """The dotted keys a yaml mapping sets (its ``defaults`` list aside).

    >>> sorted(flat_keys({"policy": {"stages": [1], "k": 3}, "defaults": [], "seed": 0}))
    ['policy.k', 'policy.stages', 'seed']
    """
    if not isinstance(node, dict):
        return {prefix}
    out: set[str] = set()
    for key, value in node.items():
        if key != "defaults" or prefix:
            out |= flat_keys(value, f"{prefix}.{key}" if prefix else str(key))
    return out


def check_row_overrides(overrides: Sequence[str], conf_dir: Path = CONF_DIR) -> None:
    """A job's overrides must not set a key that one of its experiment rows (``experiment/<group>=<row>``:
    a sweep's row, as in ``dapo_ablation``) sets too: the override would win in every row, and rows
    labelled by what they change would all run the same thing. ConfigError naming both."""
    rows, plain = {}, {}
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        path = conf_dir / key / f"{value}.yaml"
        if key.startswith("experiment/") and path.exists():
            rows[override] = flat_keys(yaml.safe_load(path.read_text()) or {})
        else:
            plain[key] = override
    for row, keys in rows.items():
        for key, override in plain.items():
            if key in keys:
                raise ConfigError(
                    f"override '{override}' sets {key}, which the experiment's row '{row}' sets too: every "
                    f"row would run with it, under its own label; drop the override, or sweep over {key}"
                )


def check_below_interpolations(overrides: Sequence[str], compose_without: Callable[[list[str]], Any]) -> None:
    """A ``+`` / ``++`` override of a key below a node that the config sets by interpolation
    (``++policy.cold_start.max_steps=200`` where ``dapo_synth`` says ``policy.cold_start:
    ${experiment.cold_start}``) would not reach the node it points to: OmegaConf replaces the interpolation
    with a new node holding only that key, and the run would lack every other one. A multirun's component
    overrides take ``++`` (:func:`rag_lab.runner.sweeps.soften`), so this is where the trap is.
    ``compose_without`` composes the job's config without the overrides under test; ConfigError naming the
    override and the key to set instead."""
    keys = {o: o.lstrip("+").partition("=")[0] for o in overrides if o.startswith("+")}
    # a dotted key, not a config group (``+cold_start@experiment.cold_start=r3rag_cs``, ``+group/x=y``)
    added = [o for o, key in keys.items() if "." in key and not set("@/") & set(key)]
    if not added:
        return
    base = compose_without([o for o in overrides if o not in added])
    for override in added:
        key, _, value = override.lstrip("+").partition("=")
        parts = key.split(".")
        for depth in range(1, len(parts)):
            parent = OmegaConf.select(base, ".".join(parts[: depth - 1])) if depth > 1 else base
            name = parts[depth - 1]
            if not isinstance(parent, DictConfig) or name not in parent:
                break
            if OmegaConf.is_interpolation(parent, name):
                text = parent._get_node(name)._value()
                target = re.fullmatch(r"\$\{([\w.]+)\}", text)
                rest = ".".join(parts[depth:])
                instead = f"set {target[1]}.{rest}={value} instead" if target else "set the key it points to"
                raise ConfigError(
                    f"override '{override}': {'.'.join(parts[:depth])} is {text} in this config, and the "
                    f"override would replace it with a node holding only {rest}; {instead}"
                )
