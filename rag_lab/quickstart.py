"""``python -m rag_lab.quickstart [key=value ...]`` (``rag-lab quickstart``, ``make quickstart``): the first
result, a small table on the generated world in well under a minute on 2 CPU cores.

It is ``python -m rag_lab.run experiment=quickstart hydra.sweep.dir=outputs/quickstart``: the experiment
(``conf/experiment/quickstart.yaml``) trains APEX-Searcher's planner for 10 GRPO steps and evaluates it beside
its untrained start and two baselines on 200 test questions; the table (``outputs/quickstart/compare.md``) is
printed at the end. Other ``key=value`` overrides go to the runner as they are (``seed=1``,
``eval.limit=null``, ``hydra.sweep.dir=elsewhere``); a sweep dir that holds another config's results is
refused in one line, as the runner refuses it. ``make demo`` is the full comparison (every method, ~12 min).

Hand-written: a fixed command line for the runner, run as ``python -m rag_lab.run`` runs it
(:func:`runpy.run_module`), so its checks, its help and its errors are the runner's.
"""

import sys

from rag_lab.core.cli import run_as_main

EXPERIMENT = "experiment=quickstart"
SWEEP_DIR = "outputs/quickstart"


def command_line(argv: list[str]) -> list[str]:
    """The runner's arguments: the experiment, the sweep dir unless ``argv`` names one, then ``argv``.

    >>> command_line(["seed=1"])
    ['experiment=quickstart', 'hydra.sweep.dir=outputs/quickstart', 'seed=1']
    >>> command_line(["hydra.sweep.dir=/tmp/q"])
    ['experiment=quickstart', 'hydra.sweep.dir=/tmp/q']
    """
    named = any(arg.lstrip("+").startswith("hydra.sweep.dir=") for arg in argv)
    return [EXPERIMENT, *([] if named else [f"hydra.sweep.dir={SWEEP_DIR}"]), *argv]


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(arg in ("-h", "--help") for arg in argv):
        print(__doc__.replace("``", "`"))
        raise SystemExit(0)
    run_as_main("rag_lab.run", command_line(argv))


if __name__ == "__main__":
    main()
