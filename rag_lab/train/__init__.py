"""Training recipes that more than one method shares:

- the embedded tiny LM: its tokenizer (``tiny_tokenizer``), model and training stages (``tiny_lm``),
  reading items (``tiny_reading``), the recipe on the world (``tiny_world``) and the shipped
  checkpoint (``ship``: ``make tiny-lm``);
- the cold start: rejection-sampled teacher demonstrations (``demonstrations``) and supervised
  fine-tuning on them (``cold_start``); the SFT rows and TRL settings of both (``sft``)."""
