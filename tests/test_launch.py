"""The ``launch`` group (rag_lab/launch.py): accelerate configs composed and read by accelerate itself, for
every paper experiment that trains a 7-8B model; what the machine lacks, named before anything trains."""

import pytest
import yaml
from accelerate.commands.config.config_args import ClusterConfig
from hydra.utils import instantiate

from rag_lab.config import ConfigError, compose, group_options
from rag_lab.launch import Launch, launch_of

PAPER_EXPERIMENTS = ["dapo_2wiki", "evorag_hotpotqa", "r3rag_hotpotqa", "apex_musique", "compare_musique"]


@pytest.mark.parametrize("launch", ["zero3", "fsdp"])
@pytest.mark.parametrize("experiment", PAPER_EXPERIMENTS)
def test_the_big_model_configs_compose_for_every_paper_experiment(experiment, launch, tmp_path):
    cfg = compose([f"+experiment={experiment}", f"launch={launch}"])
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
        rows = [f"+experiment/compare_synth={r}" for r in ("stoprag", "dapo", "evorag", "r3rag", "apex")]
    for row in rows:
        cfg = compose([f"+experiment={experiment}"] + ([row] if row else []))
        assert cfg.launch.config.distributed_type == "DEEPSPEED", (experiment, row)
        assert cfg.launch.config.deepspeed_config.zero_stage == 3


def test_every_launch_option_is_read_by_accelerate(tmp_path):
    for option in group_options("launch"):
        launch = instantiate(compose([f"launch={option}"]).launch)
        ClusterConfig.from_yaml_file(str(launch.write_config(tmp_path / f"{option}.yaml")))


def test_the_command_runs_a_module_under_accelerate_with_the_written_config(tmp_path):
    launch = instantiate(compose(["launch=cpu2"]).launch)
    config = launch.write_config(tmp_path / "launch" / "accelerate.yaml")
    command = launch.command(config, "rag_lab.launched", "job.json")
    assert command[0].endswith("accelerate") and command[1:] == [
        "launch", "--config_file", str(config), "-m", "rag_lab.launched", "job.json"]  # fmt: skip
    assert yaml.safe_load(config.read_text())["num_processes"] == 2 and launch.processes == 2
    assert launch_of({"launch": None}) is None and launch_of(None) is None
    assert launch_of({"launch": {"config": {"num_processes": 3, "num_machines": 2}}}).processes == 6


def test_what_the_machine_lacks_is_named(monkeypatch):
    import torch

    zero3 = instantiate(compose(["launch=zero3"]).launch)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert ("config.distributed_type", "DEEPSPEED needs GPUs and this machine has none "
            "(launch=cpu2 runs data-parallel on CPU processes)") in zero3.check_environment()  # fmt: skip
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    problems = dict(zero3.check_environment())
    assert problems["config.num_processes"] == "8 processes, one per GPU, and this machine has 4 GPU(s)"
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
        ("+launch.processes=2", r"'launch\.processes' \(rag_lab\.launch\.Launch\): Key 'processes' not in"),
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


class SingleProcess:
    """A policy that trains and names no global batches: its trainer is not data-parallel."""

    trains = True

    def __init__(self, lr: float = 0.1):
        self.lr = lr


def test_a_trainer_without_global_batches_is_refused_before_a_launched_run_trains():
    from omegaconf import OmegaConf

    from rag_lab.launch import single_process_trainers

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
