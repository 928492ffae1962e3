"""``generator=teacher``: the world teacher behind the ``Generator`` interface, speaking every protocol.

A rule-based SIMULATOR of a strong LLM on the embedded world (DESIGN.md), labelled so everywhere.
It sees only the prompt text, like an LLM: it identifies the protocol that rendered the prompt
(:func:`rag_lab.env.protocols.identify`), reads the question and the evidence back out of it,
decides, and writes the protocol's completion (:meth:`Protocol.format`). What it knows beyond
the text is each question's gold *decomposition* (sub-questions, never their answers), looked
up by question text in the dataset; facts come only from passages in the prompt, read through
the world's sentence patterns, so it fails when retrieval failed. Questions it does not know
(another dataset) get a guess.

Noise, each a probability per decision: ``vague_query`` (the query drops its subject),
``miscopy`` (a read answer becomes a near-name from the same passages), ``premature_answer``
(answer / stop before all facts are found), ``distraction`` (each passage in view that the
question's chain does not need misleads the final answer with this chance, so a long trace of
irrelevant evidence costs accuracy as it does a real LLM's; Shi et al. 2023). Greedy calls
(temperature 0) are deterministic per prompt; sampled calls draw the noise per sample, and an
incomplete trace gives a random guess among the entities in view (the variety Stop-RAG's N
sampled answers need).
"""

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rag_lab.core.cache import text_digest
from rag_lab.core.config import takes
from rag_lab.data.base import Passage, QAExample, resolve_references
from rag_lab.env.protocols import Action, State, identify
from rag_lab.env.protocols.base import ANSWER, BACKTRACK, CONTINUE, PLAN, REASON, REFUSE, SEARCH, STOP
from rag_lab.env.protocols.simple import evidence
from rag_lab.env.teacher.agent import FIRST, SAME, Noise, combine, near_name
from rag_lab.env.teacher.reader import answer_from, parse_question
from rag_lab.generators.base import Completion, Prompt, Sampling, TokenPrompt, as_text, cut_at_stop


@dataclass
class Mind:
    """What the teacher makes of one prompt: the question's plan and the facts in evidence."""

    example: QAExample | None
    rng: random.Random
    noise: Noise
    greedy: bool

    def facts(self, passages: Sequence[Passage]) -> list[str]:
        """Sub-answers read from ``passages``, hop by hop, until a hop's fact is missing."""
        answers: list[str] = []
        for sub in self.example.decomposition if self.example else ():
            answer = answer_from(resolve_references(sub.question, answers), list(passages))
            if answer is None:
                break
            if self.rng.random() < self.noise.miscopy:
                answer = near_name(answer, passages, self.rng)
            answers.append(answer)
        return answers

    def complete(self, answers: list[str]) -> bool:
        return self.example is not None and len(answers) == len(self.example.decomposition)

    def next_question(self, answers: list[str]) -> str:
        if self.example is None or self.complete(answers):
            return self.example.question if self.example else ""
        return resolve_references(self.example.decomposition[len(answers)].question, answers)

    def queries(self, answers: list[str], keywords: bool = False) -> list[str]:
        """Query candidates for the next hop, best first (the vague one under noise)."""
        question = self.next_question(answers)
        ask = parse_question(question)
        if ask is None:
            return [question]
        short = f"{ask.subject} {ask.relation.replace('_', ' ')}"
        out = [short, question] if keywords else [question, short]
        if self.rng.random() < self.noise.vague_query:
            out.insert(0, question.replace(ask.subject, "it"))
        return out + [ask.subject]

    def final(self, answers: list[str], passages: Sequence[Passage]) -> str:
        if not self.complete(answers):
            return self.guess(answers, passages)
        answer = combine(self.example.question, answers)
        if self.distracted(answers, passages):
            wrong = [o for o in self.options(answers, passages) if o != answer]
            return self.rng.choice(wrong) if wrong else answer
        return answer

    def distracted(self, answers: list[str], passages: Sequence[Passage]) -> bool:
        if not self.noise.distraction:
            return False
        asked = " ".join(resolve_references(s.question, answers) for s in self.example.decomposition)
        idle = sum(p.title not in asked and p.title not in answers for p in passages)
        return self.rng.random() < 1 - (1 - self.noise.distraction) ** idle

    def guess(self, answers: list[str], passages: Sequence[Passage]) -> str:
        options = self.options(answers, passages)
        return options[0] if self.greedy else self.rng.choice(options)

    def options(self, answers: list[str], passages: Sequence[Passage]) -> list[str]:
        """Plausible answers in view: the two options, yes/no, or the last fact and the titles."""
        question = self.example.question if self.example else ""
        options = []
        if m := FIRST.match(question):
            options = [m.group("a"), m.group("b")]
        elif SAME.match(question) or question.startswith(("Are ", "Is ", "Did ", "Was ")):
            options = ["no", "yes"]
        else:
            options = ([answers[-1]] if answers else []) + [p.title for p in passages] or ["unknown"]
        return options

    def stop_early(self) -> bool:
        return self.rng.random() < self.noise.premature_answer


def untried(candidates: list[str], state: State) -> str | None:
    tried = {t.action.query for t in state.turns}
    return next((q for q in candidates if q not in tried), None)


# --- one decision per protocol: (mind, state) -> action --------------------------------------------


def stoprag_query(mind: Mind, state: State) -> Action:
    answers = mind.facts(evidence(state))
    return Action(SEARCH, query=mind.queries(answers)[0] if not mind.complete(answers) else state.question)


def stoprag_intermediate(mind: Mind, state: State) -> Action:
    turn = state.turns[-1]
    answer = answer_from(turn.action.query or "", turn.passages)
    if answer is not None and mind.rng.random() < mind.noise.miscopy:
        answer = near_name(answer, turn.passages, mind.rng)
    return Action(ANSWER, answer=answer or "unknown")


def final_answer(mind: Mind, state: State) -> Action:
    passages = evidence(state)
    return Action(ANSWER, answer=mind.final(mind.facts(passages), passages))


def stoprag_decide(mind: Mind, state: State) -> Action:
    answers = mind.facts(evidence(state))
    if mind.complete(answers) or mind.stop_early():
        return Action(STOP, thought="The trace states every fact the question needs.")
    return Action(CONTINUE, thought=f"Still missing: {mind.next_question(answers)}")


def dapo(mind: Mind, state: State) -> Action:
    passages = evidence(state)
    answers = mind.facts(passages)
    opening = "<think>" if not state.turns else "<reflect>"
    closing = "</think>" if not state.turns else "</reflect>"
    found = "; ".join(answers) if answers else "nothing yet"
    if mind.complete(answers) or (state.turns and mind.stop_early()):
        return Action(
            ANSWER, answer=mind.final(answers, passages), thought=f"{opening}Found: {found}.{closing}"
        )
    query = untried(mind.queries(answers, keywords=True), state)
    if query is None:  # out of reformulations: answer with what there is
        return Action(
            ANSWER, answer=mind.guess(answers, passages), thought=f"{opening}Found: {found}.{closing}"
        )
    return Action(SEARCH, query=query, thought=f"{opening}I need: {mind.next_question(answers)}{closing}")


def evorag(mind: Mind, state: State) -> Action:
    live = [t for t in state.turns if not t.abandoned]
    passages = evidence(State("", live))
    answers = mind.facts(passages)
    if mind.complete(answers) or (state.turns and mind.stop_early()):
        return Action(ANSWER, answer=mind.final(answers, passages))
    last = state.turns[-1] if state.turns else None
    if last and last.action.kind == SEARCH and not last.abandoned and last.passages:
        before = mind.facts(evidence(State("", live[:-1])))
        if len(before) == len(answers):  # the last search found nothing new: undo it
            return Action(BACKTRACK)
    query = untried(mind.queries(answers), state)
    return Action(SEARCH, query=query) if query else Action(REFUSE)


def r3rag(mind: Mind, state: State) -> Action:
    passages = evidence(state)
    answers = mind.facts(passages)
    known = f"Known so far: {'; '.join(answers)}. " if answers else ""
    if mind.complete(answers) or (state.turns and mind.stop_early()):
        return Action(
            ANSWER, answer=mind.final(answers, passages), thought=f"{known}The information is sufficient."
        )
    query = untried(mind.queries(answers), state)
    if query is None:
        return Action(ANSWER, answer=mind.guess(answers, passages), thought=f"{known}No more to retrieve.")
    return Action(SEARCH, query=query, thought=f"{known}Next I need: {mind.next_question(answers)}")


def apex_plan(mind: Mind, state: State) -> Action:
    plan = tuple(s.question for s in mind.example.decomposition) if mind.example else ()
    return Action(PLAN, plan=plan or (state.question,))


def apex_exec(mind: Mind, state: State) -> Action:
    answer = answer_from(state.focus, evidence(state))
    if answer is not None:
        return Action(ANSWER, answer=answer)
    ask = parse_question(state.focus)
    candidates = [state.focus] + ([f"{ask.subject} {ask.relation.replace('_', ' ')}"] if ask else [])
    query = untried(candidates, state)
    return Action(SEARCH, query=query) if query else Action(ANSWER, answer="unknown")


def apex_final(mind: Mind, state: State) -> Action:
    answers = [a for _, a in state.notes]
    if mind.complete(answers) and "unknown" not in answers:
        return Action(ANSWER, answer=combine(mind.example.question, answers), thought="0.9")
    return Action(ANSWER, answer=mind.guess([a for a in answers if a != "unknown"], []), thought="0.2")


def cot(mind: Mind, state: State) -> Action:
    passages = evidence(state)
    answers = mind.facts(passages)
    said = [s for s, _ in state.notes]
    if len(said) < len(answers):  # state the next fact found
        k = len(said)
        fact = f"{resolve_references(mind.example.decomposition[k].question, answers)} {answers[k]}."
        return Action(REASON, thought=fact)
    if mind.complete(answers) or (said and said[-1] == mind.next_question(answers)):
        return Action(ANSWER, answer=mind.final(answers, passages))
    question = mind.next_question(answers)  # ask for the missing fact (IRCoT retrieves with it)
    return Action(REASON, thought=question)


DECIDE: dict[str, Callable[[Mind, State], Action]] = {
    "stoprag_query": stoprag_query,
    "stoprag_intermediate": stoprag_intermediate,
    "stoprag_final": final_answer,
    "stoprag_decide": stoprag_decide,
    "qa": final_answer,
    "dapo": dapo,
    "evorag": evorag,
    "r3rag": r3rag,
    "apex_plan": apex_plan,
    "apex_exec": apex_exec,
    "apex_final": apex_final,
    "cot": cot,
}


class TeacherGenerator:
    """The world teacher as a black-box generator (a SIMULATOR; data=synth)."""

    # protocol name -> its decision (a subclass overrides some: rag_lab/env/teacher/generalist.py)
    decide: dict[str, Callable[[Mind, State], Action]] = DECIDE

    @takes(Noise)
    def __init__(
        self,
        data,
        # seeds its noisy and sampled decisions (with each call's sampling seed)
        seed: int = 0,
        **noise: float,
    ):
        """``data``: the dataset whose questions it knows (the run's, handed over by the runner); ``noise``:
        :class:`~rag_lab.env.teacher.agent.Noise`'s probabilities."""
        # not the judge split (data.judge_size): its questions stay unknown to the teacher, so that its
        # lookups (by question or sub-question text) act as before the split existed
        splits = ("train", "dev", "test")
        self.examples = {ex.question: ex for name in splits for ex in data.split(name)}
        self.noise = Noise(**noise)
        self.seed = seed

    def generate(self, prompts: Sequence[Prompt | TokenPrompt], sampling: Sampling) -> list[list[Completion]]:
        # it reads text, as a black-box LLM's user sees it: a prompt given as ids is read as its text
        return [[self._complete(as_text(p), sampling, j) for j in range(sampling.n)] for p in prompts]

    def _complete(self, prompt: Prompt, sampling: Sampling, sample: int) -> Completion:
        found = identify(prompt)
        if found is None:
            return Completion("unknown")
        protocol, state = found
        greedy = sampling.temperature <= 0
        key = f"{self.seed}:{sampling.seed}:{prompt}:{0 if greedy else sample}"
        rng = random.Random(text_digest(key))
        mind = self.mind(self.examples.get(state.question or state.focus), rng, greedy)
        text = protocol.format(self.decide[protocol.name](mind, state))
        return Completion(cut_at_stop(text, sampling)[0])  # the contract: text ends at the first stop

    def mind(self, example: QAExample | None, rng: random.Random, greedy: bool) -> Mind:
        return Mind(example, rng, self.noise, greedy)
