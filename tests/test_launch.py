"""The ``launch`` group (rag_lab/runner/launch.py): accelerate configs composed and read by accelerate itself,
for every paper experiment that trains a 7-8B model; what the machine lacks, named before anything trains."""

import json

import pytest
import yaml
from accelerate.commands.config.config_args import ClusterConfig
from hydra.utils import instantiate

from rag_lab.core.config import ConfigError, compose, group_options
from rag_lab.runner.launch import Launch, launch_of

from conftest import TINY_DATA

PAPER_EXPERIMENTS = ["dapo_2wiki", "evorag_hotpotqa", "r3rag_hotpotqa", "apex_musique", "compare_musique"]


@pytest.mark.parametrize("launch", ["zero3", "fsdp"])
@pytest.mark.parametrize("experiment", PAPER_EXPERIMENTS)
def test_the_big_model_configs_compose_for_every_paper_experiment(experiment, launch, tmp_path):
    cfg = compose([f"experiment={experiment}", f"launch={launch}"])
    built = instantiate(cfg.launch)
    gpus = 4 if experiment == "compare_musique" else 8  # its DAPO and APEX rows: 4 questions a step
    assert isinstance(built, Launch) and built.processes == gpus
    written = built.write_config(tmp_path / "accelerate.yaml")
    read = ClusterConfig.from_yaml_file(str(written))  # accelerate's own reader: every key known
    assert read.mixed_precision == "bf16" and read.num_processes == gpus
    assert str(read.distributed_type) in {"DistributedType.DEEPSPEED", "DistributedType.FSDP",
                                          "DistributedType.MULTI_GPU"}  # fmt: skip
    if launch == "zero3":
        assert read.deepspeed_config["zero_stage"] == 3
    if launch == "fsdp":
        assert read.fsdp_config["fsdp_version"] == 2


@pytest.mark.parametrize("experiment", PAPER_EXPERIMENTS)
def test_each_paper_experiment_names_zero3_and_each_of_its_rows_divides(experiment):
    rows = [""]
    if experiment == "compare_musique":  # every trained row of the sweep, with the experiment's launch
        rows = [f"experiment/compare_synth={r}" for r in ("stoprag", "dapo", "evorag", "r3rag", "apex")]
    for row in rows:
        cfg = compose([f"experiment={experiment}"] + ([row] if row else []))
        assert cfg.launch.config.distributed_type == "DEEPSPEED", (experiment, row)
        assert cfg.launch.config.deepspeed_config.zero_stage == 3


def test_every_launch_option_is_read_by_accelerate(tmp_path):
    for option in group_options("launch"):
        launch = instantiate(compose([f"launch={option}"]).launch)
        ClusterConfig.from_yaml_file(str(launch.write_config(tmp_path / f"{option}.yaml")))


def test_the_command_runs_a_module_under_accelerate_with_the_written_config(tmp_path):
    launch = instantiate(compose(["launch=cpu2"]).launch)
    config = launch.write_config(tmp_path / "launch" / "accelerate.yaml")
    command = launch.command(config, "rag_lab.runner.launched", "job.json")
    assert command[0].endswith("accelerate") and command[1:] == [
        "launch", "--config_file", str(config), "-m", "rag_lab.runner.launched", "job.json"]  # fmt: skip
    assert yaml.safe_load(config.read_text())["num_processes"] == 2 and launch.processes == 2
    assert launch_of({"launch": None}) is None and launch_of(None) is None
    two_machines = launch_of({"launch": {"config": {"num_processes": 6, "num_machines": 2}}})
    assert (two_machines.processes, two_machines.per_machine) == (6, 3)  # accelerate's count: all machines


def test_what_the_machine_lacks_is_named(monkeypatch):
    import torch

    zero3 = instantiate(compose(["launch=zero3"]).launch)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert ("config.distributed_type", "DEEPSPEED needs GPUs and this machine has none "
            "(launch=cpu2 runs data-parallel on CPU processes)") in zero3.check_environment()  # fmt: skip
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    problems = dict(zero3.check_environment())
    assert problems["config.num_processes"] == "8 processes on this machine, one per GPU, and it has 4 GPU(s)"
    assert instantiate(compose(["launch=cpu2"]).launch).check_environment() == []  # CPU processes need none


@pytest.mark.parametrize(
    "override, says",
    [
        ("launch.program=nolauncher", r"'launch\.program': 'nolauncher' is not installed"),
        ("+launch.config.gpus=2", r"'launch\.config': accelerate does not read it: .*\['gpus'\]"),
        (
            "launch.config.distributed_type=GPUS",
            r"'launch\.config': accelerate does not read it: 'GPUS' is not",
        ),
        ("launch.config.num_machines=0", r"'launch\.config\.num_machines': 0: a whole number, 1 or more"),
        (
            "launch.config.num_machines=4",
            r"'launch\.config\.num_processes': 2 processes in all do not split over 4",
        ),
        (
            "+launch.processes=2",
            r"'launch\.processes' \(rag_lab\.runner\.launch\.Launch\): Key 'processes' not in",
        ),
    ],
)
def test_a_bad_launch_setting_fails_at_compose_naming_it(override, says):
    with pytest.raises(ConfigError, match=says):
        compose(["launch=cpu2", override])


def test_the_processes_must_divide_the_policys_global_batches():
    """R3-RAG names its global batch (the questions of a PPO iteration): 3 processes cannot split 16 of them
    equally, 4 can; a policy that names none takes any count."""
    with pytest.raises(ConfigError, match=r"3 processes do not divide policy\.ppo\.batch_size=16"):
        compose(["policy=r3rag", "launch=cpu2", "launch.config.num_processes=3", "policy.ppo.batch_size=16"])
    compose(["policy=r3rag", "launch=cpu2", "launch.config.num_processes=4", "policy.ppo.batch_size=16"])
    compose(["policy=top_title", "launch=cpu2", "launch.config.num_processes=3"])


def test_more_processes_than_held_out_questions_is_refused_before_training():
    """Each process measures a share of a held-out curve's questions: 4 processes need 4 of them."""
    base = ["launch=cpu2", "launch.config.num_processes=4", "policy.ppo.batch_size=16"]
    with pytest.raises(
        ConfigError, match=r"4 processes and policy.heldout.n=3 held-out questions: at least one"
    ):
        compose(["policy=r3rag", *base, "policy.heldout.n=3"])
    compose(["policy=r3rag", *base, "policy.heldout.n=4"])
    compose(["policy=r3rag", *base, "policy.heldout.n=0"])  # no curve


class SingleProcess:
    """A policy that trains and names no global batches: its trainer is not data-parallel."""

    trains = True

    def __init__(self, lr: float = 0.1):
        self.lr = lr


def test_a_trainer_without_global_batches_is_refused_before_a_launched_run_trains():
    from omegaconf import OmegaConf

    from rag_lab.runner.launch import single_process_trainers

    run = OmegaConf.create({"policy": {"_target_": "test_launch.SingleProcess"}})
    [(key, why)] = single_process_trainers(run)
    assert key == "config" and why.startswith("policy=SingleProcess trains in one process only")
    for name in [
        "stoprag",
        "dapo",
        "evorag",
        "r3rag",
        "apex",
    ]:  # the five methods' trainers are all data-parallel
        assert single_process_trainers(compose([f"policy={name}"])) == [], name


SLURM_2 = {"SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1",
           "SLURM_JOB_NODELIST": "gpu[017-018]"}  # fmt: skip


def test_on_a_slurm_job_of_two_nodes_each_node_takes_its_rank_and_meets_the_first():
    launch = instantiate(
        compose(["launch=zero3", "launch.config.num_machines=2", "launch.config.num_processes=16"]).launch
    )
    node = launch.on_cluster(SLURM_2).config
    assert (node["num_machines"], node["machine_rank"], node["main_process_ip"]) == (2, 1, "gpu017")
    # node 0's port: one of this Slurm job's own (job 77), none being named
    assert node["main_process_port"] == 29577 and node["num_processes"] == 16 and launch.per_machine == 8
    assert launch.on_cluster({"SLURM_JOB_NUM_NODES": "1"}) is launch and launch.on_cluster({}) is launch
    cpu = instantiate(compose(["launch=cpu2", "launch.config.num_machines=2"]).launch)
    assert dict(cpu.check_environment({}))["config.num_machines"].startswith(
        "2 machines, and this is no Slurm"
    )
    assert cpu.check_environment(SLURM_2) == []


def test_the_slurm_launcher_asks_the_nodes_and_gpus_of_launch():
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from rag_lab.core.config import CONF_DIR

    def launcher(*overrides):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = hydra_compose("config", ["hydra/launcher=slurm", *overrides], return_hydra_config=True)
        node = cfg.hydra.launcher
        return node.nodes, node.gpus_per_node, node.tasks_per_node, node.mem_gb, node.cpus_per_task

    # host memory: 16 GB + 40 a GPU process; CPUs: 6 a GPU process, at least 8 (slurm.yaml's arithmetic)
    assert launcher() == (1, 1, 1, 56, 8)
    assert launcher("launch=zero3") == (1, 8, 1, 336, 48)
    assert launcher("launch=zero3", "launch.config.num_machines=2", "launch.config.num_processes=16") == (
        2,
        8,
        1,
        336,
        48,
    )


def test_a_node_after_the_first_runs_node_0s_job_of_the_same_slurm_job(tmp_path, monkeypatch):
    import json
    import subprocess

    from rag_lab.core.errors import RagLabError

    ran = []
    monkeypatch.setattr(
        subprocess, "run", lambda command, env: ran.append(command) or subprocess.CompletedProcess(command, 0)
    )
    for key, value in SLURM_2.items():
        monkeypatch.setenv(key, value)
    launch = instantiate(compose(["launch=cpu2", "launch.config.num_machines=2"]).launch).on_cluster(SLURM_2)
    work = tmp_path / "launch"
    work.mkdir()
    (work / "job.json").write_text(json.dumps({"run_config": {}, "slurm_job": "76"}))  # an earlier job's
    with pytest.raises(RagLabError, match=r"node 1 waited 0 s for node 0's .*job\.json"):
        launch.follow("rag_lab.runner.launched", work, timeout=0)
    assert ran == []
    (work / "job.json").write_text(json.dumps({"run_config": {}, "slurm_job": "77"}))
    launch.follow("rag_lab.runner.launched", work, timeout=0)
    assert ran[0][-1] == str(work / "job.json") and ran[0][3] == str(work / "node1" / "accelerate.yaml")
    assert yaml.safe_load((work / "node1" / "accelerate.yaml").read_text())["machine_rank"] == 1


def test_the_runner_on_a_node_after_the_first_trains_its_share_and_writes_no_results(tmp_path, monkeypatch):
    from rag_lab.run import run

    for key, value in SLURM_2.items():
        monkeypatch.setenv(key, value)
    followed = []
    monkeypatch.setattr(
        Launch, "follow", lambda self, module, work: followed.append((self.node, module, work))
    )
    cfg = compose(["policy=dapo", "generator=tiny", "launch=cpu2", "launch.config.num_machines=2"])
    assert run(cfg, tmp_path / "run") == {}
    assert followed == [(1, "rag_lab.runner.launched", tmp_path / "run" / "launch")]
    assert not (tmp_path / "run").exists()  # node 0 writes the run dir


@pytest.fixture
def gpus(monkeypatch):
    """A machine with 8 GPUs, faked: CUDA's calls answer as there, and set_device records its argument."""
    import torch

    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    return chosen


@pytest.mark.parametrize(
    "local_rank, device", [(None, "cuda:0"), ("0", "cuda:0"), ("3", "cuda:3"), ("7", "cuda:7")]
)
def test_each_rank_takes_the_gpu_of_its_local_rank(gpus, monkeypatch, local_rank, device):
    """Every model a launched process builds goes to its own GPU, not all of them to GPU 0 (issue 66)."""
    import torch

    from rag_lab.core.devices import local_gpu
    from rag_lab.generators.hf import GPU_MIN_PARAMETERS, default_device

    if local_rank is None:
        monkeypatch.delenv("LOCAL_RANK", raising=False)
    else:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    assert local_gpu() == device and gpus == [int(device[-1])]
    big, small = torch.nn.Linear(GPU_MIN_PARAMETERS, 1, bias=False, device="meta"), torch.nn.Linear(2, 2)
    assert default_device(big) == device and default_device(small) == "cpu"


def test_more_ranks_on_a_node_than_gpus_is_one_line(gpus, monkeypatch):
    from rag_lab.core.devices import local_gpu
    from rag_lab.core.errors import RagLabError

    monkeypatch.setenv("LOCAL_RANK", "8")
    with pytest.raises(
        RagLabError, match=r"^launch.config.num_processes: process 8 of this node has no GPU \(the"
    ):
        local_gpu()


def test_the_runner_builds_no_model_while_the_launched_processes_train(tmp_path, monkeypatch):
    """Under launch the N processes train first; the runner builds its own generator and policy after."""
    import rag_lab.run as runner

    order = []
    monkeypatch.setattr(
        Launch, "run_job", lambda self, module, job, work: order.append(f"launched {job['part']}")
    )

    def components(*args, **kwargs):
        order.append("runner's models")
        raise RuntimeError("stop here")

    monkeypatch.setattr(runner, "components", components)
    cfg = compose(["policy=dapo", "generator=tiny", "launch=cpu2", *TINY_DATA])
    with pytest.raises(RuntimeError, match="stop here"):
        runner.run(cfg, tmp_path / "run")
    assert order[-2:] == ["launched fit", "runner's models"]


def test_a_killed_rank_ends_the_job_in_one_line_naming_it(tmp_path, monkeypatch):
    """Two real processes under accelerate launch; rank 1 is killed (SIGKILL) between two collectives. The
    job ends (no rank hangs in the second collective) and the runner's one line names rank 1."""
    import os
    import time
    from pathlib import Path

    from rag_lab.core.errors import RagLabError

    tests = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]))
    cpu2 = compose(["launch=cpu2", "launch.timeout_s=120"]).launch  # a free port (Launch.write_config)
    launch = instantiate(cpu2)
    assert launch.timeout_s == 120
    with pytest.raises(RagLabError) as e:
        launch.run_job("launched_kill", {}, tmp_path / "work")
    # not the group's timeout: the job ended when the rank died (timed from the kill, not from the start:
    # two interpreters' imports take a minute on a loaded machine)
    assert time.time() - float((tmp_path / "work" / "killed_at").read_text()) < 60
    assert str(e.value).startswith(
        "launch: rank 1 of 2 died without an error (killed: a signal or the out-of-memory killer); the other"
    ) and "\n" not in str(e.value)
    assert json.loads((tmp_path / "work" / "job.json").read_text())["timeout_s"] == 120


def test_a_rank_that_fails_is_named_with_its_error(tmp_path):
    from rag_lab.runner.launch import fate

    ranks = tmp_path / "ranks"
    ranks.mkdir()
    (ranks / "rank0.json").write_text(json.dumps({"state": "done"}))
    assert fate(ranks, 2) == "rank 1 of 2 never started"
    (ranks / "rank1.json").write_text(json.dumps({"state": "failed", "error": "policy.k: 0 is below 1"}))
    assert fate(ranks, 2) == "rank 1 of 2 failed: policy.k: 0 is below 1"
    assert fate(tmp_path / "none", 2) == "the training job failed"


def test_launch_fsdp_refuses_a_model_class_it_cannot_wrap_before_training(gpus, tmp_path, monkeypatch):
    """FSDP's transformer-based wrap needs the model class's layer class: the shipped tiny LM (Qwen2) names
    one; a class that names none is one line naming the setting, before the run dir is touched."""
    from transformers import Qwen2ForCausalLM

    from rag_lab.run import check_launch

    fsdp = ["policy=dapo", "generator=tiny", "launch=fsdp", "policy.questions_per_step=8"]
    check_launch(compose(fsdp))  # Qwen2ForCausalLM shards by Qwen2DecoderLayer
    monkeypatch.setattr(Qwen2ForCausalLM, "_no_split_modules", None)
    says = r"^config 'launch.config.fsdp_config.fsdp_auto_wrap_policy': FSDP's transformer-based wrap"
    with pytest.raises(ConfigError, match=says + r" shards by the model's layer class, and Qwen2ForCausalLM"):
        check_launch(compose(fsdp))
    named = "+launch.config.fsdp_config.fsdp_transformer_layer_cls_to_wrap=Qwen2DecoderLayer"
    check_launch(compose([*fsdp, named]))


def test_gradient_checkpointing_is_a_launch_setting_that_reaches_trls_trainers(tmp_path, monkeypatch):
    """``launch.gradient_checkpointing`` (on in launch=fsdp and zero3) travels in job.json; a launched process
    sets it for TRL's trainers (SFT and GRPO / DPO configs: non-reentrant), off elsewhere."""
    from rag_lab.train.parallel import CHECKPOINTING_ENV
    from rag_lab.train.sft import sft_config
    from rag_lab.train.trainer_args import trainer_args

    assert [compose([f"launch={n}"]).launch.gradient_checkpointing for n in ("cpu2", "fsdp", "zero3")] == [
        False, True, True]  # fmt: skip
    launch = instantiate(compose(["launch=fsdp"]).launch)
    monkeypatch.setattr("rag_lab.runner.launch.Launch._run", lambda self, module, job, work: None)
    launch.run_job("rag_lab.runner.launched", {}, tmp_path / "work")
    assert json.loads((tmp_path / "work" / "job.json").read_text())["gradient_checkpointing"] is True
    monkeypatch.delenv(CHECKPOINTING_ENV, raising=False)
    assert sft_config(tmp_path, 1, 1, 1e-3, 0, 0).gradient_checkpointing is False
    monkeypatch.setenv(CHECKPOINTING_ENV, "1")
    config = sft_config(tmp_path, 1, 1, 1e-3, 0, 0)
    assert config.gradient_checkpointing and config.gradient_checkpointing_kwargs == {"use_reentrant": False}
    assert trainer_args(tmp_path, "cpu", seed=0, save_steps=1)["gradient_checkpointing"] is True


def test_a_ranks_report_carries_its_peak_gpu_memory_where_it_used_a_gpu(tmp_path, monkeypatch):
    """``make gpu-check`` sets each launched process's ``torch.cuda.max_memory_allocated`` beside the memory
    plan's prediction: the rank's report carries it where CUDA was used, and nothing on a CPU."""
    import torch

    from rag_lab.runner.launch import RANKS_ENV, report_rank

    monkeypatch.setenv(RANKS_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "0")
    with report_rank():
        pass
    assert json.loads((tmp_path / "rank0.json").read_text()) == {"state": "done"}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 9 * 2**30)
    with report_rank():
        pass
    assert json.loads((tmp_path / "rank0.json").read_text()) == {
        "state": "done",
        "max_memory_allocated": 9 * 2**30,
    }
