"""A launched job for test_two_nodes.py (``accelerate launch -m launched_two_nodes <job.json>``, the command
rag_lab.runner.launch.Launch builds for each node of a Slurm job): every process, on whichever node, trains
``job["trainers"]`` of tests/data_parallel.py on its share of each global batch; rank 0 saves the weights."""

import sys
from pathlib import Path


def main(job_file: str) -> None:
    import json

    import torch
    from data_parallel import main as train

    from rag_lab.runner.launch import report_rank
    from rag_lab.train.parallel import state

    job = json.loads(Path(job_file).read_text())
    torch.set_num_threads(1)
    with report_rank():
        state(job["timeout_s"])  # the process group of both nodes, with the launch's timeout
        train(job["trainers"], job["model_dir"], job["work"], job["out"])


if __name__ == "__main__":
    main(sys.argv[1])
