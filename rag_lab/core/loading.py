"""Which models load straight into their shards in a process of a sharded launch, and which load whole
(issue 72).

Two library switches make transformers' ``from_pretrained`` load a model only in part:

- **DeepSpeed ZeRO-3's init**: while a DeepSpeed config is registered with transformers
  (``HfDeepSpeedConfig``: accelerate's ``DeepSpeedPlugin`` registers one whenever an accelerator state is
  made under a DeepSpeed launch, and so does each ``TrainingArguments`` made there), every weight is
  partitioned over the processes as it loads (``deepspeed.zero.Init``). A model DeepSpeed then wraps is
  right; any other (the run's generator, a reload to roll out with) holds 1/N of each weight, and its
  forward is wrong.
- **FSDP's RAM-efficient loading** (``fsdp_cpu_ram_efficient_loading``): while
  ``FSDP_CPU_RAM_EFFICIENT_LOADING`` is true, every process but each node's first loads zeros, which
  accelerate's ``prepare`` replaces with rank 0's weights (its ``fsdp2_load_full_state_dict`` broadcast). A
  model that accelerate never prepares keeps the zeros, silently.

Both are right only for the model a trainer shards right after loading it. So each launched process turns
both off before any model loads (:func:`loading_on_purpose`); :func:`trained_loading` turns them on around
a trained model's load, and :func:`replicated_loading` keeps them off around a frozen model's load (a
TRL trainer's arguments may have registered DeepSpeed's config again in between). Outside a sharded launch
all three do nothing.

Hand-written: which switch applies where; the switches are transformers' and accelerate's.
"""

import contextlib
import os
from collections.abc import Iterator

EFFICIENT = "FSDP_CPU_RAM_EFFICIENT_LOADING"


def _true(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes")


def _sharded_launch() -> bool:
    """Whether ``accelerate launch`` made this process FSDP or DeepSpeed (its environment says so)."""
    return _true("ACCELERATE_USE_FSDP") or _true("ACCELERATE_USE_DEEPSPEED")


def loading_on_purpose() -> None:
    """Called once by each launched process before its models load: the shared accelerator state is made
    first (so its FSDP plugin keeps the launch's ``cpu_ram_efficient_loading`` for ``prepare``'s broadcast,
    and its DeepSpeed plugin the launch's ZeRO-3 config), then both switches are turned off for every load
    but a trained model's (:func:`trained_loading`)."""
    if not _sharded_launch():
        return
    import torch
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    if not AcceleratorState._shared_state:  # launch=fsdp_cpu made it with the process group already
        Accelerator(cpu=not torch.cuda.is_available())
    _switch(None, efficient=False)


def _plugins() -> tuple[object | None, object | None]:
    """(the accelerator state's DeepSpeed plugin where it is ZeRO-3 with ``zero3_init_flag``, its FSDP plugin
    where it loads RAM-efficiently); None for each that does not apply (or no state made)."""
    from accelerate.state import AcceleratorState

    shared = AcceleratorState._shared_state
    deepspeed, fsdp = shared.get("deepspeed_plugin"), shared.get("fsdp_plugin")
    zero3 = deepspeed is not None and deepspeed.zero_stage == 3 and deepspeed.zero3_init_flag
    return (deepspeed if zero3 else None), (
        fsdp if getattr(fsdp, "cpu_ram_efficient_loading", False) else None
    )


def _switch(registered, efficient: bool) -> None:
    """transformers' DeepSpeed registration set to ``registered`` (a weak reference, or None), and the
    efficient-loading variable to ``efficient``."""
    from transformers.integrations import deepspeed

    deepspeed._hf_deepspeed_config_weak_ref = registered
    os.environ[EFFICIENT] = "true" if efficient else "false"


@contextlib.contextmanager
def _restored() -> Iterator[None]:
    """The registration and the variable as they were before the block."""
    from transformers.integrations import deepspeed

    registered, efficient = deepspeed._hf_deepspeed_config_weak_ref, os.environ.get(EFFICIENT)
    try:
        yield
    finally:
        deepspeed._hf_deepspeed_config_weak_ref = registered
        if efficient is None:
            os.environ.pop(EFFICIENT, None)
        else:
            os.environ[EFFICIENT] = efficient


@contextlib.contextmanager
def trained_loading() -> Iterator[None]:
    """Around the ``from_pretrained`` of a model that a trainer prepares right after (accelerate's
    ``prepare``: it shards the model and broadcasts rank 0's weights): ZeRO-3's init and FSDP's efficient
    loading as the launch sets them. Nothing else may use the model before it is prepared."""
    if not _sharded_launch():
        yield
        return
    deepspeed, fsdp = _plugins()
    with _restored():
        if deepspeed is not None:
            deepspeed.set_deepspeed_weakref()  # accelerate's registration (kept alive by the plugin)
        os.environ[EFFICIENT] = "true" if fsdp is not None else "false"
        yield


@contextlib.contextmanager
def replicated_loading() -> Iterator[None]:
    """Around the ``from_pretrained`` of a model no trainer shards (the run's generator, a reload to roll out
    or evaluate with): the whole model in every process, whatever registered DeepSpeed's config before."""
    if not _sharded_launch():
        yield
        return
    with _restored():
        _switch(None, efficient=False)
        yield
