"""The policy contract: roll out a batch of questions; optionally fit on a training split.

A policy that trains keeps what it trained on itself (a Q-network, a model: its ``generator``); evaluation
asks for it (:func:`rag_lab.eval.evaluate.acting_env`). Nothing is written into the shared ``Env``."""

from pathlib import Path
from typing import Any, Protocol

from rag_lab.data.base import QAExample
from rag_lab.env import Env, Episode


class Policy(Protocol):
    # False for prompting baselines: the runner skips fit().
    trains: bool
    # The LM the policy acts with once fit trained one (None, or absent: the env's generator).
    generator: Any

    def fit(self, env: Env, train: list[QAExample], dev: list[QAExample], out_dir: Path, logger=None) -> None:
        """Train, checkpointing under ``out_dir`` so that a killed run resumes; training curves go to
        ``logger`` (the run's: ``log_metrics(metrics, step)``) when given."""
        ...

    def rollout(self, env: Env, batch: list[QAExample]) -> list[Episode]:
        """One episode per question, in order. Must not depend on which other questions share
        the batch (seed per question id), so a resumed evaluation gives the same numbers."""
        ...

    # Optional (a method with a training reward of its own; evaluation asks with hasattr):
    # def own_rewards(self, env: Env, batch: list[QAExample], episodes: list[Episode]) -> list[float | None]:
    #     """The reward the method's own trainer gives each evaluated episode (its reward code, its settings:
    #     a start and its trained row scored alike), one per episode, None where it has none; evaluation
    #     writes it as records.jsonl's ``own_reward`` (absent: None)."""
