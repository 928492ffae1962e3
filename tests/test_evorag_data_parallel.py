"""EVO-RAG without a serial phase on rank 0 (issue 66): each process rolls out and branches its share of a
cycle's rollout batches and plays its share of the dev questions, and the results are gathered, so two
processes branch the same pairs, train on the same DPO rows and measure the same dev EM as one
(tests/evorag_data_parallel.py runs the cycle in 1 process, then in 2 forked from it)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rag_lab.train.parallel import my_units

from conftest import untrained_tiny_lm

HERE = Path(__file__).parent
SCRIPT = HERE / "evorag_data_parallel.py"


@pytest.mark.parametrize("processes", [1, 2, 3, 5])
def test_the_shares_of_the_processes_make_the_whole_once_in_order(processes):
    """Every unit of work, of 0 to 8, is one process's, and the main process's come first in each round."""
    for n in range(9):
        shares = [my_units(n, processes, r) for r in range(processes)]
        assert sorted(u for share in shares for u in share) == list(range(n))
        assert all(share == list(range(r, n, processes)) for r, share in enumerate(shares))
        assert sum(not share for share in shares) == max(processes - n, 0)  # those with nothing to do


@pytest.mark.slow
def test_two_processes_branch_train_and_measure_what_one_does(data, tmp_path):
    """One EVO-RAG cycle (6 questions in rollout batches of 2, 3 dev questions) in one process, then in two:
    process 0 plays batches 0 and 2 and dev questions 0 and 2, process 1 batch 1 and dev question 1; the
    branches (every node's prompt, branches and returns), the DPO rows, the dev EM, the cycle's counts are
    those of one process, and the trained policy and preference heads too (to DPO's rounding, as in
    test_data_parallel); a dev EM of one question, where process 1 has none, too. Six DPO rows in global
    batches of 2: a last batch short of the global one would be padded by accelerate under launch (its
    ``even_batches``), which one process does not do."""
    model = untrained_tiny_lm(data, ("evorag",), tmp_path / "lm")
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent), "CUDA_VISIBLE_DEVICES": ""}
    env.pop("WORLD_SIZE", None)
    command = [sys.executable, str(SCRIPT), str(model), str(tmp_path / "out"), "--fork", "2"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    one, two = tmp_path / "out" / "p1", tmp_path / "out" / "p2"

    def played(where: Path, rank: int) -> dict:
        return json.loads((where / f"played-{rank}.json").read_text())

    alone, first, second = played(one, 0), played(two, 0), played(two, 1)
    assert not (one / "played-1.json").exists() and len(alone["batches"]) == 3
    assert first["batches"] == [alone["batches"][0], alone["batches"][2]]
    assert second["batches"] == [alone["batches"][1]]
    # the lone question (dev-1) is process 0's; then the cycle's three, process 1 the second
    assert alone["dev"] == [["dev-1"], ["dev-0", "dev-1", "dev-2"]]
    assert first["dev"] == [["dev-1"], ["dev-0", "dev-2"]] and second["dev"] == [["dev-1"]]

    branches = json.loads((one / "branches.json").read_text())
    assert branches == json.loads((two / "branches.json").read_text())
    assert len(branches["nodes"]) == branches["counts"]["states"] == 6  # one node per episode, all 6
    assert [n["index"] for n in branches["nodes"]] == list(range(6))
    assert (one / "cycle" / "pairs.jsonl").read_text() == (two / "cycle" / "pairs.jsonl").read_text()
    assert (one / "cycle" / "pairs.jsonl").read_text().count("\n") == 6
    assert json.loads((one / "lone.json").read_text()) == json.loads((two / "lone.json").read_text()) == 1.0

    cycles = [json.loads((x / "cycle" / "cycle.json").read_text()) for x in (one, two)]
    assert cycles[0]["dev_em"] == cycles[1]["dev_em"] == pytest.approx(1 / 3)  # dev-1's gold is ""
    exact = [k for k in cycles[0] if k.startswith(("branch/", "rollout/", "dpo/")) or k == "pm/pairs"]
    assert {k: cycles[1][k] for k in exact} == {k: cycles[0][k] for k in exact}
    assert cycles[1]["pm/loss"] == pytest.approx(cycles[0]["pm/loss"], rel=1e-5)
    assert (cycles[0]["processes"], cycles[1]["processes"]) == (1, 2)
    wa, wb = (load_file(x / "cycle" / "model.safetensors") for x in (one, two))
    for key, value in wa.items():
        torch.testing.assert_close(wb[key], value, rtol=1e-4, atol=1e-5, msg=key)
    ha, hb = (torch.load(x / "heads.pt") for x in (one, two))
    for key, value in ha.items():
        torch.testing.assert_close(hb[key], value, rtol=1e-4, atol=1e-5, msg=key)


@pytest.mark.slow
def test_a_killed_two_process_evorag_run_resumes_to_the_uninterrupted_numbers(tiny_cfg, tmp_path):
    """``launch=cpu2`` EVO-RAG (one Discovery cycle: 4 questions in rollout batches of 2, DPO for 3 epochs)
    killed with SIGKILL once its DPO epoch has a checkpoint, then run again: it resumes from that checkpoint
    (the branches and the preference model's epoch from the cycle's work dir), and its trained weights, pairs
    and metrics are those of a run never killed."""
    from test_data_parallel import LAUNCHED

    from rag_lab.run import run

    from conftest import TINY_DATA, TINY_LM, killed_run

    overrides = [*TINY_DATA, *TINY_LM, "generator.reading_steps=4", "generator.tune_steps=2",
                 "experiment=evorag_synth", "hydra.mode=RUN", *LAUNCHED["evorag_synth"], "policy.stages=[1]",
                 "policy.questions_per_cycle=4", "policy.rollout_batch=2", "policy.dpo_epochs=3",
                 "policy.save_steps=1", "eval.limit=2", "launch=cpu2"]  # fmt: skip
    straight = run(tiny_cfg(*overrides, f"cache_dir={tmp_path / 'a'}"), tmp_path / "run_a")
    killed = [*overrides, f"cache_dir={tmp_path / 'b'}"]
    killed_run(
        killed, tmp_path / "run_b", "evorag/*.work/dpo/checkpoint-1/trainer_state.json", tmp_path / "b"
    )
    assert not list((tmp_path / "b").glob("evorag/*/cycle.json")), "killed after the cycle ended"
    resumed = run(tiny_cfg(*killed), tmp_path / "run_b")

    [a], [b] = (sorted((tmp_path / x).glob("evorag/*/cycle.json")) for x in "ab")
    wa, wb = (load_file(x.parent / "model.safetensors") for x in (a, b))
    for name, value in wa.items():
        torch.testing.assert_close(wb[name], value, rtol=0, atol=1e-6, msg=name)
    assert (a.parent / "pairs.jsonl").read_text() == (b.parent / "pairs.jsonl").read_text()
    assert resumed["all"] == straight["all"]
    cards = [json.loads(x.read_text()) for x in (a, b)]
    steps = cards[0]["dpo/steps"]
    assert cards[0]["dpo/resumed_from"] is None and 1 <= cards[1]["dpo/resumed_from"] < steps, cards
    assert cards[1]["processes"] == 2 and cards[1]["dev_em"] == cards[0]["dev_em"]
    rows = [json.loads(line) for line in (b.parent / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, steps + 1))  # each step logged once
