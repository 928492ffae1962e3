"""APEX-Searcher (arXiv:2603.13853; docs/methods/apex.md) as a policy: ``policy=apex``.

Inference is the plan → execute → synthesise loop of :class:`rag_lab.policies.apex.pipeline.APEXPipeline`
(its algorithms 1 and 2: ``#n`` resolved from the knowledge base, up to ``hops`` rounds of the executor
step with de-duplicated retrieval, a fallback to the question itself when the plan does not parse, a
final answer with a confidence). Training follows its Refining Credit Assignment, each part a switch
(its table 2's ablation):

- ``plan_rl``: the planner trained by GRPO with SEPR against the gold decompositions
  (:mod:`rag_lab.policies.apex.planner`), from the generator's model;
- ``executor_sft``: the executor fine-tuned on the world teacher's filtered ``apex_exec`` / ``apex_final``
  traces (the shared cold start, :func:`rag_lab.train.cold_start.cold_start`), from the same model.

Planner and executor are two models, as in the paper (its planner and executor are trained apart): the
planner generates the plans, the executor everything else. Both stay on the policy (``planner``, and
``generator``: the fine-tuned executor, which evaluation acts with); untrained, each is the run's
generator. The plan reward is the run's ``reward`` group (``reward=sepr``, which this policy's config
selects). Both trainings are cached (:mod:`rag_lab.core.cache`; the planner's key holds the base model, the
questions' gold plans, the planner's and the reward's resolved config and the code; built outside the
runner, with no ``run_config``, it is kept in the run's ``checkpoints/`` instead) and resume after a kill.
"""

import json
import logging
from pathlib import Path
from typing import Any

from rag_lab.core import cache
from rag_lab.core.config import takes
from rag_lab.core.errors import RagLabError
from rag_lab.core.records import read_records
from rag_lab.data.base import QAExample
from rag_lab.env import Env, Episode
from rag_lab.generators.base import vllm_backed
from rag_lab.generators.hf import HFGenerator
from rag_lab.policies.apex.pipeline import APEXPipeline
from rag_lab.policies.apex.planner import PlannerRL, train_planner
from rag_lab.policies.stoprag.transfer import fit_stopper
from rag_lab.rewards.sepr import gold_plan
from rag_lab.train.cold_start import ColdStartConfig, cold_start, load
from rag_lab.train.curves import write_curves
from rag_lab.train.heldout import HeldOut, HeldOutCallback
from rag_lab.train.resume import readable

log = logging.getLogger(__name__)

PANELS = [
    ("held-out questions (greedy)", ["heldout/acc", "heldout/format_failures"]),
    ("plan reward (SEPR)", ["rewards/sepr/mean"]),
    ("plan steps", ["rewards/plan_steps/mean"]),
    ("KL to the reference / entropy", ["kl", "entropy"]),
    ("planner loss", ["loss"]),
    ("plan tokens", ["completions/mean_length"]),
    ("executor SFT loss", ["sft_loss"]),
]


class APEX(APEXPipeline):
    trains = True
    # each GPU's memory for its training (rag_lab.train.memory: python -m rag_lab.plan)
    memory_plan = "rag_lab.train.memory.methods.apex"

    @takes(APEXPipeline)
    def __init__(
        self,
        # two of the three switches of the paper's table 2 (the third, plan, is the pipeline's)
        plan_rl: bool = True,
        executor_sft: bool = True,
        planner: PlannerRL | None = None,
        # the executor's SFT: the cold start on the executor's protocols
        executor: ColdStartConfig | None = None,
        # the executor's teacher: a generator (null: the world teacher, data=synth only; the paper's are
        # Qwen2.5-32B-Instruct and DeepSeek-V3)
        teacher: Any = None,
        cache_dir: str = "~/.cache/rag_lab",
        # the plan reward (reward=sepr), the dataset the planner and the executor train on, and the run's
        # resolved config (the planner's cache key): filled by the runner
        reward: Any = None,
        train_data: Any = None,
        run_config: dict | None = None,
        # Stop-RAG's stopping rule before each further sub-question (policy=stoprag's settings; null: none):
        # rag_lab/policies/stoprag/transfer.py
        stopper: Any = None,
        # the held-out curve while the planner trains: the whole pipeline's greedy Acc on the dev split's
        # first n questions every `every` steps
        heldout: HeldOut | None = None,
        # the loop: policy=apex_prompt's keys (plan, hops, k, max_new_tokens, temperature)
        **pipeline: Any,
    ):
        super().__init__(**pipeline)
        self.plan_rl = plan_rl
        self.executor_sft = executor_sft
        self.sepr = reward
        # the yaml's planner: and executor: (how each trains)
        self.planner_settings = planner or PlannerRL()
        self.executor_settings = executor
        self.teacher = teacher
        self.train_data = train_data
        self.cache_dir = cache_dir
        self.run_config = run_config
        self.stoprag = stopper
        self.heldout = heldout or HeldOut(n=0)
        # what fit trains: the planner's LM and the executor's (None: the run's generator)
        self.planner_lm: HFGenerator | None = None
        self.generator: HFGenerator | None = None

    @staticmethod
    def global_batches(s: dict) -> dict[str, int]:
        """What the processes of a launched run split equally (:mod:`rag_lab.runner.launch`): the planner's
        questions per step (whole groups each) and the executor's SFT batch."""
        planner = dict(s.get("planner") or {})
        sizes = {
            "planner.questions_per_step": int(planner.get("questions_per_step", PlannerRL.questions_per_step))
        }
        if s.get("executor"):
            sizes["executor.batch_size"] = int(
                dict(s["executor"]).get("batch_size", ColdStartConfig.batch_size)
            )
        return sizes

    @staticmethod
    def check_settings(s: dict, run) -> list[tuple[str, str]]:
        """Switches that contradict each other (:mod:`rag_lab.core.config`)."""
        problems = []
        if s["plan_rl"] and not s["plan"]:
            problems.append(
                ("plan_rl", "plan RL trains the planner, but plan=false runs none: set plan_rl=false")
            )
        if s["executor_sft"] and not s["executor"]:
            problems.append(("executor", "executor_sft=true needs the executor's cold-start settings"))
        return problems

    def fit(self, env: Env, train: list[QAExample], dev: list[QAExample], out_dir: Path, logger=None) -> None:
        base = env.generator
        if not self.executor_sft and not (self.plan and self.plan_rl):  # nothing to train: the prompting loop
            self.stopper = fit_stopper(self.stoprag, self.run_config, env, train, dev, out_dir, logger)
            return
        run_generator = base
        vllm = vllm_backed(base)
        if vllm:  # generator=vllm: train transformers copies, plans roll out on vLLM
            base = vllm.trainable()
        if not hasattr(base, "model") or not hasattr(base, "tokenizer"):
            raise RagLabError("policy=apex trains a transformers model: set generator=tiny, smollm2 or hf")
        model_dir, tokenizer_dir = Path(base.model.name_or_path), Path(base.tokenizer.name_or_path)
        rows: list[dict] = []
        if self.plan and self.plan_rl and self.sepr is None:
            raise RagLabError("reward: plan RL needs the plan reward (set reward=sepr)")
        if self.executor_sft:
            if self.train_data is None or self.executor_settings is None:
                raise RagLabError("policy.executor: the executor's SFT needs its config and training data")
            path = cold_start(
                model_dir,
                self.train_data,
                self.executor_settings,
                self.cache_dir,
                tokenizer=tokenizer_dir,
                chat=base.chat,
                teacher=self.teacher,
            )
            self.generator = load(path, batch_size=base.batch_size, seed=base.seed)
            if self.plan and self.planner_lm is None:
                self.planner_lm = run_generator  # the untrained planner plans, not the fine-tuned executor
            offset = rows[-1]["step"] if rows else 0
            losses = json.loads((path / "train.json").read_text())["sft"]["losses"]
            rows += [{"stage": "executor", "step": offset + r["step"], "sft_loss": r["loss"]} for r in losses]
        if self.plan and self.plan_rl:
            # after the executor: the held-out curve runs the whole pipeline, with the executor it will have
            heldout = self._heldout(env.with_generator(self.generator or base), dev)
            trl_vllm = vllm.trl_settings() if vllm else None
            planner_dir = self._fit_planner(
                base, model_dir, tokenizer_dir, train, Path(out_dir), heldout, trl_vllm
            )
            offset = rows[-1]["step"] if rows else 0
            rows += [
                r | {"stage": "planner", "step": offset + r["step"]}
                for r in read_records(planner_dir / "log.jsonl")
            ]
        if rows:
            write_curves(rows, Path(out_dir), logger, PANELS, "APEX-Searcher training", sharex=False)
        self.stopper = fit_stopper(self.stoprag, self.run_config, env, train, dev, out_dir, logger)

    def _heldout(self, env: Env, dev: list[QAExample]) -> HeldOutCallback | None:
        """The planner's held-out curve: the whole pipeline (the planner as it trains, ``env``'s executor)
        on the dev split's first ``heldout.n`` questions, greedy. With ``generator=vllm`` the planner's plans
        generate on its trainer's vLLM engine, synced to the step's weights; the executor (trained before,
        frozen here) answers with transformers."""
        questions = self.heldout.questions(dev)
        if not questions:
            return None

        def rollout(planner, share: list[QAExample]) -> list[Episode]:
            kept = self.planner_lm
            self.planner_lm = planner  # the planner as it trains: on its trainer's vLLM engine, or its model
            try:
                return APEXPipeline.rollout(self, env, share)
            finally:
                self.planner_lm = kept

        scorer = getattr(self.train_data, "scorer", "squad")
        callback = HeldOutCallback(self.heldout, questions, rollout, scorer=scorer, generator=env.generator)
        callback.executor = str(getattr(env.generator.model, "name_or_path", ""))
        return callback

    def _fit_planner(
        self,
        base: HFGenerator,
        model_dir: Path,
        tokenizer_dir: Path,
        train: list[QAExample],
        out_dir: Path,
        heldout: HeldOutCallback | None = None,
        vllm: dict | None = None,
    ) -> Path:
        """The planner trained by GRPO with SEPR (cached, see the module docstring), loaded as
        ``self.planner_lm``; its dir. ``vllm``: TRL's vLLM keys (``generator=vllm``: the plans roll out on
        TRL's engine, which TRL syncs after every update)."""
        questions = [q for q in train if q.decomposition]
        plans = [[q.id, q.question, [[s.question, s.answer] for s in q.decomposition]] for q in questions]
        root = self.cache_dir if self.run_config is not None else out_dir
        reward = (self.run_config or {}).get("reward")
        out = cache.path(
            root,
            "apex_planner",
            cache.files_digest(model_dir, tokenizer_dir),
            base.chat,
            plans,
            self.planner_settings,
            reward,
            # the held-out curve in its log: its questions and the executor it ran with
            [self.heldout, [q.id for q in heldout.questions], heldout.executor] if heldout else None,
            # rolled out on vLLM: other samples, another planner (keys without vLLM unchanged)
            *([vllm] if vllm else []),
            code="rag_lab.policies.apex.planner",
        )
        settings = {"chat": base.chat, "batch_size": base.batch_size, "seed": base.seed, "dtype": "float32"}
        if (out / "train.json").exists():
            log.info("APEX planner: reusing %s", out)
        else:
            fresh = HFGenerator(str(model_dir), str(tokenizer_dir), **settings)
            train_planner(
                fresh, questions, self.sepr, self.planner_settings, out, base.chat, heldout=heldout, vllm=vllm
            )
        self.planner_lm = HFGenerator(str(readable(out, "APEX planner")), str(tokenizer_dir), **settings)
        return out

    def rollout(self, env: Env, batch: list[QAExample]) -> list[Episode]:
        """The pipeline's episodes; with ``sepr``, each plan's SEPR against the gold plan (questions that
        have one) on the plan step's rewards, which records.jsonl's ``sepr`` and the table's SEPR show."""
        episodes = super().rollout(env, batch)
        scored = [(ex, ep) for ex, ep in zip(batch, episodes, strict=True) if ex.decomposition and self.plan]
        if self.sepr is not None and scored:
            values = self.sepr([ep.steps[0].text for _, ep in scored], [gold_plan(ex) for ex, _ in scored])
            for (_, ep), value in zip(scored, values, strict=True):
                ep.steps[0].rewards["sepr"] = float(value)
        return episodes

    def own_rewards(self, env: Env, batch: list[QAExample], episodes: list[Episode]) -> list[float | None]:
        """The plan reward the planner trains on: each plan's SEPR against its gold plan, as :meth:`rollout`
        put it on the plan step (None where there is none: no gold plan, no ``sepr``, no plan)."""
        return [ep.steps[0].rewards.get("sepr") if ep.steps else None for ep in episodes]

    def plan_env(self, env: Env) -> Env:
        """The planner's environment: the planner (trained, or the untrained model when only the executor
        was fine-tuned) when fit set one, else the env as it is."""
        return env if self.planner_lm is None else env.with_generator(self.planner_lm)
