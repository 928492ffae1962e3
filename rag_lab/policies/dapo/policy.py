"""Multi-stage-reward DAPO (OpenReview XVtORJ0AXN; docs/methods/dapo.md) as a policy: ``policy=dapo``.

The policy is the ``dapo`` tagged protocol rolled out by the engine (``<think>``, ``<search>`` →
``<information>``, ``<reflect>``, ``<answer>``; :class:`rag_lab.policies.agent.Agent`). ``fit`` trains a
copy of the generator's model with TRL's ``GRPOTrainer`` in DAPO's setting (:mod:`.trainer`: token-level
loss, clip-higher, no KL, group-normalised advantages), its rollouts the engine's multi-turn episodes with
the retrieved tokens masked out of the loss and DAPO's dynamic sampling (:mod:`.rollout`). The reward is
r_sum = r_a + r_s + r_f (eq. 12): the run's ``reward`` group (``reward=dapo``: :mod:`rag_lab.rewards.dapo`,
which this policy's config selects), trained in ``stages``: stage 1's answer reward (eq. 10) pays
retrievals of wrong answers, stage 2's (eq. 11) charges retrievals of right ones, and stage 2 starts from
stage 1's weights. ``stages`` [1, 2] is the paper; [2] is its "w/o stage one", [1] "w/o stage two",
[unified] its table 2's single-stage reward, [] the untrained start. The trained model stays on the
policy (``generator``), which evaluation acts with.

- Optional first: the cold start (:func:`rag_lab.train.cold_start.cold_start`, SFT on rejection-sampled
  teacher demonstrations of the ``dapo`` protocol), on in ``conf/policy/dapo.yaml``; ``make demo``,
  ``dapo_synth`` and ``dapo_2wiki`` start from the model itself, as the paper does
  (docs/methods/dapo.md#starting-point).
- Each stage is cached (``cache_dir/dapo/<key>``, :mod:`rag_lab.core.cache`: the starting weights, the stage,
  the training questions, the corpus, the run's resolved config but for ``policy.stages``, and the code),
  so a sweep over ``stages`` trains stage 1 once; a killed stage resumes from its last Trainer checkpoint,
  and the same seed gives the same weights on CPU (rollout seeds follow the step, not the process). Built
  outside the runner (no ``run_config``) nothing is shared: the stages live in the run's ``checkpoints/``.
- Curves (TRL's loss and rewards by component, plus the monitors RC, Acc and the dynamic-sampling counts)
  go to the stage's ``log.jsonl``, to the run's logger (``log.jsonl``; wandb with ``logger=wandb``) and to
  ``<run>/checkpoints/curves.png``.

Deviations: G, the batch and the step count are the embedded default's (8 × 4 questions, tens of steps
on 2 cores), the paper's (G 32, batch 32, lr 1e-6, 500 steps) are ``dapo_2wiki``'s; "stage 1 trains until
retrieval is learnt" is a fixed step count per stage; the answer's correctness is EM by default (the
paper's LLM judge: ``reward.answer.correct=judge``). Without a cold start the stages train a copy of the
run's model (the run's generator is shared, so it is not trained in place), which costs its memory twice.
"""

import logging
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any

from omegaconf import DictConfig, OmegaConf

from rag_lab.core import cache
from rag_lab.core.batches import enough_questions, micro_batch, processes_of
from rag_lab.core.config import NonNegative, OneOf, OpenUnit, Positive, PositiveInt, Range, takes
from rag_lab.core.errors import RagLabError
from rag_lab.core.records import read_records
from rag_lab.data.base import QAExample
from rag_lab.env import Env, Episode
from rag_lab.generators.base import Sampling, vllm_backed
from rag_lab.policies.agent import Agent
from rag_lab.policies.dapo.rollout import rollout_text, total_rewards
from rag_lab.policies.dapo.trainer import PANELS, stage_rewards, train_stage
from rag_lab.rewards.base import Reward, named
from rag_lab.train.cold_start import ColdStartConfig
from rag_lab.train.curves import write_curves
from rag_lab.train.heldout import HeldOut
from rag_lab.train.lora import LoRA, lora_settings
from rag_lab.train.resume import load_model, readable
from rag_lab.train.start import starting_model

log = logging.getLogger(__name__)
STAGES = (1, 2, "unified")


@dataclass(eq=False)
class DAPOSettings:
    """``policy=dapo``'s training settings, declared once: :class:`DAPO` takes each as a keyword
    (:func:`rag_lab.core.config.takes`, so the config schema lists them) and holds it as an attribute."""

    # the answer reward's stages, trained in order, each from the last one's weights
    stages: list[int | str] = (1, 2)
    # the stage whose r_a scores the evaluated episodes' own reward (records' own_reward; null: the last of
    # `stages`, or 2 where there is none: the start is scored as the [1, 2] row it starts)
    reward_stage: int | str | None = None
    # training steps per stage; questions per step, each sampled `group_size` times (G)
    steps: PositiveInt = 30
    questions_per_step: PositiveInt = 4
    # (GRPO compares a group's samples: 2 at least)
    group_size: Annotated[int, Range(2)] = 8
    # sequences per forward and backward pass in each process, at most (null: a process's whole step,
    # questions x G / processes): gradient accumulation over the step's episodes, still one update a
    # step, for a batch that does not fit in memory (the paper's 32 x 32; rag_lab.train.grpo.passes)
    micro_batch: PositiveInt | None = None
    lr: Positive = 1e-4
    epsilon: Annotated[float, Range(0, 1, open_min=True, open_max=True)] = 0.2
    epsilon_high: Annotated[float, Range(0, 1, open_min=True, open_max=True)] = 0.28
    # the KL term's coefficient (GRPO's beta): 0, as DAPO removes the KL term (the paper's sec. 3.2)
    kl_coef: NonNegative = 0.0
    # sampling of the training rollouts (> 0: at 0 a group's samples are all the same)
    train_temperature: Positive = 1.0
    top_p: OpenUnit = 1.0
    # drop groups whose rewards are all equal and re-draw them, at most max_rounds rollouts a step
    dynamic_sampling: bool = True
    max_rounds: PositiveInt = 4
    # what makes a group flat: its total rewards all equal ("reward": zero advantage, our reading of the
    # paper's sec. 3.2) or its episodes all right or all wrong ("correct": DAPO's own, Yu et al. 2025)
    flat_by: Annotated[str, OneOf("reward", "correct")] = "reward"
    # the first `train_limit` training questions (null: all)
    train_limit: PositiveInt | None = None
    lora: LoRA | None = None
    # SFT on the teacher's dapo demonstrations first (null: start from the generator as it is)
    cold_start: ColdStartConfig | None = None
    save_steps: PositiveInt = 10
    bf16: bool | None = None
    # the held-out curve: greedy Acc on the dev split's first n questions every `every` steps (null: none)
    heldout: HeldOut | None = None
    cache_dir: str = "~/.cache/rag_lab"
    seed: int = 0

    def __post_init__(self) -> None:
        bad = [s for s in self.stages if s not in STAGES]
        if bad:
            raise RagLabError(f"policy.stages: {bad[0]!r} is not a stage (1, 2 or unified)")
        if self.reward_stage is not None and self.reward_stage not in STAGES:
            raise RagLabError(f"policy.reward_stage: {self.reward_stage!r} is not a stage (1, 2 or unified)")
        self.stages = list(self.stages)
        self.heldout = self.heldout or HeldOut(n=0)


class DAPO(Agent, DAPOSettings):
    trains = True
    # each GPU's memory for its training (rag_lab.train.memory: python -m rag_lab.plan)
    memory_plan = "rag_lab.train.memory.methods.dapo"

    @takes(DAPOSettings, Agent, drop=["protocol"])
    def __init__(
        self,
        # reward name -> reward function (TRL's signature): the run's reward group (reward=dapo: answer,
        # search, format); filled by the runner
        reward: dict[str, Reward] | Reward | None = None,
        # weight per reward name (missing: 1.0); a null reward is left out (the ablations)
        weights: dict[str, float] | None = None,
        # the dataset trained on (the cold start's world) and the run's resolved config (the stages' cache
        # key); both filled by the runner
        train_data: Any = None,
        run_config: dict | None = None,
        # DAPOSettings' keys, and the rollout: policy=agent's (k, max_turns, exclude_seen, max_new_tokens,
        # temperature)
        **settings: Any,
    ):
        training = {f.name for f in fields(DAPOSettings)}
        DAPOSettings.__init__(self, **{k: v for k, v in settings.items() if k in training})
        super().__init__("dapo", **{k: v for k, v in settings.items() if k not in training})
        self.reward = named(reward)
        self.weights = {name: float((weights or {}).get(name, 1.0)) for name in self.reward}
        self.train_sampling = Sampling(
            temperature=self.train_temperature, top_p=self.top_p, max_new_tokens=self.sampling.max_new_tokens
        )
        self.train_data = train_data
        self.run_config = run_config
        # the trained model, once fit ran (evaluation acts with it)
        self.generator = None

    @staticmethod
    def global_batches(s: dict) -> dict[str, int]:
        """What the processes of a launched run split equally (:mod:`rag_lab.runner.launch`): a step's
        questions, so that each process plays whole groups."""
        return {"questions_per_step": int(s["questions_per_step"])}

    @staticmethod
    def check_settings(s: dict, run) -> list[tuple[str, str]]:
        """What the declarations cannot say (:mod:`rag_lab.core.config`): the clip range, the stages, names;
        the batch's relations and its shares over the processes (:mod:`rag_lab.core.batches`), LoRA's
        settings."""
        problems = []
        if not 0 < s["epsilon"] <= s["epsilon_high"] < 1:
            why = (
                f"the clip range needs 0 < epsilon ({s['epsilon']}) <= epsilon_high ({s['epsilon_high']}) < 1"
            )
            problems.append(("epsilon_high", why))
        problems += [
            ("stages", f"{x!r} is not a stage (1, 2 or unified)") for x in s["stages"] if x not in STAGES
        ]
        if s.get("reward_stage") is not None and s["reward_stage"] not in STAGES:
            problems.append(("reward_stage", f"{s['reward_stage']!r} is not a stage (1, 2 or unified)"))
        problems += micro_batch(s, "episodes", processes_of(run)) + enough_questions(s)
        problems += lora_settings(s["lora"])
        terms = OmegaConf.select(run, "reward")
        names = (
            [k for k in terms if not k.startswith("_") and k != "beta"]
            if isinstance(terms, DictConfig)
            else []
        )
        if terms is not None and OmegaConf.select(run, "reward._target_", default="").endswith(
            "reward_terms"
        ):
            unknown = sorted(set(s["weights"] or {}) - set(names))
            problems += [
                ("weights", f"{n!r} is no term of the reward group ({', '.join(names)})") for n in unknown
            ]
        return problems

    def fit(self, env: Env, train: list[QAExample], dev: list[QAExample], out_dir: Path, logger=None) -> None:
        if not self.reward and self.stages:
            raise RagLabError("reward: DAPO needs reward functions (set reward=dapo)")
        base = env.generator
        start, generator = starting_model(
            "dapo", base, self.cold_start, self.train_data, self.cache_dir, bool(self.stages)
        )
        questions, rows, previous = train[: self.train_limit], [], cache.files_digest(start)
        for i, stage in enumerate(self.stages):
            done = self.stage_dir(previous, stage, questions, env, Path(out_dir))
            if (done / "train.json").exists():
                log.info("DAPO stage %s: reusing %s", stage, done)
            else:
                # a later stage's start is the stage before's last held-out point (the same model): not again
                heldout = self.heldout.questions(dev)
                train_stage(self, generator, env, stage, questions, done, heldout, measure_start=i == 0)
            generator = generator.with_model(
                load_model(readable(done, f"DAPO stage {stage}"), like=generator.model)
            )
            offset = rows[-1]["step"] if rows else 0
            logged = read_records(done / "log.jsonl")
            rows += [r | {"stage": str(stage), "step": offset + r["step"]} for r in logged]
            previous = done.name
        self.generator = generator
        vllm = vllm_backed(base)
        if self.stages and vllm:  # generator=vllm: the run evaluates on an engine of the trained weights
            self.generator = vllm.with_weights(str(done))
        if rows:
            write_curves(rows, Path(out_dir), logger, PANELS, "DAPO training")

    def own_rewards(self, env: Env, batch: list[QAExample], episodes: list[Episode]) -> list[float | None]:
        """r_sum = r_a + r_s + r_f (eq. 12) of each evaluated episode, as a stage's trainer scores a rollout
        (:func:`.trainer.stage_rewards` weighted by :func:`.rollout.total_rewards`, on the engine's rollout
        text), r_a that of ``reward_stage``; None each with no reward group."""
        if not self.reward:
            return [None] * len(episodes)
        stage = self.reward_stage if self.reward_stage is not None else (self.stages or [2])[-1]
        texts = [rollout_text(env.corpus, ep) for ep in episodes]
        return total_rewards(stage_rewards(self, stage), texts, [list(q.answers) for q in batch]).tolist()

    def stage_dir(self, previous: str, stage, questions: list[QAExample], env: Env, out_dir: Path) -> Path:
        """Where a stage's model is cached (module docstring): ``cache_dir/dapo/<key>``, or with no
        ``run_config`` (built outside the runner) ``out_dir/stages/<key>``, shared with nothing."""
        content = [[q.id, q.question, list(q.answers)] for q in questions], env.corpus.fingerprint
        config = dict(self.run_config or {})
        # which stages run, and which one scores the evaluation, are not what this stage trains
        config["policy"] = {
            k: v for k, v in config.get("policy", {}).items() if k not in ("stages", "reward_stage")
        }
        # the corpus and the questions count by content; the evaluation's settings do not count
        for unrelated in ("eval", "logger", "judge", "experiment", "data", "train_data", "hydra"):
            config.pop(unrelated, None)
        root = self.cache_dir if self.run_config is not None else out_dir / "stages"
        return cache.path(
            root, "dapo", previous, str(stage), *content, config, code="rag_lab.policies.dapo.trainer"
        )
