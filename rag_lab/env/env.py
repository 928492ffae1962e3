"""The shared environment: a corpus, a retriever and (when the policy needs one) a generator."""

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from rag_lab.data.base import Corpus, Passage
from rag_lab.errors import RagLabError
from rag_lab.retrievers.base import Hit, Retriever


@dataclass
class Env:
    corpus: Corpus
    retriever: Retriever | None = None
    generator: Any = None

    def search(
        self, queries: Sequence[str], k: int, exclude: Sequence[Collection[str]] | None = None
    ) -> list[list[Hit]]:
        if self.retriever is None:
            raise RagLabError(
                "retriever: this policy searches, but the config has no retriever (set retriever=bm25)"
            )
        return self.retriever.search(queries, k, exclude)

    def passages(self, hits: Sequence[Hit]) -> list[Passage]:
        return [self.corpus.get(h.id) for h in hits]
