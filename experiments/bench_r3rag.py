"""R3-RAG's PPO speed on 2 cores: the seconds of one iteration by phase (rollouts, rewards, per-step samples,
the no-grad pass for old log-probs / values / the initial model's log-probs, GAE, the update), the batch's
size, and peak memory, at the embedded default's settings (``policy=r3rag``: 16 questions x 4 temperatures,
2 PPO epochs x 4 minibatches) on the shipped tiny LM after its cold start (cached under ``--cache-dir``; the
first run trains it, ~6 min).

    python experiments/bench_r3rag.py [--cache-dir DIR] [override ...]   # writes results/bench_r3rag.md
"""

import argparse
import json
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
from bench_dapo import timed
from benchlib import peak_rss_mb, publish, shipped_lm
from hydra.utils import instantiate

from rag_lab.core.config import build, compose
from rag_lab.env import Env
from rag_lab.policies.r3rag import trainer

PHASES = [
    ("rollouts", "rollouts (4 temperatures, the engine)"),
    ("step_samples", "per-step samples (prompts re-fitted, tokenized)"),
    ("score", "no-grad pass: old log-probs, values, the initial model's log-probs"),
    ("advantages", "GAE and the normalisations"),
    ("update", "PPO update (epochs x minibatches, backward)"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", default="~/.cache/rag_lab")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    cfg = compose(
        ["experiment=r3rag_synth", "policy.ppo.iterations=2", f"cache_dir={args.cache_dir}", *args.overrides]
    )
    data = instantiate(cfg.data)
    generator = build(cfg.generator, data=data)
    env = Env(data.corpus, build(cfg.retriever, corpus=data.corpus), generator)
    clock = {name: SimpleNamespace(seconds=0.0) for name, _ in PHASES + [("reward", "")]}
    for name, _ in PHASES:  # each phase's seconds added to its clock
        setattr(trainer, name, timed(getattr(trainer, name), clock[name]))
    reward = build(cfg.reward)
    reward.score = timed(reward.score, clock["reward"])
    policy = build(cfg.policy, reward=reward, train_data=data)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        policy.fit(env, data.split("train"), [], Path(tmp) / "run")  # the cold start is cached
        total = time.perf_counter() - start
        rows = [json.loads(line) for line in (Path(tmp) / "run" / "train_log.jsonl").open()]
    n = len(rows)
    table = [{"phase": label, "s / iteration": clock[name].seconds / n} for name, label in PHASES]
    table.insert(
        1,
        {
            "phase": "step rewards (support overlap, exact match)",
            "s / iteration": clock["reward"].seconds / n,
        },
    )
    table.append(
        {"phase": "iteration (the trainer's own clock)", "s / iteration": sum(r["wall_s"] for r in rows) / n}
    )
    p = SimpleNamespace(**cfg.policy.ppo)
    sizes = {k: sum(r[k] for r in rows) / n for k in ("samples", "tokens", "rollout/steps")}
    publish(
        "bench_r3rag",
        f"`experiment=r3rag_synth` PPO on the shipped tiny LM after its cold start: {n} iterations of "
        f"{p.batch_size} questions x {len(p.temperatures)} temperatures, {p.ppo_epochs} epochs x "
        f"{p.minibatches} minibatches, micro-batch {p.micro_batch}, BM25 top {cfg.policy.k}, at most "
        f"{cfg.policy.max_turns} steps\n\n"
        f"{pd.DataFrame(table).round(2).to_markdown(index=False)}\n\n"
        f"per iteration: {sizes['samples']:.0f} step samples, {sizes['tokens']:.0f} policy tokens, "
        f"{sizes['rollout/steps']:.2f} steps per episode; fit in all (loads, cold start lookup, {n} "
        f"iterations, save): {total:.0f} s\n\npeak RSS {peak_rss_mb():.0f} MB",
        lm=shipped_lm(),
    )


if __name__ == "__main__":
    main()
