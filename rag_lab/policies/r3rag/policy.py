"""R3-RAG (arXiv:2505.23794; docs/methods/r3rag.md) as a policy: ``policy=r3rag``.

The policy is the ``r3rag`` protocol rolled out by the engine: each step a fresh prompt (the question and the
previous steps with their documents), the model writing ``The problem analysis: …`` then ``The retrieval
query: …`` or ``The final answer: …``; top-k documents per search, at most 5 steps. ``fit`` trains a copy of
the generator's model:

- the cold start (its algorithms 1-2: :func:`rag_lab.train.cold_start.cold_start` on the teacher's
  rejection-sampled ``r3rag`` trajectories, one SFT pair per step) → R3-RAG-CS; null: the model as it is;
- then ``ppo.iterations`` iterations of PPO with GAE, a value head and the KL to the initial model
  (:mod:`.ppo`, :mod:`.trainer`) on the step rewards of ``reward=r3rag``
  (:class:`rag_lab.rewards.r3rag_judges.R3RAGReward`); 0: the cold start alone.

The trained model is cached in ``cache_dir/r3rag/<key>`` (the starting weights, the questions, the corpus, the
run's config less evaluation and logging, the code) and resumes after a kill from ``<key>.work``. Curves
(reward parts, losses, KL, clip fraction, explained variance) go to ``checkpoints/train_log.jsonl``,
``curves.png`` and the logger; ``checkpoints/r3rag.json`` names the model.

Deviations, written down: the embedded default's sizes (``policy.ppo``: iterations, batch, learning rates)
are the tiny LM's; the paper's are ``r3rag_hotpotqa``'s. The process judge on ``data=synth`` is the gold
support overlap (no LLM judge runs on 2 CPU cores).
"""

import json
import logging
import shutil
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from rag_lab.core import cache
from rag_lab.core.config import PositiveInt, takes
from rag_lab.core.errors import RagLabError
from rag_lab.core.records import atomic_write_text, read_records
from rag_lab.data.base import QAExample
from rag_lab.env import Env, Episode
from rag_lab.generators.base import vllm_backed
from rag_lab.policies.agent import Agent
from rag_lab.policies.r3rag.ppo import PPOSettings
from rag_lab.policies.r3rag.trainer import PPOTrainer, Rollout
from rag_lab.policies.stoprag.transfer import fit_stopper
from rag_lab.rewards.r3rag_judges import R3RAGReward
from rag_lab.train.cold_start import ColdStartConfig
from rag_lab.train.curves import write_curves
from rag_lab.train.heldout import HeldOut
from rag_lab.train.parallel import barrier
from rag_lab.train.resume import load_model, readable
from rag_lab.train.start import starting_model

log = logging.getLogger(__name__)
PANELS = [
    ("held-out questions (greedy)", ["heldout/acc", "heldout/format_failures"]),
    ("reward parts (per step, mean)", ["reward/process", "reward/outcome", "reward/step"]),
    ("rollouts (sampled)", ["rollout/acc", "rollout/format_failure", "rollout/no_answer"]),
    ("losses", ["loss/policy", "loss/value"]),
    ("KL to the initial model", ["kl"]),
    ("clip fraction, mean ratio", ["clip_fraction", "ratio"]),
    ("critic's explained variance", ["explained_variance"]),
]
UNRELATED = ("eval", "logger", "judge", "experiment", "data", "train_data", "hydra")


class R3RAG(Agent):
    trains = True
    # each GPU's memory for its training (rag_lab.train.memory: python -m rag_lab.plan)
    memory_plan = "rag_lab.policies.r3rag.memory.plan"

    @takes(Agent, drop=["protocol"])
    def __init__(
        self,
        # the run's reward group (reward=r3rag), filled by the runner
        reward: R3RAGReward | None = None,
        ppo: PPOSettings | None = None,
        # SFT on the teacher's r3rag trajectories first (null: start from the generator as it is)
        cold_start: ColdStartConfig | None = None,
        # the first train_limit training questions (null: all)
        train_limit: PositiveInt | None = None,
        # the retriever PPO's rollouts search with (a partial retriever config; null: the run's): retriever
        # transfer trains with one and evaluates with the run's (the paper's table 3)
        train_retriever: Any = None,
        cache_dir: str = "~/.cache/rag_lab",
        seed: int = 0,
        # the dataset trained on and the run's resolved config (the cache key), filled by the runner
        train_data: Any = None,
        run_config: dict | None = None,
        # Stop-RAG's stopping rule on R3-RAG's turns (policy=stoprag's settings; null: none):
        # rag_lab/policies/stoprag/transfer.py
        stopper: Any = None,
        # the held-out curve: greedy Acc on the dev split's first n questions every `every` PPO iterations
        heldout: HeldOut | None = None,
        # the rollout: policy=agent's keys (k, max_turns, exclude_seen, max_new_tokens, temperature)
        **rollout: Any,
    ):
        rollout.setdefault("max_turns", 5)
        super().__init__("r3rag", **rollout)
        self.ppo = (
            ppo or PPOSettings()
        )  # its settings checked where it was built (PPOSettings.check_settings)
        self.reward = reward
        self.cold_start = cold_start
        self.train_limit = train_limit
        self.train_retriever = train_retriever
        self.cache_dir = cache_dir
        self.seed = seed
        self.train_data = train_data
        self.run_config = run_config
        self.stoprag = stopper
        self.heldout = heldout or HeldOut(n=0)
        self.scorer = getattr(train_data, "scorer", "squad")
        # the trained model, once fit ran (evaluation acts with it)
        self.generator = None

    @staticmethod
    def global_batches(s: dict) -> dict[str, int]:
        """What the processes of a launched PPO job split equally (:mod:`rag_lab.runner.launch`): the
        questions of an iteration."""
        return {"ppo.batch_size": int(dict(s.get("ppo") or {}).get("batch_size", PPOSettings.batch_size))}

    @staticmethod
    def check_settings(s: dict, run) -> list[tuple[str, str]]:
        """What the declarations cannot say (:mod:`rag_lab.core.config`): the reward. ``policy.ppo``'s own
        settings are :class:`~.ppo.PPOSettings`' to check."""
        target = OmegaConf.select(run, "reward._target_", default=None) if run is not None else None
        if target and not target.endswith("R3RAGReward"):
            return [("reward", f"policy=r3rag needs reward=r3rag, not {target}")]
        return []

    def fit(self, env: Env, train: list[QAExample], dev: list[QAExample], out_dir: Path, logger=None) -> None:
        self.fit_ppo(env, train, dev, out_dir, logger)
        self.stopper = fit_stopper(self.stoprag, self.run_config, env, train, dev, out_dir, logger)

    def fit_ppo(
        self, env: Env, train: list[QAExample], dev: list[QAExample], out_dir: Path, logger=None
    ) -> None:
        trains = self.ppo.iterations > 0
        if trains and not isinstance(self.reward, R3RAGReward):
            raise RagLabError("reward: policy=r3rag needs reward=r3rag (its step rewards and judges)")
        start, generator = starting_model(
            "r3rag", env.generator, self.cold_start, self.train_data, self.cache_dir, trains
        )
        self.generator = generator
        if isinstance(self.reward, R3RAGReward):  # what trains and what scores the evaluation (own_rewards)
            self.ready_reward(env)
        if not trains:
            return
        env, questions = self.training_env(env), train[: self.train_limit]
        root = Path(self.cache_dir).expanduser() if self.run_config is not None else Path(out_dir) / "ppo"
        done = self.result_dir(cache.files_digest(start), questions, env, root)
        if not (done / "ppo.json").exists():  # in every process of a launched run (rag_lab.runner.launched)
            self.train(generator, env, questions, done, dev)
        self.generator = generator.with_model(load_model(readable(done, "r3rag PPO"), like=generator.model))
        vllm = vllm_backed(env.generator)
        if vllm:  # generator=vllm: evaluation on an engine of the trained weights
            self.generator = vllm.with_weights(str(done))
        rows = list(read_records(done / "log.jsonl"))
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        info = {"model": str(done), "start": str(start)}
        atomic_write_text(out / "r3rag.json", json.dumps(info, indent=1) + "\n")
        write_curves(rows, out, logger, PANELS, "R3-RAG PPO")

    def ready_reward(self, env: Env) -> None:
        """The reward made ready: the dataset's scorer, and the run's generator as the judges' where none is
        set."""
        self.reward.scorer = self.scorer
        if self.reward.judge.generator is None:
            self.reward.judge.generator = env.generator

    def training_env(self, env: Env) -> Env:
        """The environment PPO acts in (``train_retriever``'s, else the run's), the reward made ready."""
        self.ready_reward(env)
        if self.train_retriever is not None:
            env = Env(env.corpus, self.train_retriever(corpus=env.corpus), env.generator)
        return env

    def own_rewards(self, env: Env, batch: list[QAExample], episodes: list[Episode]) -> list[float | None]:
        """Each evaluated episode's return, the sum of its step rewards (GAE's γ = 1) as PPO's rollouts are
        scored (:meth:`rag_lab.rewards.r3rag_judges.R3RAGReward.score`: process and outcome, the judges
        batched); a judge reads a step's documents as the episode saw them (whole: the cut to
        ``ppo.max_doc_chars`` is PPO's rollouts'). None each without ``reward=r3rag``."""
        if not isinstance(self.reward, R3RAGReward):
            return [None] * len(episodes)

        def docs(i: int, j: int) -> list:
            return [env.corpus.get(pid) for pid in episodes[i].steps[j].retrieved_ids]

        rows, _ = self.reward.score(episodes, batch, docs)
        return [float(sum(row)) for row in rows]

    def train(
        self, generator, env: Env, questions: list[QAExample], done: Path, dev: list[QAExample] = ()
    ) -> None:
        """PPO from ``generator``'s model, published to ``done`` by the main process (resumed from
        ``<done>.work``); in every process of a launched job (:mod:`.job`). ``dev``: where the held-out
        curve's questions come from."""
        work = done.with_name(f"{done.name}.work")
        rollout = Rollout(self.protocol, self.k, self.max_turns, self.sampling.max_new_tokens)
        trainer = PPOTrainer(
            generator,
            env,
            self.reward,
            questions,
            self.ppo,
            rollout,
            self.seed,
            heldout=self.heldout,
            heldout_questions=self.heldout.questions(dev),
            scorer=self.scorer,
        )
        if not trainer.accelerator.is_main_process:
            trainer.run(work, None)
            barrier()  # until the main process published the model
            return
        with cache.publish(done) as tmp:
            rows = trainer.run(work, tmp)
            atomic_write_text(tmp / "log.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
            weights = next(generator.model.parameters())
            info = {
                "iterations": self.ppo.iterations,
                "questions": len(questions),
                "wall_s": sum(r.get("wall_s", 0.0) for r in rows),
                "device": str(weights.device),
                "dtype": str(weights.dtype),
                "processes": trainer.accelerator.num_processes,
            }
            atomic_write_text(tmp / "ppo.json", json.dumps(info, indent=1) + "\n")
        shutil.rmtree(work, ignore_errors=True)
        barrier()

    def result_dir(self, start: str, questions: list[QAExample], env: Env, root: Path) -> Path:
        """Where the trained model is cached: ``<root>/r3rag/<key>``; ``root`` is ``cache_dir`` under the
        runner, else the run's ``checkpoints/ppo`` (shared with nothing). The key holds the retriever PPO
        searched with (``train_retriever``, else the run's: a transfer row trained with BM25 shares the BM25
        row's model) and the reward's code besides the trainer's."""
        content = [[q.id, q.question, list(q.answers)] for q in questions]
        config = {k: v for k, v in dict(self.run_config or {}).items() if k not in UNRELATED}
        config["policy"] = dict(config.get("policy") or {})
        # the stopping rule acts at evaluation only: one PPO model with or without it
        config["policy"].pop("stopper", None)
        searched = config["policy"].pop("train_retriever", None)
        if searched is not None:
            config["retriever"] = {k: v for k, v in dict(searched).items() if k != "_partial_"}
        settings = [self.ppo, self.k, self.max_turns, self.sampling.max_new_tokens, self.seed]
        reward_code = cache.code_digest("rag_lab.rewards.r3rag_judges")
        return cache.path(
            root,
            "r3rag",
            start,
            content,
            env.corpus.fingerprint,
            config,
            settings,
            reward_code,
            code="rag_lab.policies.r3rag.trainer",
        )
