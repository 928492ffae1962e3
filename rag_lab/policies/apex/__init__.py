"""APEX-Searcher: the policy (:mod:`.policy`) and its planner RL (:mod:`.planner`)."""

from rag_lab.policies.apex.policy import APEX

__all__ = ["APEX"]
