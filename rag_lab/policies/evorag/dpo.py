"""EVO-RAG's policy epoch (arXiv:2505.17391 sec. 3.4): DPO on the preferred / rejected actions of the
branch pairs, with TRL's ``DPOTrainer`` (its sigmoid loss −log σ(β·Δ), Δ the chosen's minus the rejected's
log-ratio to the reference) and a PEFT LoRA adapter, merged into the weights after the epoch.

- A row is token ids, token in, token out: the state's prompt as the policy was given it (rendered with the
  chat template where there is one, fitted to the model and tokenized once by the engine:
  :mod:`rag_lab.env.fit`), the chosen action's ids and the rejected's as the policy wrote them
  (:func:`rag_lab.policies.evorag.branches.action_ids`). TRL 1.16's ``DPOTrainer`` would tokenize prompt
  and prompt + completion as text and split them where they part (and a chat template closes the turn
  with tokens the policy never wrote), so a BPE merge at the boundary would change what is trained;
  :func:`trainer_class` passes our ids through, TRL's collator and loss unchanged.
- The reference is the model at the start of the epoch (the adapter switched off): iterative DPO, each
  cycle's reference the policy that rolled its data out. The paper does not name its reference.
- A killed epoch resumes from its last Trainer checkpoint (``work``) to the uninterrupted weights.

Hand-written: only the rows, their pass-through and the log-probability probe; the training is TRL's.
"""

import functools
import logging
from pathlib import Path

import torch

from rag_lab.policies.evorag.preference import Branch
from rag_lab.train.curves import CurveLog
from rag_lab.train.dpo import dpo_config
from rag_lab.train.lora import peft_config
from rag_lab.train.parallel import share
from rag_lab.train.resume import last_good_checkpoint, stopped_early
from rag_lab.train.sharded import saveable

log = logging.getLogger(__name__)


def dpo_rows(prompts: list[list[int]], pairs: list[list[tuple[Branch, Branch]]]) -> list[dict]:
    """One DPO row per pair: its state's prompt ids as the policy was given them (``prompts[i]``; a state
    with none, a generator that read text, gives no row), the better branch's action ids as ``chosen_ids``,
    the worse one's as ``rejected_ids`` (the module docstring)."""
    return [
        {"prompt_ids": list(prompt), "chosen_ids": good.completion_ids, "rejected_ids": bad.completion_ids}
        for prompt, state_pairs in zip(prompts, pairs, strict=True)
        if prompt
        for good, bad in state_pairs
    ]


@functools.cache
def trainer_class():
    """TRL's ``DPOTrainer``, given rows that are token ids already (``prompt_ids``, ``chosen_ids``,
    ``rejected_ids``: :func:`dpo_rows`) passing them through as they are, with TRL's own guard (under
    ``keep_start`` truncation a prompt that fills ``max_length`` is dropped); rows of text go TRL's way."""
    from trl import DPOTrainer

    class IdsDPOTrainer(DPOTrainer):
        def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
            if "prompt_ids" not in dataset.column_names:
                return super()._prepare_dataset(dataset, processing_class, args, dataset_name)
            if args.max_length is not None and args.truncation_mode == "keep_start":
                dataset = dataset.filter(lambda row: len(row["prompt_ids"]) < args.max_length)
            return dataset

    return IdsDPOTrainer


def dpo_epoch(model, generator, rows: list[dict], settings, work: Path, seed: int, what: str):
    """Train ``model`` (in place; ``generator``: its tokenizer, device and context) on ``rows`` for
    ``settings.dpo_epochs`` with DPO and LoRA (``settings``: an
    :class:`~rag_lab.policies.evorag.policy.EvoRAG`); the model with the adapter merged (under FSDP / ZeRO-3
    the main process's, None in the others), and the epoch's counts (its curve: ``work/log.jsonl``)."""
    from datasets import Dataset

    last = last_good_checkpoint(work)
    resumed_at = int(last.rsplit("-", 1)[-1]) if last else 0
    curve = CurveLog(work / "log.jsonl", resumed_at=resumed_at)
    peft = peft_config(settings.lora)
    args = dpo_config(
        work,
        generator.device,
        seed,
        settings.save_steps,
        settings.bf16,
        beta=settings.beta,
        learning_rate=settings.lr,
        # batch_size: the global batch; this process's share of it (rag_lab.train.parallel)
        per_device_train_batch_size=share(settings.batch_size, "policy.batch_size"),
        gradient_accumulation_steps=settings.grad_accum,
        num_train_epochs=settings.dpo_epochs,
        max_length=getattr(generator, "context_length", None) or 1024,
    )
    trainer = trainer_class()(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=generator.tokenizer,
        peft_config=peft,
        callbacks=[curve],
    )
    log.info("%s: DPO on %d pairs%s", what, len(rows), f", resuming from {last}" if last else "")
    trainer.train(resume_from_checkpoint=last)
    if trainer.state.global_step < trainer.state.max_steps:
        raise stopped_early(what, trainer.state.global_step, trainer.state.max_steps, work)
    # LoRA merged; a collective under FSDP / ZeRO-3, the gathered model the main process's (None elsewhere)
    trained = saveable(trainer.model, trainer.accelerator)
    stats = {"steps": trainer.state.global_step, "resumed_from": resumed_at or None}
    stats |= {"device": str(trainer.args.device), "bf16": trainer.args.bf16}
    return (trained.eval() if trained is not None else None), stats


@torch.no_grad()
def sequence_logprob(model, tokenizer, prompt: str, completion: str) -> float:
    """log π(completion | prompt) summed over the completion's tokens (plain text, no special tokens)."""
    ids = tokenizer(prompt + completion, add_special_tokens=False, return_tensors="pt").input_ids
    start = len(tokenizer(prompt, add_special_tokens=False).input_ids)
    ids = ids.to(next(model.parameters()).device)
    logits = model(ids).logits[0, :-1].float().log_softmax(-1)
    picked = logits.gather(1, ids[0, 1:, None])[:, 0]
    return picked[start - 1 :].sum().item()
