"""Stop-RAG (arXiv:2510.14337; docs/methods/stoprag.md): value-based stopping for iterative RAG, trained
offline with Q(λ). ``policy=stoprag``.

- :mod:`.pipeline`: the loop, Stop-RAG's iterative pipeline with a pluggable stopping rule
  (``policy=fixed_iter``, ``policy=llm_stop``);
- :mod:`.policy`: :class:`~.policy.StopRAG` (offline data → Q-network → τ) and its stopper;
- :mod:`.offline` (the offline dataset), :mod:`.qnet` (the Q-network), :mod:`.targets` (Q(λ) targets),
  :mod:`.trainer` (the Q-network's training loop), :mod:`.tau` (τ tuned on dev).
"""
