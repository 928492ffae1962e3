"""What a trainer does with a model that FSDP or ZeRO-3 has sharded across the processes (issue 66).

A sharded model holds 1/N of each weight in each process, so three things a one-process trainer does
directly become collectives that every process must call together:

- **its full weights** (:func:`full_state_dict`): FSDP2's full state dict (torch's ``get_model_state_dict``
  with ``full_state_dict``, what accelerate's ``get_state_dict`` calls for FSDP2), or ZeRO-3's gathered
  16-bit one (accelerate's ``get_state_dict``); the model's own ``state_dict`` when nothing is sharded;
- **saving it** (:func:`save_full`): the full weights gathered by every process, written by the main one
  with transformers' ``save_pretrained(state_dict=...)`` (LoRA merged first: :func:`merged_copy`), so the
  result loads back as one ordinary checkpoint;
- **generating with it** (:func:`generation_copy`): an FSDP2 forward all-gathers each layer, so every
  process would have to run the same number of forwards, and multi-turn rollouts differ in turns and
  lengths between processes. Rollouts therefore run on an unsharded copy of the current weights (what a
  colocated vLLM engine holds too), filled from the full state dict after each update; ZeRO-3 gathers
  with TRL's ``unwrap_model_for_generation``.

Hand-written: only which call applies when; gathering, sharding and saving are torch's, accelerate's and
transformers' own.
"""

import copy
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
    if peft:
        from peft import get_peft_model

        plain = get_peft_model(plain, copy.deepcopy(inner.peft_config["default"]))
    plain.load_state_dict(weights, assign=True, strict=True)
    plain.tie_weights() if hasattr(plain, "tie_weights") else None
    return plain.merge_and_unload() if peft else plain


def generation_copy(model: torch.nn.Module, held: torch.nn.Module | None = None) -> torch.nn.Module:
    """The model to generate with: ``model`` itself when it is not FSDP-sharded; else an unsharded copy of
    its current weights (a collective: every process calls it after each update), refilled in ``held``
    (the copy of the previous call) when given, so rollouts never all-gather per forward."""
    if not fsdp_modules(model):
        return model
    weights = full_state_dict(model)
    if held is None:
        held = merged_copy(model, weights) if not hasattr(unwrapped(model), "peft_config") else None
        if held is None:  # LoRA: the merged copy is the one to generate with, made anew
            return merged_copy(model, weights).eval()
        return held.eval()
    held.load_state_dict(weights, strict=True)
    return held.eval()


def save_full(model: torch.nn.Module, path: Path, accelerator=None, is_main: bool = True) -> None:
    """Every process calls it: the full weights gathered, the main process (``is_main``) writing them with
    ``save_pretrained`` into ``path`` (LoRA merged), so they load back as one unsharded checkpoint."""
    sharded = fsdp_modules(model) or (accelerator is not None and zero3(accelerator))
    weights = full_state_dict(model, accelerator) if sharded else None
    if not is_main:
        return
    inner = unwrapped(model)
    if sharded:
        merged_copy(model, weights).save_pretrained(path)
    elif hasattr(inner, "peft_config"):
        inner.merge_and_unload().save_pretrained(path)
    else:
        inner.save_pretrained(path)


def fsdp_launch() -> bool:
    """Whether this is a launched process whose launch shards models with FSDP (``launch=fsdp``,
    ``launch=fsdp_cpu``): a hand-written loop then prepares its network through accelerate as well."""
    import os

    from rag_lab.train.parallel import processes

    return processes() > 1 and os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true"


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
