"""The policies that the world teacher's demonstrations are recorded behind: a registry the policies fill.

The demonstrations (:mod:`rag_lab.train.demonstrations`: the tiny LM's recipe, the cold start) are the
prompts the real policies render, so they are made by rolling those policies out behind the teacher. The
policies sit a layer above the training recipes (docs/concepts/architecture.md), so the recipes do not
import them: :mod:`rag_lab.policies.demonstrators` registers them here when :mod:`rag_lab.policies` is
imported, which every policy does and every command that trains does first.

Hand-written: a module-level slot, the smallest registry that keeps the imports going down.
"""

from collections.abc import Callable
from dataclasses import dataclass

from rag_lab.core import cache
from rag_lab.core.errors import RagLabError


@dataclass(frozen=True)
class Demonstrators:
    """What the demonstrations roll out behind the teacher."""

    # (k, iterations) -> one policy per protocol family (k passages per search, Stop-RAG pipelines of
    # `iterations`), in the order they are rolled out: the cold start keeps episodes in that order
    policies: Callable[[int, int], list]
    # () -> the reader of each question's gold passages, one chain-of-thought sentence a step (the tiny LM's
    # chain stage)
    gold_chains: Callable[[], object]

    def code_digest(self) -> str:
        """The digest of the registering module's code and of everything it imports (the policies' prompts):
        part of every demonstrations cache key, so a changed prompt is never served from a stale cache."""
        return cache.code_digest(self.policies.__module__)


_registered: list[Demonstrators] = []


def register(demonstrators: Demonstrators) -> None:
    """Make ``demonstrators`` the ones the demonstrations use (a later registration replaces an earlier)."""
    _registered[:] = [demonstrators]


def registered() -> Demonstrators:
    """The registered demonstrators; a one-line error when nothing registered them."""
    if not _registered:
        raise RagLabError(
            "teacher demonstrations: no demonstration policies are registered (import rag_lab.policies "
            "first: rag_lab/policies/demonstrators.py registers them)"
        )
    return _registered[0]
