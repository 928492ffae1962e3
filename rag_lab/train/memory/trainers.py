"""One step of each TRL trainer rag_lab runs (TRL 1.16), on fake weights: the tensor work of the step, as TRL
does it, without its data pipeline (which fake tensors cannot feed).

- **SFT** (``SFTTrainer``: the cold starts, APEX's executor): ``micro`` rows of ``length`` tokens through
  TRL's fused LM head (``add_fused_lm_head``: log-probabilities in tiles, never the whole logits), the loss,
  backward, gradient clipping, AdamW (``adamw_torch_fused``, transformers' default).
- **GRPO / DAPO** (``GRPOTrainer``: DAPO's stages, APEX's planner): the scoring passes of one micro-batch
  without gradient (the old log-probabilities, which TRL computes under vLLM's importance-sampling
  correction; the reference's, where ``beta`` > 0: a reference TRL shards as one FSDP unit, ``prepare_fsdp``),
  then the micro-batch's forward with entropies, backward, clipping, AdamW. A step's other micro-batches
  repeat the same peak.
- **DPO + LoRA** (``DPOTrainer``: EVO-RAG): chosen and rejected concatenated, the policy's log-probabilities,
  then the reference's without gradient with the adapter disabled (no second model; the policy's activations
  still held), the sigmoid loss, backward into the adapters, AdamW over them.

Each returns its phases (:mod:`rag_lab.train.memory.phases`): rollout (where it rolls out), update, save.
"""

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from rag_lab.train.memory import fake
from rag_lab.train.memory.ledger import Phase
from rag_lab.train.memory.measure import tracking
from rag_lab.train.memory.phases import (
    Bench,
    Rollout,
    beside,
    ready_optimizer,
    reference_phase,
    rollout_phase,
    save_phase,
    shard_bytes,
    tokens,
    update_phase,
)

# the fused head's fields each trainer asks for (TRL 1.16's choices)
SFT_OUTPUTS, GRPO_OUTPUTS = ("log_probs", "entropy", "is_top1"), ("log_probs", "entropy")
DPO_OUTPUTS = ("log_probs", "entropy", "mean_logits", "is_top1")


@dataclass(frozen=True)
class Shapes:
    """One step's sizes: rows a forward (``micro``), the prompt's and completion's tokens."""

    micro: int
    prompt: int
    completion: int
    # GRPO: the KL term's coefficient (a reference where > 0), the old log-probabilities' pass, the
    # temperature
    beta: float = 0.0
    old_logps: bool = False
    temperature: float = 1.0

    @property
    def length(self) -> int:
        return self.prompt + self.completion


def policy_model(bench: Bench, config, outputs, temperature: float = 1.0, lora: dict | None = None):
    """The trained model as TRL hands it to accelerate: the fused head added, LoRA adapters on (PEFT), then
    prepared (sharded) like accelerate prepares it."""
    from trl.trainer.utils import add_fused_lm_head

    model = fake.causal_lm(config, bench.dtype, trains=True, checkpointing=bench.checkpointing)
    add_fused_lm_head(model, temperature=temperature, outputs=outputs)
    if lora:
        from peft import LoraConfig, get_peft_model

        with fake.on_meta():
            model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **lora))
    return fake.prepare(model, bench.mesh, bench.mixed_precision)


def adamw(model) -> torch.optim.Optimizer:
    """transformers' default optimizer (``adamw_torch_fused``) over the trained parameters, its state made."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6, fused=True)
    ready_optimizer(optimizer)
    return optimizer


def labelled(rows: int, shapes: Shapes, vocab: int) -> dict:
    """Token ids and labels of ``rows`` sequences, the prompt's labels -100 (only the completion is
    scored)."""
    ids = tokens(rows, shapes.length, vocab)
    labels = ids.clone()
    labels[:, : shapes.prompt] = -100
    return {"input_ids": ids, "labels": labels, "fused_lm_head": True}


def finish(model, optimizer) -> None:
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0, foreach=True)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def sft(bench: Bench, config, shapes: Shapes, rollout: Rollout, name: str = "SFT") -> list[Phase]:
    model = policy_model(bench, config, SFT_OUTPUTS)
    optimizer = adamw(model)
    with tracking(model, optimizer) as phase:
        phase.begin()
        phase.forward()
        model(**labelled(shapes.micro, shapes, config.vocab_size)).loss.backward()
        finish(model, optimizer)
        update = update_phase(phase, name, rollout, {}, {})
        return [update, save_phase(phase, name, model, rollout, {}, {})]


def grpo(bench: Bench, config, shapes: Shapes, rollout: Rollout, name: str = "GRPO") -> list[Phase]:
    from trl.models import prepare_fsdp
    from trl.trainer.utils import add_fused_lm_head

    model = policy_model(bench, config, GRPO_OUTPUTS, shapes.temperature)
    optimizer = adamw(model)
    reference = None
    if shapes.beta > 0:  # TRL's reference: the same weights frozen, sharded as one unit (prepare_fsdp)
        reference = fake.causal_lm(config, bench.dtype, trains=False)
        add_fused_lm_head(reference, temperature=shapes.temperature)
        reference = prepare_fsdp(fake.materialize(reference), _trl_accelerator(bench))
    frozen = shard_bytes(reference=reference)
    batch = labelled(shapes.micro, shapes, config.vocab_size)
    phases = []
    if reference is not None:
        phases.append(
            reference_phase(
                name, reference, lambda: reference(**batch), beside(model, optimizer, {}), rollout
            )
        )
    with tracking(model, optimizer) as phase:
        phases.insert(0, rollout_phase(phase, name, model, rollout, {}, frozen))
        if shapes.old_logps:  # the old log-probabilities (vLLM's importance-sampling correction)
            phase.begin()
            with torch.no_grad():
                phase.forward()
                model(**batch)
            phases.append(Phase(name, "score", phase.lines(outside=rollout.outside("score") | frozen)))
        phase.begin()
        phase.forward()
        out = model(**batch)
        (-(out.log_probs.sum()) + 0.0 * out.entropy.sum()).backward()
        finish(model, optimizer)
        phases.append(update_phase(phase, name, rollout, {}, frozen))
        return phases + [save_phase(phase, name, model, rollout, {}, frozen)]


def dpo(bench: Bench, config, shapes: Shapes, rollout: Rollout, lora: dict, name: str = "DPO") -> list[Phase]:
    model = policy_model(bench, config, DPO_OUTPUTS, lora=lora)
    optimizer = adamw(model)
    batch = labelled(2 * shapes.micro, shapes, config.vocab_size)  # chosen and rejected, concatenated
    with tracking(model, optimizer) as phase:
        phases = [rollout_phase(phase, name, model, rollout, {}, {})]
        phase.begin()
        phase.forward()
        logps = model(**batch).log_probs.sum(-1)
        with torch.no_grad(), model.disable_adapter():  # then the reference: the adapter switched off
            phase.forward()
            ref = model(**batch).log_probs.sum(-1)
        chosen, rejected = (logps - ref).chunk(2)
        (-F.logsigmoid(0.1 * (chosen - rejected))).mean().backward()
        finish(model, optimizer)
        phases.append(update_phase(phase, name, rollout, {}, {}))
        return phases + [save_phase(phase, name, model, rollout, {}, {})]


def _trl_accelerator(bench: Bench):
    """What TRL's ``prepare_fsdp`` reads of an Accelerator: accelerate's FSDP2 plugin in the launch's mixed
    precision, the mesh."""
    from types import SimpleNamespace

    from accelerate.utils import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward=True)
    if bench.mixed_precision != "no":
        plugin.set_mixed_precision(bench.mixed_precision)
    return SimpleNamespace(
        state=SimpleNamespace(fsdp_plugin=plugin),
        torch_device_mesh=bench.mesh,
        parallelism_config=SimpleNamespace(fsdp_dim_names=(fake.MESH_DIM,)),
        device=fake.DEVICE,
    )
