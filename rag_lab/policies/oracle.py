"""``oracle_rag``: the reader given each question's gold supporting passages and no search — what the LM
can do when search is perfect, the ceiling that every method learning to search is read against.

Three readers over the same passages: ``qa`` answers at once (standard RAG with perfect retrieval: a
multi-hop question must then be composed inside one answer), ``cot`` reasons one sentence at a time
(chain-of-thought over the gold passages, one hop a sentence, then ``So the answer is:``) and ``hops``
reads hop by hop as APEX's executor does (each gold sub-question, earlier answers filled in, asked with
its own gold passage in view, then APEX's synthesis over the answers: the ceiling of a plan-and-execute
loop whose plans and searches are perfect; questions without a gold decomposition get the synthesis of
nothing). A comparison's ceiling is the best of them on the LM at hand (issue 64: the LM's card measures
each).

The passages are shuffled per question (seeded by the question's id, the same order in every run) so that
their order does not give the chain away; ``order=gold`` keeps the decomposition's order. A question whose
evidence is withheld (synth's unanswerable questions) gets the supports that exist, as a perfect search
would. A dataset whose questions name no gold supports cannot have this row: the policy says so, naming
the dataset, before anything runs.
"""

import random
from typing import Any

from rag_lab.core.config import ConfigError, NonNegative, PositiveInt
from rag_lab.data.base import QAExample, resolve_references
from rag_lab.env import Env, Episode
from rag_lab.env.protocols.apex import APEXExecute, APEXFinal
from rag_lab.env.protocols.base import ANSWER, SEARCH, Action, State, Turn
from rag_lab.env.protocols.simple import QA
from rag_lab.policies.prompting import ChainOfThought

READERS = ("qa", "cot", "hops")
ORDERS = ("shuffled", "gold")


class OracleRAG(ChainOfThought):
    """The gold supporting passages in the prompt, read by ``reader`` (``qa`` or ``cot``); no retrieval."""

    def __init__(
        self,
        data: Any = None,
        run_config: dict | None = None,
        # how the gold passages are read: qa (answer at once) | cot (reasoning sentences) | hops (APEX)
        reader: str = "qa",
        # shuffled (per question, seeded by its id) or gold (the decomposition's order)
        order: str = "shuffled",
        max_steps: PositiveInt = 6,
        max_new_tokens: PositiveInt = 32,
        temperature: NonNegative = 0.0,
    ):
        for key, value, allowed in (("reader", reader, READERS), ("order", order, ORDERS)):
            if value not in allowed:
                raise ConfigError(f"policy.{key}: {value!r} is not one of {', '.join(allowed)}")
        super().__init__(
            retrieve=False, max_steps=max_steps, max_new_tokens=max_new_tokens, temperature=temperature
        )
        self.reader = reader
        self.order = order
        if data is not None:  # the runner hands its dataset over; a caller without one checks nothing
            check_supports(data, ((run_config or {}).get("eval") or {}).get("split", "test"))

    def gold(self, env: Env, ex: QAExample) -> list:
        """The question's supporting passages that the corpus holds, in this policy's order."""
        passages = [env.corpus.get(pid) for pid in dict.fromkeys(ex.supporting_ids) if pid in env.corpus]
        if self.order == "shuffled":
            random.Random(ex.id).shuffle(passages)
        return passages

    def rollout(self, env: Env, batch: list[QAExample]) -> list[Episode]:
        states, episodes = self.start(batch)
        for state, ex in zip(states, batch, strict=True):
            state.turns.append(Turn(Action(SEARCH), self.gold(env, ex)))
        if self.reader == "qa":
            self.finish(episodes, self.ask(env, QA(), states, episodes))
        elif self.reader == "hops":
            self.hop_by_hop(env, batch, [State(ex.question) for ex in batch], episodes)
        else:
            self.reason(env, batch, states, episodes, [set() for _ in batch])
        return episodes

    def hop_by_hop(
        self, env: Env, batch: list[QAExample], states: list[State], episodes: list[Episode]
    ) -> None:
        """The ``hops`` reader: APEX's executor over each question's gold plan, one hop a batched call, each
        sub-question with its own gold passage in view, then APEX's synthesis (see the module docstring)."""
        for j in range(max((len(ex.decomposition) for ex in batch), default=0)):
            live = [i for i, ex in enumerate(batch) if j < len(ex.decomposition)]
            tasks = []
            for i in live:
                hop = batch[i].decomposition[j]
                focus = resolve_references(hop.question, [a for _, a in states[i].notes])
                passages = [env.corpus.get(hop.support_id)] if hop.support_id in env.corpus else []
                turn = Turn(Action(SEARCH, query=focus), passages)
                tasks.append(State(states[i].question, [turn], focus=focus, notes=list(states[i].notes)))
            actions = self.ask(env, APEXExecute(), tasks, [episodes[i] for i in live])
            for i, task, a in zip(live, tasks, actions, strict=True):
                states[i].notes.append((task.focus, (a.answer if a.kind == ANSWER else None) or "unknown"))
                if a.kind == SEARCH:  # nothing is searched: the sub-answer is "unknown", no retrieval counted
                    episodes[i].steps[-1].query = None
        self.finish(episodes, self.ask(env, APEXFinal(), states, episodes))


def check_supports(data: Any, split: str) -> None:
    """A one-line error naming the dataset (and its file) when no question of ``split`` names a gold
    supporting passage."""
    examples = data.split(split)
    if any(ex.supporting_ids for ex in examples):
        return
    where = getattr(data, "path", None)
    source = f" ({where}, split {split})" if where is not None else f" (split {split})"
    raise ConfigError(
        f"policy=oracle_rag: data={getattr(data, 'name', type(data).__name__)}{source} names no gold "
        "supporting passages, so there is nothing to put in the prompt; use a dataset with supports "
        "(synth, hotpotqa, 2wiki, musique)"
    )
