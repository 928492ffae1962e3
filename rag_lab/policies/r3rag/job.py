"""R3-RAG's PPO as its own data-parallel job: the run's ``launch`` (``launch=cpu2``, ``ddp``, ``zero3``,
``fsdp``: :mod:`rag_lab.launch`) runs this module in N processes under ``accelerate launch``, and the
runner waits for it.

The runner stays one process (it evaluates and writes the run); ``fit`` writes ``job.json`` in the PPO work
dir (the run's resolved config, the starting model, where to publish) and launches
``<launch> -m rag_lab.policies.r3rag.job <job.json>``. Each process rebuilds the data, the retriever, the
reward and the policy from the config, loads the starting model, and trains its share of every batch
(:mod:`.ppo`); the main process publishes the result to the cache, where the runner then finds it.
"""

import json
import logging
import sys
from pathlib import Path


def main(job_file: str) -> None:
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from rag_lab.config import build
    from rag_lab.env import Env
    from rag_lab.train.cold_start import load
    from rag_lab.train.resume import load_model

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    job = json.loads(Path(job_file).read_text())
    cfg = OmegaConf.create(job["run_config"])
    data = instantiate(cfg.data)
    train_data = instantiate(cfg.train_data) if cfg.get("train_data") else data
    base = build(cfg.generator, data=data)
    policy = build(cfg.policy, train_data=train_data, reward=build(cfg.reward), run_config=job["run_config"])
    if job["cold_started"]:
        generator = load(job["start"], batch_size=base.batch_size, seed=base.seed)
    else:
        generator = base.with_model(load_model(job["start"], like=base.model))
    env = policy.training_env(Env(data.corpus, build(cfg.retriever, corpus=data.corpus), base))
    questions = train_data.split(cfg.train_split)[: policy.train_limit]
    policy.train(generator, env, questions, Path(job["done"]), data.split("dev"))


if __name__ == "__main__":
    main(sys.argv[1])
