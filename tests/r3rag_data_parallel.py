"""One PPO update of R3-RAG on a fixed global batch, on however many processes launched it (``python`` alone:
one; ``accelerate launch --multi_gpu --num_processes 2``: two, gloo on CPU). Each process takes every N-th
episode of the batch; rank 0 writes the updated weights and the update's statistics to ``OUT``. Run by
tests/test_r3rag_data_parallel.py, which compares 1 process with 2.

    python tests/r3rag_data_parallel.py MODEL_DIR OUT.pt
    python tests/r3rag_data_parallel.py MODEL_DIR OUT.pt --fork 2   # one process, then 2 forked from it

``--fork N``: the one-process update into ``OUT``, then the same update on N processes forked from this
one by accelerate's ``debug_launcher`` (gloo over a file store; the imports are not paid again) into
``OUT`` with ``.fork`` before its suffix. One thread each: a child forked from a process whose OpenMP
pool ran can hang in its first parallel region.
"""

import sys

import torch


def global_batch(vocab: int) -> tuple[list, list[list[float]]]:
    """Six episodes of 1-3 steps: (samples, per-episode step rewards), prompts and completions drawn once."""
    from rag_lab.policies.r3rag.samples import Sample

    draw = torch.Generator().manual_seed(0)
    samples, rewards = [], []
    for episode, steps in enumerate([3, 1, 2, 2, 3, 1]):
        for step in range(steps):
            prompt = torch.randint(
                3, vocab, (int(torch.randint(5, 12, (1,), generator=draw)),), generator=draw
            )
            completion = torch.randint(
                3, vocab, (int(torch.randint(2, 6, (1,), generator=draw)),), generator=draw
            )
            samples.append(Sample(prompt.tolist(), completion.tolist(), episode, step))
        rewards.append(torch.randn(steps, generator=draw).tolist())
    return samples, rewards


def update(model_dir: str):
    """The PPO update of this process's episodes; (the trained model with its value head, the update's stats,
    the accelerator)."""
    from dataclasses import replace

    from transformers import AutoModelForCausalLM

    from rag_lab.policies.r3rag.ppo import PPOSettings, advantages, build, make_accelerator, score
    from rag_lab.policies.r3rag.ppo import update as ppo_update
    from rag_lab.policies.r3rag.samples import tensors

    torch.manual_seed(0)
    accelerator = make_accelerator()
    lm = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    settings = PPOSettings(ppo_epochs=3, minibatches=1, micro_batch=2, actor_lr=1e-2, critic_lr=1e-2)
    model, reference, optimizer = build(lm, settings, accelerator)
    samples, rewards = global_batch(lm.config.vocab_size)
    rank, world = accelerator.process_index, accelerator.num_processes
    mine = list(range(rank, len(rewards), world))
    local = [replace(s, episode=mine.index(s.episode)) for s in samples if s.episode in mine]
    batch = tensors(local, pad_id=0)
    batch = score(model, reference, batch, settings.micro_batch, accelerator)
    batch = advantages(local, [rewards[i] for i in mine], batch, settings, accelerator)
    stats = ppo_update(model, optimizer, batch, settings, accelerator, seed=0)
    return accelerator.unwrap_model(model), stats, accelerator


def main(model_dir: str, out: str) -> None:
    model, stats, accelerator = update(model_dir)
    if accelerator.is_main_process:
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        torch.save({"weights": state, "stats": stats, "processes": accelerator.num_processes}, out)
    accelerator.wait_for_everyone()


def forked(model_dir: str, out: str) -> None:
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)  # the parent's one-process state came along
    main(model_dir, out)


if __name__ == "__main__":
    if "--fork" in sys.argv:
        from pathlib import Path

        from accelerate import debug_launcher

        torch.set_num_threads(1)
        main(*sys.argv[1:3])
        out = Path(sys.argv[2])
        debug_launcher(
            forked,
            (sys.argv[1], str(out.with_suffix(".fork" + out.suffix))),
            num_processes=int(sys.argv[sys.argv.index("--fork") + 1]),
        )
    else:
        main(*sys.argv[1:3])
