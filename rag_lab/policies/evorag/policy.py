"""EVO-RAG (arXiv:2505.17391; docs/methods/evorag.md) as a policy: ``policy=evorag``.

The policy is the ``evorag`` protocol rolled out by the engine: one action per step, SEARCH / BACKTRACK /
ANSWER / REFUSE, at most T_max = 20 steps (``max_turns``; sec. 3.1, 3.6). BACKTRACK abandons the latest
search that still holds evidence (its documents leave the prompt: :mod:`rag_lab.env.engine`). ``fit``
trains a copy of the generator's model:

- optionally first the cold start (:func:`rag_lab.train.cold_start.cold_start` on the teacher's ``evorag``
  demonstrations; a refusal of an unanswerable question counts as right);
- then per stage of ``stages`` (1 Discovery, 2 Refinement: table 1's weights), cycles of branch
  rollouts scored by the seven step rewards (``reward=evorag``: :class:`rag_lab.rewards.evorag.EvoRAGReward`),
  one preference-model epoch and one DPO + LoRA policy epoch (:mod:`.trainer`), until dev EM stalls for
  ``patience`` cycles; Refinement starts from Discovery's best cycle, and the final model is the last
  stage's best (:mod:`.curriculum`). ``stages`` [] is the untrained start, [1] Discovery alone.
- Curves (preference accuracy and loss, DPO loss / margins / accuracies, dev EM, the rollouts' steps,
  backtracks and refusals, the branch counts) go to ``checkpoints/train_log.jsonl``, ``curves.png`` and the
  logger; which cycle each stage chose to ``checkpoints/evorag.json``.

Deviations, written down (the embedded default's sizes; the paper's are ``evorag_hotpotqa``'s): a cycle
draws ``questions_per_cycle`` training questions, rolled out in batches of ``rollout_batch`` (each its own
seed, so that 1 and N processes branch alike), and branches ``states_per_episode`` states of each; dev
EM is on the dev split's first ``dev_limit`` questions; the preference model reads MiniLM embeddings (a
frozen LLM in the paper) and trains beside the policy without steering it (the paper leaves its role in the
update open: DPO's pairs come from the returns, as its sec. 3.4 describes them); each DPO's reference is
the policy at the start of its cycle. Without a cold start the stages train a copy of the run's model.
"""

import json
import logging
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Annotated, Any

from omegaconf import OmegaConf

from rag_lab.core import cache
from rag_lab.core.config import NonNegative, OpenUnit, Positive, PositiveInt, Range, check_ranges, takes
from rag_lab.core.errors import RagLabError
from rag_lab.core.records import atomic_write_text
from rag_lab.data.base import QAExample
from rag_lab.env import Env, Episode
from rag_lab.generators.base import vllm_backed
from rag_lab.policies.agent import Agent
from rag_lab.policies.evorag.branches import ACTIONS, held_evidence
from rag_lab.policies.evorag.curriculum import curve_rows, run_stage
from rag_lab.policies.evorag.preference import DELTA, MINILM, PreferenceModel
from rag_lab.policies.evorag.trainer import dev_em
from rag_lab.rewards.evorag import COMPONENTS, EvoRAGReward
from rag_lab.train.cold_start import ColdStartConfig
from rag_lab.train.curves import write_curves
from rag_lab.train.lora import LoRA, lora_settings
from rag_lab.train.resume import load_model
from rag_lab.train.start import starting_model
from rag_lab.train.vllm_engine import rollout_engine

log = logging.getLogger(__name__)
PANELS = [
    ("preference model (accuracy on new pairs, loss)", ["pm/accuracy", "pm/loss"]),
    ("DPO loss", ["loss"]),
    ("DPO rewards", ["rewards/margins", "rewards/accuracies"]),
    ("EM (dev greedy, rollouts sampled)", ["dev_em", "rollout/em"]),
    ("rollouts per episode", ["rollout/steps", "rollout/backtracks", "rollout/refused"]),
    ("branches per cycle", ["branch/states", "branch/branches", "branch/pairs_pm", "branch/pairs_dpo"]),
]
# the curriculum's stopping settings: they decide how many cycles run, not what a cycle is (not in its key)
STOPPING = ("stages", "max_cycles", "patience", "min_delta")
# nor does the stage that scores the evaluation (own_rewards)
EVALUATION = ("reward_stage",)


@dataclass(frozen=True)
class PreferenceSettings:
    """``policy.preference``: the multi-head preference model (:mod:`.preference`)."""

    # |ΔR| at least this for a pair (sec. 3.3's Δ)
    margin: NonNegative = DELTA
    heads: PositiveInt = len(COMPONENTS)
    encoder: str = MINILM
    lr: Positive = 1e-3
    batch_size: PositiveInt = 64
    # the widest pairs per state (null: every qualifying pair)
    pairs_per_state: PositiveInt | None = None

    def __post_init__(self) -> None:
        for key, why in check_ranges(PreferenceSettings, asdict(self)):
            raise RagLabError(f"policy.preference.{key}: {why}")


def relations(s: dict) -> list[tuple[str, str]]:
    """What :class:`EvoRAGSettings`' declarations cannot say: the stages, the actions, LoRA's settings."""
    problems = []
    stages = list(s["stages"])
    if any(x not in (1, 2) for x in stages) or stages != sorted(set(stages)):
        problems.append(("stages", f"{stages}: a subset of [1, 2] in order (1 Discovery, 2 Refinement)"))
    if s.get("reward_stage") not in (None, 1, 2):
        problems.append(("reward_stage", f"{s['reward_stage']!r}: 1 (Discovery), 2 (Refinement) or null"))
    unknown = [a for a in s["actions"] if a not in ACTIONS]
    if unknown or len(set(s["actions"])) < 2:
        problems.append(("actions", f"{list(s['actions'])}: two or more of {', '.join(ACTIONS)}"))
    return problems + lora_settings(s.get("lora"))


def t_max(max_turns: int) -> list[tuple[str, str]]:
    """The rollout's T_max (``max_turns``, policy=agent's key) is a step at least."""
    return [] if max_turns >= 1 else [("max_turns", f"(T_max) must be >= 1, got {max_turns}")]


@dataclass(eq=False)
class EvoRAGSettings:
    """``policy=evorag``'s training settings, declared once: :class:`EvoRAG` takes each as a keyword
    (:func:`rag_lab.core.config.takes`, so the config schema lists them) and holds it as an attribute; each
    is checked here, where it is built (its range, :func:`relations`)."""

    # 1 Discovery, 2 Refinement, in order; [] the untrained start
    stages: list[int] = (1, 2)
    # the stage whose weights score the evaluated episodes' own reward (records' own_reward: R(x); null: the
    # last of `stages`, or 2 where there is none: the start is scored as the [1, 2] row it starts)
    reward_stage: Annotated[int, Range(1, 2)] | None = None
    # cycles per stage at most; stop a stage when dev EM has not beaten its best for `patience` cycles
    max_cycles: PositiveInt = 3
    patience: PositiveInt = 2
    min_delta: NonNegative = 0.0
    # per cycle: training questions rolled out, states branched per episode (null: all)
    questions_per_cycle: PositiveInt = 64
    states_per_episode: PositiveInt | None = 2
    # questions rolled out together under one seed (.trainer.collect): a batch plays the same in 1 or N
    # processes, and a launched run's processes share the batches (more batches than processes: all busy)
    rollout_batch: PositiveInt = 16
    # the dev questions dev EM is measured on (null: all)
    dev_limit: PositiveInt | None = 200
    # the action kinds a state's siblings take
    actions: list[str] = ACTIONS
    # DPO's pairs: |ΔR| at least `margin` (δ, sec. 3.4), the `pairs_per_state` widest per state
    margin: NonNegative = 0.2
    pairs_per_state: PositiveInt | None = 1
    preference: PreferenceSettings | None = None
    # DPO: β, learning rate, batch (effective: batch_size x grad_accum), epochs over a cycle's pairs
    beta: Positive = 0.1
    lr: Positive = 1e-3
    batch_size: PositiveInt = 8
    grad_accum: PositiveInt = 1
    dpo_epochs: PositiveInt = 1
    lora: LoRA | None = None
    # sampling of the training rollouts and the branches
    train_temperature: Positive = 1.0
    top_p: OpenUnit = 1.0
    train_limit: PositiveInt | None = None
    # SFT on the teacher's evorag demonstrations first (null: start from the generator as it is)
    cold_start: ColdStartConfig | None = None
    save_steps: PositiveInt = 5
    bf16: bool | None = None
    cache_dir: str = "~/.cache/rag_lab"
    seed: int = 0

    def __post_init__(self) -> None:
        settings = {f.name: getattr(self, f.name) for f in fields(EvoRAGSettings)}
        for key, why in [*check_ranges(EvoRAGSettings, settings), *relations(settings)]:
            raise RagLabError(f"policy.{key}: {why}")
        self.stages = list(self.stages)
        self.actions = list(self.actions)
        self.preference = self.preference or PreferenceSettings()


class EvoRAG(Agent, EvoRAGSettings):
    trains = True
    # each GPU's memory for its training (rag_lab.train.memory: python -m rag_lab.plan)
    memory_plan = "rag_lab.train.memory.methods.evorag"

    @takes(EvoRAGSettings, Agent, drop=["protocol"])
    def __init__(
        self,
        # the run's reward group (reward=evorag), filled by the runner
        reward: EvoRAGReward | None = None,
        # the dataset trained on and the run's resolved config (the cycles' cache key), filled by the runner
        train_data: Any = None,
        run_config: dict | None = None,
        # EvoRAGSettings' keys, and the rollout: policy=agent's (k, max_turns = T_max, exclude_seen,
        # max_new_tokens, temperature)
        **settings: Any,
    ):
        training = {f.name for f in fields(EvoRAGSettings)}
        EvoRAGSettings.__init__(self, **{k: v for k, v in settings.items() if k in training})
        rollout = {"max_turns": 20} | {k: v for k, v in settings.items() if k not in training}
        for key, why in t_max(rollout["max_turns"]):
            raise RagLabError(f"policy.{key}: {why}")
        super().__init__("evorag", **rollout)
        self.reward = reward
        self.train_data = train_data
        self.run_config = run_config
        self.scorer = getattr(train_data, "scorer", "squad")
        # the trained model, once fit ran (evaluation acts with it), and its rollouts' vLLM engine
        self.generator = None
        self.engine = None

    @staticmethod
    def global_batches(s: dict) -> dict[str, int]:
        """What the processes of a launched run split equally (:mod:`rag_lab.runner.launch`): DPO's batch (the
        preference model's is split item by item; the rollout batches and the dev questions are taken in
        turn, a process with none joining the gather: :mod:`.trainer`)."""
        return {"batch_size": int(s["batch_size"])}

    @staticmethod
    def check_settings(s: dict, run) -> list[tuple[str, str]]:
        """What the schema cannot say (:mod:`rag_lab.core.config`): the settings' relations, T_max, the
        reward."""
        problems = relations(s) + t_max(s.get("max_turns", 1))
        target = OmegaConf.select(run, "reward._target_", default=None) if run is not None else None
        if target and not target.endswith("EvoRAGReward"):
            problems.append(("reward", f"policy=evorag needs reward=evorag, not {target}"))
        return problems

    def fit(self, env: Env, train: list[QAExample], dev: list[QAExample], out_dir: Path, logger=None) -> None:
        if self.stages and not isinstance(self.reward, EvoRAGReward):
            raise RagLabError("reward: policy=evorag needs reward=evorag (its seven step rewards)")
        base = env.generator
        start, generator = starting_model(
            "evorag", base, self.cold_start, self.train_data, self.cache_dir, bool(self.stages)
        )
        self.generator = generator
        if isinstance(self.reward, EvoRAGReward):  # what trains and what scores the evaluation (own_rewards)
            self.reward.scorer = self.scorer
            if self.reward.refusal == "verifier" and self.reward.verifier.generator is None:
                self.reward.verifier.generator = base
        if not self.stages:
            return
        # generator=vllm: the rollouts' engine (rag_lab.train.vllm_engine; None: transformers)
        self.engine = rollout_engine(base, generator.model, generator.tokenizer, generator.chat)
        questions, dev = train[: self.train_limit], self.dev_questions(dev)
        root = Path(self.cache_dir).expanduser() if self.run_config is not None else Path(out_dir) / "stages"
        previous = cache.files_digest(start)
        start_em = first_em = self.start_em(generator, env, previous, dev, root)
        pm = PreferenceModel(self.preference.encoder, self.preference.heads, seed=self.seed)
        results, chosen = [], {}
        for stage in self.stages:
            result = run_stage(self, generator, env, stage, previous, start_em, questions, dev, pm, root)
            results.append((stage, result))
            best = result.chosen
            generator = generator.with_model(load_model(best, like=generator.model))
            previous, start_em = best.name, json.loads((best / "cycle.json").read_text())["dev_em"]
            chosen[str(stage)] = {"cycles": [str(p) for p in result.cycles], "chosen": str(best)}
        self.generator = generator
        self.engine = None
        vllm = vllm_backed(base)
        if vllm:  # generator=vllm: evaluate on an engine of the chosen weights
            self.generator = vllm.with_weights(str(best))
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "evorag.json", json.dumps(chosen, indent=1) + "\n")
        write_curves(curve_rows(results, first_em, len(dev)), out, logger, PANELS, "EVO-RAG training")

    def own_rewards(self, env: Env, batch: list[QAExample], episodes: list[Episode]) -> list[float | None]:
        """R(x) = Σ_t w(t)·r_t (sec. 3.3) of each evaluated episode, as the trainer scores a base rollout
        (:meth:`rag_lab.rewards.evorag.EvoRAGReward.returns`, T_max ``max_turns``, D≤t the passages the
        episode still held: :func:`.branches.held_evidence`), under ``reward_stage``'s weights; None each
        without ``reward=evorag``."""
        if not isinstance(self.reward, EvoRAGReward):
            return [None] * len(episodes)
        stage = self.reward_stage if self.reward_stage is not None else (self.stages or [2])[-1]
        evidence = [held_evidence(env.corpus, ep) for ep in episodes]
        return self.reward.returns(episodes, batch, stage, self.max_turns, evidence)

    def dev_questions(self, dev: list[QAExample]) -> list[QAExample]:
        """The stall rule's questions: the training data's dev split (the paper stops on its training set's
        dev EM), else the run's; the first ``dev_limit``."""
        source = self.train_data.split("dev") if self.train_data is not None else dev
        return list(source)[: self.dev_limit]

    def start_em(self, generator, env: Env, start: str, dev: list[QAExample], root: Path) -> float:
        """Dev EM of the model the first stage starts from (the stall rule's first value), cached."""
        path = self.cycle_dir(start, "start", 0, [], dev, env, root).with_suffix(".json")
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, json.dumps({"dev_em": dev_em(self, generator, env, dev)}) + "\n")
        return json.loads(path.read_text())["dev_em"]

    def cycle_dir(self, previous: str, stage, cycle: int, questions, dev, env: Env, root: Path) -> Path:
        """Where a cycle is cached (:mod:`.curriculum`): ``<root>/evorag/<key>``; ``root`` is ``cache_dir``
        under the runner, else the run's ``checkpoints/stages`` (shared with nothing)."""
        content = [[[q.id, q.question, list(q.answers)] for q in qs] for qs in (questions, dev)]
        config = dict(self.run_config or {})
        config["policy"] = {
            k: v for k, v in config.get("policy", {}).items() if k not in (*STOPPING, *EVALUATION)
        }
        for unrelated in ("eval", "logger", "judge", "experiment", "data", "train_data", "hydra"):
            config.pop(unrelated, None)
        return cache.path(
            root,
            "evorag",
            previous,
            str(stage),
            cycle,
            *content,
            env.corpus.fingerprint,
            config,
            code="rag_lab.policies.evorag.curriculum",
        )
