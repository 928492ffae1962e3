"""Each GPU's memory for a run, planned without a GPU: ``python -m rag_lab.plan <the run's overrides>``.

    python -m rag_lab.plan experiment=dapo_2wiki launch=fsdp generator=vllm
    python -m rag_lab.plan experiment=r3rag_hotpotqa launch=fsdp launch.config.num_machines=2 \\
        launch.config.num_processes=16
    python -m rag_lab.plan generator=smollm2 experiment=dapo_synth launch=fsdp launch.config.num_processes=1
    python -m rag_lab.plan ... --markdown          # the ledger as a markdown table

Composes the run's config as ``python -m rag_lab.run`` does (the same overrides, the same one-line errors),
builds the run's model from its real architecture with fake weights, shards it over a fake process group of
the launch's processes as accelerate's FSDP2 path does, runs one step of each trainer the method uses, and
prints one GPU's ledger, phase by phase (rollout, update, save): policy shards, gradients, optimizer state,
reference, critic and value head, the generation engine's reservation, activations, temporaries and all-gather
buffers, encoders; its peak, and whether it stays under ``launch.memory``'s bound (exit status 1 when not).
The launch's GPU, headroom and the token budgets the config leaves open are ``launch.memory``'s keys
(docs/how-to/gpu-memory.md). Plans FSDP2 launches (launch=fsdp) of training policies.
"""

import sys

from rag_lab import CONF_DIR
from rag_lab.core.cli import check_yaml_files, cli_overrides, user_config_dirs
from rag_lab.core.config import compose
from rag_lab.core.errors import one_line_errors

MARKDOWN = "--markdown"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    markdown = MARKDOWN in argv
    argv = [a for a in argv if a != MARKDOWN]
    with one_line_errors():
        from rag_lab.train.memory.planner import plan

        check_yaml_files([CONF_DIR, *user_config_dirs(argv)])
        cfg = compose(cli_overrides(argv, __doc__, "config"))
        ledger = plan(cfg)
    print(f"{ledger.headline()}\n\n{ledger.markdown()}" if markdown else ledger.text())
    return 1 if ledger.over() else 0


if __name__ == "__main__":
    sys.exit(main())
