"""Policies (``conf/policy/``): what acts in the environment. The prompting baselines (``prompting``,
``baselines``, ``agent``, ``teacher``) and the methods, one package each (``stoprag/``, ``dapo/``,
``apex/``, ``evorag/``, ``r3rag/``).

Adding a method ``m`` (the five are laid out this way):

- ``rag_lab/policies/m/`` holds the method: ``__init__.py`` (a docstring naming the paper and listing the
  package's modules; it imports nothing, so that no package pulls in another's trainer), ``policy.py``
  (the policy class: ``trains = True``, ``memory_plan`` (its GPU memory plan, :mod:`rag_lab.train.memory`),
  ``fit``, ``rollout``; its docstring names the paper's sections and every deviation), its loop
  (``pipeline.py``, or the shared engine agent ``policies/agent.py`` with its protocol) and its trainer
  (``trainer.py``: TRL where TRL has it, hand-written and said so where not).
- ``rag_lab/env/protocols/m.py``: its text protocol (prompt rendering and parsing; the world teacher
  learns to speak it in ``rag_lab/env/teacher/generator.py``).
- ``rag_lab/rewards/m.py``: its rewards, pure functions with TRL's signature and the paper's equation
  numbers; ``conf/reward/*.yaml`` one per reward (or a dict of named terms).
- ``conf/policy/m.yaml`` (the policy's settings; ``defaults: [override /reward@_global_.reward: ...]``
  selects its reward group) and ``conf/experiment/m_*.yaml`` (``# @package _global_`` deltas: the
  embedded default's run, the paper's setup, the ablations).
- Tests in ``tests/test_m*.py``: rewards against hand-computed values, two training steps on a toy model,
  a killed fit resuming to the same numbers.

What a method receives and keeps:

- The runner builds each thing once and hands it down by parameter name (:func:`rag_lab.core.config.build`):
  ``reward`` (the run's reward group, built), ``train_data`` (the dataset ``fit``'s questions come from:
  the run's ``train_data``, else its ``data``), ``run_config`` (the resolved config, for cache keys). They
  are constructor parameters, not config keys.
- ``fit(env, train, dev, out_dir, logger)`` trains from ``env.generator`` (the run's, shared: never
  trained in place or replaced), checkpoints under ``out_dir`` so that a killed run resumes, and keeps
  what it trained on the policy: a model as ``self.generator`` (evaluation then acts with it:
  :func:`rag_lab.eval.evaluate.acting_env`), anything else (a Q-network, a planner) as its own
  attribute. A model it must act with in part of its loop gets its own view of the env
  (``env.with_generator(model)``); the ``Env`` is frozen.
- Caches go through :mod:`rag_lab.core.cache` (``cache.path(cache_dir, "m", <content>, <config>, code=...)``),
  keyed by the resolved config, the inputs' content and the code; curves through
  :mod:`rag_lab.train.curves`; supervised starts through the cold start (:mod:`rag_lab.train.cold_start`).
"""

from rag_lab.policies import demonstrators  # registers the teacher's demonstration policies (rag_lab.train)
from rag_lab.policies.base import Policy

__all__ = ["Policy", "demonstrators"]
