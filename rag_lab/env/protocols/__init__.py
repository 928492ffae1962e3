"""Per-paper text formats: each renders a state as a prompt and parses a completion (see base.py)."""

from rag_lab.env.protocols import apex, evorag, r3rag, simple, stoprag, tagged
from rag_lab.env.protocols.base import PROTOCOLS, Action, Protocol, State, Turn, identify

__all__ = [
    "PROTOCOLS",
    "Action",
    "Protocol",
    "State",
    "Turn",
    "identify",
    "apex",
    "evorag",
    "r3rag",
    "simple",
    "stoprag",
    "tagged",
]
