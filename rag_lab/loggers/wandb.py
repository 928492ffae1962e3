"""``logger=wandb``: metrics, the final table and per-question trajectories as a wandb Table.

With no API key in the environment the run is offline (``WANDB_MODE=offline``), so a run never
waits on the network; ``wandb sync <run_dir>/wandb/offline-run-*`` uploads it later. wandb's
own files (run, cache, data, config dirs) are kept inside the run directory.
"""

import os
from pathlib import Path
from typing import Any

import pandas as pd

# Trajectory columns shown in the wandb Table (the full records stay in records.jsonl).
TRAJECTORY_COLUMNS = ["id", "question", "answers", "prediction", "queries", "n_steps", "em", "f1", "acc"]


class WandbLogger:
    def __init__(
        self,
        run_dir: str,
        run_config: Any = None,
        project: str = "rag_lab",
        entity: str | None = None,
        name: str | None = None,
        group: str | None = None,
        tags: list[str] | None = None,
        # online / offline / disabled; null: online when WANDB_API_KEY is set, else offline.
        mode: str | None = None,
    ):
        import wandb

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
        self.run = wandb.init(
            project=project,
            entity=entity,
            name=name,
            group=group,
            tags=tags,
            mode=mode,
            dir=str(root),
            config=run_config,
            reinit="finish_previous",
        )
        self._wandb = wandb

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.run.log(metrics, step=step)

    def log_table(self, name: str, table: pd.DataFrame) -> None:
        self.run.log({name: self._wandb.Table(dataframe=table.astype(object).where(table.notna(), None))})

    def log_records(self, records: list[dict[str, Any]]) -> None:
        rows = [[_cell(r.get(c)) for c in TRAJECTORY_COLUMNS] for r in records]
        self.run.log({"trajectories": self._wandb.Table(columns=TRAJECTORY_COLUMNS, data=rows)})

    def finish(self) -> None:
        self.run.finish()


def _cell(value: Any) -> Any:
    return " | ".join(map(str, value)) if isinstance(value, list) else value
