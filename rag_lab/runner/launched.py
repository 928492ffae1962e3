"""One process of a run's training under ``launch`` (:mod:`rag_lab.runner.launch`): ``accelerate launch -m
rag_lab.runner.launched <run dir>/launch/job.json`` starts N of them. Each rebuilds the run from its resolved
config (``job.json``: the config the runner wrote to the run dir, and the run dir) as the runner does
(:func:`rag_lab.run.components`) and calls the policy's ``fit``; the trainers split each global batch
between the processes and the main process publishes (:mod:`rag_lab.train.parallel`). The main process
fits into the run dir (``checkpoints/``: curves, a resumable trainer's checkpoints); every other process
into ``launch/rank<i>/`` (what it writes there beside the main process is a copy, and no two processes
write one file). The runner waits, then its own ``fit`` finds the published results, and it evaluates in
one process. A job of ``part`` ``generator`` (``generator=tiny`` where no shipped checkpoint fits) builds only
the run's generator: the tiny LM's recipe, data-parallel (:mod:`rag_lab.train.tiny.model`), into the cache.
"""

import json
import logging
import os
import sys
from pathlib import Path


def main(job_file: str) -> None:
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from rag_lab.core.config import build
    from rag_lab.core.errors import one_line_errors
    from rag_lab.core.loading import loading_on_purpose
    from rag_lab.core.seeding import seed_everything
    from rag_lab.run import components, fit
    from rag_lab.runner.launch import report_rank
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


if __name__ == "__main__":
    main(sys.argv[1])
