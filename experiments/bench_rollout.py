"""Rollout engine speed: episodes/s at batch 64 vs one question at a time (the way FlashRAG's
pipelines run), same tiny LM, same BM25, same questions, same protocol, in the same run; and
where the time goes (generate / retrieve / the rest: rendering, parsing, bookkeeping).

    python experiments/bench_rollout.py      # writes experiments/results/bench_rollout.md

Uses the embedded default LM (generator=tiny; trained on first use, then cached).
"""

import time

import pandas as pd
from benchlib import peak_rss_mb, publish
from hydra.utils import instantiate

from rag_lab.config import compose
from rag_lab.env import Env
from rag_lab.env.engine import run_agent
from rag_lab.env.protocols import PROTOCOLS
from rag_lab.generators.base import Sampling

N_QUESTIONS, BATCH, PROTOCOL, MAX_TURNS, K = 128, 64, "r3rag", 5, 3


class Timed:
    """Wraps a generator or a retriever and adds up the seconds spent in it."""

    def __init__(self, inner, method: str):
        self.inner, self.method, self.seconds = inner, method, 0.0
        self.chat = getattr(inner, "chat", False)

    def __getattr__(self, name):
        if name != self.method:
            return getattr(self.inner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return getattr(self.inner, name)(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        return timed


def measure(env_parts, examples, batch: int) -> dict:
    corpus, retriever, generator = env_parts
    gen, ret = Timed(generator, "generate"), Timed(retriever, "search")
    env = Env(corpus, ret, gen)
    start = time.perf_counter()
    episodes = []
    for i in range(0, len(examples), batch):
        chunk = examples[i : i + batch]
        episodes += run_agent(PROTOCOLS[PROTOCOL](), chunk, env, Sampling(max_new_tokens=48), K, MAX_TURNS)
    total = time.perf_counter() - start
    right = sum(ep.prediction in ex.answers for ep, ex in zip(episodes, examples, strict=True))
    return {
        "loop": f"batch {batch}" if batch > 1 else "one question at a time",
        "episodes/s": len(examples) / total,
        "seconds": total,
        "generate s": gen.seconds,
        "retrieve s": ret.seconds,
        "rest s": total - gen.seconds - ret.seconds,
        "turns": sum(len(ep.steps) for ep in episodes),
        "EM": 100 * right / len(examples),
    }


def main() -> None:
    cfg = compose(["generator=tiny"])
    data = instantiate(cfg.data)
    retriever = instantiate(cfg.retriever, corpus=data.corpus)
    generator = instantiate(cfg.generator, data=data)
    examples = data.split("dev")[:N_QUESTIONS]
    parts = (data.corpus, retriever, generator)
    rows = [measure(parts, examples, BATCH), measure(parts, examples, 1)]
    table = pd.DataFrame(rows).round(2).to_markdown(index=False)
    speedup = rows[0]["episodes/s"] / rows[1]["episodes/s"]
    publish(
        "bench_rollout",
        f"{N_QUESTIONS} synth dev questions, protocol `{PROTOCOL}`, ≤ {MAX_TURNS} turns, top-{K} BM25, "
        f"greedy, the tiny LM (generator=tiny)\n\n{table}\n\n"
        f"batched engine vs one question at a time: **{speedup:.1f}x** episodes/s (same episodes: "
        f"EM {rows[0]['EM']:.1f} vs {rows[1]['EM']:.1f}); peak RSS {peak_rss_mb():.0f} MB",
    )


if __name__ == "__main__":
    main()
