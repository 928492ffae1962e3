"""A launched job for test_launch.py's killed-rank test (``accelerate launch -m launched_kill <job.json>``):
both ranks make the process group and meet once; then rank 1 is killed by SIGKILL, as the out-of-memory
killer would (the time written beside the job first), and rank 0 waits for it in a collective."""

import os
import signal
import sys
import time


def main(job_file: str) -> None:
    import json
    from pathlib import Path

    from rag_lab.runner.launch import report_rank
    from rag_lab.train.parallel import barrier, state

    job = json.loads(Path(job_file).read_text())
    with report_rank():
        group = state(job["timeout_s"])
        barrier()
        if group.process_index == 1:
            Path(job_file).with_name("killed_at").write_text(str(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        barrier()  # rank 0 waits here for the rank that is gone


if __name__ == "__main__":
    main(sys.argv[1])
