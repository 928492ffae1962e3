"""Sampled groups: each question rolled out ``n`` times, and how many of its groups are mixed.

GRPO and DAPO learn from the spread of rewards inside a group of samples of one question: a group that is all
right or all wrong has zero advantage everywhere and gives no gradient (DAPO's dynamic sampling drops such
groups: Yu et al. 2025, arXiv:2503.14476; docs/methods/dapo.md#dynamic-sampling). ``eval.samples=n`` evaluates
every question ``n`` times (the copies, ``<id>#s<j>``, are rolled out side by side, so a sampling policy draws
``n`` different rollouts; ``policy.temperature`` decides how different) and adds to ``metrics.json``:

- ``mixed_groups``: the share of questions whose samples are neither all right nor all wrong (by EM);
- ``solved_groups``: the share with at least one right sample (pass@n).
"""

import dataclasses
from collections import defaultdict
from collections.abc import Sequence

from rag_lab.data.base import QAExample

MARK = "#s"


def repeat(examples: Sequence[QAExample], n: int) -> list[QAExample]:
    """Every example ``n`` times in a row, ids ``<id>#s0`` ... ``<id>#s<n-1>`` (n = 1: unchanged)."""
    if n == 1:
        return list(examples)
    return [dataclasses.replace(ex, id=f"{ex.id}{MARK}{j}") for ex in examples for j in range(n)]


def group_stats(records: Sequence[dict]) -> dict[str, float]:
    """``mixed_groups`` and ``solved_groups`` over the groups of sampled records (by their id)."""
    groups: dict[str, list[float]] = defaultdict(list)
    for record in records:
        groups[record["id"].rpartition(MARK)[0]].append(record["em"])
    if not groups:
        return {}
    mixed = sum(0 < sum(ems) < len(ems) for ems in groups.values())
    solved = sum(sum(ems) > 0 for ems in groups.values())
    return {"mixed_groups": mixed / len(groups), "solved_groups": solved / len(groups)}
