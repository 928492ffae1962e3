"""vLLM rollouts for the training loops TRL does not run (issue 66): R3-RAG's hand-written PPO and EVO-RAG's
cycles (DPO between rollouts). DAPO's and APEX's planner's GRPO get the same from TRL's ``GRPOTrainer``
(``use_vllm``: :meth:`rag_lab.generators.vllm.VLLMGenerator.trl_settings`), whose engine also plays their
multi-turn rollouts and held-out questions (:func:`trainer_engine`, issue 72).

Reused from TRL 1.16, not re-written: its vLLM backend, ``trl.generation.vllm_generation.VLLMGeneration``,
built here as its ``GRPOTrainer`` builds it:

- the engine: colocate (vLLM's ``LLM`` in the training processes, ``external_launcher``, one engine per TP
  group of ranks, seeded per group) or server (its ``VLLMClient`` to a ``trl vllm-serve`` server, with the
  NCCL communicator the weights go through);
- the weight sync, ``sync_weights``: every parameter read under the name vLLM expects, gathered where it is
  sharded (DeepSpeed ZeRO-3's ``GatheredParameters``, FSDP's full tensors), a PEFT model's adapters merged
  into the weights first (``merge_adapter``) and unmerged after;
- with tensor parallelism > 1 in colocate mode, its ``generate``, which gathers the prompts of the TP group
  (:class:`rag_lab.generators.vllm.TPGroupGenerator`).

Hand-written (the adapter): :class:`RolloutEngine` builds the backend from ``generator=vllm``'s settings
and hands out our generator on it (:func:`rag_lab.generators.vllm.engine_generator`); its :meth:`sync` is
TRL's sync of the model a loop trained, which the loop calls after each update, before the next rollouts.
A model that no wrapper shards (EVO-RAG's, reloaded after each DPO epoch with its LoRA adapter merged) is
read as it is, whatever the run's launch: TRL's FSDP path would ask its plain tensors for their shards.

**Asleep between phases** (``generator.sleep``, TRL's ``vllm_enable_sleep_mode``): a colocated engine gives
its GPU memory back to training between phases: vLLM's level-2 sleep drops its weights and KV cache, and
waking it means pushing the trained weights again (TRL's ``sync_weights`` wakes the weights first; vLLM's own
reload would read the checkpoint on disk). TRL's ``generate`` sleeps after every call, and a multi-turn phase
calls it once a turn, so :func:`awake` holds the engine awake over a whole phase instead: weights pushed where
they slept (TRL's own ``_llm_weights_sleeping`` flag, which its ``generate`` reads too), KV cache woken, TRL's
per-call sleep held off, and a level-2 sleep when the phase ends.
"""

import contextlib
from collections.abc import Iterator

import torch

from rag_lab.core.errors import RagLabError
from rag_lab.generators.base import vllm_backed
from rag_lab.generators.vllm import engine_generator, rollouts_done
from rag_lab.train.parallel import processes


def rollout_engine(
    run_generator, model, tokenizer, chat: bool, accelerator=None, main_only: bool = False
) -> "RolloutEngine | None":
    """The vLLM engine ``model``'s rollouts go through where the run's generator is vLLM
    (``generator=vllm``), else None (the loop generates with its transformers model). ``main_only``: the
    loop's rollouts run on the main process alone (EVO-RAG's), which a TP group's shared engine cannot serve.
    """
    vllm = vllm_backed(run_generator)
    if vllm is None:
        return None
    settings = vllm.backend_settings()
    check_group(settings, processes(), main_only)
    return RolloutEngine(settings, model, tokenizer, chat, accelerator)


def check_group(settings: dict, world: int, main_only: bool) -> None:
    """One line, before an engine is built, where colocate mode's TP groups cannot form or serve the loop."""
    tp = settings["tensor_parallel_size"]
    if settings["mode"] != "colocate" or tp == 1:
        return
    if world % tp:
        raise RagLabError(
            f"generator.tensor_parallel_size: {tp} does not divide the {world} training process(es) (colocate"
            " mode shares one engine between each group of tensor_parallel_size ranks)"
        )
    if main_only and world > 1:
        raise RagLabError(
            f"generator.tensor_parallel_size: {tp} with train_mode=colocate, but this method rolls out on the"
            " main process alone and a TP group's engine generates only with every rank of the group: set"
            " generator.train_mode=server or tensor_parallel_size=1"
        )


class RolloutEngine:
    """TRL's ``VLLMGeneration`` around the trained ``model`` (module docstring): ``generator`` generates on it
    (each process its own episodes), :meth:`sync` loads the model's weights into it."""

    def __init__(self, settings: dict, model, tokenizer, chat: bool, accelerator=None):
        from trl.generation.vllm_generation import VLLMGeneration

        if accelerator is None:
            from accelerate import Accelerator

            accelerator = Accelerator(cpu=not torch.cuda.is_available())
        self.backend = VLLMGeneration(
            model=model, accelerator=accelerator, processing_class=tokenizer, **settings
        )
        self.generator = engine_generator(self.backend, tokenizer, chat)
        self.sharded_backend = self.backend._dist
        self.syncs = 0

    @contextlib.contextmanager
    def acting(self) -> Iterator:
        """Our generator on the engine, awake for one phase (:func:`awake`); at its end this rank joins a TP
        group's rounds until the others' end too (:func:`rag_lab.generators.vllm.rollouts_done`)."""
        with awake(self.backend):
            yield self.generator
            rollouts_done(self.generator)

    def sync(self, model=None) -> None:
        """TRL's weight sync of ``model`` (None: the model it holds, trained in place) into the engine, in
        every process (gathering a sharded parameter is a collective); the engine's prefix cache reset."""
        if model is not None:
            self.backend.model = model
        self.backend._dist = self.sharded_backend if sharded(self.backend.model) else unsharded()
        self.backend.sync_weights()
        self.syncs += 1


def sharded(model) -> bool:
    """Whether any parameter of ``model`` is a shard: a DTensor (FSDP2), an FSDP1 flat parameter or a
    DeepSpeed ZeRO-3 partition."""
    from torch.distributed.tensor import DTensor

    return any(
        isinstance(p, DTensor) or hasattr(p, "ds_id") or type(p).__name__ == "FlatParameter"
        for p in model.parameters()
    )


def unsharded():
    """TRL's ``DistributedBackend`` with neither DeepSpeed nor FSDP: its gathers do nothing."""
    from trl.distributed import DistributedBackend

    plain = DistributedBackend.__new__(DistributedBackend)
    plain.zero_stage = 0
    plain.fsdp_version = None
    return plain


@contextlib.contextmanager
def awake(backend) -> Iterator[None]:
    """TRL's colocated engine awake for one phase where it sleeps between phases (module docstring); as it
    is otherwise (no sleep mode, a server)."""
    if not (backend.mode == "colocate" and backend.enable_sleep_mode):
        yield
        return
    if backend._llm_weights_sleeping:  # a level-2 sleep dropped them: the trained weights pushed again
        backend.sync_weights()
    backend.llm.wake_up(tags=["kv_cache"])
    backend.enable_sleep_mode = False  # TRL's generate (a TP group's rounds) neither sleeps nor re-syncs
    try:
        yield
    finally:
        backend.enable_sleep_mode = True
    backend.llm.sleep(level=2)
    backend._llm_weights_sleeping = True


@contextlib.contextmanager
def trainer_engine(trainer, generator, step: int | None = None) -> Iterator:
    """Our generator on a TRL trainer's vLLM engine (``trainer.vllm_generation``) for one phase, speaking as
    ``generator`` does (its tokenizer, chat or plain text): synced first where ``step`` is given and TRL has
    not loaded that step's weights yet (a held-out measurement after an update; TRL then skips its own sync
    at that step), awake for the phase (:func:`awake`), and at its end this rank joins a TP group's rounds
    until the others' end too."""
    backend = trainer.vllm_generation
    if step is not None and getattr(trainer, "_last_loaded_step", None) != step:
        backend.sync_weights()  # every rank: a collective under FSDP / ZeRO-3
        trainer._last_loaded_step = step
    with awake(backend):
        engine = engine_generator(backend, generator.tokenizer, generator.chat)
        yield engine
        rollouts_done(engine)
