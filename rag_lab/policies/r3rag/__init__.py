"""R3-RAG (papers/r3-rag.txt; METHODS.md §4): step-wise cold start, then PPO with GAE on process and outcome
rewards (``rag_lab.rewards.r3rag``). Modules: ``gae`` (advantages and returns of per-step samples), ``losses``
(eq. 7's clipped surrogate, eq. 9's KL to the initial model, the critic's loss)."""
