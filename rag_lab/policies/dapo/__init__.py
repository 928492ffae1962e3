"""Multi-stage-reward DAPO (OpenReview XVtORJ0AXN; docs/methods/dapo.md). ``policy=dapo``.

- :mod:`.policy`: :class:`~.policy.DAPO`: the ``dapo`` agent (:mod:`rag_lab.policies.agent`), optionally
  cold-started, then trained stage by stage;
- :mod:`.trainer`: one stage of TRL's ``GRPOTrainer`` in DAPO's setting;
- :mod:`.rollout`: its multi-turn rollouts through the engine, with dynamic sampling;
- rewards: :mod:`rag_lab.rewards.dapo`; protocol: :mod:`rag_lab.env.protocols.tagged`.
"""
