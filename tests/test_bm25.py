"""BM25 scores against the formulas written out by hand, both backends, exclusion, empty queries."""

import math
from collections import Counter

import numpy as np
import pytest

from rag_lab.data.base import Corpus
from rag_lab.retrievers.bm25 import BM25Retriever
from rag_lab.retrievers.tokenize import Tokenizer

DOCS = [
    ("Ada", "Ada was born in London. Ada wrote notes."),
    ("London", "London is a city in England."),
    ("Paris", "Paris is a city. Paris is large and old and the city is busy."),
    ("Film", "The film was directed by Ada."),
]
CORPUS = Corpus([f"p{i}" for i in range(len(DOCS))], [t for t, _ in DOCS], [x for _, x in DOCS])
QUERIES = ["Where was Ada born?", "city Paris", "busy old London"]


def formula(method: str, query: str, k1: float = 1.5, b: float = 0.75) -> np.ndarray:
    """BM25 written out from its definitions (Kamphuis et al. 2020, "Which BM25 do you mean?").

    ``robertson`` as Kamphuis et al. and bm25s: tf / (tf + k1·norm), idf floored at 0; ``okapi`` as
    rank_bm25's BM25Okapi with epsilon = 0: the (k1 + 1) factor kept, negative idf set to 0.
    """
    tok = Tokenizer()
    docs = [Counter(tok(f"{t}\n{x}")) for t, x in DOCS]
    n, avgdl = len(docs), sum(sum(d.values()) for d in docs) / len(docs)
    scores = np.zeros(n)
    for term in tok(query):
        df = sum(term in d for d in docs)
        if df == 0:
            continue
        idf = {
            "robertson": max(0.0, math.log((n - df + 0.5) / (df + 0.5))),
            "okapi": max(0.0, math.log((n - df + 0.5) / (df + 0.5))),
            "lucene": math.log(1 + (n - df + 0.5) / (df + 0.5)),
            "atire": math.log(n / df),
        }[method]
        for j, d in enumerate(docs):
            tf, dl = d[term], sum(d.values())
            norm = tf + k1 * (1 - b + b * dl / avgdl)
            scores[j] += idf * (tf * (k1 + 1) / norm if method in ("atire", "okapi") else tf / norm)
    return scores


@pytest.mark.parametrize("method", ["lucene", "robertson", "atire"])
def test_bm25s_scores_equal_the_formula(method):
    retriever = BM25Retriever(CORPUS, method=method, show_progress=False)
    for q in QUERIES:
        np.testing.assert_allclose(retriever.scores(q), formula(method, q), rtol=1e-5, atol=1e-6)


def test_rank_bm25_okapi_with_epsilon_0_equals_bm25s_robertson():
    fast = BM25Retriever(CORPUS, method="robertson", show_progress=False)
    ref = BM25Retriever(CORPUS, method="robertson", backend="rank_bm25", epsilon=0.0, show_progress=False)
    for q in QUERIES:
        np.testing.assert_allclose(ref.scores(q), formula("okapi", q), rtol=1e-6)
        # Same ranking: the scores differ only by the constant factor k1 + 1.
        np.testing.assert_allclose(fast.scores(q) * 2.5, ref.scores(q), rtol=1e-5, atol=1e-6)
        assert list(np.argsort(-fast.scores(q), kind="stable")) == list(
            np.argsort(-ref.scores(q), kind="stable")
        )


def test_search_ranks_excludes_and_handles_empty_queries():
    retriever = BM25Retriever(CORPUS, show_progress=False)
    hits = retriever.search(
        ["Paris city", "", "   ", "zzz unknown", "Ada"], k=2, exclude=[(), (), (), (), ("p0",)]
    )
    assert hits[0][0].id == "p2"
    assert hits[1] == hits[2] == hits[3] == []
    assert [h.id for h in hits[4]] == ["p3"]  # p0 excluded; only p3 mentions Ada otherwise
    assert all(a.score >= b.score for a, b in zip(hits[0], hits[0][1:], strict=False))


def test_unknown_backend_or_method_is_a_config_error():
    with pytest.raises(ValueError, match="unknown BM25 backend 'lucy'"):
        BM25Retriever(CORPUS, backend="lucy")
    with pytest.raises(ValueError, match="rank_bm25 has no 'lucene'"):
        BM25Retriever(CORPUS, backend="rank_bm25", method="lucene")


def test_index_cache_is_reused_and_invalidated_by_a_corpus_change(tmp_path):
    first = BM25Retriever(CORPUS, cache_dir=str(tmp_path), show_progress=False)
    (entry,) = (tmp_path / "index" / "bm25").iterdir()
    again = BM25Retriever(CORPUS, cache_dir=str(tmp_path), show_progress=False)
    assert again.search(["Paris"], 3) == first.search(["Paris"], 3)
    assert len(list((tmp_path / "index" / "bm25").iterdir())) == 1
    changed = Corpus(CORPUS.ids, CORPUS.titles, [*CORPUS.texts[:3], "The film was directed by Paris."])
    fresh = BM25Retriever(changed, cache_dir=str(tmp_path), show_progress=False)
    assert len(list((tmp_path / "index" / "bm25").iterdir())) == 2
    assert "p3" in [h.id for h in fresh.search(["Paris"], 4)[0]]
    assert "p3" not in [h.id for h in again.search(["Paris"], 4)[0]]
    assert entry.exists()
