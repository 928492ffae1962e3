"""Policies (``conf/policy/``): prompting baselines and the five methods."""

from rag_lab.policies.base import Policy

__all__ = ["Policy"]
