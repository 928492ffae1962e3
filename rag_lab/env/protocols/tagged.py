"""The multi-stage-reward DAPO paper's tagged rollout (OpenReview XVtORJ0AXN sec. 3.2, "Rollout with
Search", and the "Instruction for Trained RLM" of its appendix B.4).

One rollout is one growing text: ``<think>…</think>``, then ``<search>q</search>`` (generation
pauses at ``</search>``; the engine appends ``<information>top-k passages</information>``),
``<reflect>…</reflect>``, … and finally ``<answer>…</answer>``. Each engine turn generates up to
the next ``</search>`` or ``</answer>``; the prompt of the next turn is the question followed by
everything so far, and the tokens inside ``<information>`` are the environment's, not the
policy's (trainers mask them). Chat models get the trace as an assistant message to continue.
The protocol ``continues``: where the generator has a tokenizer, the engine keeps the rollout as token ids
(the first prompt's, the policy's as sampled, each information block's tokenized once) and never renders
the text below again (:mod:`rag_lab.env.engine`); :meth:`DAPOTagged.prompt` is the text those ids stand for.
"""

import re

from rag_lab.env.protocols.base import (
    ANSWER,
    INVALID,
    SEARCH,
    Action,
    Protocol,
    State,
    Turn,
    documents,
    read_passage,
)
from rag_lab.generators.base import Prompt

TAG = re.compile(r"<(search|answer)>(.*?)</\1>", re.S)
INFORMATION = re.compile(r"\n<information>\n(.*?)\n</information>\n", re.S)


class DAPOTagged(Protocol):
    name = "dapo"
    stop = ("</search>", "</answer>")
    answer_prefix = "<answer>"
    include_stop = True
    continues = True
    system = (
        "Please answer the given question by following the structured reasoning protocol below:\n"
        "1. Always begin with <think>...</think> to provide a brief internal reasoning sketch.\n"
        "2. If your internal knowledge is sufficient to answer the question: provide a concise summary of "
        "your reasoning inside <reflect>...</reflect>, then give the final answer inside "
        "<answer>...</answer>.\n"
        "3. Only if your internal knowledge is genuinely insufficient: generate a brief keyword-based search "
        "query inside <search>...</search>, with sufficient factual clues (names, dates, locations).\n"
        "4. When the system returns information inside <information>...</information>: if it is sufficient, "
        "integrate it with your reasoning inside <reflect>...</reflect>, then provide the final concise "
        "answer inside <answer>...</answer>.\n"
        "5. If the retrieved information is insufficient: explain the issue within <reflect>...</reflect> "
        "and, if necessary, generate a revised <search> query.\n"
        "6. The final answer must be concise and clear, placed inside <answer></answer>."
    )

    @staticmethod
    def information(turn: Turn) -> str:
        return f"\n<information>\n{documents(turn.passages)}\n</information>\n" if turn.passages else ""

    def appended(self, turn: Turn) -> str:
        return self.information(turn)

    def rollout_text(self, state: State) -> str:
        """The policy's turns with the engine's information blocks between them."""
        return "".join(turn.text + self.information(turn) for turn in state.turns)

    def body(self, state: State) -> str:
        return f"Question: {state.question}{self.tag}" + self.rollout_text(state)

    def read_body(self, body: str) -> State:
        head, _, rest = body.partition(self.tag)
        state = State(head.removeprefix("Question: "))
        # Split the rollout into policy texts and information blocks.
        position = 0
        for m in INFORMATION.finditer(rest):
            text = rest[position : m.start()]
            passages = [read_passage(line) for line in m.group(1).splitlines()]
            state.turns.append(Turn(self.parse(text), passages, text=text))
            position = m.end()
        if rest[position:]:
            state.turns.append(Turn(self.parse(rest[position:]), text=rest[position:]))
        return state

    def prompt(self, state: State, chat: bool = False) -> Prompt:
        """Plain: the question, the tag line, then the rollout so far (which the policy continues)."""
        if not chat:
            return self.body(state)
        messages = [{"role": "system", "content": self.system}, {"role": "user", "content": state.question}]
        if state.turns:  # continued by the generator (continue_final_message)
            messages.append({"role": "assistant", "content": self.rollout_text(state)})
        return messages

    def read(self, prompt: Prompt) -> State | None:
        if isinstance(prompt, str):
            return self.read_body(prompt) if prompt.startswith("Question: ") and self.tag in prompt else None
        if prompt[0]["content"] != self.system:
            return None
        rollout = prompt[2]["content"] if len(prompt) > 2 else ""
        return self.read_body(f"Question: {prompt[1]['content']}{self.tag}{rollout}")

    def parse(self, text: str) -> Action:
        """The last ``<search>`` or ``<answer>`` of one turn; the text before it is the thought."""
        found = list(TAG.finditer(text))
        if not found:
            return Action(INVALID, thought=text.strip(), error="no <search>…</search> or <answer>…</answer>")
        m = found[-1]
        value, thought = m.group(2).strip(), text[: m.start()].strip()
        if not value:
            return Action(INVALID, thought=thought, error=f"empty <{m.group(1)}>")
        if m.group(1) == "search":
            return Action(SEARCH, query=value, thought=thought)
        return Action(ANSWER, answer=value, thought=thought)

    def format(self, action: Action) -> str:
        sep = "\n" if action.thought else ""
        if action.kind == SEARCH:
            return f"{action.thought}{sep}<search>{action.query}</search>"
        return f"{action.thought}{sep}<answer>{action.answer}</answer>"


def structure_ok(rollout: str) -> bool:
    """r_f's check (DAPO paper sec. 3.3, eq. 6): ``<think>`` first, then either ``<reflect><answer>`` or
    rounds of ``<search><information><reflect>`` ending in ``<answer>``; nothing else.

    >>> structure_ok("<think>a</think>\\n<reflect>b</reflect>\\n<answer>c</answer>")
    True
    >>> structure_ok("<think>a</think>\\n<search>q</search>\\n<information>\\nx\\n</information>\\n"
    ...              "<reflect>b</reflect>\\n<answer>c</answer>")
    True
    >>> structure_ok("<think>a</think>\\n<answer>c</answer>")
    False
    >>> structure_ok("<think>a</think>\\n<search>q</search>\\n<information>\\nx\\n</information>\\n"
    ...              "<reflect>b</reflect>\\n<reflect>b</reflect>\\n<answer>c</answer>")
    False
    """
    tags = re.findall(r"<(think|search|information|reflect|answer)>.*?</\1>", rollout, re.S)
    if re.sub(r"<(think|search|information|reflect|answer)>.*?</\1>", "", rollout, flags=re.S).strip():
        return False
    sequence = " ".join(tags)
    # exactly the paper's two structures: each round's reflect precedes the answer; no second reflect
    return bool(re.fullmatch(r"think( search information reflect)+ answer|think reflect answer", sequence))
