"""Prompts as the model reads them: token ids, fitted to its positions on purpose (the question kept, the
passages cut, counted).

Where the generator has a tokenizer, every prompt leaves here as the token ids the model reads
(:class:`~rag_lab.generators.base.TokenPrompt`: token in, token out):

- a prompt rendered afresh from its state (every protocol's first turn; every turn of a protocol that
  re-renders its history, R3-RAG's, EVO-RAG's, APEX's, Stop-RAG's) is rendered (the chat template for a
  chat model) and tokenized once, here; the generator decodes from those ids and the engine records them
  on the step (``Step.prompt_ids``), so a trainer's sample is never a re-tokenization;
- a continued rollout (a protocol that ``continues``: DAPO's) is its ids so far, the policy's as sampled
  included, with the environment's text after its last turn (the information block) tokenized alone and
  appended. Its history is never rendered or tokenized again.

A prompt longer than the model's positions less the tokens it may generate is, left to the backend, cut
where the backend cuts (or read past the positions the model was trained on). Instead each prompt is
measured with the generator's own tokenizer and, where it is too long:

- a rendered prompt is rendered again from its state with every retrieved passage cut to the same number of
  words: the most that fits (a binary search; passages already shorter stay whole);
- a continued one has only the passages of the block it appends cut so (the ids before them are what the
  model already read; deviation from the rendered case, where every passage is cut alike), and the cut is
  kept in the state, so that its text is what the model read.

The question, the instructions and the policy's own earlier text are never cut. A prompt that does not fit
even with those passages cut to their titles is not generated: its completion is empty with
``finish_reason`` :data:`TOO_LONG`, which the step records as a scored failure with :data:`TOO_LONG_ERROR`.
Each prompt cut or refused counts once in ``Completion.prompt_cut``, then the episode's ``prompt_cuts`` (a
field of ``records.jsonl``).

Hand-written: transformers only truncates a token sequence from one side, blind to what it holds.
Generators without a tokenizer (the teacher, API models) read text and are not measured.
"""

from collections.abc import Sequence
from dataclasses import replace

from rag_lab.data.base import Passage
from rag_lab.env.protocols.base import PROTOCOLS, Protocol, State
from rag_lab.generators.base import Prompt, Sampling, TokenPrompt, prompt_ids, text_ids

TOO_LONG = "prompt_too_long"
TOO_LONG_ERROR = "the prompt does not fit the model's positions even with every passage cut to its title"


def context_length(generator) -> int | None:
    """The most tokens (prompt and completion) ``generator``'s model reads; None where unknown."""
    return getattr(generator, "context_length", None)


def tokenizer_of(generator):
    """The tokenizer ``generator`` feeds its model with (None: a generator that reads text)."""
    return getattr(generator, "tokenizer", None)


def cut_passages(passages: Sequence[Passage], words: int) -> list[Passage]:
    """Each passage's text cut to its first ``words`` words (a shorter one whole)."""

    def cut(p: Passage) -> Passage:
        parts = p.text.split()
        return p if len(parts) <= words else replace(p, text=" ".join(parts[:words]))

    return [cut(p) for p in passages]


def with_passages_cut(state: State, words: int) -> State:
    """``state`` with every passage's text cut to its first ``words`` words (``state`` unchanged)."""
    return replace(state, turns=[replace(t, passages=cut_passages(t.passages, words)) for t in state.turns])


def most_words(longest: int, fits) -> int | None:
    """The most words (0 .. ``longest``) a passage may keep for ``fits`` (a predicate on a word count that
    holds below some count and fails above it); None when not even 0 fits."""
    if not fits(0):
        return None
    lo, hi = 0, longest  # fits at lo; whole (hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def rendered_prompt(
    tokenizer, protocol: Protocol, state: State, chat: bool, budget: int
) -> TokenPrompt | None:
    """The prompt of ``state`` with its passages cut to the most words that fit ``budget`` tokens, as ids;
    None when even passages of no words do not fit."""

    def ids(words: int) -> tuple[list[int], Prompt]:
        prompt = protocol.prompt(with_passages_cut(state, words), chat)
        return prompt_ids(tokenizer, [prompt])[0], prompt

    longest = max((len(p.text.split()) for t in state.turns for p in t.passages), default=0)
    words = most_words(longest, lambda w: len(ids(w)[0]) <= budget)
    return None if words is None else TokenPrompt(*ids(words))


def continued_prompt(
    tokenizer, protocol: Protocol, state: State, stream: list[int], chat: bool, budget: int | None
) -> tuple[TokenPrompt | None, int]:
    """A continued rollout's next prompt: ``stream`` (its ids so far) and the environment's text after the
    state's last turn, tokenized alone, the block's passages cut where they do not fit ``budget`` (the cut
    kept in the state); whether it was cut (1) or not (0). None when not even passages of no words fit."""
    turn = state.turns[-1]

    def block(words: int | None) -> list[int]:
        shown = turn if words is None else replace(turn, passages=cut_passages(turn.passages, words))
        text = protocol.appended(shown)
        return text_ids(tokenizer, [text])[0] if text else []

    whole = block(None)
    if budget is None or len(stream) + len(whole) <= budget:
        return TokenPrompt(stream + whole, protocol.prompt(state, chat)), 0
    longest = max((len(p.text.split()) for p in turn.passages), default=0)
    words = most_words(longest, lambda w: len(stream) + len(block(w)) <= budget)
    if words is None:
        return None, 1
    turn.passages = cut_passages(turn.passages, words)  # the history now holds what the model read
    return TokenPrompt(stream + block(None), protocol.prompt(state, chat)), 1


def prompt_as_ids(tokenizer, prompt: Prompt) -> list[int]:
    """The ids the engine gives the model for ``prompt`` (a state as text: a demonstration's) had the policy
    written each earlier turn of it as that turn's text tokenized alone (what SFT trains it to write): a
    continued rollout's first prompt rendered and tokenized, then each turn's text and the environment's
    block after it, each tokenized alone (:func:`continued_prompt`); any other prompt rendered and
    tokenized once. Demonstrations then train on the ids the policy reads at inference."""
    for cls in PROTOCOLS.values():
        protocol = cls()
        if protocol.continues and (state := protocol.read(prompt)) is not None:
            chat = not isinstance(prompt, str)
            ids = prompt_ids(tokenizer, [protocol.prompt(State(state.question), chat)])[0]
            for turn in state.turns:
                ids += sum(text_ids(tokenizer, [t for t in (turn.text, protocol.appended(turn)) if t]), [])
            return ids
    return prompt_ids(tokenizer, [prompt])[0]


def fitted_prompts(
    generator,
    protocol: Protocol,
    states: Sequence[State],
    chat: bool,
    sampling: Sampling,
    streams: Sequence[list[int] | None] | None = None,
) -> tuple[list[Prompt | TokenPrompt | None], list[int]]:
    """The prompts of ``states``, each within the model's positions less ``sampling.max_new_tokens`` (see the
    module docstring), and whether each was cut (1) or not (0). With a tokenizer each is a
    :class:`TokenPrompt`; ``streams[i]``, when given, is state i's continued rollout so far (its ids)."""
    tokenizer = tokenizer_of(generator)
    if tokenizer is None:
        return [protocol.prompt(s, chat) for s in states], [0] * len(states)
    positions = context_length(generator)
    budget = None if positions is None else positions - sampling.max_new_tokens
    streams = list(streams) if streams is not None else [None] * len(states)
    prompts: list[Prompt | TokenPrompt | None] = [None] * len(states)
    cut = [0] * len(states)
    fresh = [i for i, stream in enumerate(streams) if stream is None]
    rendered = [protocol.prompt(states[i], chat) for i in fresh]
    for i, prompt, ids in zip(fresh, rendered, prompt_ids(tokenizer, rendered), strict=True):
        if budget is None or len(ids) <= budget:
            prompts[i] = TokenPrompt(ids, prompt)
        else:
            prompts[i], cut[i] = rendered_prompt(tokenizer, protocol, states[i], chat, budget), 1
    for i, stream in enumerate(streams):
        if stream is not None:
            prompts[i], cut[i] = continued_prompt(tokenizer, protocol, states[i], stream, chat, budget)
    return prompts, cut
