"""BM25 over a corpus with ``bm25s`` (sparse matrices; ~10-50x faster than ``rank_bm25``).

Titles are indexed with the text (``title\\ntext``), as FlashRAG's corpora do.
"""

import logging
from collections.abc import Collection, Sequence

import bm25s

from rag_lab.data.base import Corpus
from rag_lab.retrievers.base import Hit

logging.getLogger("bm25s").setLevel(logging.WARNING)


class BM25Retriever:
    def __init__(
        self,
        corpus: Corpus,
        k1: float = 1.5,
        b: float = 0.75,
        # bm25s variants: lucene (default), robertson, atire, bm25l, bm25+
        method: str = "lucene",
        stopwords: str | None = "en",
        show_progress: bool = False,
    ):
        self.corpus, self.stopwords, self.show_progress = corpus, stopwords, show_progress
        self.index = bm25s.BM25(k1=k1, b=b, method=method)
        docs = [f"{t}\n{x}" for t, x in zip(corpus.titles, corpus.texts, strict=True)]
        tokens = bm25s.tokenize(docs, stopwords=stopwords, show_progress=show_progress)
        self.index.index(tokens, show_progress=show_progress)
        self.vocab = tokens.vocab

    def search(
        self, queries: Sequence[str], k: int, exclude: Sequence[Collection[str]] | None = None
    ) -> list[list[Hit]]:
        exclude = exclude or [()] * len(queries)
        out: list[list[Hit]] = [[] for _ in queries]
        # Queries with no indexed word (empty, whitespace, unseen words) score 0 everywhere: no hits.
        ids_of = {i: self._query_ids(q) for i, q in enumerate(queries) if q and q.strip()}
        live = [i for i, ids in ids_of.items() if ids]
        if not live or k <= 0:
            return out
        depth = min(len(self.corpus), k + max(len(exclude[i]) for i in live))
        ids = [ids_of[i] for i in live]
        rows, scores = self.index.retrieve(ids, k=depth, show_progress=False, n_threads=1)
        for j, i in enumerate(live):
            hits = [
                Hit(self.corpus.ids[r], float(s))
                for r, s in zip(rows[j], scores[j], strict=True)
                if s > 0 and self.corpus.ids[r] not in exclude[i]
            ]
            out[i] = hits[:k]
        return out

    def _query_ids(self, query: str) -> list[int]:
        words = bm25s.tokenize([query], stopwords=self.stopwords, return_ids=False, show_progress=False)[0]
        return [self.vocab[w] for w in words if w in self.vocab and w]
