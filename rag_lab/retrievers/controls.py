"""Retriever controls: what a method does when retrieval is random, empty or perfect.

"Search-R1, re-examined" trained the same agent against a random retriever (the policy soon stopped
searching) and an empty one (it searched more); the embedded world can also give the opposite bound, an
oracle that knows each question's gold passages. Against these three a method's gain can be read as the
evidence's doing or the algorithm's (issue 74):

- ``retriever=random`` (:class:`RandomRetriever`): ``k`` passages drawn uniformly from the corpus, a
  draw fixed by (the query's text, ``seed``), so one config and seed give the same numbers.
- ``retriever=empty`` (:class:`EmptyRetriever`): no passage for any query.
- ``retriever=oracle`` (:class:`OracleRetriever`): the gold passages first, the rest BM25's. It is the one
  retriever that must know which question a query is asked for: it declares ``takes_gold`` and
  :meth:`rag_lab.env.Env.search` hands it each query's supporting ids (every policy passes its questions);
  a search that names no questions is refused in one line.

Hand-written: no retrieval library ships controls of this kind (they are a few lines over the corpus).
Scores: the random and empty retrievers rank nothing, so a random hit's score is 0; the oracle's gold hits
score just above BM25's best, so every answer stays best first.
"""

import hashlib
from collections.abc import Callable, Collection, Sequence

import numpy as np

from rag_lab.core.errors import RagLabError
from rag_lab.data.base import Corpus
from rag_lab.retrievers.base import Hit, Retriever
from rag_lab.retrievers.fusion import build

NO_GOLD = (
    "retriever=oracle: this search names no questions, so the oracle has no gold passages to put first "
    "(a caller of Env.search passes questions=, one QAExample a query)"
)


def asked(query: str) -> bool:
    """The contract's rule (rag_lab/retrievers/base.py): an empty or whitespace-only query has no hits."""
    return bool(query and query.strip())


class RandomRetriever:
    def __init__(
        self,
        corpus: Corpus,
        # the draws' seed (with each query's text): the run's seed by default
        seed: int = 0,
    ):
        self.corpus = corpus
        self.seed = seed

    def rng(self, query: str) -> np.random.Generator:
        """The query's own generator: the same (seed, text) draws the same passages in any batch."""
        digest = hashlib.sha256(f"{self.seed}\0{query}".encode()).digest()
        return np.random.default_rng(int.from_bytes(digest[:8], "little"))

    def draw(self, query: str, k: int, skip: Collection[str]) -> list[Hit]:
        """``k`` distinct passages not in ``skip``, uniformly at random: the first ``k`` allowed rows of the
        query's fixed random stream (excluding a passage does not reshuffle the others)."""
        n = len(self.corpus)
        banned = {self.corpus.row(pid) for pid in skip if pid in self.corpus}
        want = min(k, n - len(banned))
        if want <= 0:
            return []
        rng = self.rng(query)
        if 2 * want >= n - len(banned):  # most of what is left: one permutation is cheaper than rejection
            rows = [r for r in rng.permutation(n).tolist() if r not in banned][:want]
        else:
            rows, taken = [], set(banned)
            while len(rows) < want:
                for r in rng.integers(n, size=2 * want).tolist():
                    if r not in taken and len(rows) < want:
                        rows.append(r)
                        taken.add(r)
        return [Hit(self.corpus.ids[r], 0.0) for r in rows]

    def search(
        self, queries: Sequence[str], k: int, exclude: Sequence[Collection[str]] | None = None
    ) -> list[list[Hit]]:
        exclude = exclude or [()] * len(queries)
        return [self.draw(q, k, skip) if asked(q) else [] for q, skip in zip(queries, exclude, strict=True)]


class EmptyRetriever:
    def __init__(self, corpus: Corpus | None = None):
        self.corpus = corpus

    def search(
        self, queries: Sequence[str], k: int, exclude: Sequence[Collection[str]] | None = None
    ) -> list[list[Hit]]:
        return [[] for _ in queries]


class OracleRetriever:
    # Env.search hands this retriever each query's gold passage ids (``gold=``)
    takes_gold = True

    def __init__(
        self,
        corpus: Corpus,
        # the retriever that fills the hits after the gold passages (a retriever config: bm25's)
        base: Retriever | Callable[..., Retriever],
    ):
        self.corpus = corpus
        self.base = build(corpus, base)

    def search(
        self,
        queries: Sequence[str],
        k: int,
        exclude: Sequence[Collection[str]] | None = None,
        gold: Sequence[Collection[str]] | None = None,
    ) -> list[list[Hit]]:
        """Per query, its gold passages that the corpus holds and ``exclude`` does not (in the question's
        order), then the base retriever's hits for the query's text, to ``k`` in all, no passage twice."""
        if gold is None:
            raise RagLabError(NO_GOLD)
        exclude = exclude or [()] * len(queries)
        firsts = [
            [p for p in dict.fromkeys(ids) if p in self.corpus and p not in skip][:k] if asked(q) else []
            for q, ids, skip in zip(queries, gold, exclude, strict=True)
        ]
        deeper = [len(first) + k for first in firsts]
        fills = self.base.search(queries, max(deeper, default=k), exclude)
        out = []
        for first, fill in zip(firsts, fills, strict=True):
            top = max((h.score for h in fill), default=0.0) + 1.0
            hits = [Hit(p, top) for p in first] + [h for h in fill if h.id not in first]
            out.append(hits[:k])
        return out
