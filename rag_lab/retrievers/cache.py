"""Where the retrievers keep their indexes: ``cache_dir/index/<kind>/<key>`` (:func:`rag_lab.core.cache.path`:
the corpus' fingerprint, the retriever's settings, the code that builds the index), so a changed corpus,
setting or builder never reuses a stale index. Entries are published atomically (:func:`rag_lab.core.cache.
publish`)."""

from pathlib import Path

from rag_lab.core import cache
from rag_lab.data.base import Corpus


def index_dir(cache_dir: str | None, kind: str, corpus: Corpus, params: dict, code: str) -> Path | None:
    """``cache_dir/index/<kind>/<key>`` for an index built by the module ``code`` (None: caching off)."""
    if not cache_dir:
        return None
    return cache.path(cache_dir, f"index/{kind}", corpus.fingerprint, params, code=code)
