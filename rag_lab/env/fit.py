"""Prompts that fit the generator's model: cut on purpose, the question kept, the passages cut, counted.

A prompt longer than the model's positions less the tokens it may generate is, left to the backend,
cut where the backend cuts (or read past the positions the model was trained on). Instead, before a
batch is generated, each prompt is measured with the generator's own tokenizer (after its chat
template) and, where it is too long, re-rendered from its state with every retrieved passage cut to
the same number of words: the most that fits (a binary search; passages already shorter stay whole).
The question, the instructions and the policy's own earlier text are never cut. A prompt that does not
fit even with every passage cut to its title is not generated: its completion is empty with
``finish_reason`` :data:`TOO_LONG`, which the step records as a scored failure with :data:`TOO_LONG_ERROR`.
Each prompt cut or refused counts once in ``Completion.prompt_cut``, then the episode's
``prompt_cuts`` (a field of ``records.jsonl``).

Hand-written: transformers only truncates a token sequence from one side, blind to what it holds.
Generators without a known context (the teacher, API models) are not measured.
"""

from collections.abc import Sequence
from dataclasses import replace

from rag_lab.data.base import Passage
from rag_lab.env.protocols.base import Protocol, State
from rag_lab.generators.base import Prompt, Sampling, render

TOO_LONG = "prompt_too_long"
TOO_LONG_ERROR = "the prompt does not fit the model's positions even with every passage cut to its title"


def context_length(generator) -> int | None:
    """The most tokens (prompt and completion) ``generator``'s model reads; None where unknown."""
    return getattr(generator, "context_length", None)


def token_counts(generator, prompts: Sequence[Prompt]) -> list[int]:
    """Each prompt's length in tokens, as ``generator`` will render and tokenize it."""
    texts = [render(generator.tokenizer, p) for p in prompts]
    return [len(ids) for ids in generator.tokenizer(texts, add_special_tokens=False).input_ids]


def with_passages_cut(state: State, words: int) -> State:
    """``state`` with every passage's text cut to its first ``words`` words (``state`` unchanged)."""

    def cut(p: Passage) -> Passage:
        parts = p.text.split()
        return p if len(parts) <= words else replace(p, text=" ".join(parts[:words]))

    turns = [replace(t, passages=[cut(p) for p in t.passages]) for t in state.turns]
    return replace(state, turns=turns)


def fitted_prompt(protocol: Protocol, state: State, chat: bool, fits) -> Prompt | None:
    """The prompt of ``state`` with its passages cut to the most words that ``fits`` (a predicate on a
    prompt); None when even passages of no words do not fit."""
    longest = max((len(p.text.split()) for t in state.turns for p in t.passages), default=0)
    if not fits(protocol.prompt(with_passages_cut(state, 0), chat)):
        return None
    lo, hi = 0, longest  # fits at lo; the prompt whole (hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(protocol.prompt(with_passages_cut(state, mid), chat)) else (lo, mid)
    return protocol.prompt(with_passages_cut(state, lo), chat)


def fitted_prompts(
    generator, protocol: Protocol, states: Sequence[State], chat: bool, sampling: Sampling
) -> tuple[list[Prompt | None], list[int]]:
    """The prompts of ``states``, each within the model's positions less ``sampling.max_new_tokens``
    (see the module docstring), and whether each was cut (1) or not (0)."""
    prompts: list[Prompt | None] = [protocol.prompt(s, chat) for s in states]
    positions = context_length(generator)
    if positions is None or not prompts:
        return prompts, [0] * len(prompts)
    budget = positions - sampling.max_new_tokens
    cut = [0] * len(prompts)
    for i, n in enumerate(token_counts(generator, prompts)):
        if n > budget:
            prompts[i] = fitted_prompt(
                protocol, states[i], chat, lambda p: token_counts(generator, [p])[0] <= budget
            )
            cut[i] = 1
    return prompts, cut
