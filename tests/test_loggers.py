"""wandb runs offline without an API key, and keeps every file inside the run directory."""

import pandas as pd

from rag_lab.loggers.wandb import WandbLogger


def test_wandb_offline_without_api_key(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    logger = WandbLogger(run_dir=str(tmp_path), run_config={"seed": 0}, project="test")
    assert logger.run.settings.mode == "offline"
    logger.log_metrics({"em": 0.5, "f1": 0.6})
    logger.log_table("table", pd.DataFrame({"subset": ["all"], "EM": [50.0], "Ret P": [None]}))
    logger.log_records([{"id": "q1", "question": "Q?", "answers": ["A"], "prediction": "A", "queries": ["q"],
                         "n_steps": 1, "em": 1.0, "f1": 1.0, "acc": 1.0}])  # fmt: skip
    logger.finish()
    (offline,) = (tmp_path / "wandb").glob("offline-run-*")
    assert list(offline.glob("*.wandb"))
