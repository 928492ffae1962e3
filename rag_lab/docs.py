"""README.md's generated part: the config-group table, built from the config tree.

``python -m rag_lab.docs`` rewrites the table between the ``<!-- config-groups:begin -->`` and
``<!-- config-groups:end -->`` markers of README.md; ``--check`` only says whether it is stale
(``tests/test_report.py`` runs that check). The options of a group are the yaml stems of
``conf/<group>/`` (the config group is the only registry) and its default comes from
``conf/config.yaml``; only the package column is written here, in :data:`PACKAGES`.
"""

import argparse
import sys

import yaml

from rag_lab import CONF_DIR
from rag_lab.config import group_options
from rag_lab.errors import RagLabError

README = CONF_DIR.parent / "README.md"
BEGIN, END = "<!-- config-groups:begin -->", "<!-- config-groups:end -->"

# Config group -> the package column: the package that mirrors it and what it holds.
PACKAGES = {
    "data": "`data/` — `QAExample`, `Passage`, `Corpus`, loaders, `synth/` (the generated world)",
    "retriever": "`retrievers/` — batched `search(queries, k, exclude)`, on-disk index cache",
    "generator": "`generators/` — `generate(prompts, sampling)`; `env/teacher/`, `train/tiny/`",
    "policy": "`policies/` — `rollout(env, batch)`; a method per package (`fit(...)`: trained policies)",
    "reward": "`rewards/` — pure functions with TRL's signature; a method's policy selects its own",
    "logger": "`loggers/`",
    "judge": "`eval/judge.py` — LLM-as-judge accuracy (DAPO paper B.4 prompt) through any generator",
    "cold_start": "`train/cold_start.py` — SFT on rejection-sampled teacher demonstrations",
    "launch": "`launch.py` — training data-parallel under `accelerate launch` (an accelerate config file)",
    "experiment": "— `# @package _global_` deltas over the defaults",
}


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
            f"rag_lab/docs.py PACKAGES is out of step with conf/: add {unknown or 'nothing'}, "
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


def with_table(readme: str, table: str) -> str:
    """``readme`` with the text between the markers replaced by ``table``."""
    if readme.count(BEGIN) != 1 or readme.count(END) != 1 or readme.index(BEGIN) > readme.index(END):
        raise RagLabError(f"README.md needs one {BEGIN} line followed by one {END} line")
    head, rest = readme.split(BEGIN)
    return f"{head}{BEGIN}\n{table}{END}{rest.split(END)[1]}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rag_lab.docs", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check; exit 1 when README.md is stale")
    args = parser.parse_args(argv)
    try:
        text = README.read_text()
        fresh = with_table(text, config_groups_table())
    except RagLabError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    if args.check:
        if fresh != text:
            print(
                "error: README.md's config-group table is stale: run `python -m rag_lab.docs`",
                file=sys.stderr,
            )
            raise SystemExit(1)
    elif fresh != text:
        README.write_text(fresh)
        print(f"rewrote the config-group table in {README}")


if __name__ == "__main__":
    main()
