"""Records shared by every dataset: ``QAExample``, ``Passage``, ``Corpus`` and ``Dataset``."""

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any, Protocol

from rag_lab.core.errors import RagLabError


class DataError(RagLabError):
    """Bad input data; the message names the file, the line and the field."""


@dataclass(frozen=True)
class SubQuestion:
    """One step of a gold decomposition; ``question`` may reference earlier answers as ``#1``, ``#2``."""

    question: str
    answer: str
    support_id: str | None = None


def resolve_references(question: str, answers: list[str]) -> str:
    """Replace ``#n`` in a sub-question by the n-th earlier answer (``#10`` before ``#1``).

    >>> resolve_references("Where was #1 born?", ["Ada Lovelace"])
    'Where was Ada Lovelace born?'
    """
    for i in range(len(answers), 0, -1):
        question = question.replace(f"#{i}", answers[i - 1])
    return question


@dataclass(frozen=True)
class QAExample:
    id: str
    question: str
    # Gold answer first, then its aliases; metrics take the best over all of them.
    answers: tuple[str, ...]
    type: str = ""
    hops: int = 1
    answerable: bool = True
    supporting_ids: tuple[str, ...] = ()
    # Titles of the supporting passages, and (title, sentence index) pairs where the format has them.
    supporting_titles: tuple[str, ...] = ()
    supporting_facts: tuple[tuple[str, int], ...] = ()
    decomposition: tuple[SubQuestion, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        """FlashRAG's layout: the title on the first line, then the text."""
        return f"{self.title}\n{self.text}"


class Corpus(Sequence[Passage]):
    """Passages in column arrays with an id → row index.

    Each passage is held once as three strings in parallel lists (no per-passage object);
    ``Passage`` objects are built on access. Duplicate ids are an error naming them.
    """

    def __init__(self, ids: list[str], titles: list[str], texts: list[str], source: str = "<memory>"):
        if not len(ids) == len(titles) == len(texts):
            raise DataError(f"{source}: ids, titles and texts differ in length")
        self.ids = ids
        self.titles = titles
        self.texts = texts
        self.source = source
        self._row = {pid: i for i, pid in enumerate(ids)}
        if len(self._row) != len(ids):
            seen: set[str] = set()
            dups = sorted({pid for pid in ids if pid in seen or seen.add(pid)})
            raise DataError(f"{source}: duplicate passage ids: {', '.join(dups[:10])}")

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return Passage(self.ids[i], self.titles[i], self.texts[i])

    def __iter__(self) -> Iterator[Passage]:
        for i in range(len(self)):
            yield self[i]

    def get(self, pid: str) -> Passage:
        return self[self._row[pid]]

    def row(self, pid: str) -> int:
        return self._row[pid]

    def __contains__(self, pid: object) -> bool:
        return pid in self._row

    @cached_property
    def fingerprint(self) -> str:
        """A hash of every id, title and text: a changed corpus never reuses a cached index."""
        digest = hashlib.blake2b(digest_size=16)
        for pid, title, text in zip(self.ids, self.titles, self.texts, strict=True):
            digest.update(f"{pid}\x00{title}\x00{text}\x01".encode())
        return digest.hexdigest()


def kept_questions(ids: list[str], source: str, skip_duplicates: bool = False) -> list[int]:
    """The positions of a split's questions to keep: the split must not be empty, and each id once.

    A repeated id is an error naming it (records are keyed by id, so both copies could not be
    scored or resumed); with ``skip_duplicates`` (``data.skip_malformed=true``) later copies are
    dropped (the caller counts them as ``len(ids) - len(kept)``).
    """
    if not ids:
        raise DataError(f"{source}: no questions (an empty file, or every line was skipped)")
    first: dict[str, int] = {}
    for i, qid in enumerate(ids):
        first.setdefault(qid, i)
    if len(first) < len(ids) and not skip_duplicates:
        seen: set[str] = set()
        dups = [qid for qid in ids if qid in seen or seen.add(qid)]
        raise DataError(
            f"{source}: {len(dups)} duplicate question id(s): {', '.join(dict.fromkeys(dups[:5]))} "
            "(each id must be unique; data.skip_malformed=true keeps the first of each)"
        )
    return sorted(first.values())


class Dataset(Protocol):
    """What ``conf/data/*.yaml`` builds: named splits of questions over one corpus."""

    name: str
    # The metric rules of the dataset's official scorer (see rag_lab.eval.metrics).
    scorer: str

    def split(self, name: str) -> list[QAExample]: ...

    @property
    def corpus(self) -> Corpus: ...
