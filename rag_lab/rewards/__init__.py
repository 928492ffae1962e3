"""Reward functions (``conf/reward/``), pure, with TRL's signature ``f(completions, **columns)``."""
