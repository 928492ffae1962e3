"""``launch.memory``: the GPU a sharded launch runs on, and what its memory plan assumes where the config says
nothing (:mod:`rag_lab.train.memory`; docs/how-to/gpu-memory.md)."""

from typing import Annotated

from rag_lab.core.ranges import Positive, PositiveInt, Range


class MemorySettings:
    def __init__(
        self,
        # each GPU's memory in GiB as torch.cuda reports it (an H100 80GB: 79.1, less than its 80 decimal GB
        # and its 81,559 MiB in nvidia-smi; an H200: 139.8)
        gpu_memory_gib: Positive = 79.1,
        # the share of it the plan keeps free (the CUDA context, the allocator's fragmentation): 0.1 bounds an
        # H100's plan at 71.2 GiB (76.4 GB)
        headroom: Annotated[float, Range(0, 1, open_max=True)] = 0.1,
        # tokens of a prompt's instructions and question, and of one retrieved passage: the lengths the config
        # does not bound (a multi-turn sequence is the prompt, then each turn's output and passages)
        prompt_tokens: PositiveInt = 512,
        passage_tokens: PositiveInt = 160,
        # plan before a GPU launch trains, and stop a plan over the bound in one line (false: skip the check;
        # python -m rag_lab.plan still plans)
        check: bool = True,
    ):
        self.gpu_memory_gib = float(gpu_memory_gib)
        self.headroom = float(headroom)
        self.prompt_tokens = int(prompt_tokens)
        self.passage_tokens = int(passage_tokens)
        self.check = check

    # the same settings: a launch's node composed twice compares equal
    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(self) == vars(other)

    __hash__ = None

    @property
    def gpu_bytes(self) -> int:
        return int(self.gpu_memory_gib * 2**30)
