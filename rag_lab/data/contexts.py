"""Datasets that ship their own passages (HotpotQA, 2WikiMultihopQA, MuSiQue).

As Stop-RAG and IRCoT do for MuSiQue and 2Wiki, the corpus is the union of every split's
contexts, de-duplicated by (title, text). A passage's id is a hash of its title and text, so it
is the same in every split and every run, and each question's gold supports are known by id.
"""

import hashlib
import random
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

from rag_lab.data.base import Corpus, DataError, QAExample, kept_questions
from rag_lab.data.flashrag import missing_file


def passage_id(title: str, text: str) -> str:
    """Stable id of a (title, text) pair.

    >>> passage_id("Paris", "Paris is a city.") == passage_id("Paris", "Paris is a city.")
    True
    """
    return hashlib.blake2b(f"{title}\n{text}".encode(), digest_size=8).hexdigest()


@dataclass(frozen=True)
class Context:
    title: str
    text: str
    is_support: bool = False

    @property
    def id(self) -> str:
        return passage_id(self.title, self.text)


class ContextDataset:
    """Base of the context-carrying loaders: split files under ``path``, corpus = union of contexts.

    A subclass sets ``scorer``, ``source``, ``make_target`` and implements
    ``read(path) -> Iterable[tuple[QAExample, list[Context]]]``; the example's ``supporting_ids``
    are filled here from the contexts flagged as supports.
    """

    scorer = "squad"
    source = ""
    make_target = ""

    def __init__(
        self,
        path: str,
        split_files: dict[str, str],
        name: str,
        skip_malformed: bool = False,
        sample: dict[str, int] | None = None,
        sample_seed: int = 0,
    ):
        self.name = name
        self.path = Path(path)
        self.split_files = dict(split_files)
        # Random disjoint subsets per split (Stop-RAG: 1000 validation and 1000 test questions both
        # drawn from the official dev file): splits that read the same file take consecutive slices
        # of one seeded shuffle of it, in split_files order.
        self.sample = dict(sample or {})
        self.sample_seed = sample_seed
        self.skip_malformed = skip_malformed
        # Per split file: malformed rows skipped, and repeated question ids dropped (skip_malformed).
        self.skipped: dict[str, int] = {}
        self.duplicates: dict[str, int] = {}
        self._loaded: dict[Path, list[tuple[QAExample, list[Context]]]] = {}

    def read(self, path: Path) -> Iterable[tuple[QAExample, list[Context]]]:
        raise NotImplementedError

    def _file(self, split: str) -> Path:
        if self.path.is_file():  # `data.path=<one gold file>`: every split reads it
            return self.path
        if split not in self.split_files:
            raise DataError(f"{self.name} has no split '{split}' (has: {', '.join(self.split_files)})")
        path = self.path / self.split_files[split]
        if not path.exists():
            raise missing_file(path, f"{self.name} split '{split}'", self.source, self.make_target)
        return path

    def _load(self, split: str) -> list[tuple[QAExample, list[Context]]]:
        return self._load_file(self._file(split))

    def _load_file(self, path: Path) -> list[tuple[QAExample, list[Context]]]:
        """Parsed rows of a file; a file that serves two splits (test = dev) is parsed once."""
        if path not in self._loaded:
            rows = []
            for ex, contexts in self.read(path):
                support = list({c.id: c for c in contexts if c.is_support}.values())
                ex = replace(
                    ex,
                    supporting_ids=tuple(c.id for c in support),
                    supporting_titles=tuple(c.title for c in support),
                )
                rows.append((ex, contexts))
            kept = kept_questions([ex.id for ex, _ in rows], str(path), self.skip_malformed)
            self.duplicates[path.name] = len(rows) - len(kept)
            rows = [rows[i] for i in kept]
            self._loaded[path] = rows
        return self._loaded[path]

    def split(self, name: str) -> list[QAExample]:
        rows = [ex for ex, _ in self._load(name)]
        if name not in self.sample:
            return rows
        same_file = [s for s in self.split_files if s in self.sample and self._file(s) == self._file(name)]
        start = sum(self.sample[s] for s in same_file[: same_file.index(name)])
        order = list(range(len(rows)))
        random.Random(self.sample_seed).shuffle(order)
        return [rows[i] for i in order[start : start + self.sample[name]]]

    @cached_property
    def corpus(self) -> Corpus:
        ids: list[str] = []
        titles: list[str] = []
        texts: list[str] = []
        seen: set[str] = set()
        files = [self.path] if self.path.is_file() else [self.path / f for f in self.split_files.values()]
        for path in dict.fromkeys(p for p in files if p.exists()):
            for _, contexts in self._load_file(path):
                for c in contexts:
                    if c.id not in seen:
                        seen.add(c.id)
                        ids.append(c.id)
                        titles.append(c.title)
                        texts.append(c.text)
        if not ids:
            what = f"{self.name} (no split file to build the corpus from)"
            raise missing_file(self.path, what, self.source, self.make_target)
        return Corpus(ids, titles, texts, source=str(self.path))
