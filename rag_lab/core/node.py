"""The processes of one node (machine), for work made once a node and shared through files (issue 72): the
dense index's passage embeddings and its faiss index (rag_lab/retrievers/dense.py). The base layer's, so that
a retriever can split work between the processes of its node without importing the run machinery.

``rag_lab.train.parallel`` spreads work over every process of a job and gathers it through the process group;
this shares it through the files alone: no collective, so a process that finds the work done waits for
nothing, and the processes need not reach this point in lockstep. ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` are
set in every process by torch's elastic launcher, which ``accelerate launch`` (and torchrun) runs: the
process's index on its node and the number of processes on it. Not launched, a process is alone on its node.
"""

import os
import time
from collections.abc import Sequence
from pathlib import Path

from rag_lab.core.errors import RagLabError

# Seconds a process waits for the other processes of its node with no new file appearing before it stops in
# one line (a process that stopped without ending the job). A 100k-passage shard takes a minute on a GPU, an
# hour on 2 CPU cores with E5-base; a faiss IVF index of 21M passages trains and fills in under an hour.
STALL_S = 7200.0


def local_rank() -> int:
    """This process's index among its node's processes (0 when not launched)."""
    return int(os.environ.get("LOCAL_RANK") or 0)


def local_processes() -> int:
    """How many processes of the job run on this node (1 when not launched)."""
    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE") or 1))


def wait_for(paths: Sequence[Path], what: str, stall_s: float = STALL_S, poll_s: float = 0.1) -> None:
    """Return once every one of ``paths`` exists (written by another process of the node, published by a
    rename so that it exists whole or not at all). A RagLabError naming ``what`` when ``stall_s`` seconds
    pass with none of them appearing."""
    missing = [p for p in paths if not p.exists()]
    last_progress = time.monotonic()
    while missing:
        time.sleep(poll_s)
        still = [p for p in missing if not p.exists()]
        if len(still) < len(missing):
            last_progress = time.monotonic()
        elif time.monotonic() - last_progress > stall_s:
            names = ", ".join(p.name for p in still[:3]) + (" ..." if len(still) > 3 else "")
            raise RagLabError(
                f"{what}: process {local_rank()} of this node waited {stall_s:g} s for the node's other "
                f"processes to write {names} (in {still[0].parent}) and none appeared: did one stop?"
            )
        missing = still
