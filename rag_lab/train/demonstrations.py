"""Rejection-sampled teacher demonstrations (R3-RAG's algorithm 1, papers/r3-rag.txt): the data of
the cold start (``rag_lab.train.cold_start``).

A strong teacher rolls out several trajectories per training question at varied temperature; a
trajectory is kept only when its final answer is correct and every step is well formed; each kept
trajectory of L steps gives L (prompt = question + the steps so far, completion = the next step) pairs.

- The teacher is the world teacher (``rag_lab.generators.teacher``: a rule-based SIMULATOR of a strong
  LLM, ``data=synth`` only), put behind the real policies (:func:`~rag_lab.generators.teacher.demos.
  demonstration_policies`: the policies that render a prompt of a chosen protocol) on the ``split``,
  so the pairs are exactly the prompts the policies render at inference. Each sample is one rollout
  at one temperature and seed (:class:`AtTemperature`). Deviation: the world teacher reads a
  temperature only as greedy (0: its noise drawn once per prompt) or sampled (any other: drawn per
  seed); ``noise`` sets how often it errs, which is what rejection sampling filters.
- Rejection, per episode: kept when the prediction scores EM 1 under the dataset's official scorer
  (``rag_lab.eval.metrics``) and no step broke its protocol (every completion parses, no format
  failure or step error). Identical pairs are kept once. ``counts`` per protocol: episodes sampled,
  kept, rejected as wrong, rejected as malformed (malformed wins when both), unique pairs kept.
- Cached (:func:`demonstrations`): under ``cold_start/demos/``, keyed by the questions, the corpus, the
  sampling settings and the source of the code that samples (:data:`SOURCES`), so a second call does
  not sample again (about 100 s for the whole synth training split).

Hand-written: TRL has no sampler of agent episodes, and the per-episode verdict needs to know which
generate calls belong to which episode: each rollout here is one question (the policies' episodes do
not depend on their batch, so this changes no episode), and a fresh
:class:`~rag_lab.generators.teacher.demos.Recorder` serves it.
"""

import fnmatch
import hashlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm.auto import tqdm

from rag_lab.data.base import QAExample
from rag_lab.env import Env, Episode
from rag_lab.env.protocols.base import INVALID, PROTOCOLS, Protocol, identify
from rag_lab.errors import RagLabError
from rag_lab.eval.metrics import SCORERS
from rag_lab.generators.base import Completion, Prompt, Sampling
from rag_lab.generators.teacher.agent import Noise
from rag_lab.generators.teacher.demos import Recorder, demonstration_policies

if TYPE_CHECKING:
    from rag_lab.train.cold_start import ColdStartConfig

log = logging.getLogger(__name__)

# The settings that make the demonstrations (the rest are training's).
SAMPLING = ("protocols", "split", "limit", "temperatures", "samples", "noise", "k", "iterations", "seed")
# Questions each demonstration policy is probed on to learn which protocols its prompts use.
PROBE = 4


class AtTemperature:
    """A generator wrapper that serves every call at one temperature and seed (the policies ask for
    greedy; a sample of the teacher is the same rollout at another temperature and seed)."""

    def __init__(self, inner, temperature: float, seed: int):
        self.inner, self.temperature, self.seed = inner, temperature, seed

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
        return hashlib.sha256(json.dumps(self.pairs).encode()).hexdigest()


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
    teacher, env: Env, questions: Sequence[QAExample], wanted: set[str], config: "ColdStartConfig", chat: bool
) -> list:
    """The demonstration policies whose prompts use any of the ``wanted`` protocols, found by rolling
    each out on a few questions (a policy does not name the protocols its pipeline renders)."""
    chosen, spoken = [], set()
    for policy in demonstration_policies(config.k, config.iterations):
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
    """``malformed`` (a step broke its protocol), else ``wrong`` (EM 0), else ``kept``."""
    broken = episode.format_failure or any(s.error for s in episode.steps)
    if broken or any(p is None or p.parse(text).kind == INVALID for p, _, text in named):
        return "malformed"
    return "kept" if em(episode.prediction, list(example.answers)) else "wrong"


def sample_demonstrations(
    data, config: "ColdStartConfig", retriever, chat: bool = False, teacher=None
) -> Demonstrations:
    """Rejection-sampled demonstrations of ``config.protocols`` on ``config.split`` (see the module
    docstring). ``teacher``: the generator to sample (default: the world teacher with ``config.noise``);
    ``chat``: render chat prompts (for a chat model) instead of plain text."""
    from rag_lab.generators.teacher.generator import TeacherGenerator

    wanted = chosen_protocols(config.protocols)
    teacher = teacher or TeacherGenerator(data, **asdict(config.noise or Noise()), seed=config.seed)
    questions = list(data.split(config.split))[: config.limit]
    if not questions:
        raise RagLabError(f"cold_start.split: the split {config.split!r} of {data.name} has no questions")
    env, em = Env(data.corpus, retriever), SCORERS[getattr(data, "scorer", "squad")]["em"]
    plan = [(t, config.seed * 1000 + j) for j, t in enumerate(
        t for t in config.temperatures for _ in range(1 if t == 0 else config.samples))]  # fmt: skip
    counts = {name: dict.fromkeys(("episodes", "kept", "wrong", "malformed", "pairs"), 0) for name in wanted}
    kept: dict[str, tuple[Prompt, str, str]] = {}
    policies = speakers(teacher, env, questions, set(wanted), config, chat)
    for policy in tqdm(policies, desc="cold start: teacher episodes", leave=False):
        for example in questions:
            for temperature, seed in plan:
                episode, pairs = rollout_one(
                    policy, AtTemperature(teacher, temperature, seed), env, example, chat
                )
                named = [(protocol_of(prompt), prompt, text) for prompt, text in pairs]
                spoken = {p.name for p, _, _ in named if p is not None and p.name in counts}
                if not spoken:
                    continue
                outcome = verdict(episode, named, example, em)
                for name in spoken:
                    counts[name]["episodes"] += 1
                    counts[name][outcome] += 1
                if outcome == "kept":
                    for p, prompt, text in named:
                        if p.name in counts:
                            kept.setdefault(json.dumps([prompt, text]), (prompt, text, p.name))
    for _, _, name in kept.values():
        counts[name]["pairs"] += 1
    for name, c in counts.items():
        log.info("cold start: %s: %d episodes, %d kept, %d wrong, %d malformed; %d distinct pairs",
                 name, c["episodes"], c["kept"], c["wrong"], c["malformed"], c["pairs"])  # fmt: skip
    return Demonstrations([(prompt, text) for prompt, text, _ in kept.values()], counts)


# What the demonstrations are made by: their cache key holds this code's text, so a changed teacher,
# protocol or policy samples afresh.
SOURCES = ("generators/teacher", "env", "policies", "retrievers/bm25.py", "train/demonstrations.py")


def demonstrations(
    data, config: "ColdStartConfig", cache_dir: str | Path, chat: bool = False, retriever=None, teacher=None
) -> Demonstrations:
    """:func:`sample_demonstrations`, searching with BM25 unless ``retriever`` is given. With the world
    teacher and BM25 (``teacher`` and ``retriever`` None: their identity is known) the result is cached
    under ``cache_dir/cold_start/demos/`` by what makes it: the questions, the corpus, the sampling
    settings, ``chat`` and the source of the code that samples (:data:`SOURCES`)."""
    from rag_lab.retrievers.bm25 import BM25Retriever

    sampled = retriever or BM25Retriever(data.corpus, cache_dir=str(cache_dir))
    if retriever is not None or teacher is not None:
        return sample_demonstrations(data, config, sampled, chat, teacher)
    path = Path(cache_dir).expanduser() / "cold_start" / "demos" / f"{_demos_key(data, config, chat)}.json"
    if path.exists():
        stored = json.loads(path.read_text())
        return Demonstrations([(p, c) for p, c in stored["pairs"]], stored["counts"])
    demos = sample_demonstrations(data, config, sampled, chat)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps({"pairs": demos.pairs, "counts": demos.counts}))
    partial.replace(path)
    return demos


def _demos_key(data, config: "ColdStartConfig", chat: bool) -> str:
    root = Path(__file__).resolve().parent.parent
    files = [p for name in SOURCES for p in ([root / name] if name.endswith(".py") else
                                              sorted((root / name).rglob("*.py")))]  # fmt: skip
    code = hashlib.sha256("".join(p.read_text() for p in files).encode()).hexdigest()
    questions = [[ex.id, ex.question, list(ex.answers), [[s.question, s.answer] for s in ex.decomposition]]
                 for ex in list(data.split(config.split))[: config.limit]]  # fmt: skip
    sampling = {k: v for k, v in asdict(config).items() if k in SAMPLING}
    key = json.dumps([data.corpus.fingerprint, questions, sampling, chat, code])
    return hashlib.sha256(key.encode()).hexdigest()[:16]
