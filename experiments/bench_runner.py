"""Benchmark the runner's evaluation loop: questions/s and the cost of per-batch durable appends.

Measures, on a generated world of ~4,000 questions, the LM-free baseline end to end
(batched BM25 retrieval + scoring + fsynced appends to records.jsonl) at several batch sizes,
and the peak resident memory. Prints a table and writes experiments/results/bench_runner.md.

    python experiments/bench_runner.py
"""

import tempfile
import time
from pathlib import Path

import pandas as pd
from benchlib import peak_rss_mb, publish

from rag_lab.data.synth import SynthDataset
from rag_lab.env import Env
from rag_lab.eval.evaluate import evaluate
from rag_lab.policies.baselines import TopTitle
from rag_lab.retrievers.bm25 import BM25Retriever


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        data = SynthDataset(tmp, n_people=2000, n_cities=200, n_films=600, dev_size=200, test_size=2000)
        t_data = time.perf_counter() - t0
        t0 = time.perf_counter()
        env = Env(data.corpus, BM25Retriever(data.corpus))
        t_index = time.perf_counter() - t0
        examples = data.split("test")
        rows = []
        for batch_size in [1, 16, 64, 256]:
            path = Path(tmp) / f"records-{batch_size}.jsonl"
            t0 = time.perf_counter()
            evaluate(TopTitle(k=5), env, examples, path, data.scorer, batch_size=batch_size)
            seconds = time.perf_counter() - t0
            rows.append(
                {
                    "batch size": batch_size,
                    "questions": len(examples),
                    "seconds": round(seconds, 2),
                    "questions/s": round(len(examples) / seconds, 1),
                }
            )
    table = pd.DataFrame(rows).to_markdown(index=False)
    publish(
        "bench_runner",
        f"world: {len(data.corpus)} passages, generated in {t_data:.2f} s; BM25 index {t_index:.2f} s; "
        f"peak RSS {peak_rss_mb():.0f} MB\n\n{table}",
        lm="none (the LM-free TopTitle baseline: BM25 retrieval and scoring)",
    )


if __name__ == "__main__":
    main()
