"""What every trainer does to run data-parallel: the same code in 1 or N processes (issue 50).

A run with ``launch`` set (:mod:`rag_lab.runner.launch`) trains in N processes started by ``accelerate
launch`` (:mod:`rag_lab.runner.launched`: each rebuilds the run and calls the policy's ``fit``). In each
trainer:

- data every process needs but one should make quickly (the tiny LM's recipe's caches, a BM25 index):
  :func:`main_first`, so the main process builds the cache and the others read it;
- a global batch split into equal shares, one per process (:func:`share`), so N processes make the
  update of one (TRL's trainers take the share as ``per_device_train_batch_size``; accelerate's
  data loader hands process i every N-th share of the global batch);
- the result published by the main process alone (:func:`publish_on_main`), the others waiting for it;
- rollouts, encodings and evaluations (EVO-RAG's branches and dev EM, the held-out curves, Stop-RAG's
  offline data and state encodings, the cold start's demonstrations, the run's evaluation): :func:`spread`,
  so each process does every N-th unit of work and every process gets all the results, in order (no process
  waits in a collective while the main one works alone, issue 66); what is already done, as the main process
  reads it: :func:`from_main`; a count of each process's share: :func:`summed`;
- a hand-written training loop (Stop-RAG's Q-network, EVO-RAG's preference model) takes every N-th item of
  each batch and sums the gradients across the processes before its optimiser steps
  (:func:`shared_backward`), so N processes make the step of one.

In one process (no ``accelerate launch``) each helper is the plain single-process step. Hand-written: only
these few lines over accelerate's ``PartialState`` (its process index, barrier and
``main_process_first``); process groups, gradient all-reduce and the gathering of results are accelerate's
and torch's.

Resuming several CPU processes: transformers' ``Trainer`` loads the optimiser's checkpoint with
``map_location=args.device``, which is ``cpu:<i>`` in a multi-process CPU run, and torch's loader knows the
location ``cpu`` only ("don't know how to restore data location ... cpu:0": found by the killed 2-process
test). :func:`_indexed_cpu` teaches torch's loader (``torch.serialization.register_package``, its extension
point) that ``cpu:<i>`` is the CPU.
"""

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import torch

from rag_lab.core.errors import RagLabError
from rag_lab.train.sharded import fsdp_on_cpu, make_cpu_fsdp


def _indexed_cpu(storage, location: str):
    """A storage to restore at ``cpu:<i>``: the CPU, as it is (None: another location, another loader's)."""
    return storage if location.startswith("cpu:") else None


torch.serialization.register_package(11, lambda _: None, _indexed_cpu)
R = TypeVar("R")


def state(timeout_s: int | None = None):
    """accelerate's ``PartialState`` (one process unless launched by ``accelerate launch``), on the CPU
    where no GPU is (gloo between CPU processes: without ``cpu``, accelerate takes a CPU-only launched
    process for a single one), as TRL's trainers and R3-RAG's PPO make it. ``timeout_s``
    (``launch.timeout_s``, :mod:`rag_lab.runner.launched`): the process group's timeout in a collective, where
    this call makes the group (the first in a process)."""
    from datetime import timedelta

    import torch
    from accelerate import PartialState

    extra = {"timeout": timedelta(seconds=timeout_s)} if timeout_s and processes() > 1 else {}
    partial = PartialState(cpu=not torch.cuda.is_available(), **extra)
    if partial.distributed_type == "MULTI_CPU" and fsdp_on_cpu():
        make_cpu_fsdp()
    return partial


# set by rag_lab.runner.launched from the launch's gradient_checkpointing (a launched process's trainers read
# it)
CHECKPOINTING_ENV = "RAG_LAB_GRADIENT_CHECKPOINTING"


def gradient_checkpointing() -> dict:
    """TRL's gradient-checkpointing keys for this process: on where the launch asks for it
    (``launch.gradient_checkpointing``), non-reentrant (what FSDP and ZeRO-3 need); off elsewhere (a small
    model only slows down)."""
    on = os.environ.get(CHECKPOINTING_ENV) == "1"
    return {
        "gradient_checkpointing": on,
        "gradient_checkpointing_kwargs": {"use_reentrant": False} if on else None,
    }


def processes() -> int:
    """How many processes train together: ``WORLD_SIZE``, as ``accelerate launch`` (and torchrun, and
    accelerate's ``debug_launcher``) sets it for each process; 1 when not launched. Read from the
    environment, so asking starts no process group."""

    return max(1, int(os.environ.get("WORLD_SIZE") or 1))


def rank() -> int:
    """This process's index among the launched ones (0 when not launched)."""
    return state().process_index if processes() > 1 else 0


def own_key(key: str) -> str:
    """``key`` (a seed string) made this process's own: unchanged in the main process, so one process draws
    what it drew before; ``<key>/<rank>`` in the others."""
    return f"{key}/{rank()}" if rank() else key


def own_seed(seed: int) -> int:
    """``seed`` made this process's own (:func:`own_key`'s rule, for integer seeds)."""
    return seed + 7_919 * rank()


def is_main() -> bool:
    return processes() == 1 or state().is_main_process


def barrier() -> None:
    """Every process waits here for the others (nothing in one process)."""
    if processes() > 1:
        state().wait_for_everyone()


def share(global_batch: int, key: str) -> int:
    """This process's share of a global batch of ``global_batch`` (named ``key`` in errors): equal shares,
    or a one-line error (checked at compose as well: :func:`rag_lab.core.batches.divides`)."""
    n = processes()
    if global_batch % n:
        raise RagLabError(
            f"launch: {n} processes do not divide {key}={global_batch} (each takes an equal share)"
        )
    return global_batch // n


@contextlib.contextmanager
def main_first() -> Iterator[None]:
    """The main process runs the block first (building a cache), then the others (reading it)."""
    if processes() == 1:
        yield
        return
    with state().main_process_first():
        yield


def publish_on_main(write: Callable[[], object]) -> None:
    """``write()`` (which publishes a result) in the main process only; every process waits until it did."""
    if is_main():
        write()
    barrier()


def shared_backward(batch: Sequence[Any], loss_of: Callable[[list], Any], params: list) -> Any:
    """The gradient of ``loss_of(batch)`` into ``params``' ``.grad``, this process computing it on its share
    of the batch (every N-th item) and the shares summed across the processes (accelerate's ``reduce``, one
    exchange); the whole batch's loss. ``loss_of`` must add over items (a sum, or a mean scaled by its share
    of the batch). A parameter no process's loss reached keeps ``grad`` None, so the optimiser leaves it
    alone (weight decay included), as in one process."""
    import torch

    n = processes()
    mine = list(batch[state().process_index :: n]) if n > 1 else list(batch)
    loss = loss_of(mine) if mine else None
    if loss is not None:
        loss.backward()
    if n == 1:
        return loss
    from accelerate.utils import reduce

    device = params[0].device
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    reached = torch.tensor([float(p.grad is not None) for p in params], device=device)
    own = loss.detach().view(1) if loss is not None else torch.zeros(1, device=device)
    summed, offset = reduce(torch.cat([g.flatten() for g in grads] + [reached, own]), reduction="sum"), 0
    for p, g, hit in zip(params, grads, summed[-1 - len(params) : -1], strict=True):
        p.grad = summed[offset : offset + g.numel()].view_as(g) if hit > 0 else None
        offset += g.numel()
    return summed[-1]


def my_units(n: int, processes: int, rank: int) -> list[int]:
    """The units of work, of ``n``, that process ``rank`` of ``processes`` does: every ``processes``-th from
    its own index (none where ``n`` is smaller than its index).

    >>> my_units(7, 2, 0), my_units(7, 2, 1), my_units(1, 2, 1)
    ([0, 2, 4, 6], [1, 3, 5], [])
    """
    return list(range(rank, n, processes))


def spread(
    n: int, work: Callable[[list[int]], Sequence[R]], finish: Callable[[], None] | None = None
) -> list[R]:
    """The results of ``n`` units of work, unit 0 first, in every process: this process does its units
    (:func:`my_units`; ``work(units)`` returns one result per unit, which must not depend on which other units
    it was given), and the results are gathered (accelerate's ``gather_object``, picklable results). Every
    process calls it at the same point, one with no unit too: it calls no ``work`` and joins the gather.
    ``finish()``: called in every process once its units are done (or it had none), before the gather: the
    end of a generation phase that the other processes may still need (a sharded model's lockstep, a TP
    group's engine: :func:`rag_lab.generators.vllm.rollouts_done`)."""
    world = processes()
    mine = my_units(n, world, rank())
    done = list(zip(mine, work(mine), strict=True)) if mine else []
    if finish is not None:
        finish()
    if world > 1:
        from accelerate.utils import gather_object

        done = gather_object(done)
    return [result for _, result in sorted(done, key=lambda unit: unit[0])]


def from_main(make: Callable[[], R]) -> R:
    """``make()`` in the main process, its result in every process (accelerate's ``broadcast_object_list``,
    picklable): what the main process reads of a file or a cache, so that the processes agree on the work
    left (a file another process cannot read, or one a kill cut at another line, says the same to all)."""
    if processes() == 1:
        return make()
    from accelerate.utils import broadcast_object_list

    box = [make() if is_main() else None]
    broadcast_object_list(box, from_process=0)
    return box[0]


def summed(value: int) -> int:
    """``value`` added up over the processes (a count each process made of its own share of the work)."""
    if processes() == 1:
        return value
    from accelerate.utils import gather_object

    return sum(gather_object([value]))
