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
