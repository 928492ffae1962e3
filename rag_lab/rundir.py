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
"""

import logging
import shutil
import time
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from rag_lab.errors import RagLabError
from rag_lab.eval.table import metrics_table, to_markdown
from rag_lab.records import atomic_write_json, atomic_write_text

log = logging.getLogger("rag_lab.run")

# Keys that may differ between a killed run and its resumption.
RESUMABLE_CHANGES = {"eval.batch_size", "eval.resume", "logger"}
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


def prepare(run_dir: Path, cfg: DictConfig, hydra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Check the directory against the config, then write config.yaml (resolved) and ``.hydra/``.

    ``hydra`` holds what Hydra would have written into ``.hydra/`` (``config``, ``hydra``,
    ``overrides``: yaml-able objects); None outside ``@hydra.main`` (tests, notebooks).
    """
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
