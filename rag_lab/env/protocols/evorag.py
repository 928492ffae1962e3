"""EVO-RAG's step format (arXiv:2505.17391 sec. 3.1-3.2): one action per step from
{SEARCH, BACKTRACK, ANSWER, REFUSE}.

The paper gives the action set, not a text format; ours (a documented choice) is one line per
step — ``SEARCH: <sub-query>``, ``BACKTRACK``, ``ANSWER: <answer>`` or ``REFUSE`` — after an
optional ``Thought:`` line. The prompt lists the steps so far with the documents each SEARCH
brought back. BACKTRACK "returns to an earlier state": the engine discards the evidence of the
latest search that still has some (its documents leave the prompt; the step stays listed as
``SEARCH: q (abandoned)`` so the policy does not repeat itself blindly).
"""

from rag_lab.env.protocols.base import (
    ANSWER,
    BACKTRACK,
    REFUSE,
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

WORDS = {SEARCH: "SEARCH", BACKTRACK: "BACKTRACK", ANSWER: "ANSWER", REFUSE: "REFUSE"}
KINDS = {word: kind for kind, word in WORDS.items()}
ABANDONED = " (abandoned)"


class EVORAGStep(Protocol):
    name = "evorag"
    system = (
        "You answer multi-hop questions by searching a knowledge base step by step. At each step output "
        "exactly one action line: 'SEARCH: <sub-query>' to retrieve documents for a new sub-query, "
        "'BACKTRACK' to abandon the last search and its documents, 'ANSWER: <short answer>' when the "
        "documents support an answer, or 'REFUSE' when the question cannot be answered from the knowledge "
        "base. You may precede the action with one 'Thought: ...' line."
    )

    def body(self, state: State) -> str:
        lines = [f"Question: {state.question}"]
        for turn in state.turns:
            a = turn.action
            if a.kind == SEARCH:
                lines.append(f"SEARCH: {a.query}" + (ABANDONED if turn.abandoned else ""))
                if turn.passages and not turn.abandoned:
                    lines += ["Documents:", documents(turn.passages)]
            else:
                lines.append(WORDS[a.kind])
        return "\n".join(lines)

    def read_body(self, body: str) -> State:
        head, *rest = body.split("\n")
        state = State(head.removeprefix("Question: "))
        in_docs = False
        for line in rest:
            if line.startswith("SEARCH: "):
                query = line[len("SEARCH: ") :]
                turn = Turn(
                    Action(SEARCH, query=query.removesuffix(ABANDONED)), abandoned=query.endswith(ABANDONED)
                )
                state.turns.append(turn)
                in_docs = False
            elif line == "Documents:":
                in_docs = True
            elif line in KINDS:
                state.turns.append(Turn(Action(KINDS[line])))
                in_docs = False
            elif in_docs and state.turns:
                state.turns[-1].passages.append(read_passage(line))
        return state

    def parse(self, text: str) -> Action:
        return command(text, KINDS)

    def format(self, action: Action) -> str:
        return format_command(action, WORDS)
