"""Data-parallel training under accelerate: the ``launch`` config group (issue 50).

``launch=null`` (the default) trains in the runner's own process. Any other option trains the run's
policy in N processes: the runner (one process, which evaluates and writes the run) starts
``accelerate launch --config_file <run dir>/launch/accelerate.yaml -m rag_lab.launched <run
dir>/launch/job.json`` (:meth:`Launch.run_job`), whose every process rebuilds the run from its resolved
config and calls the policy's ``fit`` (each trainer takes its share of every global batch; the main
process publishes: :mod:`rag_lab.train.parallel`); then the runner's own ``fit`` finds the published
results and trains nothing. A policy whose trainer is not data-parallel yet is refused before anything
trains (:func:`single_process_trainers`).

Each option is an accelerate config file, written as a config node: ``launch=cpu2`` (two CPU processes
over gloo, what the tests run), ``launch=ddp`` (one process per GPU, bf16), ``launch=zero3`` (DeepSpeed
ZeRO-3, bf16), ``launch=fsdp`` (FSDP2, bf16); ``launch.config.num_processes=8`` and every other key of
accelerate's config file override as usual.

Hand-written: only the glue between a Hydra config and ``accelerate launch`` and the checks made before
anything trains (the program on ``PATH``, accelerate's own reading of the config file, GPUs where the
config needs them, DeepSpeed installed where it is named). Process groups, DDP, ZeRO and FSDP are
accelerate's (and DeepSpeed's / torch's); TRL's trainers run on them unchanged.
"""

import json
import logging
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger(__name__)

# distributed types that need one CUDA device per process (accelerate.utils.DistributedType's names)
NEEDS_GPUS = {"MULTI_GPU", "DEEPSPEED", "FSDP", "MEGATRON_LM"}


def resolve(program: str) -> str | None:
    """``program``'s path: beside this interpreter first (a venv's ``bin/``, on ``PATH`` or not), then on
    ``PATH``; None when neither has it."""
    return shutil.which(program, path=str(Path(sys.executable).parent)) or shutil.which(program)


class Launch:
    """How training is launched: ``program`` (accelerate's command line) with ``config`` (the keys of an
    accelerate config file, as ``accelerate config`` writes them)."""

    def __init__(self, config: dict[str, Any], program: str = "accelerate"):
        from omegaconf import DictConfig, OmegaConf

        if isinstance(config, DictConfig):  # as Hydra's instantiate passes it
            config = OmegaConf.to_container(config, resolve=True)
        self.config, self.program = dict(config), program

    @property
    def processes(self) -> int:
        """Processes in all (per machine times machines)."""
        return int(self.config.get("num_processes", 1)) * int(self.config.get("num_machines", 1))

    def write_config(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(self.config, sort_keys=True))
        return path

    def command(self, config_file: Path, module: str, *args: str) -> list[str]:
        """``accelerate launch --config_file <config_file> -m <module> ARGS``."""
        program = resolve(self.program) or self.program
        return [program, "launch", "--config_file", str(config_file), "-m", module, *args]

    def run_job(self, module: str, job: dict, work: Path) -> None:
        """``accelerate launch --config_file <work>/accelerate.yaml -m <module> <work>/job.json`` with ``job``
        written to that file; waits for it, and a failed job is one line (its own output is above it)."""
        from rag_lab.errors import RagLabError
        from rag_lab.records import atomic_write_text

        work.mkdir(parents=True, exist_ok=True)
        atomic_write_text(work / "job.json", json.dumps(job, default=str) + "\n")
        command = self.command(self.write_config(work / "accelerate.yaml"), module, str(work / "job.json"))
        log.info("launch: %s", " ".join(command))
        if subprocess.run(command).returncode != 0:
            raise RagLabError(f"launch: the training job failed ({' '.join(command)}); its output is above")

    def check_environment(self) -> list[tuple[str, str]]:
        """What this machine lacks for the config: GPUs, DeepSpeed. Checked right before training (a
        login node composes a cluster job's config without the GPUs the job will have)."""
        import torch

        kind, problems = str(self.config.get("distributed_type", "NO")), []
        if kind in NEEDS_GPUS and not self.config.get("use_cpu"):
            have = torch.cuda.device_count()
            if have == 0:
                problems.append(("config.distributed_type", f"{kind} needs GPUs and this machine has none "
                                 "(launch=cpu2 runs data-parallel on CPU processes)"))  # fmt: skip
            elif int(self.config.get("num_processes", 1)) > have:
                wanted = self.config["num_processes"]
                why = f"{wanted} processes, one per GPU, and this machine has {have} GPU(s)"
                problems.append(("config.num_processes", why))
        if kind == "DEEPSPEED":
            import importlib.util

            if importlib.util.find_spec("deepspeed") is None:
                problems.append(
                    ("config.distributed_type", "DEEPSPEED needs deepspeed: pip install deepspeed")
                )
        return problems

    @staticmethod
    def check_settings(s: dict, run) -> list[tuple[str, str]]:
        """At compose time: the launcher is installed and accelerate reads the config file."""
        from accelerate.commands.config.config_args import ClusterConfig

        problems = []
        program = str(s.get("program") or "")
        if resolve(program) is None:
            problems.append(
                ("program", f"{program!r} is not installed (not beside {sys.executable}, not on PATH)")
            )
        config = dict(s.get("config") or {})
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "accelerate.yaml"
            path.write_text(yaml.safe_dump(config))
            try:
                ClusterConfig.from_yaml_file(str(path))
            except (ValueError, TypeError, KeyError) as e:
                why = str(e).replace(str(path), "the config").splitlines()[0]
                problems.append(("config", f"accelerate does not read it: {why}"))
        for key in ("num_processes", "num_machines"):
            if not (isinstance(config.get(key, 1), int) and config.get(key, 1) >= 1):
                problems.append((f"config.{key}", f"{config.get(key)!r}: a whole number, 1 or more"))
        if problems or run is None or not run.get("policy"):
            return problems
        return problems + divides(Launch(config).processes, run)


def divides(processes: int, run) -> list[tuple[str, str]]:
    """Every global batch of the run's policy (its class names them: ``global_batches(settings) -> {key:
    size}``; so does a stopping rule it trains), the cold start's included, splits into equal shares, one
    per process, so N processes make the update of one."""
    sizes = {}
    for where, cls, node in _trainers(run):
        batches = getattr(cls, "global_batches", None)
        sizes |= {
            f"{where}.{key}".removeprefix("policy."): n
            for key, n in (batches(node) if batches else {}).items()
        }
    settings = _trainers(run)[0][2]
    if isinstance(settings.get("cold_start"), dict) and settings["cold_start"].get("batch_size"):
        sizes["cold_start.batch_size"] = int(settings["cold_start"]["batch_size"])
    problems = []
    for key, size in sizes.items():
        if size % processes:
            why = f"{processes} processes do not divide policy.{key}={size} (each takes an equal share)"
            problems.append(("config.num_processes", why))
    return problems


def single_process_trainers(run) -> list[tuple[str, str]]:
    """The run's trainers that do not train data-parallel yet (no ``global_batches``): checked right before
    a launched run trains (the configs of every experiment compose with every ``launch`` option)."""
    problems = []
    for where, cls, _ in _trainers(run):
        if getattr(cls, "trains", True) and getattr(cls, "global_batches", None) is None:
            why = (f"{where}={cls.__name__} trains in one process only (its data-parallel training is not "
                   "built yet); launch=null trains it here")  # fmt: skip
            problems.append(("config", why))
    return problems


def _trainers(run) -> list[tuple[str, type, dict]]:
    """(where, class, settings) of the run's policy and of a stopping rule it trains."""
    from omegaconf import OmegaConf

    from rag_lab.config import locate, schema_for

    def with_defaults(target: str, node: dict) -> dict:  # the node over its signature's defaults
        schema = schema_for(target)
        return (OmegaConf.to_container(OmegaConf.structured(schema)) if schema is not dict else {}) | node

    settings = with_defaults(run.policy._target_, OmegaConf.to_container(run.policy, resolve=True))
    parts = [("policy", locate(run.policy._target_), settings)]
    stopper = settings.get("stopper")
    if isinstance(stopper, dict) and stopper.get("_target_"):
        parts.append(
            ("policy.stopper", locate(stopper["_target_"]), with_defaults(stopper["_target_"], stopper))
        )
    return parts


def launch_of(run_config: dict | None) -> Launch | None:
    """The run's ``launch`` (a resolved config's node), or None: train in this process."""
    node = dict((run_config or {}).get("launch") or {})
    if not node:
        return None
    return Launch(dict(node.get("config") or {}), node.get("program", "accelerate"))
