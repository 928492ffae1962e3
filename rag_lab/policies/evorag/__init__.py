"""EVO-RAG (papers/evo-rag.txt): step rewards (``rag_lab.rewards.evorag``), a multi-head preference model
(``preference``), DPO on preferred branches."""
