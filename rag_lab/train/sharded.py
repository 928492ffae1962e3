"""What a trainer does with a model that FSDP or ZeRO-3 has sharded across the processes (issue 66).

A sharded model holds 1/N of each weight in each process, so four things a one-process trainer does
directly become collectives that every process must call together:

- **its full weights** (:func:`full_state_dict`): FSDP2's full state dict (torch's ``get_model_state_dict``
  with ``full_state_dict`` and ``cpu_offload``, as accelerate's ``get_state_dict`` calls it: gathered once
  onto the main process's host memory), or ZeRO-3's gathered 16-bit one (accelerate's
  ``get_state_dict``); the model's own ``state_dict`` when nothing is sharded;
- **saving it** (:func:`saveable`, issue 72): those full weights, in the dtype the model was loaded in,
  around which the main process alone builds an unsharded model (on the meta device, the tensors
  assigned; LoRA merged: :func:`merged_copy`) to ``save_pretrained``, so the result loads back as one
  ordinary checkpoint;
- **checkpointing it for resume** (:func:`save_sharded`, :func:`load_sharded`, issue 72): torch's
  distributed checkpoint of the model's and the optimizer's states (``get_state_dict`` /
  ``set_state_dict``), each process writing and reading its own shards, so nothing is gathered and a
  checkpoint resumes into any number of processes;
- **generating with it**: not here. Rollouts generate on the sharded model itself, every process in step
  (:mod:`rag_lab.train.lockstep`), or on a vLLM engine synced one tensor at a time
  (:mod:`rag_lab.train.vllm_engine`); no copy of the weights is made for them.

Hand-written: only which call applies when; gathering, sharding and saving are torch's, accelerate's and
transformers' own.
"""

import contextlib
import copy
import os
from collections.abc import Iterator
from pathlib import Path

import torch


def fsdp_modules(model: torch.nn.Module) -> bool:
    """Whether ``model`` (or a module in it) was sharded by FSDP2 (torch's ``fully_shard``)."""
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in model.modules())


def zero3(accelerator) -> bool:
    plugin = getattr(getattr(accelerator, "state", None), "deepspeed_plugin", None)
    return bool(plugin) and plugin.zero_stage == 3


def sharded(accelerator) -> bool:
    """Whether ``accelerator`` shards the models it prepares (FSDP, or DeepSpeed ZeRO-3)."""
    from accelerate.utils import DistributedType

    return accelerator.distributed_type == DistributedType.FSDP or zero3(accelerator)


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside DDP's / DeepSpeed's wrapper (FSDP2 wraps in place: the module itself)."""
    from accelerate.utils import extract_model_from_parallel

    return extract_model_from_parallel(model)


def full_state_dict(
    model: torch.nn.Module, accelerator=None, everywhere: bool = False
) -> dict[str, torch.Tensor]:
    """The model's full weights in host memory, keys as the unwrapped model's; a collective under FSDP2 and
    ZeRO-3 (every process calls it). Gathered once, onto the main process only, with CPU offload (torch's
    ``get_model_state_dict`` with ``full_state_dict`` and ``cpu_offload``: the other processes get {}, and
    no GPU ever holds the whole model; ZeRO-3: accelerate's gathered 16-bit one). ``everywhere``: every
    process gets them (a small network each process evaluates: Stop-RAG's Q-network; an unsharded
    generation copy). Unsharded: the model's own, in every process."""
    if fsdp_modules(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=not everywhere)
        weights = get_model_state_dict(model, options=options)
        return {k: _own(v) for k, v in weights.items()}
    if accelerator is not None and zero3(accelerator):
        return accelerator.get_state_dict(model)
    return {k: v.detach().cpu() for k, v in unwrapped(model).state_dict().items()}


def _own(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in host memory of its own: torch's CPU offload copies a GPU tensor, but leaves a CPU one as
    it is, a view of FSDP2's gathered buffer that is freed when its layer reshards (``launch=fsdp_cpu``)."""
    tensor = tensor.detach()
    return tensor.clone() if tensor.device.type == "cpu" else tensor.cpu()


def merged_copy(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> torch.nn.Module:
    """An unsharded copy of ``model`` holding ``weights`` (its full state dict), LoRA adapters merged into
    the base weights (PEFT's ``merge_and_unload``): the model a one-process run would save."""
    inner = unwrapped(model)
    peft = hasattr(inner, "peft_config")
    base = inner.get_base_model() if peft else inner
    with torch.device("meta"):
        plain = type(base)(copy.deepcopy(base.config))
    own = dict(base.named_buffers())
    for name, buffer in list(plain.named_buffers()):  # no weights (rotary frequencies): copied as they are
        if buffer.is_meta:
            module, _, attr = name.rpartition(".")
            plain.get_submodule(module).register_buffer(attr, own[name].clone(), persistent=False)
    if peft:
        from peft import get_peft_model

        plain = get_peft_model(plain, copy.deepcopy(inner.peft_config["default"]))
    plain.load_state_dict(weights, assign=True, strict=True)
    if hasattr(plain, "tie_weights"):
        plain.tie_weights()
    return plain.merge_and_unload() if peft else plain


def reshard(model: torch.nn.Module) -> None:
    """Every FSDP unit of ``model`` back to its shards: a unit that does not reshard after its forward
    (accelerate's last one: the final norm with the embeddings) stays gathered until a backward, which a
    frozen model never runs."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def fsdp_launch() -> bool:
    """Whether this is a launched process whose launch shards models with FSDP (``launch=fsdp``,
    ``launch=fsdp_cpu``): a hand-written loop then prepares its network through accelerate as well."""
    return _world() > 1 and os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true"


def _world() -> int:
    """``WORLD_SIZE`` as ``accelerate launch`` sets it (:func:`rag_lab.train.parallel.processes`)."""
    return max(1, int(os.environ.get("WORLD_SIZE") or 1))


def sharded_backward(batch: list, loss_of, accelerator) -> torch.Tensor:
    """:func:`rag_lab.train.parallel.shared_backward`'s step for a network FSDP has sharded: each process
    takes every N-th item of ``batch``, padded to as many items as the largest share with weight-0
    repeats (a sharded forward is a collective: every process makes the same passes); ``loss_of(items,
    weights)`` is their weighted sum. FSDP averages the gradients over the processes, so the loss is
    scaled by N: the sum over the whole batch, the step of one process. Returns the whole batch's loss."""
    n, rank = accelerator.num_processes, accelerator.process_index
    mine, width = list(batch[rank::n]), -(-len(batch) // n)
    weights = torch.tensor([1.0] * len(mine) + [0.0] * (width - len(mine)))
    loss = loss_of(mine + [batch[0]] * (width - len(mine)), weights)
    accelerator.backward(loss * n)
    return accelerator.reduce(loss.detach(), reduction="sum")


# the tag of a ZeRO-3 engine's checkpoint in the folder save_sharded names
DEEPSPEED_TAG = "zero3"


def save_sharded(path: Path, model: torch.nn.Module, optimizer, weights: bool = True) -> None:
    """The optimizer's state (and with ``weights`` the model's) written into the directory ``path`` by torch's
    distributed checkpoint, each process its own shards (no process gathers either; a collective under
    FSDP2, and a single shard in one process). :func:`load_sharded` reads it in any number of processes.
    A ZeRO-3 engine writes DeepSpeed's own checkpoint of its partitions (not run here: no GPU)."""
    if hasattr(model, "save_checkpoint"):  # a ZeRO-3 engine: DeepSpeed's own checkpoint, its partitions
        model.save_checkpoint(str(path), tag=DEEPSPEED_TAG)
        return
    from torch.distributed.checkpoint import save
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"optimizer": optimizer_state} | ({"model": model_state} if weights else {})
    with _one_process():
        save(state, checkpoint_id=str(path), no_dist=not torch.distributed.is_initialized())


def load_sharded(path: Path, model: torch.nn.Module, optimizer, weights: bool = True) -> None:
    """What :func:`save_sharded` wrote into ``path``, loaded into ``model`` and ``optimizer`` as they are
    now (sharded over however many processes, or not: torch's distributed checkpoint reshards by parameter
    name); a collective under FSDP2."""
    if hasattr(model, "load_checkpoint"):  # a ZeRO-3 engine (into as many processes as wrote it)
        model.load_checkpoint(str(path), tag=DEEPSPEED_TAG, load_optimizer_states=True)
        return
    from torch.distributed.checkpoint import load
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"optimizer": optimizer_state} | ({"model": model_state} if weights else {})
    with _one_process():
        load(state, checkpoint_id=str(path), no_dist=not torch.distributed.is_initialized())
    set_state_dict(
        model, optimizer, model_state_dict=state.get("model", {}), optim_state_dict=state["optimizer"]
    )


@contextlib.contextmanager
def _one_process() -> Iterator[None]:
    """Quiet about a checkpoint written or read by one process (torch warns each time it has no group)."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def saveable(model: torch.nn.Module, accelerator=None) -> torch.nn.Module | None:
    """The model to ``save_pretrained`` once training is done: ``model`` itself (LoRA merged) when nothing is
    sharded. Under FSDP / ZeRO-3 (a collective: every process calls it) its full weights gathered once onto
    the main process in host memory (:func:`full_state_dict`), in the dtype the model was loaded in (FSDP
    keeps float32 master weights under bf16 mixed precision: the saved model is not upcast), and an
    unsharded model built there around them (:func:`merged_copy`: on the meta device, the tensors
    assigned, no second copy); None on the other processes, which save nothing."""
    inner = unwrapped(model)
    if not (fsdp_modules(model) or (accelerator is not None and zero3(accelerator))):
        return inner.merge_and_unload() if hasattr(inner, "peft_config") else inner
    weights = full_state_dict(model, accelerator)
    if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
        return None
    return merged_copy(model, as_loaded(weights, inner))


def as_loaded(weights: dict[str, torch.Tensor], like: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``weights`` (a transformers model's) with their floating-point tensors in the dtype the model ``like``
    was loaded in (its config's ``dtype``): under bf16 mixed precision FSDP trains float32 master weights
    (accelerate upcasts them), which a save would otherwise write at twice the size."""
    dtype = getattr(getattr(like, "config", None), "dtype", None)
    dtype = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        return weights
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in weights.items()}


# ---- FSDP in CPU processes (launch=fsdp_cpu) ------------------------------------------------------------
def fsdp_on_cpu() -> bool:
    """Whether this is a launched CPU process that the launch makes FSDP (``launch=fsdp_cpu``)."""
    import torch

    fsdp = os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true"
    return fsdp and _world() > 1 and not torch.cuda.is_available()


def accelerator_config() -> dict | None:
    """transformers' ``accelerator_config`` for TRL's trainers: under FSDP on CPU, the accelerator state
    made by :func:`state` (``use_configured_state``: transformers would reset it to a plain CPU one);
    else transformers' default (null)."""
    return {"use_configured_state": True} if fsdp_on_cpu() else None


def make_cpu_fsdp() -> None:
    """FSDP in launched CPU processes (``launch=fsdp_cpu``): the sharded code path of a GPU run, over gloo.

    accelerate makes a process FSDP only where its device is a GPU-family one (its ``AcceleratorState``
    ignores ``ACCELERATE_USE_FSDP`` for ``MULTI_CPU``), yet FSDP2 itself (torch's ``fully_shard``) shards,
    gathers and reduce-scatters on CPU tensors over gloo. Here the shared accelerator state (a Borg: every
    later ``Accelerator``, TRL's trainers' included, reads it) is made FSDP with the plugin accelerate would
    build from the launch's ``FSDP_*`` variables; preparing, ``get_state_dict`` and saving are then
    accelerate's own FSDP2 code, as on GPUs. Hand-written: these lines only (no library runs FSDP on CPU)."""
    from accelerate import Accelerator, PartialState
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin()  # read from the launch's FSDP_* variables
    Accelerator(cpu=True, fsdp_plugin=plugin)  # the shared state, made as every Accelerator makes it
    # every AcceleratorState copies the PartialState's type on construction: both say FSDP
    PartialState._shared_state.update(distributed_type=DistributedType.FSDP)
    AcceleratorState._shared_state.update(distributed_type=DistributedType.FSDP, fsdp_plugin=plugin)
    if not getattr(Accelerator.get_state_dict, "cpu_copies", False):
        Accelerator.get_state_dict = _copied_state_dict(Accelerator.get_state_dict)


def _copied_state_dict(get_state_dict):
    """accelerate's ``get_state_dict`` (what transformers' Trainer saves checkpoints with) for FSDP2 on CPU:
    torch's ``cpu_offload`` leaves a CPU tensor uncopied, a view of FSDP2's gathered buffer that is freed
    when the layer reshards ("invalid python storage" when saved); here the full weights are gathered onto
    the main process into tensors of their own (:func:`full_state_dict`), as accelerate gathers them."""

    def copied(self, model, unwrap=True):
        if not self.is_fsdp2:
            return get_state_dict(self, model, unwrap)
        return full_state_dict(model)

    copied.cpu_copies = True
    return copied
