"""``rag-lab <command> [args ...]``: one console script for every command (``python -m rag_lab`` too).

    rag-lab quickstart
    rag-lab run experiment=stoprag_synth
    rag-lab run -m generator=tiny policy=direct,standard_rag
    rag-lab report outputs/demo
    rag-lab run --help                      # the command's own help

``rag-lab X args`` runs ``python -m rag_lab.X args``: the command's module is run as ``__main__`` by
:func:`runpy.run_module` (what ``python -m`` itself does), with ``sys.argv`` as ``python -m`` sets it. So
Hydra's command line (``--help``, ``--cfg job``, ``-m``), its job name and the command's own help and errors
are the same under both spellings. The commands are found by module name, not imported here: ``rag-lab
--help`` starts in a blink, and a command this install lacks is one line.

Hand-written: git-style dispatch to modules that already parse their own command lines (Hydra's and
argparse's); a subcommand parser (argparse's ``add_subparsers``) would parse them a second time.
"""

import importlib.util
import sys

from rag_lab.core.cli import run_as_main

# The commands, each one line in ``rag-lab --help``; ``rag_lab/<name>.py`` runs it.
COMMANDS = {
    "quickstart": "a first result in about a minute: a small table on the embedded world",
    "run": "compose a config, train the policy when it trains, evaluate it, write the run dir (Hydra)",
    "report": "fold run dirs into one table; --compare tests two runs question by question",
    "claims": "judge the papers' claims (conf/claims.yaml) on run outputs; writes claims.md",
    "score": "score predictions made anywhere with a dataset's official rules",
    "index": "build a retriever's index ahead of time (cached for later runs)",
    "serve": "serve a generator (OpenAI-compatible) or a retriever over HTTP",
    "plan": "each GPU's memory for a run, planned without a GPU",
}
PROG = "rag-lab"


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {summary}" for name, summary in COMMANDS.items()]
    return (
        f"usage: {PROG} <command> [args ...]   (the same as: python -m rag_lab.<command> [args ...])\n\n"
        "commands:\n" + "\n".join(lines) + f"\n\n{PROG} <command> --help shows a command's own help.\n"
    )


def fail(message: str) -> None:
    """One line and exit status 1, as :func:`rag_lab.core.errors.one_line_errors` ends a command."""
    print(f"error: {PROG}: {message}", file=sys.stderr)
    raise SystemExit(1)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(usage())
        raise SystemExit(0 if argv else 2)
    if argv[0] == "--version":
        from rag_lab import __version__

        print(f"rag_lab {__version__}")
        return
    name, args = argv[0], argv[1:]
    if name not in COMMANDS:
        fail(f"unknown command '{name}' (commands: {', '.join(COMMANDS)}; {PROG} --help)")
    module = f"rag_lab.{name}"
    if importlib.util.find_spec(module) is None:
        fail(f"'{name}' is not in this install of rag_lab (no module {module}); update rag_lab")
    run_as_main(module, args)


if __name__ == "__main__":
    main()
