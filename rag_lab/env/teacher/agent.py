"""The world teacher's agent loop: follow a question's decomposition, retrieve for each sub-question,
read the answer from the passages, substitute it into the next sub-question, combine at the end.

A rule-based SIMULATOR of a strong LLM on the embedded world (DESIGN.md), labelled so everywhere.
It may use a question's gold decomposition (its sub-questions, never their answers) with
configurable noise, and it never sees gold answers: a step whose evidence is not retrieved
fails, and so does the question. Noise (each a probability per step):

- ``vague_query``: the query drops the subject (a wrong / vague sub-query);
- ``miscopy``: a read answer is replaced by a near-name from the same passages (mis-copied entity);
- ``premature_answer``: the agent stops early and answers with what it has.
"""

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rag_lab.core.config import Probability
from rag_lab.data.base import Passage, QAExample, resolve_references
from rag_lab.data.synth.world import MONTHS
from rag_lab.env.teacher.reader import answer_from, parse_question

# search(queries, questions) -> passages per query, best first (a batched retriever call behind it);
# questions[i]: the question query i is asked for (what retriever=oracle reads)
Search = Callable[[Sequence[str], Sequence[QAExample]], list[list[Passage]]]


@dataclass(frozen=True)
class Noise:
    # each a probability per decision
    vague_query: Probability = 0.0
    miscopy: Probability = 0.0
    premature_answer: Probability = 0.0
    # per passage in view that no step of the chain needs: the chance that it misleads a final answer
    distraction: Probability = 0.0


@dataclass
class TeacherStep:
    question: str
    query: str
    passage_ids: list[str]
    answer: str | None


@dataclass
class TeacherTrace:
    steps: list[TeacherStep] = field(default_factory=list)
    answer: str = ""


def date_key(value: str) -> int | None:
    """'12 March 1943' -> 19430312, '1975' -> 19750000; None when it is not a date or a year."""
    parts = value.split()
    if len(parts) == 3 and parts[1] in MONTHS and parts[0].isdigit() and parts[2].isdigit():
        return int(parts[2]) * 10000 + (MONTHS.index(parts[1]) + 1) * 100 + int(parts[0])
    return int(value) * 10000 if value.isdigit() else None


FIRST = re.compile(r"^(?:Who|Which film|Which company) .*first, (?P<a>.+) or (?P<b>.+)\?$")
SAME = re.compile(r"^Are (?:the directors of )?(?P<a>.+) and (?P<b>.+) from the same country\?$")


def combine(question: str, answers: list[str]) -> str:
    """The final answer from the sub-answers: comparisons compare, chains take the last answer."""
    if m := FIRST.match(question):
        # sub-answers: [value of a, value of b] or, through a bridge, [bridge a, bridge b, value a, value b]
        va, vb = (date_key(x) for x in answers[-2:])
        if va is None or vb is None or va == vb:
            return ""
        return m.group("a") if va < vb else m.group("b")
    if SAME.match(question):
        return "yes" if answers[-2] == answers[-1] else "no"
    return answers[-1] if answers else ""


class WorldTeacher:
    """Solves embedded-world questions by following their decompositions (a SIMULATOR)."""

    def __init__(self, k: int = 5, noise: Noise | None = None, seed: int = 0):
        self.k = k
        self.noise = noise or Noise()
        self.seed = seed

    def solve(self, examples: Sequence[QAExample], search: Search) -> list[TeacherTrace]:
        """One trace per example; each hop of all live examples is one batched search."""
        rngs = [random.Random(f"{self.seed}:{ex.id}") for ex in examples]
        traces = [TeacherTrace() for _ in examples]
        answers: list[list[str]] = [[] for _ in examples]
        live = [i for i, ex in enumerate(examples) if ex.decomposition]
        hop = 0
        while live:
            questions = {
                i: resolve_references(examples[i].decomposition[hop].question, answers[i]) for i in live
            }
            queries = {i: self._query(q, rngs[i]) for i, q in questions.items()}
            found = search([queries[i] for i in live], [examples[i] for i in live])
            still = []
            for i, passages in zip(live, found, strict=True):
                answer = answer_from(questions[i], passages)
                if answer is not None and rngs[i].random() < self.noise.miscopy:
                    answer = near_name(answer, passages, rngs[i])
                traces[i].steps.append(
                    TeacherStep(questions[i], queries[i], [p.id for p in passages], answer)
                )
                if answer is None:  # evidence not retrieved: the question fails
                    continue
                answers[i].append(answer)
                done = hop + 1 == len(examples[i].decomposition)
                if done or rngs[i].random() < self.noise.premature_answer:
                    traces[i].answer = combine(examples[i].question, answers[i]) if done else answer
                else:
                    still.append(i)
            live, hop = still, hop + 1
        return traces

    def _query(self, question: str, rng: random.Random) -> str:
        if rng.random() < self.noise.vague_query and (ask := parse_question(question)):
            return question.replace(ask.subject, "it")
        return question


def near_name(answer: str, passages: Sequence[Passage], rng: random.Random) -> str:
    """Another title from the passages sharing a word with the answer (a near-name), if any."""
    words = set(answer.split())
    near = [p.title for p in passages if p.title != answer and words & set(p.title.split())]
    return rng.choice(near) if near else answer
