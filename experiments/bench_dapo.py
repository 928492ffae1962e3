"""DAPO training speed on 2 cores: seconds per step and where they go (the engine's generate and search
calls, the rewards, TRL's update), and peak memory, for the embedded default's step (4 questions x 8
rollouts, up to 5 turns, BM25 top 3) on the shipped tiny LM.

    python experiments/bench_dapo.py      # writes experiments/results/bench_dapo.md
"""

import functools
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
from bench_rollout import Timed
from benchlib import peak_rss_mb, publish, shipped_lm
from hydra.utils import instantiate

from rag_lab.core.config import build, compose
from rag_lab.env import Env
from rag_lab.generators.hf import HFGenerator

STEPS = 6


def timed(fn, clock: SimpleNamespace):
    """``fn`` with its seconds added to ``clock`` (a reward: called by dynamic sampling and by TRL)."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            clock.seconds += time.perf_counter() - start

    return call


def main() -> None:
    cfg = compose(
        [
            "generator=tiny",
            "policy=dapo",
            "reward=dapo",
            "policy.cold_start=null",
            f"policy.steps={STEPS}",
            "policy.save_steps=1000",
        ]
    )
    data = instantiate(cfg.data)
    generator = build(cfg.generator, data=data)
    search = Timed(build(cfg.retriever, corpus=data.corpus), "search")
    generate, rewards = SimpleNamespace(seconds=0.0), SimpleNamespace(seconds=0.0)
    # the class's: DAPO rolls out with its own copy of the model, a generator of its own
    HFGenerator.generate = timed(HFGenerator.generate, generate)
    env = Env(data.corpus, search, generator)
    with tempfile.TemporaryDirectory() as tmp:
        policy = build(cfg.policy, reward=build(cfg.reward), train_data=data)
        policy.cache_dir = tmp
        policy.reward = {name: timed(fn, rewards) for name, fn in policy.reward.items()}
        start = time.perf_counter()
        policy.fit(env, data.split("train"), [], Path(tmp) / "run")
        total = time.perf_counter() - start
    stages = len(cfg.policy.stages)
    steps = STEPS * stages
    measured = generate.seconds + search.seconds + rewards.seconds
    rows = [
        {"part": "generate (engine, batched per turn)", "s/step": generate.seconds / steps},
        {"part": "search (BM25, batched per turn)", "s/step": search.seconds / steps},
        {"part": "rewards (dynamic sampling's check, then TRL's)", "s/step": rewards.seconds / steps},
        {"part": "TRL: log-probs, loss, backward, step", "s/step": (total - measured) / steps},
        {"part": "total", "s/step": total / steps},
    ]
    table = pd.DataFrame(rows).round(2).to_markdown(index=False)
    publish(
        "bench_dapo",
        f"`policy=dapo` on the shipped tiny LM (no cold start), {stages} stages x {STEPS} steps, each step "
        f"{cfg.policy.questions_per_step} questions x {cfg.policy.group_size} rollouts (up to "
        f"{cfg.policy.max_turns} turns, BM25 top {cfg.policy.k}), dynamic sampling on\n\n{table}\n\n"
        f"peak RSS {peak_rss_mb():.0f} MB",
        lm=shipped_lm(),
    )


if __name__ == "__main__":
    main()
