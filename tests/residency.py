"""Where each model's weights live in the processes of a sharded launch (issue 72), on the conftest's tiny LM:
two processes forked under launch=fsdp_cpu's FSDP variables with RAM-efficient loading on, as ``accelerate
launch`` sets them, each doing what a launched R3-RAG process does; then one process resuming the two's
checkpoint. Run by tests/test_residency.py.

    python tests/residency.py MODEL_DIR WORK
    python tests/residency.py MODEL_DIR WORK --sft   # TRL's trainer killed and resumed, sharded checkpoints

In each of the two processes (``WORK/rank<i>.pt``): whether a plain ``from_pretrained`` (a frozen model no
trainer prepares: a TRL reference, an encoder), the run's generator and the policy's copy hold the
checkpoint's weights; whether the run's generator let its weights go; what a load inside
``trained_loading`` holds before ``prepare``; PPO's reference's logits on fixed ids; the LM's share of the
reference. Then one PPO update, a checkpoint (``WORK/ppo``), a fresh start resumed from it, and its weights
and optimizer state; rank 0 also writes the trained weights and optimizer state, and the final save
(``WORK/saved``). Last, in this process alone: the same fresh start resumed from the two processes'
checkpoint (``WORK/one.pt``).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # its siblings data_parallel.py, r3rag_data_parallel.py

import torch

IDS = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]])


def truth(model_dir: str) -> dict[str, torch.Tensor]:
    """The checkpoint's weights, read from its file (transformers' loading switches do not touch it)."""
    from safetensors.torch import load_file

    return load_file(str(Path(model_dir) / "model.safetensors"))


def holds(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> bool:
    state = model.state_dict()
    return all(torch.equal(state[k].cpu(), v) for k, v in weights.items())


def trained(model_dir: str, work: Path, accelerator, record: dict):
    """PPO's build from the policy's copy (start.py's), one update of this process's episodes; the trainer
    around it (model, reference, optimizer) with the update's weights."""
    from dataclasses import replace

    from r3rag_data_parallel import global_batch

    from rag_lab.generators.hf import HFGenerator
    from rag_lab.policies.r3rag.ppo import PPOSettings, advantages, build, score, update
    from rag_lab.policies.r3rag.samples import tensors
    from rag_lab.policies.r3rag.trainer import PPOTrainer
    from rag_lab.train.start import starting_model

    base = HFGenerator(model_dir, f"{model_dir}/tokenizer", dtype="float32", chat=False)
    record["generator"] = holds(base.model, truth(model_dir))
    _, generator = starting_model("r3rag", base, None, None, str(work / "cache"), trains=True)
    record["released"] = base._model is None
    record["copy"] = holds(generator.model, truth(model_dir))
    torch.manual_seed(0)
    settings = PPOSettings(ppo_epochs=1, minibatches=1, micro_batch=2, actor_lr=1e-2, critic_lr=1e-2)
    t = PPOTrainer.__new__(PPOTrainer)  # the trainer's checkpoint and resume around these three
    t.model, t.reference, t.optimizer = build(generator.model, settings, accelerator)
    t.accelerator, t.engine, t.settings = accelerator, None, settings
    with torch.no_grad():  # a collective under FSDP: every process, the same ids
        record["reference_logits"] = t.reference(input_ids=IDS).logits.cpu()
    samples, rewards = global_batch(generator.model.config.vocab_size)
    rank, world = accelerator.process_index, accelerator.num_processes
    mine = list(range(rank, len(rewards), world))
    local = [replace(s, episode=mine.index(s.episode)) for s in samples if s.episode in mine]
    batch = score(t.model, t.reference, tensors(local, pad_id=0), settings.micro_batch, accelerator)
    batch = advantages(local, [rewards[i] for i in mine], batch, settings, accelerator)
    update(t.model, t.optimizer, batch, settings, accelerator, seed=0)
    return t


def full_states(t) -> tuple[dict, dict]:
    """(the full weights, the full optimizer state keyed by parameter name), on the main process."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    from rag_lab.train.sharded import fsdp_modules, full_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=fsdp_modules(t.model))
    return full_state_dict(t.model), get_optimizer_state_dict(t.model, t.optimizer, options=options)


def resumed(model_dir: str, work: Path, accelerator) -> tuple[dict, dict]:
    """A fresh start (the LM from disk, PPO's build) resumed from ``WORK/ppo``; its full states."""
    from rag_lab.policies.r3rag.ppo import PPOSettings, build
    from rag_lab.policies.r3rag.trainer import PPOTrainer
    from rag_lab.train.resume import load_model

    lm = load_model(model_dir, like=torch.nn.Linear(1, 1))
    settings = PPOSettings(ppo_epochs=1, minibatches=1, micro_batch=2, actor_lr=1e-2, critic_lr=1e-2)
    t = PPOTrainer.__new__(PPOTrainer)
    t.model, t.reference, t.optimizer = build(lm, settings, accelerator)
    t.accelerator, t.engine, t.settings = accelerator, None, settings
    assert t.resume(work / "ppo")[0] == 1
    return full_states(t)


def main(model_dir: str, work: str) -> None:
    """In each of the forked processes (module docstring)."""
    import os

    from accelerate.state import AcceleratorState
    from transformers import AutoModelForCausalLM

    from rag_lab.core.loading import loading_on_purpose, trained_loading
    from rag_lab.policies.r3rag.ppo import make_accelerator
    from rag_lab.train.parallel import state

    AcceleratorState._reset_state(reset_partial_state=True)  # the parent's state came along
    os.environ["LOCAL_RANK"] = str(state().process_index)  # as accelerate launch sets it (debug launcher: 0)
    loading_on_purpose()  # as rag_lab.runner.launched does, before any model
    work, record = Path(work), {}
    record["plain"] = holds(AutoModelForCausalLM.from_pretrained(model_dir), truth(model_dir))
    with trained_loading():
        lm = AutoModelForCausalLM.from_pretrained(model_dir)
    record["trained_zeros"] = all(not v.any() for v in lm.state_dict().values())
    accelerator = make_accelerator()
    t = trained(model_dir, work, accelerator, record)
    # (this process's share of the reference, the whole of it): parameters that are not DTensors count whole
    local = sum(getattr(p, "to_local", lambda p=p: p)().numel() for p in t.reference.parameters())
    record["reference_share"] = (local, sum(p.numel() for p in t.reference.parameters()))
    weights, optimizer = full_states(t)
    t.checkpoint(work / "ppo", 1, [{"step": 1}])
    saved = t.gathered()
    if accelerator.is_main_process:
        saved.save(work / "saved")
        torch.save({"weights": weights, "optimizer": optimizer}, work / "trained.pt")
    record["resumed"] = resumed(model_dir, work, accelerator)
    torch.save(record, work / f"rank{accelerator.process_index}.pt")


def sft_resumed(model_dir: str, work: str) -> None:
    """``--sft``: the cold start's SFT (TRL's trainer) 3 steps straight, then killed once its checkpoint of
    step 2 is written (sharded: ``fsdp_state_dict_type: SHARDED_STATE_DICT``) and run again, resuming from
    it; rank 0 writes both results' full weights and the checkpoint's files (``WORK/sft.pt``)."""
    import os

    from accelerate.state import AcceleratorState
    from data_parallel import pairs
    from transformers import TrainerCallback

    from rag_lab.core.loading import loading_on_purpose
    from rag_lab.train.parallel import state
    from rag_lab.train.sft import SFTSettings, sft
    from rag_lab.train.sharded import full_state_dict

    class Killed(TrainerCallback):
        def on_save(self, args, trainer_state, control, **kwargs):
            if trainer_state.global_step == 2:
                raise KeyboardInterrupt  # as a kill leaves it: checkpoint-2 written, step 3 never run

    AcceleratorState._reset_state(reset_partial_state=True)
    os.environ["LOCAL_RANK"] = str(state().process_index)
    loading_on_purpose()
    settings = SFTSettings(max_steps=3, batch_size=4, lr=1e-2, warmup_steps=0, max_length=64, save_steps=1)
    out = {}
    for name, callbacks in (("straight", ()), ("killed", (Killed(),)), ("resumed", ())):
        where = Path(work) / ("straight" if name == "straight" else "killed")
        try:
            trainer, stats = sft(model_dir, f"{model_dir}/tokenizer", pairs(40), settings, where, callbacks)
        except KeyboardInterrupt:
            out["checkpoint"] = sorted(p.name for p in (where / "checkpoint-2").iterdir())
            continue
        out[name], out[f"{name}_from"] = full_state_dict(trainer.model), stats["resumed_from"]
    if state().is_main_process:
        torch.save(out, Path(work) / "sft.pt")


if __name__ == "__main__":
    import os

    from accelerate import debug_launcher
    from data_parallel import FSDP_ENV

    torch.set_num_threads(1)
    model_dir, work = sys.argv[1:3]
    os.environ.update(FSDP_ENV)  # launch=fsdp_cpu's, RAM-efficient loading on (as in launch=fsdp)
    if "--sft" in sys.argv:
        debug_launcher(sft_resumed, (model_dir, work), num_processes=2)
        sys.exit(0)
    debug_launcher(main, (model_dir, work), num_processes=2)
    for key in FSDP_ENV:
        os.environ.pop(key)
    from rag_lab.policies.r3rag.ppo import make_accelerator

    torch.save({"resumed": resumed(model_dir, Path(work), make_accelerator())}, Path(work) / "one.pt")
