"""R3-RAG's PPO samples (arXiv:2505.23794 sec. 3.3 and appendix A; docs/methods/r3rag.md): every step of a
rolled-out episode is one sample, its prompt (the question and the previous steps with their documents, as
the model saw it) and its completion (the step the policy wrote).

- :func:`rollouts`: the policy's episodes of the ``r3rag`` protocol (the batched engine), one per question at
  each of ``temperatures`` (the official code's 0.1 / 0.4 / 0.7 / 1.0), documents cut to ``max_doc_chars``
  (:class:`CutDocuments`; the paper's 512 during RL), the state before each step traced.
- :func:`step_samples`: each step's prompt ids as the model was given them (``Step.prompt_ids``: the engine
  rendered, fitted and tokenized the prompt once, :mod:`rag_lab.env.fit`, and recorded those ids; a prefix
  written for the model, a stopping rule's answer start, included) and the completion's token ids as
  sampled: token in, token out, never the prompt rendered and tokenized again. A step whose prompt did not
  fit has no tokens: it keeps its reward (the episode's returns see it) and trains nothing.
- :func:`tensors`: the samples as right-padded rows of prompt + completion, with the ``mask`` of the
  completion's tokens among the next-token positions: the only positions with a policy loss. Everything
  else (the question, the earlier steps, the retrieved documents, padding) is 0: retrieved tokens carry no
  loss, and the value target is read at the prompt's last token only (:mod:`.model`).

Hand-written: no library turns agent episodes into per-step PPO samples.
"""

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from rag_lab.data.base import Passage, QAExample
from rag_lab.env import Env
from rag_lab.env.engine import Live, play
from rag_lab.env.protocols.base import Protocol
from rag_lab.generators.base import Sampling
from rag_lab.retrievers.base import Hit


@dataclass(frozen=True)
class CutDocuments(Env):
    """The environment with every retrieved document's text cut to ``max_chars`` characters."""

    max_chars: int | None = None

    def passages(self, hits: Sequence[Hit]) -> list[Passage]:
        found = super().passages(hits)
        return found if self.max_chars is None else [replace(p, text=p.text[: self.max_chars]) for p in found]


@dataclass
class Sample:
    """One step of one episode."""

    prompt_ids: list[int]
    completion_ids: list[int]
    # the episode's index in the batch and the step's in the episode
    episode: int
    step: int


def rollouts(
    protocol: Protocol,
    env: Env,
    questions: Sequence[QAExample],
    temperatures: Sequence[float],
    sampling: Sampling,
    k: int,
    max_turns: int,
) -> tuple[list[QAExample], list[Live], list[list[Live]]]:
    """(the question of each episode, its final live state, the states before each of its steps): one
    episode per question at each temperature (``sampling``'s seed plus the temperature's index)."""
    examples, live, traces = [], [], []
    for n, temperature in enumerate(temperatures):
        tuned = replace(sampling, temperature=temperature, seed=(sampling.seed or 0) + n)
        batch = [Live.start(q) for q in questions]
        trace: list[list[Live]] = [[] for _ in batch]
        play(protocol, batch, env, tuned, k, max_turns, trace=trace)
        for x in batch:
            x.episode.stop_reason = x.episode.stop_reason or "max_turns"
        examples += list(questions)
        live += batch
        traces += trace
    return examples, live, traces


def step_samples(live: Sequence[Live]) -> list[Sample]:
    """One sample per step that has tokens (module docstring), episodes in order, steps in order: ``live``
    the episodes' final states (:func:`rollouts`)."""
    return [
        Sample(list(step.prompt_ids), list(step.token_ids), i, j)
        for i, x in enumerate(live)
        for j, step in enumerate(x.episode.steps)
        if step.prompt_ids and step.token_ids
    ]


def tensors(samples: Sequence[Sample], pad_id: int) -> dict[str, torch.Tensor]:
    """``input_ids`` / ``attention_mask`` [N, L] (prompt + completion, right-padded), ``mask`` [N, L-1]
    (1 where the next token is the completion's), ``value_at`` [N] (the prompt's last position)."""
    width = max(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(samples), width), dtype=torch.long)
    mask = torch.zeros((len(samples), width - 1))
    for r, s in enumerate(samples):
        p, c = len(s.prompt_ids), len(s.completion_ids)
        ids[r, : p + c] = torch.tensor(s.prompt_ids + s.completion_ids)
        attention[r, : p + c] = 1
        mask[r, p - 1 : p + c - 1] = 1  # position j predicts token j + 1
    value_at = torch.tensor([len(s.prompt_ids) - 1 for s in samples])
    return {"input_ids": ids, "attention_mask": attention, "mask": mask, "value_at": value_at}
