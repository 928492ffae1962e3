import numpy as np
import pytest

from rag_lab.eval.stats import bootstrap_ci, paired_bootstrap


def test_ci_brackets_the_mean_and_is_deterministic():
    values = [0.0, 1.0] * 50
    low, high = bootstrap_ci(values)
    assert low < 0.5 < high
    # Normal approximation: mean ± 1.96·sd/√n = 0.5 ± 0.098; the percentile bootstrap is close.
    assert low == pytest.approx(0.5 - 1.96 * 0.5 / np.sqrt(100), abs=0.03)
    assert bootstrap_ci(values) == (low, high)


def test_paired_bootstrap_detects_a_consistent_gain_and_not_noise():
    rng = np.random.default_rng(0)
    base = rng.random(300)
    better = paired_bootstrap(list(base + 0.1), list(base))
    assert better.delta == pytest.approx(0.1) and better.p_value == 0.0 and better.ci_low > 0
    flips = rng.choice([-0.1, 0.1], size=300)
    same = paired_bootstrap(list(base + flips), list(base))
    assert same.p_value > 0.05 and same.ci_low < 0 < same.ci_high


def test_paired_bootstrap_rejects_unpaired_input():
    with pytest.raises(ValueError, match="equally long"):
        paired_bootstrap([1.0], [1.0, 0.0])


def test_the_bootstrap_resamples_questions_with_all_their_seeds():
    """Two questions, three seeds of a deterministic method: question 1 always gains 1, question 2 never.
    By hand, resampling the 2 questions (each with its 3 seeds): the mean gain is 1 with chance 1/4 (q1
    drawn twice), 0 with chance 1/4 and 0.5 with chance 1/2, so p = 2 x 1/4 = 0.5 and the 95% interval is
    [0, 1]. Pooling the 6 (seed, question) pairs as independent, the gain is k/6 with k ~ Binomial(6, 1/2):
    it is 0 only when all six draws are question 2's, p = 2 / 64, and the interval is [1/6, 5/6]
    (P(k = 0) = 1/64 < 2.5% < P(k <= 1) = 7/64): too narrow, and significant where it is not."""
    a, b = [1.0, 1.0, 1.0, 0.0, 0.0, 0.0], [0.0] * 6
    questions, seeds = ["q1"] * 3 + ["q2"] * 3, ["0", "1", "2"] * 2
    clustered = paired_bootstrap(a, b, questions=questions, seeds=seeds)
    assert (clustered.n, clustered.pairs, clustered.delta) == (2, 6, 0.5)
    assert clustered.p_value == pytest.approx(0.5, abs=0.03)
    assert (clustered.ci_low, clustered.ci_high) == (0.0, 1.0)
    assert clustered.seed_deltas == (0.5, 0.5, 0.5) and clustered.seed_sd == 0.0
    pooled = paired_bootstrap(a, b)  # each pair its own question: what the seed tables used to do
    assert pooled.n == 6 and pooled.p_value == pytest.approx(2 / 64, abs=0.01)
    assert (pooled.ci_low, pooled.ci_high) == (pytest.approx(1 / 6), pytest.approx(5 / 6))


def test_the_seed_spread_is_each_seeds_own_difference():
    # seed 0: a gains 1 on both questions; seed 1: nothing. Per question the mean gain is 0.5.
    r = paired_bootstrap(
        [1.0, 1.0, 0.0, 0.0], [0.0] * 4, questions=["q1", "q2"] * 2, seeds=["0", "0", "1", "1"]
    )
    assert r.delta == 0.5 and r.seed_deltas == (1.0, 0.0)
    assert r.seed_sd == pytest.approx(2**-0.5)


def test_the_bootstrap_is_exactly_its_definition():
    """Every number of the result, against the definition written out here: questions drawn with
    replacement (numpy's default_rng(seed).integers, 10,000 draws), the 2.5th and 97.5th percentiles,
    twice the smaller tail for p, the means per question first."""
    rng = np.random.default_rng(7)
    a, b = list(rng.random(12)), list(rng.random(12))
    questions, seeds = [f"q{i % 6}" for i in range(12)], ["0"] * 6 + ["1"] * 6
    r = paired_bootstrap(a, b, questions=questions, seeds=seeds)
    per_q = np.array([np.mean([a[i] - b[i] for i in (q, q + 6)]) for q in range(6)])
    draws = np.random.default_rng(0).integers(0, 6, size=(10_000, 6))
    deltas = per_q[draws].mean(axis=1)
    low, high = np.percentile(deltas, [2.5, 97.5])
    p = min(1.0, 2 * min(float(np.mean(deltas <= 0)), float(np.mean(deltas >= 0))))
    assert (r.ci_low, r.ci_high, r.p_value) == (pytest.approx(low), pytest.approx(high), p)
    assert (r.n, r.pairs, r.delta) == (6, 12, pytest.approx(per_q.mean()))
    assert (r.mean_a, r.mean_b) == (pytest.approx(np.mean(a)), pytest.approx(np.mean(b)))
    per_seed = (np.mean(a[:6]) - np.mean(b[:6]), np.mean(a[6:]) - np.mean(b[6:]))
    assert r.seed_deltas == pytest.approx(per_seed) and r.seed_sd == pytest.approx(np.std(per_seed, ddof=1))
    assert r == paired_bootstrap(a, b, questions=questions, seeds=seeds, n_resamples=10_000, seed=0)
    assert r != paired_bootstrap(a, b, questions=questions, seeds=seeds, seed=1)


def test_the_bootstrap_edge_cases():
    same = paired_bootstrap([0.5, 0.5, 1.0], [0.5, 0.5, 1.0])  # no difference anywhere: p is 1, not 2
    assert (same.delta, same.p_value, same.ci_low, same.ci_high) == (0.0, 1.0, 0.0, 0.0)
    assert same.seed_deltas == (0.0,) and same.seed_sd is None  # one seed: no spread
    ints = paired_bootstrap([1, 0], [0, 0])  # whole numbers are scores too
    assert ints.delta == 0.5 and isinstance(ints.mean_a, float)
    with pytest.raises(ValueError, match=r"^paired bootstrap: one question and one seed per pair$"):
        paired_bootstrap([1.0, 0.0], [0.0, 0.0], questions=["q1"])
    with pytest.raises(ValueError, match=r"two equally long, non-empty score lists \(0 vs 0\)"):
        paired_bootstrap([], [])


def ci_by_definition(x: np.ndarray, confidence: float, seed: int) -> np.ndarray:
    """The percentile bootstrap written out: 1,000 draws of len(x) values with replacement
    (default_rng(seed).integers), the mean of each, the central ``confidence`` interval of those means."""
    means = x[np.random.default_rng(seed).integers(0, len(x), size=(1000, len(x)))].mean(axis=1)
    tail = 100 * (1 - confidence) / 2
    return np.percentile(means, [tail, 100 - tail])


def test_the_ci_is_exactly_its_definition():
    x = np.array([0.1 * i**1.5 for i in range(15)])
    for confidence, seed in [(0.95, 0), (0.5, 0), (0.95, 3)]:
        assert bootstrap_ci(list(x), confidence, seed) == pytest.approx(
            tuple(ci_by_definition(x, confidence, seed))
        )
    assert bootstrap_ci(list(x)) == bootstrap_ci(list(x), 0.95, 0) != bootstrap_ci(list(x), 0.95, 1)
    # two different values are already a sample to resample; a constant, one value or none is its own interval
    assert bootstrap_ci([0.0, 1.0]) == pytest.approx(tuple(ci_by_definition(np.array([0.0, 1.0]), 0.95, 0)))
    assert bootstrap_ci([0.25, 0.25, 0.25]) == (0.25, 0.25) and bootstrap_ci([0.7]) == (0.7, 0.7)
    assert all(np.isnan(v) for v in bootstrap_ci([]))
