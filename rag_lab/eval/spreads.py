"""Issue 74's statistic: does corpus coverage move a metric more than the choice among methods?

SearchAgentReview (arXiv 2605.27881) found that fixing a corpus's missing gold documents moved EM by more
than the gap between the algorithms it compared. The embedded world sets coverage, so rag_lab can test it
on one LM and one world: with ``m(c)`` the mean over the methods of the metric at coverage ``c``,

- the coverage spread ``S_cov = max_c m(c) − min_c m(c)`` over the coverage levels;
- the method spread ``S_meth = max_m A(m, c_full) − min_m A(m, c_full)`` over the methods at full coverage;
- the claim is on ``S_cov − S_meth``: coverage moves the metric more when it is above 0.

Its 95% CI and p come from the bootstrap over questions (:func:`rag_lab.eval.stats.cluster_bootstrap`): all
the runs answer the same questions, so each draw takes a question with every (level, method) cell and every
seed of it together, and both spreads are recomputed from the draw. Resampling each cell on its own would
drop the pairing that makes two cells' difference precise (a hard question is hard in every cell) and widen
the interval. Beside it, each seed's own ``S_cov`` and ``S_meth`` (the seed spread).

The bias of a max − min: a range of noisy means is larger, on average, than the range of their true values
(for k equal means each with standard error se, about 1.69·se for k = 3 and 2.33·se for k = 5). The
bootstrap does not remove it: its draws carry the same noise again, so the CI is centred on the biased
estimate. Here the two spreads are biased unequally: ``S_meth`` is a range of 5 single-method means,
``S_cov`` a range of 3 means that each average 5 methods (their noise shrinks by up to √5). With no true
effect at all, ``S_cov − S_meth`` therefore sits below 0: the statistic leans against the claim, so a
"holds" is conservative, and a "reversed" with small spreads can be the noise of five methods and not a
real method effect; read it beside the spreads and the seed values.

Hand-written: the statistic is ours (no library has it); the bootstrap is :mod:`rag_lab.eval.stats`'.
"""

from dataclasses import dataclass

import numpy as np

from rag_lab.eval.stats import cluster_bootstrap


@dataclass(frozen=True)
class SpreadResult:
    s_cov: float  # the coverage spread over all questions and seeds
    s_meth: float  # the method spread at full coverage
    delta: float  # s_cov − s_meth
    ci_low: float
    ci_high: float
    # two-sided p of the bootstrap against 0 (:func:`rag_lab.eval.stats.cluster_bootstrap`)
    p_value: float
    n: int  # questions (the resampled unit)
    # (S_cov, S_meth) within each seed, in the seeds' order
    seed_spreads: tuple[tuple[float, float], ...] = ()


def spreads(means: np.ndarray, full: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``S_cov`` and ``S_meth`` of means shaped (..., levels, methods); ``full``: the level at full
    coverage (module docstring).

    >>> s_cov, s_meth = spreads(np.array([[0.6, 0.5, 0.7], [0.4, 0.4, 0.4]]))
    >>> round(float(s_cov), 4), round(float(s_meth), 4)
    (0.2, 0.2)
    """
    by_level = means.mean(axis=-1)
    at_full = means[..., full, :]
    return by_level.max(axis=-1) - by_level.min(axis=-1), at_full.max(axis=-1) - at_full.min(axis=-1)


def spread_test(scores: np.ndarray, full: int = 0, n_resamples: int = 10_000, seed: int = 0) -> SpreadResult:
    """``S_cov − S_meth`` of ``scores`` shaped (questions, seeds, levels, methods), every cell scored, with
    its bootstrap over questions (each draw a question with all its cells and seeds) and each seed's own
    spreads.

    >>> scores = np.zeros((4, 1, 2, 2))
    >>> scores[:, :, 0, :] = 1.0  # full coverage answers every question, the lower level none
    >>> r = spread_test(scores)
    >>> r.s_cov, r.s_meth, r.delta, (r.ci_low, r.ci_high), r.seed_spreads
    (1.0, 0.0, 1.0, (1.0, 1.0), ((1.0, 0.0),))
    """
    per_question = scores.mean(axis=1)  # each question over its seeds, then the questions are the unit
    s_cov, s_meth = spreads(per_question.mean(axis=0), full)
    delta, low, high, p = cluster_bootstrap(
        per_question, lambda means: np.subtract(*spreads(means, full)), n_resamples, seed
    )
    per_seed = tuple(
        (float(c), float(m))
        for c, m in (spreads(scores[:, i].mean(axis=0), full) for i in range(scores.shape[1]))
    )
    return SpreadResult(float(s_cov), float(s_meth), delta, low, high, p, scores.shape[0], per_seed)
