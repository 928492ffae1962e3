"""The one cache key, and the digests it is made of. Every cache of rag_lab (the generated world, the
retrievers' indexes, the tiny LM, SmolLM2's conversion, the cold start and its demonstrations, Stop-RAG's
offline data, DAPO's stages, APEX's planner) lives at :func:`path`: ``cache_dir/<kind>/<key>``.

:func:`key` hashes what makes the artefact, in three parts:

- its **resolved config**: the settings the component was built with (a config node, a dataclass), passed
  as they are; keys named ``cache_dir`` are dropped (moving the cache does not change what is in it);
- its **inputs' content**: digests of the data it read (the corpus' fingerprint, the questions, a base
  model's files: :func:`files_digest`);
- the **code** that made it: :func:`code_digest` of the module that writes the cache, i.e. the source of
  that module and of every ``rag_lab`` module it imports, directly or not (read from the import graph,
  :func:`import_graph`; no hand-kept file list), and the package version. A changed line anywhere in that
  code gives a new key, so a stale artefact is never served; unrelated code (a report, a test) does not.

Entries are published atomically (:func:`publish`: built in a temporary directory, then renamed), so a
killed build leaves no half-written entry.

Hand-written: the import graph is ``ast``'s, over the package's own files. ``tests/test_layers.py`` reads
the same graph to check that imports follow the layers.
"""

import ast
import contextlib
import dataclasses
import functools
import hashlib
import json
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import rag_lab

PACKAGE_DIR = Path(rag_lab.__file__).resolve().parent


def text_digest(text: str | bytes) -> str:
    """The sha256 hex digest of ``text``.

    >>> text_digest("")[:12]
    'e3b0c44298fc'
    """
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def stream_digest(chunks: Iterable[str | bytes]) -> str:
    """The sha256 hex digest of ``chunks`` joined (fed one at a time: a corpus need not fit in one string).

    >>> stream_digest(["a", "b"]) == text_digest("ab")
    True
    """
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk.encode() if isinstance(chunk, str) else chunk)
    return digest.hexdigest()


def files_digest(*dirs: str | Path) -> str:
    """A digest of every file under ``dirs`` (relative path and bytes; a folder inside another counts once):
    a model's identity, wherever it lies."""
    roots = sorted({Path(d).resolve() for d in dirs})
    roots = [r for r in roots if not any(o != r and o in r.parents for o in roots)]

    def chunks() -> Iterator[bytes]:
        for root in roots:
            for path in sorted(p for p in root.rglob("*") if p.is_file()):
                yield f"{path.relative_to(root)}\0".encode()
                with open(path, "rb") as f:
                    while chunk := f.read(1 << 20):
                        yield chunk

    return stream_digest(chunks())


def folder_digests(folder: str | Path, skip: Iterable[str] = ()) -> dict[str, str]:
    """Every file under ``folder`` whose name is not in ``skip`` (relative path -> sha256), in path order:
    what a shipped checkpoint's card fingerprints."""
    skip = set(skip)
    files = sorted(p for p in Path(folder).rglob("*") if p.is_file() and p.name not in skip)
    return {str(p.relative_to(folder)): text_digest(p.read_bytes()) for p in files}


def check_folder(folder: str | Path, recorded: Any, card: str | Path, remedy: str) -> None:
    """A one-line error naming the file when ``folder`` does not hold the files ``recorded`` (relative path
    -> sha256, from the card file ``card``) fingerprints; ``remedy``: the command that rebuilds it."""
    from rag_lab.core.errors import RagLabError

    if not isinstance(recorded, dict) or not recorded:
        raise RagLabError(f"{card}: no 'files' fingerprints (sha256 per file); {remedy} writes them")
    found = folder_digests(folder, skip=[Path(card).name])
    for name, digest in recorded.items():
        if name not in found:
            raise RagLabError(f"{Path(folder) / name}: missing, but the card {card} lists it")
        if found[name] != digest:
            raise RagLabError(
                f"{Path(folder) / name}: sha256 {found[name][:16]}… is not the card's ({digest[:16]}…, "
                f"{card}): the file changed after it was shipped (`git checkout` it, or {remedy})"
            )


def plain(value: Any) -> Any:
    """``value`` as JSON-able data for a key: config nodes and dataclasses as dicts (``cache_dir`` dropped),
    tuples as lists, paths as strings; anything else must already be plain.

    >>> plain({"k": (1, 2), "cache_dir": "/tmp", "p": Path("a")})
    {'k': [1, 2], 'p': 'a'}
    """
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(value, DictConfig | ListConfig):
        value = OmegaConf.to_container(value, resolve=True)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items() if k != "cache_dir"}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise TypeError(f"cache key: {type(value).__name__} is not config data ({value!r:.60})")


def key(*parts: Any, code: str | None = None, length: int = 16) -> str:
    """The cache key of an artefact made from ``parts`` (resolved config and content digests, see the module
    docstring) by the module ``code`` (its import closure's source and the package version).

    >>> key({"k1": 1.2}, "corpus") == key({"k1": 1.2}, "corpus") != key({"k1": 0.9}, "corpus")
    True
    """
    blob = json.dumps([plain(list(parts)), code_digest(code) if code else None], sort_keys=True)
    return text_digest(blob)[:length]


def path(cache_dir: str | Path, kind: str, *parts: Any, code: str | None = None) -> Path:
    """``cache_dir/<kind>/<key(*parts, code=code)>``."""
    return Path(cache_dir).expanduser() / kind / key(*parts, code=code)


@contextlib.contextmanager
def publish(target: Path) -> Iterator[Path]:
    """Yield a temp dir beside ``target``; on success it becomes ``target`` in one rename."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield tmp
        if target.exists():  # another process published first: keep theirs
            shutil.rmtree(tmp)
        else:
            tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# ---- the code: rag_lab's import graph ---------------------------------------------------------------------


def module_files(root: Path = PACKAGE_DIR) -> dict[str, Path]:
    """Every module of the package under ``root``: dotted name -> file (a package is its ``__init__``)."""
    out = {}
    for file in sorted(root.rglob("*.py")):
        parts = file.relative_to(root.parent).with_suffix("").parts
        if "__pycache__" in parts:
            continue
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    return out


def _imported(file: Path, module: str, is_package: bool) -> Iterator[str]:
    """Every dotted name ``file`` imports, anywhere in it (lazy and ``TYPE_CHECKING`` imports included)."""
    base = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            origin = node.module or ""
            if node.level:
                anchor = base.rsplit(".", node.level - 1)[0] if node.level > 1 else base
                origin = f"{anchor}.{origin}".rstrip(".")
            yield origin
            yield from (f"{origin}.{alias.name}" for alias in node.names)


@functools.cache
def import_graph(root: Path = PACKAGE_DIR) -> dict[str, frozenset[str]]:
    """module -> the package's modules it imports. Importing ``a.b.c`` runs the ``__init__`` of ``a`` and
    ``a.b`` first, so each import also points at the imported module's packages (but for the importer's
    own packages, which are set up before it runs)."""
    files = module_files(root)
    graph = {}
    for module, file in files.items():
        own = {module.rsplit(".", i)[0] for i in range(1, module.count(".") + 1)}
        targets = set()
        for name in _imported(file, module, file.name == "__init__.py"):
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                prefix = ".".join(parts[:i])
                if prefix in files and prefix != module and prefix not in own:
                    targets.add(prefix)
        graph[module] = frozenset(targets)
    return graph


def closure(module: str) -> list[str]:
    """``module`` and every package module it imports, directly or not, sorted."""
    graph, seen, todo = import_graph(), set(), [module]
    while todo:
        name = todo.pop()
        if name not in seen and name in graph:
            seen.add(name)
            todo.extend(graph[name])
    return sorted(seen)


@functools.cache
def code_digest(module: str) -> str:
    """A digest of the source of ``module``'s :func:`closure` and the package version."""
    files = module_files()
    if module not in files:
        raise ValueError(f"cache key: {module!r} is not a module of rag_lab")
    texts = (f"{name}\0{files[name].read_text()}\0" for name in closure(module))
    return stream_digest([rag_lab.__version__, *texts])
