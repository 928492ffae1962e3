"""On-disk index cache keyed by (corpus fingerprint, retriever config).

A changed corpus (any id, title or text) or a changed parameter gives a new key, so a stale
index is never served. Entries are published atomically: built in a temp dir, then renamed.
"""

import contextlib
import hashlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from rag_lab.data.base import Corpus


def index_dir(cache_dir: str | None, kind: str, corpus: Corpus, params: dict) -> Path | None:
    """``cache_dir/index/<kind>/<key>`` (None when caching is off)."""
    if not cache_dir:
        return None
    key = hashlib.sha256(json.dumps([corpus.fingerprint, kind, params], sort_keys=True).encode()).hexdigest()[
        :16
    ]
    return Path(cache_dir).expanduser() / "index" / kind / key


@contextlib.contextmanager
def publish(path: Path) -> Iterator[Path]:
    """Yield a temp dir beside ``path``; on success it becomes ``path`` in one rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        yield tmp
        if path.exists():  # another process published first: keep theirs
            shutil.rmtree(tmp)
        else:
            tmp.rename(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
