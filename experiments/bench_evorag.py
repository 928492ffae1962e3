"""EVO-RAG training speed on 2 cores: the seconds of one cycle by phase (base rollouts, sibling branches,
the returns, the preference-model epoch, the DPO + LoRA epoch, dev EM), the cycle's counts, and peak
memory, at the embedded default's settings (``policy=evorag``: 24 questions, 2 states each, T_max 20) on
the shipped tiny LM after its cold start (cached under ``--cache-dir``; the first run trains it, ~6 min).

    python experiments/bench_evorag.py [--cache-dir DIR] [override ...]   # writes results/bench_evorag.md
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
from rag_lab.policies.evorag import branches, trainer

PHASES = [
    (branches, "base_rollouts", "base rollouts (the policy, sampled)"),
    (branches, "roll", "sibling branches (forced actions, then played out)"),
    (branches, "returns", "returns R(x) (seven rewards, one MiniLM call)"),
    (trainer, "pm_epoch", "preference model: accuracy, one epoch"),
    (trainer, "policy_epoch", "DPO + LoRA epoch (TRL), merge, save"),
    (trainer, "dev_em", "dev EM"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", default="~/.cache/rag_lab")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    cfg = compose(
        [
            "experiment=evorag_synth",
            "policy.stages=[1]",
            "policy.max_cycles=1",
            f"cache_dir={args.cache_dir}",
            *args.overrides,
        ]
    )
    data = instantiate(cfg.data)
    generator = build(cfg.generator, data=data)
    env = Env(data.corpus, build(cfg.retriever, corpus=data.corpus), generator)
    clock = {label: SimpleNamespace(seconds=0.0) for _, _, label in PHASES}
    for module, name, label in PHASES:  # each phase's seconds added to its clock
        setattr(module, name, timed(getattr(module, name), clock[label]))
    policy = build(cfg.policy, reward=build(cfg.reward), train_data=data)
    policy.fit(env, data.split("train"), [], Path(tempfile.mkdtemp()) / "warm")  # the cold start, then cached
    for c in clock.values():
        c.seconds = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        policy = build(cfg.policy, reward=build(cfg.reward), train_data=data)
        start = time.perf_counter()
        policy.fit(env, data.split("train"), [], Path(tmp) / "run")
        total = time.perf_counter() - start
        [cycle] = (Path(tmp) / "run" / "stages" / "evorag").glob("*/cycle.json")
        summary = json.loads(cycle.read_text())
    rows = [{"phase": label, "s": clock[label].seconds} for _, _, label in PHASES]
    rows[-1]["phase"] = "dev EM (greedy): the start's and the cycle's"
    rows += [{"phase": "other (loads, cold start lookup)", "s": total - sum(r["s"] for r in rows)}]
    rows += [{"phase": "total (one cycle and the start's dev EM)", "s": total}]
    counts = {k.removeprefix("branch/"): v for k, v in summary.items() if k.startswith("branch/")}
    counts["DPO steps"] = summary.get("dpo/steps")
    p = SimpleNamespace(**cfg.policy)
    publish(
        "bench_evorag",
        f"`experiment=evorag_synth` one Discovery cycle on the shipped tiny LM after its cold start: "
        f"{p.questions_per_cycle} questions, {p.states_per_episode} states each, T_max {p.max_turns}, BM25 "
        f"top {p.k}, DPO batch {p.batch_size} x {p.grad_accum}, dev EM on {p.dev_limit} questions\n\n"
        f"{pd.DataFrame(rows).round(1).to_markdown(index=False)}\n\n"
        f"counts: {', '.join(f'{k} {v}' for k, v in counts.items())}\n\n"
        f"peak RSS {peak_rss_mb():.0f} MB",
        lm=shipped_lm(),
    )


if __name__ == "__main__":
    main()
