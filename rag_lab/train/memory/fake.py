"""N GPUs without a GPU: a fake process group, fake tensors, and models sharded as accelerate shards them.

- :func:`ranks`: torch's fake process group (``FakeStore``, backend ``"fake"``: every collective returns at
  once with tensors of the right shapes) of ``world`` ranks, this process rank 0, a one-dimensional device
  mesh over them, and ``FakeTensorMode`` (tensors with shapes, dtypes and devices, and no storage), as
  torchtitan's memory estimator sets them up (``scripts/estimate/estimation.py``).
- :func:`prepare`: accelerate's own FSDP2 preparation (``fsdp2_prepare_model``: each layer of the model's
  ``_no_split_modules`` its own unit, the input embedding its own, the final norm and output head one unit
  kept gathered after the forward, the root; trained weights upcast to float32 under mixed precision, a
  ``MixedPrecisionPolicy`` in the launch's dtype), then its autocast around the forward with float32 outputs,
  as ``Accelerator.prepare_model`` does; ``fsdp_cpu_ram_efficient_loading`` is left out (it changes how the
  weights reach the shards, not what the shards hold).

Two seams, each written down where it is: accelerate's logger wants an accelerator state that the plan never
makes, and DTensor's sharding propagation runs its whole-tensor "shadow" ops under the caller's fake mode,
where torch's memory tracker would count them as allocations (torch 2.13: its guard expects propagation in a
fake mode of its own, which is what it gets here).
"""

import contextlib
import logging
from collections.abc import Iterator
from types import SimpleNamespace

import torch
from torch import nn

from rag_lab.core.errors import RagLabError

MESH_DIM = "fsdp"
# the plan's stand-in for a GPU: fake tensors on the CPU device (one device: nothing is offloaded to it)
DEVICE = torch.device("cpu")


@contextlib.contextmanager
def ranks(world: int) -> Iterator[object]:
    """The fake world of ``world`` ranks (module docstring); yields its device mesh."""
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RagLabError(
            "the memory plan makes its own (fake) process group: run it outside a launched process"
        )
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        # made outside FakeTensorMode (inside it, init_device_mesh trips on a data-dependent scalar)
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=(MESH_DIM,))
        # meta tensors (the models are built on meta, then made fake: materialize) may enter fake ops
        with FakeTensorMode(allow_non_fake_inputs=True), _propagation_in_its_own_mode():
            yield mesh
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def _propagation_in_its_own_mode() -> Iterator[None]:
    """DTensor's sharding propagation computes each op's output shape on whole-size fake tensors, in the fake
    mode it detects (ours); torch's memory trackers skip ops run in another fake mode only. Here it finds none
    and makes its own, so the trackers count the shards' ops, not the whole tensors'."""
    from torch.distributed.tensor import _sharding_prop

    detect = _sharding_prop.detect_fake_mode
    _sharding_prop.detect_fake_mode = lambda *args, **kwargs: None
    try:
        yield
    finally:
        _sharding_prop.detect_fake_mode = detect


@contextlib.contextmanager
def on_meta() -> Iterator[None]:
    """Modules built here are built on the meta device, outside the fake mode: torch refuses a module's
    ``.to()`` on fake tensors (it swaps them), which PEFT's adapters and R3-RAG's value head call while they
    are made; :func:`materialize` then makes them fake (torchtitan's estimator builds on meta too)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily(), torch.device("meta"):
        yield


def materialize(module: nn.Module) -> nn.Module:
    """``module``'s meta tensors made fake tensors on the plan's device (no-op for fake ones), its tied
    weights tied again (``to_empty`` makes each module's weight its own tensor; transformers' ``tie_weights``
    shares them, as ``from_pretrained`` does)."""
    from transformers import PreTrainedModel

    if any(t.device.type == "meta" for t in [*module.parameters(), *module.buffers()]):
        module.to_empty(device=DEVICE)
        for part in module.modules():
            if isinstance(part, PreTrainedModel):
                part.tie_weights()
    return module


@contextlib.contextmanager
def python_functions() -> Iterator[None]:
    """TorchScript functions of transformers' model modules (DeBERTa's relative positions) run as the Python
    functions they were compiled from: the TorchScript interpreter does not run on fake tensors."""
    import sys

    swapped = []
    for name, module in list(sys.modules.items()):
        if name.startswith("transformers.models.") and module is not None:
            for attr, value in list(vars(module).items()):
                original = getattr(value, "_torchdynamo_inline", None)
                if isinstance(value, torch.jit.ScriptFunction) and original is not None:
                    swapped.append((module, attr, value))
                    setattr(module, attr, original)
    try:
        yield
    finally:
        for module, attr, value in swapped:
            setattr(module, attr, value)


def prepare(model: nn.Module, mesh, mixed_precision: str, reshard_after_forward: bool = True) -> nn.Module:
    """``model`` sharded over ``mesh`` by accelerate's FSDP2 path, with its autocast (module docstring)."""
    import accelerate.utils.fsdp_utils as fsdp_utils
    from accelerate.utils import FullyShardedDataParallelPlugin, convert_outputs_to_fp32

    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2,
        auto_wrap_policy="transformer_based_wrap",
        reshard_after_forward=reshard_after_forward,
        cpu_ram_efficient_loading=False,
    )
    if mixed_precision != "no":
        plugin.set_mixed_precision(mixed_precision)
    # what fsdp2_prepare_model reads of an Accelerator
    accelerator = SimpleNamespace(
        state=SimpleNamespace(fsdp_plugin=plugin),
        torch_device_mesh=mesh,
        parallelism_config=SimpleNamespace(fsdp_dim_names=(MESH_DIM,)),
        mixed_precision=mixed_precision,
        is_main_process=True,
        device=DEVICE,
    )
    materialize(model)
    # accelerate's logger wants an accelerator state: a plain one, its warnings only (not the upcast's list)
    logger, fsdp_utils.logger = fsdp_utils.logger, logging.Logger(fsdp_utils.__name__, logging.WARNING)
    try:
        model = fsdp_utils.fsdp2_prepare_model(accelerator, model)
    finally:
        fsdp_utils.logger = logger
    _gather_once(model)
    if mixed_precision != "no":
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[mixed_precision]
        forward = torch.autocast(DEVICE.type, dtype=dtype)(model.forward.__func__)
        model.forward = convert_outputs_to_fp32(forward).__get__(model)
    return model


def _gather_once(model: nn.Module) -> None:
    """Each FSDP unit gathered and let go once, as a run's first step does: its dtypes fixed while every
    trained weight still asks for gradients (a first forward with LoRA switched off, as DPO's reference pass,
    would see none trained), and a gathered form for every weight, which FSDPMemTracker's backward hook reads
    even for a unit whose forward never runs (an output head TRL's fused head reads directly). Holds nothing
    after."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.unshard()
            module.reshard()


def causal_lm(config, dtype: torch.dtype, trains: bool, checkpointing: bool = False) -> nn.Module:
    """A causal LM of ``config`` in ``dtype``, built on meta (:func:`on_meta`), trained or frozen; gradient
    checkpointing as TRL's trainers turn it on (non-reentrant)."""
    from transformers import AutoModelForCausalLM

    with on_meta():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.config.use_cache = False
    if checkpointing and trains:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.train() if trains else model.requires_grad_(False).eval()


def encoder(config, dtype: torch.dtype = torch.float32, classifier: bool = False) -> nn.Module:
    """An encoder of ``config`` (transformers' ``AutoModel``; ``classifier``: a sequence classifier, a
    reranker) as the retrievers and rewards load one (float32: ``from_pretrained``'s default), frozen, built
    on meta."""
    from transformers import AutoModel, AutoModelForSequenceClassification

    with on_meta():
        model = (AutoModelForSequenceClassification if classifier else AutoModel).from_config(
            config, dtype=dtype
        )
    return model.requires_grad_(False).eval()


def held_bytes(tensors) -> int:
    """The bytes ``tensors`` hold on this rank: a sharded tensor's local shard only, with FSDP's padding (the
    storage under the shard)."""
    from torch.distributed.tensor import DTensor

    return sum((t.to_local() if isinstance(t, DTensor) else t).untyped_storage().nbytes() for t in tensors)


def module_bytes(module: nn.Module | None) -> int:
    """What ``module``'s parameters and buffers hold on this rank (0 for None)."""
    if module is None:
        return 0
    return held_bytes([*module.parameters(), *module.buffers()])
