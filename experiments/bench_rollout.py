"""Rollout speed: episodes/s at batch 64 vs one question at a time (the way FlashRAG's pipelines
run), same tiny LM, same BM25, same questions, same policy, in the same run; and where the time
goes (generate / retrieve / the rest: rendering, parsing, bookkeeping), and inside generate the model's
forward passes that read prompts (prefill) and those that extend completions by a token (decode).

The speed-up of the batched loop is bounded by what batching cannot share: the prefill. On a CPU the
prefill is compute-bound (the same floating-point work at batch 1 or 64), so batched seconds >= the
prefill seconds of either loop, and the ratio <= sequential seconds / batched prefill seconds (the
"bound" line).

    python experiments/bench_rollout.py      # writes experiments/results/bench_rollout.md
    python experiments/bench_rollout.py generator.device=cuda   # ... bench_rollout_cuda.md (make gpu-check)

Uses the embedded default LM (generator=tiny; trained on first use, then cached).
"""

import sys
import time

import pandas as pd
from benchlib import ForwardClock, peak_rss_mb, publish, shipped_lm
from hydra.utils import instantiate

from rag_lab.core.config import build, compose
from rag_lab.env import Env
from rag_lab.policies.stoprag.pipeline import IterativePipeline

N_QUESTIONS, BATCH, ITERATIONS = 64, 64, 4


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
    clock = ForwardClock(generator.model)
    env = Env(corpus, ret, gen)
    start = time.perf_counter()
    episodes = []
    # Stop-RAG's pipeline at a fixed horizon: every episode runs all its turns whatever the model says
    # (an agent protocol would end early on the tiny LM's format failures and measure little).
    policy = IterativePipeline(iterations=ITERATIONS)
    for i in range(0, len(examples), batch):
        episodes += policy.rollout(env, examples[i : i + batch])
    total = time.perf_counter() - start
    clock.close()
    right = sum(ep.prediction in ex.answers for ep, ex in zip(episodes, examples, strict=True))
    return {
        "loop": f"batch {batch}" if batch > 1 else "one question at a time",
        "episodes/s": len(examples) / total,
        "seconds": total,
        "generate s": gen.seconds,
        "prefill s": clock.seconds["prefill"],
        "decode s": clock.seconds["decode"],
        "retrieve s": ret.seconds,
        "rest s": total - gen.seconds - ret.seconds,
        "generated steps": sum(len(ep.steps) for ep in episodes),
        "EM": 100 * right / len(examples),
        "_predictions": [ep.prediction for ep in episodes],
    }


def main(overrides: list[str]) -> None:
    cfg = compose(["generator=tiny", *overrides])
    data = instantiate(cfg.data)
    retriever = build(cfg.retriever, corpus=data.corpus)
    generator = build(cfg.generator, data=data)
    examples = data.split("dev")[:N_QUESTIONS]
    parts = (data.corpus, retriever, generator)
    rows = [measure(parts, examples, BATCH), measure(parts, examples, 1)]
    same = sum(a == b for a, b in zip(rows[0].pop("_predictions"), rows[1].pop("_predictions"), strict=True))
    table = pd.DataFrame(rows).round(2).to_markdown(index=False)
    speedup = rows[0]["episodes/s"] / rows[1]["episodes/s"]
    bound = rows[1]["seconds"] / rows[0]["prefill s"]
    device = next(generator.model.parameters()).device.type
    publish(
        "bench_rollout" if device == "cpu" else f"bench_rollout_{device}",
        f"{N_QUESTIONS} synth dev questions, Stop-RAG's pipeline (`fixed_iter`) at T = {ITERATIONS}: per "
        f"iteration a follow-up query, BM25 top 1, an intermediate answer; then the final answer (9 "
        f"generate calls per episode); greedy, the tiny LM (generator=tiny) on {device}\n\n{table}\n\n"
        f"batched engine vs one question at a time: **{speedup:.1f}x** episodes/s (same episodes: "
        f"{same}/{len(examples)} final answers identical, EM {rows[0]['EM']:.1f} vs {rows[1]['EM']:.1f}); "
        f"peak RSS {peak_rss_mb():.0f} MB\n\nbound: one question at a time {rows[1]['seconds']:.2f} s / "
        f"the batched loop's prefill {rows[0]['prefill s']:.2f} s = **{bound:.1f}x** (prefill at batch 1: "
        f"{rows[1]['prefill s']:.2f} s)",
        lm=shipped_lm(),
    )


if __name__ == "__main__":
    main(sys.argv[1:])
