"""The batched multi-turn rollout engine (DESIGN.md, "The environment and the rollout engine").

A whole batch of episodes advances together: per turn, one batched ``generate`` call for every
live episode (stopping at the protocol's stop strings), parse, one batched ``search`` for every
SEARCH action (excluding each episode's already-seen passages when asked), append the evidence,
drop finished episodes. The protocol renders and parses; the engine knows only action kinds:

- SEARCH: retrieve ``k`` for the query; the passages join the state.
- ANSWER / REFUSE: the episode ends (REFUSE predicts "").
- BACKTRACK: the latest search that still holds evidence is abandoned (its passages leave the
  prompt; EVO-RAG's "return to an earlier state").
- anything unparsable (INVALID, or a kind the loop has no use for): the episode ends with
  ``format_failure`` set and the parser's reason; it is scored, never raised.

Token in, token out: where the generator has a tokenizer, each prompt goes to it as token ids
(:mod:`rag_lab.env.fit`), and each step keeps the ids the model was given (``Step.prompt_ids``), the ids it
sampled (``token_ids``, never the environment's text) and their log-probs: what trainers train on, with the
retrieved text masked out of the loss, and never a re-tokenization of the text. A protocol whose turns
continue each other (``Protocol.continues``: DAPO's) plays on the episode's ids (``Live.ids``): the next
turn's prompt is the last one's ids, the ids it sampled and the environment's block tokenized once, alone. A
prefix written for the model (a forced action word, a stopping rule's answer start) is tokenized alone and
appended to the prompt's ids; the step's ``prompt_ids`` hold it, its ``token_ids`` only what the model wrote.
"""

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from tqdm.auto import tqdm

from rag_lab.core.errors import RagLabError
from rag_lab.data.base import QAExample
from rag_lab.env.env import Env
from rag_lab.env.episode import Episode, Step
from rag_lab.env.fit import TOO_LONG, TOO_LONG_ERROR, fitted_prompts, tokenizer_of
from rag_lab.env.protocols.base import ANSWER, BACKTRACK, REFUSE, SEARCH, Action, Protocol, State, Turn
from rag_lab.generators.base import Completion, Prompt, Sampling, TokenPrompt, text_ids


@dataclass
class Live:
    episode: Episode
    state: State
    seen: set[str]
    # A continued rollout's token ids through its last turn (the prompt it was given, the ids it sampled),
    # which its next turn extends (None: no turn yet, or a protocol that renders each prompt afresh).
    ids: list[int] | None = None
    # the question it answers: what a gold-reading retriever (retriever=oracle) is handed with its searches
    example: QAExample | None = None

    @classmethod
    def start(cls, example: QAExample) -> "Live":
        """A new episode of ``example``: no step yet, nothing seen."""
        return cls(Episode(example.id, example.question), State(example.question), set(), example=example)


def generate(
    env: Env,
    protocol: Protocol,
    states: Sequence[State],
    sampling: Sampling,
    prefixes: Sequence[str] | None = None,
    streams: Sequence[list[int] | None] | None = None,
) -> list[Completion]:
    """One completion per state, from ``protocol``'s prompt fitted to the model (:mod:`rag_lab.env.fit`: a
    prompt that cannot fit is not generated, its completion empty with finish reason ``TOO_LONG``),
    stopping where ``protocol`` pauses; its ``prompt_ids`` the ids the model was given. ``prefixes[i]``,
    when given, is the start of state i's completion, written for the model (EVO-RAG's forced siblings:
    ``"SEARCH:"``): the model continues it, and the completion's text begins with it (its ``token_ids``
    hold only what the model wrote). ``streams[i]``: state i's continued rollout so far (``Live.ids``)."""
    if env.generator is None:
        raise RagLabError(
            "generator: this policy needs a generator (set generator=tiny, teacher, hf, vllm or openai)"
        )
    tuned = replace(sampling, n=1, stop=protocol.stop, include_stop=protocol.include_stop)
    prompts, cuts = fitted_prompts(env.generator, protocol, states, chat_of(env), tuned, streams)
    prefixes = list(prefixes) if prefixes is not None else [""] * len(prompts)
    out = [Completion("", finish_reason=TOO_LONG) for _ in prompts]
    fit = [i for i, p in enumerate(prompts) if p is not None]
    if fit:
        asked = [prefilled(prompts[i], prefixes[i], tokenizer_of(env.generator)) for i in fit]
        for i, p, c in zip(fit, asked, env.generator.generate(asked, tuned), strict=True):
            ids = list(p.ids) if isinstance(p, TokenPrompt) else []
            out[i] = replace(c[0], text=prefixes[i] + c[0].text, prompt_ids=ids)
    for c, cut in zip(out, cuts, strict=True):
        c.prompt_cut = cut
    return out


def prefilled(prompt: Prompt | TokenPrompt, prefix: str, tokenizer=None) -> Prompt | TokenPrompt:
    """``prompt`` with ``prefix`` as the start of the model's reply: appended to a text prompt, or to a
    chat's partial assistant message (one is opened when the chat has none); to a :class:`TokenPrompt`'s
    ids tokenized alone (``tokenizer``), and to its text so."""
    if not prefix:
        return prompt
    if isinstance(prompt, TokenPrompt):
        return TokenPrompt(prompt.ids + text_ids(tokenizer, [prefix])[0], prefilled(prompt.text, prefix))
    if isinstance(prompt, str):
        return prompt + prefix
    if prompt[-1]["role"] == "assistant":
        return [*prompt[:-1], {"role": "assistant", "content": prompt[-1]["content"] + prefix}]
    return [*prompt, {"role": "assistant", "content": prefix}]


def account(episode: Episode, completion: Completion) -> None:
    """A generation's tokens and prompt cut, counted in its episode."""
    episode.completion_tokens += len(completion.token_ids)
    episode.prompt_tokens += completion.prompt_tokens
    episode.prompt_cuts += completion.prompt_cut


def record(episode: Episode, completion: Completion, action: Action) -> Step:
    """A generation as a step of ``episode`` (the parser's error, or why the prompt was refused)."""
    step = Step(
        text=completion.text,
        action=action.kind,
        query=action.query,
        prompt_ids=completion.prompt_ids,
        token_ids=completion.token_ids,
        logprobs=completion.logprobs,
        error=TOO_LONG_ERROR if completion.finish_reason == TOO_LONG else action.error or "",
    )
    episode.steps.append(step)
    account(episode, completion)
    return step


def chat_of(env: Env) -> bool:
    """Whether the generator wants chat messages (instruction-tuned models) or plain text (tiny)."""
    return bool(getattr(env.generator, "chat", False))


def undoable(state: State) -> Turn | None:
    """The turn a BACKTRACK at ``state`` abandons: the latest search still holding evidence (None: none)."""
    return next((t for t in reversed(state.turns) if t.passages and not t.abandoned), None)


def fork(x: Live) -> Live:
    """An independent copy of a live episode (its steps, turns and seen passages), so that a branch's later
    steps (a BACKTRACK marks a turn abandoned) leave the original as it was."""
    turns = [replace(t, passages=list(t.passages)) for t in x.state.turns]
    episode = replace(x.episode, steps=list(x.episode.steps))
    ids = None if x.ids is None else list(x.ids)
    return Live(episode, replace(x.state, turns=turns), set(x.seen), ids, x.example)


def advance(
    protocol: Protocol,
    live: Sequence[Live],
    env: Env,
    completions: Sequence[Completion],
    k: int,
    exclude_seen: bool = False,
) -> list[Live]:
    """One turn: parse each completion, run one batched search for every SEARCH, record the steps, apply
    the transitions (module docstring); the episodes still live after it."""
    actions = [protocol.parse(c.text) for c in completions]
    searching = [i for i, a in enumerate(actions) if a.kind == SEARCH]
    exclude = [live[i].seen for i in searching] if exclude_seen else None
    queries = [actions[i].query for i in searching]
    asking = [live[i].example for i in searching]
    hits = dict(zip(searching, env.search(queries, k, exclude, asking), strict=True)) if searching else {}
    still = []
    for i, (x, completion, action) in enumerate(zip(live, completions, actions, strict=True)):
        step = record(x.episode, completion, action)
        turn = Turn(action, text=completion.text)
        if protocol.continues and completion.prompt_ids:  # the ids the next turn continues
            x.ids = completion.prompt_ids + completion.token_ids
        if action.kind == SEARCH:
            step.retrieved_ids = [h.id for h in hits[i]]
            turn.passages = env.passages(hits[i])
            x.seen.update(step.retrieved_ids)
        elif action.kind == BACKTRACK:
            undone = undoable(x.state)
            if undone is not None:
                undone.abandoned = True
        elif action.kind in (ANSWER, REFUSE):
            x.episode.prediction = (action.answer or "") if action.kind == ANSWER else ""
            x.episode.stop_reason = action.kind
            continue
        else:
            x.episode.format_failure = True
            x.episode.stop_reason = "format_error"
            step.error = step.error or f"unexpected action {action.kind!r}"
            continue
        x.state.turns.append(turn)
        still.append(x)
    return still


def play(
    protocol: Protocol,
    live: Sequence[Live],
    env: Env,
    sampling: Sampling,
    k: int = 5,
    max_turns: int = 5,
    exclude_seen: bool = False,
    trace: list[list[Live]] | None = None,
    progress: bool = False,
    stopper: Any = None,
) -> None:
    """Advance every episode of ``live`` until it ends or holds ``max_turns`` steps (a forked episode
    keeps its earlier steps in that count), all of them batched per turn. ``trace[i]``, when given,
    receives a :func:`fork` of ``live[i]`` before each of its steps: the states it visited. A ``stopper``
    (Stop-RAG's ``should_stop(env, states, episodes)``) is asked before each turn; where it says stop, the
    turn's completion starts with the protocol's ``answer_prefix`` (the model writes the answer) and the
    episode's stop reason is ``stopper``."""
    position = {id(x): i for i, x in enumerate(live)}
    live = [x for x in live if len(x.episode.steps) < max_turns]
    for _ in tqdm(range(max_turns), desc=f"{protocol.name} turns", disable=not progress, leave=False):
        if not live:
            break
        if trace is not None:
            for x in live:
                trace[position[id(x)]].append(fork(x))
        stopping = stops(stopper, protocol, env, live)
        prefixes = [protocol.answer_prefix if stop else "" for stop in stopping]
        streams = [x.ids for x in live] if protocol.continues else None
        completions = generate(env, protocol, [x.state for x in live], sampling, prefixes, streams)
        still = advance(protocol, live, env, completions, k, exclude_seen)
        for x, stop in zip(live, stopping, strict=True):
            if stop and x.episode.stop_reason == ANSWER:
                x.episode.stop_reason = "stopper"
        live = [x for x in still if not full(x, max_turns)]


def stops(stopper: Any, protocol: Protocol, env: Env, live: Sequence[Live]) -> list[bool]:
    """Where ``stopper`` ends an episode before this turn (all False without one)."""
    if stopper is None:
        return [False] * len(live)
    if protocol.answer_prefix is None:
        raise RagLabError(
            f"a stopping rule needs a way to make the model answer: protocol {protocol.name} has none"
        )
    return stopper.should_stop(env, [x.state for x in live], [x.episode for x in live])


def full(x: Live, max_turns: int) -> bool:
    """Whether ``x`` used its ``max_turns`` steps (it then ends with stop reason ``max_turns``)."""
    if len(x.episode.steps) < max_turns:
        return False
    x.episode.stop_reason = "max_turns"
    return True


def run_agent(
    protocol: Protocol,
    examples: Sequence[QAExample],
    env: Env,
    sampling: Sampling,
    k: int = 5,
    max_turns: int = 5,
    exclude_seen: bool = False,
    progress: bool = False,
    stopper: Any = None,
) -> list[Episode]:
    """Roll out one episode per example with ``protocol``, all examples batched per turn (``stopper``:
    :func:`play`'s)."""
    live = [Live.start(ex) for ex in examples]
    episodes = [x.episode for x in live]
    play(protocol, live, env, sampling, k, max_turns, exclude_seen, progress=progress, stopper=stopper)
    return episodes
