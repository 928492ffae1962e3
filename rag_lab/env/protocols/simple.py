"""The prompting baselines' formats: ``qa`` (question, optional documents → short answer; the
direct / standard-RAG / Iter-RetGen reader) and ``cot`` (documents, question and the reasoning so
far → the next reasoning sentence, or ``So the answer is: …``; chain-of-thought and IRCoT, after
Trivedi et al. 2023, whose retrieval query is the latest sentence).
"""

from rag_lab.env.protocols.base import (
    ANSWER,
    INVALID,
    REASON,
    SEARCH,
    Action,
    Protocol,
    State,
    Turn,
    documents,
    first_line,
    read_passage,
)

ANSWER_IS = "So the answer is:"


def evidence(state: State) -> list:
    return [p for turn in state.turns for p in turn.passages]


def read_evidence(lines: list[str]) -> list[Turn]:
    passages = [read_passage(line) for line in lines if line]
    return [Turn(Action(SEARCH), passages)] if passages else []


class QA(Protocol):
    name = "qa"
    stop = ("\n",)
    system = (
        "Answer the question, using the documents when they are given. Output only the answer, as short as "
        "possible (an entity, a date, yes or no), with no explanation."
    )

    def body(self, state: State) -> str:
        docs = documents(evidence(state))
        return (f"Documents:\n{docs}\n" if docs else "") + f"Question: {state.question}"

    def read_body(self, body: str) -> State:
        head, _, question = body.rpartition("Question: ")
        return State(question, read_evidence(head.removeprefix("Documents:\n").splitlines()))

    def parse(self, text: str) -> Action:
        answer = first_line(text)
        return Action(ANSWER, answer=answer) if answer else Action(INVALID, error="empty answer")

    def format(self, action: Action) -> str:
        return action.answer or ""


class CoT(Protocol):
    """One reasoning sentence per generation; the reasoning so far sits in ``State.notes`` as
    (sentence, "") pairs so that IRCoT can interleave retrieval between sentences."""

    name = "cot"
    stop = ("\n",)
    system = (
        "Answer the question by reasoning step by step, one sentence at a time, using the documents. When "
        f"the reasoning is complete, write '{ANSWER_IS} <short answer>'."
    )

    def body(self, state: State) -> str:
        docs = documents(evidence(state))
        reasoning = "".join(f"\n{s}" for s, _ in state.notes)
        return (
            f"Documents:\n{docs}\n" if docs else ""
        ) + f"Question: {state.question}\nReasoning:{reasoning}"

    def read_body(self, body: str) -> State:
        head, _, rest = body.rpartition("Question: ")
        question, _, reasoning = rest.partition("\nReasoning:")
        state = State(question, read_evidence(head.removeprefix("Documents:\n").splitlines()))
        state.notes = [(s, "") for s in reasoning.split("\n") if s]
        return state

    def parse(self, text: str) -> Action:
        sentence = first_line(text)
        if not sentence:
            return Action(INVALID, error="empty reasoning step")
        if sentence.startswith(ANSWER_IS):
            answer = sentence[len(ANSWER_IS) :].strip()
            return Action(ANSWER, answer=answer) if answer else Action(INVALID, error="empty answer")
        return Action(REASON, thought=sentence)

    def format(self, action: Action) -> str:
        return f"{ANSWER_IS} {action.answer}" if action.kind == ANSWER else action.thought
