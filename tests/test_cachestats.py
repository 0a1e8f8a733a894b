"""kvasym.cachestats against closed forms: the statistics that compare real caches with the
synthetic families must mean what the tables say they mean."""

from __future__ import annotations

import numpy as np
import pytest

from kvasym.cachestats import TOP_CHANNELS, cache_statistics

RNG = np.random.default_rng(2026)


def test_isotropic_gaussian():
    """A light tail (Hill index far above any heavy family's); participation ratio of a sample
    covariance d / (1 + (d + 1) / n) in expectation (Marchenko-Pastur second moment); no mean;
    top channels d-th shares."""
    n, d = 20000, 32
    s = cache_statistics(RNG.standard_normal((n, d)))
    assert s["tail_index"] > 6.0
    assert s["participation_ratio"] == pytest.approx(d / (1 + (d + 1) / n), rel=0.01)
    assert s["mean_energy"] == pytest.approx(0.0, abs=5e-3)
    assert s["top_channel_energy"] == pytest.approx(TOP_CHANNELS / d, rel=0.05)


def test_hill_estimate_of_a_pareto_tail_is_its_index():
    """Pareto with index alpha: the Hill estimate is the threshold MLE, s.e. alpha / sqrt(k)."""
    from kvasym.cachestats import hill_order, hill_tail_index

    alpha, n = 2.5, 10**6
    estimate = hill_tail_index(RNG.pareto(alpha, n) + 1.0)
    assert estimate == pytest.approx(alpha, abs=4 * alpha / np.sqrt(hill_order(n)))
    # sign does not matter, and a batch is estimated row by row
    batch = np.stack([RNG.pareto(1.5, 40000) + 1, -(RNG.pareto(4.0, 40000) + 1)])
    low, high = hill_tail_index(batch)
    assert low == pytest.approx(1.5, rel=0.1) and high == pytest.approx(4.0, rel=0.1)


def test_hill_order_and_edge_cases():
    from kvasym.cachestats import hill_order, hill_tail_index
    from kvasym.errors import KvasymError

    assert [hill_order(n) for n in (3, 4, 100, 101, 131072)] == [2, 2, 10, 11, 363]
    assert hill_tail_index(np.zeros(100)) == 0.0  # no tail to measure
    assert hill_tail_index(np.ones(100)) == np.inf  # top values all equal
    with pytest.raises(KvasymError, match="at least 3"):
        hill_tail_index(np.ones(2))


@pytest.mark.parametrize("nu", [1.05, 3.0, 5.0])
def test_student_t_tail_index_is_nu_where_kurtosis_does_not_exist(nu):
    """Student-t with nu degrees of freedom has tail index nu (regular variation), also for
    nu <= 4 where the kurtosis of the previous table did not exist (the Hill estimate's
    second-order bias grows with nu: it is documented, and ranks light tails rather than equal
    their nu)."""
    s = cache_statistics(RNG.standard_t(nu, size=(200000, 8)))
    assert s["tail_index"] == pytest.approx(nu, rel=0.1)


def test_low_rank_participation_ratio_is_the_rank():
    basis = np.linalg.qr(RNG.standard_normal((64, 5)))[0]
    x = RNG.standard_normal((50000, 5)) @ basis.T
    assert cache_statistics(x)["participation_ratio"] == pytest.approx(5 / (1 + 6 / 50000), rel=0.02)
    # exactly rank 1: every row on one line
    line = np.outer(RNG.standard_normal(300), RNG.standard_normal(64))
    assert cache_statistics(line)["participation_ratio"] == pytest.approx(1.0, rel=1e-9)


def test_mean_energy_and_outlier_channels_closed_forms():
    """x = mu + N(0, I): mean share |mu|^2 / (|mu|^2 + d); one channel of scale s among d:
    its energy share s^2 / (s^2 + d - 1), plus TOP_CHANNELS - 1 ordinary ones."""
    d, n = 16, 100000
    mu = np.full(d, 2.0)
    s = cache_statistics(mu + RNG.standard_normal((n, d)))
    assert s["mean_energy"] == pytest.approx(mu @ mu / (mu @ mu + d), rel=0.01)
    scale = 20.0
    x = RNG.standard_normal((n, d))
    x[:, 3] *= scale
    expected = (scale**2 + (TOP_CHANNELS - 1)) / (scale**2 + d - 1)
    assert cache_statistics(x)["top_channel_energy"] == pytest.approx(expected, rel=0.01)


def test_scale_invariance_and_overflow_safety():
    x = RNG.standard_normal((500, 16))
    a, b = cache_statistics(x), cache_statistics(x * 1e200)
    for key in a:
        assert b[key] == pytest.approx(a[key], rel=1e-9), key
