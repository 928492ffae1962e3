"""Retrieval speed on a 100k-passage generated corpus, 1,000 queries, top-10.

- BM25 queries/s: bm25s (our default backend) vs rank_bm25 (reference), same tokens, same run.
- Dense: MiniLM encode throughput (passages/s) on CPU, on a 5,000-passage sample.
- faiss: search ms/query over 100k × 384 vectors (Flat and HNSW32), build time.
- Peak resident memory of the process.

    python experiments/bench_retrieval.py      # writes experiments/results/bench_retrieval.md
"""

import random
import time

import numpy as np
import pandas as pd
from benchlib import peak_rss_mb, publish

from rag_lab.data.base import Corpus
from rag_lab.data.synth.world import build_world
from rag_lab.retrievers.bm25 import BM25Retriever
from rag_lab.retrievers.dense import Encoder

N_QUERIES, K = 1000, 10
SIZES = {
    "people": 72_000,
    "cities": 6_000,
    "countries": 300,
    "films": 15_000,
    "companies": 6_000,
    "bands": 2_000,
}


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main() -> None:
    rng = random.Random(0)
    world, t_world = timed(lambda: build_world(rng, SIZES, withhold_rate=0.0))
    ids = list(world.passages)
    corpus = Corpus(ids, [world.passages[i][0] for i in ids], [world.passages[i][1] for i in ids])
    people = [e.name for e in world.of_kind("person")]
    films = [e.name for e in world.of_kind("film")]
    queries = [
        f"Where was {rng.choice(people)} born?" if i % 2 else f"Who directed {rng.choice(films)}?"
        for i in range(N_QUERIES)
    ]
    rows = []

    fast, t_fast_index = timed(lambda: BM25Retriever(corpus, show_progress=False))
    _, t_fast = timed(lambda: fast.search(queries, K))
    ref, t_ref_index = timed(
        lambda: BM25Retriever(corpus, method="robertson", backend="rank_bm25", show_progress=False)
    )
    _, t_ref = timed(lambda: ref.search(queries, K))
    rows += [
        {"what": "BM25 bm25s (lucene)", "index s": t_fast_index, "queries/s": N_QUERIES / t_fast},
        {"what": "BM25 rank_bm25 (Okapi)", "index s": t_ref_index, "queries/s": N_QUERIES / t_ref},
    ]
    speedup = t_ref / t_fast

    encoder = Encoder("sentence-transformers/all-MiniLM-L6-v2", batch_size=64)
    sample = [f"{corpus.titles[i]}\n{corpus.texts[i]}" for i in range(5000)]
    emb, t_encode = timed(lambda: encoder.encode(sample))
    rows.append({"what": "MiniLM encode (CPU, 5k passages)", "passages/s": len(sample) / t_encode})

    import faiss

    gen = np.random.default_rng(0)
    vectors = gen.standard_normal((len(corpus), emb.shape[1]), dtype=np.float32)
    vectors[: len(emb)] = emb
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    q = encoder.encode(queries)
    for factory in ["Flat", "HNSW32"]:
        index = faiss.index_factory(vectors.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
        _, t_build = timed(lambda index=index: index.add(vectors))
        if factory.startswith("HNSW"):
            faiss.ParameterSpace().set_index_parameter(index, "efSearch", 128)
        _, t_search = timed(lambda index=index: index.search(q, K))
        rows.append(
            {
                "what": f"faiss {factory} ({len(corpus):,} x {vectors.shape[1]})",
                "index s": t_build,
                "ms/query": 1000 * t_search / N_QUERIES,
            }
        )

    table = pd.DataFrame(rows).round(2).to_markdown(index=False)
    publish(
        "bench_retrieval",
        f"corpus: {len(corpus):,} generated passages (world built in {t_world:.1f} s); "
        f"{N_QUERIES:,} queries, top-{K}\n\n{table}\n\n"
        f"**bm25s vs rank_bm25: {speedup:.0f}x queries/s** (goal >= 50x); peak RSS {peak_rss_mb():,.0f} MB",
        lm="none (retrieval only)",
    )


if __name__ == "__main__":
    main()
