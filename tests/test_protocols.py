"""Each protocol: prompt → read gives the state back, format → parse gives the action back (both
renderings), broken completions parse to a scored INVALID with a reason, and identify() finds
the protocol behind any prompt."""

import pytest

from rag_lab.data.base import Passage
from rag_lab.env.protocols import PROTOCOLS, Action, State, Turn, identify
from rag_lab.env.protocols.base import (
    ANSWER,
    BACKTRACK,
    CONTINUE,
    INVALID,
    PLAN,
    REASON,
    REFUSE,
    SEARCH,
    STOP,
)  # fmt: skip
from rag_lab.env.protocols.tagged import structure_ok

P1 = Passage("Tuine Dovale", "Tuine Dovale", "Tuine Dovale was born in Peport. She is a film director.")
P2 = Passage("The Brobres", "The Brobres", "The Brobres is a film directed by Tuine Dovale.")
P3 = Passage("Peport", "Peport", "Peport is the capital of Veoia.")
Q = "Where was the director of The Brobres born?"

# protocol -> (a state it renders, actions it must parse back)
CASES = {
    "stoprag_query": (
        State(Q, [Turn(Action(SEARCH, query="Who directed The Brobres?"), [P2], answer="Tuine Dovale")]),
        [Action(SEARCH, query="Where was Tuine Dovale born?")],
    ),
    "stoprag_intermediate": (
        State("", [Turn(Action(SEARCH, query="Who directed The Brobres?"), [P2])]),
        [Action(ANSWER, answer="Tuine Dovale")],
    ),
    "stoprag_final": (
        State(Q, [Turn(Action(SEARCH, query="Who directed The Brobres?"), [P2], answer="Tuine Dovale"),
                  Turn(Action(SEARCH, query="Where was Tuine Dovale born?"), [P1], answer="Peport")]),
        [Action(ANSWER, answer="Peport")],
    ),
    "stoprag_decide": (
        State(Q, [Turn(Action(SEARCH, query="Who directed The Brobres?"), [P2], answer="Tuine Dovale")]),
        [Action(STOP, thought="All facts known."), Action(CONTINUE, thought="Missing the birthplace.")],
    ),
    "dapo": (
        State(Q, [Turn(Action(SEARCH, query="The Brobres director", thought="<think>x</think>"), [P2, P3],
                       text="<think>x</think>\n<search>The Brobres director</search>")]),
        [Action(SEARCH, query="Tuine Dovale birthplace", thought="<reflect>Found it.</reflect>"),
         Action(ANSWER, answer="Peport", thought="<reflect>Done.</reflect>")],
    ),
    "evorag": (
        State(Q, [Turn(Action(SEARCH, query="Who directed The Brobres?"), [P3], abandoned=True),
                  Turn(Action(BACKTRACK)),
                  Turn(Action(SEARCH, query="The Brobres"), [P2, P1])]),
        [Action(SEARCH, query="Where was Tuine Dovale born?"), Action(BACKTRACK), Action(REFUSE),
         Action(ANSWER, answer="Peport", thought="It is in the documents.")],
    ),
    "r3rag": (
        State(Q, [Turn(Action(SEARCH, query="Who directed The Brobres?", thought="Need it."), [P2])]),
        [Action(SEARCH, query="Where was Tuine Dovale born?", thought="Director known."),
         Action(ANSWER, answer="Peport", thought="Sufficient.")],
    ),
    "apex_plan": (State(Q), [Action(PLAN, plan=("Who directed The Brobres?", "Where was #1 born?"))]),
    "apex_exec": (
        State("", [Turn(Action(SEARCH, query="Tuine Dovale"), [P1, P3])],
              focus="Where was Tuine Dovale born?", notes=[("Who directed The Brobres?", "Tuine Dovale")]),
        [Action(SEARCH, query="Tuine Dovale birthplace"), Action(ANSWER, answer="Peport")],
    ),
    "apex_final": (
        State(Q, notes=[("Who directed The Brobres?", "Tuine Dovale"), ("Where was #1 born?", "Peport")]),
        [Action(ANSWER, answer="Peport", thought="0.9")],
    ),
    "qa": (State(Q, [Turn(Action(SEARCH), [P1, P2])]), [Action(ANSWER, answer="Peport")]),
    "cot": (
        State(Q, [Turn(Action(SEARCH), [P2])], notes=[("Who directed The Brobres? Tuine Dovale.", "")]),
        [Action(REASON, thought="Where was Tuine Dovale born?"), Action(ANSWER, answer="Peport")],
    ),
}  # fmt: skip

BROKEN = {
    "stoprag_query": ["", "\n\n"],
    "stoprag_intermediate": [""],
    "stoprag_final": ["  "],
    "stoprag_decide": ["Analysis: fine", "Decision: STOP", "Decision: <MAYBE>"],
    "dapo": ["<think>hm</think>", "<search>unclosed", "<answer></answer>", "plain words"],
    "evorag": ["", "SEARCH:", "ANSWER", "JUMP: somewhere", "search: lower case"],
    "r3rag": ["The retrieval query: q", "The problem analysis: a", "The problem analysis: a\n"
              "The retrieval query: q\nThe final answer: b", "The problem analysis: a\nThe final answer:"],
    "apex_plan": ["", "Who directed it? Where was #1 born?"],
    "apex_exec": ["", "LOOKUP: x"],
    "apex_final": ["Peport", "CONFIDENCE: 0.5"],
    "qa": [""],
    "cot": ["", "So the answer is:"],
}  # fmt: skip


def test_every_protocol_has_cases():
    assert set(CASES) == set(PROTOCOLS) == set(BROKEN)


def same_state(a: State, b: State) -> bool:
    """Equal as a prompt shows them (abandoned evidence is not shown)."""

    def view(s: State):
        shown = [[(p.title, p.text) for p in t.passages if not t.abandoned] for t in s.turns]
        turns = [(t.action.kind, t.action.query, t.answer, t.abandoned) for t in s.turns]
        return s.question, s.focus, [tuple(n) for n in s.notes], turns, shown

    return view(a) == view(b)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("chat", [False, True])
def test_read_inverts_prompt(name, chat):
    protocol, (state, _) = PROTOCOLS[name](), CASES[name]
    prompt = protocol.prompt(state, chat)
    assert same_state(protocol.read(prompt), state)
    found, read = identify(prompt)
    assert found.name == name and same_state(read, state)


@pytest.mark.parametrize("name", sorted(CASES))
def test_parse_inverts_format(name):
    protocol = PROTOCOLS[name]()
    for action in CASES[name][1]:
        assert protocol.parse(protocol.format(action)) == action


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_completions_are_invalid_with_a_reason(name):
    protocol = PROTOCOLS[name]()
    for text in BROKEN[name]:
        action = protocol.parse(text)
        assert action.kind == INVALID and action.error, (name, text, action)


def test_prompts_of_other_protocols_are_not_read():
    state = CASES["qa"][0]
    qa = PROTOCOLS["qa"]().prompt(state)
    assert PROTOCOLS["cot"]().read(qa) is None and PROTOCOLS["dapo"]().read(qa) is None
    assert identify("no protocol renders this") is None


def test_dapo_chat_rendering_continues_the_assistant_turn():
    state = CASES["dapo"][0]
    messages = PROTOCOLS["dapo"]().prompt(state, chat=True)
    assert [m["role"] for m in messages] == ["system", "user", "assistant"]
    assert messages[2]["content"].startswith(
        "<think>x</think>\n<search>The Brobres director</search>\n<information>"
    )


def test_dapo_structure_reward_check():
    search = "<think>a</think>\n<search>q</search>\n<information>\nx\n</information>\n"
    assert structure_ok(search + "<reflect>b</reflect>\n<answer>c</answer>")
    assert structure_ok("<think>a</think><reflect>b</reflect><answer>c</answer>")
    assert not structure_ok(search + "<answer>c</answer>")  # no reflection after information
    assert not structure_ok("<think>a</think>stray text<reflect>b</reflect><answer>c</answer>")
    assert not structure_ok("<reflect>b</reflect><answer>c</answer>")  # no think
