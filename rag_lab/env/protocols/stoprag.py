"""Stop-RAG's pipeline prompts (arXiv:2510.14337 appendix D, prompts 1-3, and the final answer).

The trace every task reads is the paper's: ``Main question:`` then, per iteration,
``Follow up:`` (the query), ``Document:`` (the one kept passage) and ``Intermediate answer:``.
The system messages are the paper's prompts without their few-shot blocks (deviation: the
paper's few-shot examples are not published; add them through a subclass's ``system``).
"""

import re

from rag_lab.env.protocols.base import (
    ANSWER,
    CONTINUE,
    INVALID,
    SEARCH,
    STOP,
    Action,
    Protocol,
    State,
    Turn,
    field_value,
    first_line,
    passage_text,
    read_passage,
)


def trace(state: State) -> str:
    lines = [f"Main question: {state.question}"]
    for turn in state.turns:
        lines.append(f"Follow up: {turn.action.query}")
        lines += [f"Document: {passage_text(p)}" for p in turn.passages]
        lines.append(f"Intermediate answer: {turn.answer or ''}")
    return "\n".join(lines)


def read_trace(body: str) -> State:
    state = State("")
    for line in body.splitlines():
        label, _, value = line.partition(": ")
        if label == "Main question":
            state.question = value
        elif label == "Follow up":
            state.turns.append(Turn(Action(SEARCH, query=value)))
        elif label == "Document" and state.turns:
            state.turns[-1].passages.append(read_passage(value))
        elif label == "Intermediate answer" and state.turns:
            state.turns[-1].answer = value
    return state


def one_line(text: str, kind: str, what: str) -> Action:
    value = first_line(text)
    if not value:
        return Action(INVALID, error=f"empty {what}")
    return Action(kind, query=value) if kind == SEARCH else Action(kind, answer=value)


class StopRAGQuery(Protocol):
    """Prompt 1: the next follow-up question."""

    name = "stoprag_query"
    stop = ("\n",)
    system = (
        "Given an original question and a series of follow-up questions and answers, generate the next "
        "logical follow-up question that targets a specific missing piece of information needed to answer "
        "the original question. The question will be used to retrieve additional information from a "
        "knowledge base (e.g., Wikipedia). Output only the new question itself; no explanations or extra "
        "text."
    )
    instruction = (
        "Respond with a simple follow-up question that will help answer the main question, do not explain "
        "yourself or output anything else."
    )

    def body(self, state: State) -> str:
        return trace(state)

    def read_body(self, body: str) -> State:
        return read_trace(body)

    def parse(self, text: str) -> Action:
        return one_line(text, SEARCH, "follow-up question")

    def format(self, action: Action) -> str:
        return action.query or ""


class StopRAGIntermediate(Protocol):
    """Prompt 2: answer the follow-up question from its one document."""

    name = "stoprag_intermediate"
    stop = ("\n",)
    system = (
        "Given a question with its corresponding Wikipedia snippet, generate an answer using only the "
        "provided snippet. Output only the answer, with no additional text. Keep the answer concise and "
        "directly relevant to the question."
    )

    def body(self, state: State) -> str:
        turn = state.turns[-1]
        docs = "".join(f"\nDocument: {passage_text(p)}" for p in turn.passages)
        return f"Question: {turn.action.query}{docs}"

    def read_body(self, body: str) -> State:
        turn = Turn(Action(SEARCH, query=field_value(body, "Question:") or ""))
        turn.passages = [
            read_passage(line[len("Document: ") :])
            for line in body.splitlines()
            if line.startswith("Document: ")
        ]
        return State("", [turn])

    def parse(self, text: str) -> Action:
        return one_line(text, ANSWER, "intermediate answer")

    def format(self, action: Action) -> str:
        return action.answer or ""


class StopRAGFinal(Protocol):
    """The final answer from the trace (the paper's pipeline, answer generation step)."""

    name = "stoprag_final"
    stop = ("\n",)
    system = (
        "Given an original question and a series of follow-up questions each paired with its top Wikipedia "
        "snippet plus intermediate answers, answer the original question. Output only the answer, with no "
        "additional text."
    )
    instruction = "Final answer to the main question:"

    def body(self, state: State) -> str:
        return trace(state)

    def read_body(self, body: str) -> State:
        return read_trace(body)

    def parse(self, text: str) -> Action:
        return one_line(text, ANSWER, "final answer")

    def format(self, action: Action) -> str:
        return action.answer or ""


DECISION = re.compile(r"Decision:\s*<(STOP|CONTINUE)>")


class StopRAGDecide(Protocol):
    """Prompt 3 (LLM-Stop): a short analysis, then ``Decision: <STOP>`` or ``Decision: <CONTINUE>``."""

    name = "stoprag_decide"
    stop = ("<STOP>", "<CONTINUE>")
    include_stop = True
    system = (
        "Given an original question and a series of follow-up questions each paired with its top Wikipedia "
        "snippet plus intermediate answers, analyze step by step whether there is sufficient information to "
        "provide a complete and accurate final answer to the original question. Format your response as: "
        "Analysis: Step-by-step reasoning about information completeness Decision: <STOP> or <CONTINUE>. "
        "<STOP>: All components of the original question can be answered with current information such that "
        "a complete and final answer can be derived from it. <CONTINUE>: Missing any required information "
        "needed to answer the original question."
    )
    instruction = (
        "Based on the information provided, give a short analysis of whether the original question can be "
        "answered. Then, decide whether to stop or continue gathering information."
    )

    def body(self, state: State) -> str:
        return trace(state)

    def read_body(self, body: str) -> State:
        return read_trace(body)

    def parse(self, text: str) -> Action:
        m = DECISION.search(text)
        if not m:
            return Action(INVALID, error="no 'Decision: <STOP>' or 'Decision: <CONTINUE>'")
        thought = field_value(text[: m.start()], "Analysis:") or ""
        return Action(STOP if m.group(1) == "STOP" else CONTINUE, thought=thought)

    def format(self, action: Action) -> str:
        return f"Analysis: {action.thought}\nDecision: <{action.kind.upper()}>"
