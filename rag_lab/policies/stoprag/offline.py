"""Stop-RAG's offline dataset (arXiv:2510.14337 sec. 4.2, "Offline dataset construction").

Every training question runs the fixed-iteration pipeline to the horizon T without stopping; each
prefix s_t (t = 1 .. T) is a state, and r(s_t, STOP) (eq. 13) is the mean score S (F1 by default)
of N final answers sampled from s_t at temperature > 0 (the authors use 0.7, top-p 0.9: at
temperature 0 the N answers are identical). r(s_{T-1}, CONT) is the same quantity at s_T (eq. 14).

Batched: a batch of questions advances one iteration per two generator calls (queries, then intermediate
answers), and the N samples of *every* state of the batch go through one call with ``n = N`` — 2T + 1
calls per batch instead of T·(2 + N) per question. Rows are appended to a jsonl (``StopRAG.offline_path``:
``cache_dir/stoprag/<key>.jsonl``) one flushed batch at a time, so a killed collection resumes at the next
unfinished batch and a second run with the same settings reuses the file. The batches are fixed by the
question order, not by what is left: a batch that a kill cut mid-append runs again whole, so every
generator call of a resumed collection sees the prompts it saw in an uninterrupted one (a sampling
generator seeded per call, or one whose padding depends on the batch, gives the same rows).
"""

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from tqdm.auto import tqdm

from rag_lab.core.records import RecordWriter, read_records
from rag_lab.data.base import QAExample
from rag_lab.env import Env, Episode
from rag_lab.env.engine import chat_of
from rag_lab.env.fit import fitted_prompts
from rag_lab.env.protocols.base import ANSWER, State
from rag_lab.eval.metrics import SCORERS
from rag_lab.generators.base import Sampling
from rag_lab.train.parallel import from_main, is_main, processes, spread

log = logging.getLogger(__name__)


@dataclass
class Trajectory:
    """One question run to the horizon: ``passages[t-1]`` are the texts retrieved at iteration t,
    ``rewards[t]`` = r(s_t, STOP) for t = 1 .. T (``rewards[0]`` is unused and 0)."""

    question_id: str
    question: str
    passages: list[list[str]]
    rewards: list[float] = field(default_factory=list)
    # greedy final answers from each state s_1 .. s_T (evaluation trajectories: the τ curve)
    answers: list[str] = field(default_factory=list)


class CountingGenerator:
    """Wraps a generator to count its batched calls and the completions it returned."""

    def __init__(self, generator):
        self.inner = generator
        self.calls = 0
        self.completions = 0
        self.chat = getattr(generator, "chat", False)
        # what rag_lab.env.fit measures prompts with
        self.context_length = getattr(generator, "context_length", None)
        self.tokenizer = getattr(generator, "tokenizer", None)

    def generate(self, prompts, sampling):
        self.calls += 1
        self.completions += len(prompts) * sampling.n
        return self.inner.generate(prompts, sampling)


def prefixes(state: State) -> list[State]:
    """s_1 .. s_t of a state with t iterations."""
    return [State(state.question, state.turns[:t]) for t in range(1, len(state.turns) + 1)]


def run_to_horizon(pipeline, env: Env, batch: Sequence[QAExample]) -> list[State]:
    """The pipeline's T iterations for every question of the batch, never stopping (batched)."""
    states = [State(ex.question) for ex in batch]
    episodes = [Episode(ex.id, ex.question) for ex in batch]
    seen: list[set[str]] = [set() for _ in batch]
    for _ in range(pipeline.iterations):
        pipeline.iterate(env, list(batch), states, episodes, seen)
    return states


def final_answers(pipeline, env: Env, states: Sequence[State], sampling: Sampling) -> list[list[str]]:
    """``sampling.n`` final answers per state, all states in one generator call (a state whose prompt
    cannot fit the model, :mod:`rag_lab.env.fit`: ``n`` empty answers)."""
    protocol = pipeline.final
    tuned = replace(sampling, stop=protocol.stop, include_stop=protocol.include_stop)
    prompts, _ = fitted_prompts(env.generator, protocol, states, chat_of(env), tuned)
    fit = [i for i, p in enumerate(prompts) if p is not None]
    answers = [[""] * sampling.n for _ in prompts]
    for i, completions in zip(fit, env.generator.generate([prompts[i] for i in fit], tuned), strict=True):
        actions = [protocol.parse(c.text) for c in completions]
        answers[i] = [(a.answer or "") if a.kind == ANSWER else "" for a in actions]
    return answers


def reward_sampling(pipeline, samples: int, temperature: float, top_p: float) -> Sampling:
    """How eq. 13's N final answers are sampled (temperature > 0: at 0 they are identical)."""
    length = pipeline.sampling.max_new_tokens
    return Sampling(n=samples, temperature=temperature, top_p=top_p, max_new_tokens=length)


def stop_rewards(
    pipeline,
    env: Env,
    states: Sequence[State],
    golds: Sequence[Sequence[str]],
    sampling: Sampling,
    score: str,
) -> list[float]:
    """r(s, STOP) of each state (eq. 13): the mean score S (``score``) of ``sampling.n`` final answers
    sampled from it, all states in one generator call. The offline data's rewards and the policy's
    evaluated episodes (``StopRAG.own_rewards``) both come from it."""
    metric = SCORERS["squad"][score]
    sampled = final_answers(pipeline, env, states, sampling)
    return [sum(metric(a, list(g)) for a in ans) / len(ans) for ans, g in zip(sampled, golds, strict=True)]


def collect(
    pipeline,
    env: Env,
    examples: Sequence[QAExample],
    path: Path,
    samples: int = 8,
    temperature: float = 0.7,
    top_p: float = 0.9,
    score: str = "f1",
    greedy_answers: bool = False,
    batch_size: int = 64,
    desc: str = "stoprag offline data",
) -> list[Trajectory]:
    """Trajectories with rewards for ``examples`` (appended to / resumed from ``path``).

    ``greedy_answers`` also keeps the greedy final answer of every state (for τ tuning: the
    stopping policy's own answer at each possible stop). Under a launch every process calls it, and they
    share the batches left as the main process reads ``path`` (each rolls out every N-th batch, N at a time:
    :func:`rag_lab.train.parallel.spread`); every process gets every trajectory, and the main process alone
    appends them, in question order (the file one process writes)."""
    done = from_main(lambda: {r["question_id"]: r for r in read_records(path)})
    every = [examples[start : start + batch_size] for start in range(0, len(examples), batch_size)]
    todo = [batch for batch in every if any(ex.id not in done for ex in batch)]
    writer, world = (RecordWriter(path) if is_main() else None), processes()
    sampling = reward_sampling(pipeline, samples, temperature, top_p) if samples else None
    greedy = Sampling(max_new_tokens=pipeline.sampling.max_new_tokens) if greedy_answers else None

    def rows(units: list[int], batches: list) -> list[list[dict]]:
        return [batch_rows(pipeline, env, batches[u], sampling, greedy, score) for u in units]

    bar = tqdm(total=len(todo), desc=desc, unit="batch", disable=not todo or writer is None)
    for start in range(0, len(todo), world):
        batches = todo[start : start + world]
        for made in spread(len(batches), lambda units, batches=batches: rows(units, batches)):
            if writer is not None:
                writer.write([r for r in made if r["question_id"] not in done])
            done.update((r["question_id"], r) for r in made)
        bar.update(len(batches))
    bar.close()
    return [Trajectory(**done[ex.id]) for ex in examples]


def batch_rows(
    pipeline,
    env: Env,
    batch: Sequence[QAExample],
    sampling: Sampling | None,
    greedy: Sampling | None,
    score: str,
) -> list[dict]:
    """One batch of questions run to the horizon: a trajectory's row each, with r(s_t, STOP) from the
    ``sampling`` answers (eq. 13; None: no rewards) and the ``greedy`` answer of every state (None: none)."""
    horizon = pipeline.iterations
    states = run_to_horizon(pipeline, env, batch)
    flat = [s for state in states for s in prefixes(state)]
    golds = [ex.answers for ex in batch for _ in range(horizon)]
    stop = stop_rewards(pipeline, env, flat, golds, sampling, score) if sampling else None
    best = final_answers(pipeline, env, flat, greedy) if greedy else None
    rows = []
    for i, (ex, state) in enumerate(zip(batch, states, strict=True)):
        rewards = []
        if stop:
            rewards = [0.0] + stop[i * horizon : (i + 1) * horizon]
        passages = [[p.contents for p in turn.passages] for turn in state.turns]
        answers = [a[0] for a in best[i * horizon : (i + 1) * horizon]] if best else []
        rows.append(dataclasses.asdict(Trajectory(ex.id, ex.question, passages, rewards, answers)))
    return rows


def states_of(traj: Trajectory, upto: int) -> list[tuple[str, list[str]]]:
    """(question, [d_1 .. d_t]) for t = 1 .. upto."""
    docs = [p for turn in traj.passages for p in turn]
    per = [len(turn) for turn in traj.passages]
    return [(traj.question, docs[: sum(per[:t])]) for t in range(1, upto + 1)]
