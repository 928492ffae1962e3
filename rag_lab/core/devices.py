"""Which device a process's models go to (issue 66): the base layer's, so that every component (generators,
retrievers, policies, trainers) can place its model without importing the run machinery."""

import os

from rag_lab.core.errors import RagLabError


def local_gpu() -> str:
    """This process's GPU: ``cuda:<LOCAL_RANK>`` in a launched process (``accelerate launch``, torchrun and
    Slurm's tasks set ``LOCAL_RANK``: the process's index on its node), ``cuda:0`` in the runner's own; the
    current CUDA device is set to it, so that whatever allocates on a bare ``cuda`` lands there too. Every
    rank on GPU 0 is the first out-of-memory a user of 8 GPUs meets. More processes on a node than it has
    GPUs is one line naming the setting."""
    import torch

    local = int(os.environ.get("LOCAL_RANK") or 0)
    gpus = torch.cuda.device_count()
    if local >= gpus:
        raise RagLabError(
            f"launch.config.num_processes: process {local} of this node has no GPU (the node has {gpus}); "
            "start at most one process a GPU on each node"
        )
    torch.cuda.set_device(local)
    return f"cuda:{local}"
