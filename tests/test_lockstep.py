"""Generation on a sharded model (issue 72, rag_lab/train/lockstep.py): two FSDP2 processes on CPU (gloo),
each playing its own multi-turn episodes on the sharded model itself (different questions, turns and
completion lengths, so different numbers of forwards), finish without a hang and play what one unsharded
process plays, and no process ever holds a full copy of the weights. The ZeRO-3 branch is checked on a fake
accelerator (DeepSpeed forms no process group on CPU)."""

import gc
import json
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rag_lab.env import Env
from rag_lab.generators.base import Sampling
from rag_lab.generators.hf import HFGenerator
from rag_lab.retrievers.bm25 import BM25Retriever

from conftest import free_port

pytestmark = pytest.mark.usefixtures("one_thread")
LM = Path(__file__).resolve().parents[1] / "rag_lab" / "checkpoints" / "tiny_lm"
# what tests/data_parallel.py's --fsdp sets: accelerate's FSDP2 variables of launch=fsdp_cpu
FSDP_ENV = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "FSDP_STATE_DICT_TYPE": "FULL_STATE_DICT",
            "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP",
            "FSDP_RESHARD_AFTER_FORWARD": "true"}  # fmt: skip
GREEDY = Sampling(max_new_tokens=32)


def generator() -> HFGenerator:
    return HFGenerator(str(LM), str(LM / "tokenizer"), dtype="float32", batch_size=4)


def in_ranks(fn, args: tuple, n: int = 2, timeout_s: float = 60.0) -> None:
    """``fn(*args)`` in ``n`` processes forked from this one, a gloo group over a file store between them
    (accelerate's ``debug_launcher`` set-up, whose join has no deadline): a hang fails the test after
    ``timeout_s`` instead of hanging it. (A shared launcher fixture is to come in tests/conftest.py.)"""
    from accelerate.utils import patch_environment
    from accelerate.utils.launch import PrepareForLaunch
    from torch.multiprocessing import start_processes

    with tempfile.NamedTemporaryFile() as store, patch_environment(
        world_size=n, master_addr="127.0.0.1", master_port=str(free_port()), accelerate_mixed_precision="no",
        accelerate_debug_rdv_file=store.name, accelerate_use_cpu="yes", gloo_socket_ifname="lo",
        omp_num_threads="1", **FSDP_ENV,  # one thread a rank (accelerate would take the cores / ranks)
    ):  # fmt: skip
        ranks = start_processes(PrepareForLaunch(fn, debug=True), args, n, join=False, start_method="fork")
        deadline = time.monotonic() + timeout_s
        while not ranks.join(timeout=1.0):
            if time.monotonic() > deadline:
                for process in ranks.processes:
                    process.kill()
                pytest.fail(f"the {n} ranks did not end within {timeout_s:.0f} s: a collective mismatched")


def full_copies(model) -> int:
    """Plain tensors alive with the full shape of one of ``model``'s sharded weights and storage behind
    them (FSDP's own gathered buffers are freed after each layer: their storage has size 0)."""
    from torch.distributed.tensor import DTensor

    shapes = {tuple(p.shape) for p in model.parameters() if p.dim() == 2}  # the weight matrices
    tensors = [t for t in gc.get_objects() if isinstance(t, torch.Tensor) and not isinstance(t, DTensor)]
    return sum(tuple(t.shape) in shapes and t.device.type == "cpu" and t.untyped_storage().nbytes() > 0
               for t in tensors)  # fmt: skip


def forbid_full_weights() -> None:
    """What a full copy of the weights is made with, made to fail: torch's full state dict (the old
    generation copy), our ``full_state_dict`` and a DTensor's ``full_tensor``."""
    import torch.distributed.checkpoint.state_dict as dcp
    from torch.distributed.tensor import DTensor

    import rag_lab.train.sharded as sharded

    def refused(*args, **kwargs):
        raise AssertionError("a full copy of the weights was gathered for generation")

    dcp.get_model_state_dict = sharded.full_state_dict = refused
    DTensor.full_tensor = refused


def dapo_rollouts(env: Env, questions):
    """DAPO's rollout function (TRL's rollout_func) over ``questions``: greedy groups of 2, no refill."""
    from rag_lab.policies.dapo.rollout import SearchRollouts

    zero = (lambda texts, answers: [0.0] * len(texts), 1.0)
    return SearchRollouts(env, env.generator, questions, [zero], k=2, max_turns=3, sampling=GREEDY,
                          dynamic_sampling=False, max_rounds=1, seed=0)  # fmt: skip


def prompts_of(rollouts, questions) -> list:
    return [rollouts.first_prompt(q) for q in questions for _ in range(2)]


def play_sharded(out: str, data, questions: dict) -> None:
    """In each rank: the tiny LM sharded by FSDP2, then DAPO's rollouts of this rank's questions and a
    held-out measurement of 5 questions (3 on rank 0, 2 on rank 1) on it; what each played, its forwards and
    the full-size tensors alive before and after, into ``out/rank<r>.json``."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from rag_lab.env.engine import run_agent
    from rag_lab.env.protocols.tagged import DAPOTagged
    from rag_lab.train import lockstep
    from rag_lab.train.heldout import HeldOut, HeldOutCallback
    from rag_lab.train.parallel import state

    torch.set_num_threads(1)
    AcceleratorState._reset_state(reset_partial_state=True)  # the parent's one-process state came along
    state()  # FSDP on CPU, as a launched process makes it
    rank = torch.distributed.get_rank()
    accelerator, base = Accelerator(), generator()
    model = accelerator.prepare(base.model)
    before = full_copies(model)
    forbid_full_weights()
    phases = []
    real = lockstep.Lockstep.finish

    def finish(self):  # the phase's own forwards and the dummies it made to keep in step
        real(self)
        phases.append((self.forwards, self.dummies))

    lockstep.Lockstep.finish = finish
    env = Env(data.corpus, BM25Retriever(data.corpus), base)
    rollouts = dapo_rollouts(env, questions[rank])
    trainer = SimpleNamespace(model=model, accelerator=accelerator, num_generations=2, use_vllm=False,
                              state=SimpleNamespace(global_step=0))  # fmt: skip
    dapo = rollouts(prompts_of(rollouts, questions[rank]), trainer)
    played = []

    def rollout(actor, share):
        episodes = run_agent(DAPOTagged(), share, env.with_generator(actor), GREEDY, 2, 3)
        played.extend([q.id, [s.token_ids for s in e.steps]] for q, e in zip(share, episodes, strict=True))
        return episodes

    callback = HeldOutCallback(HeldOut(n=3), questions["heldout"], rollout, lambda row: None, generator=base)
    callback.trainer = trainer
    callback.measure(0, model)
    record = {
        "dapo": dapo["completion_ids"],
        "heldout": played,
        "phases": phases,
        "full_copies": [before, full_copies(model)],
        "sharded": lockstep.in_step(model, accelerator),
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))


def test_ranks_that_play_different_turns_generate_on_the_sharded_model_in_step(data, tmp_path):
    """Rank 0 plays 3 questions, rank 1 one (DAPO's rollouts), then 3 and 2 held-out questions: their
    forwards differ, the one that ends first makes dummy forwards until the other ends (no hang), and each
    plays what one process plays on the unsharded model (greedy), with no full copy of the weights."""
    from rag_lab.env.engine import run_agent
    from rag_lab.env.protocols.tagged import DAPOTagged

    dev = data.split("dev")
    # greedy, the tiny LM plays 2 and 2 turns (rank 0), 3 (rank 1); held out: 3 and 3 (rank 0), 1 (rank 1)
    questions = {0: dev[6:8], 1: dev[5:6], "heldout": dev[2:5]}
    one = Env(data.corpus, BM25Retriever(data.corpus), generator())
    trainer = SimpleNamespace(model=one.generator.model, accelerator=None, num_generations=2, use_vllm=False,
                              state=SimpleNamespace(global_step=0))  # fmt: skip
    want = {}
    for rank in (0, 1):
        rollouts = dapo_rollouts(one, questions[rank])
        want[rank] = rollouts(prompts_of(rollouts, questions[rank]), trainer)["completion_ids"]
    episodes = run_agent(DAPOTagged(), questions["heldout"], one, GREEDY, 2, 3)
    pairs = zip(questions["heldout"], episodes, strict=True)
    heldout = {q.id: [s.token_ids for s in e.steps] for q, e in pairs}
    in_ranks(play_sharded, (str(tmp_path), data, questions))
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank, record in enumerate(got):
        assert record["sharded"]
        assert record["dapo"] == want[rank]
        share = questions["heldout"][rank::2]  # the held-out questions this rank measured
        assert dict(map(tuple, record["heldout"])) == {q.id: heldout[q.id] for q in share}
        assert record["full_copies"][1] == record["full_copies"][0]  # nothing full-size left behind
    turns = [max(len(steps) for _, steps in record["heldout"]) for record in got]
    for phase in (0, 1):  # each phase: every rank made as many forwards as the other, dummies included
        (f0, d0), (f1, d1) = (record["phases"][phase] for record in got)
        assert f0 != f1 and f0 + d0 == f1 + d1 and min(d0, d1) == 0 < max(d0, d1)
    assert sum(len(t) for t in want[0]) != sum(len(t) for t in want[1]) and turns[0] != turns[1]


class FakeAccelerator:
    """An accelerator whose state says DeepSpeed ZeRO-3 (what TRL's unwrap and our selection read)."""

    device = torch.device("cpu")
    state = SimpleNamespace(deepspeed_plugin=SimpleNamespace(zero_stage=3), fsdp_plugin=None)

    def unwrap_model(self, model, keep_fp32_wrapper=True):
        return model


def test_under_zero3_the_model_generates_unwrapped_without_a_gather_every_rank_in_step(monkeypatch, tmp_path):
    """The ZeRO-3 branch (no CPU process group for DeepSpeed here): TRL's ``unwrap_model_for_generation``
    without ``GatheredParameters`` (DeepSpeed's hooks fetch each layer), the model in lockstep, and a
    one-process group's phase plays what the model plays alone."""
    import trl.models.utils as trl_utils

    from rag_lab.train import lockstep
    from rag_lab.train.parallel import CHECKPOINTING_ENV

    asked = []
    real = trl_utils.unwrap_model_for_generation

    def unwrap(model, accelerator, gather_deepspeed3_params=True, **kwargs):
        asked.append((gather_deepspeed3_params, kwargs["gradient_checkpointing_kwargs"]))
        return real(model, accelerator, gather_deepspeed3_params=gather_deepspeed3_params, **kwargs)

    monkeypatch.setattr(trl_utils, "unwrap_model_for_generation", unwrap)
    monkeypatch.setenv(CHECKPOINTING_ENV, "1")  # launch.gradient_checkpointing, as zero3.yaml sets it
    base = generator()
    base.model.train()  # as a trainer holds it
    torch.distributed.init_process_group("gloo", store=torch.distributed.FileStore(str(tmp_path / "s"), 1),
                                         rank=0, world_size=1)  # fmt: skip
    try:
        with lockstep.generating(base, base.model, FakeAccelerator()) as actor:
            assert isinstance(actor, lockstep.Lockstep) and actor.root is base.model
            assert not base.model.training  # eval for the phase
            got = actor.generate(["where was ada born ?", "who"], GREEDY)
        with lockstep.generating(base, base.model, None) as plain:  # unsharded: the generator as it is
            assert not isinstance(plain, lockstep.Lockstep) and plain.model is base.model
    finally:
        torch.distributed.destroy_process_group()
    # one unwrap, the partitions not gathered (a gather would import DeepSpeed), checkpointing turned back
    # on after it as the trainers set it (non-reentrant: what ZeRO-3 needs)
    assert asked == [(False, {"use_reentrant": False})]
    assert actor.forwards > 0 and actor.dummies == 0
    assert base.model.training  # as it was before the phase
    want = base.with_model(base.model.eval()).generate(["where was ada born ?", "who"], GREEDY)
    assert [[c.token_ids for c in cs] for cs in got] == [[c.token_ids for c in cs] for cs in want]


def ppo_trainer(data, accelerator):
    """R3-RAG's PPO trainer on the tiny LM (the r3rag protocol), measuring 3 held-out questions greedily."""
    from rag_lab.env.protocols.r3rag import R3RAGStep
    from rag_lab.policies.r3rag.ppo import PPOSettings
    from rag_lab.policies.r3rag.trainer import PPOTrainer, Rollout
    from rag_lab.rewards.r3rag_judges import R3RAGReward
    from rag_lab.train.heldout import HeldOut

    base = generator()
    env = Env(data.corpus, BM25Retriever(data.corpus), base)
    settings = PPOSettings(iterations=1, batch_size=2, temperatures=(1.0,), minibatches=1, micro_batch=2)
    rollout = Rollout(R3RAGStep(), k=2, max_turns=3, max_new_tokens=32)
    return PPOTrainer(base, env, R3RAGReward(), data.split("train")[:4], settings, rollout, 0, accelerator,
                      heldout=HeldOut(n=3), heldout_questions=data.split("dev")[2:5])  # fmt: skip


def recorded_episodes(played: list):
    """R3-RAG's trainer's run_agent, each episode's steps' token ids appended to ``played``."""
    from rag_lab.policies.r3rag import trainer

    real = trainer.run_agent

    def run_agent(protocol, questions, env, *args):
        episodes = real(protocol, questions, env, *args)
        played.extend(
            [q.id, [s.token_ids for s in e.steps]] for q, e in zip(questions, episodes, strict=True)
        )
        return episodes

    trainer.run_agent = run_agent


def measure_ppo_sharded(out: str, data) -> None:
    """In each rank: R3-RAG's actor-critic sharded by FSDP2, its held-out questions measured on it."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from rag_lab.train.parallel import state

    AcceleratorState._reset_state(reset_partial_state=True)
    state()
    t, played = ppo_trainer(data, Accelerator()), []
    before = full_copies(t.model)
    forbid_full_weights()
    recorded_episodes(played)
    t.measure(0, None)
    record = {"heldout": played, "full_copies": [before, full_copies(t.model)]}
    Path(out, f"rank{torch.distributed.get_rank()}.json").write_text(json.dumps(record))


@pytest.mark.slow
def test_r3rags_lm_generates_through_its_sharded_actor_critic_in_step(data, tmp_path, monkeypatch):
    """R3-RAG's LM sits inside its actor-critic, the module FSDP shards as one root: the held-out questions
    generate through the actor-critic's forward (its hooks gather the LM's embeddings and head), every rank
    in step, and play what one unsharded process plays."""
    from accelerate import Accelerator

    from rag_lab.policies.r3rag import trainer

    played = []
    with monkeypatch.context() as patch:  # one process, the actor-critic unsharded
        patch.setattr(trainer, "run_agent", trainer.run_agent)  # restored before the ranks fork
        recorded_episodes(played)
        ppo_trainer(data, Accelerator(cpu=True)).measure(0, None)
    want = dict(map(tuple, played))
    in_ranks(measure_ppo_sharded, (str(tmp_path), data))
    for rank in (0, 1):
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        got = dict(map(tuple, record["heldout"]))
        assert got and got == {q: want[q] for q in got}  # its share, as one process played it
        assert record["full_copies"][1] == record["full_copies"][0]
