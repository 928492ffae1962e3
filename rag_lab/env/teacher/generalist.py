"""``generator=generalist``: the world teacher played as a general instruct model would play it, without
the answer key (issue 64) — the teacher whose demonstrations the default LM's searching and planning
come from.

A rule-based SIMULATOR (DESIGN.md), labelled so everywhere. It reads exactly as the world teacher does
(:class:`~rag_lab.env.teacher.generator.Mind`: the facts in the passages in view, hop by hop, and the
final answer from them), and it writes every protocol's format. What it does not have is the gold
decomposition's use for *acting*: where the world teacher searches with the next gold sub-question, plans
with the gold plan and stops once every fact is found, the generalist only knows what a general instruct
model knows from the question's surface (the papers start from such models: Qwen2.5-Instruct for APEX's
planner and multi-stage DAPO, an instruct LM for EVO-RAG):

- **queries**: the question verbatim (with probability ``verbatim``), else its keywords, with the last
  entity it has read in front once it has read one (a rephrase of the question with what it found), never
  the next gold sub-question;
- **searches**: a fixed number (``searches``), whatever the evidence holds; with probability ``jitter``
  one fewer or one more. Never BACKTRACK or REFUSE (EVO-RAG's actions a general model does not use);
- **plans**: the question whole, as one sub-question (with probability ``whole_plan``; APEX's own fallback),
  else split once at its surface (:func:`surface_plan`: the outermost "the R of …" becomes a first
  sub-question, "A or B" / "A and B" become one sub-question each);
- **APEX's executor**: one search with the sub-question as it is, then its answer (or ``unknown``).

Each draw comes from the prompt's own random stream, as the world teacher's noise does, so greedy calls
are deterministic per prompt and a set of demonstrations holds the mixture: an LM trained on them has a
greedy mode (keyword queries at the default habits, ``searches`` searches, whole plans) and, sampled, the
rest — the room the RL methods learn in. The two places where the papers imitate a stronger model keep
the world teacher: R3-RAG's cold start and APEX's executor SFT (``rag_lab.train.cold_start``).

Hand-written: no library simulates a general LM on a generated world.
"""

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from rag_lab.core.config import takes
from rag_lab.core.ranges import PositiveInt, Probability
from rag_lab.data.base import resolve_references
from rag_lab.env.protocols import Action, State
from rag_lab.env.protocols.base import ANSWER, CONTINUE, PLAN, REASON, SEARCH, STOP
from rag_lab.env.protocols.simple import evidence
from rag_lab.env.teacher.agent import FIRST, SAME, Noise, date_key
from rag_lab.env.teacher.generator import DECIDE, Mind, TeacherGenerator
from rag_lab.env.teacher.reader import answer_from, parse_question

# Words a keyword query drops: question words, auxiliaries, articles, prepositions.
STOPWORDS = frozenset(
    "who whom whose what which where when why how is was were are did does do the a an of in on from by "
    "to for with and or has have had".split()
)


def keywords(question: str) -> str:
    """The question's content words, in order.

    >>> keywords("Where was the director of The Kulier born?")
    'director Kulier born'
    """
    words = re.findall(r"[\w'-]+", question)
    return " ".join(w for w in words if w.lower() not in STOPWORDS) or question


def surface_plan(question: str) -> tuple[str, ...]:
    """The question split once at its surface, as a general model does without knowing how this world's
    questions are built: "A or B" / "A and B" into one sub-question each, the outermost "the R of X" of a
    chain into "Who is the R of X?" and the rest asked of ``#1``; a question with neither is its own plan.

    >>> surface_plan("Where was the mother of the spouse of Thoa Zistad born?")
    ('Who is the mother of the spouse of Thoa Zistad?', 'Where was #1 born?')
    >>> surface_plan("Who was born first, Riia Vale or Bo Stad?")
    ('Who was born first, Riia Vale?', 'Who was born first, Bo Stad?')
    >>> surface_plan("Who is the maternal grandfather of Viao Vaton?")
    ('Who is the maternal grandfather of Viao Vaton?',)
    """
    if (m := FIRST.match(question)) or (m := SAME.match(question)):
        a, b = m.group("a"), m.group("b")
        return tuple(question.replace(f"{a} or {b}", x).replace(f"{a} and {b}", x) for x in (a, b))
    ask = parse_question(question)
    if ask is None or not ask.subject.startswith("the ") or " of " not in ask.subject:
        return (question,)
    return (f"Who is {ask.subject}?", question.replace(ask.subject, "#1"))


@dataclass(frozen=True)
class Habits:
    """What the generalist does in place of the gold decomposition (its probabilities per decision)."""

    # searches before it answers, whatever it has found
    searches: PositiveInt = 2
    # the chance of one search fewer (before `searches`) or one more (at `searches`)
    jitter: Probability = 0.35
    # the chance that a query is the question verbatim (else its keywords, after the last entity read)
    verbatim: Probability = 0.3
    # the chance that a plan is the question whole (else surface_plan)
    whole_plan: Probability = 0.6


@dataclass
class GeneralistMind(Mind):
    habits: Habits = field(default_factory=Habits)

    def query(self, question: str, passages) -> str:
        """The next query: the question, or its keywords after the last entity read (see the module)."""
        if self.rng.random() < self.habits.verbatim:
            return question
        found = [a for a in self.facts(passages) if date_key(a) is None and a not in ("yes", "no")]
        entity = found[-1] if found else ""
        return f"{entity} {keywords(question)}" if entity and entity not in question else keywords(question)

    def answer_now(self, searches: int) -> bool:
        """Whether to answer after ``searches`` searches: at ``habits.searches``, give or take one."""
        if searches == 0:
            return False
        if searches < self.habits.searches:
            return self.rng.random() < self.habits.jitter
        if searches == self.habits.searches:
            return self.rng.random() >= self.habits.jitter
        return True

    def subs(self) -> list:
        return list(self.example.decomposition) if self.example else []

    def answer(self, passages) -> str:
        answers = self.facts(passages)
        return self.final(answers, passages) if self.complete(answers) else self.guess(answers, passages)


def searched(state: State) -> int:
    return sum(t.action.kind == SEARCH for t in state.turns)


def found_text(mind: Mind, passages) -> str:
    answers = mind.facts(passages)
    return "; ".join(answers) if answers else "nothing yet"


# --- one decision per protocol where the world teacher would use the gold decomposition to act ------------


def stoprag_query(mind: GeneralistMind, state: State) -> Action:
    return Action(SEARCH, query=mind.query(state.question, evidence(state)))


def stoprag_decide(mind: GeneralistMind, state: State) -> Action:
    if mind.answer_now(len(state.turns)):
        return Action(STOP, thought="I have searched enough.")
    return Action(CONTINUE, thought="I will search again.")


def dapo(mind: GeneralistMind, state: State) -> Action:
    passages = evidence(state)
    opening, closing = ("<think>", "</think>") if not state.turns else ("<reflect>", "</reflect>")
    thought = f"{opening}Found: {found_text(mind, passages)}.{closing}"
    if mind.answer_now(searched(state)):
        return Action(ANSWER, answer=mind.answer(passages), thought=thought)
    return Action(SEARCH, query=mind.query(state.question, passages), thought=thought)


def evorag(mind: GeneralistMind, state: State) -> Action:
    passages = evidence(State("", [t for t in state.turns if not t.abandoned]))
    if mind.answer_now(searched(state)):
        return Action(ANSWER, answer=mind.answer(passages))
    return Action(SEARCH, query=mind.query(state.question, passages))


def r3rag(mind: GeneralistMind, state: State) -> Action:
    passages = evidence(state)
    known = f"Known so far: {found_text(mind, passages)}. "
    if mind.answer_now(searched(state)):
        return Action(ANSWER, answer=mind.answer(passages), thought=f"{known}I will answer now.")
    return Action(SEARCH, query=mind.query(state.question, passages), thought=f"{known}I will search again.")


def apex_plan(mind: GeneralistMind, state: State) -> Action:
    whole = mind.rng.random() < mind.habits.whole_plan
    return Action(PLAN, plan=(state.question,) if whole else surface_plan(state.question))


def apex_exec(mind: GeneralistMind, state: State) -> Action:
    if not state.turns:
        return Action(SEARCH, query=state.focus)
    passages = evidence(state)
    answer = answer_from(state.focus, passages)
    if answer is None and mind.example is not None:  # the whole question as its sub-question: read its chain
        answer = mind.answer(passages)
    return Action(ANSWER, answer=answer or "unknown")


def cot(mind: GeneralistMind, state: State) -> Action:
    """The world teacher's chain of thought (it states each fact it reads, then answers), except that a
    missing fact is asked for with the generalist's query, not the next gold sub-question (IRCoT retrieves
    with it), and an ask that brought nothing new ends in an answer."""
    passages = evidence(state)
    answers, said = mind.facts(passages), [s for s, _ in state.notes]
    if len(said) < len(answers) or mind.complete(answers):
        return DECIDE["cot"](mind, state)
    subs = mind.subs()[: len(answers)]
    stated = {f"{resolve_references(s.question, answers)} {a}." for s, a in zip(subs, answers, strict=True)}
    if said and said[-1] not in stated:  # the last sentence asked, and no new fact came of it
        return Action(ANSWER, answer=mind.answer(passages))
    return Action(REASON, thought=mind.query(state.question, passages))


GENERALIST: dict[str, Callable] = {
    **DECIDE,
    "stoprag_query": stoprag_query,
    "stoprag_decide": stoprag_decide,
    "dapo": dapo,
    "evorag": evorag,
    "r3rag": r3rag,
    "apex_plan": apex_plan,
    "apex_exec": apex_exec,
    "cot": cot,
}


class GeneralistTeacher(TeacherGenerator):
    """The world teacher without the answer key's plans and searches (a SIMULATOR; data=synth)."""

    decide = GENERALIST

    @takes(Habits)
    def __init__(
        self,
        data,
        seed: int = 0,
        # the world teacher's mistakes (a Noise config; null: none)
        noise: Noise | None = None,
        **habits,
    ):
        """``data``: the dataset whose questions it reads (the runner hands it over); ``habits``:
        :class:`Habits`' settings; ``noise``: the world teacher's (none by default)."""
        super().__init__(data, seed=seed, **asdict(noise or Noise()))
        self.habits = Habits(**habits)

    def mind(self, example, rng, greedy: bool) -> GeneralistMind:
        return GeneralistMind(example, rng, self.noise, greedy, self.habits)
