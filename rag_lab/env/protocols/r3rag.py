"""R3-RAG's step format (arXiv:2505.23794 sec. 3.1, figures 6-7 and algorithm 2).

Each step is generated from a fresh prompt: the question plus every previous step (analysis,
query, retrieved documents); the output is ``The problem analysis: …`` followed by either
``The retrieval query: …`` or ``The final answer: …``. The system message is the paper's role and
answer-format block (its long decomposition instructions are abridged: deviation, add them
through ``system`` if a real model needs them).
"""

from rag_lab.env.protocols.base import (
    ANSWER,
    INVALID,
    SEARCH,
    Action,
    Protocol,
    State,
    Turn,
    documents,
    field_value,
    read_passage,
)

ANALYSIS, QUERY, FINAL, DOCS = (
    "The problem analysis:",
    "The retrieval query:",
    "The final answer:",
    "The retrieval documents:",
)


class R3RAGStep(Protocol):
    name = "r3rag"
    # where a stopping rule ends the episode: the analysis says so, the model writes the answer
    answer_prefix = f"{ANALYSIS} The documents retrieved so far are enough to answer.\n{FINAL}"
    system = (
        "# Role: You are an expert in large language models and knowledge retrieval.\n"
        "# Answer Format:\n"
        "The problem analysis: [Analyze information based on previous steps and the question]\n"
        "**Either:**\nThe retrieval query: [If information is insufficient, generate one query]\n"
        "**OR:**\nThe final answer: [If information is sufficient, provide the final answer]\n"
        "# Instructions: decompose complex questions into atomic sub-questions, address them step by "
        "step, and generate a single targeted query per step."
    )

    def body(self, state: State) -> str:
        lines = [f"The question: {state.question}", "The previous steps:"]
        for j, turn in enumerate(state.turns, 1):
            lines += [f"Step {j}:", f"{ANALYSIS} {turn.action.thought}", f"{QUERY} {turn.action.query}", DOCS]
            lines += [documents(turn.passages)] if turn.passages else []
        return "\n".join(lines)

    def read_body(self, body: str) -> State:
        lines = body.split("\n")
        state = State(lines[0].removeprefix("The question: "))
        thought, in_docs = "", False
        for line in lines[2:]:
            if line.startswith(ANALYSIS):
                thought, in_docs = line[len(ANALYSIS) :].strip(), False
            elif line.startswith(QUERY):
                state.turns.append(Turn(Action(SEARCH, query=line[len(QUERY) :].strip(), thought=thought)))
            elif line == DOCS:
                in_docs = True
            elif in_docs and state.turns and not line.startswith("Step "):
                state.turns[-1].passages.append(read_passage(line))
        return state

    def parse(self, text: str) -> Action:
        thought = field_value(text, ANALYSIS)
        query, answer = field_value(text, QUERY), field_value(text, FINAL)
        if thought is None:
            return Action(INVALID, error=f"no '{ANALYSIS}'")
        if (query is None) == (answer is None):
            return Action(INVALID, thought=thought, error=f"needs exactly one of '{QUERY}' / '{FINAL}'")
        if query is not None:
            return (
                Action(SEARCH, query=query, thought=thought)
                if query
                else Action(INVALID, error="empty query")
            )
        return (
            Action(ANSWER, answer=answer, thought=thought)
            if answer
            else Action(INVALID, error="empty answer")
        )

    def format(self, action: Action) -> str:
        last = f"{QUERY} {action.query}" if action.kind == SEARCH else f"{FINAL} {action.answer}"
        return f"{ANALYSIS} {action.thought}\n{last}"
