"""The retriever contract: one batched call for many queries."""

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Hit:
    id: str
    score: float


class Retriever(Protocol):
    def search(
        self, queries: Sequence[str], k: int, exclude: Sequence[Collection[str]] | None = None
    ) -> list[list[Hit]]:
        """Top-``k`` hits per query, best first; ``exclude[i]`` are passage ids dropped for query i
        before the top ``k`` are taken (passages already seen in an episode). An empty or
        whitespace-only query has no hits."""
        ...


def filter_hits(hits: list[Hit], exclude: Collection[str], k: int) -> list[Hit]:
    """The first ``k`` hits whose id is not excluded (hits are best first)."""
    return [h for h in hits if h.id not in exclude][:k]
