"""The world teacher (a rule-based SIMULATOR of a strong LLM on the embedded world; issue 5)."""
