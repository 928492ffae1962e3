"""APEX-Searcher's planner and executor formats (arXiv:2603.13853v3 sec. 2.2.2 and 2.4, appendix E).

Planner: the question in, an ordered list of sub-questions out, one per line as ``1. …``;
later ones may reference earlier answers as ``#1``, ``#2``. No parsable line → INVALID (the
policy then falls back to the question itself, as the paper does).

Executor: the paper's five executor prompts (sufficiency check, answer from knowledge,
continuation, first / later query) are fused into one decision step (deviation, documented):
given the sub-question (placeholders resolved), the knowledge base of earlier (sub-question,
sub-answer) pairs, the queries tried for this sub-question and their documents, output
``SEARCH: <query>`` (a query different from those tried) or ``ANSWER: <sub-answer>``.
Final synthesis: the question and the knowledge base in, ``ANSWER: …`` and ``CONFIDENCE: 0-1`` out.
"""

import re

from rag_lab.env.protocols.base import (
    ANSWER,
    INVALID,
    PLAN,
    SEARCH,
    Action,
    Protocol,
    State,
    Turn,
    command,
    documents,
    format_command,
    read_passage,
)

STEP = re.compile(r"^\s*(\d+)[.)]\s+(.+?)\s*$")


class APEXPlan(Protocol):
    name = "apex_plan"
    system = (
        "Decompose the question into the fewest ordered sub-questions that answer it, one per line as "
        "'1. ...', '2. ...'. Each sub-question asks for one fact; refer to the answer of an earlier "
        "sub-question as #1, #2, ... . A question that needs one fact is its own single sub-question."
    )

    def body(self, state: State) -> str:
        return f"Question: {state.question}"

    def read_body(self, body: str) -> State:
        return State(body.removeprefix("Question: "))

    def parse(self, text: str) -> Action:
        plan = tuple(m.group(2) for line in text.splitlines() if (m := STEP.match(line)))
        return Action(PLAN, plan=plan) if plan else Action(INVALID, error="no numbered sub-question")

    def format(self, action: Action) -> str:
        return "\n".join(f"{i}. {q}" for i, q in enumerate(action.plan, 1))


def knowledge(notes: list[tuple[str, str]]) -> str:
    return "\n".join(f"{q} -> {a}" for q, a in notes)


def read_knowledge(lines: list[str]) -> list[tuple[str, str]]:
    return [tuple(line.split(" -> ", 1)) for line in lines if " -> " in line]  # type: ignore[misc]


EXEC = {SEARCH: "SEARCH", ANSWER: "ANSWER"}


class APEXExecute(Protocol):
    name = "apex_exec"
    system = (
        "You solve one sub-question of a larger question. Use the knowledge gathered so far and the "
        "retrieved documents. If they answer the sub-question, output 'ANSWER: <short answer>'. Otherwise "
        "output 'SEARCH: <query>' with a query different from the ones already tried."
    )

    def body(self, state: State) -> str:
        lines = [f"Sub-question: {state.focus}", "Knowledge:", knowledge(state.notes)]
        for turn in state.turns:
            lines += [f"Tried: {turn.action.query}", documents(turn.passages)]
        return "\n".join(lines)

    def read_body(self, body: str) -> State:
        head, _, rest = body.partition("\nKnowledge:\n")
        state = State("", focus=head.removeprefix("Sub-question: "))
        notes, *tried = re.split(r"\n(?=Tried: )", rest)
        state.notes = read_knowledge(notes.splitlines())
        for block in tried:
            query, *docs = block.split("\n")
            state.turns.append(
                Turn(
                    Action(SEARCH, query=query.removeprefix("Tried: ")), [read_passage(d) for d in docs if d]
                )
            )
        return state

    def parse(self, text: str) -> Action:
        return command(text, {w: k for k, w in EXEC.items()})

    def format(self, action: Action) -> str:
        return format_command(action, EXEC)


CONFIDENCE = re.compile(r"CONFIDENCE:\s*([01](?:\.\d+)?)")


class APEXFinal(Protocol):
    name = "apex_final"
    system = (
        "Answer the question from the knowledge gathered for its sub-questions. Output 'ANSWER: <short "
        "answer>' and, on the next line, 'CONFIDENCE: <a number from 0 to 1>'."
    )

    def body(self, state: State) -> str:
        return f"Question: {state.question}\nKnowledge:\n{knowledge(state.notes)}"

    def read_body(self, body: str) -> State:
        head, _, rest = body.partition("\nKnowledge:\n")
        return State(head.removeprefix("Question: "), notes=read_knowledge(rest.splitlines()))

    def parse(self, text: str) -> Action:
        answer = command(text.split("\nCONFIDENCE:")[0], {"ANSWER": ANSWER})
        if answer.kind == INVALID:
            return answer
        m = CONFIDENCE.search(text)
        return Action(ANSWER, answer=answer.answer, thought=m.group(1) if m else "")

    def format(self, action: Action) -> str:
        confidence = f"\nCONFIDENCE: {action.thought}" if action.thought else ""
        return f"ANSWER: {action.answer}{confidence}"
