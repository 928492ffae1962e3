"""Stop-RAG's iterative pipeline (arXiv:2510.14337 sec. 4.1 and 5.3, appendix D's prompts 1-3) as a policy,
with a pluggable stopping rule: ``policy=fixed_iter`` (always T iterations) and ``policy=llm_stop``
(the generator answers STOP / CONTINUE before each further iteration, prompt 3). Stop-RAG plugs
its value-based rule in as another :class:`Stopper`.

One iteration for every live question at once: generate a follow-up query (prompt 1; one batched
call), retrieve ``depth`` and keep the top ``k`` after dropping passages already seen (the
authors' code; ``retriever=rerank`` reranks the top 10 first, as the paper), then answer the
follow-up from its document (prompt 2; one batched call). After the last iteration, or a stop,
the final answer comes from the whole trace (one batched call).

Token ids: the generator is a black box to Stop-RAG (its Q-network reads the state's text, and no
token-level policy loss trains on these episodes), but each step keeps the ids the model was given and
sampled all the same (:mod:`rag_lab.env.engine`); the intermediate answers are counted, not steps.
"""

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from rag_lab.core.config import PositiveInt
from rag_lab.data.base import QAExample
from rag_lab.env import Env, Episode
from rag_lab.env.engine import account, generate, record
from rag_lab.env.protocols.base import ANSWER, INVALID, SEARCH, STOP, Action, State, Turn
from rag_lab.env.protocols.stoprag import StopRAGDecide, StopRAGFinal, StopRAGIntermediate, StopRAGQuery
from rag_lab.generators.base import Sampling


class Stopper(Protocol):
    def should_stop(self, env: Env, states: Sequence[State], episodes: Sequence[Episode]) -> list[bool]:
        """Before the next iteration: True where the question should stop and answer now."""
        ...


class NeverStop:
    def should_stop(self, env: Env, states: Sequence[State], episodes: Sequence[Episode]) -> list[bool]:
        return [False] * len(states)


class LLMStop:
    """The generator decides (prompt 3); an unparsable decision counts as CONTINUE and is recorded."""

    def __init__(
        self,
        # the longest STOP / CONTINUE decision (greedy)
        max_new_tokens: PositiveInt = 64,
    ):
        self.protocol = StopRAGDecide()
        self.sampling = Sampling(max_new_tokens=max_new_tokens)

    def should_stop(self, env: Env, states: Sequence[State], episodes: Sequence[Episode]) -> list[bool]:
        asking = [i for i, s in enumerate(states) if s.turns]  # nothing to judge before the first round
        out = [False] * len(states)
        asked = generate(env, self.protocol, [states[i] for i in asking], self.sampling)
        for i, completion in zip(asking, asked, strict=True):
            action = self.protocol.parse(completion.text)
            record(episodes[i], completion, action)
            out[i] = action.kind == STOP
        return out


def traced_state(corpus, episode: Episode) -> State:
    """The state a finished episode of the pipeline answered from, replayed from its steps: each iteration's
    step (the ones with a query) a turn of its query, the passages it kept and its intermediate answer."""
    turns = [
        Turn(
            Action(SEARCH, query=s.query), [corpus.get(pid) for pid in s.retrieved_ids], answer=s.answer or ""
        )
        for s in episode.steps
        if s.query is not None
    ]
    return State(episode.question, turns)


class IterativePipeline:
    trains = False

    def __init__(
        self,
        # decides before each further iteration whether to stop (null: never; Stop-RAG passes its Q-network's)
        stopper: Stopper | None = None,
        # T: the most iterations per question
        iterations: PositiveInt = 10,
        # passages kept per iteration (the paper keeps the reranked top 1)
        k: PositiveInt = 1,
        # drop passages a question's earlier iterations retrieved from its later searches
        exclude_seen: bool = True,
        # the longest completion of one call (query, intermediate or final answer; greedy)
        max_new_tokens: PositiveInt = 32,
    ):
        self.stopper = stopper or NeverStop()
        self.iterations = iterations
        self.k = k
        self.exclude_seen = exclude_seen
        self.sampling = Sampling(max_new_tokens=max_new_tokens)
        self.query = StopRAGQuery()
        self.intermediate = StopRAGIntermediate()
        self.final = StopRAGFinal()

    def fit(self, env: Env, train: list[QAExample], dev: list[QAExample], out_dir: Path, logger=None) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not train")

    def iterate(
        self,
        env: Env,
        batch: list[QAExample],
        states: list[State],
        episodes: list[Episode],
        seen: list[set[str]],
    ) -> None:
        """One pipeline iteration for every state given (batched; ``batch[i]``: state i's question): query,
        retrieve, answer."""
        queries = generate(env, self.query, states, self.sampling)
        actions = [self.query.parse(c.text) for c in queries]
        # An empty follow-up is a scored format failure; the pipeline searches with the question.
        texts = [a.query if a.kind == SEARCH else s.question for a, s in zip(actions, states, strict=True)]
        hits = env.search(texts, self.k, seen if self.exclude_seen else None, batch)
        for s, ep, c, a, q, found, ids in zip(
            states, episodes, queries, actions, texts, hits, seen, strict=True
        ):
            step = record(ep, c, Action(SEARCH, query=q) if a.kind == SEARCH else a)
            step.query = q
            step.retrieved_ids = [h.id for h in found]
            ep.format_failure |= a.kind == INVALID
            ids.update(step.retrieved_ids)
            s.turns.append(Turn(Action(SEARCH, query=q), env.passages(found)))
        for s, ep, c in zip(
            states, episodes, generate(env, self.intermediate, states, self.sampling), strict=True
        ):
            a = self.intermediate.parse(c.text)
            s.turns[-1].answer = a.answer or ""
            ep.steps[-1].answer = a.answer or ""
            account(ep, c)

    def answer(
        self, env: Env, states: list[State], episodes: list[Episode], sampling: Sampling | None = None
    ) -> None:
        for ep, c in zip(episodes, generate(env, self.final, states, sampling or self.sampling), strict=True):
            a = self.final.parse(c.text)
            record(ep, c, a)
            ep.prediction = (a.answer or "") if a.kind == ANSWER else ""
            ep.format_failure |= a.kind == INVALID

    def rollout(self, env: Env, batch: list[QAExample]) -> list[Episode]:
        states = [State(ex.question) for ex in batch]
        episodes = [Episode(ex.id, ex.question, stop_reason="max_steps") for ex in batch]
        seen: list[set[str]] = [set() for _ in batch]
        live = list(range(len(batch)))
        for _ in range(self.iterations):
            stops = self.stopper.should_stop(env, [states[i] for i in live], [episodes[i] for i in live])
            for i, stop in zip(live, stops, strict=True):
                if stop:
                    episodes[i].stop_reason = "stop"
            live = [i for i, stop in zip(live, stops, strict=True) if not stop]
            if not live:
                break
            self.iterate(
                env,
                [batch[i] for i in live],
                [states[i] for i in live],
                [episodes[i] for i in live],
                [seen[i] for i in live],
            )
        self.answer(env, states, episodes)
        return episodes
