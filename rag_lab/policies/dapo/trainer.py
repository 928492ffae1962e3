"""One stage of multi-stage-reward DAPO (OpenReview XVtORJ0AXN; docs/methods/dapo.md) on TRL's
``GRPOTrainer`` in DAPO's setting: ``loss_type="dapo"`` (token-level loss averaged over the batch's
tokens), clip-higher ``epsilon`` 0.2 / ``epsilon_high`` 0.28, ``beta`` 0 by default (``policy.kl_coef``:
no KL term, no reference model), group-normalised advantages, one optimiser update per generated batch
(mini-batch = batch: on-policy, so the clip binds only where the sampler's and the trainer's log-probs
differ, as in the paper's verl setup); rollouts from the engine with the retrieved tokens out of the loss and
dynamic sampling (:mod:`rag_lab.policies.dapo.rollout`). The stage trains the model it is given in place
and publishes it to its cache directory (:func:`rag_lab.core.cache.publish`); a killed stage resumes from its
last Trainer checkpoint (``<dir>.work`` beside it) to the uninterrupted weights.
"""

import json
import logging
import shutil
import time
from pathlib import Path

from rag_lab.core import cache
from rag_lab.data.base import QAExample
from rag_lab.env import Env
from rag_lab.generators.base import vllm_backed
from rag_lab.generators.hf import HFGenerator
from rag_lab.policies.dapo.rollout import OnRollouts, SearchRollouts
from rag_lab.rewards.dapo import answer_correct, retrieval_count
from rag_lab.train.curves import CurveLog
from rag_lab.train.grpo import grpo_config, passes
from rag_lab.train.heldout import HeldOutCallback
from rag_lab.train.lora import peft_config
from rag_lab.train.parallel import processes, publish_on_main, share
from rag_lab.train.resume import last_good_checkpoint, stopped_early
from rag_lab.train.sharded import saveable

log = logging.getLogger(__name__)

# TRL's log keys -> the curves' (the rest keep TRL's names)
RENAME = {"rewards/rc/mean": "rc", "rewards/acc/mean": "acc", "frac_reward_zero_std": "flat_groups"}
PANELS = [
    ("held-out questions (greedy)", ["heldout/acc", "heldout/format_failures"]),
    ("reward", ["reward", "rewards/answer/mean", "rewards/search/mean", "rewards/format/mean"]),
    ("retrieval count (RC)", ["rc"]),
    ("accuracy / format rate", ["acc", "format_rate"]),
    ("loss", ["loss"]),
    ("dynamic sampling", ["sampling/dropped_groups", "sampling/flat_groups_kept", "sampling/mixed_groups"]),
    ("completion tokens", ["completions/mean_length"]),
]


def dapo_config(policy, work: Path, reward_weights: list[float], device: str, vllm: dict | None = None):
    """TRL's ``GRPOConfig`` in DAPO's setting (module docstring), at the sizes of ``policy`` (a
    :class:`~rag_lab.policies.dapo.policy.DAPO`), on ``device`` (:func:`rag_lab.train.grpo.grpo_config`);
    ``vllm``: TRL's vLLM keys when the run's generator is vLLM (rollouts through its engine)."""
    return grpo_config(
        work,
        device,
        policy.seed,
        policy.save_steps,
        policy.bf16,
        max_steps=policy.steps,
        # a step's questions split between the processes, whole groups each (rag_lab.train.parallel), in
        # passes of policy.micro_batch sequences (one update a step either way)
        **passes(
            share(policy.questions_per_step, "policy.questions_per_step") * policy.group_size,
            policy.micro_batch,
            "policy.micro_batch",
        ),
        num_generations=policy.group_size,
        num_iterations=1,
        learning_rate=policy.lr,
        loss_type="dapo",
        epsilon=policy.epsilon,
        epsilon_high=policy.epsilon_high,
        beta=policy.kl_coef,
        scale_rewards="group",
        reward_weights=reward_weights,
        temperature=policy.train_sampling.temperature,
        max_completion_length=policy.max_turns * policy.sampling.max_new_tokens,
        remove_unused_columns=False,
        **(vllm or {}),
    )


def vllm_settings(env: Env) -> dict:
    """TRL's vLLM keys where the run's generator is vLLM (``generator=vllm``), else none."""
    vllm = vllm_backed(env.generator)
    return vllm.trl_settings() if vllm else {}


def curve_row(rollouts: SearchRollouts):
    """The curve's row of a logged step: TRL's keys renamed, the format rate, the rollouts' counts."""

    def finish(row: dict) -> dict:
        row = {RENAME.get(k, k): v for k, v in row.items()}
        if "rewards/format/mean" in row:  # r_f is +1 / -1
            row["format_rate"] = (row["rewards/format/mean"] + 1) / 2
        return row | rollouts.stats

    return finish


def train_stage(
    policy,
    generator: HFGenerator,
    env: Env,
    stage,
    questions: list[QAExample],
    done: Path,
    heldout: list[QAExample] = (),
    measure_start: bool = True,
) -> None:
    """One stage of GRPO-with-DAPO on ``generator.model`` (in place), published to ``done``, with the
    settings of ``policy`` (a :class:`~rag_lab.policies.dapo.policy.DAPO`); its held-out curve (the greedy
    episodes of ``heldout``, :mod:`rag_lab.train.heldout`; the start's if ``measure_start``) joins its log."""
    from datasets import Dataset
    from trl import GRPOTrainer

    work = done.with_name(f"{done.name}.work")
    rewards = stage_rewards(policy, stage)
    # monitors: logged by TRL as rewards/rc and rewards/acc, weight 0 (they train nothing)
    monitors = [(OnRollouts("rc", retrieval_count), 0.0), (OnRollouts("acc", answer_correct), 0.0)]
    rollouts = SearchRollouts(
        env,
        generator,
        questions,
        rewards,
        k=policy.k,
        max_turns=policy.max_turns,
        sampling=policy.train_sampling,
        dynamic_sampling=policy.dynamic_sampling,
        flat_by=policy.flat_by,
        max_rounds=policy.max_rounds,
        seed=policy.seed,
    )
    dataset = Dataset.from_list(
        [{"prompt": rollouts.first_prompt(q), "answers": list(q.answers)} for q in questions]
    )
    last = last_good_checkpoint(work)
    resumed_at = int(last.rsplit("-", 1)[-1]) if last else 0
    curve = CurveLog(work / "log.jsonl", resumed_at=resumed_at, finish=curve_row(rollouts))
    measured = heldout_curve(policy, env, generator, heldout, curve, resumed_at, measure_start)
    trainer = GRPOTrainer(
        model=generator.model,
        reward_funcs=[fn for fn, _ in rewards + monitors],
        args=dapo_config(
            policy, work, [w for _, w in rewards + monitors], generator.device, vllm_settings(env)
        ),
        train_dataset=dataset,
        processing_class=generator.tokenizer,
        peft_config=peft_config(policy.lora),
        rollout_func=rollouts,
        callbacks=[curve, measured],
    )
    measured.trainer = trainer  # the held-out questions generate as its rollouts do (engine or model)
    log.info(
        "DAPO stage %s: %d steps of %d questions x %d samples%s",
        stage,
        policy.steps,
        policy.questions_per_step,
        policy.group_size,
        f", resuming from {last}" if last else "",
    )
    began = time.perf_counter()
    trainer.train(resume_from_checkpoint=last)
    if trainer.state.global_step < policy.steps:
        raise stopped_early(f"DAPO stage {stage}", trainer.state.global_step, policy.steps, work)
    model = saveable(trainer.model, trainer.accelerator)  # LoRA merged; a collective under FSDP / ZeRO-3
    stats = {
        "stage": str(stage),
        "steps": policy.steps,
        "seconds": time.perf_counter() - began,
        "resumed_from": curve.resumed_at or None,
        "device": str(trainer.args.device),
        "bf16": trainer.args.bf16,
        "processes": processes(),
    }
    # every process trained on its groups; the main one publishes
    publish_on_main(lambda: publish_stage(model, stats, work, done))


def publish_stage(model, stats: dict, work: Path, done: Path) -> None:
    """The stage's model, curve and stats, published to ``done`` in one rename; the work dir removed."""
    with cache.publish(done) as tmp:
        model.save_pretrained(tmp)
        shutil.copy2(work / "log.jsonl", tmp / "log.jsonl")
        (tmp / "train.json").write_text(json.dumps(stats, indent=1, default=str) + "\n")
    shutil.rmtree(work, ignore_errors=True)


def heldout_curve(
    policy,
    env: Env,
    generator: HFGenerator,
    questions: list[QAExample],
    curve: CurveLog,
    resumed_at: int,
    start: bool = True,
) -> HeldOutCallback:
    """The held-out curve (:mod:`rag_lab.train.heldout`): the policy's greedy episodes of ``questions``
    with the trainer's model as it is (on its vLLM engine with ``generator=vllm``), each row into ``curve``'s
    log; ``start``: the model before the first step too."""
    return HeldOutCallback(
        policy.heldout,
        questions,
        lambda actor, share: policy.rollout(env.with_generator(actor), list(share)),
        lambda row: curve.writer.write([row]),
        getattr(policy.train_data, "scorer", "squad"),
        resumed_at,
        generator=generator,
        start=start,
    )


def stage_rewards(policy, stage) -> list[tuple[OnRollouts, float]]:
    """The reward terms of ``policy``'s group with their weights, r_a's form that of ``stage`` (eqs. 10-12):
    what a stage trains on, and what the policy's evaluated episodes are scored with (``own_rewards``)."""
    return [
        (OnRollouts(name, fn, **({"stage": stage} if takes_stage(fn) else {})), policy.weights[name])
        for name, fn in policy.reward.items()
    ]


def takes_stage(fn) -> bool:
    """Whether reward ``fn`` has a ``stage`` parameter (the multi-stage answer reward's)."""
    import inspect
    from functools import partial

    target = fn.func if isinstance(fn, partial) else fn
    return "stage" in inspect.signature(target).parameters
