"""The base layer: what every other layer of rag_lab uses, and nothing above it.

``config`` (schemas from the constructors' signatures; compose, validate, build), ``ranges`` (a setting's
valid range or choices), ``errors`` (one-line errors for bad input), ``fastyaml`` (libyaml under OmegaConf),
``seeding``, ``cli`` (what the commands share: Hydra's compose from the command line), ``batches`` (the
trainers' global batches against the processes), ``records`` (atomic JSON / JSONL writes), ``cache`` (the one
cache key, and the import graph its code digest and ``tests/test_layers.py`` read), ``launch`` (the
``launch`` group: accelerate's configs, and ``local_gpu``, the device of this process, which generators,
retrievers and trainers ask for).

Nothing here imports from a layer above (``tests/test_layers.py``). This file imports nothing, so that
importing one module of the layer loads that module only.
"""
