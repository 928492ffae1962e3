"""Shared fixtures: every cache, wandb and matplotlib file goes under pytest's tmp dirs; offline."""

import os
from pathlib import Path

import pytest

from rag_lab.config import compose

# A world small enough for a sub-second end-to-end run.
TINY_DATA = [
    "data.n_people=60",
    "data.n_cities=12",
    "data.n_countries=4",
    "data.n_films=20",
    "data.dev_size=20",
    "data.test_size=40",
]


@pytest.fixture(scope="session", autouse=True)
def _isolated_env(tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("env")
    os.environ["RAG_LAB_CACHE"] = str(root / "cache")
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ["MPLCONFIGDIR"] = str(root / "mpl")
    os.environ.pop("WANDB_API_KEY", None)
    for var in ["WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_CONFIG_DIR"]:
        os.environ[var] = str(root / var.lower())


@pytest.fixture
def tiny_cfg():
    """Compose the real config tree on the tiny world; extra overrides as arguments."""

    def make(*overrides: str):
        other_data = any(o.startswith("data=") and o != "data=synth" for o in overrides)
        return compose([*([] if other_data else TINY_DATA), *overrides])

    return make


@pytest.fixture
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent
