"""Reward functions (``conf/reward/``), pure, with TRL's signature ``f(completions, **columns)``; EVO-RAG's
(``evorag``) and R3-RAG's (``r3rag``) step rewards score the steps of finished trajectories instead."""
