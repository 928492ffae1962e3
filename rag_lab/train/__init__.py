"""Training recipes that more than one method shares: the embedded tiny LM (``tiny_lm``, ``tiny_world``)
and the cold start (supervised fine-tuning on rejection-sampled teacher demonstrations)."""
