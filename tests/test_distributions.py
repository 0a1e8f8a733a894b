"""Seeded synthetic data: determinism, laws of each kind, the query rule, spec validation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from kvasym.distributions import (
    DISTRIBUTION_KINDS,
    DistributionSpec,
    TrialData,
    generate_trial,
    rescale_queries,
)
from kvasym.errors import KvasymError

SPECS = {
    "gauss": {"kind": "gaussian"},
    "heavy": {"kind": "student_t", "nu": 3.0},
    "lr": {"kind": "low_rank", "rank": 4},
    "lr_noisy": {"kind": "low_rank", "rank": 4, "noise": 0.1},
    "outliers": {"kind": "concentrated", "n_outliers": 4, "outlier_scale": 20.0},
}


def spec(name: str) -> DistributionSpec:
    return DistributionSpec.from_dict(SPECS[name], name=name)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_shapes_dtypes_and_determinism(name: str) -> None:
    a = generate_trial(spec(name), dim=32, seq_len=50, n_queries=7, base_seed=11, trial=3)
    b = generate_trial(spec(name), dim=32, seq_len=50, n_queries=7, base_seed=11, trial=3)
    c = generate_trial(spec(name), dim=32, seq_len=50, n_queries=7, base_seed=11, trial=4)
    d = generate_trial(spec(name), dim=32, seq_len=50, n_queries=7, base_seed=12, trial=3)
    assert isinstance(a, TrialData)
    assert a.keys.shape == (50, 32) and a.values.shape == (50, 32) and a.queries.shape == (7, 32)
    for arr in (a.keys, a.values, a.queries):
        assert arr.dtype == np.float64 and np.all(np.isfinite(arr))
    for field in ("keys", "values", "queries"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
        assert not np.array_equal(getattr(a, field), getattr(c, field))
        assert not np.array_equal(getattr(a, field), getattr(d, field))
    # Keys and values are distinct draws, not copies of one stream.
    assert not np.allclose(a.keys, a.values)


def test_identity_ignores_call_order_and_defaults() -> None:
    s = spec("lr")
    first = generate_trial(s, 16, 20, 3, base_seed=5, trial=1)
    generate_trial(spec("heavy"), 16, 20, 3, base_seed=5, trial=1)  # other work in between
    again = generate_trial(
        DistributionSpec("lr", "low_rank", {"rank": 4, "noise": 0}), 16, 20, 3, 5, 1
    )
    np.testing.assert_array_equal(first.keys, again.keys)
    np.testing.assert_array_equal(first.queries, again.queries)


def test_gaussian_moments() -> None:
    data = generate_trial(spec("gauss"), 64, 2000, 4, base_seed=0, trial=0)
    x = data.keys.ravel()
    assert abs(x.mean()) < 0.01 and abs(x.var() - 1.0) < 0.02
    assert stats.kstest(x[:20000], "norm").pvalue > 1e-3


@pytest.mark.parametrize("nu", [1.05, 1.5, 3.0])
def test_student_t_quantiles_match_scipy(nu: float) -> None:
    s = DistributionSpec.from_dict({"name": "t", "kind": "student_t", "nu": nu})
    data = generate_trial(s, 64, 1000, 4, base_seed=1, trial=0)
    x = data.keys.ravel()
    levels = np.array([0.05, 0.25, 0.5, 0.75, 0.95])
    empirical = np.quantile(x, levels)
    expected = stats.t.ppf(levels, df=nu)
    # Standard error of a sample quantile: sqrt(a(1-a)/n) / density at the quantile.
    se = np.sqrt(levels * (1 - levels) / x.size) / stats.t.pdf(expected, df=nu)
    assert np.all(np.abs(empirical - expected) < 5 * se)
    assert stats.kstest(x[:20000], "t", args=(nu,)).pvalue > 1e-3


def test_student_t_nu_105_is_finite() -> None:
    s = DistributionSpec.from_dict({"name": "t", "kind": "student_t", "nu": 1.05})
    for trial in range(3):
        data = generate_trial(s, 128, 4000, 64, base_seed=2, trial=trial)
        for arr in (data.keys, data.values, data.queries):
            assert np.all(np.isfinite(arr))
        # The heavy tail is really there: some coordinates are huge.
        assert np.max(np.abs(data.keys)) > 1e3
        scores = data.queries @ data.keys.T / math.sqrt(128)
        np.testing.assert_allclose(np.std(scores, axis=1), 1.0, rtol=1e-9)


def test_low_rank_rank_and_shared_subspace() -> None:
    dim, rank = 32, 4
    data = generate_trial(spec("lr"), dim, 100, 10, base_seed=3, trial=0)
    assert np.linalg.matrix_rank(data.keys) == rank
    assert np.linalg.matrix_rank(data.values) == rank
    # Queries live in the keys' subspace; values have their own subspace.
    assert np.linalg.matrix_rank(np.vstack([data.keys, data.queries])) == rank
    assert np.linalg.matrix_rank(np.vstack([data.keys, data.values])) == 2 * rank


def test_low_rank_scale_and_noise() -> None:
    dim = 64
    clean = generate_trial(DistributionSpec("lr", "low_rank", {"rank": 8}), dim, 4000, 2, 4, 0)
    noisy = generate_trial(
        DistributionSpec("lr", "low_rank", {"rank": 8, "noise": 0.5}), dim, 4000, 2, 4, 0
    )
    # Average coordinate variance 1 for the low-rank part, plus noise**2.
    assert abs(np.mean(clean.keys**2) - 1.0) < 0.05
    assert abs(np.mean(noisy.keys**2) - 1.25) < 0.06
    assert np.linalg.matrix_rank(noisy.keys) == dim


def test_concentrated_outliers_carry_energy_and_are_shared_with_queries() -> None:
    data = generate_trial(spec("outliers"), 128, 500, 200, base_seed=6, trial=0)
    energy = np.sum(data.keys**2, axis=0)
    top = np.sort(np.argsort(energy)[-4:])
    assert energy[top].sum() / energy.sum() > 0.5
    q_energy = np.sum(data.queries**2, axis=0)
    np.testing.assert_array_equal(np.sort(np.argsort(q_energy)[-4:]), top)
    # Non-outlier channels are N(0, 1).
    rest = np.delete(data.keys, top, axis=1)
    assert abs(rest.var() - 1.0) < 0.03


@pytest.mark.parametrize("name", sorted(SPECS))
def test_query_rule_unit_score_std(name: str) -> None:
    data = generate_trial(spec(name), 48, 300, 16, base_seed=7, trial=2)
    scores = data.queries @ data.keys.T / math.sqrt(48)
    np.testing.assert_allclose(np.std(scores, axis=1, ddof=0), 1.0, rtol=1e-10)


def test_query_rule_degenerate_keys() -> None:
    q = np.array([[3.0, 4.0], [0.0, 0.0]])
    out = rescale_queries(q, np.zeros((5, 2)))
    assert np.all(np.isfinite(out))
    assert np.linalg.norm(out[0]) == pytest.approx(math.sqrt(2))
    np.testing.assert_array_equal(out[1], 0.0)
    # One key: the std over keys is 0 as well.
    out = rescale_queries(q[:1], np.array([[1.0, 2.0]]))
    assert np.linalg.norm(out[0]) == pytest.approx(math.sqrt(2))


@pytest.mark.parametrize(
    ("entry", "needle"),
    [
        ({"name": "heavy", "kind": "student_t", "nu": 1.0}, "distributions[heavy].nu"),
        ({"name": "heavy", "kind": "student_t", "nu": "2"}, "distributions[heavy].nu"),
        ({"name": "heavy", "kind": "student_t", "nu": float("nan")}, "distributions[heavy].nu"),
        ({"name": "heavy", "kind": "student_t"}, "distributions[heavy].nu"),
        ({"name": "heavy", "kind": "student_t", "nu": 2, "mu": 0}, "distributions[heavy].mu"),
        ({"name": "heavy", "kind": "cauchy"}, "distributions[heavy].kind"),
        ({"name": "heavy"}, "distributions[heavy].kind"),
        ({"name": "lr", "kind": "low_rank", "rank": 0}, "distributions[lr].rank"),
        ({"name": "lr", "kind": "low_rank", "rank": 2.5}, "distributions[lr].rank"),
        ({"name": "lr", "kind": "low_rank", "rank": True}, "distributions[lr].rank"),
        ({"name": "lr", "kind": "low_rank", "rank": 2, "noise": -1}, "distributions[lr].noise"),
        ({"name": "c", "kind": "concentrated", "n_outliers": 2}, "distributions[c].outlier_scale"),
        (
            {"name": "c", "kind": "concentrated", "n_outliers": 2, "outlier_scale": 0},
            "distributions[c].outlier_scale",
        ),
        ({"name": "g", "kind": "gaussian", "params": {"nu": 2}}, "distributions[g].nu"),
        ({"name": "g", "kind": "gaussian", "params": {}, "rank": 2}, "distributions[g].rank"),
        ({"name": "bad name", "kind": "gaussian"}, "name"),
        ({"kind": "gaussian"}, "name"),
    ],
)
def test_invalid_specs_name_the_key(entry: dict, needle: str) -> None:
    with pytest.raises(KvasymError) as info:
        DistributionSpec.from_dict(entry)
    assert needle in str(info.value)


def test_spec_forms_are_equivalent_and_hashable() -> None:
    flat = DistributionSpec.from_dict({"name": "lr", "kind": "low_rank", "rank": 3})
    nested = DistributionSpec.from_dict({"kind": "low_rank", "params": {"rank": 3.0}}, name="lr")
    assert flat == nested and hash(flat) == hash(nested)
    assert dict(flat.params) == {"rank": 3, "noise": 0.0}
    assert DistributionSpec.from_dict(flat.to_dict()) == flat
    assert set(DISTRIBUTION_KINDS) == {"gaussian", "student_t", "low_rank", "concentrated"}
    with pytest.raises(TypeError):
        flat.params["rank"] = 5  # type: ignore[index]
    with pytest.raises(KvasymError, match="contradicts"):
        DistributionSpec.from_dict({"name": "a", "kind": "gaussian"}, name="b")


def test_generation_time_checks_name_dim() -> None:
    with pytest.raises(KvasymError, match=r"distributions\[lr\]\.rank = 40 exceeds dim = 32"):
        generate_trial(DistributionSpec("lr", "low_rank", {"rank": 40}), 32, 10, 2, 0, 0)
    with pytest.raises(KvasymError, match=r"n_outliers = 40 exceeds dim = 32"):
        generate_trial(
            DistributionSpec("c", "concentrated", {"n_outliers": 40, "outlier_scale": 2}),
            32,
            10,
            2,
            0,
            0,
        )
    for bad in ({"dim": 0}, {"seq_len": -1}, {"n_queries": 1.5}, {"trial": -1}):
        kwargs = {"dim": 8, "seq_len": 4, "n_queries": 2, "base_seed": 0, "trial": 0} | bad
        with pytest.raises(KvasymError, match=next(iter(bad))):
            generate_trial(spec("gauss"), **kwargs)
