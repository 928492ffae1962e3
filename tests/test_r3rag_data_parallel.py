"""R3-RAG's PPO data-parallel under accelerate, the slow set: two CPU processes started by ``accelerate
launch`` make the update of one (the forked twin of this test runs in tests/test_data_parallel.py with every
other trainer), and ``launch=cpu2`` trains a whole run's cold start and PPO in two processes."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

HERE = Path(__file__).parent
SCRIPT = HERE / "r3rag_data_parallel.py"


def launch(processes: int, model: str, out: Path, fork: bool = False) -> None:
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent), "CUDA_VISIBLE_DEVICES": ""}
    if processes == 1 or fork:
        command = [sys.executable, str(SCRIPT)]
    else:
        accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
        command = [
            accelerate,
            "launch",
            "--multi_gpu",
            f"--num_processes={processes}",
            "--num_machines=1",
            "--mixed_precision=no",
            "--dynamo_backend=no",
            "--main_process_port=0",
            str(SCRIPT),
        ]
    extra = ["--fork", str(processes)] if fork else []
    done = subprocess.run(
        [*command, model, str(out), *extra], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow
def test_two_processes_under_accelerate_launch_make_the_update_of_one(tiny_lm, tmp_path):
    """The same, with the two processes started by ``accelerate launch`` (its command line, its
    environment-variable rendezvous), as ``launch=cpu2`` starts them."""
    launch(1, tiny_lm, tmp_path / "one.pt")
    launch(2, tiny_lm, tmp_path / "two.pt")
    check_same_update(tiny_lm, tmp_path / "one.pt", tmp_path / "two.pt")


def check_same_update(tiny_lm: str, one_path: Path, two_path: Path) -> None:
    one, two = torch.load(one_path), torch.load(two_path)
    assert (one["processes"], two["processes"]) == (1, 2)
    for key, value in one["weights"].items():
        torch.testing.assert_close(two["weights"][key], value, rtol=1e-4, atol=1e-5, msg=key)
    for key in ("loss/policy", "loss/value", "kl", "clip_fraction", "ratio"):
        assert two["stats"][key] == pytest.approx(one["stats"][key], rel=1e-4, abs=1e-6), key
    # the update did something: the weights moved, and the clip bound on some tokens over three passes
    initial = AutoModelForCausalLM.from_pretrained(tiny_lm).state_dict()
    assert any(not torch.equal(one["weights"][f"lm.{k}"], v) for k, v in initial.items())
    assert one["stats"]["clip_fraction"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("launch", ["cpu2", "fsdp_cpu"])
def test_policy_launch_trains_ppo_as_a_two_process_job(launch, tiny_cfg, tmp_path):
    """``launch=cpu2``: the runner launches the training (the cold start's SFT, then PPO) under accelerate
    in two CPU processes (rag_lab.runner.launched), then finds the results and evaluates. ``launch=fsdp_cpu``:
    the same with every model sharded (FSDP2 over gloo): the rollouts generate on the sharded actor-critic,
    the processes in step; the checkpoints and results are the gathered full weights."""
    from rag_lab.run import run

    cfg = tiny_cfg(
        "experiment=r3rag_synth",
        "hydra.mode=RUN",
        "policy.cold_start.max_steps=2",
        "policy.cold_start.batch_size=2",
        "policy.ppo.iterations=2",
        "policy.ppo.batch_size=2",
        "policy.ppo.temperatures=[1.0]",
        "policy.ppo.minibatches=1",
        "policy.max_new_tokens=16",
        "policy.max_turns=2",
        f"launch={launch}",
        "eval.limit=2",
        f"cache_dir={tmp_path / 'cache'}",
    )
    metrics = run(cfg, tmp_path / "run")
    assert metrics["all"]["n"] == 2
    [trained] = (tmp_path / "cache" / "r3rag").glob("*/ppo.json")
    assert json.loads(trained.read_text())["processes"] == 2
    [cold] = (tmp_path / "cache" / "cold_start").glob("*/train.json")
    assert json.loads(cold.read_text())["sft"]["processes"] == 2
    assert (tmp_path / "run" / "launch" / "accelerate.yaml").exists()
    rows = [json.loads(line) for line in (tmp_path / "run" / "checkpoints" / "train_log.jsonl").open()]
    assert [r["step"] for r in rows if "heldout/acc" not in r] == [1, 2]  # PPO's rows
    assert [r["step"] for r in rows if "heldout/acc" in r] == [0, 1, 2]
