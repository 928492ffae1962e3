"""Held-out curves: how a method's policy answers questions it never trains on, measured while it trains.

A trainer's own curve (a batch's reward) is measured on what it trains on and is noisy; the held-out curve
is the policy's accuracy (Acc, the dataset's scorer) on fixed held-out questions (the dev split's first
``n``), greedy, in the method's own loop, at the start and every ``every`` steps (and at the last). Its rows,
``{"step", "heldout/acc", "heldout/format_failures", "heldout/n"}`` (``n``: the questions measured, for the
95% band the comparison's plot draws), join the training log, so ``train_log.jsonl``, the method's curves and
the comparison's ``curves.png`` draw it.

The policy answers with the trainer's model as it is at that step (:func:`rag_lab.train.lockstep.acting`): on
the trainer's vLLM engine, synced to that step's weights, where the run's generator is vLLM; else with
transformers on the model itself, under FSDP / ZeRO-3 the sharded model with every process in step. No
copy of the weights is made.

Hand-written: TRL's ``eval_strategy`` evaluates a loss on a dataset, not a multi-turn policy's answers.
"""

import contextlib
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
import torch
from transformers import TrainerCallback

from rag_lab.core.config import AtLeast
from rag_lab.data.base import QAExample
from rag_lab.env import Episode
from rag_lab.eval.metrics import SCORERS
from rag_lab.generators.vllm import rollouts_done
from rag_lab.train.lockstep import acting, model_only

HELDOUT_KEY = "heldout/acc"
# the questions a held-out row was measured on
HELDOUT_N = "heldout/n"


@dataclass(frozen=True)
class HeldOut:
    """``policy.heldout``: held-out questions (the dev split's first ``n``; 0: no curve) and the training
    steps between two measurements."""

    n: Annotated[int, AtLeast(0)] = 64
    every: Annotated[int, AtLeast(1)] = 2

    def questions(self, dev: Sequence[QAExample]) -> list[QAExample]:
        return list(dev[: self.n])

    def due(self, step: int, last: int) -> bool:
        """Whether ``step`` (of ``last``) is measured: the start, every ``every``-th, the last."""
        return step == 0 or step % self.every == 0 or step == last


def heldout_row(step: int, questions: Sequence[QAExample], episodes: Sequence[Episode], scorer: str) -> dict:
    """The curve's row: Acc and the format-failure rate of ``episodes`` against their ``questions``, and how
    many questions that is (a reader's interval around the Acc needs it).

    >>> from rag_lab.env import Episode
    >>> qs = [QAExample("a", "?", ("Paris",)), QAExample("b", "?", ("Rome",))]
    >>> eps = [Episode("a", "?", prediction="paris"), Episode("b", "?", prediction="", format_failure=True)]
    >>> row = heldout_row(4, qs, eps, "squad")
    >>> row["step"], row["heldout/acc"], row["heldout/format_failures"], row["heldout/n"]
    (4, 0.5, 0.5, 2)
    """
    acc = SCORERS[scorer]["acc"]
    right = [acc(ep.prediction, list(q.answers)) for q, ep in zip(questions, episodes, strict=True)]
    return {
        "step": step,
        "time": time.time(),
        HELDOUT_KEY: sum(right) / len(right),
        "heldout/format_failures": sum(ep.format_failure for ep in episodes) / len(episodes),
        HELDOUT_N: len(right),
    }


def measured(
    step: int,
    questions: Sequence[QAExample],
    rollout: Callable[[list[QAExample]], list[Episode]],
    scorer: str,
    finish: Callable[[], None] | None = None,
) -> dict | None:
    """The curve's row at ``step``, measured by every process: process i rolls out ``questions[i::N]``, and
    the episodes are gathered (:func:`rag_lab.train.parallel.spread`); the main process gets the row of all of
    them, the others None. Every process calls it at the same steps, one with no share too (it joins the
    gather). Under ``launch`` no rank waits in a collective while the main process measures alone (issue
    66). ``finish()``: the end of the generation phase, before the gather (a sharded model's lockstep)."""
    from rag_lab.train.parallel import is_main, spread

    def roll(units: list[int]) -> list[Episode]:
        with rng_kept():
            return rollout([questions[i] for i in units])

    episodes = spread(len(questions), roll, finish)
    return heldout_row(step, questions, episodes, scorer) if is_main() else None


@contextlib.contextmanager
def rng_kept() -> Iterator[None]:
    """Every random stream (Python's, numpy's, torch's CPU and CUDA ones) as it was before the block: a
    measurement (the generator seeds torch for each call) leaves training's draws as they would have been."""
    states = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.random.set_rng_state(states[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


class HeldOutCallback(TrainerCallback):
    """For TRL's trainers: ``rollout(generator, questions)`` (the method's greedy episodes of ``questions``
    with ``generator``, the trainer's model as it is) at the steps :meth:`HeldOut.due` picks, each row handed
    to ``write``. ``generator``: the transformers generator whose tokenizer and settings speak for the model
    (:func:`rag_lab.train.lockstep.acting`); ``trainer``, set by the method once its trainer is built: the
    model, accelerator and vLLM engine measured (unset: the model the callback is handed, unsharded). A run
    resumed at step ``resumed_at`` measures from there on (the rows before are in the log already; the
    Trainer calls ``on_train_begin`` before it loads the checkpoint's step, so the start is skipped by that
    number). A trainer that keeps the rows itself sets ``write`` and ``resumed_at`` before it trains. Under
    ``launch`` every process measures its share of the questions and the main process writes the row
    (:func:`measured`). ``start=False``: the model before the first step is not measured, where a stage
    continues from one measured already (DAPO's second stage starts from the first's last point)."""

    def __init__(
        self,
        settings: HeldOut,
        questions: Sequence[QAExample],
        rollout: Callable[[Any, list[QAExample]], list[Episode]],
        write: Callable[[dict], None] | None = None,
        scorer: str = "squad",
        resumed_at: int = 0,
        generator: Any = None,
        start: bool = True,
    ):
        self.settings = settings
        self.questions = list(questions)
        self.rollout = rollout
        self.write = write
        self.scorer = scorer
        self.resumed_at = resumed_at
        self.generator = generator
        self.start = start
        self.trainer: Any = None

    def measure(self, step: int, model: Any) -> None:
        """Every process measures its share (:func:`measured`) on what the trainer's model generates with
        at ``step`` (its engine synced to that step, or the model itself, every process in step); the main
        process writes the row."""
        with acting(self.trainer or model_only(model), self.generator, step) as actor:
            row = measured(
                step,
                self.questions,
                lambda share: self.rollout(actor, share),
                self.scorer,
                finish=lambda: rollouts_done(actor),
            )
        if row is not None:
            self.write(row)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.start and self.resumed_at == 0 and self.questions:
            self.measure(0, model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.questions and self.settings.due(state.global_step, state.max_steps):
            self.measure(state.global_step, model)
