"""The world teacher: a rule-based SIMULATOR of a strong LLM on the embedded world (``data=synth``).

It speaks every protocol of the environment (``generator=teacher``: :mod:`.generator`), so it lives with
them: it reads a prompt back into a state with :func:`rag_lab.env.protocols.identify`, decides
(:mod:`.agent`: follow the question's gold decomposition, never its answers) and reads facts from the
passages in view (:mod:`.reader`). ``policy=teacher`` runs its agent loop as a policy.
"""
