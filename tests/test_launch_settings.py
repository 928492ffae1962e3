"""Every ``launch`` setting reaches the launched processes, each launched run takes a free port, and the
launched processes evaluate (issue 72): read inside the processes a ``python -m rag_lab.run`` starts."""

import json
import os
from pathlib import Path

import pytest
import yaml
from hydra.utils import instantiate

from rag_lab.core.config import compose, group_options
from rag_lab.runner.launch import Launch, job_port, launch_of, resolve

from conftest import TINY_DATA, cli

HERE = Path(__file__).parent


class LaunchWithMemory(Launch):
    """A launch with a key of its own, as a later setting of the group would add one."""

    def __init__(self, config: dict, gpu_memory_gib: float = 80.0, **settings):
        super().__init__(config, **settings)
        self.gpu_memory_gib = gpu_memory_gib


def runs_launch(*overrides: str) -> tuple[Launch, Launch]:
    """(the launch the runner uses: ``launch_of`` of the run's resolved config, the node instantiated)."""
    from omegaconf import OmegaConf

    cfg = compose(list(overrides))
    return launch_of({"launch": OmegaConf.to_container(cfg.launch, resolve=True)}), instantiate(cfg.launch)


@pytest.mark.parametrize("option", group_options("launch"))
def test_the_runners_launch_keeps_every_key_of_the_node(option):
    """``launch_of`` (what the runner launches with) holds every setting the composed node holds: the
    overridden timeout, gradient checkpointing, the program, accelerate's config."""
    flipped = str(not compose([f"launch={option}"]).launch.gradient_checkpointing).lower()
    overrides = [f"launch={option}", "launch.timeout_s=77", f"launch.gradient_checkpointing={flipped}",
                 "launch.program=accelerate", "launch.config.num_processes=4"]  # fmt: skip
    ours, node = runs_launch(*overrides)
    assert vars(ours) == vars(node)
    assert (ours.timeout_s, ours.gradient_checkpointing, ours.processes) == (77, flipped == "true", 4)


def test_a_key_added_to_the_launch_later_reaches_it_too():
    ours, _ = runs_launch("launch=cpu2", "launch._target_=test_launch_settings.LaunchWithMemory",
                          "+launch.gpu_memory_gib=70", "launch.timeout_s=60")  # fmt: skip
    assert type(ours) is LaunchWithMemory and (ours.gpu_memory_gib, ours.timeout_s) == (70, 60)
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1",
             "SLURM_JOB_NODELIST": "gpu[1-2]"}  # fmt: skip
    node = ours.on_cluster(slurm)  # node 1 of a Slurm job: every setting kept, its rank and node 0's port
    assert (node.gpu_memory_gib, node.timeout_s, node.config["machine_rank"]) == (70, 60, 1)
    assert node.config["main_process_port"] == job_port("4242") == 29742


def accelerates_port(launch: Launch, tmp_path: Path) -> int:
    """The rendezvous port ``accelerate launch`` takes from the config file the launch writes."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    command = launch.command(launch.write_config(tmp_path / "accelerate.yaml"), "rag_lab.runner.launched")
    args = launch_command_parser().parse_args([*command[2:], "job.json"])
    _validate_launch_command(args)
    prepare_multi_gpu_env(args)
    return int(args.master_port)


def test_a_launched_run_on_one_machine_takes_a_free_port_unless_the_config_names_one(tmp_path):
    """Two launched runs on one machine (a sweep's) never meet on accelerate's default port: with none named,
    accelerate picks a free one for each (from the ephemeral range, never 29500); a named port is kept."""
    import socket

    launch = instantiate(compose(["launch=cpu2"]).launch)
    assert "main_process_port" not in launch.config
    port = accelerates_port(launch, tmp_path)
    assert port != 29500
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free
    named = instantiate(compose(["launch=cpu2", "+launch.config.main_process_port=29611"]).launch)
    assert accelerates_port(named, tmp_path) == 29611


REPORT = "_target_: launched_report.Reporting\nmodel: ???\nout: ???\ntrain: false\n"


def runs(tmp_path: Path, tiny_lm: str, capfd, monkeypatch, name: str, *overrides: str) -> Path:
    """``python -m rag_lab.run policy=report ...`` (tests/launched_report.py, from a yaml on the search path)
    on 6 test questions in batches of 2; its run dir."""
    conf = tmp_path / "conf" / "policy"
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "report.yaml").write_text(REPORT)
    run_dir = tmp_path / name
    args = [f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "policy=report", f"policy.model={tiny_lm}",
            f"policy.out={tmp_path / 'report'}", *TINY_DATA, "eval.limit=6", "eval.batch_size=2",
            *overrides, f"hydra.run.dir={run_dir}"]  # fmt: skip
    rc, said = cli("run", args, capfd, monkeypatch)
    assert rc == 0, said[-3000:]
    return run_dir


@pytest.mark.parametrize("train", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["keys", "sft"])
def test_every_launch_setting_reaches_the_launched_processes(train, tiny_lm, tmp_path, capfd, monkeypatch):
    """``python -m rag_lab.run ... launch=cpu2 launch.timeout_s=77 launch.gradient_checkpointing=true
    launch.program=<a wrapper of accelerate>``: inside each launched process the process group's timeout is
    77 s as torch holds it, gradient checkpointing is on in the keys every trainer's TRL config takes (in the
    slow set: TRL's SFTTrainer trained a step with it on), the wrapper started the job, and the rendezvous
    took a free port (none named). Then the two processes evaluated, rank 0 the batches 0 and 2, rank 1 the
    batch 1, the runner none, into the records one process writes, byte for byte."""
    for key, value in {"PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
                       "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    program = tmp_path / "accelerate-wrapper"
    program.write_text(f'#!/bin/sh\nRAG_LAB_TEST_PROGRAM="$0" exec {resolve("accelerate")} "$@"\n')
    program.chmod(0o755)
    launch = ["launch=cpu2", "launch.timeout_s=77", "launch.gradient_checkpointing=true",
              f"launch.program={program}", f"policy.train={str(train).lower()}"]  # fmt: skip
    launched = runs(tmp_path, tiny_lm, capfd, monkeypatch, "launched", *launch)
    out = tmp_path / "report"
    for rank in (0, 1):
        got = json.loads((out / f"rank{rank}.json").read_text())
        assert (got["timeout_s"], got["gradient_checkpointing"]) == (77, [True, True] if train else True), (
            rank
        )
        assert (got["program"], got["processes"]) == (str(program), 2) and got["port"] != 29500, rank
    assert yaml.safe_load((launched / "launch" / "accelerate.yaml").read_text())["main_process_port"] == 0

    ids = [json.loads(line)["id"] for line in (launched / "records.jsonl").read_text().splitlines()]
    batches = [ids[i : i + 2] for i in range(0, 6, 2)]
    played = {p.stem: [json.loads(line) for line in p.read_text().splitlines()] for p in out.glob("played-*")}
    assert played == {"played-rank0": [batches[0], batches[2]], "played-rank1": [batches[1]]}
    alone = runs(tmp_path, tiny_lm, capfd, monkeypatch, "alone")  # the same policy, evaluated by the runner
    assert (out / "played-runner.jsonl").exists()
    assert (alone / "records.jsonl").read_bytes() == (launched / "records.jsonl").read_bytes()
