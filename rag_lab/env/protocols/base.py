"""The protocol contract: render a state as a prompt, parse a completion into an ``Action``.

A protocol is one paper's text format for one generation task (Stop-RAG's query generation,
DAPO's tagged turns, R3-RAG's step, ...). The engine and the policies only call
:meth:`Protocol.prompt` and :meth:`Protocol.parse`; the two inverses exist for the world teacher
(a SIMULATOR that must act on the same text a real LLM sees): :meth:`Protocol.read` recovers
the state from a prompt, :meth:`Protocol.format` writes the ideal completion of an action.
Round trips ``parse(format(a)) == a`` and ``read(prompt(s)) == s`` are tested per protocol.

Two renderings: plain text (the tiny LM; it opens with the protocol's tag line, ``[name]``)
and chat (real instruction-tuned models; the paper's instructions as the system message). The
plain rendering ends with the protocol's tag line, ``[name]``, right where generation starts:
the traces of several protocols look alike, and a small model attends to what is near.
"""

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from rag_lab.data.base import Passage
from rag_lab.generators.base import Prompt

# Action kinds
SEARCH, ANSWER, STOP, CONTINUE, BACKTRACK, REFUSE, PLAN, REASON, INVALID = (
    "search",
    "answer",
    "stop",
    "continue",
    "backtrack",
    "refuse",
    "plan",
    "reason",
    "invalid",
)


@dataclass(frozen=True)
class Action:
    kind: str
    query: str | None = None
    answer: str | None = None
    # The free-text reasoning that came with the action (think / reflect / analysis).
    thought: str = ""
    plan: tuple[str, ...] = ()
    # Why a completion was INVALID (a scored format failure, never an exception).
    error: str = ""


@dataclass
class Turn:
    """One round of a trace as a prompt shows it: the action, the evidence it brought back."""

    action: Action
    passages: list[Passage] = field(default_factory=list)
    # The intermediate answer of pipelines that keep one per round (Stop-RAG, APEX's executor).
    answer: str | None = None
    # The policy's raw text for multi-turn protocols that continue their own output (DAPO).
    text: str = ""
    # Evidence discarded by a later BACKTRACK (EVO-RAG).
    abandoned: bool = False


@dataclass
class State:
    question: str
    turns: list[Turn] = field(default_factory=list)
    # Task inputs some protocols need besides the trace: APEX's current sub-question and its
    # knowledge base of (sub-question, sub-answer) pairs.
    focus: str = ""
    notes: list[tuple[str, str]] = field(default_factory=list)


class Protocol:
    """Base class of the protocols (one small subclass per format and task)."""

    name: ClassVar[str]
    # The system message of the chat rendering (the paper's instructions), and a closing line of
    # its user message (the paper's user-prompt suffix).
    system: ClassVar[str] = ""
    instruction: ClassVar[str] = ""
    # Generation stops at these; kept in the text when ``include_stop`` (DAPO's ``</search>``).
    stop: ClassVar[tuple[str, ...]] = ()
    include_stop: ClassVar[bool] = False
    # The start of a completion that answers (``"<answer>"``): written for the model where a stopping rule
    # ends an episode (rag_lab.env.engine.play); None where the protocol has none.
    answer_prefix: ClassVar[str | None] = None
    # Whether each turn continues the previous one's text (DAPO's tagged rollout): the engine then keeps the
    # episode's token ids and appends the environment's text (``appended``) tokenized once, never rendering
    # and tokenizing the history again. Otherwise every turn's prompt is rendered afresh from the state.
    continues: ClassVar[bool] = False

    def appended(self, turn: Turn) -> str:
        """The environment's text that follows the policy's ``turn`` in a continued rollout ("" for none)."""
        return ""

    @property
    def tag(self) -> str:
        return f"\n[{self.name}]\n"

    def body(self, state: State) -> str:
        """The state as text (the chat user message, or the plain prompt after the tag)."""
        raise NotImplementedError

    def read_body(self, body: str) -> State:
        raise NotImplementedError

    def parse(self, text: str) -> Action:
        raise NotImplementedError

    def format(self, action: Action) -> str:
        raise NotImplementedError

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            PROTOCOLS[cls.name] = cls

    def prompt(self, state: State, chat: bool = False) -> Prompt:
        if chat:
            user = self.body(state) + (f"\n{self.instruction}" if self.instruction else "")
            return [{"role": "system", "content": self.system}, {"role": "user", "content": user}]
        return self.body(state) + self.tag

    def read(self, prompt: Prompt) -> State | None:
        """The state behind a prompt of this protocol, or None when it is another protocol's."""
        if isinstance(prompt, str):
            return self.read_body(prompt[: -len(self.tag)]) if prompt.endswith(self.tag) else None
        if len(prompt) >= 2 and prompt[0]["role"] == "system" and prompt[0]["content"] == self.system:
            user = prompt[1]["content"]
            if self.instruction and user.endswith("\n" + self.instruction):
                user = user[: -len(self.instruction) - 1]
            return self.read_body(user)
        return None


# name -> class, filled by subclassing (no hand-kept list).
PROTOCOLS: dict[str, type[Protocol]] = {}


def identify(prompt: Prompt) -> tuple[Protocol, State] | None:
    """The protocol that rendered ``prompt`` and the state it shows (the teacher's eyes)."""
    for cls in PROTOCOLS.values():
        protocol = cls()
        if (state := protocol.read(prompt)) is not None:
            return protocol, state
    return None


def passage_text(p: Passage) -> str:
    return f"{p.title}: {p.text}"


PASSAGE = re.compile(r"^(?P<title>[^:\n]+): (?P<text>.*)$")


def read_passage(line: str) -> Passage:
    """The inverse of :func:`passage_text`; the id is the title (the teacher reads text only)."""
    m = PASSAGE.match(line.strip())
    if not m:
        return Passage("", "", line.strip())
    return Passage(m.group("title"), m.group("title"), m.group("text"))


def field_value(text: str, label: str) -> str | None:
    """The rest of the first line that starts with ``label`` (e.g. ``Answer:``), stripped."""
    for line in text.splitlines():
        if line.strip().startswith(label):
            return line.strip()[len(label) :].strip()
    return None


def first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def documents(passages: Sequence[Passage]) -> str:
    return "\n".join(passage_text(p) for p in passages)


def command(text: str, kinds: dict[str, str], thought_label: str = "Thought:") -> Action:
    """An ``ACTION: value`` or bare ``ACTION`` line (EVO-RAG, APEX's executor), after an optional
    ``Thought:`` line. ``kinds`` maps the upper-case action word to an action kind; a kind that
    carries a value (search / answer) must have one."""
    thought = ""
    for line in (line.strip() for line in text.splitlines()):
        if not line:
            continue
        if line.startswith(thought_label):
            thought = line[len(thought_label) :].strip()
            continue
        word, _, value = line.partition(":")
        kind = kinds.get(word.strip())
        if kind is None:
            return Action(INVALID, thought=thought, error=f"unknown action line {line[:40]!r}")
        value = value.strip()
        if kind in (SEARCH, ANSWER) and not value:
            return Action(INVALID, thought=thought, error=f"{word.strip()} without a value")
        if kind == SEARCH:
            return Action(kind, query=value, thought=thought)
        return Action(kind, answer=value or None, thought=thought)
    return Action(INVALID, thought=thought, error="no action")


def format_command(action: Action, words: dict[str, str], thought_label: str = "Thought:") -> str:
    """The inverse of :func:`command`; ``words`` maps kinds back to action words."""
    head = f"{thought_label} {action.thought}\n" if action.thought else ""
    value = action.query if action.kind == SEARCH else action.answer
    return head + words[action.kind] + (f": {value}" if value else "")
