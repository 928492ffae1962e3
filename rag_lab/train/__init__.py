"""Training recipes that more than one method shares:

- the embedded tiny LM (``tiny``, what ``generator=tiny`` builds): its tokenizer, model and training
  stages, reading items, the recipe on the world and the shipped checkpoint (``tiny.ship``:
  ``make tiny-lm``);
- the cold start: rejection-sampled teacher demonstrations (``demonstrations``) and supervised
  fine-tuning on them (``cold_start``); the SFT rows and TRL settings of both (``sft``)."""
