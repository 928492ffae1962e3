"""The evaluation loop: batched rollouts, scored per question, appended and flushed per batch,
resumable; then metrics computed from everything in ``records.jsonl``.

Metrics are always recomputed from the records file in the dataset's question order, so a run
that was killed and resumed ends with exactly the metrics of an uninterrupted run.
"""

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from tqdm.auto import tqdm

from rag_lab.core.records import RecordWriter, read_records
from rag_lab.data.base import Corpus, QAExample
from rag_lab.data.evidence import reachable
from rag_lab.env import Env, Episode
from rag_lab.env.protocols.base import BACKTRACK, REFUSE
from rag_lab.eval.judge import LLMJudge
from rag_lab.eval.metrics import ANSWER_METRICS, SCORERS, answer_recall, retrieval_pr
from rag_lab.eval.stats import bootstrap_ci

R = TypeVar("R")

# Per-question fields averaged into metrics.json, in table order.
METRIC_FIELDS = [
    "em",
    "f1",
    "acc",
    "retrieval_count",
    "n_steps",
    "backtracks",
    "refused",
    "tokens_total",
    "ret_precision",
    "ret_recall",
    "answer_recall",
    "judge_acc",
    "sepr",
    # the method's own training reward of the episode (rag_lab/policies: own_rewards), where it has one
    "own_reward",
]


class Acting(Protocol):
    """What evaluation needs of a policy (``rag_lab.policies.base.Policy``): its rollouts, and the
    generator it acts with when it trained its own (``generator``; None or absent: the env's)."""

    def rollout(self, env: Env, batch: list[QAExample]) -> list[Episode]: ...


def acting_env(policy: Acting, env: Env) -> Env:
    """The env ``policy`` acts in: the run's, with the policy's own generator when it has one."""
    own = getattr(policy, "generator", None)
    return env if own is None else env.with_generator(own)


def score_record(
    ex: QAExample, episode: Episode, scorer: str, corpus: Corpus, recall_at: Sequence[int] = ()
) -> dict[str, Any]:
    """One line of records.jsonl: the question, its gold, the episode and its scores."""
    record: dict[str, Any] = {
        "id": ex.id,
        "question": ex.question,
        "answers": list(ex.answers),
        "type": ex.type,
        "hops": ex.hops,
        "answerable": ex.answerable,
        "supporting_ids": list(ex.supporting_ids),
        # its gold evidence is in the index (corpus.coverage: rag_lab/data/evidence.py); None: no gold named
        "reachable": reachable(ex, corpus),
    }
    record |= episode.to_record()
    for name in ANSWER_METRICS:
        record[name] = SCORERS[scorer][name](episode.prediction, list(ex.answers))
    record["tokens_total"] = record["tokens"]["prompt"] + record["tokens"]["completion"]
    # EVO-RAG's extra actions: steps that undid a search, and a refusal to answer
    record["backtracks"] = sum(s["action"] == BACKTRACK for s in record["steps"])
    record["refused"] = float(episode.stop_reason == REFUSE)
    # APEX's plan reward, where the policy scored its plan against a gold one
    record["sepr"] = next((r["sepr"] for r in record["rewards"] if "sepr" in r), None)
    if any(s.text for s in episode.steps) and not record["tokens_total"]:
        # The generator wrote text but counts no tokens (the teacher, openai): unknown, not 0.
        record["tokens"] = record["tokens_total"] = None
    record["ret_precision"], record["ret_recall"] = retrieval_pr(
        record["retrieved_ids"], record["supporting_ids"]
    )
    ranked = list(dict.fromkeys(record["retrieved_ids"]))  # distinct, in retrieval order
    record["answer_recall"] = answer_recall([corpus.get(pid).contents for pid in ranked], list(ex.answers))
    gold = set(record["supporting_ids"])
    for k in recall_at:  # over the first k distinct passages retrieved; precision per k slots
        found = len(set(ranked[:k]) & gold)
        record[f"precision@{k}"] = found / k if gold else math.nan
        record[f"recall@{k}"] = found / len(gold) if gold else math.nan
    return record


class Ranks(Protocol):
    """The processes that share an evaluation (:mod:`rag_lab.train.parallel` under a launch: each plays its
    share of the batches); :class:`OneProcess` elsewhere."""

    def processes(self) -> int: ...

    def is_main(self) -> bool: ...

    def spread(self, n: int, work: Callable[[list[int]], Sequence[R]]) -> list[R]: ...

    def from_main(self, make: Callable[[], R]) -> R: ...


class OneProcess:
    """This process alone: it does every unit of work."""

    def processes(self) -> int:
        return 1

    def is_main(self) -> bool:
        return True

    def spread(self, n: int, work: Callable[[list[int]], Sequence[R]]) -> list[R]:
        return list(work(list(range(n))))

    def from_main(self, make: Callable[[], R]) -> R:
        return make()


def scored_batch(
    policy: Acting, env: Env, batch: list[QAExample], scorer: str, recall_at: Sequence[int]
) -> list[dict[str, Any]]:
    """One batch rolled out and scored: its records, in the batch's order."""
    episodes = policy.rollout(env, batch)
    if len(episodes) != len(batch):
        name = type(policy).__name__
        raise RuntimeError(f"{name}.rollout returned {len(episodes)} episodes for {len(batch)}")
    # the method's own training reward of each episode (Policy.own_rewards; None: a policy without one)
    own = policy.own_rewards(env, batch, episodes) if hasattr(policy, "own_rewards") else [None] * len(batch)
    pairs = zip(batch, episodes, own, strict=True)
    return [score_record(ex, ep, scorer, env.corpus, recall_at) | {"own_reward": r} for ex, ep, r in pairs]


def evaluate(
    policy: Acting,
    env: Env,
    examples: list[QAExample],
    records_path: Path,
    scorer: str,
    batch_size: int = 64,
    resume: bool = True,
    judge: LLMJudge | None = None,
    recall_at: Sequence[int] = (),
    ranks: Ranks | None = None,
) -> list[dict]:
    """Roll out every example not yet in ``records_path``; return all records in example order (under a
    launch, in the main process; the others return none).

    With a ``judge``, each record also gets ``judge_acc`` (LLM-as-judge, DAPO paper B.4). The policy
    acts in ``env`` with its own generator when it trained one (:func:`acting_env`). ``ranks``: the
    processes of a launched run, which share the batches left as the main process reads ``records_path``
    (each plays every N-th batch, N at a time; the main process judges and appends them in question order,
    so the file is the one one process writes); every process calls it, and only the main one needs a
    ``judge``.
    """
    env, ranks = acting_env(policy, env), ranks or OneProcess()
    if not resume and ranks.is_main():
        records_path.unlink(missing_ok=True)
    done = ranks.from_main(lambda: {r["id"] for r in read_records(records_path)})
    # Batches are fixed by question order, not formed from what is left: a resumed run rolls out
    # every batch with the same questions as an uninterrupted one (batched generation can depend on
    # the batch: padding, sampling streams), and writes only the records it lacks. The processes of a
    # launched run share them on the same footing: one batch's episodes do not depend on the others.
    batches = [examples[i : i + batch_size] for i in range(0, len(examples), batch_size)]
    todo = [batch for batch in batches if not all(ex.id in done for ex in batch)]
    writer, world = RecordWriter(records_path) if ranks.is_main() else None, ranks.processes()
    initial = sum(ex.id in done for ex in examples)

    def play(units: list[int], batches: list[list[QAExample]]) -> list[list[dict[str, Any]]]:
        return [scored_batch(policy, env, batches[u], scorer, recall_at) for u in units]

    with tqdm(total=len(examples), initial=initial, desc="evaluate", unit="q", disable=writer is None) as bar:
        for start in range(0, len(todo), world):
            round_ = todo[start : start + world]
            scored = ranks.spread(len(round_), lambda units, round_=round_: play(units, round_))
            for records in scored if writer is not None else []:
                records = [r for r in records if r["id"] not in done]
                if judge is not None:
                    verdicts = judge([r["prediction"] for r in records], [r["answers"] for r in records])
                    for record, verdict in zip(records, verdicts, strict=True):
                        record["judge_acc"] = verdict
                writer.write(records)
                bar.update(len(records))
    if writer is None:
        return []
    by_id = {r["id"]: r for r in read_records(records_path)}
    return [by_id[ex.id] for ex in examples]


def _at_k_order(field: str) -> tuple[int, str]:
    name, k = field.split("@")
    return int(k), name


def _mean(values: list[float]) -> float | None:
    kept = [v for v in values if v is not None and not math.isnan(v)]
    return sum(kept) / len(kept) if kept else None


def aggregate(records: list[dict]) -> dict[str, Any]:
    """Means (and 95% bootstrap CIs of EM / F1 / Acc) over all records and per question type."""

    def summary(rows: list[dict]) -> dict[str, Any]:
        out: dict[str, Any] = {"n": len(rows)}
        at_k = sorted(
            {f for r in rows for f in r if f.startswith(("recall@", "precision@"))}, key=_at_k_order
        )
        out |= {f: _mean([r.get(f) for r in rows]) for f in [*METRIC_FIELDS, *at_k]}
        out["format_failure_rate"] = _mean([float(r["format_failure"]) for r in rows])
        out["tokens_per_correct"] = tokens_per_correct(rows)
        if any(r.get("prompt_cuts") for r in rows):  # prompts cut to fit the model (rag_lab.env.fit)
            out["prompt_cut_rate"] = _mean([float(r.get("prompt_cuts", 0) > 0) for r in rows])
        out |= refusal_pr(rows)
        if any(r.get("reachable") is not None for r in rows):  # the share whose gold evidence is indexed
            out["reachable"] = _mean([float(r["reachable"]) for r in rows if r.get("reachable") is not None])
        out["ci95"] = {m: list(bootstrap_ci([r[m] for r in rows])) for m in ANSWER_METRICS} if rows else {}
        return out

    metrics = {"all": summary(records)}
    for kind in sorted({r["type"] for r in records if r["type"]}):
        metrics[f"type={kind}"] = summary([r for r in records if r["type"] == kind])
    if len({r.get("answerable", True) for r in records}) == 2:  # EVO-RAG's unanswerable questions apart
        for flag in (True, False):
            metrics[f"answerable={str(flag).lower()}"] = summary(
                [r for r in records if r.get("answerable", True) is flag]
            )
    # the questions whose gold evidence the index holds, and the others (corpus.coverage): searches and the
    # method's own reward on each
    flags = [r.get("reachable") for r in records]
    if True in flags and False in flags:
        for flag in (True, False):
            rows = [r for r in records if r.get("reachable") is flag]
            metrics[f"reachable={str(flag).lower()}"] = summary(rows)
    return metrics


def tokens_per_correct(rows: list[dict]) -> float | None:
    """R3-RAG's efficiency: every question's prompt + completion tokens over the questions right by Acc
    (None where no question is right or the generator counts no tokens).

    >>> tokens_per_correct([{"tokens_total": 300, "acc": 1.0}, {"tokens_total": 100, "acc": 0.0}])
    400.0
    """
    right = sum(r["acc"] for r in rows)
    if not right or any(r.get("tokens_total") is None for r in rows):
        return None
    return sum(r["tokens_total"] for r in rows) / right


def refusal_pr(rows: list[dict]) -> dict[str, float]:
    """EVO-RAG's refusals against the questions marked unanswerable: recall (the unanswerable ones refused)
    and precision (the refusals that were of unanswerable questions); each absent where undefined.

    >>> rows = [{"answerable": False, "refused": 1.0}, {"answerable": False, "refused": 0.0},
    ...         {"answerable": True, "refused": 1.0}, {"answerable": True, "refused": 1.0}]
    >>> refusal_pr(rows)
    {'refusal_recall': 0.5, 'refusal_precision': 0.3333333333333333}
    """
    out = {}
    unanswerable = [r for r in rows if r.get("answerable", True) is False]
    refused = [r for r in rows if r.get("refused")]
    if unanswerable:
        out["refusal_recall"] = sum(bool(r.get("refused")) for r in unanswerable) / len(unanswerable)
    if refused:
        out["refusal_precision"] = sum(r.get("answerable", True) is False for r in refused) / len(refused)
    return out
