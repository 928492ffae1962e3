"""Line-by-line JSON reading with errors that name the file, the line and the field."""

import json
import re
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


# A JSON escape of a UTF-16 surrogate: only where one appears can the parsed text hold a lone one.
SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def check_text(value: Any, path: str = "") -> None:
    """A FieldError naming the first field of ``value`` whose text is not valid Unicode: a lone UTF-16
    surrogate (``"\\ud83d"`` without its pair), which no tokenizer or UTF-8 file can take.

    >>> check_text({"question": "ok", "answers": ["a \\ud83d"]})
    Traceback (most recent call last):
    rag_lab.data.jsonl.FieldError: field 'answers[0]' holds text that is not valid Unicode ('\\ud83d' at ...)
    """
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            bad = value[e.start : e.end]
            raise FieldError(
                f"field '{path}' holds text that is not valid Unicode ({bad!r} at character {e.start})"
            ) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            check_text(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_text(item, f"{path}[{i}]")


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
                if SURROGATE_ESCAPE.search(line):
                    check_text(row)
                yield parse(row)
            except (json.JSONDecodeError, FieldError) as e:
                if skip_malformed:
                    if counter is not None:
                        counter["skipped"] = counter.get("skipped", 0) + 1
                    continue
                why = f"malformed JSON ({e.msg})" if isinstance(e, json.JSONDecodeError) else str(e)
                raise DataError(f"{path}:{lineno}: {why}") from None


def write_jsonl(path: Path, rows: list[dict]) -> None:
    from rag_lab.core.records import atomic_write_text

    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def read_json_list(
    path: Path, parse: Callable[[dict], T], skip_malformed: bool = False, counter: dict | None = None
) -> Iterator[T]:
    """Parse each item of a whole-file JSON list (HotpotQA / 2Wiki layout); errors name the item."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        items = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}:{e.colno}: malformed JSON ({e.msg})") from None
    if not isinstance(items, list):
        raise DataError(f"{path}: expected a JSON list of questions, got {type(items).__name__}")
    escapes = bool(SURROGATE_ESCAPE.search(text))
    for i, row in enumerate(items):
        try:
            if not isinstance(row, dict):
                raise FieldError(f"expected a JSON object, got {type(row).__name__}")
            if escapes:
                check_text(row)
            yield parse(row)
        except FieldError as e:
            if skip_malformed:
                if counter is not None:
                    counter["skipped"] = counter.get("skipped", 0) + 1
                continue
            qid = row.get("_id", row.get("id")) if isinstance(row, dict) else None
            raise DataError(f"{path}: item {i}{f' (id {qid})' if qid else ''}: {e}") from None
