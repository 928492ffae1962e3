"""Reporting and statistics tables, read from run directories (they train nothing).

``compare`` (the all-methods table of a sweep, with paired tests against a reference row, and the Hydra
callback that writes it when the sweep ends: ``python -m rag_lab.reporting.compare``), ``plots`` (the Pareto
front of accuracy against retrieval count, curves side by side), ``docs`` (the README's config list,
generated from ``conf/``). The commands ``python -m rag_lab.report`` and ``python -m rag_lab.claims`` stay at
the top level.

Above the components, below the commands. This file imports nothing.
"""
