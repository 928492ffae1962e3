"""Teacher demonstrations: (prompt, completion) pairs of every protocol, for SFT.

The world teacher (a rule-based SIMULATOR) is wrapped in a :class:`Recorder` and put behind the
real policies — the Stop-RAG pipeline with LLM-Stop, the DAPO / EVO-RAG / R3-RAG agents, APEX's
plan-execute loop, standard RAG, direct, IRCoT — run on training questions. Every generation
call it serves becomes a pair, so the demonstrations are exactly the prompts those policies
render at inference. Pairs are then sampled per protocol to an equal budget of words (seeded):
short tasks (a plan, an answer from one passage) get many examples, long traces fewer, and no
protocol crowds out another; the many short ones are where a small model learns to copy.
"""

import random
from collections import defaultdict
from collections.abc import Sequence

from tqdm.auto import tqdm

from rag_lab.data.base import Corpus, QAExample
from rag_lab.env import Env
from rag_lab.env.protocols import identify
from rag_lab.generators.base import Completion, Prompt, Sampling
from rag_lab.policies.apex_pipeline import APEXPipeline
from rag_lab.policies.pipeline import IterativePipeline, LLMStop
from rag_lab.policies.prompting import Agent, ChainOfThought, Direct, StandardRAG
from rag_lab.retrievers.base import Retriever


class Recorder:
    """A generator wrapper that keeps every (prompt, completion text) it serves. ``chat``: whether the
    policies behind it render chat messages (for a chat model's demonstrations) or plain text."""

    def __init__(self, inner, chat: bool = False):
        self.inner, self.chat = inner, chat
        self.pairs: list[tuple[Prompt, str]] = []

    def generate(self, prompts: Sequence[Prompt], sampling: Sampling) -> list[list[Completion]]:
        out = self.inner.generate(prompts, sampling)
        self.pairs += [(p, c.text) for p, cs in zip(prompts, out, strict=True) for c in cs]
        return out


def demonstration_policies(k: int = 3, iterations: int = 6) -> list:
    """One policy per protocol family, with the embedded default's sizes."""
    return [
        IterativePipeline(LLMStop(), iterations=iterations),  # stoprag_decide + query/intermediate/final
        IterativePipeline(iterations=iterations),  # traces that run past the last needed fact
        Agent("dapo", k=k, max_turns=6),
        Agent("evorag", k=k, max_turns=10),
        Agent("r3rag", k=k, max_turns=6),
        APEXPipeline(k=k),
        StandardRAG(k=k),
        Direct(),
        ChainOfThought(retrieve=True, k=k),
    ]


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
    for policy in tqdm(demonstration_policies(k, iterations), desc="teacher demonstrations", leave=False):
        for start in range(0, len(questions), batch_size):
            policy.rollout(env, list(questions[start : start + batch_size]))
    by_protocol: dict[str, dict[str, str]] = defaultdict(dict)
    for prompt, text in recorder.pairs:
        found = identify(prompt)
        if found is not None and isinstance(prompt, str):
            by_protocol[found[0].name].setdefault(prompt, text)  # one completion per distinct prompt
    return dict(by_protocol)


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


def demonstrations(
    teacher,
    corpus: Corpus,
    retriever: Retriever,
    questions: Sequence[QAExample],
    words_per_protocol: int = 60_000,
    seed: int = 0,
    k: int = 3,
    iterations: int = 6,
    protocols: Sequence[str] | None = None,
) -> list[tuple[str, str]]:
    """:func:`collect` then :func:`sample`."""
    return sample(
        collect(teacher, corpus, retriever, questions, k, iterations), words_per_protocol, protocols, seed
    )
