"""The environment every policy acts in: corpus + retriever (+ generator), and episode records."""

from rag_lab.env.env import Env
from rag_lab.env.episode import Episode, Step

__all__ = ["Env", "Episode", "Step"]
