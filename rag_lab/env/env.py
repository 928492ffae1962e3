"""The shared environment: a corpus, a retriever and (when the policy needs one) a generator.

Frozen: the runner builds one and hands it down; a policy that acts with its own model (a trained one, a
planner) makes its own view with :meth:`Env.with_generator`, never writes into the shared one."""

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rag_lab.core.errors import RagLabError
from rag_lab.data.base import Corpus, Passage
from rag_lab.retrievers.base import Hit, Retriever


@dataclass(frozen=True)
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

    def with_generator(self, generator: Any) -> "Env":
        """The same corpus and retriever, acting with ``generator``."""
        return replace(self, generator=generator)

    def passages(self, hits: Sequence[Hit]) -> list[Passage]:
        return [self.corpus.get(h.id) for h in hits]
