"""Data-parallel training under accelerate: the ``launch`` config group (issue 50).

``launch=null`` (the default) trains in the runner's own process. Any other option trains the run's
policy in N processes: the runner (one process, which writes the run) starts
``accelerate launch --config_file <run dir>/launch/accelerate.yaml -m rag_lab.runner.launched <run
dir>/launch/job.json`` (:meth:`Launch.run_job`), whose every process rebuilds the run from its resolved
config and calls the policy's ``fit`` (each trainer takes its share of every global batch; the main
process publishes: :mod:`rag_lab.train.parallel`), then evaluates its share of the questions (the main
process writes ``records.jsonl``); then the runner's own ``fit`` finds the published results and trains
nothing, and its evaluation finds the records complete. The runner builds the launch from the whole
``launch`` node (:func:`launch_of`), so every setting reaches the processes; on one machine a launch that
names no ``main_process_port`` takes a free one (:meth:`Launch.write_config`). A policy whose trainer is
not data-parallel yet is refused before anything trains (:func:`single_process_trainers`).

Each option is an accelerate config file, written as a config node: ``launch=cpu2`` (two CPU processes
over gloo, what the tests run), ``launch=ddp`` (one process per GPU, bf16), ``launch=zero3`` (DeepSpeed
ZeRO-3, bf16), ``launch=fsdp`` (FSDP2, bf16); ``launch.config.num_processes=8`` (all processes, on all
machines, as accelerate counts them) and every other key of accelerate's config file override as usual.

On a Slurm cluster (``hydra/launcher=slurm``: one job a sweep point, on ``launch.config.num_machines``
nodes, one task a node) every node's task runs the runner. Node 0 is the runner above; each other node
waits for node 0's ``job.json`` of the same Slurm job and runs ``accelerate launch`` on it with its own
rank (:meth:`Launch.on_cluster`: ``machine_rank`` from ``SLURM_NODEID``, ``main_process_ip`` the job's
first node), trains its share, and writes nothing into the run dir but ``launch/``.

Hand-written: only the glue between a Hydra config and ``accelerate launch`` and the checks made before
anything trains (the program on ``PATH``, accelerate's own reading of the config file, GPUs where the
config needs them, DeepSpeed installed where it is named; the processes against every trainer's batches:
:mod:`rag_lab.core.batches`). Process groups, DDP, ZeRO and FSDP are
accelerate's (and DeepSpeed's / torch's); TRL's trainers run on them unchanged.
"""

import contextlib
import copy
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from rag_lab.core.batches import divides, trainers
from rag_lab.core.errors import RagLabError
from rag_lab.core.ranges import PositiveInt

log = logging.getLogger(__name__)

# hydra/launcher=slurm's GPUs a node: launch's processes in all over its machines
OmegaConf.register_new_resolver(
    "rag_lab_per_node", lambda total, machines: int(total) // int(machines), replace=True
)
# hydra/launcher=slurm's host memory (GB) and CPUs a node for that many GPU processes (the arithmetic:
# conf/hydra/launcher/slurm.yaml)
NODE_GB, PROCESS_GB, PROCESS_CPUS = 16, 40, 6
OmegaConf.register_new_resolver(
    "rag_lab_node_gb", lambda n: NODE_GB + PROCESS_GB * max(1, int(n)), replace=True
)
OmegaConf.register_new_resolver("rag_lab_node_cpus", lambda n: max(8, PROCESS_CPUS * int(n)), replace=True)

# distributed types that need one CUDA device per process (accelerate.utils.DistributedType's names)
NEEDS_GPUS = {"MULTI_GPU", "DEEPSPEED", "FSDP", "MEGATRON_LM"}


# Where each launched process reports how it ended (:func:`report_rank`), read by the runner (:func:`fate`).
RANKS_ENV = "RAG_LAB_RANKS"


@contextlib.contextmanager
def report_rank() -> Iterator[None]:
    """Around a launched process's work: ``<ranks>/rank<RANK>.json`` says it started, then that it is done
    (with its peak GPU memory, :func:`gpu_peak`) or failed (with its error's one line), so that the runner can
    name the rank that ended the job. Outside a launched run (no ``RAG_LAB_RANKS``) it does nothing."""
    folder = os.environ.get(RANKS_ENV)
    if not folder:
        yield
        return
    path = Path(folder) / f"rank{int(os.environ.get('RANK') or 0)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"state": "started", "pid": os.getpid()}))
    try:
        yield
    except BaseException as e:
        error = (str(e).strip().splitlines() or [type(e).__name__])[0]
        path.write_text(json.dumps({"state": "failed", "error": error}))
        raise
    path.write_text(json.dumps({"state": "done"} | gpu_peak()))


def gpu_peak() -> dict[str, int]:
    """This process's peak of allocated GPU memory in bytes (``torch.cuda.max_memory_allocated``: what
    ``make gpu-check`` sets beside the memory plan's prediction), where it used a GPU; else nothing."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return {}
    return {"max_memory_allocated": int(torch.cuda.max_memory_allocated())}


def fate(ranks: Path, processes: int) -> str:
    """What ended a failed launched job, from its ranks' reports (:func:`report_rank`): the ranks that
    started and never reported an end (killed: a signal, the out-of-memory killer; the others' errors are
    then its consequence, a collective with a peer gone), else the ranks that failed (their errors), else
    the ranks that never started."""
    reports = {}
    for path in ranks.glob("rank*.json"):
        try:
            reports[int(path.stem[4:])] = json.loads(path.read_text())
        except (ValueError, OSError):
            continue
    died = [r for r, s in sorted(reports.items()) if s.get("state") == "started"]
    if died:
        names = ", ".join(map(str, died))
        return (
            f"rank {names} of {processes} died without an error (killed: a signal or the out-of-memory "
            "killer); the other ranks were stopped"
        )
    failed = {r: s.get("error", "?") for r, s in sorted(reports.items()) if s.get("state") == "failed"}
    if failed:
        return "; ".join(f"rank {r} of {processes} failed: {error}" for r, error in failed.items())
    missing = [r for r in range(processes) if r not in reports]
    if missing and reports:
        return f"rank {', '.join(map(str, missing))} of {processes} never started"
    return "the training job failed"


def resolve(program: str) -> str | None:
    """``program``'s path: beside this interpreter first (a venv's ``bin/``, on ``PATH`` or not), then on
    ``PATH``; None when neither has it."""
    return shutil.which(program, path=str(Path(sys.executable).parent)) or shutil.which(program)


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list, as ``scontrol show hostnames`` prints it first.

    >>> first_host("gpu[007-009,012],cpu1"), first_host("a1,a2"), first_host("node5")
    ('gpu007', 'a1', 'node5')
    """
    match = re.match(r"([^,\[]+)(?:\[([^],-]+))?", nodelist.strip())
    if not match:
        raise ValueError(f"not a Slurm node list: {nodelist!r}")
    return match.group(1) + (match.group(2) or "")


def slurm_nodes(env: Mapping[str, str]) -> tuple[int, int, str] | None:
    """(nodes, this node's rank, the first node's host) of a Slurm job on several nodes; None elsewhere."""
    n = int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or 1)
    if n <= 1:
        return None
    return n, int(env.get("SLURM_NODEID") or 0), first_host(env.get("SLURM_JOB_NODELIST") or "")


class Launch:
    """How training is launched: ``program`` (accelerate's command line) with ``config`` (the keys of an
    accelerate config file, as ``accelerate config`` writes them)."""

    def __init__(
        self,
        # the keys of the accelerate config file the launch writes (as `accelerate config` writes them)
        config: dict[str, Any],
        # the launcher run as `<program> launch --config_file <config> -m <module>` (beside this Python first)
        program: str = "accelerate",
        timeout_s: PositiveInt = 1800,
        gradient_checkpointing: bool = False,
        hf_generate_max_params: PositiveInt = 1_000_000_000,
        # the GPU the launch runs on and what its memory plan assumes (rag_lab.train.memory.settings; null: no
        # plan, as on CPU launches)
        memory: Any = None,
    ):
        """``timeout_s``: how long a process waits in a collective (a barrier, an all-reduce) for the others
        before its process group gives up (torch's default, 10-30 min depending on the backend, passes
        unnoticed where one rank has died; the runner then names the rank). ``gradient_checkpointing``:
        TRL's trainers (SFT, GRPO, DPO) recompute activations in the backward pass instead of keeping them
        (transformers' gradient checkpointing, non-reentrant), a 7B model's activations in a GPU's memory.
        ``hf_generate_max_params``: under FSDP / ZeRO-3, the largest model a method trains and rolls out with
        transformers (``generator=hf``) on its sharded weights, every rank in step; a larger one is refused
        before anything trains, naming vLLM (:func:`rag_lab.train.lockstep.too_large_to_step`)."""
        from omegaconf import DictConfig, OmegaConf

        if isinstance(config, DictConfig):  # as Hydra's instantiate passes it
            config = OmegaConf.to_container(config, resolve=True)
        self.config = dict(config)
        self.program = program
        self.timeout_s = int(timeout_s)
        self.gradient_checkpointing = bool(gradient_checkpointing)
        self.memory = memory
        self.hf_generate_max_params = int(hf_generate_max_params)

    @property
    def processes(self) -> int:
        """Processes in all, on every machine (accelerate's ``num_processes``)."""
        return int(self.config.get("num_processes", 1))

    @property
    def per_machine(self) -> int:
        """Processes on each machine (accelerate's ``num_processes // num_machines``)."""
        return self.processes // max(1, int(self.config.get("num_machines", 1)))

    def on_cluster(self, env: Mapping[str, str] = os.environ) -> "Launch":
        """This launch on this node of a multi-node Slurm job (``machine_rank``, the first node's address); as
        it is elsewhere."""
        nodes = slurm_nodes(env)
        if nodes is None:
            return self
        n, rank, host = nodes
        port = int(self.config.get("main_process_port") or job_port(env.get("SLURM_JOB_ID")))
        where = {"num_machines": n, "machine_rank": rank, "main_process_ip": host, "main_process_port": port}
        node = copy.copy(self)  # every other setting as it is (a key added to Launch later too)
        node.config = self.config | where
        return node

    @property
    def node(self) -> int:
        return int(self.config.get("machine_rank", 0))

    def write_config(self, path: Path) -> Path:
        """The accelerate config file; on one machine with no port named, ``main_process_port: 0``: accelerate
        gives the job a free port of its own (two launched runs on one machine, a sweep's, never meet on
        accelerate's default 29500)."""
        config = dict(self.config)
        if int(config.get("num_machines", 1)) <= 1 and config.get("main_process_port") is None:
            config["main_process_port"] = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config, sort_keys=True))
        return path

    def command(self, config_file: Path, module: str, *args: str) -> list[str]:
        """``accelerate launch --config_file <config_file> -m <module> ARGS``."""
        program = resolve(self.program) or self.program
        return [program, "launch", "--config_file", str(config_file), "-m", module, *args]

    def run_job(self, module: str, job: dict, work: Path) -> None:
        """``accelerate launch --config_file <work>/accelerate.yaml -m <module> <work>/job.json`` with ``job``
        written to that file; waits for it, and a failed job is one line (its own output is above it)."""
        from rag_lab.core.records import atomic_write_text

        work.mkdir(parents=True, exist_ok=True)
        slurm_job = os.environ.get("SLURM_JOB_ID")
        job = job | {"slurm_job": slurm_job, "timeout_s": self.timeout_s}
        job |= {"gradient_checkpointing": self.gradient_checkpointing}
        atomic_write_text(work / "job.json", json.dumps(job, default=str) + "\n")
        self._run(module, work / "job.json", work)

    def follow(self, module: str, work: Path, timeout: float = 3600.0, poll: float = 2.0) -> None:
        """A node other than 0 of a Slurm job: wait for node 0's ``<work>/job.json`` of this Slurm job, then
        run this node's processes on it (their files under ``<work>/node<rank>/``)."""
        job_file, slurm_job, waited = work / "job.json", os.environ.get("SLURM_JOB_ID"), 0.0
        while not (job_file.exists() and json.loads(job_file.read_text()).get("slurm_job") == slurm_job):
            if waited >= timeout:
                raise RagLabError(f"launch: node {self.node} waited {timeout:.0f} s for node 0's {job_file}")
            time.sleep(poll)
            waited += poll
        self._run(module, job_file, work / f"node{self.node}")

    def _run(self, module: str, job_file: Path, work: Path) -> None:
        command = self.command(self.write_config(work / "accelerate.yaml"), module, str(job_file))
        log.info("launch: %s", " ".join(command))
        ranks = work / "ranks"
        shutil.rmtree(ranks, ignore_errors=True)
        if subprocess.run(command, env=os.environ | {RANKS_ENV: str(ranks)}).returncode != 0:
            raise RagLabError(
                f"launch: {fate(ranks, self.processes)}; its output is above ({' '.join(command)})"
            )

    def check_environment(self, env: Mapping[str, str] = os.environ) -> list[tuple[str, str]]:
        """What this machine lacks for the config: GPUs, DeepSpeed, the nodes. Checked right before training
        (a login node composes a cluster job's config without the GPUs the job will have)."""
        import torch

        kind, problems = str(self.config.get("distributed_type", "NO")), []
        machines, nodes = int(self.config.get("num_machines", 1)), slurm_nodes(env)
        if machines > 1 and (nodes is None or nodes[0] != machines):
            here = "no Slurm job on several nodes" if nodes is None else f"a Slurm job on {nodes[0]} nodes"
            why = (
                f"{machines} machines, and this is {here} (hydra/launcher=slurm starts one job on "
                "launch.config.num_machines nodes)"
            )
            problems.append(("config.num_machines", why))
        if kind in NEEDS_GPUS and not self.config.get("use_cpu"):
            have = torch.cuda.device_count()
            if have == 0:
                why = (
                    f"{kind} needs GPUs and this machine has none "
                    "(launch=cpu2 runs data-parallel on CPU processes)"
                )
                problems.append(("config.distributed_type", why))
            elif self.per_machine > have:
                why = f"{self.per_machine} processes on this machine, one per GPU, and it has {have} GPU(s)"
                problems.append(("config.num_processes", why))
        if kind == "DEEPSPEED":
            import importlib.util

            if importlib.util.find_spec("deepspeed") is None:
                problems.append(
                    ("config.distributed_type", "DEEPSPEED needs deepspeed: pip install deepspeed")
                )
        return problems

    def check_model(self, model_dir: str | None) -> list[tuple[str, str]]:
        """What FSDP needs of the model it shards: its transformer-based wrap (``launch=fsdp``) shards by the
        model class's layer class (transformers' ``_no_split_modules``), unless the config names one. A model
        class that names none is refused before anything trains; ``model_dir`` None (not known before the
        run builds it) is not checked."""
        fsdp = self.config.get("fsdp_config") or {}
        wraps = self.config.get("distributed_type") == "FSDP" and fsdp.get("fsdp_auto_wrap_policy") == (
            "TRANSFORMER_BASED_WRAP"
        )
        if not wraps or fsdp.get("fsdp_transformer_layer_cls_to_wrap") or model_dir is None:
            return []
        from transformers import AutoConfig, AutoModelForCausalLM

        model_config = AutoConfig.from_pretrained(model_dir)
        cls = AutoModelForCausalLM._model_mapping.get(type(model_config), None)
        if cls is None or not getattr(cls, "_no_split_modules", None):
            name = cls.__name__ if cls is not None else f"model type {model_config.model_type!r}"
            why = (
                f"FSDP's transformer-based wrap shards by the model's layer class, and {name} names none"
                " (_no_split_modules): set launch.config.fsdp_config.fsdp_transformer_layer_cls_to_wrap"
            )
            return [("config.fsdp_config.fsdp_auto_wrap_policy", why)]
        return []

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
        if not problems and config.get("num_processes", 1) % config.get("num_machines", 1):
            n, machines = config["num_processes"], config["num_machines"]
            why = f"{n} processes in all do not split over {machines} machines"
            problems.append(("config.num_processes", why))
        if problems or run is None or not run.get("policy"):
            return problems
        return problems + divides(Launch(config).processes, run)


def single_process_trainers(run) -> list[tuple[str, str]]:
    """The run's trainers that do not train data-parallel yet (no ``global_batches``): checked right before
    a launched run trains (the configs of every experiment compose with every ``launch`` option)."""
    problems = []
    for where, cls, _ in trainers(run):
        if getattr(cls, "trains", True) and getattr(cls, "global_batches", None) is None:
            why = (
                f"{where}={cls.__name__} trains in one process only (its data-parallel training is not "
                "built yet); launch=null trains it here"
            )
            problems.append(("config", why))
    return problems


def launch_of(run_config: dict | None) -> Launch | None:
    """The run's ``launch`` (a resolved config's node), or None: train in this process. Built the one way a
    config node is, by Hydra's ``instantiate`` of the whole node, so that every key reaches the launch (and,
    through ``job.json``, each launched process), a key added later too."""
    from hydra.utils import instantiate

    node = dict((run_config or {}).get("launch") or {})
    if not node:
        return None
    return instantiate({"_target_": f"{__name__}.Launch"} | node, _convert_="all")


def job_port(slurm_job: str | None) -> int:
    """The port node 0 of a Slurm job on several nodes listens on, where the config names none: one of its
    own per job (29500 + the job id's last three digits), so that two jobs sharing a node do not meet.

    >>> job_port("4242"), job_port(None)
    (29742, 29500)
    """
    return 29500 + int(re.sub(r"\D", "", slurm_job or "") or 0) % 1000
