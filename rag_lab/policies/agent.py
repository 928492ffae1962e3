"""``policy=agent``: an agentic protocol (``dapo``, ``evorag``, ``r3rag``: rag_lab/env/protocols) rolled out
by the batched engine (:func:`rag_lab.env.engine.run_agent`), untrained: each paper's prompting baseline, and
the loop that DAPO (and EVO-RAG, R3-RAG) train.
"""

from rag_lab.core.config import NonNegative, PositiveInt
from rag_lab.core.errors import RagLabError
from rag_lab.data.base import QAExample
from rag_lab.env import Env, Episode
from rag_lab.env.engine import run_agent
from rag_lab.env.protocols.base import PROTOCOLS
from rag_lab.policies.prompting import Prompting


class Agent(Prompting):
    """An agentic protocol rolled out by the engine (untrained prompting baseline)."""

    # a stopping rule asked before each turn (a trained method sets it: rag_lab/policies/stoprag/transfer.py)
    stopper = None

    def __init__(
        self,
        # the method whose prompt and step format the agent speaks: dapo | evorag | r3rag
        protocol: str = "dapo",
        # passages per search
        k: PositiveInt = 5,
        # steps per episode at most; an episode that uses them all ends (stop reason max_turns)
        max_turns: PositiveInt = 5,
        # drop passages an episode has already seen from later searches
        exclude_seen: bool = False,
        # the longest completion of one step, and its sampling temperature (0: greedy)
        max_new_tokens: PositiveInt = 128,
        temperature: NonNegative = 0.0,
    ):
        super().__init__(k, max_new_tokens, temperature)
        if protocol not in PROTOCOLS:
            raise RagLabError(
                f"policy.protocol: unknown protocol {protocol!r}; known: {', '.join(sorted(PROTOCOLS))}"
            )
        self.protocol = PROTOCOLS[protocol]()
        self.max_turns = max_turns
        self.exclude_seen = exclude_seen

    def rollout(self, env: Env, batch: list[QAExample]) -> list[Episode]:
        return run_agent(
            self.protocol,
            batch,
            env,
            self.sampling,
            self.k,
            self.max_turns,
            self.exclude_seen,
            stopper=self.stopper,
        )
