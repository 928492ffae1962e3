"""Run records on disk: atomic writes, an append-and-flush jsonl writer, and resumable reads.

A run directory must survive a kill at any instant: whole files are written to a temporary
file and renamed over the target (rename is atomic on POSIX), and ``records.jsonl`` is only
ever appended to, one flushed + fsynced batch at a time. A kill during an append can leave a
partial last line; :func:`read_records` drops (and truncates away) that line, so the resumed
run redoes only that question.
"""

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rag_lab.core.errors import RagLabError

_UMASK = os.umask(0)
os.umask(_UMASK)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temp file in the same directory + rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file normal permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


class RecordsError(RagLabError):
    """A run file damaged in the middle (not the torn last line a kill leaves)."""


def read_records(path: str | Path, repair: bool = True) -> list[dict]:
    """Read a jsonl of records; a torn final line (a kill mid-append) is dropped.

    Any other malformed line is an error naming the file and line: it means the file was
    edited or corrupted, and silently skipping it would change the metrics.
    With ``repair`` the torn tail is truncated away so that later appends start on a clean line.
    """
    path = Path(path)
    if not path.exists():
        return []
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    records: list[dict] = []
    good_bytes = 0
    for lineno, line in enumerate(lines, start=1):
        is_last = lineno == len(lines)
        if not line.strip():
            good_bytes += len(line) + (0 if is_last else 1)
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            if is_last:  # no trailing newline: the append was cut off
                break
            raise RecordsError(
                f"{path}:{lineno}: malformed record ({e.msg}); the file was edited or damaged: restore "
                "that line, or start over with eval.resume=false (the old files are set aside)"
            ) from None
        good_bytes += len(line) + (0 if is_last else 1)
    if repair and good_bytes < len(raw):
        with open(path, "r+b") as f:
            f.truncate(good_bytes)
    return records


class RecordWriter:
    """Appends records to a jsonl file; each :meth:`write` is one flushed, fsynced batch."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, records: Iterable[dict]) -> None:
        text = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in records)
        if not text:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
