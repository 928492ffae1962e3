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


def test_wandb_groups_by_experiment_and_logs_steps_and_plots_offline(tmp_path, monkeypatch):
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    monkeypatch.setenv("WANDB_MODE", "offline")
    config = {"seed": 0, "experiment": {"name": "compare_synth"}}
    logger = WandbLogger(run_dir=str(tmp_path), run_config=config, project="test")
    assert logger.run.group == "compare_synth"
    steps = [{"action": "search", "query": "who", "retrieved_ids": ["p1", "p2"], "rewards": {"f1": 0.5}},
             {"action": "answer", "answer": "A", "rewards": {}}]  # fmt: skip
    logger.log_records([{"id": "q1", "question": "Q?", "answers": ["A"], "prediction": "A", "steps": steps,
                         "stop_reason": "answer", "n_steps": 2, "em": 1.0}])  # fmt: skip
    plt.plot([0, 1], [1, 0])
    plt.savefig(tmp_path / "curves.png")
    logger.log_image("curves", tmp_path / "curves.png")
    logger.finish()
    (offline,) = (tmp_path / "wandb").glob("offline-run-*")
    tables = {p.name.split("_")[0]: json.loads(p.read_text()) for p in offline.rglob("*.table.json")}
    assert tables["trajectories"]["columns"][:4] == ["id", "step", "action", "query"]
    assert [row[:4] for row in tables["trajectories"]["data"]] == [
        ["q1", 0, "search", "who"],
        ["q1", 1, "answer", None],
    ]
    assert tables["trajectories"]["data"][0][4] == "p1 | p2" and tables["answers"]["data"][0][4] == "answer"
    assert list(offline.rglob("curves*.png"))
