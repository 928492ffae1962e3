"""Sentence embeddings for the rewards that compare texts (DAPO's search reward, APEX's SEPR): any
encoder of the retriever registry, MiniLM (offline) when none is given."""

from collections.abc import Sequence
from typing import Any

import numpy as np


def default_encoder() -> Any:
    from rag_lab.retrievers.dense import Encoder

    return Encoder("sentence-transformers/all-MiniLM-L6-v2")


def query_vectors(encoder: Any, texts: Sequence[str]) -> np.ndarray:
    """Unit-length float64 rows, one per text, embedded as queries (with the encoder's query prefix:
    E5's "query: ", Qwen3-Embedding's instruction); an all-zero row stays zero.

    >>> class Toy:
    ...     def encode(self, texts):
    ...         return [[3.0, 4.0] if t == "a" else [0.0, 0.0] for t in texts]
    >>> query_vectors(Toy(), ["a", "b"]).tolist()
    [[0.6, 0.8], [0.0, 0.0]]
    """
    prefix = getattr(encoder, "query_prefix", "")
    m = np.asarray(encoder.encode([prefix + t for t in texts]), dtype=np.float64)
    return m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-12)
