"""A few updates of one trainer on a fixed global batch, in however many processes launched it; rank 0 saves
the weights to ``OUT``. Run by tests/test_data_parallel.py, which compares 1 process with 2.

    python tests/data_parallel.py TRAINER MODEL_DIR WORK OUT.pt
    python tests/data_parallel.py TRAINER MODEL_DIR WORK OUT.pt --fork 2   # 1 process, then 2 forked from it

TRAINER: ``sft`` (rag_lab.train.sft: the cold start's and the tiny LM's SFT). ``--fork N``: the one-process
run into ``OUT``, then the same on N processes forked from this one by accelerate's ``debug_launcher``
(gloo over a file store; the imports are not paid again) into ``OUT`` with ``.fork`` before its suffix, each
with its own work dir. One thread each: a child forked from a process whose OpenMP pool ran can hang.
"""

import sys
from pathlib import Path

import torch

# Prompts and completions in the conftest tiny LM's words; lengths vary, so length grouping matters.
WORDS = "Q : A S D where was ada born paris london city".split()


def pairs(n: int = 600) -> list[tuple[str, str]]:
    """``n`` pairs: 600 makes transformers' length-grouped megabatches (min(n / 4b, 50) batches of b)
    differ between a batch of 4 and one of 2, so a per-process grouping would train on other rows."""
    draw = torch.Generator().manual_seed(0)

    def text(lo: int, hi: int) -> str:
        length = int(torch.randint(lo, hi, (1,), generator=draw))
        return " ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (length,), generator=draw))

    return [(text(3, 12), text(1, 5)) for _ in range(n)]


def sft(model_dir: str, work: Path) -> tuple[torch.nn.Module, dict]:
    from rag_lab.train.sft import SFTSettings
    from rag_lab.train.sft import sft as run

    settings = SFTSettings(max_steps=3, batch_size=4, lr=1e-2, warmup_steps=0, max_length=64, save_steps=100)
    trainer, stats = run(model_dir, f"{model_dir}/tokenizer", pairs(), settings, work)
    return trainer.model, {"loss": stats["mean_loss"]}


TRAINERS = {"sft": sft}


def main(trainer: str, model_dir: str, work: str, out: str) -> None:
    from rag_lab.train.parallel import barrier, is_main, processes

    model, stats = TRAINERS[trainer](model_dir, Path(work) / f"p{processes()}")
    if is_main():
        weights = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        torch.save({"weights": weights, "stats": stats, "processes": processes()}, out)
    barrier()


def forked(*args: str) -> None:
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)  # the parent's one-process state came along
    main(*args)


if __name__ == "__main__":
    args = sys.argv[1:5]
    torch.set_num_threads(1)
    main(*args)
    if "--fork" in sys.argv:
        from accelerate import debug_launcher

        out = Path(args[3])
        forked_args = (*args[:3], str(out.with_suffix(".fork" + out.suffix)))
        debug_launcher(forked, forked_args, num_processes=int(sys.argv[sys.argv.index("--fork") + 1]))
