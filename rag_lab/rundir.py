"""A run directory's files besides records.jsonl: config.yaml, metrics.json, table.md / table.csv.

``config.yaml`` doubles as a guard: a run resumed in a directory whose records came from a
different config (other than batch size, resume flag and logger, which cannot change results)
is refused, since mixing the two would silently corrupt the metrics.
"""

from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from rag_lab.errors import RagLabError
from rag_lab.eval.table import metrics_table, to_markdown
from rag_lab.records import atomic_write_json, atomic_write_text

# Keys that may differ between a killed run and its resumption.
RESUMABLE_CHANGES = {"eval.batch_size", "eval.resume", "logger"}


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out |= _flatten(v, f"{prefix}.{k}" if prefix else str(k))
    return out


def prepare(run_dir: Path, cfg: DictConfig) -> dict[str, Any]:
    """Write config.yaml (resolved); refuse to resume over records of a different config."""
    config = OmegaConf.to_container(cfg, resolve=True)
    path = run_dir / "config.yaml"
    if path.exists() and (run_dir / "records.jsonl").exists() and cfg.eval.resume:
        old, new = _flatten(yaml.safe_load(path.read_text())), _flatten(config)
        changed = sorted(
            k
            for k in old.keys() | new.keys()
            if old.get(k) != new.get(k)
            and not any(k == r or k.startswith(r + ".") for r in RESUMABLE_CHANGES)
        )
        if changed:
            raise RagLabError(
                f"{run_dir} holds records of a different config (changed: {', '.join(changed[:5])}); "
                "use another hydra.run.dir, or eval.resume=false to start over"
            )
    atomic_write_text(path, OmegaConf.to_yaml(cfg, resolve=True))
    return config


def write_results(run_dir: Path, metrics: dict[str, dict]) -> str:
    """metrics.json, table.csv and table.md; returns the markdown table."""
    atomic_write_json(run_dir / "metrics.json", metrics)
    table = metrics_table(metrics)
    atomic_write_text(run_dir / "table.csv", table.to_csv(index=False))
    markdown = to_markdown(table)
    atomic_write_text(run_dir / "table.md", markdown)
    return markdown
