"""The stages of a run that the runner (:mod:`rag_lab.run`) and every process of a launched training job
(:mod:`rag_lab.runner.launched`) share: build the run's environment and policy, fit the policy, evaluate it.
Both call these, so a launched process rebuilds exactly what the runner would.
"""

from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig

from rag_lab.core.config import build
from rag_lab.data.evidence import Evidence, index_corpus
from rag_lab.env import Env
from rag_lab.eval.evaluate import evaluate
from rag_lab.eval.groups import repeat


def components(cfg: DictConfig, config: dict, data, train_data) -> tuple[Env, object]:
    """The run's environment (corpus, retriever, generator) and policy, as the runner and every process of
    a launched training job build them."""
    corpus = index_corpus(data, Evidence(**cfg.corpus))
    retriever = build(cfg.retriever, corpus=corpus)
    env = Env(corpus, retriever, build(cfg.generator, data=data))
    return env, policy_of(cfg, config, data, train_data)


def policy_of(cfg: DictConfig, config: dict, data, train_data):
    """The run's policy, untrained (its ``fit`` trains it, or finds what an earlier fit published)."""
    return build(cfg.policy, data=data, train_data=train_data, reward=build(cfg.reward), run_config=config)


def fit(cfg: DictConfig, policy, env: Env, data, train_data, run_dir: Path, logger=None) -> None:
    """The policy's training on the run's training split, into ``<run dir>/checkpoints``. Under ``launch`` the
    runner calls it after its launched processes trained, and the policy's ``fit`` finds their published
    results; the launched processes call it themselves (:mod:`rag_lab.runner.launched`)."""
    train = train_data.split(cfg.train_split)
    policy.fit(env, train, data.split("dev"), run_dir / "checkpoints", logger=logger)


def eval_examples(cfg: DictConfig, data) -> list:
    """The questions evaluated: ``eval.split``'s first ``eval.limit``, each ``eval.samples`` times."""
    return repeat(data.split(cfg.eval.split)[: cfg.eval.limit], cfg.eval.samples)


def judge_of(cfg: DictConfig, generator, run_dir: Path):
    """The run's judge (``judge.generator: null`` shares the run's ``generator``), or None."""
    if not cfg.judge:
        return None
    shared = {"generator": generator} if cfg.judge.generator is None else {}
    return instantiate(cfg.judge, cache_path=str(run_dir / "judge_cache.jsonl"), **shared)


def evaluate_run(cfg: DictConfig, policy, env: Env, data, run_dir: Path, judge, resume: bool, ranks=None):
    """The run's evaluation (``eval.*``) into ``<run dir>/records.jsonl``: by the runner, or under ``launch``
    by the launched processes, each its share of the batches (``ranks``: :mod:`rag_lab.train.parallel`)."""
    return evaluate(
        policy,
        env,
        eval_examples(cfg, data),
        run_dir / "records.jsonl",
        data.scorer,
        judge=judge,
        batch_size=cfg.eval.batch_size,
        resume=resume,
        recall_at=list(cfg.eval.recall_at),
        ranks=ranks,
    )
