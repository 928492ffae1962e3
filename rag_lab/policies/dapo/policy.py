"""Multi-stage-reward DAPO (papers/multi-stage-dapo.txt; METHODS.md §2) as a policy: ``policy=dapo``.

The policy is the ``dapo`` tagged protocol rolled out by the engine (``<think>``, ``<search>`` →
``<information>``, ``<reflect>``, ``<answer>``; :class:`rag_lab.policies.prompting.Agent`). ``fit``
trains the generator's model with TRL's ``GRPOTrainer`` in DAPO's setting (``loss_type="dapo"``:
token-level loss averaged over the batch's tokens; clip-higher ``epsilon`` 0.2 / ``epsilon_high``
0.28; ``beta`` 0: no KL term, no reference model; group-normalised advantages), its rollouts the
engine's multi-turn episodes with the retrieved tokens masked out of the loss and DAPO's dynamic
sampling (:mod:`rag_lab.policies.dapo.rollout`). The reward is r_sum = r_a + r_s + r_f (eq. 12;
``reward=dapo``: :mod:`rag_lab.rewards.dapo`), trained in ``stages``: stage 1's answer reward (eq. 10)
pays retrievals of wrong answers, stage 2's (eq. 11) charges retrievals of right ones, and stage 2
starts from stage 1's weights. ``stages`` [1, 2] is the paper; [2] is its "w/o stage one", [1] "w/o
stage two", [unified] its table 2's single-stage reward, [] the untrained start.

- Optional first: the cold start (:func:`rag_lab.train.cold_start.cold_start`, SFT on rejection-sampled
  teacher demonstrations of the ``dapo`` protocol), the embedded default's starting point.
- Each stage is cached by content (``cache_dir/dapo/<key>``: the starting weights, the stage and every
  setting, the training questions, the rewards, this code), so a sweep over ``stages`` trains stage 1
  once; a killed stage resumes from its last Trainer checkpoint (``.work`` beside it), and the same
  seed gives the same weights on CPU (rollout seeds follow the step, not the process).
- Curves (TRL's loss and rewards by component, plus the monitors RC, Acc and the dynamic-sampling
  counts) go to the stage's ``log.jsonl``, to the run's logger (``log.jsonl``; wandb with
  ``logger=wandb``) and to ``<run>/checkpoints/curves.png``.

Deviations: G, the batch and the step count are the embedded default's (8 × 4 questions, tens of
steps on 2 cores), the paper's (G 32, batch 32, lr 1e-6, 500 steps) are ``dapo_2wiki``'s; "stage 1
trains until retrieval is learnt" is a fixed step count per stage; the answer's correctness is EM by
default (the paper's LLM judge: ``reward.answer.correct=judge``).
"""

import hashlib
import inspect
import json
import logging
import shutil
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

from rag_lab.config import PositiveInt
from rag_lab.data.base import QAExample
from rag_lab.env import Env
from rag_lab.errors import RagLabError
from rag_lab.generators.base import Sampling
from rag_lab.policies.dapo.curves import CurveLog, write_curves
from rag_lab.policies.dapo.rollout import OnRollouts, SearchRollouts
from rag_lab.policies.prompting import Agent
from rag_lab.records import read_records
from rag_lab.retrievers.cache import publish
from rag_lab.train.cold_start import ColdStartConfig, LoRA, content_hash, load

log = logging.getLogger(__name__)
STAGES = (1, 2, "unified")


class DAPO(Agent):
    trains = True

    def __init__(
        self,
        # reward name -> reward function (TRL's signature): ``reward=dapo`` gives answer, search, format
        rewards: dict[str, Any] | None = None,
        # weight per reward name (missing: 1.0); a null reward is left out (the ablations)
        weights: dict[str, float] | None = None,
        # the answer reward's stages, trained in order, each from the last one's weights
        stages: list[int | str] = (1, 2),
        # training steps per stage; questions per step, each sampled `group_size` times (G)
        steps: PositiveInt = 30,
        questions_per_step: PositiveInt = 4,
        group_size: PositiveInt = 8,
        lr: float = 1e-4,
        epsilon: float = 0.2,
        epsilon_high: float = 0.28,
        # sampling of the training rollouts
        train_temperature: float = 1.0,
        top_p: float = 1.0,
        # drop groups whose rewards are all equal and re-draw them, at most max_rounds rollouts a step
        dynamic_sampling: bool = True,
        max_rounds: PositiveInt = 4,
        # the first `train_limit` training questions (null: all)
        train_limit: PositiveInt | None = None,
        lora: LoRA | None = None,
        # SFT on the teacher's dapo demonstrations first (null: start from the generator as it is)
        cold_start: ColdStartConfig | None = None,
        # the world the cold start's teacher demonstrates on (the run's data)
        data: Any = None,
        # the dataset whose training split DAPO trains on (null: the run's data); dapo_2wiki trains on
        # 2Wiki and evaluates on seven datasets
        train_data: Any = None,
        save_steps: PositiveInt = 10,
        bf16: bool | None = None,
        cache_dir: str = "~/.cache/rag_lab",
        seed: int = 0,
        # the rollout (policy=agent's keys)
        k: PositiveInt = 5,
        max_turns: PositiveInt = 5,
        exclude_seen: bool = False,
        max_new_tokens: PositiveInt = 128,
        temperature: float = 0.0,
    ):
        super().__init__("dapo", k, max_turns, exclude_seen, max_new_tokens, temperature)
        bad = [s for s in stages if s not in STAGES]
        if bad:
            raise RagLabError(f"policy.stages: {bad[0]!r} is not a stage (1, 2 or unified)")
        self.rewards = {name: fn for name, fn in (rewards or {}).items() if fn is not None}
        self.weights = {name: float((weights or {}).get(name, 1.0)) for name in self.rewards}
        self.stages, self.steps, self.lr = list(stages), steps, lr
        self.questions_per_step, self.group_size = questions_per_step, group_size
        self.epsilon, self.epsilon_high = epsilon, epsilon_high
        self.train_sampling = Sampling(
            temperature=train_temperature, top_p=top_p, max_new_tokens=max_new_tokens
        )
        self.dynamic_sampling, self.max_rounds, self.train_limit = dynamic_sampling, max_rounds, train_limit
        self.lora, self.cold_start, self.data, self.train_data = lora, cold_start, data, train_data
        self.save_steps, self.bf16, self.cache_dir, self.seed = save_steps, bf16, cache_dir, seed

    # ---- training -------------------------------------------------------------------------------
    def fit(self, env: Env, train: list[QAExample], dev: list[QAExample], out_dir: Path, logger=None) -> None:
        if not self.rewards and self.stages:
            raise RagLabError("reward: DAPO needs reward functions (set reward=dapo)")
        generator = env.generator
        if not hasattr(generator, "model") or not hasattr(generator, "tokenizer"):
            raise RagLabError("policy=dapo trains a transformers model: set generator=tiny, smollm2 or hf")
        start = Path(generator.model.name_or_path)
        if self.cold_start is not None:
            start = self._cold_start(env, generator)
        if self.train_data is not None:
            train = self.train_data.split("train")
        questions, rows, previous = train[: self.train_limit], [], content_hash(start)
        for stage in self.stages:
            key = self.stage_key(previous, stage, questions)
            done = Path(self.cache_dir).expanduser() / "dapo" / key
            if (done / "train.json").exists():
                log.info("DAPO stage %s: reusing %s", stage, done)
            else:
                self.train_stage(env, stage, questions, done)
            env.generator.model = load_model(done, like=env.generator.model)
            offset = rows[-1]["step"] if rows else 0
            rows += [
                r | {"stage": str(stage), "step": offset + r["step"]}
                for r in read_records(done / "log.jsonl")
            ]
            previous = key
        if rows:
            write_curves(rows, Path(out_dir), logger)

    def _cold_start(self, env: Env, generator) -> Path:
        from rag_lab.train.cold_start import cold_start

        if self.data is None:
            raise RagLabError("policy.cold_start needs policy.data (the run's world: ${data})")
        path = cold_start(generator.model.name_or_path, self.data, self.cold_start, self.cache_dir,
                          tokenizer=generator.tokenizer.name_or_path, chat=generator.chat)  # fmt: skip
        env.generator = load(path, batch_size=generator.batch_size, seed=generator.seed)
        return path

    def train_stage(self, env: Env, stage, questions: list[QAExample], done: Path) -> None:
        """One stage of GRPO-with-DAPO on ``env.generator.model`` (in place), published to ``done``."""
        from datasets import Dataset
        from peft import LoraConfig
        from transformers.trainer_utils import get_last_checkpoint
        from trl import GRPOConfig, GRPOTrainer

        from rag_lab.rewards.dapo import answer_correct, retrieval_count

        work = done.with_name(f"{done.name}.work")
        rewards = [(OnRollouts(name, fn, **({"stage": stage} if takes(fn, "stage") else {})),
                    self.weights[name]) for name, fn in self.rewards.items()]  # fmt: skip
        # monitors: logged by TRL as rewards/rc and rewards/acc, weight 0 (they train nothing)
        monitors = [(OnRollouts("rc", retrieval_count), 0.0), (OnRollouts("acc", answer_correct), 0.0)]
        rollouts = SearchRollouts(env, questions, rewards, self.k, self.max_turns, self.train_sampling,
                                  self.dynamic_sampling, self.max_rounds, self.seed)  # fmt: skip
        dataset = Dataset.from_list(
            [{"prompt": rollouts.first_prompt(q), "answers": list(q.answers)} for q in questions]
        )
        cuda = torch.cuda.is_available()
        args = GRPOConfig(
            output_dir=str(work), max_steps=self.steps, seed=self.seed, data_seed=self.seed,
            per_device_train_batch_size=self.questions_per_step * self.group_size,
            num_generations=self.group_size, gradient_accumulation_steps=1, steps_per_generation=1,
            num_iterations=1, learning_rate=self.lr, lr_scheduler_type="constant", warmup_steps=0,
            loss_type="dapo", epsilon=self.epsilon, epsilon_high=self.epsilon_high, beta=0.0,
            scale_rewards="group", reward_weights=[w for _, w in rewards + monitors],
            temperature=self.train_sampling.temperature,
            max_completion_length=self.max_turns * self.sampling.max_new_tokens, disable_dropout=True,
            logging_steps=1, save_strategy="steps", save_steps=self.save_steps, save_total_limit=2,
            bf16=(cuda and torch.cuda.is_bf16_supported()) if self.bf16 is None else self.bf16,
            use_cpu=not cuda, report_to="none", gradient_checkpointing=False, remove_unused_columns=False,
        )  # fmt: skip
        peft = None
        if self.lora and self.lora.r:
            peft = LoraConfig(
                r=self.lora.r,
                lora_alpha=self.lora.alpha,
                lora_dropout=self.lora.dropout,
                target_modules=list(self.lora.target_modules),
                task_type="CAUSAL_LM",
            )
        last = get_last_checkpoint(str(work)) if work.is_dir() else None
        resumed_at = int(last.rsplit("-", 1)[-1]) if last else 0
        curve = CurveLog(work / "log.jsonl", rollouts, resumed_at=resumed_at)
        trainer = GRPOTrainer(
            model=env.generator.model, reward_funcs=[fn for fn, _ in rewards + monitors], args=args,
            train_dataset=dataset, processing_class=env.generator.tokenizer, peft_config=peft,
            rollout_func=rollouts, callbacks=[curve],
        )  # fmt: skip
        log.info(
            "DAPO stage %s: %d steps of %d questions x %d samples%s",
            stage,
            self.steps,
            self.questions_per_step,
            self.group_size,
            f", resuming from {last}" if last else "",
        )
        began = time.perf_counter()
        trainer.train(resume_from_checkpoint=last)
        if trainer.state.global_step < self.steps:
            raise RagLabError(f"DAPO stage {stage}: stopped at step {trainer.state.global_step} of "
                              f"{self.steps}; the next run resumes from {work}")  # fmt: skip
        model = trainer.model.merge_and_unload() if peft else trainer.model
        with publish(done) as tmp:
            model.save_pretrained(tmp)
            shutil.copy2(work / "log.jsonl", tmp / "log.jsonl")
            stats = {"stage": str(stage), "steps": self.steps, "seconds": time.perf_counter() - began,
                     "resumed_from": curve.resumed_at or None, "settings": self.settings()}  # fmt: skip
            (tmp / "train.json").write_text(json.dumps(stats, indent=1, default=str) + "\n")
        shutil.rmtree(work, ignore_errors=True)

    def settings(self) -> dict:
        """Everything that changes what a stage learns (its cache key)."""
        return {
            "steps": self.steps, "questions_per_step": self.questions_per_step, "group_size": self.group_size,
            "lr": self.lr, "epsilon": self.epsilon, "epsilon_high": self.epsilon_high,
            "sampling": repr(self.train_sampling), "dynamic_sampling": self.dynamic_sampling,
            "max_rounds": self.max_rounds, "lora": repr(self.lora), "k": self.k, "max_turns": self.max_turns,
            "exclude_seen": self.exclude_seen, "seed": self.seed, "weights": self.weights,
            "max_new_tokens": self.sampling.max_new_tokens,
            "rewards": {name: describe(fn) for name, fn in self.rewards.items()},
        }  # fmt: skip

    def stage_key(self, previous: str, stage, questions: list[QAExample]) -> str:
        root = Path(__file__).resolve().parent.parent.parent
        sources = [*sorted((root / "policies" / "dapo").glob("*.py")), root / "rewards" / "dapo.py",
                   root / "env" / "engine.py", root / "env" / "protocols" / "tagged.py"]  # fmt: skip
        code = hashlib.sha256("".join(p.read_text() for p in sources if p.exists()).encode()).hexdigest()
        ids = [[q.id, q.question, list(q.answers)] for q in questions]
        blob = json.dumps([previous, str(stage), self.settings(), ids, code], sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def takes(fn, name: str) -> bool:
    """Whether reward ``fn`` has a parameter ``name`` (the answer reward's ``stage``)."""
    target = fn.func if isinstance(fn, partial) else fn
    return name in inspect.signature(target).parameters


SCALAR = (int, float, str, bool, type(None))


def plain(value) -> bool:
    """A scalar, or a list / tuple / dict of scalars (what prints the same in every process)."""
    if isinstance(value, dict):
        value = list(value.values())
    return (
        isinstance(value, SCALAR)
        or isinstance(value, list | tuple)
        and all(isinstance(x, SCALAR) for x in value)
    )


def describe(fn, depth: int = 0) -> Any:
    """A reward's identity for the cache key: its function and bound settings, or its class and plain
    fields, and those of the objects it holds (the search reward's encoder: its model name)."""
    if isinstance(fn, partial):
        return [f"{fn.func.__module__}.{fn.func.__qualname__}", sorted(fn.keywords.items())]
    if inspect.isfunction(fn):
        return f"{fn.__module__}.{fn.__qualname__}"
    fields = []
    for k, v in sorted(vars(fn).items()):
        if k == "device":  # where it runs does not change what it computes
            continue
        if plain(v):
            fields.append((k, v))
        elif depth == 0 and hasattr(v, "__dict__") and not isinstance(v, torch.nn.Module):
            fields.append((k, describe(v, depth + 1)))
    return [type(fn).__qualname__, fields]


def load_model(path: Path, like):
    from transformers import AutoModelForCausalLM

    device = next(like.parameters()).device
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
