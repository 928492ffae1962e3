"""The memory plan of a composed run config: its launch's world of fake GPUs, its method's trainers one step
each, the ledger (:mod:`rag_lab.train.memory`); and the check made before a GPU launch trains."""

import logging
import time

from omegaconf import DictConfig, OmegaConf

from rag_lab.core.config import ConfigError, locate
from rag_lab.core.errors import RagLabError
from rag_lab.train.memory import fake
from rag_lab.train.memory.context import Context
from rag_lab.train.memory.ledger import Ledger
from rag_lab.train.memory.methods import plan_of
from rag_lab.train.memory.phases import Bench
from rag_lab.train.memory.settings import MemorySettings

log = logging.getLogger(__name__)


def fsdp_launch(cfg: DictConfig) -> dict:
    """The run's launch node, resolved, where it is FSDP2 (what the plan models); a one-line error
    elsewhere."""
    launch = OmegaConf.to_container(cfg.launch, resolve=True) if cfg.get("launch") else None
    config = (launch or {}).get("config") or {}
    version = (config.get("fsdp_config") or {}).get("fsdp_version")
    if config.get("distributed_type") != "FSDP" or version != 2:
        name = config.get("distributed_type", "null") if launch else "null"
        raise ConfigError(
            f"config 'launch': {name} is not planned; the memory plan models FSDP2 (launch=fsdp: parameters, "
            "gradients and optimizer state sharded as ZeRO-3 shards them)"
        )
    return launch


def plan(cfg: DictConfig) -> Ledger:
    """The ledger of ``cfg``'s run on one GPU of its launch (rank 0)."""
    launch = fsdp_launch(cfg)
    policy = locate(cfg.policy._target_)
    if not getattr(policy, "trains", False):
        raise ConfigError(f"config 'policy': {policy.__name__} trains nothing: no training memory to plan")
    config = launch["config"]
    memory = MemorySettings(**{k: v for k, v in (launch.get("memory") or {}).items() if k != "_target_"})
    world = int(config.get("num_processes", 1))
    mixed = "no" if config.get("use_cpu") else str(config.get("mixed_precision") or "no")
    from rag_lab.core.batches import trainers

    settings = trainers(cfg)[0][2]
    run = OmegaConf.to_container(cfg, resolve=True)
    began = time.perf_counter()
    with fake.ranks(world) as mesh:
        bench = Bench(mesh, mixed, bool(launch.get("gradient_checkpointing")))
        ctx = Context(run, memory, world, bench)
        phases = plan_of(policy)(ctx, settings)
    machines = int(config.get("num_machines", 1))
    try:
        name = ctx.model_name()[0]
    except RagLabError:  # a generator that names no model (a teacher, an API model)
        name = str(ctx.generator.get("_target_", "no generator")).rsplit(".", 1)[-1]
    title = (
        f"{(run.get('experiment') or {}).get('name') or policy.__name__} ({name}; {world} processes on "
        f"{machines} machine(s); planned in {time.perf_counter() - began:.1f} s)"
    )
    return Ledger(title, world, memory.gpu_bytes, memory.headroom, phases)


def check(cfg: DictConfig) -> None:
    """Before a GPU launch trains: a plan over its bound is one line naming the phase and its largest line.
    Planned where the launch names its GPU's memory (``launch.memory``, with ``check``: launch=fsdp) and the
    policy trains; CPU launches (cpu2, fsdp_cpu) name none. The runner leaves the embedded tiny LM out (a
    fraction of a GiB: the plan's seconds for nothing)."""
    launch = cfg.get("launch")
    memory = launch.get("memory") if launch else None
    trains = getattr(locate(cfg.policy._target_), "trains", False)
    if not memory or not memory.get("check", True) or not trains or launch.config.get("use_cpu"):
        return
    ledger = plan(cfg)
    log.info("memory plan: %s", ledger.headline())
    over = ledger.over()
    if over:
        raise ConfigError(
            f"config 'launch.memory.gpu_memory_gib': {over} (python -m rag_lab.plan with this run's "
            "overrides prints the ledger)"
        )
