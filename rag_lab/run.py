"""The runner: ``python -m rag_lab.run [group=option ...] [experiment=name]``.

compose (Hydra) → validate against the components' schemas → read the data → check the run dir →
seed → build retriever, generator, reward, policy, logger → ``policy.fit`` when the policy trains →
evaluate → write records, metrics and tables into the run directory. ``--help`` lists the
config groups and options (``hydra.help`` in ``conf/config.yaml``).

Each thing is built once and handed down by name (:func:`rag_lab.core.config.build`): the corpus to the
retriever, the dataset to the generator (the tiny LM, the teacher), the training dataset, the reward group
and the resolved config to the policy. What the policy trains stays on the policy; evaluation asks it.
"""

import functools
import json
import logging
import os
import sys
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

import rag_lab.policies  # noqa: F401  (registers the demonstration policies generator=tiny's recipe rolls out)
from rag_lab import CONF_DIR
from rag_lab.core.cli import (
    check_below_interpolations,
    check_experiment_overrides,
    check_row_overrides,
    check_yaml_files,
    user_config_dirs,
)
from rag_lab.core.config import ConfigError, locate, validate
from rag_lab.core.errors import one_line_errors
from rag_lab.core.seeding import seed_everything
from rag_lab.eval.evaluate import aggregate
from rag_lab.eval.groups import group_stats
from rag_lab.eval.provenance import ROW_HASH_VERSION, check_judge, row_hash
from rag_lab.eval.table import metrics_table
from rag_lab.runner import rundir
from rag_lab.runner.launch import launch_of, single_process_trainers
from rag_lab.runner.stages import components, eval_examples, evaluate_run, fit, judge_of
from rag_lab.runner.sweeps import code_hash, config_hash, drop_inapplicable, register, reuse, soften

log = logging.getLogger("rag_lab.run")
# one process of a launched run (`accelerate launch -m <it>`)
LAUNCHED = "rag_lab.runner.launched"


def data_counts(data) -> dict[str, int]:
    """What loading dropped under ``data.skip_malformed=true``: malformed lines and repeated ids."""
    counts = {
        "skipped_lines": sum(getattr(data, "skipped", {}).values()),
        "duplicate_ids": sum(getattr(data, "duplicates", {}).values()),
    }
    return {k: v for k, v in counts.items() if v}


def check_launch(cfg: DictConfig) -> None:
    """Before the run dir is touched: a trained model too large to roll out with transformers under the
    launch, a GPU's memory over the launch's plan (:mod:`rag_lab.train.memory`), then what this machine lacks
    for the run's ``launch`` (GPUs, DeepSpeed), where the policy trains."""
    from rag_lab.train.lockstep import too_large_to_step

    trains = getattr(locate(cfg.policy._target_), "trains", False)
    if not cfg.launch or not (trains or is_tiny(cfg)):
        return
    for key, why in too_large_to_step(cfg, model_dir(cfg)) if trains else []:  # a config's, not the machine's
        raise ConfigError(f"config 'launch.{key}': {why}")
    if trains and not is_tiny(cfg):  # each GPU's memory where the launch names its GPU (launch=fsdp)
        from rag_lab.train.memory.planner import check

        check(cfg)
    launch = launch_of({"launch": OmegaConf.to_container(cfg.launch, resolve=True)})
    for key, why in [*launch.check_environment(), *(single_process_trainers(cfg) if trains else [])]:
        raise ConfigError(f"config 'launch.{key}': {why}")
    for key, why in launch.check_model(model_dir(cfg)):
        raise ConfigError(f"config 'launch.{key}': {why}")


def check_lora(cfg: DictConfig) -> None:
    """Before the run dir is touched: each LoRA target module of a training policy (its own, its cold
    start's, its executor's) is a module of the run's model, where that model is known (:func:`model_dir`)."""
    from rag_lab.train.lora import lora_targets

    if getattr(locate(cfg.policy._target_), "trains", False):
        policy = OmegaConf.to_container(cfg.policy, resolve=True)
        for key, why in lora_targets({"policy": policy}, model_dir(cfg)):
            raise ConfigError(f"config '{key}': {why}")


def model_dir(cfg: DictConfig) -> str | None:
    """The folder of the run's generator model where it is known before the run builds anything: a local
    folder or a hub name in the cache (``generator.model``), or the shipped tiny LM (``generator=tiny``
    with no checkpoint named); None otherwise (a hub model not downloaded, a tiny LM still to train)."""
    from rag_lab.core.errors import RagLabError
    from rag_lab.retrievers.dense import resolve_model

    if not cfg.generator:
        return None
    if is_tiny(cfg):
        from rag_lab.train.tiny.generator import checkpoint_dir

        folder = checkpoint_dir(cfg.generator.get("checkpoint"))
        return str(folder) if (folder / "config.json").exists() else None
    name = cfg.generator.get("model")
    if not name:
        return None
    try:
        return resolve_model(str(name))
    except RagLabError:
        return None


def launched_job(config: dict, run_dir: Path, part: str) -> dict:
    """What each launched process does (:mod:`rag_lab.runner.launched`): build the run's generator (``part``
    ``generator``: the tiny LM's recipe) or fit its policy and evaluate it (``fit``)."""
    return {"run_config": config, "run_dir": str(run_dir), "part": part, "evaluate": part == "fit"}


def is_tiny(cfg: DictConfig) -> bool:
    return bool(cfg.generator) and str(cfg.generator.get("_target_", "")).endswith("tiny.generator.tiny_lm")


def generator_trains(cfg: DictConfig, data) -> bool:
    """Whether building the run's generator trains it: ``generator=tiny`` where no shipped checkpoint fits."""
    if not is_tiny(cfg):
        return False
    from rag_lab.train.tiny.generator import fitting_checkpoint, recipe_part, recipe_settings

    node = OmegaConf.to_container(cfg.generator, resolve=True)
    world = getattr(data, "world", data)
    return fitting_checkpoint(world, node.get("checkpoint"), recipe_settings(recipe_part(node))) is None


def train_launched(cfg: DictConfig, config: dict, run_dir: Path) -> bool:
    """Under ``launch``, a training policy's N processes (:mod:`rag_lab.runner.launched`), run before the
    runner builds any model of its own: while they train, the runner holds no copy of the model (on a GPU, a
    copy beside every rank's); then they evaluate, each its share of the questions, into the run dir's
    ``records.jsonl``. On a Slurm job of several nodes: this node's rank and the first node. Whether they
    ran (the records are then complete)."""
    launch = launch_of(config)
    if launch is None or not getattr(locate(cfg.policy._target_), "trains", False):
        return False
    launch.on_cluster().run_job(LAUNCHED, launched_job(config, run_dir, "fit"), run_dir / "launch")
    return True


def follows(cfg: DictConfig, run_dir: Path, data) -> bool:
    """On a node other than 0 of a Slurm job on several nodes: this node's processes of node 0's launched
    training jobs (the tiny LM's recipe where it trains, then the policy's fit), and nothing written but
    ``<run dir>/launch/**/node<i>/`` (node 0 evaluates and writes)."""
    if not cfg.launch:
        return False
    launch = launch_of({"launch": OmegaConf.to_container(cfg.launch, resolve=True)}).on_cluster()
    if launch.node == 0:
        return False
    log.info("node %d of %s: training this node's share of node 0's jobs", launch.node, run_dir)
    if generator_trains(cfg, data):
        launch.follow(LAUNCHED, run_dir / "launch" / "generator")
    if getattr(locate(cfg.policy._target_), "trains", False):
        launch.follow(LAUNCHED, run_dir / "launch")
    return True


def provenance(cfg: DictConfig, run_dir: Path, digest: str, row: str, generator, n: int) -> dict:
    """``<run dir>/provenance.json`` (:func:`rag_lab.runner.rundir.write_provenance`): the commit, the code's
    hash, the config's (and the row's: the config less the seed), the LM's fingerprint, the split, the seed
    and the number of questions, which the claims table records on every line and checks
    (rag_lab/claims.py)."""
    commit, dirty = rundir.git_commit(Path(__file__).resolve().parents[1])
    entry = {
        "commit": commit,
        "dirty": dirty,
        "code": code_hash(),
        "config": digest,
        "row_config": row,
        "row_hash_version": ROW_HASH_VERSION,
        "lm": rundir.lm_fingerprint(generator),
        "split": cfg.eval.split,
        "seed": cfg.seed,
        "n": n,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    return rundir.write_provenance(run_dir, entry)


def reused(cfg: DictConfig, run_dir: Path, digest: str) -> dict | None:
    """The metrics of an earlier run of config ``digest``, its results copied into ``run_dir``
    (:func:`rag_lab.runner.sweeps.reuse`; ``eval.reuse``), or None where there is none to reuse."""
    if not cfg.eval.reuse or rundir.holds_results(run_dir):
        return None
    source = reuse(run_dir, digest, cfg.cache_dir)
    if source is None:
        return None
    log.info("config %s ran before in %s: its results copied here (eval.reuse=false runs it)", digest, source)
    return json.loads((run_dir / "metrics.json").read_text())


def run(cfg: DictConfig, run_dir: Path, hydra_files: dict | None = None) -> dict:
    validate(cfg)
    check_judge(cfg)
    check_launch(cfg)
    check_lora(cfg)
    row = row_hash(cfg)  # of the config as composed: building the components resolves nodes of it in place
    data = instantiate(cfg.data)  # bad data fails here, before the run dir is touched
    if follows(cfg, run_dir, data):
        return {}
    train_data = instantiate(cfg.train_data) if cfg.train_data else data
    examples = eval_examples(cfg, data)
    config = rundir.prepare(run_dir, cfg, hydra_files)
    digest = config_hash(config)
    log.info("run %s (config %s)", run_dir, digest)
    earlier = reused(cfg, run_dir, digest)
    if earlier is not None:
        return earlier
    seed_everything(cfg.seed)
    if launch_of(config) is not None and generator_trains(cfg, data):
        # generator=tiny with no checkpoint that fits: its recipe trains in the launched processes first
        job = launched_job(config, run_dir, "generator")
        launch_of(config).on_cluster().run_job(LAUNCHED, job, run_dir / "launch" / "generator")

    launched = train_launched(cfg, config, run_dir)
    env, policy = components(cfg, config, data, train_data)
    generator = env.generator
    provenance(cfg, run_dir, digest, row, generator, len(examples))
    logger = instantiate(cfg.logger, _partial_=True)(run_dir=str(run_dir), run_config=config)

    if policy.trains:
        fit(cfg, policy, env, data, train_data, run_dir, logger)

    # under launch the launched processes evaluated (eval.resume applied there): this evaluation reads the
    # records they wrote
    judge = judge_of(cfg, generator, run_dir)
    records = evaluate_run(cfg, policy, env, data, run_dir, judge, cfg.eval.resume or launched)
    metrics = aggregate(records)
    if cfg.eval.samples > 1:
        metrics["all"] |= group_stats(records)
    dropped = data_counts(data)
    metrics["all"] |= dropped
    markdown = rundir.write_results(run_dir, metrics)
    log.info(
        "%s on %s/%s (%d questions)\n%s",
        type(policy).__name__,
        data.name,
        cfg.eval.split,
        len(records),
        markdown,
    )
    if metrics["all"].get("prompt_cut_rate"):
        log.warning(
            "%.1f%% of the questions had a prompt longer than the generator's model reads: their passages "
            "were cut to fit, the question kept, or where even that did not fit, nothing was generated (a "
            "scored failure) (records.jsonl: prompt_cuts; rag_lab/env/fit.py)",
            100 * metrics["all"]["prompt_cut_rate"],
        )
    if dropped:
        log.warning("data.skip_malformed dropped %s", ", ".join(f"{v} {k}" for k, v in dropped.items()))

    logger.log_metrics({k: v for k, v in metrics["all"].items() if v is not None})
    logger.log_table("table", metrics_table(metrics))
    logger.log_records(records)
    for plot in sorted(run_dir.glob("checkpoints/**/*.png")):  # training curves
        logger.log_image(str(plot.relative_to(run_dir).with_suffix("")), plot)
    logger.finish()
    register(run_dir, digest, cfg.cache_dir)
    return metrics


def compose_job(hc, overrides: list[str]) -> DictConfig:
    """This job's config composed again with other overrides (inside ``main``: Hydra is set up)."""
    searchpath = [o for o in hc.overrides.hydra if o.lstrip("+").startswith("hydra.searchpath=")]
    return hydra.compose("config", overrides=[*overrides, *searchpath])


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    hc = HydraConfig.get()
    # What Hydra writes into .hydra/ by default; rundir.prepare writes it once the run dir checks out.
    hydra_files = {"config": cfg, "hydra": OmegaConf.create({"hydra": hc}), "overrides": hc.overrides.task}
    with one_line_errors():
        check_row_overrides([o.removeprefix("++") for o in hc.overrides.task])
        check_below_interpolations(hc.overrides.task, functools.partial(compose_job, hc))
        for override in drop_inapplicable(cfg, hc.overrides.task):
            log.info("%s: not a setting of this job's component, left out", override)
        run(cfg, Path(hc.runtime.output_dir), hydra_files)


if __name__ == "__main__":
    # Hydra then re-raises instead of printing a traceback; one_line_errors renders what a user can fix.
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    with one_line_errors():
        check_yaml_files([CONF_DIR, *user_config_dirs(sys.argv[1:])])
        check_experiment_overrides(sys.argv[1:])
        sys.argv[1:] = soften(sys.argv[1:])
        main()
