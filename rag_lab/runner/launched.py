"""One process of a run's training under ``launch`` (:mod:`rag_lab.runner.launch`): ``accelerate launch -m
rag_lab.runner.launched <run dir>/launch/job.json`` starts N of them. Each rebuilds the run from its resolved
config (``job.json``: the config the runner wrote to the run dir, and the run dir) as the runner does
(:mod:`rag_lab.runner.stages`) and calls the policy's ``fit``; the trainers split each global batch
between the processes and the main process publishes (:mod:`rag_lab.train.parallel`). The main process
fits into the run dir (``checkpoints/``: curves, a resumable trainer's checkpoints); every other process
into ``launch/rank<i>/`` (what it writes there beside the main process is a copy, and no two processes
write one file). Then every process evaluates its share of the questions (:func:`evaluate_share`), the main
process writing the run dir's ``records.jsonl``. The runner waits, then its own ``fit`` finds the published
results, and its evaluation finds the records complete. A job of ``part`` ``generator`` (``generator=tiny``
where no shipped checkpoint fits) builds only the run's generator: the tiny LM's recipe, data-parallel
(:mod:`rag_lab.train.tiny.model`), into the cache.
"""

import json
import logging
import os
import sys
from pathlib import Path


def main(job_file: str) -> None:
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    import rag_lab.policies  # noqa: F401  (registers the demonstration policies generator=tiny's recipe uses)
    from rag_lab.core.config import build
    from rag_lab.core.errors import one_line_errors
    from rag_lab.core.loading import loading_on_purpose
    from rag_lab.core.seeding import seed_everything
    from rag_lab.runner.launch import report_rank
    from rag_lab.runner.stages import components, fit
    from rag_lab.train.parallel import CHECKPOINTING_ENV, state

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with one_line_errors():
        job = json.loads(Path(job_file).read_text())
        os.environ[CHECKPOINTING_ENV] = "1" if job.get("gradient_checkpointing") else "0"
        cfg = OmegaConf.create(job["run_config"])
        seed_everything(cfg.seed)
        data = instantiate(cfg.data)
        train_data = instantiate(cfg.train_data) if cfg.get("train_data") else data
        if job.get("part") == "generator":  # the tiny LM's recipe (the runner builds it from the cache after)
            state(job.get("timeout_s"))
            loading_on_purpose()
            build(cfg.generator, data=data)
            return
        with report_rank():
            # the process group first (with the launch's timeout), then the models: each on this rank's own
            # device (devices.local_gpu)
            state(job.get("timeout_s"))
            # ZeRO-3's init and FSDP's RAM-efficient loading only where a trained model loads: every
            # frozen model (the run's generator, PPO's reference, a reload) whole and right in every process
            loading_on_purpose()
            env, policy = components(cfg, job["run_config"], data, train_data)
            rank, run_dir = int(os.environ.get("RANK") or 0), Path(job["run_dir"])
            work = run_dir if rank == 0 else run_dir / "launch" / f"rank{rank}"
            fit(cfg, policy, env, data, train_data, work)
            del env, policy  # the training's models (shards, optimiser) go before the evaluation's load
            if job.get("evaluate"):
                evaluate_share(cfg, job, data, train_data, work)


def evaluate_share(cfg, job: dict, data, train_data, work: Path) -> None:
    """The run's evaluation, each process playing its share of the batches (:func:`rag_lab.eval.evaluate.
    evaluate` with :mod:`rag_lab.train.parallel` as its ranks); the main process judges and writes
    ``records.jsonl`` into the run dir as the runner would, and the runner then finds it complete. Each
    process acts as the runner does: the run's components built afresh, the policy's ``fit`` finding what the
    training published, every model loaded whole (one process's batches are not another's, so no model may
    need every process in step, as a ZeRO-3 partitioned one or one FSDP's efficient loading left empty
    outside rank 0 would). Records byte-identical to one process's: one batch's episodes depend on that
    batch alone, what a resumed evaluation already relies on."""
    import gc

    import torch

    from rag_lab.runner.stages import components, evaluate_run, fit, judge_of
    from rag_lab.train import parallel

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    whole_loading()
    env, policy = components(cfg, job["run_config"], data, train_data)
    fit(cfg, policy, env, data, train_data, work)  # finds the published results, trains nothing
    run_dir = Path(job["run_dir"])
    judge = judge_of(cfg, env.generator, run_dir) if parallel.is_main() else None
    evaluate_run(cfg, policy, env, data, run_dir, judge, cfg.eval.resume, ranks=parallel)


def whole_loading() -> None:
    """Models loaded from now on load whole: not partitioned by ZeRO-3's init (transformers' DeepSpeed
    config unset), not left empty outside rank 0 by FSDP's efficient loading."""
    os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "false"
    from transformers.integrations import deepspeed

    deepspeed.unset_hf_deepspeed_config()


if __name__ == "__main__":
    main(sys.argv[1])
