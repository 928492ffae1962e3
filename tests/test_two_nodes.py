"""Two nodes on one machine (issue 66): a Slurm job of two nodes, as rag_lab.runner.launch starts it
(``Launch.on_cluster`` from the job's variables; node 0 ``run_job``, node 1 ``follow``), each node one
``accelerate launch`` of one process, ``machine_rank`` 0 and 1, meeting at 127.0.0.1 over gloo."""

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from transformers import AutoModelForCausalLM

from rag_lab.core.config import compose
from rag_lab.runner.launch import Launch

HERE = Path(__file__).parent


def nodes(port: int) -> tuple[Launch, Launch]:
    """Node 0's and node 1's launch of ``launch=cpu2`` on two machines (one process each), as each node's
    runner makes it from the variables Slurm sets in its task."""
    overrides = ["launch=cpu2", "launch.config.num_machines=2", f"+launch.config.main_process_port={port}"]
    launch = instantiate(compose([*overrides, "launch.timeout_s=120"]).launch)
    job = {"SLURM_JOB_ID": "66", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "127.0.0.1"}
    return tuple(launch.on_cluster(job | {"SLURM_NODEID": str(rank)}) for rank in (0, 1))


def both(first: Launch, second: Launch, module: str, job: dict, work: Path) -> None:
    """Node 1 follows (a thread: it waits for node 0's job.json of the same Slurm job), node 0 runs the job;
    both ``accelerate launch`` commands run at once; an error of either is raised here."""
    errors = []

    def follow() -> None:
        try:
            second.follow(module, work, timeout=120, poll=0.1)
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            errors.append(e)

    follower = threading.Thread(target=follow)
    follower.start()
    try:
        first.run_job(module, job, work)
    finally:
        follower.join(timeout=300)
    assert not follower.is_alive()
    if errors:
        raise errors[0]


def test_each_node_runs_accelerate_with_its_rank_and_the_first_nodes_address(
    launch_port, tmp_path, monkeypatch
):
    """The commands the two nodes run, read by accelerate's own launcher: torchrun's nodes, this node's
    rank, one process a node, node 0's address and port."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    ran = []
    monkeypatch.setattr(
        subprocess, "run", lambda command, env: ran.append(command) or subprocess.CompletedProcess(command, 0)
    )
    monkeypatch.setenv("SLURM_JOB_ID", "66")
    port = launch_port  # named: node 1 meets node 0 there
    first, second = nodes(port)
    both(first, second, "launched_two_nodes", {"trainers": "sft"}, tmp_path / "launch")
    by_config = {command[3]: command for command in ran}
    assert sorted(by_config) == [
        str(tmp_path / "launch" / "accelerate.yaml"),
        str(tmp_path / "launch" / "node1" / "accelerate.yaml"),
    ]
    for rank, config in enumerate(sorted(by_config)):
        command = by_config[config]
        assert command[1:3] == ["launch", "--config_file"] and command[-3:] == [
            "-m",
            "launched_two_nodes",
            str(tmp_path / "launch" / "job.json"),
        ]
        args = launch_command_parser().parse_args(command[2:])
        _validate_launch_command(args)  # the config file's keys, as accelerate launch reads them
        prepare_multi_gpu_env(args)  # torchrun's arguments, into args
        assert (args.nnodes, args.node_rank, args.nproc_per_node) == ("2", rank, "1")
        # torchrun's rendezvous at node 0 (accelerate reads no same_network from a config file)
        assert (args.rdzv_backend, args.rdzv_endpoint) == ("static", f"127.0.0.1:{port}")
        assert args.multi_gpu and not args.cpu  # torchrun's launcher, as for launch=cpu2 on one machine


@pytest.mark.slow
def test_two_nodes_make_the_update_of_one_process(launch_port, tiny_lm, tmp_path, monkeypatch):
    """The cold start's SFT (TRL's SFTTrainer, tests/data_parallel.py's ``sft``: 3 steps of a global batch
    of 4) on two nodes of one process each equals the same SFT in one process."""
    env = {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "SLURM_JOB_ID": "66"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), str(HERE.parent)]))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    one = [
        sys.executable,
        str(HERE / "data_parallel.py"),
        "sft",
        tiny_lm,
        str(tmp_path / "w1"),
        str(tmp_path / "one"),
    ]
    done = subprocess.run(one, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

    (tmp_path / "two").mkdir()
    job = {
        "trainers": "sft",
        "model_dir": tiny_lm,
        "work": str(tmp_path / "w2"),
        "out": str(tmp_path / "two"),
    }
    first, second = nodes(launch_port)
    both(first, second, "launched_two_nodes", job, tmp_path / "launch")
    one, two = (torch.load(tmp_path / out / "sft.pt") for out in ("one", "two"))
    assert (one["processes"], two["processes"]) == (1, 2)
    assert sorted((tmp_path / "launch" / "ranks").glob("*.json")) == [
        tmp_path / "launch" / "ranks" / "rank0.json"
    ]
    assert [p.name for p in (tmp_path / "launch" / "node1" / "ranks").glob("*.json")] == ["rank1.json"]
    for key, value in one["weights"].items():
        torch.testing.assert_close(two["weights"][key], value, rtol=1e-4, atol=1e-5, msg=key)
    assert two["stats"] == pytest.approx(one["stats"], rel=1e-4)
    initial = AutoModelForCausalLM.from_pretrained(tiny_lm).state_dict()
    assert any(not torch.equal(one["weights"][k], v) for k, v in initial.items())  # it trained
