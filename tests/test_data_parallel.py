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


TRAINERS = ["sft", "dpo", "grpo", "qnet", "preference", "ppo"]


def test_two_processes_make_the_updates_of_one(tiny_lm, tmp_path):
    """Every trainer in one process, then in two forked from it (accelerate's debug launcher: gloo, the code
    path of ``accelerate launch`` without paying more interpreters' imports): one subprocess for all."""
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent), "CUDA_VISIBLE_DEVICES": ""}
    env.pop("WORLD_SIZE", None)
    command = [
        sys.executable,
        str(SCRIPT),
        ",".join(TRAINERS),
        tiny_lm,
        str(tmp_path / "work"),
        str(tmp_path / "out"),
    ]
    done = subprocess.run([*command, "--fork", "2"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    initial = AutoModelForCausalLM.from_pretrained(tiny_lm).state_dict()
    for trainer in TRAINERS:
        one, two = (torch.load(tmp_path / out / f"{trainer}.pt") for out in ("out", "out-2"))
        assert (one["processes"], two["processes"]) == (1, 2)
        for key, value in one["weights"].items():
            # Attention is invariant to the key projection's bias (it shifts every score of a query alike), so
            # its gradient is rounding noise, which Adam scales up to steps of the learning rate's size.
            atol = 1e-4 if key.endswith(("k_proj.bias", "key.bias")) else 1e-5
            torch.testing.assert_close(
                two["weights"][key], value, rtol=1e-4, atol=atol, msg=f"{trainer}: {key}"
            )
        assert two["stats"] == pytest.approx(one["stats"], rel=1e-4), trainer
        # it trained: weights moved from the tiny LM's (the Q-network counts its own)
        moved = one["stats"].get("moved") or sum(
            not torch.equal(one["weights"][k], v) for k, v in initial.items() if k in one["weights"]
        )
        assert moved, trainer
    ppo = torch.load(tmp_path / "out" / "ppo.pt")["stats"]
    assert ppo["clip_fraction"] > 0  # the clip bound on some tokens over PPO's three passes


# each method's paper-scale-free run under launch=cpu2: SHORT_TRAINING's sizes with two questions a step
LAUNCHED = {
    "dapo_synth": ["policy.steps=2", "policy.questions_per_step=2", "policy.group_size=2",
                   "policy.max_new_tokens=16", "policy.cold_start.limit=4", "policy.cold_start.max_steps=2"],
    "evorag_synth": ["policy.max_cycles=1", "policy.questions_per_cycle=2", "policy.states_per_episode=1",
                     "policy.dev_limit=2", "policy.max_turns=3", "policy.max_new_tokens=16",
                     "policy.batch_size=2", "policy.cold_start.limit=4", "policy.cold_start.max_steps=2"],
    "apex_synth": ["policy.planner.train_limit=4", "policy.planner.questions_per_step=2",
                   "policy.planner.group_size=2", "policy.planner.epochs=1",
                   "policy.planner.max_new_tokens=16", "policy.executor.limit=4",
                   "policy.executor.max_steps=2"],
    "stoprag_synth": ["policy.iterations=3", "policy.samples=2", "policy.train_limit=20", "policy.epochs=1",
                      "policy.dev_limit=4", "generator=teacher"],
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("experiment", sorted(LAUNCHED))
def test_a_method_trains_under_launch_cpu2(experiment, tiny_cfg, tmp_path):
    """``launch=cpu2``: the runner starts the method's whole training in two CPU processes
    (rag_lab.launched: the cold start's SFT and the method's own trainer), then finds the published
    results and evaluates; each published model says it was trained by two processes."""
    import json

    from rag_lab.run import run

    launch = ["launch=cpu2", "+launch.config.main_process_port=29535"]
    cfg = tiny_cfg(f"+experiment={experiment}", "hydra.mode=RUN", *LAUNCHED[experiment], *launch,
                   "eval.limit=2", f"cache_dir={tmp_path / 'cache'}")  # fmt: skip
    metrics = run(cfg, tmp_path / "run")
    assert metrics["all"]["n"] == 2
    # the trained models' cards (the tiny LM, the generator, was trained by the runner before the job)
    cache = tmp_path / "cache"
    trained = [
        p for p in [*cache.glob("*/*/train.json"), *cache.glob("*/*/cycle.json")] if p.parts[-3] != "tiny_lm"
    ]
    cards = {p.parts[-3]: json.loads(p.read_text()) for p in trained}
    if experiment == "stoprag_synth":  # no cold start; the fit's card
        cards = {"stoprag_fit": json.loads(next(cache.glob("stoprag_fit/*/stoprag.json")).read_text())}
    else:
        assert "cold_start" in cards and len(cards) >= 2, sorted(cards)
    assert all(c.get("processes", c.get("sft", {}).get("processes")) == 2 for c in cards.values()), cards
