"""What a trainer does with a model that FSDP or ZeRO-3 has sharded across the processes (issue 66).

A sharded model holds 1/N of each weight in each process, so three things a one-process trainer does
directly become collectives that every process must call together:

- **its full weights** (:func:`full_state_dict`): FSDP2's full state dict (torch's ``get_model_state_dict``
  with ``full_state_dict``, what accelerate's ``get_state_dict`` calls for FSDP2), or ZeRO-3's gathered
  16-bit one (accelerate's ``get_state_dict``); the model's own ``state_dict`` when nothing is sharded;
- **saving it** (:func:`saveable`): the full weights gathered by every process, written by the main one
  as an unsharded copy with ``save_pretrained`` (LoRA merged first: :func:`merged_copy`), so the
  result loads back as one ordinary checkpoint;
- **generating with it**: not here. Rollouts generate on the sharded model itself, every process in step
  (:mod:`rag_lab.train.lockstep`), or on a vLLM engine synced one tensor at a time
  (:mod:`rag_lab.train.vllm_engine`); no copy of the weights is made for them.

Hand-written: only which call applies when; gathering, sharding and saving are torch's, accelerate's and
transformers' own.
"""

import copy
import os

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


def full_state_dict(model: torch.nn.Module, accelerator=None) -> dict[str, torch.Tensor]:
    """The model's full weights, on the CPU; a collective under FSDP2 and ZeRO-3 (every process calls it,
    every process gets them under FSDP2, the main one under ZeRO-3). Keys as the unwrapped model's."""
    if fsdp_modules(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=False)
        return {k: v.detach().cpu() for k, v in get_model_state_dict(model, options=options).items()}
    if accelerator is not None and zero3(accelerator):
        return accelerator.get_state_dict(model)
    return {k: v.detach().cpu() for k, v in unwrapped(model).state_dict().items()}


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


def optimizer_state(model: torch.nn.Module, optimizer) -> dict:
    """The optimizer's full state, keyed by parameter name (torch's ``get_optimizer_state_dict``): a
    collective under FSDP2, loaded back by :func:`load_optimizer_state` in any number of processes."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=False)
    return get_optimizer_state_dict(model, optimizer, options=options)


def load_optimizer_state(model: torch.nn.Module, optimizer, state: dict) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def load_full(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """A full state dict loaded into ``model``, sharded or not (torch's ``set_model_state_dict``: each
    process keeps its shard of every weight)."""
    if not fsdp_modules(model):
        unwrapped(model).load_state_dict(weights)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True))


def saveable(model: torch.nn.Module, accelerator=None) -> torch.nn.Module:
    """The model to ``save_pretrained`` once training is done: ``model`` (LoRA merged), or under FSDP /
    ZeRO-3 an unsharded copy of its full weights (every process calls it: a collective)."""
    inner = unwrapped(model)
    if fsdp_modules(model) or (accelerator is not None and zero3(accelerator)):
        return merged_copy(model, full_state_dict(model, accelerator))
    return inner.merge_and_unload() if hasattr(inner, "peft_config") else inner


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
    when the layer reshards ("invalid python storage" when saved); here the full weights are gathered into
    tensors of their own (:func:`rag_lab.train.sharded.full_state_dict`)."""

    def copied(self, model, unwrap=True):
        if not self.is_fsdp2:
            return get_state_dict(self, model, unwrap)
        return full_state_dict(model)

    copied.cpu_copies = True
    return copied


def zero3_loading() -> bool:
    """Under a DeepSpeed ZeRO-3 launch with ``zero3_init_flag`` (``launch=zero3``), called by each launched
    process before its models load: the accelerator state is made first, so that its DeepSpeed plugin
    registers the config with transformers (``HfDeepSpeedConfig``) and ``from_pretrained`` partitions each
    weight as it loads (``deepspeed.zero.Init``) instead of loading the whole model in every process, as
    accelerate's docs ask (the Accelerator before the model). Whether it did."""
    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true"
    if not (deepspeed and os.environ.get("ACCELERATE_DEEPSPEED_ZERO3_INIT", "").lower() == "true"):
        return False
    from accelerate import Accelerator

    Accelerator()
    return True
