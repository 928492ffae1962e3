"""``logger=local``: training curves appended to ``<run_dir>/log.jsonl``; nothing leaves the machine."""

import json
import time
from pathlib import Path
from typing import Any

import pandas as pd

from rag_lab.core.records import RecordWriter


class LocalLogger:
    def __init__(
        self,
        # the run directory (the runner passes it)
        run_dir: str,
        run_config: Any = None,
    ):
        self.writer = RecordWriter(Path(run_dir) / "log.jsonl")

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.writer.write(
            [{"time": time.time(), "step": step} | json.loads(json.dumps(metrics, default=str))]
        )

    def log_table(self, name: str, table: pd.DataFrame) -> None:
        """Tables already live in the run dir (table.md / table.csv)."""

    def log_records(self, records: list[dict[str, Any]]) -> None:
        """Records already live in the run dir (records.jsonl)."""

    def log_image(self, name: str, path: str | Path) -> None:
        """Plots already live in the run dir."""

    def finish(self) -> None:
        pass
