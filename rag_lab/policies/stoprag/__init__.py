"""Stop-RAG (papers/stop-rag.txt): value-based stopping for iterative RAG, trained offline with Q(λ)."""

from rag_lab.policies.stoprag.policy import QStopper, StopRAG

__all__ = ["QStopper", "StopRAG"]
