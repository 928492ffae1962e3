"""A policy for test_launch_settings.py (``policy._target_: launched_report.Reporting``, from a yaml on the
run's search path): in each launched process its ``fit`` writes what the launch gave the process (its process
group's timeout as torch holds it, gradient checkpointing as every trainer's TRL config takes it, or with
``train`` as TRL's SFTTrainer trained one step of the cold start's ``sft`` with it, the program that started
it, the rendezvous port), then its ``rollout`` records which process played which questions."""

import json
import os
from pathlib import Path

from rag_lab.env import Episode


def group_timeout_s() -> float:
    """The default process group's timeout, as its gloo backend holds it."""
    import torch
    import torch.distributed as dist

    return dist.group.WORLD._get_backend(torch.device("cpu")).options._timeout.total_seconds()


def who() -> str:
    """``rank<i>`` in a launched process, ``runner`` in the runner's own."""
    from rag_lab.train.parallel import processes, rank

    return f"rank{rank()}" if processes() > 1 else "runner"


class Reporting:
    trains = True

    def __init__(
        self,
        # the tiny LM the SFT step trains (tests/conftest.py's tiny_lm)
        model: str,
        # where each process writes its report
        out: str,
        # train one SFT step on 2 pairs (1 a process) and report the trainer's gradient checkpointing (TRL's
        # import: 6 s a process); false: the keys every trainer's TRL config takes
        train: bool = False,
        batch_size: int = 2,
    ):
        self.model, self.out, self.train, self.batch_size = model, Path(out), train, batch_size

    @staticmethod
    def global_batches(s: dict) -> dict[str, int]:
        return {"batch_size": int(s["batch_size"])}

    def fit(self, env, train, dev, out_dir: Path, logger=None) -> None:
        from rag_lab.train.parallel import gradient_checkpointing

        report = self.out / f"{who()}.json"
        if who() == "runner" or report.exists():  # the runner's and the evaluation's fit: published already
            return
        checkpointing = gradient_checkpointing()["gradient_checkpointing"]
        if self.train:
            from rag_lab.train.sft import SFTSettings, sft

            pairs = [("where was ada born", "paris"), ("where was ada born", "london")]
            settings = SFTSettings(max_steps=1, batch_size=self.batch_size, warmup_steps=0, max_length=32)
            trainer, _ = sft(self.model, f"{self.model}/tokenizer", pairs, settings, Path(out_dir) / "sft")
            checkpointing = [trainer.args.gradient_checkpointing, trainer.model.is_gradient_checkpointing]
        self.out.mkdir(parents=True, exist_ok=True)
        got = {
            "timeout_s": group_timeout_s(),
            "gradient_checkpointing": checkpointing,
            "program": os.environ.get("RAG_LAB_TEST_PROGRAM"),
            "processes": int(os.environ["WORLD_SIZE"]),
            "port": int(os.environ["MASTER_PORT"]),
        }
        report.write_text(json.dumps(got))

    def rollout(self, env, batch) -> list[Episode]:
        with (self.out / f"played-{who()}.jsonl").open("a") as f:
            f.write(json.dumps([ex.id for ex in batch]) + "\n")
        return [Episode(ex.id, ex.question, prediction=ex.answers[0]) for ex in batch]
