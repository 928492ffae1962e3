"""Sweeps over rows of different policies, and runs keyed by their config's hash.

**A method's setting in a sweep of rows.** ``python -m rag_lab.run -m experiment=stoprag_synth
policy.lambda_end=0.1,0.3,0.5`` sweeps Stop-RAG's λ over an experiment whose rows are three policies;
``fixed_iter`` and ``llm_stop`` have no ``lambda_end``, and Hydra would refuse the override for them
(a key not in the config). In a multirun, :func:`soften` turns each ``group.key=value`` override of a
component (``policy.``, ``reward.``, ``generator.``, ``retriever.``, ``judge.``) into Hydra's
``++group.key=value`` (set or add); in the job, :func:`drop_inapplicable` removes such a key again where the
component's schema has no such setting, and the job's log names it (``...: not a setting of this job's
component, left out``): a key that no row takes, a typo, is left out of every job, so read those lines; a
single run keeps Hydra's strict behaviour (an unknown key is an error).

**Runs keyed by the config's hash.** :func:`config_hash` hashes the resolved config without what cannot
change results (logger, batch size, resume / reuse flags, cache dir) together with the code and files of the
``rag_lab`` package. A finished run registers its directory under ``<cache_dir>/runs/<hash>.json``; a later
run of the same hash (the λ sweep's three ``fixed_iter`` jobs, a rerun of a sweep) copies its results
instead of running again (:func:`reuse`), unless ``eval.reuse=false``.
"""

import dataclasses
import functools
import json
import logging
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf, open_dict

import rag_lab
from rag_lab import CONF_DIR
from rag_lab.core import cache
from rag_lab.core.records import atomic_write_json
from rag_lab.eval.runs import results_config

log = logging.getLogger("rag_lab.run")

SOFT_GROUPS = ("policy.", "reward.", "generator.", "retriever.", "judge.")
# Files a reused run gets from the run it reuses.
RESULT_FILES = ("records.jsonl", "metrics.json", "table.md", "table.csv", "provenance.json")


def is_multirun(argv: Sequence[str], conf_dir: Path = CONF_DIR) -> bool:
    """``-m`` / ``--multirun``, or an ``experiment=`` whose file sets ``hydra.mode: MULTIRUN``."""
    if "-m" in argv or "--multirun" in argv:
        return True
    for arg in argv:
        key, _, value = arg.lstrip("+").partition("=")
        path = conf_dir / "experiment" / f"{value}.yaml"
        if key == "experiment" and path.exists():
            mode = ((yaml.safe_load(path.read_text()) or {}).get("hydra") or {}).get("mode")
            if mode == "MULTIRUN":
                return True
    return False


def soften(argv: list[str], conf_dir: Path = CONF_DIR) -> list[str]:
    """In a multirun, ``group.key=value`` overrides of components as ``++group.key=value``."""
    if not is_multirun(argv, conf_dir):
        return argv
    return [f"++{a}" if a.startswith(SOFT_GROUPS) and "=" in a else a for a in argv]


def _owner(cfg: DictConfig, parts: list[str]) -> int | None:
    """The depth of the nearest node above ``parts`` (below the root) holding a ``_target_``: the component
    the key belongs to; None when there is none (the group has no component in this job)."""
    for depth in range(len(parts) - 1, 0, -1):
        node = OmegaConf.select(cfg, ".".join(parts[:depth]))
        if isinstance(node, DictConfig) and "_target_" in node:
            return depth
    return None


def drop_inapplicable(cfg: DictConfig, overrides: Sequence[str]) -> list[str]:
    """Remove what ``++`` overrides of components set where the component does not take it (the field
    below it is not in its ``_target_``'s schema: ``policy.lambda_end`` on ``fixed_iter``, the whole
    ``policy.ppo`` node that ``policy.ppo.batch_size`` made there); a group that has no component in this
    job (``reward.beta`` with a policy that takes no reward) goes back to null. Returns the overrides left
    out."""
    from rag_lab.core.config import schema_for

    dropped = []
    for override in overrides:
        key = override.removeprefix("++").partition("=")[0]
        if not override.startswith("++") or not key.startswith(SOFT_GROUPS):
            continue
        parts = key.split(".")
        depth = _owner(cfg, parts)
        with open_dict(cfg):
            if depth is None:
                OmegaConf.update(cfg, parts[0], None, merge=False)
            else:
                owner = OmegaConf.select(cfg, ".".join(parts[:depth]))
                schema = schema_for(owner._target_)
                if schema is dict or parts[depth] in {f.name for f in dataclasses.fields(schema)}:
                    continue
                if parts[depth] in owner:  # (an earlier override's node may have gone already)
                    del owner[parts[depth]]
        dropped.append(override[2:])
    return dropped


@functools.cache
def package_digest(root: Path = Path(rag_lab.__file__).parent) -> str:
    """The digest of every file of the ``rag_lab`` package (code, shipped checkpoint), read once per process
    (a sweep's jobs share it). Not :func:`rag_lab.core.cache.files_digest`: that one counts ``__pycache__``,
    which Python writes as modules are first imported, so the same code would hash differently."""

    def chunks() -> Iterator[bytes]:
        for path in sorted(root.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                yield str(path.relative_to(root)).encode()
                yield path.read_bytes()

    return cache.stream_digest(chunks())


def config_hash(config: dict[str, Any]) -> str:
    """16 hex digits: the resolved config less what cannot change results (``results_config``), and the
    package's files."""
    text = json.dumps(results_config(config), sort_keys=True) + package_digest()
    return cache.text_digest(text)[:16]


def code_hash() -> str:
    """16 hex digits of :func:`package_digest`: the package's code and shipped checkpoints."""
    return package_digest()[:16]


def _registry(cache_dir: str) -> Path:
    return Path(cache_dir).expanduser() / "runs"


def reuse(run_dir: Path, digest: str, cache_dir: str) -> Path | None:
    """Copy the results of the finished run registered under ``digest`` into ``run_dir``; returns that
    run's directory, or None (none registered, gone, unfinished, this very directory, or a directory that
    now holds another config's run: a registry entry outlives the files it names)."""
    entry = _registry(cache_dir) / f"{digest}.json"
    if not entry.exists():
        return None
    source = Path(json.loads(entry.read_text())["run_dir"])
    if source.resolve() == run_dir.resolve() or not all((source / f).exists() for f in RESULT_FILES[:2]):
        return None
    if config_hash(yaml.safe_load((source / "config.yaml").read_text()) or {}) != digest:
        log.info("config %s: %s now holds another config's run; not reused", digest, source)
        return None
    for name in RESULT_FILES:
        if (source / name).exists():
            shutil.copy2(source / name, run_dir / name)
    atomic_write_json(run_dir / "reused.json", {"from": str(source), "config_hash": digest})
    return source


def register(run_dir: Path, digest: str, cache_dir: str) -> None:
    """Record ``run_dir`` as the finished run of ``digest``."""
    atomic_write_json(_registry(cache_dir) / f"{digest}.json", {"run_dir": str(run_dir.resolve())})
