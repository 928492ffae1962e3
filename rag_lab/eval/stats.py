"""Uncertainty: 95% bootstrap confidence intervals (scipy), the Wilson score interval of a proportion (a
held-out curve's point: k right of n questions) and a paired bootstrap test over questions.

The paired test is hand-written (scipy has no paired bootstrap *test*): it follows Koehn (2004),
"Statistical Significance Tests for Machine Translation Evaluation": resample the shared
questions with replacement, recompute the mean difference, and report how often its sign flips.
Seeds are not extra questions: with runs over several seeds it is a cluster bootstrap, each draw a
question with all its seeds' pairs, the difference averaged over the seeds inside a question, then over
the questions (Davison & Hinkley 1997, sec. 3.8). Pooling the (seed, question) pairs as if independent
counts each question once per seed: a deterministic method's three seeds are three identical copies, and
the interval comes out too narrow (1.75x on APEX's plan − none EM). The seed-to-seed spread is reported
beside it: the difference within each seed, its mean and sd over seeds.
"""

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

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


def wilson_ci(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``successes`` / ``n`` (scipy's ``binomtest``): unlike the
    normal approximation it stays inside [0, 1] and is not empty at 0 or ``n`` successes.

    >>> [round(x, 4) for x in wilson_ci(32, 64)]
    [0.381, 0.619]
    >>> wilson_ci(0, 64)[0]
    0.0
    """
    ci = stats.binomtest(successes, n).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


@dataclass(frozen=True)
class PairedResult:
    # questions (the resampled unit) and (seed, question) pairs
    n: int
    mean_a: float
    mean_b: float
    delta: float  # mean(a) - mean(b): per question over its seeds, then over questions
    ci_low: float
    ci_high: float
    # Two-sided p-value: twice the smaller share of resamples whose delta is <= 0 or >= 0.
    p_value: float
    pairs: int = 0
    # mean(a) - mean(b) within each seed (over the questions it scored), in seed order; their sd
    seed_deltas: tuple[float, ...] = field(default=())
    seed_sd: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def paired_bootstrap(
    a: Sequence[float],
    b: Sequence[float],
    questions: Sequence[str] | None = None,
    seeds: Sequence[str] | None = None,
    n_resamples: int = 10_000,
    seed: int = 0,
    null: float = 0.0,
) -> PairedResult:
    """Paired bootstrap of mean(a) - mean(b) resampling questions: pair i is question ``questions[i]`` in
    seed ``seeds[i]`` (default: each pair its own question, one seed). Each draw takes whole questions
    with all their seeds' pairs (module docstring). ``p``: two-sided, against a difference of ``null``
    (0; a non-inferiority test's margin, e.g. -0.01 for "loses at most one point").

    >>> q, s = ["q1", "q1", "q2", "q2"], ["0", "1", "0", "1"]
    >>> r = paired_bootstrap([1, 1, 0, 0], [0, 0, 0, 0], questions=q, seeds=s)
    >>> r.n, r.pairs, r.delta, r.seed_deltas
    (2, 4, 0.5, (0.5, 0.5))
    """
    if len(a) != len(b) or not a:
        raise ValueError(
            f"paired bootstrap needs two equally long, non-empty score lists ({len(a)} vs {len(b)})"
        )
    questions = list(questions) if questions is not None else list(range(len(a)))
    seeds = list(seeds) if seeds is not None else ["0"] * len(a)
    if not len(questions) == len(seeds) == len(a):
        raise ValueError("paired bootstrap: one question and one seed per pair")
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    order = list(dict.fromkeys(questions))
    rows = {q: [] for q in order}
    for i, q in enumerate(questions):
        rows[q].append(i)
    per_a = np.array([a[rows[q]].mean() for q in order])
    per_b = np.array([b[rows[q]].mean() for q in order])
    diff = per_a - per_b
    _, low, high, p = cluster_bootstrap(diff, lambda means: means, n_resamples, seed, null)
    per_seed = []
    for s in dict.fromkeys(seeds):
        mine = [i for i, x in enumerate(seeds) if x == s]
        per_seed.append(float(a[mine].mean() - b[mine].mean()))
    spread = float(np.std(per_seed, ddof=1)) if len(per_seed) > 1 else None
    return PairedResult(
        len(diff),
        float(per_a.mean()),
        float(per_b.mean()),
        float(diff.mean()),
        float(low),
        float(high),
        p,
        len(a),
        tuple(per_seed),
        spread,
    )


def cluster_bootstrap(
    per_question: np.ndarray,
    statistic: Callable[[np.ndarray], np.ndarray],
    n_resamples: int = 10_000,
    seed: int = 0,
    null: float = 0.0,
) -> tuple[float, float, float, float]:
    """A statistic of means over questions, with its bootstrap over questions: ``per_question`` holds one
    row per question (each already its mean over its seeds; the axes after the first are the cells the
    statistic reads, e.g. levels × rows), and each draw takes whole rows, so all the cells and seeds of a
    question move together (module docstring). ``statistic`` maps means shaped (draws, *cells) to (draws,).
    Returns the statistic on the questions as they are, the 95% percentile CI of the draws, and the
    two-sided p against ``null``: twice the smaller share of draws <= or >= it (:func:`paired_bootstrap`
    is this with the statistic a mean difference).

    >>> cluster_bootstrap(np.array([[1.0, 0.0], [1.0, 0.0]]), lambda m: m[:, 0] - m[:, 1])
    (1.0, 1.0, 1.0, 0.0)
    """
    n = len(per_question)
    idx = np.random.default_rng(seed).integers(0, n, size=(n_resamples, n))
    # the draws' means in chunks of about 4M numbers (10k draws x 500 questions x 15 cells is 600 MB at once)
    chunks = max(1, n_resamples * per_question.size // 4_000_000)
    draws = np.concatenate(
        [statistic(per_question[part].mean(axis=1)) for part in np.array_split(idx, chunks)]
    )
    p = min(1.0, 2 * min(float(np.mean(draws <= null)), float(np.mean(draws >= null))))
    low, high = np.percentile(draws, [2.5, 97.5])
    return float(statistic(per_question.mean(axis=0)[None])[0]), float(low), float(high), p
