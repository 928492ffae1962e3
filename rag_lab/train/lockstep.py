"""Generation on the model a trainer holds, the engines' way (issue 72): what a method's rollouts and held-out
questions generate with for one phase (:func:`acting`, :func:`generating`).

With ``generator=vllm`` that is the trainer's vLLM engine (TRL's ``VLLMGeneration``), synced one tensor at a
time after each update and awake for the phase only (:mod:`rag_lab.train.vllm_engine`). Otherwise it is the
trained model itself, with transformers, as it is:

- unsharded: the model (in eval mode for the phase);
- FSDP2: the sharded module. Each forward all-gathers one layer at a time in FSDP's own hooks and frees it
  after (TRL's ``unwrap_model_for_generation`` yields the module as it is);
- DeepSpeed ZeRO-3: TRL's ``unwrap_model_for_generation`` without ``GatheredParameters`` (its
  ``gather_deepspeed3_params=False``): DeepSpeed's module hooks fetch each layer's partitions as it runs.

No process holds a full copy of the weights beyond the layer being gathered: no state dict is gathered,
nothing is copied to the host, and every FSDP unit is resharded when the phase ends
(:func:`rag_lab.train.sharded.reshard`).
Every layer is gathered at every decoding step, which is slow for a large model: a method that would roll
out a model above ``launch.hf_generate_max_params`` this way is refused before anything trains
(:func:`too_large_to_step`).

**Lockstep.** A sharded forward is a collective: every layer's gather needs every rank, so the ranks must make
the same forwards in the same order. Multi-turn rollouts do not: each rank plays its own episodes, with their
own turns, prompt groups and completion lengths, and calls ``generate`` a different number of times.
transformers' ``synced_gpus`` solves this within one ``generate`` call (a rank that finished keeps making
forwards until all have); our decoding loop is hand-written (:mod:`rag_lab.generators.decode`) and a phase
spans many calls, so here the lockstep covers the whole phase (:class:`Lockstep`):

- every forward of the phase is preceded by a one-int all-reduce of "still working" (1);
- a rank whose phase ended (:meth:`Lockstep.finish`, through :func:`rag_lab.generators.vllm.rollouts_done`,
  which a TP group's engine answers the same way) all-reduces 0 and makes a one-token dummy forward for as
  long as the sum says another rank still works; it returns once every rank has ended.

A forward runs outside ``torch.inference_mode`` (under ``no_grad``): FSDP2 re-uses the buffers it gathers
into, and a buffer made inside inference mode cannot be written by the training forward that follows.

Hand-written: the all-reduce before each forward and the dummy forwards (no library keeps a phase of many
``generate`` calls in step); sharding and gathering are FSDP's and DeepSpeed's, the unwrap TRL's.
"""

import contextlib
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any

import torch

from rag_lab.generators.base import Completion, Prompt, Sampling
from rag_lab.train.sharded import fsdp_modules, reshard, unwrapped, zero3


class InStep:
    """The model a generator decodes with inside a phase: ``root``'s forward (whose hooks gather the
    sharded weights), after the ranks' "still working" all-reduce; every other attribute (``config``,
    ``device``, ``generation_config``) is ``lm``'s, the causal LM inside ``root`` (``root`` itself, or
    R3-RAG's LM inside its actor-critic)."""

    def __init__(self, phase: "Lockstep", root: torch.nn.Module, lm: torch.nn.Module):
        self.phase = phase
        self.root = root
        self.lm = lm

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.phase.working(True)
        return self.phase.forward(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        lm = self.__dict__.get("lm")
        if lm is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(lm, name)


class Lockstep:
    """A generator (its tokenizer and settings) around a sharded model, every rank's forwards in step
    (module docstring); attributes other than :meth:`generate` and :meth:`finish` are the generator's."""

    def __init__(self, generator, root: torch.nn.Module, lm: torch.nn.Module, device: torch.device):
        self.generator = generator.with_model(InStep(self, root, lm))
        self.root = root
        self.device = device
        self.pad = generator.tokenizer.pad_token_id or 0
        # this rank's forwards and dummy forwards in the phase (the tests read them)
        self.forwards = self.dummies = 0

    def generate(self, prompts: Sequence[Prompt], sampling: Sampling) -> list[list[Completion]]:
        return self.generator.generate(prompts, sampling)

    def working(self, still: bool) -> int:
        """How many ranks still work, this one saying whether it does (every rank's next forward waits on
        it: a collective)."""
        count = torch.tensor([int(still)], device=self.device)
        torch.distributed.all_reduce(count)
        return int(count.item())

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self.forwards += 1
        with torch.inference_mode(False), torch.no_grad():
            return self.root(*args, **kwargs)

    def finish(self) -> None:
        """This rank's phase ended: a one-token dummy forward for each forward another rank still makes,
        until every rank has ended (each call is a collective: every rank calls it at the same point)."""
        while self.working(False):
            self.dummies += 1
            with torch.inference_mode(False), torch.no_grad():
                self.root(input_ids=torch.full((1, 1), self.pad, dtype=torch.long, device=self.device))

    def __getattr__(self, name: str) -> Any:
        generator = self.__dict__.get("generator")
        if generator is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(generator, name)


def in_step(model: torch.nn.Module, accelerator=None) -> bool:
    """Whether ``model``'s forwards are collectives: FSDP2 sharded it, or the accelerator is ZeRO-3's."""
    return fsdp_modules(model) or (accelerator is not None and zero3(accelerator))


def unwrapped_for_generation(model: torch.nn.Module, accelerator=None):
    """TRL's ``unwrap_model_for_generation`` without gathering ZeRO-3's partitions (each layer is fetched
    as it runs), gradient checkpointing turned back on after it as this process's trainers set it; FSDP2's
    module as it is where no accelerator is at hand (what TRL yields for it)."""
    if accelerator is None:
        return contextlib.nullcontext(model)
    from trl.models.utils import unwrap_model_for_generation

    from rag_lab.train.parallel import gradient_checkpointing

    kwargs = gradient_checkpointing()["gradient_checkpointing_kwargs"]
    return unwrap_model_for_generation(
        model, accelerator, gather_deepspeed3_params=False, gradient_checkpointing_kwargs=kwargs
    )


@contextlib.contextmanager
def generating(
    generator, model: torch.nn.Module, accelerator=None, lm: torch.nn.Module | None = None
) -> Iterator[Any]:
    """``generator``'s tokenizer and settings around ``model``'s current weights, for one phase, in eval
    mode (module docstring): the model itself, or where it is sharded a :class:`Lockstep` on it, whose
    phase ends (every rank joining) when the block does. ``lm``: the causal LM to decode with where it sits
    inside ``model`` (R3-RAG's actor-critic), run through ``model``'s forward so that its hooks gather."""
    was_training = model.training
    model.eval()
    try:
        if not in_step(model, accelerator):
            yield generator.with_model(lm if lm is not None else unwrapped(model))
            return
        with unwrapped_for_generation(model, accelerator) as root:
            device = accelerator.device if accelerator is not None else next(root.parameters()).device
            phase = Lockstep(generator, root, root if lm is None else lm, device)
            yield phase
            phase.finish()
            reshard(root)
    finally:
        model.train(was_training)


@contextlib.contextmanager
def acting(trainer, generator, step: int | None = None) -> Iterator[Any]:
    """What a TRL trainer's model generates with for one phase (its rollouts, or the held-out questions):
    its vLLM engine where it has one (TRL's ``use_vllm``; synced to the weights of ``step`` where given,
    awake for the phase: :func:`rag_lab.train.vllm_engine.trainer_engine`), else :func:`generating` on
    ``trainer.model`` with ``generator``'s tokenizer and settings. ``trainer``: anything with ``model``
    and ``accelerator`` (and ``use_vllm``, ``vllm_generation``)."""
    if getattr(trainer, "use_vllm", False):
        from rag_lab.train.vllm_engine import trainer_engine

        with trainer_engine(trainer, generator, step) as engine:
            yield engine
        return
    with generating(generator, trainer.model, getattr(trainer, "accelerator", None)) as actor:
        yield actor


def model_only(model: torch.nn.Module) -> SimpleNamespace:
    """A trainer-like holder of ``model`` alone, for :func:`acting` (no accelerator, no engine)."""
    return SimpleNamespace(model=model, accelerator=None)


# ---- before anything trains ----------------------------------------------------------------------------
def sharding(launch_config: dict) -> str | None:
    """What shards a launch's models (``launch.config``): "FSDP", "ZeRO-3", or None (nothing does)."""
    if launch_config.get("distributed_type") == "FSDP":
        return "FSDP"
    deepspeed = launch_config.get("deepspeed_config") or {}
    if launch_config.get("distributed_type") == "DEEPSPEED" and deepspeed.get("zero_stage") == 3:
        return "ZeRO-3"
    return None


def parameter_count(model_dir: str) -> int:
    """The parameters of the causal LM in ``model_dir``, counted on the meta device from its config (no
    weights read)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    return sum(p.numel() for p in model.parameters())


def too_large_to_step(run, model_dir: str | None) -> list[tuple[str, str]]:
    """``(launch key, why)`` where a method that trains the run's model (DAPO, R3-RAG, EVO-RAG, APEX) would
    roll it out with transformers under a sharded launch and the model has more parameters than
    ``launch.hf_generate_max_params``: every forward would gather each layer from every rank, every rank in
    step (module docstring), far slower than a vLLM engine synced after each update. ``model_dir`` None (not
    known before the run builds it) is not checked."""
    from omegaconf import OmegaConf

    from rag_lab.core.config import locate, schema_for
    from rag_lab.generators.base import VLLMBacked
    from rag_lab.train.start import ROLLS_OUT_ON_VLLM

    launch = OmegaConf.to_container(run.launch, resolve=True) if run.get("launch") else None
    kind = sharding(dict(launch.get("config") or {})) if launch else None
    generator, policy = run.get("generator"), run.get("policy")
    if kind is None or model_dir is None or not generator or not policy:
        return []
    method = str(policy._target_).removeprefix("rag_lab.policies.").split(".")[0]
    built = locate(generator._target_)  # a generator class, or a function that builds one (generator=tiny)
    if method not in ROLLS_OUT_ON_VLLM or (isinstance(built, type) and issubclass(built, VLLMBacked)):
        return []  # a method that trains no LM, or the rollouts go through vLLM already
    limit = launch.get("hf_generate_max_params")
    if limit is None:  # a launch file without the key: the Launch's own default
        limit = OmegaConf.structured(schema_for(launch["_target_"])).hf_generate_max_params
    count = parameter_count(model_dir)
    if count <= limit:
        return []
    name = generator.get("model") or model_dir
    why = (
        f"generator=hf: {name} has {count / 1e9:.1f}B parameters, above launch.hf_generate_max_params="
        f"{limit:,}; under {kind} its rollouts would generate through {kind}'s per-layer gathers, every rank"
        f" in step: set generator=vllm generator.model={name}"
    )
    return [("hf_generate_max_params", why)]
