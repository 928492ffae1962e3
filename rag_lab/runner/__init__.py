"""The run machinery behind ``python -m rag_lab.run`` (rag_lab/run.py, the command, stays at the top).

``rundir`` (a run directory's files besides its records: config, metrics, tables, provenance; the run dir's
lock), ``sweeps`` (a method's setting in a sweep of rows; runs keyed by their config's hash and reused),
``launched`` (one process of a run's training under ``launch``: ``accelerate launch -m
rag_lab.runner.launched``; an entry point that rebuilds the run through ``rag_lab.run``, so
``tests/test_layers.py`` counts it with the commands). The run's loggers are ``rag_lab.loggers``.

Above the components (data ... policies / train), below the commands. This file imports nothing.
"""
