"""The logger contract. The run directory's files are always written; a logger mirrors them."""

from pathlib import Path
from typing import Any, Protocol

import pandas as pd


class Logger(Protocol):
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None: ...

    def log_table(self, name: str, table: pd.DataFrame) -> None: ...

    def log_records(self, records: list[dict[str, Any]]) -> None:
        """Per-question trajectories (question, gold, prediction, queries, steps, scores)."""
        ...

    def log_image(self, name: str, path: str | Path) -> None:
        """A plot (png) the run wrote."""
        ...

    def finish(self) -> None: ...
