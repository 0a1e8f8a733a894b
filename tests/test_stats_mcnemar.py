"""McNemar's exact test and the Clopper-Pearson interval (kvasym.stats), against scipy, a
published worked example, brute-force enumeration and the intervals' defining tail equations."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import scipy.stats

from kvasym.errors import KvasymError
from kvasym.stats import clopper_pearson, mcnemar_exact


def _pairs(b: int, c: int, both: int, neither: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Paired outcomes with b (1, 0), c (0, 1), both (1, 1) and neither (0, 0) units, shuffled."""
    base = np.array([1] * b + [0] * c + [1] * both + [0] * neither)
    other = np.array([0] * b + [1] * c + [1] * both + [0] * neither)
    order = np.random.default_rng(seed).permutation(base.size)
    return base[order], other[order]


@pytest.mark.parametrize("b, c", [(0, 1), (1, 7), (7, 1), (3, 3), (5, 12), (20, 4), (0, 9), (40, 61)])
def test_mcnemar_equals_scipy_binomtest_on_the_discordant_pairs(b, c):
    base, other = _pairs(b, c, both=6, neither=2, seed=b * 100 + c)
    out = mcnemar_exact(base, other)
    # the exact conditional test is the two-sided binomial test of b successes in b + c at 1/2
    # (the binomial at 1/2 is symmetric, so scipy's "as likely or less" rule gives 2 * the smaller tail)
    expected = scipy.stats.binomtest(b, b + c, 0.5, alternative="two-sided").pvalue
    assert out["b"] == b and out["c"] == c and out["n"] == b + c + 8
    assert out["p"] == pytest.approx(expected, rel=1e-12)
    assert out["log10_p"] == pytest.approx(math.log10(expected), abs=1e-12)
    assert out["accuracy_diff"] == pytest.approx(np.mean(other) - np.mean(base), abs=1e-15)
    assert out["accuracy_diff"] == pytest.approx((c - b) / out["n"], abs=1e-15)


def test_mcnemar_published_example_fagerland_2013():
    # Fagerland, Lydersen & Laake (2013), BMC Med Res Methodol 13:91, Table 1: airway
    # hyper-responsiveness before/after stem cell transplantation in 21 children (Bentur et al.
    # 2009): 1 AHR/AHR, 1 AHR/no AHR, 7 no AHR/AHR, 12 no AHR/no AHR. Published exact
    # conditional p = 0.070 (= 2 * 9 / 256 = 0.0703125 exactly).
    base, other = _pairs(b=1, c=7, both=1, neither=12)
    out = mcnemar_exact(base, other)
    assert (out["n"], out["b"], out["c"]) == (21, 1, 7)
    assert round(out["p"], 3) == 0.070
    assert out["p"] == pytest.approx(18 / 256, rel=1e-14)


def test_mcnemar_p_by_brute_force_enumeration_of_the_discordant_signs():
    # under the null each discordant pair is (1, 0) or (0, 1) with probability 1/2, independently:
    # p = share of the 2^(b+c) sign patterns whose min(b', c') is at most the observed min(b, c),
    # which equals 2 P(Binom <= min) when b != c and 1 when b == c
    for b, c in [(0, 3), (1, 4), (2, 2), (2, 7), (6, 3)]:
        m = b + c
        at_least_as_extreme = sum(min(sum(s), m - sum(s)) <= min(b, c) for s in itertools.product((0, 1), repeat=m))
        assert mcnemar_exact(*_pairs(b, c, 0, 0))["p"] == pytest.approx(at_least_as_extreme / 2**m, rel=1e-12)


def test_mcnemar_no_discordant_pairs_gives_p_one():
    out = mcnemar_exact([1, 1, 0, 0, 1], [1, 1, 0, 0, 1])
    assert (out["b"], out["c"], out["p"], out["log10_p"], out["accuracy_diff"]) == (0, 0, 1.0, 0.0, 0.0)
    assert mcnemar_exact([True, False], np.array([1.0, 0.0]))["p"] == 1.0  # bool and float 0/1 accepted


def test_mcnemar_far_tail_log10_p_is_finite_and_exact():
    # b = 3000, c = 0: p = 2 * 2^-3000, far below the smallest float64
    out = mcnemar_exact(np.ones(3000), np.zeros(3000))
    assert out["p"] == 0.0
    assert out["log10_p"] == pytest.approx(math.log10(2) - 3000 * math.log10(2), abs=1e-9)
    # b = 1000, c = 10: against the log-space sum of exact binomial coefficients (integers)
    out = mcnemar_exact(*_pairs(1000, 10, 0, 0))
    tail = sum(math.comb(1010, i) for i in range(11))
    assert out["log10_p"] == pytest.approx(math.log10(2 * tail) - 1010 * math.log10(2), abs=1e-9)


@pytest.mark.parametrize("args, name", [
    (([1, 0, 1], [1, 0]), "baseline_correct and other_correct"),
    (([1, 2, 0], [1, 0, 0]), "baseline_correct"),
    (([1, 0, 0], [1, 0.5, 0]), "other_correct"),
    (([], []), "baseline_correct"),
    (([[1, 0]], [[1, 0]]), "baseline_correct"),
    ((["a", "b"], [1, 0]), "baseline_correct"),
])
def test_mcnemar_refusals_name_the_argument(args, name):
    with pytest.raises(KvasymError, match=name):
        mcnemar_exact(*args)


@pytest.mark.parametrize("k, n", [(0, 1), (0, 10), (3, 10), (10, 10), (15, 15), (7, 30), (29, 30), (1, 200)])
@pytest.mark.parametrize("level", [0.95, 0.9])
def test_clopper_pearson_equals_scipy_and_solves_its_tail_equations(k, n, level):
    low, high = clopper_pearson(k, n, level)
    ref = scipy.stats.binomtest(k, n).proportion_ci(confidence_level=level, method="exact")
    assert (low, high) == pytest.approx((ref.low, ref.high), abs=1e-12)
    alpha = 1 - level
    # the defining equations: P(X >= k | low) = alpha / 2 and P(X <= k | high) = alpha / 2
    if k > 0:
        assert scipy.stats.binom.sf(k - 1, n, low) == pytest.approx(alpha / 2, rel=1e-8)
    else:
        assert low == 0.0
    if k < n:
        assert scipy.stats.binom.cdf(k, n, high) == pytest.approx(alpha / 2, rel=1e-8)
    else:
        assert high == 1.0


def test_clopper_pearson_textbook_values():
    # 0 of n: the upper end solves (1 - p)^n = alpha / 2, i.e. 1 - 0.025^(1/n) (0.3085 at n = 10)
    assert clopper_pearson(0, 10)[1] == pytest.approx(1 - 0.025 ** 0.1, rel=1e-12)
    # n of n: the lower end solves p^n = alpha / 2
    assert clopper_pearson(15, 15)[0] == pytest.approx(0.025 ** (1 / 15), rel=1e-12)


@pytest.mark.parametrize("args, name", [((-1, 5), "k"), ((6, 5), "k must be <= n"), ((0, 0), "n"),
                                        ((1, 5, 1.5), "level"), ((1.5, 5), "k")])
def test_clopper_pearson_refusals_name_the_argument(args, name):
    with pytest.raises(KvasymError, match=name):
        clopper_pearson(*args)
