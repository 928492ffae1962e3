"""Line-by-line JSON reading with errors that name the file, the line and the field."""

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from rag_lab.data.base import DataError

T = TypeVar("T")


class FieldError(DataError):
    """A missing or mistyped field; the reader adds file and line."""


def require(row: dict, key: str, kind: type | tuple[type, ...]) -> Any:
    """``row[key]`` checked for presence and type."""
    if key not in row:
        raise FieldError(f"missing field '{key}'")
    value = row[key]
    if not isinstance(value, kind):
        expected = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise FieldError(f"field '{key}' should be {expected}, got {type(value).__name__}")
    return value


def require_text(row: dict, key: str) -> str:
    """``row[key]`` as a string that is not blank (a question, an answer)."""
    value = require(row, key, str)
    if not value.strip():
        raise FieldError(f"field '{key}' is empty")
    return value


def require_int(row: dict, key: str, default: int) -> int:
    """``row[key]`` as an int (a digit string counts: some releases write ``"hops": "2"``)."""
    value = row.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).strip().isdigit():
        raise FieldError(f"field '{key}' should be a whole number, got {value!r}")
    return int(value)


def read_jsonl(
    path: Path, parse: Callable[[dict], T], skip_malformed: bool = False, counter: dict | None = None
) -> Iterator[T]:
    """Parse each line of ``path`` with ``parse``; a bad line raises ``DataError(file:line: why)``.

    With ``skip_malformed`` bad lines are skipped and counted in ``counter['skipped']``.
    """
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise FieldError(f"expected a JSON object, got {type(row).__name__}")
                yield parse(row)
            except (json.JSONDecodeError, FieldError) as e:
                if skip_malformed:
                    if counter is not None:
                        counter["skipped"] = counter.get("skipped", 0) + 1
                    continue
                why = f"malformed JSON ({e.msg})" if isinstance(e, json.JSONDecodeError) else str(e)
                raise DataError(f"{path}:{lineno}: {why}") from None


def write_jsonl(path: Path, rows: list[dict]) -> None:
    from rag_lab.records import atomic_write_text

    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def read_json_list(
    path: Path, parse: Callable[[dict], T], skip_malformed: bool = False, counter: dict | None = None
) -> Iterator[T]:
    """Parse each item of a whole-file JSON list (HotpotQA / 2Wiki layout); errors name the item."""
    try:
        with open(path, encoding="utf-8") as f:
            items = json.load(f)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}:{e.colno}: malformed JSON ({e.msg})") from None
    if not isinstance(items, list):
        raise DataError(f"{path}: expected a JSON list of questions, got {type(items).__name__}")
    for i, row in enumerate(items):
        try:
            if not isinstance(row, dict):
                raise FieldError(f"expected a JSON object, got {type(row).__name__}")
            yield parse(row)
        except FieldError as e:
            if skip_malformed:
                if counter is not None:
                    counter["skipped"] = counter.get("skipped", 0) + 1
                continue
            qid = row.get("_id", row.get("id")) if isinstance(row, dict) else None
            raise DataError(f"{path}: item {i}{f' (id {qid})' if qid else ''}: {e}") from None
