"""BM25 with ``bm25s`` (sparse matrices; the default) or ``rank_bm25`` (the reference backend).

Both backends get the same tokens (``Tokenizer``). bm25s variants: ``lucene`` (default),
``robertson``, ``atire``, ``bm25l``, ``bm25+``; rank_bm25 offers ``robertson`` (``BM25Okapi``,
with its ``epsilon`` floor on negative idf), ``bm25l`` and ``bm25+``. Titles are indexed with
the text (``title\\ntext``), as FlashRAG's corpora do. A bm25s index is cached on disk under the
corpus fingerprint and the parameters (``rag_lab.retrievers.cache``).
"""

import logging
import os
from collections.abc import Collection, Sequence

# Where JAX is installed, importing bm25s runs a JAX op, and JAX then takes 75% of a GPU's memory (XLA's
# preallocation; seen on an H200: every other CUDA user of the process ran out of memory). rag_lab ranks
# with numpy (top_rows), so JAX stays on the CPU unless the user's environment says otherwise.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import bm25s  # noqa: E402
import numpy as np  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

from rag_lab.core import cache
from rag_lab.core.errors import RagLabError
from rag_lab.core.ranges import NonNegative, Probability
from rag_lab.data.base import Corpus
from rag_lab.retrievers.base import Hit, filter_hits
from rag_lab.retrievers.cache import index_dir
from rag_lab.retrievers.tokenize import Tokenizer

logging.getLogger("bm25s").setLevel(logging.WARNING)
RANK_BM25 = {"robertson": "BM25Okapi", "bm25l": "BM25L", "bm25+": "BM25Plus"}


class BM25Retriever:
    def __init__(
        self,
        corpus: Corpus,
        # term-frequency saturation: how much a repeated query term adds (0: presence only)
        k1: NonNegative = 1.5,
        # document-length normalisation (0: none, 1: full)
        b: Probability = 0.75,
        # lucene | robertson | atire | bm25l | bm25+
        method: str = "lucene",
        # bm25l / bm25+ only
        delta: NonNegative = 0.5,
        # the stop-word list dropped from queries and passages: en | en_plus (bm25s's lists) | null
        stopwords: str | None = "en",
        # a Snowball language (e.g. english), or null
        stemmer: str | None = None,
        # bm25s (fast) | rank_bm25 (reference)
        backend: str = "bm25s",
        # rank_bm25's BM25Okapi floor for negative idf (0 reproduces bm25s robertson exactly)
        epsilon: NonNegative = 0.25,
        # the bm25s index is cached under cache_dir/index/bm25/<key> (null: built each run)
        cache_dir: str | None = None,
        # progress bars while the corpus is tokenised and indexed
        show_progress: bool = True,
    ):
        self.corpus = corpus
        self.backend = backend
        self.show_progress = show_progress
        self.tokenize = Tokenizer(stopwords=stopwords, stemmer=stemmer)
        params = {
            "k1": k1,
            "b": b,
            "method": method,
            "delta": delta,
            "stopwords": stopwords,
            "stemmer": stemmer,
        }
        if backend == "bm25s":
            self._build_bm25s(params, cache_dir)
        elif backend == "rank_bm25":
            self._build_rank_bm25(params, epsilon)
        else:
            raise RagLabError(f"retriever.backend: unknown BM25 backend '{backend}' (use bm25s or rank_bm25)")

    def _docs(self) -> list[list[str]]:
        pairs = zip(self.corpus.titles, self.corpus.texts, strict=True)
        return [
            self.tokenize(f"{t}\n{x}")
            for t, x in tqdm(pairs, total=len(self.corpus), desc="tokenize", disable=not self.show_progress)
        ]

    def _build_bm25s(self, params: dict, cache_dir: str | None) -> None:
        path = index_dir(cache_dir, "bm25", self.corpus, params, __name__)
        if path is not None and (path / "params.index.json").exists():
            self.index = bm25s.BM25.load(str(path), mmap=True, show_progress=False)
        else:
            self.index = bm25s.BM25(
                k1=params["k1"], b=params["b"], method=params["method"], delta=params["delta"]
            )
            self.index.index(self._docs(), show_progress=self.show_progress)
            if path is not None:
                with cache.publish(path) as tmp:
                    self.index.save(str(tmp), show_progress=False)
        self.vocab = self.index.vocab_dict

    def _build_rank_bm25(self, params: dict, epsilon: float) -> None:
        import rank_bm25

        if params["method"] not in RANK_BM25:
            raise RagLabError(
                f"retriever.method: rank_bm25 has no '{params['method']}' (has {', '.join(RANK_BM25)})"
            )
        cls = getattr(rank_bm25, RANK_BM25[params["method"]])
        extra = {"epsilon": epsilon} if params["method"] == "robertson" else {"delta": params["delta"]}
        self.index = cls(self._docs(), k1=params["k1"], b=params["b"], **extra)

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every passage for one query."""
        tokens = [t for t in self.tokenize(query) if self.backend == "rank_bm25" or t in self.vocab]
        if not tokens:
            return np.zeros(len(self.corpus))
        return np.asarray(self.index.get_scores(tokens), dtype=np.float64)

    def search(
        self, queries: Sequence[str], k: int, exclude: Sequence[Collection[str]] | None = None
    ) -> list[list[Hit]]:
        """Top-k per query. Selection runs over the passages with a positive score only: with few
        matching passages a full-corpus partial sort degenerates on the ties at 0 (bm25s's own
        top-k took 5 ms per query on a 100k corpus for a one-match query; this takes 0.1 ms)."""
        exclude = exclude or [()] * len(queries)
        out: list[list[Hit]] = []
        for query, skip in zip(queries, exclude, strict=True):
            # Empty, whitespace-only and all-unknown-word queries score 0 everywhere: no hits.
            scores = self.scores(query) if query and query.strip() and k > 0 else np.zeros(0)
            rows = top_rows(scores, k + len(skip))
            hits = [Hit(self.corpus.ids[r], float(scores[r])) for r in rows]
            out.append(filter_hits(hits, skip, k))
        return out


def top_rows(scores: np.ndarray, depth: int) -> np.ndarray:
    """Rows of the ``depth`` best positive scores, best first; ties in corpus order.

    >>> top_rows(np.array([0.0, 2.0, 0.5, 2.0, 0.0]), 2).tolist()
    [1, 3]
    """
    candidates = np.flatnonzero(scores > 0)
    if len(candidates) > depth:
        candidates = np.sort(candidates[np.argpartition(-scores[candidates], depth - 1)[:depth]])
    return candidates[np.argsort(-scores[candidates], kind="stable")]
