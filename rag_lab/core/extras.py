"""Optional dependencies: a module that only some installs hold, and the pip extra that installs it.

faiss is not a base dependency: faiss-cpu and faiss-gpu both ship the ``faiss`` module, so the ``cpu``
extra (``make install``) brings one and the ``gpu`` extra (``make install-gpu``) the other, and
``pip install 'rag_lab[gpu]'`` never holds both. wandb is the ``wandb`` extra: the default logger is local.
A setting that needs a missing one fails in one line naming the extra, at compose time where the setting's
``check_settings`` asks :func:`check_installed`, and at the import otherwise (:func:`require`).
"""

import importlib
import importlib.util
from types import ModuleType

from rag_lab.core.errors import RagLabError

# module -> how to install it: the extras of pyproject.toml's [project.optional-dependencies] that hold it
EXTRAS = {
    "faiss": "pip install 'rag_lab[cpu]' (or 'rag_lab[gpu]' on a GPU machine)",
    "wandb": "pip install 'rag_lab[wandb]'",
}


def missing_message(module: str, what: str) -> str:
    """The one line for ``what`` (the setting) needing ``module`` where it is not installed.

    >>> missing_message("faiss", "retriever=minilm")  # doctest: +NORMALIZE_WHITESPACE
    "retriever=minilm needs faiss, which is not installed here: pip install 'rag_lab[cpu]'
    (or 'rag_lab[gpu]' on a GPU machine)"
    """
    return f"{what} needs {module}, which is not installed here: {EXTRAS[module]}"


def installed(module: str) -> bool:
    """Whether ``module`` can be imported here, found without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module without a spec
        return False


def check_installed(module: str, what: str) -> None:
    """At compose time (a ``check_settings``): one line when ``module`` is missing, before anything runs."""
    if not installed(module):
        raise RagLabError(missing_message(module, what))


def require(module: str, what: str) -> ModuleType:
    """``import module``, or one line naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise RagLabError(missing_message(module, what)) from None
