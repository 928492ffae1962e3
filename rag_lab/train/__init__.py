"""Training recipes that more than one method shares:

- the embedded tiny LM: its model and training loops (``tiny_lm``), its reading items (``tiny_reading``),
  the recipe on the world (``tiny_world``) and the shipped checkpoint (``ship``: ``make tiny-lm``);
- the cold start: rejection-sampled teacher demonstrations (``demonstrations``) and supervised
  fine-tuning on them (``cold_start``)."""
