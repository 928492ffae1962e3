"""No serial phase under a launch (issue 72): Stop-RAG's offline and dev trajectories, the cold start's
demonstrations and the run's evaluation are shared out over the processes and gathered, and two processes
(accelerate's debug launcher: gloo, forked from this one) make what one makes, the files byte for byte,
each process having played its share."""

import pickle
from functools import partial
from pathlib import Path

import pytest
from accelerate import debug_launcher

from rag_lab.env import Env
from rag_lab.env.teacher.generator import TeacherGenerator
from rag_lab.policies.stoprag.offline import CountingGenerator, Trajectory, collect
from rag_lab.policies.stoprag.pipeline import IterativePipeline
from rag_lab.retrievers.bm25 import BM25Retriever
from rag_lab.train.parallel import processes, rank, summed

pytestmark = pytest.mark.usefixtures("one_thread")


def in_two(function, *args) -> None:
    """``function(*args)`` in each of two processes (accelerate's debug launcher: gloo over a file store)."""
    debug_launcher(partial(forked, function, *args), num_processes=2)


def forked(function, *args) -> None:
    """In a forked process: accelerate's state made anew (this process's one-process state, made by an earlier
    test's ``TrainingArguments``, came along with the fork), then ``function(*args)``."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    function(*args)


def keep(out: Path, name: str, value) -> None:
    """This process's ``value``, as ``<out>/<name>-<processes>-<rank>.pkl``."""
    (out / f"{name}-{processes()}-{rank()}.pkl").write_bytes(pickle.dumps(value))


def kept(out: Path, name: str, n: int, r: int = 0):
    return pickle.loads((out / f"{name}-{n}-{r}.pkl").read_bytes())


# ---- Stop-RAG's offline data and dev trajectories ------------------------------------------------------


def trajectories(data, out: Path) -> None:
    """Stop-RAG's offline data (2 samples a state; one file for all processes, as the cache's) and its dev
    trajectories (greedy answers; a file of each process's own, as in its own ``out_dir``) of 10 questions
    in batches of 3 (4 batches: 2 rounds of 2 processes)."""
    env = Env(data.corpus, BM25Retriever(data.corpus), CountingGenerator(TeacherGenerator(data)))
    pipeline, questions = IterativePipeline(iterations=2, max_new_tokens=16), data.split("train")[:10]
    trajs = collect(pipeline, env, questions, out / f"offline-{processes()}.jsonl", samples=2, batch_size=3)
    dev = collect(pipeline, env, data.split("dev")[:10], out / f"dev-{processes()}-{rank()}.jsonl", samples=0,
                  greedy_answers=True, batch_size=3)  # fmt: skip
    keep(out, "trajectories", (trajs, dev, env.generator.calls, summed(env.generator.calls)))


def test_two_processes_collect_stoprags_trajectories_of_one(data, tmp_path):
    """Two processes resume each file at its second batch, as the main process reads it (the other process
    has no dev file of its own), and share the three batches left of each: every process gets all the
    trajectories, equal to one process's, and the main process alone writes the files, the one process's
    byte for byte; each process made its share of the generator calls."""
    env = Env(data.corpus, BM25Retriever(data.corpus), TeacherGenerator(data))
    pipeline, train, dev = (
        IterativePipeline(iterations=2, max_new_tokens=16),
        data.split("train"),
        data.split("dev"),
    )
    collect(pipeline, env, train[:3], tmp_path / "offline-2.jsonl", samples=2, batch_size=3)
    collect(pipeline, env, dev[:3], tmp_path / "dev-2-0.jsonl", samples=0, greedy_answers=True, batch_size=3)
    trajectories(data, tmp_path)
    in_two(trajectories, data, tmp_path)
    one, (zero, two) = (
        kept(tmp_path, "trajectories", 1),
        (kept(tmp_path, "trajectories", 2, r) for r in (0, 1)),
    )
    assert zero[:2] == two[:2] == one[:2] and all(isinstance(t, Trajectory) for t in one[0] + one[1])
    assert [t.question_id for t in one[0]] == [ex.id for ex in data.split("train")[:10]]
    assert all(len(t.rewards) == 3 for t in one[0]) and all(len(t.answers) == 2 for t in one[1])
    assert (tmp_path / "offline-2.jsonl").read_bytes() == (tmp_path / "offline-1.jsonl").read_bytes()
    assert (tmp_path / "dev-2-0.jsonl").read_bytes() == (tmp_path / "dev-1-0.jsonl").read_bytes()
    assert not (tmp_path / "dev-2-1.jsonl").exists()
    calls = (one[2], zero[2], two[2])
    # one process: 5 calls a batch (2 iterations of 2, then the final answers), 4 batches of each file
    assert calls[0] == 5 * 4 + 5 * 4 and calls[1] > 0 and calls[2] > 0
    assert calls[1] + calls[2] == calls[0] - 2 * 5  # the first batch of each was on file
    assert zero[3] == two[3] == calls[1] + calls[2]  # what Stop-RAG's stats count: every process's calls


# ---- the cold start's demonstrations --------------------------------------------------------------------


class Counting:
    """A generator that counts the episodes it served a first prompt of (one a rollout)."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def generate(self, prompts, sampling):
        self.calls += 1
        return self.inner.generate(prompts, sampling)


def demos(data, out: Path) -> None:
    from rag_lab.train.cold_start import ColdStartConfig
    from rag_lab.train.demonstrations import demonstrations, sample_demonstrations

    config = ColdStartConfig(protocols=("dapo", "r3rag"), limit=4, temperatures=(0.0, 0.7), samples=2)
    teacher = Counting(TeacherGenerator(data, seed=config.seed))
    sampled = sample_demonstrations(data, config, BM25Retriever(data.corpus), teacher=teacher)
    cached = demonstrations(data, config, out / f"cache-{processes()}")
    keep(out, "demos", (sampled.pairs, sampled.counts, cached.pairs, cached.counts, teacher.calls))


def test_two_processes_sample_the_cold_starts_demonstrations_of_one(data, tmp_path):
    """The cold start's rejection sampling (4 questions x 3 draws x each policy that speaks DAPO's or
    R3-RAG's protocol) shared by two processes: the same pairs in the same order and the same counts, in
    every process; the cache the main process writes is one process's, byte for byte."""
    demos(data, tmp_path)
    in_two(demos, data, tmp_path)
    one, zero, two = kept(tmp_path, "demos", 1), kept(tmp_path, "demos", 2, 0), kept(tmp_path, "demos", 2, 1)
    assert zero[:4] == two[:4] == one[:4] and one[0] and one[0] == one[2]
    assert one[1]["dapo"]["kept"] > 0 and one[1]["r3rag"]["episodes"] > one[1]["r3rag"]["kept"] > 0
    # the teacher's calls: the probes of speakers() (every demonstration policy on 4 questions) in each
    # process, then each process's share of the episodes, which add up to one process's
    probes = zero[4] + two[4] - one[4]
    assert probes > 0 and zero[4] > probes and two[4] > probes
    [a], [b] = (list((tmp_path / f"cache-{n}" / "cold_start" / "demos").glob("*.json")) for n in (1, 2))
    assert a.name == b.name and a.read_bytes() == b.read_bytes()


# ---- the run's evaluation -------------------------------------------------------------------------------


class Judge:
    """A judge that says yes to a prediction of even length, and records what it was asked, in order."""

    def __init__(self):
        self.asked = []

    def __call__(self, predictions, golds):
        self.asked += list(predictions)
        return [float(len(p) % 2 == 0) for p in predictions]


def evaluation(data, out: Path) -> None:
    from rag_lab.eval.evaluate import evaluate
    from rag_lab.train import parallel

    policy = IterativePipeline(iterations=2, max_new_tokens=16)
    played = []
    rollout = policy.rollout
    policy.rollout = lambda env, batch: played.append([ex.id for ex in batch]) or rollout(env, batch)
    env = Env(data.corpus, BM25Retriever(data.corpus), TeacherGenerator(data))
    judge = Judge() if parallel.is_main() else None
    path = out / f"records-{processes()}.jsonl"
    records = evaluate(policy, env, data.split("test")[:9], path, "squad", batch_size=2, judge=judge,
                       recall_at=[2], ranks=parallel if processes() > 1 else None)  # fmt: skip
    keep(out, "evaluation", (records, played, judge.asked if judge else None))


def test_two_processes_evaluate_into_the_records_of_one(data, tmp_path):
    """9 questions in batches of 2 (5 batches), the first one on file: the other four are shared in rounds of
    2, process 0 playing batches 1 and 3, process 1 batches 2 and 4; the main process judges them in question
    order and appends them to records.jsonl, which ends as the one process's byte for byte, and returns all
    the records."""
    evaluation(data, tmp_path)
    lines = (tmp_path / "records-1.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "records-2.jsonl").write_text("".join(lines[:2]))  # a resumed evaluation
    in_two(evaluation, data, tmp_path)
    one, zero, two = (kept(tmp_path, "evaluation", n, r) for n, r in ((1, 0), (2, 0), (2, 1)))
    ids = [ex.id for ex in data.split("test")[:9]]
    batches = [ids[i : i + 2] for i in range(0, 9, 2)]
    assert one[1] == batches and zero[1] == [batches[1], batches[3]] and two[1] == [batches[2], batches[4]]
    assert (tmp_path / "records-2.jsonl").read_bytes() == (tmp_path / "records-1.jsonl").read_bytes()
    assert zero[0] == one[0] and two[0] == [] and [r["id"] for r in one[0]] == ids  # the main's return
    predictions = [r["prediction"] for r in one[0]]
    assert one[2] == predictions and zero[2] == predictions[2:] and two[2] is None
    assert {r["judge_acc"] for r in one[0]} == {0.0, 1.0}


@pytest.mark.slow
def test_a_launched_stoprag_run_collects_and_evaluates_as_one_process(tiny_cfg, tmp_path, monkeypatch):
    """``experiment=stoprag_synth launch=cpu2``: the two processes collect the offline data and the dev
    trajectories one process collects (the files, byte for byte, against a run without launch), then
    evaluate into the records the runner writes for the same trained policy (a run without launch that
    finds the fit in the cache), byte for byte; the runner itself rolls out nothing."""
    from test_data_parallel import LAUNCHED

    from rag_lab.policies.stoprag.policy import StopRAG
    from rag_lab.run import run

    def config(cache: str, *launch: str):
        overrides = [*LAUNCHED["stoprag_synth"], "eval.limit=6", "eval.batch_size=2", *launch]
        return tiny_cfg(
            "experiment=stoprag_synth", "hydra.mode=RUN", *overrides, f"cache_dir={tmp_path / cache}"
        )

    with monkeypatch.context() as patch:
        patch.setattr(StopRAG, "rollout", lambda *a: pytest.fail("the runner evaluated again"))
        run(config("a", "launch=cpu2"), tmp_path / "launched")
    run(config("a"), tmp_path / "same_fit")  # the fit from the cache, evaluated by the runner
    run(config("b"), tmp_path / "alone")  # everything in one process
    assert (tmp_path / "same_fit" / "records.jsonl").read_bytes() == (
        tmp_path / "launched" / "records.jsonl"
    ).read_bytes()
    [a], [b] = (list((tmp_path / x / "stoprag").glob("*.jsonl")) for x in "ab")
    assert a.name == b.name and a.read_bytes() == b.read_bytes()
    dev = [tmp_path / x / "checkpoints" / "dev_trajectories.jsonl" for x in ("launched", "alone")]
    assert dev[0].read_bytes() == dev[1].read_bytes()
    assert not (
        tmp_path / "launched" / "launch" / "rank1" / "checkpoints" / "dev_trajectories.jsonl"
    ).exists()


# ---- Stop-RAG's state encodings -------------------------------------------------------------------------


def encodings(encoder: str, out: Path) -> None:
    """300 states (100 questions x 3 steps, some alike) under a frozen tiny BERT: passes of 256 and 44."""
    import torch

    from rag_lab.policies.stoprag.qnet import QNetwork
    from rag_lab.policies.stoprag.trainer import encoded_states

    torch.manual_seed(0)
    qnet = QNetwork(encoder=encoder, freeze_encoder=True, max_length=32, dropout=0.0)
    words = "ada paris london city born film directed by".split()
    question = [f"who was {words[i % 8]} {words[i // 8 % 8]}" for i in range(100)]
    inputs = [[(question[i], [words[(i + j) % 8]] * (j + 1)) for j in range(3)] for i in range(100)]
    passes, pooled = [], []
    encode, pool = qnet.encode, qnet.pool
    qnet.encode = lambda states: passes.append(len(states)) or encode(states)
    qnet.pool = lambda batch: pooled.append(len(batch)) or pool(batch)  # the states the encoder reads
    features = encoded_states(qnet, inputs, out / f"states-{processes()}.pt")
    keep(out, "encodings", (features, passes, sum(pooled)))


def encoded_in_one_and_two(encoder: str, out: str) -> None:
    """:func:`encodings` in this process, then in two forked from it (a fresh interpreter on one thread: a
    process forked after torch's threads ran can hang in the child)."""
    import torch

    torch.set_num_threads(1)
    encodings(encoder, Path(out))
    in_two(encodings, encoder, Path(out))


@pytest.mark.slow
def test_two_processes_encode_stoprags_states_as_one_bit_for_bit(tiny_encoder_dir, tmp_path):
    """The frozen encoder's states of the Q-network's training: process 0 encodes pass 0, process 1 pass 1;
    every process gets all of them, equal bit for bit to one process's, and the main process alone writes
    the cache."""
    import os
    import subprocess
    import sys

    import torch

    here = Path(__file__).parent
    code = (
        f"import test_spread_phases as t; t.encoded_in_one_and_two({tiny_encoder_dir!r}, {str(tmp_path)!r})"
    )
    env = os.environ | {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
                        "PYTHONPATH": os.pathsep.join([str(here), str(here.parent)])}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    one, zero, two = (kept(tmp_path, "encodings", n, r) for n, r in ((1, 0), (2, 0), (2, 1)))
    assert one[0].shape == (100, 3, 16) and one[1] == [256, 44]
    assert (zero[1], two[1]) == ([256], [44])
    # each pass reads its distinct states afresh (no memo from an earlier pass): one process reads what the
    # two read together, so a pass's encodings do not depend on which passes ran before it in its process
    assert one[2] == zero[2] + two[2]
    assert torch.equal(zero[0], one[0]) and torch.equal(two[0], one[0])
    assert torch.equal(torch.load(tmp_path / "states-2.pt"), one[0])
