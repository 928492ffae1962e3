"""Retrievers (``conf/retriever/``): batched ``search(queries, k) -> list[list[Hit]]``."""

from rag_lab.retrievers.base import Hit, Retriever

__all__ = ["Hit", "Retriever"]
