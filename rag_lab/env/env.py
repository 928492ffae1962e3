"""The shared environment: a corpus, a retriever and (when the policy needs one) a generator.

Frozen: the runner builds one and hands it down; a policy that acts with its own model (a trained one, a
planner) makes its own view with :meth:`Env.with_generator`, never writes into the shared one."""

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rag_lab.core.errors import RagLabError
from rag_lab.data.base import Corpus, Passage, QAExample
from rag_lab.retrievers.base import Hit, Retriever
from rag_lab.retrievers.controls import NO_GOLD


@dataclass(frozen=True)
class Env:
    corpus: Corpus
    retriever: Retriever | None = None
    generator: Any = None

    def search(
        self,
        queries: Sequence[str],
        k: int,
        exclude: Sequence[Collection[str]] | None = None,
        questions: Sequence[QAExample | None] | None = None,
    ) -> list[list[Hit]]:
        """The retriever's top ``k`` per query. ``questions[i]``: the question query i is asked for; every
        policy passes them, and a retriever that declares ``takes_gold`` (``retriever=oracle``,
        rag_lab/retrievers/controls.py) gets their supporting ids as ``gold=``. No other retriever sees
        them."""
        if self.retriever is None:
            raise RagLabError(
                "retriever: this policy searches, but the config has no retriever (set retriever=bm25)"
            )
        if not getattr(self.retriever, "takes_gold", False):
            return self.retriever.search(queries, k, exclude)
        if questions is None or len(questions) != len(queries) or any(q is None for q in questions):
            raise RagLabError(NO_GOLD)
        gold = [q.supporting_ids for q in questions]
        return self.retriever.search(queries, k, exclude, gold=gold)

    def with_generator(self, generator: Any) -> "Env":
        """The same corpus and retriever, acting with ``generator``."""
        return replace(self, generator=generator)

    def passages(self, hits: Sequence[Hit]) -> list[Passage]:
        return [self.corpus.get(h.id) for h in hits]
