"""The policies the world teacher's demonstrations are recorded behind (:mod:`rag_lab.train.demonstrators`,
filled when :mod:`rag_lab.policies` is imported): one per protocol family, and the gold-passage reader."""

from rag_lab.policies.agent import Agent
from rag_lab.policies.apex.pipeline import APEXPipeline
from rag_lab.policies.oracle import OracleRAG
from rag_lab.policies.prompting import ChainOfThought, Direct, StandardRAG
from rag_lab.policies.stoprag.pipeline import IterativePipeline, LLMStop
from rag_lab.train.demonstrators import Demonstrators, register


def demonstration_policies(k: int = 3, iterations: int = 6) -> list:
    """One policy per protocol family, with the embedded default's sizes."""
    return [
        IterativePipeline(LLMStop(), iterations=iterations),  # stoprag_decide + query/intermediate/final
        IterativePipeline(iterations=iterations),  # traces that run past the last needed fact
        Agent("dapo", k=k, max_turns=6),
        Agent("evorag", k=k, max_turns=10),
        Agent("r3rag", k=k, max_turns=6),
        APEXPipeline(k=k),
        StandardRAG(k=k),
        Direct(),
        ChainOfThought(retrieve=True, k=k),
    ]


def gold_chains() -> OracleRAG:
    """The world teacher's chain-of-thought over each question's gold passages (``policy=oracle_rag
    policy.reader=cot``)."""
    return OracleRAG(reader="cot")


register(Demonstrators(demonstration_policies, gold_chains))
