"""``make quickstart`` (``rag-lab quickstart``): ``experiment=quickstart`` through the runner, its rows as the
docs describe them; the slow set runs it whole and checks that the trained row ends above its start."""

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from rag_lab import quickstart
from rag_lab.core.config import CONF_DIR

ROOT = Path(__file__).resolve().parents[1]
ROWS = ["direct", "standard_rag", "apex_start", "apex"]


def row(experiment: str, name: str, *more: str) -> dict:
    """One row of ``experiment`` composed as its sweep composes it (the row's override first), resolved."""
    cfg = hydra_compose("config", [f"experiment/{experiment}={name}", f"experiment={experiment}", *more])
    return OmegaConf.to_container(cfg, resolve=True)


def test_the_quickstart_rows_are_make_demos_shorter_as_the_docs_say():
    """Its rows, its trained row's start and mechanism, and each row's setting: make demo's row of the same
    name, but for the trained row's shorter planner training (the steps the docs name) and no held-out curve;
    the two APEX rows differ by plan RL alone. The README and the quickstart's docstring name those steps
    and the number of test questions."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose("config", ["experiment=quickstart"], return_hydra_config=True)
        rows = {name: row("quickstart", name) for name in ROWS}
        demo = {name: row("compare_synth", name) for name in ROWS}
        other = row("quickstart", "apex", "seed=5")
    assert cfg.hydra.sweeper.params["experiment/quickstart"].split(",") == ROWS
    table = instantiate(cfg.hydra.callbacks.compare)
    assert table.by == "experiment/quickstart" and table.starts == {"apex": "apex_start"}
    assert table.mechanisms == {"apex": {"metric": "sepr", "against": "apex_start"}}

    for name in ROWS:
        assert (rows[name]["eval"]["split"], rows[name]["eval"]["limit"]) == ("test", cfg.eval.limit)
        for key in ("data", "retriever", "generator"):
            assert rows[name][key] == demo[name][key], (name, key)
    for name in ("direct", "standard_rag"):
        assert rows[name]["policy"] == demo[name]["policy"]
    planner, demo_planner = rows["apex"]["policy"]["planner"], demo["apex"]["policy"]["planner"]
    assert {k for k in planner if planner[k] != demo_planner[k]} == {"train_limit"}
    assert rows["apex"]["policy"]["heldout"]["n"] == 0
    same = {k: v for k, v in rows["apex"]["policy"].items() if k not in ("planner", "heldout")}
    assert same == {k: v for k, v in demo["apex"]["policy"].items() if k not in ("planner", "heldout")}
    # the executor is the shipped one (seed 0's SFT) whatever the run's seed
    assert other["seed"] == 5 and other["policy"]["executor"]["seed"] == 0
    start = rows["apex_start"]["policy"]
    assert {k for k in start if start[k] != rows["apex"]["policy"][k]} == {"plan_rl"}
    assert start["plan_rl"] is False and rows["apex"]["policy"]["plan_rl"] is True

    steps = planner["train_limit"] * planner["epochs"] / planner["questions_per_step"]
    said = f"{steps:g} GRPO steps", f"{cfg.eval.limit} test questions"
    for doc in ((ROOT / "README.md").read_text(), quickstart.__doc__):
        assert all(words in " ".join(doc.split()) for words in said), said


def test_main_runs_the_runner_with_the_experiment_and_the_users_overrides(monkeypatch):
    """``rag-lab quickstart seed=1`` is ``python -m rag_lab.run experiment=quickstart
    hydra.sweep.dir=outputs/quickstart seed=1``; a sweep dir given wins; ``sys.argv`` comes back as it was."""
    ran = []
    monkeypatch.setattr(runpy, "run_module", lambda name, **kw: ran.append((name, kw, sys.argv[1:])))
    monkeypatch.setattr(sys, "argv", ["rag-lab", "x"])
    quickstart.main(["seed=1"])
    quickstart.main(["hydra.sweep.dir=/tmp/elsewhere"])
    assert [name for name, _, _ in ran] == ["rag_lab.run"] * 2
    assert ran[0][1] == {"run_name": "__main__", "alter_sys": True}
    assert ran[0][2] == ["experiment=quickstart", "hydra.sweep.dir=outputs/quickstart", "seed=1"]
    assert ran[1][2] == ["experiment=quickstart", "hydra.sweep.dir=/tmp/elsewhere"]
    assert sys.argv == ["rag-lab", "x"]


@pytest.mark.slow
def test_the_quickstart_runs_whole_and_its_trained_row_ends_above_its_start(tmp_path):
    """From an empty cache, as a user runs it: the table is printed at the end, and the trained planner's Acc
    is above its start's with the paired bootstrap's 95% interval above 0 (seed 0, deterministic)."""
    env = os.environ | {"RAG_LAB_CACHE": str(tmp_path / "cache"), "MPLBACKEND": "Agg"}
    command = [sys.executable, "-m", "rag_lab.quickstart", f"hydra.sweep.dir={tmp_path}/q"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.rstrip().endswith(f"table: {tmp_path}/q/compare.md; plot: {tmp_path}/q/pareto.png")
    table = pd.read_csv(tmp_path / "q" / "compare.csv").set_index("method")
    assert list(table.index) == ROWS and (table["N"] == 200).all()
    apex = table.loc["apex"]
    assert apex["acc"] > table.loc["apex_start", "acc"] and apex["s_low"] > 0, apex.to_dict()
    assert apex["s"] == pytest.approx(apex["acc"] - table.loc["apex_start", "acc"])
