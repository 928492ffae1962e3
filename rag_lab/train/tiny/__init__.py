"""The tiny LM (``generator=tiny``): the embedded default LM, a small Qwen2-style model with a word-level
tokenizer, trained from scratch on CPU on the embedded world and shipped trained
(``rag_lab/checkpoints/tiny_lm``). File by file:

- ``tokenizer``: the word-level tokenizer with an exact round trip (a name as its syllables);
- ``model``: the model's config (:class:`~.model.TinyConfig`) and its training loops: reading (answer-only
  loss on labelled positions) and TRL's SFT;
- ``trainer``: the stages run into a cached, atomically published model directory (and the protocol
  stage on a trained one), reused only for the same config and data;
- ``reading``: the reading items built from the world's pages and the teacher's demonstrations (layouts,
  typed renaming, length-grouped batches);
- ``recipe``: the recipe on the world (:func:`~.recipe.train`, its settings :class:`~.recipe.Recipe`);
- ``generator``: what ``generator=tiny`` builds (:func:`~.generator.tiny_lm`): the shipped checkpoint when
  its recipe and world fingerprints match the run's, else the recipe's model (cached);
- ``ship``: ``make tiny-lm``, retraining the shipped checkpoint and writing its card.

experiments/results/tiny_lm.md says how the recipe was found.
"""
