"""Prompting baselines with any generator (no training), each one batched across questions:

- ``direct``: the question alone → answer (``qa`` protocol, no retrieval).
- ``standard_rag``: retrieve the top ``k`` with the question once → answer from them.
- ``cot``: chain-of-thought, one sentence per call, no retrieval, until ``So the answer is:``.
- ``ircot`` (Trivedi et al. 2023): retrieve with the question, then after every reasoning sentence
  retrieve ``k`` more with that sentence (unseen passages only), until the answer or ``max_steps``;
  no answer by then → the ``qa`` reader over everything retrieved (IRCoT's reader step).
- ``iter_retgen`` (Shao et al. 2023): ``iterations`` rounds of retrieve-with(question + last
  answer) → answer; the last answer is the prediction.
"""

from pathlib import Path

from rag_lab.core.config import NonNegative, PositiveInt
from rag_lab.data.base import QAExample
from rag_lab.env import Env, Episode, Step
from rag_lab.env.engine import generate, record
from rag_lab.env.protocols.base import ANSWER, INVALID, REASON, SEARCH, Action, Protocol, State, Turn
from rag_lab.env.protocols.simple import QA, CoT
from rag_lab.generators.base import Sampling


class Prompting:
    """Shared plumbing: no training; batched generation and retrieval over many states."""

    trains = False

    def __init__(
        self,
        # passages per search (a policy that retrieves)
        k: PositiveInt = 5,
        # the longest completion of one call, and its sampling temperature (0: greedy)
        max_new_tokens: PositiveInt = 32,
        temperature: NonNegative = 0.0,
    ):
        self.k = k
        self.sampling = Sampling(max_new_tokens=max_new_tokens, temperature=temperature)

    def fit(self, env: Env, train: list[QAExample], dev: list[QAExample], out_dir: Path, logger=None) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not train")

    def ask(self, env: Env, protocol: Protocol, states: list[State], episodes: list[Episode]) -> list[Action]:
        """One generation per state; each recorded as a step of its episode."""
        actions = []
        for ep, c in zip(episodes, generate(env, protocol, states, self.sampling), strict=True):
            action = protocol.parse(c.text)
            record(ep, c, action)
            actions.append(action)
        return actions

    def retrieve(
        self,
        env: Env,
        states: list[State],
        episodes: list[Episode],
        queries: list[str],
        questions: list[QAExample],
        seen: list[set[str]] | None = None,
        asked: bool = False,
    ) -> list[bool]:
        """One batched search (``questions[i]``: the question query i is asked for); the passages join each
        state (excluding ``seen`` ones when given) and a search step of each episode: a new one, or with
        ``asked`` the generated step that asked for it (one search, one step). Whether each search found a
        passage (with ``seen``: a new one)."""
        hits = env.search(queries, self.k, seen, questions)
        for i, (s, ep, q, found) in enumerate(zip(states, episodes, queries, hits, strict=True)):
            ids = [h.id for h in found]
            if asked:
                ep.steps[-1].retrieved_ids = ids
            else:
                ep.steps.append(Step(action=SEARCH, query=q, retrieved_ids=ids))
            s.turns.append(Turn(Action(SEARCH, query=q), env.passages(found)))
            if seen is not None:
                seen[i].update(ids)
        return [bool(found) for found in hits]

    @staticmethod
    def finish(episodes: list[Episode], actions: list[Action], reason: str = "answer") -> None:
        for ep, a in zip(episodes, actions, strict=True):
            ep.prediction = (a.answer or "") if a.kind == ANSWER else ""
            ep.format_failure |= a.kind == INVALID
            ep.stop_reason = "format_error" if a.kind == INVALID else reason

    @staticmethod
    def start(batch: list[QAExample]) -> tuple[list[State], list[Episode]]:
        return [State(ex.question) for ex in batch], [Episode(ex.id, ex.question) for ex in batch]


class Direct(Prompting):
    def rollout(self, env: Env, batch: list[QAExample]) -> list[Episode]:
        states, episodes = self.start(batch)
        self.finish(episodes, self.ask(env, QA(), states, episodes))
        return episodes


class StandardRAG(Prompting):
    def rollout(self, env: Env, batch: list[QAExample]) -> list[Episode]:
        states, episodes = self.start(batch)
        self.retrieve(env, states, episodes, [s.question for s in states], batch)
        self.finish(episodes, self.ask(env, QA(), states, episodes))
        return episodes


class IterRetGen(Prompting):
    def __init__(
        self,
        # rounds of retrieve(question + the last round's answer) -> answer; the last round's answer is final
        iterations: PositiveInt = 3,
        # passages per search
        k: PositiveInt = 5,
        # the longest completion of one call, and its sampling temperature (0: greedy)
        max_new_tokens: PositiveInt = 32,
        temperature: NonNegative = 0.0,
    ):
        super().__init__(k, max_new_tokens, temperature)
        self.iterations = iterations

    def rollout(self, env: Env, batch: list[QAExample]) -> list[Episode]:
        states, episodes = self.start(batch)
        answers = [""] * len(batch)
        for _ in range(self.iterations):
            # Each round reads only its own retrieval (generation-augmented retrieval, then answer).
            rounds = [State(s.question) for s in states]
            self.retrieve(
                env,
                rounds,
                episodes,
                [f"{s.question} {a}".strip() for s, a in zip(states, answers, strict=True)],
                batch,
            )
            actions = self.ask(env, QA(), rounds, episodes)
            answers = [(a.answer or "") if a.kind == ANSWER else "" for a in actions]
        self.finish(episodes, actions)
        return episodes


class ChainOfThought(Prompting):
    """CoT (``retrieve=False``) and IRCoT (``retrieve=True``): one reasoning sentence per call."""

    def __init__(
        self,
        # IRCoT: retrieve k passages with each reasoning sentence (false: CoT, no retrieval)
        retrieve: bool = False,
        # reasoning sentences (calls) before the answer is forced
        max_steps: PositiveInt = 6,
        # passages per search
        k: PositiveInt = 3,
        # the longest completion of one call, and its sampling temperature (0: greedy)
        max_new_tokens: PositiveInt = 48,
        temperature: NonNegative = 0.0,
    ):
        super().__init__(k, max_new_tokens, temperature)
        self.retrieve_each = retrieve
        self.max_steps = max_steps

    def rollout(self, env: Env, batch: list[QAExample]) -> list[Episode]:
        states, episodes = self.start(batch)
        seen: list[set[str]] = [set() for _ in batch]
        if self.retrieve_each:
            self.retrieve(env, states, episodes, [s.question for s in states], batch, seen)
        self.reason(env, batch, states, episodes, seen)
        return episodes

    def reason(
        self,
        env: Env,
        batch: list[QAExample],
        states: list[State],
        episodes: list[Episode],
        seen: list[set[str]],
    ) -> None:
        """Reasoning sentences until each state answers (IRCoT: a search after each sentence); the ``qa``
        reader answers those still reasoning after ``max_steps``."""
        live = list(range(len(states)))
        for _ in range(self.max_steps):
            if not live:
                break
            actions = self.ask(env, CoT(), [states[i] for i in live], [episodes[i] for i in live])
            done = [i for i, a in zip(live, actions, strict=True) if a.kind != REASON]
            self.finish([episodes[i] for i in done], [a for a in actions if a.kind != REASON])
            live = [i for i, a in zip(live, actions, strict=True) if a.kind == REASON]
            for i, a in zip(live, [a for a in actions if a.kind == REASON], strict=True):
                states[i].notes.append((a.thought, ""))
            if self.retrieve_each and live:
                self.retrieve(
                    env,
                    [states[i] for i in live],
                    [episodes[i] for i in live],
                    [states[i].notes[-1][0] for i in live],
                    [batch[i] for i in live],
                    [seen[i] for i in live],
                )
        if live:  # no answer within max_steps: the reader answers from everything retrieved
            self.finish(
                [episodes[i] for i in live],
                self.ask(env, QA(), [states[i] for i in live], [episodes[i] for i in live]),
                reason="max_steps",
            )
