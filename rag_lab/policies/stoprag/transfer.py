"""Stop-RAG's stopping rule on another method's loop: ``policy.stopper`` of R3-RAG and APEX-Searcher.

The method trains as it does without one; then Stop-RAG trains as ``policy=stoprag`` would, on its own
iterative pipeline with the run's generator, and its τ is tuned there; a ``policy=stoprag`` run with the same
settings, generator, retriever and seed shares its offline data and its trained Q-network (both cached by
content), so the stopper costs nothing more than that row. Its
:class:`~rag_lab.policies.stoprag.policy.QStopper` is then asked before each further step of the method's
loop (R3-RAG's turns, APEX's sub-questions) with what its Q-network reads in Stop-RAG: the question and the
passages retrieved so far, which do not depend on the loop. Where it says stop, R3-RAG's next turn is its
answer (the completion starts with ``The final answer:``), and APEX goes to its synthesis; the episode's
stop reason is ``stopper``.

A transfer, not a result of either paper: the Q-network never saw these loops' states, and τ is the one
tuned on Stop-RAG's pipeline.
"""

from pathlib import Path

from rag_lab.data.base import QAExample
from rag_lab.env import Env
from rag_lab.policies.stoprag.policy import QStopper, StopRAG


def fit_stopper(
    stoprag: StopRAG | None,
    run_config: dict | None,
    env: Env,
    train: list[QAExample],
    dev: list[QAExample],
    out_dir: Path,
    logger=None,
) -> QStopper | None:
    """Train ``stoprag`` (None: no stopping rule) in ``out_dir/stopper`` with the method's run config (its
    offline data's cache key: the run's generator, retriever and seed) and return its stopping rule."""
    if stoprag is None:
        return None
    # the stoprag row's run config as far as Stop-RAG's caches read it: its own config as the policy's
    stoprag.run_config = (
        None
        if run_config is None
        else {**run_config, "policy": (run_config.get("policy") or {}).get("stopper")}
    )
    stoprag.fit(env, train, dev, Path(out_dir) / "stopper", logger)
    return QStopper(stoprag.qnet, stoprag.tau)
