"""The runner: ``python -m rag_lab.run [group=option ...] [+experiment=name]``.

compose (Hydra) → validate against the components' schemas → seed → instantiate data,
retriever, generator, policy, logger → ``policy.fit`` when the policy trains → evaluate →
write records, metrics and tables into the run directory.
"""

import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig

from rag_lab import rundir
from rag_lab.config import check_yaml_files, validate
from rag_lab.env import Env
from rag_lab.errors import one_line_errors
from rag_lab.eval.evaluate import aggregate, evaluate
from rag_lab.eval.table import metrics_table
from rag_lab.seeding import seed_everything

log = logging.getLogger("rag_lab.run")


def run(cfg: DictConfig, run_dir: Path) -> dict:
    validate(cfg)
    config = rundir.prepare(run_dir, cfg)
    seed_everything(cfg.seed)

    data = instantiate(cfg.data)
    retriever = instantiate(cfg.retriever, corpus=data.corpus) if cfg.retriever else None
    generator = instantiate(cfg.generator) if cfg.generator else None
    env = Env(data.corpus, retriever, generator)
    policy = instantiate(cfg.policy)
    logger = instantiate(cfg.logger, _partial_=True)(run_dir=str(run_dir), run_config=config)

    if policy.trains:
        policy.fit(env, data.split(cfg.train_split), data.split("dev"), run_dir / "checkpoints")

    judge = None
    if cfg.judge:  # judge.generator: null shares the run's generator
        shared = {"generator": generator} if cfg.judge.generator is None else {}
        judge = instantiate(cfg.judge, cache_path=str(run_dir / "judge_cache.jsonl"), **shared)
    examples = data.split(cfg.eval.split)[: cfg.eval.limit]
    records = evaluate(
        policy, env, examples, run_dir / "records.jsonl", data.scorer, judge=judge,
        batch_size=cfg.eval.batch_size, resume=cfg.eval.resume, recall_at=list(cfg.eval.recall_at),
    )  # fmt: skip
    metrics = aggregate(records)
    markdown = rundir.write_results(run_dir, metrics)
    log.info(
        "%s on %s/%s (%d questions)\n%s",
        type(policy).__name__,
        data.name,
        cfg.eval.split,
        len(records),
        markdown,
    )

    logger.log_metrics({k: v for k, v in metrics["all"].items() if v is not None})
    logger.log_table("table", metrics_table(metrics))
    logger.log_records(records)
    logger.finish()
    return metrics


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    with one_line_errors():
        run(cfg, Path(HydraConfig.get().runtime.output_dir))


if __name__ == "__main__":
    with one_line_errors():
        check_yaml_files()
    main()
