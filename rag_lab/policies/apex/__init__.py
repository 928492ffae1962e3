"""APEX-Searcher (arXiv:2603.13853; docs/methods/apex.md). ``policy=apex``, ``policy=apex_prompt``.

- :mod:`.pipeline`: the loop, plan → execute → synthesise, with any generator (``policy=apex_prompt``);
- :mod:`.policy`: :class:`~.policy.APEX`: the loop with its trained planner and executor;
- :mod:`.planner`: the planner's GRPO with SEPR (:mod:`rag_lab.rewards.sepr`);
- protocol: :mod:`rag_lab.env.protocols.apex`; the executor's SFT: the shared cold start.
"""
