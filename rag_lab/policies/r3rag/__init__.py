"""R3-RAG (arXiv:2505.23794; docs/methods/r3rag.md): step-wise cold start, then PPO with GAE, a value head and
the KL to the initial model on process and outcome rewards (``reward=r3rag``: ``rag_lab.rewards.r3rag`` and
``rag_lab.rewards.r3rag_judges``). Modules: ``policy`` (``policy=r3rag``), ``trainer`` (the PPO loop, its
checkpoints and log), ``ppo`` (one iteration's math, data-parallel under accelerate), ``samples`` (episodes
to per-step samples), ``model`` (the actor and its value head), ``gae``, ``losses`` (eq. 7's clipped
surrogate, eq. 9's KL, the critic's loss)."""
