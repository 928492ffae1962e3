"""The run machinery behind ``python -m rag_lab.run`` (rag_lab/run.py, the command, stays at the top).

``rundir`` (a run directory's files besides its records: config, metrics, tables, provenance; the run dir's
lock), ``sweeps`` (a method's setting in a sweep of rows; runs keyed by their config's hash and reused),
``stages`` (what the runner and each launched process share: build the run's environment and policy, fit,
evaluate), ``launched`` (one process of a run's training under ``launch``: ``accelerate launch -m
rag_lab.runner.launched``, which rebuilds the run through ``stages``). The run's loggers are
``rag_lab.loggers``.

Above the components (data ... train, policies), below the commands (docs/concepts/architecture.md). This
file imports nothing.
"""
