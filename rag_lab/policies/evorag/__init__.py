"""EVO-RAG (arXiv:2505.17391; docs/methods/evorag.md): step rewards (``rag_lab.rewards.evorag``), a multi-head
preference model (``preference``), DPO on preferred branches."""
