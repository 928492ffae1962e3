"""APEX-Searcher (papers/apex-searcher.txt; METHODS.md §5) as a policy: ``policy=apex``.

Inference is the plan → execute → synthesise loop of :class:`rag_lab.policies.apex_pipeline.APEXPipeline`
(its algorithms 1 and 2: ``#n`` resolved from the knowledge base, up to ``hops`` rounds of the executor
step with de-duplicated retrieval, a fallback to the question itself when the plan does not parse, a
final answer with a confidence). Training follows its Refining Credit Assignment, each part a switch
(its table 2's ablation):

- ``plan_rl``: the planner trained by GRPO with SEPR against the gold decompositions
  (:mod:`rag_lab.policies.apex.planner`), from the generator's model;
- ``executor_sft``: the executor fine-tuned on the world teacher's filtered ``apex_exec`` / ``apex_final``
  traces (the shared cold start, :func:`rag_lab.train.cold_start.cold_start`), from the same model.

Planner and executor are two models, as in the paper (its planner and executor are trained apart): the
planner generates the plans, the run's generator (the executor) everything else. Both trainings are
cached by content and resume after a kill.
"""

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from rag_lab.config import PositiveInt
from rag_lab.data.base import QAExample
from rag_lab.env import Env
from rag_lab.errors import RagLabError
from rag_lab.generators.hf import HFGenerator
from rag_lab.policies.apex.planner import PlannerRL, train_planner
from rag_lab.policies.apex_pipeline import APEXPipeline
from rag_lab.train.cold_start import ColdStartConfig, cold_start, content_hash, load

log = logging.getLogger(__name__)


class APEX(APEXPipeline):
    trains = True

    def __init__(
        self,
        # the three switches of the paper's table 2
        plan: bool = True,
        plan_rl: bool = True,
        executor_sft: bool = True,
        # the set-equivalence plan reward (reward=sepr)
        sepr: Any = None,
        planner: PlannerRL | None = None,
        # the executor's SFT: the cold start on the executor's protocols
        executor: ColdStartConfig | None = None,
        # the world the executor's teacher demonstrates on (the run's data)
        data: Any = None,
        cache_dir: str = "~/.cache/rag_lab",
        hops: PositiveInt = 3,
        k: PositiveInt = 3,
        max_new_tokens: PositiveInt = 64,
        temperature: float = 0.0,
    ):
        super().__init__(plan, hops, k, max_new_tokens, temperature)
        self.plan_rl, self.executor_sft, self.sepr = plan_rl, executor_sft, sepr
        self.planner_config, self.executor_config = planner or PlannerRL(), executor
        self.data, self.cache_dir = data, cache_dir
        self.planner: HFGenerator | None = None

    def fit(self, env: Env, train: list[QAExample], dev: list[QAExample], out_dir: Path, logger=None) -> None:
        base = env.generator
        if not hasattr(base, "model") or not hasattr(base, "tokenizer"):
            raise RagLabError("policy=apex trains a transformers model: set generator=tiny, smollm2 or hf")
        model_dir, tokenizer_dir = Path(base.model.name_or_path), Path(base.tokenizer.name_or_path)
        if self.plan and self.plan_rl:
            if self.sepr is None:
                raise RagLabError("policy.sepr: plan RL needs the plan reward (set reward=sepr)")
            self.planner = self._planner(base, model_dir, tokenizer_dir, train)
        if self.executor_sft:
            if self.data is None or self.executor_config is None:
                raise RagLabError("policy.executor / policy.data: the executor's SFT needs both")
            path = cold_start(
                model_dir,
                self.data,
                self.executor_config,
                self.cache_dir,
                tokenizer=tokenizer_dir,
                chat=base.chat,
            )
            env.generator = load(path, batch_size=base.batch_size, seed=base.seed)

    def _planner(self, base: HFGenerator, model_dir: Path, tokenizer_dir: Path, train: list[QAExample]):
        from rag_lab.policies.dapo.policy import describe

        questions = [q for q in train if q.decomposition]
        ids = [[q.id, q.question, [[s.question, s.answer] for s in q.decomposition]] for q in questions]
        source = (Path(__file__).parent / "planner.py").read_text()
        blob = json.dumps(
            [
                content_hash(model_dir, tokenizer_dir),
                repr(self.planner_config),
                describe(self.sepr),
                ids,
                hashlib.sha256(source.encode()).hexdigest(),
            ],
            default=str,
        )
        out = (
            Path(self.cache_dir).expanduser()
            / "apex_planner"
            / hashlib.sha256(blob.encode()).hexdigest()[:16]
        )
        if (out / "train.json").exists():
            log.info("APEX planner: reusing %s", out)
        else:
            fresh = HFGenerator(
                str(model_dir),
                str(tokenizer_dir),
                chat=base.chat,
                batch_size=base.batch_size,
                seed=base.seed,
                dtype="float32",
            )
            train_planner(fresh, questions, self.sepr, self.planner_config, out, chat=base.chat)
        return HFGenerator(
            str(out),
            str(tokenizer_dir),
            chat=base.chat,
            batch_size=base.batch_size,
            seed=base.seed,
            dtype="float32",
        )

    def plan_env(self, env: Env) -> Env:
        """The planner's environment: the trained planner when there is one, else the run's generator."""
        return env if self.planner is None else Env(env.corpus, env.retriever, self.planner)
