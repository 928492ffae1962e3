"""Teacher demonstrations: the world teacher behind the real policies, as (prompt, completion) pairs.

The world teacher (``rag_lab.env.teacher``: a rule-based SIMULATOR of a strong LLM, ``data=synth`` only)
is wrapped in a :class:`Recorder` and put behind the real policies on training questions (the ones
:mod:`rag_lab.policies.demonstrators` registers in :mod:`rag_lab.train.demonstrators`: the Stop-RAG pipeline
with LLM-Stop, the DAPO / EVO-RAG / R3-RAG agents, APEX's plan-execute loop, standard RAG, direct, IRCoT).
Every generation call it serves becomes a pair, so the demonstrations are exactly the prompts those policies
render at inference. Two uses:

- the tiny LM's recipe (:func:`collect`, then :func:`sample`: pairs drawn per protocol to an equal budget
  of words, so short tasks get many examples and long traces fewer);
- the cold start (:func:`demonstrations`): R3-RAG's rejection sampling (arXiv:2505.23794, algorithm 1).
  Several rollouts per question at varied temperature (:class:`AtTemperature`; deviation: the world
  teacher reads a temperature only as greedy, its noise drawn once per prompt, or sampled, drawn per
  seed; ``noise`` sets how often it errs, which is what rejection sampling filters). An episode is kept
  when its prediction scores EM 1 under the dataset's official scorer (or it refuses a question the data
  set marks unanswerable: EVO-RAG's REFUSE) and no step broke its protocol
  (every completion parses, no format failure or step error); each kept episode of L steps gives L
  pairs, identical pairs once. ``counts`` per protocol: episodes sampled, kept, rejected as wrong,
  rejected as malformed (malformed wins when both), distinct pairs kept. Cached under
  ``cold_start/demos/`` (:mod:`rag_lab.core.cache`: the questions, the corpus, the sampling settings, the
  code, the demonstration policies' code), so a second call does not sample again (about 100 s for the
  whole synth training split).

Hand-written: TRL has no sampler of agent episodes, and the per-episode verdict needs to know which
generate calls belong to which episode: each rollout is one question (the policies' episodes do not
depend on their batch, so this changes no episode), and a fresh :class:`Recorder` serves it. Under a launch
each process plays every N-th episode (:func:`rag_lab.train.parallel.spread`) and gets them all.
"""

import dataclasses
import fnmatch
import json
import logging
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Annotated

from tqdm.auto import tqdm

from rag_lab.core import cache
from rag_lab.core.config import AtLeast, NonNegative, PositiveInt
from rag_lab.core.errors import RagLabError
from rag_lab.core.records import atomic_write_text
from rag_lab.data.base import Corpus, QAExample
from rag_lab.env import Env, Episode
from rag_lab.env.protocols.base import INVALID, PROTOCOLS, REFUSE, Protocol, identify
from rag_lab.env.teacher.agent import Noise
from rag_lab.eval.metrics import SCORERS
from rag_lab.generators.base import Completion, Prompt, Sampling, as_text
from rag_lab.retrievers.base import Retriever
from rag_lab.train import demonstrators
from rag_lab.train.parallel import from_main, is_main, main_first, spread

log = logging.getLogger(__name__)

# Questions each demonstration policy is probed on to learn which protocols its prompts use.
PROBE = 4


@dataclass(frozen=True)
class DemoSettings:
    """Which demonstrations the cold start samples (its sampling keys, ``conf/cold_start/default.yaml``)."""

    # the protocols to demonstrate: names of rag_lab/env/protocols, or patterns (apex_*, stoprag_*)
    protocols: tuple[str, ...] = ("dapo", "evorag", "r3rag", "apex_*")
    split: str = "train"
    # the first `limit` questions of the split (null: all)
    limit: Annotated[int | None, AtLeast(1)] = None
    # one rollout per question at each temperature (0: greedy), `samples` of them above 0
    temperatures: tuple[NonNegative, ...] = (0.0, 0.7, 1.0)
    samples: PositiveInt = 1
    # the teacher's mistakes, each a probability per decision (null: none; the yaml sets some, for
    # rejection sampling to filter out)
    noise: Noise | None = None
    # passages per search, and the Stop-RAG pipelines' iterations (the demonstration policies')
    k: PositiveInt = 3
    iterations: PositiveInt = 6
    # seeds the teacher's samples
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("protocols", "temperatures"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if not self.protocols or not self.temperatures or min(self.temperatures) < 0:
            raise RagLabError(
                "cold_start: protocols and temperatures must be non-empty lists, temperatures >= 0 "
                f"(got {list(self.protocols)}, {list(self.temperatures)})"
            )


# ---- the teacher behind the policies ---------------------------------------------------------------------


class Recorder:
    """A generator wrapper that keeps every (prompt, completion text) it serves. ``chat``: whether the
    policies behind it render chat messages (for a chat model's demonstrations) or plain text."""

    def __init__(self, inner, chat: bool = False):
        self.inner = inner
        self.chat = chat
        self.pairs: list[tuple[Prompt, str]] = []

    def generate(self, prompts: Sequence[Prompt], sampling: Sampling) -> list[list[Completion]]:
        out = self.inner.generate(prompts, sampling)
        # as text: a demonstration is text (SFT gives its prompt as ids the engine's way: rag_lab.train.sft)
        self.pairs += [(as_text(p), c.text) for p, cs in zip(prompts, out, strict=True) for c in cs]
        return out


def collect(
    teacher,
    corpus: Corpus,
    retriever: Retriever,
    questions: Sequence[QAExample],
    k: int = 3,
    iterations: int = 6,
    batch_size: int = 256,
) -> dict[str, dict[str, str]]:
    """protocol name -> {plain-text prompt: the teacher's completion}, from every policy's rollouts."""
    recorder = Recorder(teacher)
    env = Env(corpus, retriever, recorder)
    policies = demonstrators.registered().policies(k, iterations)
    for policy in tqdm(policies, desc="teacher demonstrations", leave=False):
        for start in range(0, len(questions), batch_size):
            policy.rollout(env, list(questions[start : start + batch_size]))
    by_protocol: dict[str, dict[str, str]] = defaultdict(dict)
    for prompt, text in recorder.pairs:
        found = identify(prompt)
        if found is not None and isinstance(prompt, str):
            by_protocol[found[0].name].setdefault(prompt, text)  # one completion per distinct prompt
    return dict(by_protocol)


def question_keys(questions: Sequence[QAExample]) -> list:
    """What a demonstrations cache key holds of each question: id, text, answers, decomposition."""
    return [
        [ex.id, ex.question, list(ex.answers), [[s.question, s.answer] for s in ex.decomposition]]
        for ex in questions
    ]


def collected_path(cache_dir: str | Path, kind: str, data, *settings) -> Path:
    """Where :func:`collect`'s demonstrations on ``data``'s training split are cached:
    ``cache_dir/<kind>/<key>.json``, keyed by the corpus, the training questions, ``settings``, this code
    and the demonstration policies' code."""
    questions = question_keys(data.split("train"))
    code = demonstrators.registered().code_digest()
    where = cache.path(cache_dir, kind, data.corpus.fingerprint, questions, *settings, code, code=__name__)
    return where.with_name(where.name + ".json")


def teacher_demonstrations(data, cache_dir: str | Path, k: int = 3, iterations: int = 6):
    """:func:`collect` with the world teacher and BM25 over ``data``'s training split, cached under
    ``cache_dir/demonstrations/`` (:func:`collected_path`, with ``k`` and ``iterations``: the teacher is
    deterministic). Every recipe run on one world needs the same ones: 21 s on the
    full world, 11 s on the tests' tiny one, once. Returns them with the BM25 retriever."""
    from rag_lab.env.teacher.generator import TeacherGenerator
    from rag_lab.retrievers.bm25 import BM25Retriever

    retriever = BM25Retriever(data.corpus, cache_dir=str(cache_dir))
    path = collected_path(cache_dir, "demonstrations", data, k, iterations)
    if path.exists():
        return json.loads(path.read_text()), retriever
    by_protocol = collect(TeacherGenerator(data), data.corpus, retriever, data.split("train"), k, iterations)
    atomic_write_text(path, json.dumps(by_protocol))
    return by_protocol, retriever


def generalist_demonstrations(data, cache_dir: str | Path, k: int, iterations: int, habits: dict):
    """:func:`teacher_demonstrations` with the generalist (``rag_lab.env.teacher.generalist``: the world
    teacher's reading, a general model's searching and planning, by ``habits``) in the world teacher's
    place, cached under ``cache_dir/generalist_demonstrations/`` (the habits join the key)."""
    from rag_lab.env.teacher.generalist import GeneralistTeacher
    from rag_lab.retrievers.bm25 import BM25Retriever

    retriever = BM25Retriever(data.corpus, cache_dir=str(cache_dir))
    path = collected_path(cache_dir, "generalist_demonstrations", data, k, iterations, habits)
    if path.exists():
        return json.loads(path.read_text()), retriever
    teacher = GeneralistTeacher(data, **habits)
    by_protocol = collect(teacher, data.corpus, retriever, data.split("train"), k, iterations)
    atomic_write_text(path, json.dumps(by_protocol))
    return by_protocol, retriever


def sample(
    by_protocol: dict[str, dict[str, str]],
    words_per_protocol: int = 60_000,
    protocols: Sequence[str] | None = None,
    seed: int = 0,
) -> list[tuple[str, str]]:
    """Pairs of each protocol (of ``protocols`` only, when given), drawn at random until the
    protocol's pairs hold ``words_per_protocol`` words; shuffled."""
    rng = random.Random(seed)
    pairs = []
    for name in sorted(n for n in by_protocol if protocols is None or n in protocols):
        items = sorted(by_protocol[name].items())
        rng.shuffle(items)
        words = 0
        for prompt, text in items:
            if words >= words_per_protocol:
                break
            pairs.append((prompt, text))
            words += len(prompt.split()) + len(text.split())
    rng.shuffle(pairs)
    return pairs


# ---- rejection sampling (the cold start) --------------------------------------------------------------


class AtTemperature:
    """A generator wrapper that serves every call at one temperature and seed (the policies ask for
    greedy; a sample of the teacher is the same rollout at another temperature and seed)."""

    def __init__(self, inner, temperature: float, seed: int):
        self.inner = inner
        self.temperature = temperature
        self.seed = seed

    def generate(self, prompts: Sequence[Prompt], sampling: Sampling) -> list[list[Completion]]:
        return self.inner.generate(prompts, replace(sampling, temperature=self.temperature, seed=self.seed))


@dataclass
class Demonstrations:
    # (prompt, completion) pairs of kept episodes, each distinct pair once, in the order sampled
    pairs: list[tuple[Prompt, str]]
    # protocol -> {"episodes", "kept", "wrong", "malformed", "pairs"}
    counts: dict[str, dict[str, int]]

    @cached_property
    def fingerprint(self) -> str:
        return cache.text_digest(json.dumps(self.pairs))


def chosen_protocols(patterns: Sequence[str]) -> list[str]:
    """The protocol names that ``patterns`` (names or fnmatch patterns) pick, in order, each once."""
    names, out = sorted(PROTOCOLS), []
    for pattern in patterns:
        hits = fnmatch.filter(names, pattern)
        if not hits:
            raise RagLabError(
                f"cold_start.protocols: {pattern!r} names no protocol (known: {', '.join(names)})"
            )
        out += hits
    return list(dict.fromkeys(out))


def protocol_of(prompt: Prompt) -> Protocol | None:
    found = identify(prompt)
    return found[0] if found else None


def rollout_one(policy, generator, env: Env, example: QAExample, chat: bool) -> tuple[Episode, list]:
    """One episode of ``policy`` on ``example`` and every (prompt, completion) the generator served it."""
    recorder = Recorder(generator, chat=chat)
    (episode,) = policy.rollout(Env(env.corpus, env.retriever, recorder), [example])
    return episode, recorder.pairs


def speakers(
    teacher, env: Env, questions: Sequence[QAExample], wanted: set[str], config: DemoSettings, chat: bool
) -> list:
    """The demonstration policies whose prompts use any of the ``wanted`` protocols, found by rolling
    each out on a few questions (a policy does not name the protocols its pipeline renders)."""
    chosen, spoken = [], set()
    for policy in demonstrators.registered().policies(config.k, config.iterations):
        prompts = [
            p for example in questions[:PROBE] for p, _ in rollout_one(policy, teacher, env, example, chat)[1]
        ]
        names = {protocol.name for protocol in map(protocol_of, prompts) if protocol}
        spoken |= names
        if names & wanted:
            chosen.append(policy)
    if not chosen:
        raise RagLabError(
            f"cold_start.protocols: no demonstration policy renders {', '.join(sorted(wanted))} "
            f"(they render {', '.join(sorted(spoken))})"
        )
    return chosen


def verdict(episode: Episode, named: list[tuple], example: QAExample, em) -> str:
    """``malformed`` (a step broke its protocol), else ``wrong``, else ``kept``: right is EM 1, or a
    refusal (EVO-RAG's REFUSE) of a question the data set marks unanswerable."""
    broken = episode.format_failure or any(s.error for s in episode.steps)
    if broken or any(p is None or p.parse(text).kind == INVALID for p, _, text in named):
        return "malformed"
    if episode.stop_reason == REFUSE:
        return "wrong" if example.answerable else "kept"
    return "kept" if em(episode.prediction, list(example.answers)) else "wrong"


def sampled_episode(
    policy, example: QAExample, temperature: float, seed: int, teacher, env: Env, em, chat: bool, wanted: set
) -> tuple[str, list[tuple[str, Prompt, str]]]:
    """One episode of ``policy`` on ``example`` at ``temperature`` and ``seed``: its verdict (:func:`verdict`)
    and its (protocol, prompt, completion) of the ``wanted`` protocols (none: it speaks none of them)."""
    episode, pairs = rollout_one(policy, AtTemperature(teacher, temperature, seed), env, example, chat)
    named = [(protocol_of(prompt), prompt, text) for prompt, text in pairs]
    spoken = [(p.name, prompt, text) for p, prompt, text in named if p is not None and p.name in wanted]
    return (verdict(episode, named, example, em) if spoken else "silent"), spoken


def sample_demonstrations(
    data, config: DemoSettings, retriever, chat: bool = False, teacher=None
) -> Demonstrations:
    """Rejection-sampled demonstrations of ``config.protocols`` on ``config.split`` (see the module
    docstring). ``teacher``: the generator to sample (default: the world teacher with ``config.noise``);
    ``chat``: render chat prompts (for a chat model) instead of plain text."""
    from rag_lab.env.teacher.generator import TeacherGenerator

    wanted = chosen_protocols(config.protocols)
    questions = list(data.split(config.split))[: config.limit]
    if not questions:
        raise RagLabError(f"cold_start.split: the split {config.split!r} of {data.name} has no questions")
    if teacher is None and not any(ex.decomposition for ex in questions):
        raise RagLabError(
            f"cold start: the world teacher follows gold decompositions, and no {config.split} question of "
            f"{data.name} has one (it knows data=synth): give another teacher (a generator; APEX's "
            "policy.teacher) or no cold start (policy.cold_start=null)"
        )
    teacher = teacher or TeacherGenerator(data, **asdict(config.noise or Noise()), seed=config.seed)
    env, em = Env(data.corpus, retriever), SCORERS[getattr(data, "scorer", "squad")]["em"]
    plan = [
        (t, config.seed * 1000 + j)
        for j, t in enumerate(t for t in config.temperatures for _ in range(1 if t == 0 else config.samples))
    ]
    counts = {name: dict.fromkeys(("episodes", "kept", "wrong", "malformed", "pairs"), 0) for name in wanted}
    kept: dict[str, tuple[Prompt, str, str]] = {}
    policies = speakers(teacher, env, questions, set(wanted), config, chat)
    # an episode a unit, in one process's order: under launch each process plays every N-th (spread)
    units = [(policy, example, *drawn) for policy in policies for example in questions for drawn in plan]

    def play(mine: list[int]) -> list[tuple[str, list[tuple[str, Prompt, str]]]]:
        bar = tqdm(mine, desc="cold start: teacher episodes", leave=False, disable=not is_main())
        return [sampled_episode(*units[u], teacher, env, em, chat, set(counts)) for u in bar]

    for outcome, named in spread(len(units), play):
        for name in {name for name, _, _ in named}:
            counts[name]["episodes"] += 1
            counts[name][outcome] += 1
        if outcome == "kept":
            for name, prompt, text in named:
                kept.setdefault(json.dumps([prompt, text]), (prompt, text, name))
    for _, _, name in kept.values():
        counts[name]["pairs"] += 1
    for name, c in counts.items():
        log.info(
            "cold start: %s: %d episodes, %d kept, %d wrong, %d malformed; %d distinct pairs",
            name,
            c["episodes"],
            c["kept"],
            c["wrong"],
            c["malformed"],
            c["pairs"],
        )
    return Demonstrations([(prompt, text) for prompt, text, _ in kept.values()], counts)


def sampled_path(cache_dir: str | Path, data, config: DemoSettings, chat: bool) -> Path:
    """Where :func:`demonstrations` caches the world teacher's: ``cache_dir/cold_start/demos/<key>.json``,
    keyed by the corpus, the questions, the sampling settings, ``chat``, this code and the demonstration
    policies' code."""
    questions = question_keys(list(data.split(config.split))[: config.limit])
    settings = {f.name: getattr(config, f.name) for f in dataclasses.fields(DemoSettings)}
    code = demonstrators.registered().code_digest()
    where = cache.path(
        cache_dir, "cold_start/demos", data.corpus.fingerprint, questions, settings, chat, code, code=__name__
    )
    return where.with_name(where.name + ".json")


def demonstrations(
    data, config: DemoSettings, cache_dir: str | Path, chat: bool = False, retriever=None, teacher=None
) -> Demonstrations:
    """:func:`sample_demonstrations`, searching with BM25 unless ``retriever`` is given. With the world
    teacher and BM25 (``teacher`` and ``retriever`` None: their identity is known) the result is cached
    (:func:`sampled_path`)."""
    from rag_lab.retrievers.bm25 import BM25Retriever

    with main_first():  # under launch the main process builds the BM25 index's cache, the others load it
        sampled = retriever or BM25Retriever(data.corpus, cache_dir=str(cache_dir))
    if retriever is not None or teacher is not None:
        return sample_demonstrations(data, config, sampled, chat, teacher)
    path = sampled_path(cache_dir, data, config, chat)
    stored = from_main(lambda: json.loads(path.read_text()) if path.exists() else None)
    if stored is not None:
        return Demonstrations([(p, c) for p, c in stored["pairs"]], stored["counts"])
    demos = sample_demonstrations(data, config, sampled, chat)
    if is_main():  # under launch every process sampled its share and holds them all; one writes the cache
        atomic_write_text(path, json.dumps({"pairs": demos.pairs, "counts": demos.counts}))
    return demos
