"""Reward functions (``conf/reward/``), pure, with TRL's signature ``f(completions, **columns)``; EVO-RAG's
step rewards (``evorag``) score the steps of finished episodes instead."""
