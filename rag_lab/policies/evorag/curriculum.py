"""EVO-RAG's two-stage curriculum (arXiv:2505.17391 sec. 3.4-3.5, 3.7's Algorithm 1): a stage runs cycles
(:func:`rag_lab.policies.evorag.trainer.run_cycle`) until dev EM stalls for ``patience`` cycles or
``max_cycles`` ran; its result is its best cycle by dev EM (ties: the earliest); Refinement starts from
Discovery's best (the checkpoint reload of sec. 3.5), and the preference model's heads carry over.

Each cycle is cached (``<root>/evorag/<key>``: the model it starts from, the stage, the cycle, the training
and dev questions, the corpus, the run's config but for the stopping settings, the code), so a longer
``max_cycles`` or a sweep over ``stages`` reuses what ran. Hand-written: no library has this schedule.
"""

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from rag_lab.core.records import read_records
from rag_lab.policies.evorag.trainer import run_cycle
from rag_lab.train.resume import load_model, load_torch, readable

log = logging.getLogger(__name__)


def stalled(history: list[float], patience: int = 2, min_delta: float = 0.0) -> bool:
    """Whether none of the last ``patience`` values beats the best before them by more than ``min_delta``
    (``history``: the stage's start, then each cycle's dev EM).

    >>> stalled([0.10, 0.12, 0.12, 0.11]), stalled([0.10, 0.12, 0.11, 0.13]), stalled([0.10, 0.09])
    (True, False, False)
    """
    if len(history) <= patience:
        return False
    before = max(history[:-patience])
    return all(v <= before + min_delta for v in history[-patience:])


def best(values: list[float]) -> int:
    """The index of the largest value, the earliest of ties.

    >>> best([0.1, 0.3, 0.3, 0.2])
    1
    """
    return max(range(len(values)), key=lambda i: (values[i], -i))


@dataclass
class StageResult:
    """The cycles a stage ran (their cache dirs and summaries) and the one it hands over."""

    cycles: list[Path] = field(default_factory=list)
    summaries: list[dict] = field(default_factory=list)

    @property
    def chosen(self) -> Path:
        return self.cycles[best([s["dev_em"] for s in self.summaries])]


def run_stage(
    policy, generator, env, stage: int, start: str, start_em: float, questions, dev, pm, root: Path
):
    """The cycles of ``stage`` from ``generator`` (whose weights' key is ``start``) and ``pm``; the
    :class:`StageResult`. ``pm`` ends holding the chosen cycle's heads."""
    result, previous, history = StageResult(), start, [start_em]
    for cycle in range(1, policy.max_cycles + 1):
        done = policy.cycle_dir(previous, stage, cycle, questions, dev, env, root)
        if (done / "cycle.json").exists():
            log.info("EVO-RAG stage %s cycle %s: reusing %s", stage, cycle, done)
        else:
            run_cycle(policy, generator, env, stage, cycle, questions, dev, pm, done)
        summary = json.loads((done / "cycle.json").read_text())
        result.cycles.append(done)
        result.summaries.append(summary)
        generator = generator.with_model(
            load_model(readable(done, f"EVO-RAG cycle {cycle}"), like=generator.model)
        )
        pm.heads.load_state_dict(load_torch(done / "pm.pt"))
        previous, history = done.name, [*history, summary["dev_em"]]
        if stalled(history, policy.patience, policy.min_delta):
            log.info("EVO-RAG stage %s: dev EM stalled for %d cycles: %s", stage, policy.patience, history)
            break
    pm.heads.load_state_dict(load_torch(result.chosen / "pm.pt"))
    return result


def curve_rows(
    results: list[tuple[int, StageResult]], start_em: float | None = None, dev_n: int | None = None
) -> list[dict]:
    """The training curve: the start's dev EM at step 0 (``start_em``: the held-out curve's first point),
    each cycle's DPO steps (numbered on across cycles and stages), and at each cycle's last step its summary
    (dev EM, preference accuracy, branch counts, rollout monitors). ``dev_n``: the dev questions each dev EM
    was measured on, given to every row that has one (``heldout/n``: the plot's 95% band)."""
    rows, offset = [], 0
    if start_em is not None and results:
        rows.append({"stage": str(results[0][0]), "step": 0, "dev_em": start_em})
    for stage, result in results:
        for done, summary in zip(result.cycles, result.summaries, strict=True):
            steps = [
                r | {"stage": str(stage), "step": offset + r["step"]}
                for r in read_records(done / "log.jsonl")
            ]
            offset += max(len(steps), 1)
            numbers = {k: v for k, v in summary.items() if isinstance(v, int | float) and k not in ("stage",)}
            end = {"stage": str(stage), "step": offset} | numbers
            rows += steps[:-1] + [steps[-1] | end] if steps else [end]
    if dev_n is not None:
        rows = [r | {"heldout/n": dev_n} if "dev_em" in r else r for r in rows]
    return rows
