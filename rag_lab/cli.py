"""What the command lines (``python -m rag_lab.run``, ``.score``, ``.serve``, ``.index``, the cold start)
share: the config tree's yaml checked before Hydra reads it, the config folders a command line adds, and the
``key=value`` overrides of the commands that compose a config outside ``@hydra.main``."""

from pathlib import Path

from rag_lab import CONF_DIR
from rag_lab.config import ConfigError, group_options


def check_yaml_files(conf_dirs: list[Path] | None = None) -> None:
    """Parse every yaml of the config tree(s); a syntax error becomes one line naming file, line, column.

    Hydra would report it too, but deep inside a long traceback. ``conf_dirs`` defaults to the shipped
    tree; :func:`user_config_dirs` adds the folders a command line puts on Hydra's search path.
    """
    import yaml

    for conf_dir in conf_dirs or [CONF_DIR]:
        for path in sorted(Path(conf_dir).rglob("*.yaml")):
            try:
                yaml.safe_load(path.read_text())
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
    return argv
