"""Every data-parallel trainer (issue 50): two CPU processes (gloo), each with half of every global batch,
make the same update as one process with all of it (tests/data_parallel.py runs the trainer)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

HERE = Path(__file__).parent
SCRIPT = HERE / "data_parallel.py"


def one_and_two(trainer: str, model: str, tmp_path: Path) -> tuple[dict, dict]:
    """One process, then two forked from it (accelerate's debug launcher: gloo, the code path of
    ``accelerate launch`` without paying two more interpreters' imports)."""
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent), "CUDA_VISIBLE_DEVICES": ""}
    env.pop("WORLD_SIZE", None)
    command = [sys.executable, str(SCRIPT), trainer, model, str(tmp_path / "work"), str(tmp_path / "one.pt")]
    done = subprocess.run([*command, "--fork", "2"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "one.fork.pt")
    assert (one["processes"], two["processes"]) == (1, 2)
    return one, two


@pytest.mark.parametrize("trainer", ["sft"])
def test_two_processes_make_the_updates_of_one(trainer, tiny_lm, tmp_path):
    one, two = one_and_two(trainer, tiny_lm, tmp_path)
    for key, value in one["weights"].items():
        torch.testing.assert_close(two["weights"][key], value, rtol=1e-4, atol=1e-5, msg=key)
    assert two["stats"]["loss"] == pytest.approx(one["stats"]["loss"], rel=1e-4)
    initial = AutoModelForCausalLM.from_pretrained(tiny_lm).state_dict()
    assert any(not torch.equal(one["weights"][k], v) for k, v in initial.items())  # it trained
