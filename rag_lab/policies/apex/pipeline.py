"""APEX-Searcher's two-stage inference (arXiv:2603.13853v3 sec. 2.4, algorithms 1 and 2) as a
prompting policy with any generator: ``policy=apex_prompt``. The trained planner (GRPO with the
set-equivalence plan reward) and the SFT executor build on this loop.

Plan: the generator decomposes the question into sub-questions (``apex_plan``); an unparsable
plan falls back to the question itself. Execute, for every question's j-th sub-question at once:
resolve ``#n`` from the knowledge base, then up to ``hops`` rounds of the executor step
(``apex_exec``: answer, or a new query whose retrieval drops every passage the question has
already seen; a search that finds nothing new gets one step to answer, as its algorithm 2 stops
when the retrieval adds nothing); no answer after ``hops`` retrievals → one more step that must answer, else
"unknown". Each (sub-question, sub-answer) joins the knowledge base. Synthesis: the final answer
and a confidence from the knowledge base (``apex_final``).
"""

from rag_lab.core.config import NonNegative, PositiveInt
from rag_lab.data.base import QAExample, resolve_references
from rag_lab.env import Env, Episode
from rag_lab.env.protocols.apex import APEXExecute, APEXFinal, APEXPlan
from rag_lab.env.protocols.base import ANSWER, PLAN, SEARCH, Action, State, Turn
from rag_lab.policies.prompting import Prompting


class APEXPipeline(Prompting):
    # a stopping rule asked before each further sub-question (rag_lab/policies/stoprag/transfer.py)
    stopper = None

    def __init__(
        self,
        # the planner splits the question into sub-questions first (false: the question is the only one)
        plan: bool = True,
        # the executor's rounds of search per sub-question, at most, before it must answer
        hops: PositiveInt = 3,
        # passages per search
        k: PositiveInt = 3,
        # the longest completion of one call, and its sampling temperature (0: greedy)
        max_new_tokens: PositiveInt = 64,
        temperature: NonNegative = 0.0,
    ):
        super().__init__(k, max_new_tokens, temperature)
        self.plan = plan
        self.hops = hops

    def rollout(self, env: Env, batch: list[QAExample]) -> list[Episode]:
        states, episodes = self.start(batch)
        plans = [[s.question] for s in states]
        if self.plan:
            for i, a in enumerate(self.ask(self.plan_env(env), APEXPlan(), states, episodes)):
                plans[i] = list(a.plan) if a.kind == PLAN else plans[i]
        seen: list[set[str]] = [set() for _ in batch]
        stopped: set[int] = set()
        for j in range(max(len(p) for p in plans)):
            live = [i for i, p in enumerate(plans) if j < len(p) and i not in stopped]
            stopped |= self.stops(env, live, states, episodes) if j else set()
            live = [i for i in live if i not in stopped]
            answers = self.execute(
                env,
                [states[i] for i in live],
                [episodes[i] for i in live],
                [plans[i][j] for i in live],
                [seen[i] for i in live],
                [batch[i] for i in live],
            )
            for i, answer in zip(live, answers, strict=True):
                states[i].notes.append((plans[i][j], answer))
        self.finish(episodes, self.ask(env, APEXFinal(), states, episodes))
        for i in stopped:
            episodes[i].stop_reason = "stopper"
        return episodes

    def stops(self, env: Env, live: list[int], states: list[State], episodes: list[Episode]) -> set[int]:
        """The questions of ``live`` the stopping rule ends before their next sub-question: asked with the
        question and the passages retrieved so far (what Stop-RAG's Q-network reads)."""
        if self.stopper is None or not live:
            return set()
        read = [
            State(
                states[i].question,
                turns=[Turn(Action(SEARCH), passages=[env.corpus.get(p) for p in episodes[i].retrieved_ids])],
            )
            for i in live
        ]
        return {
            i
            for i, stop in zip(
                live, self.stopper.should_stop(env, read, [episodes[i] for i in live]), strict=True
            )
            if stop
        }

    def plan_env(self, env: Env) -> Env:
        """Where the plans come from (the trained APEX policy plans with its own planner model)."""
        return env

    def execute(
        self,
        env: Env,
        states: list[State],
        episodes: list[Episode],
        subs: list[str],
        seen: list[set[str]],
        batch: list[QAExample],
    ) -> list[str]:
        """Answer one sub-question per state (batched; ``batch[i]``: state i's question): executor steps
        until each answers."""
        tasks = [
            State(s.question, focus=resolve_references(q, [a for _, a in s.notes]), notes=list(s.notes))
            for s, q in zip(states, subs, strict=True)
        ]
        answers = ["unknown"] * len(states)
        live, last = list(range(len(states))), set()  # last: nothing new came back, so answer now
        for hop in range(self.hops + 1):
            actions = self.ask(env, APEXExecute(), [tasks[i] for i in live], [episodes[i] for i in live])
            for i, a in zip(live, actions, strict=True):
                if a.kind == ANSWER:
                    answers[i] = a.answer or "unknown"
            searching = [
                (i, a.query) for i, a in zip(live, actions, strict=True) if a.kind == SEARCH and i not in last
            ]
            if hop == self.hops:
                searching = []
            for i, a in zip(live, actions, strict=True):  # a search that is not run is not counted (RC)
                if a.kind == SEARCH and (i, a.query) not in searching:
                    episodes[i].steps[-1].query = None
            if not searching:
                break
            live = [i for i, _ in searching]
            found = self.retrieve(
                env,
                [tasks[i] for i in live],
                [episodes[i] for i in live],
                [q for _, q in searching],
                [batch[i] for i in live],
                [seen[i] for i in live],
                asked=True,
            )
            last = {i for i, new in zip(live, found, strict=True) if not new}
        return answers
