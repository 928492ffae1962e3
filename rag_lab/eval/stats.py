"""Uncertainty: 95% bootstrap confidence intervals (scipy) and a paired bootstrap test.

The paired test is hand-written (scipy has no paired bootstrap *test*): it follows Koehn (2004),
"Statistical Significance Tests for Machine Translation Evaluation": resample the shared
questions with replacement, recompute the mean difference, and report how often its sign flips.
"""

from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

N_RESAMPLES = 1000


def bootstrap_ci(values: list[float], confidence: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean (deterministic for a seed).

    >>> bootstrap_ci([1.0, 1.0, 1.0])
    (1.0, 1.0)
    """
    x = np.asarray(values, dtype=float)
    if len(x) < 2 or np.all(x == x[0]):
        mean = float(x.mean()) if len(x) else float("nan")
        return mean, mean
    res = stats.bootstrap(
        (x,),
        np.mean,
        n_resamples=N_RESAMPLES,
        confidence_level=confidence,
        method="percentile",
        vectorized=True,
        rng=np.random.default_rng(seed),
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


@dataclass(frozen=True)
class PairedResult:
    n: int
    mean_a: float
    mean_b: float
    delta: float  # mean(a) - mean(b)
    ci_low: float
    ci_high: float
    # Two-sided p-value: twice the smaller share of resamples whose delta is <= 0 or >= 0.
    p_value: float

    def to_dict(self) -> dict:
        return asdict(self)


def paired_bootstrap(
    a: list[float], b: list[float], n_resamples: int = 10_000, seed: int = 0
) -> PairedResult:
    """Paired bootstrap test of mean(a) - mean(b) over the same questions, in the same order."""
    if len(a) != len(b) or not a:
        raise ValueError(
            f"paired bootstrap needs two equally long, non-empty score lists ({len(a)} vs {len(b)})"
        )
    diff = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(diff), size=(n_resamples, len(diff)))
    deltas = diff[idx].mean(axis=1)
    p = min(1.0, 2 * min(float(np.mean(deltas <= 0)), float(np.mean(deltas >= 0))))
    low, high = np.percentile(deltas, [2.5, 97.5])
    return PairedResult(
        len(diff), float(np.mean(a)), float(np.mean(b)), float(diff.mean()), float(low), float(high), p
    )
