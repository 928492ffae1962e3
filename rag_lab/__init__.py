"""rag_lab: a lab bench for agentic retrieval-augmented generation on multi-hop QA."""

from pathlib import Path

__version__ = "0.1.0"

# The config tree: conf/ at the repository's top in a source checkout or an editable install, reached
# through the package's link rag_lab/conf -> ../conf, which a wheel (pip install .) holds as a folder of
# the yaml files.
CONF_DIR = (Path(__file__).resolve().parent / "conf").resolve()
