"""rag_lab: a lab bench for agentic retrieval-augmented generation on multi-hop QA."""

from pathlib import Path

__version__ = "0.1.0"

# The config tree ships next to the package (a source checkout, or an editable install).
CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
