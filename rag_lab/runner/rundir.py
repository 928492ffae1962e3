"""A run directory's files besides records.jsonl: config.yaml, .hydra/, metrics.json, table.md / .csv.

``config.yaml`` doubles as a guard: a run started in a directory that holds the output of a
different config (records, metrics or checkpoints; other than batch size, resume flag and logger,
which cannot change results) is refused, since mixing the two would silently corrupt the metrics.
The guard runs before anything is written. That is why Hydra does not write ``.hydra/`` itself
here (``hydra.output_subdir: null`` in ``conf/config.yaml``): :func:`prepare` writes the same three
files (config, hydra, overrides) once the guard has passed, so a refused run leaves the old run's
labels as they were. With ``eval.resume=false`` the previous run's files are moved aside into
``replaced/<time>/`` instead of being deleted one by one, so a run that then fails leaves no
half-replaced directory behind.

One run per directory at a time (:func:`lock`): a run holds an exclusive lock on ``<run dir>/.lock``
until its process ends (the kernel drops it when the process dies, killed or not), and a second run
started in the same directory meanwhile is refused before it writes anything: two runs in one directory
would interleave their records under one label.
"""

import dataclasses
import fcntl
import json
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from rag_lab.core import cache
from rag_lab.core.errors import RagLabError
from rag_lab.core.records import atomic_write_json, atomic_write_text
from rag_lab.eval.table import metrics_table, to_markdown

log = logging.getLogger("rag_lab.run")

# Keys that may differ between a killed run and its resumption.
RESUMABLE_CHANGES = {"eval.batch_size", "eval.resume", "eval.reuse", "logger"}
# What a run writes into its directory (Hydra's run.log stays: it is open for this run's log).
RUN_FILES = [
    "config.yaml",
    ".hydra",
    "records.jsonl",
    "metrics.json",
    "table.md",
    "table.csv",
    "log.jsonl",
    "judge_cache.jsonl",
    "provenance.json",
    "checkpoints",
    "wandb",
]
# Files whose presence means the directory holds results of the config in config.yaml.
RESULTS = ["records.jsonl", "metrics.json", "checkpoints"]


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out |= _flatten(v, f"{prefix}.{k}" if prefix else str(k))
    return out


def changed_keys(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The flattened keys whose values differ, less those a resumed run may change."""
    old, new = _flatten(old), _flatten(new)
    return sorted(
        k
        for k in old.keys() | new.keys()
        if old.get(k) != new.get(k) and not any(k == r or k.startswith(r + ".") for r in RESUMABLE_CHANGES)
    )


def holds_results(run_dir: Path) -> bool:
    return any((run_dir / name).exists() for name in RESULTS)


def set_aside(run_dir: Path) -> Path | None:
    """Move a previous run's files into ``run_dir/replaced/<time>/``; returns that folder, if any."""
    present = [name for name in RUN_FILES if (run_dir / name).exists()]
    if not present:
        return None
    target = run_dir / "replaced" / time.strftime("%Y%m%d-%H%M%S")
    while target.exists():
        target = target.with_name(target.name + "+")
    target.mkdir(parents=True)
    for name in present:
        shutil.move(run_dir / name, target / name)
    return target


# run dir -> the open descriptor holding its lock (this process's runs; reused by a later run in it)
_LOCKS: dict[Path, int] = {}


def lock(run_dir: Path) -> None:
    """Hold ``run_dir``'s lock for the rest of this process, or refuse: another process holds it."""
    run_dir = Path(run_dir).resolve()
    if run_dir in _LOCKS:
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RagLabError(
            f"{run_dir} is in use by another run (it holds {run_dir / '.lock'}): wait for it to end, "
            "or give this run another hydra.run.dir"
        ) from None
    _LOCKS[run_dir] = fd


def prepare(run_dir: Path, cfg: DictConfig, hydra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Lock the directory (:func:`lock`), check it against the config, then write config.yaml (resolved)
    and ``.hydra/``.

    ``hydra`` holds what Hydra would have written into ``.hydra/`` (``config``, ``hydra``,
    ``overrides``: yaml-able objects); None outside ``@hydra.main`` (tests, notebooks).
    """
    lock(run_dir)
    config = OmegaConf.to_container(cfg, resolve=True)
    path = run_dir / "config.yaml"
    if cfg.eval.resume and path.exists() and holds_results(run_dir):
        changed = changed_keys(yaml.safe_load(path.read_text()) or {}, config)
        if changed:
            raise RagLabError(
                f"{run_dir} holds results of a different config (changed: {', '.join(changed[:5])}); "
                "use another hydra.run.dir, or eval.resume=false to set the old run aside and start over"
            )
    elif not cfg.eval.resume:
        moved = set_aside(run_dir)
        if moved is not None:
            log.warning("eval.resume=false: the previous run's files are now in %s", moved)
    atomic_write_text(path, OmegaConf.to_yaml(cfg, resolve=True))
    for name, obj in (hydra or {}).items():
        atomic_write_text(run_dir / ".hydra" / f"{name}.yaml", OmegaConf.to_yaml(obj))
    return config


def write_results(run_dir: Path, metrics: dict[str, dict]) -> str:
    """metrics.json, table.csv and table.md; returns the markdown table."""
    atomic_write_json(run_dir / "metrics.json", metrics)
    table = metrics_table(metrics)
    atomic_write_text(run_dir / "table.csv", table.to_csv(index=False))
    markdown = to_markdown(table)
    atomic_write_text(run_dir / "table.md", markdown)
    return markdown


# ---- provenance: what made a run's numbers ---------------------------------------------------------------
# A model file larger than this counts by name and size, not bytes, in the LM's fingerprint (a 7B model's
# 15 GB are not read at every run start; a hub snapshot is named by its commit anyway).
BIG_FILE = 64 << 20


def git_commit(root: Path) -> tuple[str | None, bool]:
    """The commit checked out at ``root`` and whether ``rag_lab/`` or ``conf/`` differ from it (tracked
    files); ``(None, False)`` outside a git checkout (an installed package)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=30
        )
        if head.returncode != 0:
            return None, False
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", "rag_lab", "conf"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None, False
    return head.stdout.strip(), bool(status.stdout.strip())


def lm_fingerprint(generator: Any) -> str:
    """The run's LM, named so that two runs with equal fingerprints generated with the same model: a model
    folder's files (``<name>@<16 hex>``: paths, sizes, and the bytes of every file up to :data:`BIG_FILE`);
    a generator without a model folder (the world teacher, a simulator) by its class and settings."""
    if generator is None:
        return "none"
    source = getattr(generator, "source", None)
    if source is not None and Path(source).is_dir():
        root = Path(source)
        return f"{root.name}@{cache.stream_digest(_model_files(root))[:16]}"
    settings = {
        k: v
        for k, v in sorted(getattr(generator, "__dict__", {}).items())
        if isinstance(v, (int, float, str, bool)) or dataclasses.is_dataclass(v)
    }
    blob = json.dumps([type(generator).__qualname__, settings], sort_keys=True, default=str)
    return f"{type(generator).__name__}@{cache.text_digest(blob)[:16]}"


def _model_files(root: Path) -> Iterator[bytes]:
    """What a model folder's fingerprint reads: each file's path and size, and its bytes up to
    :data:`BIG_FILE`."""
    for path in sorted(f for f in root.rglob("*") if f.is_file() and "__pycache__" not in f.parts):
        size = path.stat().st_size
        yield f"{path.relative_to(root)}\0{size}\0".encode()
        if size <= BIG_FILE:
            yield path.read_bytes()


def write_provenance(run_dir: Path, entry: dict[str, Any]) -> dict[str, Any]:
    """``provenance.json``: ``entry`` (commit, dirty, code, config, row_config, lm, split, seed, n) where the
    directory has none; where it has one (a resumed run), the first entry stays and a resumption whose
    commit, code or LM differ is listed under ``resumed``, so a reader can refuse a run of two versions."""
    path = run_dir / "provenance.json"
    old = json.loads(path.read_text()) if path.exists() and holds_results(run_dir) else None
    if old is None:
        record = entry
    else:
        record = old
        keys = ("commit", "code", "lm")
        if any(old.get(k) != entry.get(k) for k in keys):
            record = old | {
                "resumed": [*old.get("resumed", []), {k: entry.get(k) for k in (*keys, "started")}]
            }
    atomic_write_json(path, record)
    return record
