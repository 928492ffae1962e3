"""Multi-stage-reward DAPO: the policy (:mod:`.policy`), its multi-turn rollouts with dynamic sampling
(:mod:`.rollout`) and its training curves (:mod:`.curves`)."""

from rag_lab.policies.dapo.policy import DAPO

__all__ = ["DAPO"]
