"""One EVO-RAG cycle on an untrained toy tiny LM, in however many processes launched it: its branches, a
dev EM of fewer questions than processes, the published cycle; and which rollout batches and dev questions
each process played. Run by tests/test_evorag_data_parallel.py, which compares 1 process with 2.

    python tests/evorag_data_parallel.py MODEL_DIR OUT            # one process: OUT/p1/
    python tests/evorag_data_parallel.py MODEL_DIR OUT --fork 2   # then 2 forked from it: OUT/p2/

In ``OUT/p<N>/``: ``branches.json`` (the cycle's branches as the main process has them), ``lone.json``
(the dev EM of one question: a process plays none), ``played-<rank>.json`` (each process's rollout batches
and dev shares, by question id), ``heads.pt`` (the preference heads) and ``cycle/`` (the published cycle:
model, pairs, summary). One thread each: a child forked from a process whose OpenMP pool ran can hang.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # conftest's world, data_parallel's toy encoder

import torch

# six questions in rollout batches of two (three batches: process 0 plays two, process 1 one), three dev
QUESTIONS, BATCH, DEV = 6, 2, 3


class Lengths:
    """The reward's toy encoder for any text: its length and its first letter."""

    def encode(self, texts):
        return [[float(len(t)), float(ord(t[0]) if t else 0)] for t in texts]


def policy():
    from rag_lab.policies.evorag.policy import EvoRAG, PreferenceSettings
    from rag_lab.rewards.evorag import EvoRAGReward
    from rag_lab.train.lora import LoRA

    return EvoRAG(
        reward=EvoRAGReward(encoder=Lengths()), stages=[1], max_cycles=1, questions_per_cycle=QUESTIONS,
        rollout_batch=BATCH, states_per_episode=1, dev_limit=DEV, preference=PreferenceSettings(encoder="-"),
        lr=1e-2, batch_size=2, lora=LoRA(r=4, alpha=8, dropout=0.0), save_steps=100, k=2, max_turns=3,
        max_new_tokens=8, seed=0,
    )  # fmt: skip


ORIGINAL = {}


def recording(out: Path):
    """The trainer's batch rollouts and dev EM, each process writing down the questions it played."""
    from rag_lab.policies.evorag import trainer
    from rag_lab.train.parallel import rank

    played = {"batches": [], "dev": []}
    # the trainer's own (a forked process finds the parent's recording in place)
    branch_batch, run_agent = (
        ORIGINAL.setdefault("batch", trainer.branch_batch),
        ORIGINAL.setdefault("agent", trainer.run_agent),
    )

    def save() -> None:
        (out / f"played-{rank()}.json").write_text(json.dumps(played))

    def batch(policy, generator, env, stage, picked, seed):
        played["batches"].append([q.id for q in picked])
        save()
        return branch_batch(policy, generator, env, stage, picked, seed)

    def agent(protocol, examples, *args, **kwargs):
        played["dev"].append([q.id for q in examples])
        save()
        return run_agent(protocol, examples, *args, **kwargs)

    trainer.branch_batch, trainer.run_agent = batch, agent


def golds(dev: list) -> list:
    """``dev`` with every second question's gold answer "" (the untrained LM's prediction: it writes no valid
    action), so that dev EM is neither 0 nor 1 and each process's share counts."""
    from dataclasses import replace

    return [replace(q, answers=("",)) if i % 2 else q for i, q in enumerate(dev)]


def main(model_dir: str, out: str) -> None:
    from data_parallel import ToyEncoder
    from hydra.utils import instantiate

    from rag_lab.core.config import compose
    from rag_lab.env import Env
    from rag_lab.generators.hf import HFGenerator
    from rag_lab.policies.evorag.preference import PreferenceModel
    from rag_lab.policies.evorag.trainer import collect, dev_em, run_cycle
    from rag_lab.retrievers.bm25 import BM25Retriever
    from rag_lab.train.parallel import is_main, processes, publish_on_main

    from conftest import TINY_DATA

    here = Path(out) / f"p{processes()}"
    here.mkdir(parents=True, exist_ok=True)
    recording(here)
    data = instantiate(compose(TINY_DATA).data)
    generator = HFGenerator(model_dir, f"{model_dir}/tokenizer", chat=False, dtype="float32", batch_size=64)
    env, evorag = Env(data.corpus, BM25Retriever(data.corpus), generator), policy()
    train, dev = data.split("train")[:20], golds(data.split("dev")[:DEV])
    done = here / "cycle"
    branches = collect(evorag, generator, env, 1, 1, train, done.with_name("cycle.work"))
    publish_on_main(lambda: (here / "branches.json").write_text(json.dumps(branches)))
    lone = dev_em(evorag, generator, env, dev[1:2])  # fewer questions than processes: one has none
    publish_on_main(lambda: (here / "lone.json").write_text(json.dumps(lone)))
    pm = PreferenceModel(ToyEncoder(), seed=0)
    run_cycle(evorag, generator, env, 1, 1, train, dev, pm, done)  # reads the branches collect left
    if is_main():
        torch.save({k: v.detach().cpu() for k, v in pm.heads.state_dict().items()}, here / "heads.pt")


def forked(*args: str) -> None:
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)  # the parent's one-process state came along
    main(*args)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(*sys.argv[1:3])
    if "--fork" in sys.argv:
        from accelerate import debug_launcher

        debug_launcher(
            forked, tuple(sys.argv[1:3]), num_processes=int(sys.argv[sys.argv.index("--fork") + 1])
        )
