"""The run config's own sections (``eval:``, ``corpus:``): plain dataclasses, parts of
:class:`rag_lab.core.config.RunConfig`."""

from dataclasses import dataclass, field

from rag_lab.core.ranges import Range


@dataclass
class EvalConfig:
    # The split of the dataset to evaluate on.
    split: str = "test"
    # Questions per batch: one batched rollout, then one flushed append to records.jsonl.
    batch_size: int = field(default=64, metadata={"min": 1})
    # Evaluate only the first `limit` questions of the split (null: all).
    limit: int | None = field(default=None, metadata={"min": 1})
    # Skip question ids already in this run dir's records.jsonl (resume after a kill).
    resume: bool = True
    # A run whose config (and rag_lab's code) ran to the end before copies that run's results instead of
    # running again (rag_lab/runner/sweeps.py); false: run it.
    reuse: bool = True
    # Cut-offs for recall@k / precision@k of gold supports over the retrieved passages, in order.
    recall_at: list[int] = field(default_factory=list)
    # Rollouts per question (ids <id>#s<j>); above 1, metrics add the share of mixed groups
    # (rag_lab/eval/groups.py). A sampling policy (policy.temperature > 0) makes them differ.
    samples: int = field(default=1, metadata={"min": 1})


@dataclass
class CorpusConfig:
    # The share of gold pages kept in the index, (0, 1]: nested (the pages kept at 0.6 are among those kept
    # at 0.8), drawn by corpus.seed, not the run's seed (rag_lab/data/evidence.py; docs/how-to/evidence.md).
    coverage: float = field(default=1.0, metadata={"checks": (Range(0, 1, open_min=True),)})
    # Near-duplicates of every page of the world (data=synth): same entity, conflicting facts; 0: none.
    distractors: int = field(default=0, metadata={"min": 0})
    # The stream that picks the pages kept and the distractors' facts.
    seed: int = 0
