"""``logger=wandb``: metrics, the final table, per-question answers and per-step trajectories as wandb
Tables, plots as images; one wandb run per job, grouped by the experiment (``experiment.name``) and named by
the job's overrides.

With no API key in the environment the run is offline (``WANDB_MODE=offline``), so a run never
waits on the network; ``wandb sync <run_dir>/wandb/offline-run-*`` uploads it later. wandb's
own files (run, cache, data, config dirs) are kept inside the run directory.

wandb is the ``wandb`` extra (``pip install 'rag_lab[wandb]'``; ``make install`` holds it): without it,
``logger=wandb`` is one line at compose time, before anything trains.
"""

import os
from pathlib import Path
from typing import Any

import pandas as pd

from rag_lab.core.extras import check_installed, require

# Per-question columns of the "answers" Table (the full records stay in records.jsonl).
ANSWER_COLUMNS = "id question answers prediction stop_reason n_steps retrieval_count em f1 acc".split()
# Per-step columns of the "trajectories" Table: what the policy did at each step of each question.
STEP_COLUMNS = ["id", "step", "action", "query", "retrieved_ids", "answer", "rewards", "error", "text"]


class WandbLogger:
    def __init__(
        self,
        # the run directory (the runner passes it); offline runs are written under <run_dir>/wandb/
        run_dir: str,
        run_config: Any = None,
        # wandb's own run settings (null: wandb's defaults)
        project: str = "rag_lab",
        entity: str | None = None,
        name: str | None = None,
        group: str | None = None,
        tags: list[str] | None = None,
        # online / offline / disabled; null: online when WANDB_API_KEY is set, else offline.
        mode: str | None = None,
    ):
        wandb = require("wandb", "logger=wandb")
        root = Path(run_dir)
        for var, sub in [
            ("WANDB_CACHE_DIR", "cache"),
            ("WANDB_DATA_DIR", "data"),
            ("WANDB_CONFIG_DIR", "config"),
        ]:
            os.environ.setdefault(var, str(root / "wandb" / sub))
        mode = (
            mode
            or os.environ.get("WANDB_MODE")
            or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        )
        experiment = (run_config.get("experiment") or {}) if isinstance(run_config, dict) else {}
        self.run = wandb.init(
            project=project,
            entity=entity,
            name=name or _job_name(),
            group=group or experiment.get("name"),
            tags=tags,
            mode=mode,
            dir=str(root),
            config=run_config,
            reinit="finish_previous",
        )
        self._wandb = wandb

    @staticmethod
    def check_settings(s: dict, run) -> list[tuple[str, str]]:
        """At compose time: wandb is installed (the ``wandb`` extra)."""
        check_installed("wandb", "logger=wandb")
        return []

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.run.log(metrics, step=step)

    def log_table(self, name: str, table: pd.DataFrame) -> None:
        self.run.log({name: self._wandb.Table(dataframe=table.astype(object).where(table.notna(), None))})

    def log_records(self, records: list[dict[str, Any]]) -> None:
        answers = [[_cell(r.get(c)) for c in ANSWER_COLUMNS] for r in records]
        steps = [
            [r.get("id"), i] + [_cell(step.get(c)) for c in STEP_COLUMNS[2:]]
            for r in records
            for i, step in enumerate(r.get("steps") or [])
        ]
        self.run.log(
            {
                "answers": self._wandb.Table(columns=ANSWER_COLUMNS, data=answers),
                "trajectories": self._wandb.Table(columns=STEP_COLUMNS, data=steps),
            }
        )

    def log_image(self, name: str, path: str | Path) -> None:
        self.run.log({name: self._wandb.Image(str(path))})

    def finish(self) -> None:
        self.run.finish()


def _cell(value: Any) -> Any:
    if isinstance(value, dict):
        return " | ".join(f"{k}={v}" for k, v in value.items())
    return " | ".join(map(str, value)) if isinstance(value, list) else value


def _job_name() -> str | None:
    """The Hydra job's overrides as a name (``policy.k=5,seed=1``), outside Hydra None."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    job = HydraConfig.get().job
    return job.override_dirname or job.name
