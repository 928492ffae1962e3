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

# the packaged GGUF of generator=smollm2 quantizes this hub model (its architecture ships here)
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"


def run_model(cfg: DictConfig) -> tuple[str, str]:
    """(the run's model: a folder or a hub name, the key that names it)."""
    gen = cfg.get("generator") or {}
    if gen.get("model"):
        return str(gen.model), "generator.model"
    target = str(gen.get("_target_", ""))
    if target.endswith("tiny.generator.tiny_lm"):
        from rag_lab.train.tiny.generator import checkpoint_dir

        return str(checkpoint_dir(gen.get("checkpoint"))), "generator.checkpoint"
    if target.endswith("smollm2.smollm2"):
        return SMOLLM2, "generator"
    raise RagLabError(f"generator: {target or 'null'} names no model whose memory the plan can build")


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
    name, key = run_model(cfg)
    from rag_lab.core.batches import trainers

    settings = trainers(cfg)[0][2]
    run = OmegaConf.to_container(cfg, resolve=True)
    began = time.perf_counter()
    with fake.ranks(world) as mesh:
        bench = Bench(mesh, mixed, bool(launch.get("gradient_checkpointing")))
        ctx = Context(run, memory, world, bench, name, key)
        phases = plan_of(policy)(ctx, settings)
    machines = int(config.get("num_machines", 1))
    title = (f"{(run.get('experiment') or {}).get('name') or policy.__name__} ({name}; {world} processes on "
             f"{machines} machine(s); planned in {time.perf_counter() - began:.1f} s)")  # fmt: skip
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
