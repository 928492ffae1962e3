"""Hybrid retrieval by reciprocal-rank fusion (Cormack, Clarke & Büttcher, SIGIR 2009).

score(d) = Σ_r w_r / (rrf_k + rank_r(d)), ranks from 1 over each retriever's top ``depth``;
rrf_k = 60 as in the paper (and EVO-RAG's RRF of BM25 and BGE). Hand-written: a few lines that
no retrieval library we depend on provides over arbitrary retrievers.
"""

from collections.abc import Callable, Collection, Mapping, Sequence

from rag_lab.core.ranges import NonNegative, PositiveInt
from rag_lab.data.base import Corpus
from rag_lab.retrievers.base import Hit, Retriever


def build(corpus: Corpus, spec: Retriever | Callable[..., Retriever]) -> Retriever:
    """A sub-retriever from a config partial (called with the corpus) or a built one."""
    return spec if hasattr(spec, "search") else spec(corpus=corpus)


def rrf(
    rankings: Sequence[Sequence[Hit]], rrf_k: float = 60, weights: Sequence[float] | None = None
) -> list[Hit]:
    """Fuse best-first rankings; ties keep first-seen order.

    >>> [(h.id, round(h.score, 4)) for h in rrf([[Hit("a", 9), Hit("b", 8)], [Hit("b", 1)]], rrf_k=1)]
    [('b', 0.8333), ('a', 0.5)]
    """
    weights = weights or [1.0] * len(rankings)
    fused: dict[str, float] = {}
    for ranking, w in zip(rankings, weights, strict=True):
        for rank, hit in enumerate(ranking, start=1):
            fused[hit.id] = fused.get(hit.id, 0.0) + w / (rrf_k + rank)
    return [Hit(pid, s) for pid, s in sorted(fused.items(), key=lambda kv: -kv[1])]


class RRFRetriever:
    def __init__(
        self,
        corpus: Corpus,
        # name -> a retriever config: the rankings fused
        retrievers: Mapping[str, Retriever | Callable[..., Retriever]],
        # RRF's constant k: a passage at rank r adds weight / (rrf_k + r)
        rrf_k: NonNegative = 60,
        # how deep each retriever's list goes into the fusion
        depth: PositiveInt = 100,
        # name -> its ranking's weight (a retriever not named: 1)
        weights: Mapping[str, float] | None = None,
    ):
        self.retrievers = {name: build(corpus, spec) for name, spec in retrievers.items()}
        self.rrf_k = rrf_k
        self.depth = depth
        self.weights = [float((weights or {}).get(name, 1.0)) for name in self.retrievers]

    def search(
        self, queries: Sequence[str], k: int, exclude: Sequence[Collection[str]] | None = None
    ) -> list[list[Hit]]:
        per_retriever = [r.search(queries, max(k, self.depth), exclude) for r in self.retrievers.values()]
        return [
            rrf([hits[i] for hits in per_retriever], self.rrf_k, self.weights)[:k]
            for i in range(len(queries))
        ]
