"""Error coordinates, KL, routing recall and per-trial metrics against independent references."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy.special import softmax
from scipy.stats import entropy

from kvasym.errors import KvasymError
from kvasym.metrics import (
    CATASTROPHIC_TV,
    EFF_BITS_CAP,
    SNR_DB_CAP,
    catastrophic,
    distribution_distances,
    error_coordinates,
    kl_divergence,
    matrix_coordinates,
    topk_recall,
    trial_metrics,
)

# ---------------------------------------------------------------- error coordinates


def test_scaled_estimate_has_zero_angle_and_formula_snr() -> None:
    x = np.array([[1.0, -2.0, 3.0, 0.5]])
    for c in (0.5, 0.9, 1.3, 3.0):
        out = error_coordinates(x, c * x)
        snr = 1.0 / (1.0 - c) ** 2  # ||x||^2 / ||(1 - c) x||^2
        assert out["phi"][0] == pytest.approx(0.0, abs=1e-15)
        assert out["eps_dir"][0] == pytest.approx(0.0, abs=1e-15)
        assert out["snr"][0] == pytest.approx(snr, rel=1e-12)
        assert out["snr_db"][0] == pytest.approx(10 * math.log10(snr), rel=1e-12)
        assert out["eff_bits"][0] == pytest.approx(0.5 * math.log2(snr), rel=1e-12)


def test_orthogonal_estimate() -> None:
    out = error_coordinates(np.array([1.0, 0.0]), np.array([0.0, 2.0]))
    assert out["phi"] == pytest.approx(math.pi / 2, rel=1e-15)
    assert out["eps_dir"] == pytest.approx(1.0, rel=1e-15)
    assert out["snr"] == pytest.approx(1.0 / 5.0, rel=1e-14)  # ||(1, -2)||^2 = 5
    assert out["snr_db"] == pytest.approx(10 * math.log10(0.2), rel=1e-14)


@pytest.mark.parametrize("theta", [1e-9, 1e-4, 0.3, 1.0, 2.5, math.pi - 1e-6])
def test_known_rotation_angle(theta: float) -> None:
    x = np.array([[2.0, 0.0]])
    x_hat = 2.0 * np.array([[math.cos(theta), math.sin(theta)]])
    out = error_coordinates(x, x_hat)
    assert out["phi"][0] == pytest.approx(theta, rel=1e-9)
    # eps_dir = 1 - cos(theta) evaluated without cancellation.
    assert out["eps_dir"][0] == pytest.approx(2 * math.sin(theta / 2) ** 2, rel=1e-9)
    # Same-norm rotation: ||x - x_hat||^2 = 2 ||x||^2 (1 - cos theta).
    assert out["snr"][0] == pytest.approx(1.0 / (4 * math.sin(theta / 2) ** 2), rel=1e-8)


def test_snr_cap_convention() -> None:
    x = np.array([[1.0, 2.0], [0.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    x_hat = np.array([[1.0, 2.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    out = error_coordinates(x, x_hat)
    for key in out:
        assert np.all(np.isfinite(out[key])), key
    np.testing.assert_array_equal(out["eff_bits"][:3], [EFF_BITS_CAP, EFF_BITS_CAP, -EFF_BITS_CAP])
    assert EFF_BITS_CAP == 52.0
    assert SNR_DB_CAP == pytest.approx(10 * math.log10(2.0**104))
    np.testing.assert_allclose(out["snr_db"][:3], [SNR_DB_CAP, SNR_DB_CAP, -SNR_DB_CAP])
    # Angles: exact -> 0, both zero -> 0, one zero -> pi/2.
    np.testing.assert_allclose(out["phi"], [0.0, 0.0, math.pi / 2, math.pi / 2], atol=1e-15)
    # x_hat = 0: the error is x itself, SNR = 1 (0 dB), not a special case.
    assert out["snr_db"][3] == pytest.approx(0.0, abs=1e-12)
    # Rounding-level error sits at the cap too.
    y = np.array([[1.0, 1.0]])
    assert error_coordinates(y, y * (1 + 2.0**-60))["eff_bits"][0] == EFF_BITS_CAP


def test_heavy_tailed_magnitudes_do_not_overflow() -> None:
    x = np.array([[1e200, 1e200]])
    out = error_coordinates(x, x * 1.5)
    assert out["snr"][0] == pytest.approx(4.0, rel=1e-12)
    assert out["phi"][0] == pytest.approx(0.0, abs=1e-15)


def test_non_finite_inputs_raise() -> None:
    with pytest.raises(KvasymError, match="x_hat"):
        error_coordinates(np.ones((1, 3)), np.array([[1.0, np.nan, 1.0]]))
    with pytest.raises(KvasymError, match="shape"):
        error_coordinates(np.ones((1, 3)), np.ones((1, 4)))


# Zero or |v| >= 1e-100: scaling by 2**-30 then stays exact (no subnormal underflow).
finite = st.one_of(
    st.just(0.0),
    st.floats(min_value=1e-100, max_value=1e3),
    st.floats(min_value=-1e3, max_value=-1e-100),
)


@settings(max_examples=100, deadline=None)
@given(
    x=arrays(np.float64, (3, 5), elements=finite),
    noise=arrays(np.float64, (3, 5), elements=finite),
    exponent=st.integers(min_value=-30, max_value=30),
    perm=st.permutations(range(5)),
)
def test_invariances_and_ranges(
    x: np.ndarray, noise: np.ndarray, exponent: int, perm: list[int]
) -> None:
    # A power-of-two scale is exact in float64, so the invariance must hold even when the
    # error is at rounding level (any other scale perturbs such an error by rounding).
    scale = 2.0**exponent
    x_hat = x + 0.1 * noise
    base = error_coordinates(x, x_hat)
    scaled = error_coordinates(scale * x, scale * x_hat)
    permuted = error_coordinates(x[:, perm], x_hat[:, perm])
    for other in (scaled, permuted):
        np.testing.assert_allclose(other["snr_db"], base["snr_db"], rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(other["phi"], base["phi"], rtol=1e-9, atol=1e-9)
    assert np.all((base["phi"] >= 0) & (base["phi"] <= math.pi))
    assert np.all((base["eps_dir"] >= 0) & (base["eps_dir"] <= 2))
    assert np.all(np.abs(base["eff_bits"]) <= EFF_BITS_CAP)
    # Against the textbook formulas where they are well conditioned.
    nx, nh, ne = (np.linalg.norm(a, axis=1) for a in (x, x_hat, x - x_hat))
    ok = (nx > 1e-3) & (nh > 1e-3) & (ne > 1e-6 * nx)
    cos = np.sum(x * x_hat, axis=1)[ok] / (nx[ok] * nh[ok])
    np.testing.assert_allclose(base["eps_dir"][ok], 1 - cos, atol=1e-9)
    np.testing.assert_allclose(base["snr"][ok], nx[ok] ** 2 / ne[ok] ** 2, rtol=1e-9)


def test_matrix_coordinates_pooling() -> None:
    gen = np.random.default_rng(0)
    x = gen.standard_normal((6, 4)) * np.arange(1, 7)[:, None]
    x_hat = x + 0.2 * gen.standard_normal((6, 4))
    agg = matrix_coordinates(x, x_hat)
    snr = np.sum(x**2) / np.sum((x - x_hat) ** 2)
    assert agg["snr_db"] == pytest.approx(10 * np.log10(snr), rel=1e-12)
    assert agg["eff_bits"] == pytest.approx(0.5 * np.log2(snr), rel=1e-12)
    cos = np.sum(x * x_hat, axis=1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(x_hat, axis=1))
    assert agg["phi"] == pytest.approx(np.mean(np.arccos(cos)), rel=1e-10)
    assert agg["eps_dir"] == pytest.approx(np.mean(1 - cos), rel=1e-10)


# ---------------------------------------------------------------- KL


def test_kl_matches_scipy_entropy() -> None:
    gen = np.random.default_rng(1)
    p = gen.dirichlet(np.ones(30), size=8)
    q = gen.dirichlet(np.ones(30), size=8)
    kl = kl_divergence(np.log(p), np.log(q))
    expected = [entropy(p[i], q[i]) for i in range(8)]
    np.testing.assert_allclose(kl, expected, rtol=1e-12)
    assert np.all(kl > 0)


def test_kl_zero_for_identical_and_zero_mass_conventions() -> None:
    gen = np.random.default_rng(2)
    lp = np.log(gen.dirichlet(np.ones(10), size=4))
    np.testing.assert_array_equal(kl_divergence(lp, lp), 0.0)
    # 0 log 0 = 0: a zero-probability entry in p contributes nothing whatever q says there.
    p = np.array([[0.5, 0.5, 0.0]])
    q = np.array([[0.25, 0.25, 0.5]])
    with np.errstate(divide="ignore"):
        assert kl_divergence(np.log(p), np.log(q))[0] == pytest.approx(
            entropy(p[0], q[0]), rel=1e-14
        )
        assert kl_divergence(np.log(q), np.log(p))[0] == math.inf


def test_kl_mask_ignores_entries() -> None:
    gen = np.random.default_rng(3)
    logits_p, logits_q = gen.standard_normal((2, 3, 6))
    mask = np.array([[True] * 6, [True] * 3 + [False] * 3, [True, False] * 3])
    lp = np.where(mask, logits_p, -np.inf)
    lq = np.where(mask, logits_q, -np.inf)
    from kvasym.attention import log_softmax

    kl = kl_divergence(log_softmax(lp), log_softmax(lq), mask)
    for i in range(3):
        allowed = mask[i]
        p, q = softmax(logits_p[i][allowed]), softmax(logits_q[i][allowed])
        assert kl[i] == pytest.approx(entropy(p, q), rel=1e-12)


@settings(max_examples=100, deadline=None)
@given(
    logits=arrays(np.float64, (2, 12), elements=st.floats(-20, 20)),
    delta=arrays(np.float64, (2, 12), elements=st.floats(-1e-6, 1e-6)),
)
def test_kl_is_never_negative(logits: np.ndarray, delta: np.ndarray) -> None:
    from kvasym.attention import log_softmax

    kl = kl_divergence(log_softmax(logits), log_softmax(logits + delta))
    assert np.all(kl >= 0)


# ---------------------------------------------------------------- routing recall


def brute_topk(p: np.ndarray, k: int) -> set[int]:
    """The unique k-subset dominating its complement (larger value, or equal value and lower index)."""
    n = len(p)
    found = [
        set(s)
        for s in itertools.combinations(range(n), k)
        if all(p[j] > p[m] or (p[j] == p[m] and j < m) for j in s for m in set(range(n)) - set(s))
    ]
    assert len(found) == 1
    return found[0]


def test_recall_against_brute_force_with_ties() -> None:
    gen = np.random.default_rng(4)
    # Few distinct values force ties, which must be broken by index.
    p = gen.integers(0, 4, size=(40, 8)).astype(float)
    p_hat = gen.integers(0, 4, size=(40, 8)).astype(float)
    for k in (1, 3, 5, 8, 12):
        got = topk_recall(p, p_hat, k=k)
        kk = min(k, 8)
        expected = [len(brute_topk(p[i], kk) & brute_topk(p_hat[i], kk)) / kk for i in range(40)]
        np.testing.assert_allclose(got, expected)
        assert np.all((got >= 0) & (got <= 1))
    np.testing.assert_array_equal(topk_recall(p, p, 5), 1.0)
    # Disjoint supports: top-2 {0,1} vs {2,3}.
    assert topk_recall(np.array([[4.0, 3, 1, 0]]), np.array([[0.0, 1, 3, 4]]), k=2)[0] == 0.0


def test_recall_with_mask() -> None:
    p = np.array([[0.7, 0.3, 0.0, 0.0], [0.1, 0.2, 0.3, 0.4]])
    p_hat = np.array([[0.3, 0.7, 0.0, 0.0], [0.4, 0.3, 0.2, 0.1]])
    mask = np.array([[True, True, False, False], [True] * 4])
    got = topk_recall(p, p_hat, k=3, mask=mask)
    # Row 0 has 2 allowed keys: k becomes 2 and both sets are {0, 1}.
    # Row 1: top3 {3, 2, 1} vs {0, 1, 2} share {1, 2}.
    np.testing.assert_allclose(got, [1.0, 2 / 3])


def test_recall_with_rows_of_different_k_against_brute_force() -> None:
    """A causal-like mask gives rows different k (min(k, allowed keys)): each distinct k is its
    own np.partition call, and every row must still match the brute-force top set with ties."""
    gen = np.random.default_rng(11)
    p = gen.integers(0, 3, size=(30, 9)).astype(float)
    p_hat = gen.integers(0, 3, size=(30, 9)).astype(float)
    allowed = gen.integers(1, 10, size=30)
    mask = np.arange(9)[None, :] < allowed[:, None]
    got = topk_recall(p, p_hat, k=4, mask=mask)
    expected = []
    for i in range(30):
        n, kk = int(allowed[i]), min(4, int(allowed[i]))
        expected.append(len(brute_topk(p[i, :n], kk) & brute_topk(p_hat[i, :n], kk)) / kk)
    np.testing.assert_allclose(got, expected)


def test_recall_rejects_bad_k() -> None:
    with pytest.raises(KvasymError, match="k must"):
        topk_recall(np.ones((1, 3)), np.ones((1, 3)), k=0)


# ---------------------------------------------------------------- trial metrics


def make_trial(seed: int = 5, n_q: int = 6, n_k: int = 40, d: int = 16):
    gen = np.random.default_rng(seed)
    q = gen.standard_normal((n_q, d))
    k = gen.standard_normal((n_k, d))
    v = gen.standard_normal((n_k, d))
    return gen, q, k, v


PER_QUERY = {"query", "kl", "recall_top5", "tv", "js", "top1", "catastrophic"} | {
    f"{s}_{m}" for s in "kvt" for m in ("snr_db", "eff_bits", "phi", "eps_dir")
}
PER_KEY = {
    "key",
    "n_queries",
    "logit_err_mean",
    "logit_err_var",
    "weight_ref_mean",
    "weight_hat_mean",
    "log_weight_excess",
    "k_eps_dir",
    "k_snr_db",
    "key_norm",
}


def test_trial_metrics_identity_reconstruction() -> None:
    _, q, k, v = make_trial()
    per_query, per_key = trial_metrics(q, k, v, k.copy(), v.copy(), sharpness=3.0)
    assert set(per_query) == PER_QUERY and set(per_key) == PER_KEY
    assert all(len(c) == 6 for c in per_query.values()) and all(
        len(c) == 40 for c in per_key.values()
    )
    np.testing.assert_array_equal(per_query["kl"], 0.0)
    np.testing.assert_array_equal(per_query["recall_top5"], 1.0)
    for site in "kvt":
        np.testing.assert_array_equal(per_query[f"{site}_eff_bits"], EFF_BITS_CAP)
        np.testing.assert_allclose(per_query[f"{site}_phi"], 0.0, atol=1e-7)
    np.testing.assert_array_equal(per_key["logit_err_mean"], 0.0)
    np.testing.assert_array_equal(per_key["log_weight_excess"], 0.0)


def test_trial_metrics_against_direct_computation() -> None:
    gen, q, k, v = make_trial()
    s, d = 2.5, q.shape[1]
    delta = 0.05 * gen.standard_normal(k.shape)
    k_hat = k + delta
    v_hat = v + 0.1 * gen.standard_normal(v.shape)
    per_query, per_key = trial_metrics(q, k, v, k_hat, v_hat, sharpness=s)

    p = softmax(s * q @ k.T / math.sqrt(d), axis=1)
    p_hat = softmax(s * q @ k_hat.T / math.sqrt(d), axis=1)
    np.testing.assert_allclose(
        per_query["kl"], [entropy(p[i], p_hat[i]) for i in range(6)], rtol=1e-9
    )
    t, t_hat = p @ v, p_hat @ v_hat
    t_snr = np.sum(t**2, axis=1) / np.sum((t - t_hat) ** 2, axis=1)
    np.testing.assert_allclose(per_query["t_snr_db"], 10 * np.log10(t_snr), rtol=1e-9)
    v_snr = np.sum(v**2) / np.sum((v - v_hat) ** 2)
    np.testing.assert_allclose(per_query["v_eff_bits"], 0.5 * np.log2(v_snr), rtol=1e-12)
    k_cos = np.sum(k * k_hat, axis=1) / (np.linalg.norm(k, axis=1) * np.linalg.norm(k_hat, axis=1))
    np.testing.assert_allclose(per_query["k_eps_dir"], np.mean(1 - k_cos), rtol=1e-9)
    np.testing.assert_allclose(per_key["k_eps_dir"], 1 - k_cos, rtol=1e-8)
    np.testing.assert_allclose(per_key["key_norm"], [math.hypot(*row) for row in k], rtol=1e-14)

    # Injected logit perturbation: e_ij = s * q_i . delta_j / sqrt(d).
    e = s * q @ delta.T / math.sqrt(d)
    np.testing.assert_allclose(per_key["logit_err_mean"], e.mean(axis=0), rtol=1e-9, atol=1e-14)
    np.testing.assert_allclose(per_key["logit_err_var"], e.var(axis=0), rtol=1e-9)
    np.testing.assert_allclose(per_key["weight_ref_mean"], p.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(per_key["weight_hat_mean"], p_hat.mean(axis=0), rtol=1e-12)
    excess = np.mean(np.log(p_hat) - np.log(p), axis=0)
    np.testing.assert_allclose(per_key["log_weight_excess"], excess, rtol=1e-8, atol=1e-13)
    np.testing.assert_array_equal(per_key["n_queries"], 6)


def test_log_weight_excess_first_order_theory() -> None:
    """For tiny errors, log p_hat - log p ~= e - E_p[e] (second-order remainder)."""
    gen, q, k, v = make_trial(seed=6)
    s, d = 3.0, q.shape[1]
    delta = 1e-5 * gen.standard_normal(k.shape)
    _, per_key = trial_metrics(q, k, v, k + delta, v, sharpness=s)
    e = s * q @ delta.T / math.sqrt(d)
    p = softmax(s * q @ k.T / math.sqrt(d), axis=1)
    first_order = np.mean(e - np.sum(p * e, axis=1, keepdims=True), axis=0)
    np.testing.assert_allclose(per_key["log_weight_excess"], first_order, rtol=1e-3, atol=1e-10)


def test_trial_metrics_with_causal_mask() -> None:
    gen, q, k, v = make_trial(n_q=5, n_k=7)
    mask = np.zeros((5, 7), dtype=bool)
    for i in range(5):
        mask[i, : i + 2] = True  # query i sees keys 0..i+1; key 6 is seen by nobody
    k_hat = k + 0.05 * gen.standard_normal(k.shape)
    per_query, per_key = trial_metrics(q, k, v, k_hat, v, sharpness=2.0, mask=mask)
    np.testing.assert_array_equal(per_key["n_queries"], mask.sum(axis=0))
    assert np.isnan(per_key["logit_err_mean"][6]) and np.isnan(per_key["weight_ref_mean"][6])
    e = 2.0 * q @ (k_hat - k).T / 4.0
    for j in range(6):
        rows = mask[:, j]
        assert per_key["logit_err_mean"][j] == pytest.approx(e[rows, j].mean(), rel=1e-9)
        assert per_key["logit_err_var"][j] == pytest.approx(e[rows, j].var(), rel=1e-9, abs=1e-15)
    for i in range(5):
        allowed = mask[i]
        p = softmax(2.0 * q[i] @ k[allowed].T / 4.0)
        p_hat = softmax(2.0 * q[i] @ k_hat[allowed].T / 4.0)
        assert per_query["kl"][i] == pytest.approx(entropy(p, p_hat), rel=1e-9)
    assert np.all(np.isfinite(per_query["kl"]))


def test_trial_metrics_shape_errors() -> None:
    _, q, k, v = make_trial()
    with pytest.raises(KvasymError, match="keys"):
        trial_metrics(q, k, v, k[:-1], v, 1.0)
    with pytest.raises(KvasymError, match="values"):
        trial_metrics(q, k, v, k, v[:, :-1], 1.0)


# ------------------------------------------------- bounded measures: TV, JS, top-1 (issue 14.7)


def _log(p: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(p)


def test_tv_js_top1_against_scipy_and_brute_force() -> None:
    """TV = 1/2 sum |p - q| (brute force), JS = scipy's jensenshannon squared (scipy returns the
    distance, the square root of the divergence, natural log by default), top-1 by argmax."""
    from scipy.spatial.distance import jensenshannon

    gen = np.random.default_rng(11)
    logits = 3.0 * gen.standard_normal((50, 17))
    p = softmax(logits, axis=1)
    q = softmax(logits + gen.standard_normal((50, 17)) * gen.uniform(0, 3, (50, 1)), axis=1)
    out = distribution_distances(_log(p), _log(q))
    np.testing.assert_allclose(out["tv"], 0.5 * np.abs(p - q).sum(axis=1), rtol=1e-12)
    js_scipy = np.array([jensenshannon(p[i], q[i]) ** 2 for i in range(50)])
    np.testing.assert_allclose(out["js"], js_scipy, rtol=1e-9, atol=1e-15)
    np.testing.assert_array_equal(out["top1"], (p.argmax(axis=1) == q.argmax(axis=1)).astype(float))
    assert 0.0 < out["top1"].mean() < 1.0  # both outcomes are exercised


def test_tv_js_bounds_and_identities() -> None:
    """Disjoint supports: TV = 1, JS = ln 2; identical: 0; always TV^2/2 <= JS <= ln 2 TV."""
    p = np.array([[0.5, 0.5, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    q = np.array([[0.0, 0.0, 0.25, 0.75], [0.0, 0.0, 0.0, 1.0]])
    out = distribution_distances(_log(p), _log(q))
    np.testing.assert_allclose(out["tv"], 1.0, rtol=1e-15)
    np.testing.assert_allclose(out["js"], math.log(2.0), rtol=1e-15)
    np.testing.assert_array_equal(out["top1"], 0.0)
    same = distribution_distances(_log(p), _log(p))
    np.testing.assert_array_equal(same["tv"], 0.0)
    np.testing.assert_array_equal(same["js"], 0.0)
    np.testing.assert_array_equal(same["top1"], 1.0)
    gen = np.random.default_rng(5)
    a = softmax(gen.standard_normal((400, 9)) * 4, axis=1)
    b = softmax(gen.standard_normal((400, 9)) * 4, axis=1)
    r = distribution_distances(_log(a), _log(b))
    assert np.all(r["tv"] ** 2 / 2 <= r["js"] * (1 + 1e-12))
    assert np.all(r["js"] <= math.log(2.0) * r["tv"] * (1 + 1e-12))


def test_js_accurate_for_nearly_equal_distributions() -> None:
    """For q = p (1 + eps x) the JS divergence is eps^2 / 8 sum p x^2 to leading order (its
    chi-square limit); the log-domain formula keeps it positive and accurate at eps = 1e-7,
    where the naive sum of p log(p/m) + q log(q/m) is dominated by rounding."""
    gen = np.random.default_rng(3)
    p = softmax(gen.standard_normal((20, 64)), axis=1)
    x = gen.standard_normal((20, 64))
    x -= (p * x).sum(axis=1, keepdims=True)  # keep q normalised: sum p x = 0
    for eps in (1e-3, 1e-5, 1e-7):
        q = p * (1.0 + eps * x)
        out = distribution_distances(_log(p), _log(q))
        expected = eps**2 / 8.0 * (p * x**2).sum(axis=1)
        np.testing.assert_allclose(out["js"], expected, rtol=max(1e-6, 10 * eps))
        np.testing.assert_allclose(out["tv"], 0.5 * eps * (p * np.abs(x)).sum(axis=1), rtol=1e-6)


def test_distances_with_mask_and_ties() -> None:
    """Masked keys never win the argmax and add nothing; ties go to the lower index."""
    lp = _log(np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]))
    lq = _log(np.array([[0.5, 0.5, 0.0], [0.1, 0.1, 0.8]]))
    mask = np.array([[True, True, False], [True, True, True]])
    out = distribution_distances(lp, lq, mask)
    np.testing.assert_array_equal(out["top1"], [1.0, 1.0])
    np.testing.assert_allclose(out["tv"], [0.0, 0.3], rtol=1e-12)
    # a tie in p (keys 0 and 1) with q favouring key 1: argmax p is key 0, so top-1 flips
    tie = distribution_distances(_log(np.array([[0.4, 0.4, 0.2]])), _log(np.array([[0.3, 0.5, 0.2]])))
    np.testing.assert_array_equal(tie["top1"], [0.0])
    with pytest.raises(KvasymError, match="2-D of equal shape"):
        distribution_distances(lp, lq[:, :2])


def test_catastrophic_needs_both_a_flip_and_tv_above_half() -> None:
    top1 = np.array([0.0, 0.0, 1.0, 0.0])
    tv = np.array([0.9, CATASTROPHIC_TV, 0.9, 0.2])
    np.testing.assert_array_equal(catastrophic(top1, tv), [1.0, 0.0, 0.0, 0.0])


def test_trial_metrics_carries_bounded_measures() -> None:
    gen, q, k, v = make_trial()
    s, d = 6.0, q.shape[1]
    k_hat = k + 0.3 * gen.standard_normal(k.shape)
    per_query, _ = trial_metrics(q, k, v, k_hat, v, sharpness=s)
    p = softmax(s * q @ k.T / math.sqrt(d), axis=1)
    p_hat = softmax(s * q @ k_hat.T / math.sqrt(d), axis=1)
    np.testing.assert_allclose(per_query["tv"], 0.5 * np.abs(p - p_hat).sum(axis=1), rtol=1e-10)
    np.testing.assert_array_equal(per_query["top1"], (p.argmax(1) == p_hat.argmax(1)).astype(float))
    flip = (p.argmax(1) != p_hat.argmax(1)) & (0.5 * np.abs(p - p_hat).sum(axis=1) > 0.5)
    np.testing.assert_array_equal(per_query["catastrophic"], flip.astype(float))


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_topk_compiled_scan_equals_the_numpy_sets(monkeypatch, ties: bool, masked: bool) -> None:
    """The compiled scan (large matrices, when numba imports) gives the numpy path's recall
    exactly (the reference), ties to the lower index and masked keys never chosen."""
    import kvasym.metrics as metrics_module
    from kvasym.kernels import compiled_loops

    if compiled_loops() is None:
        pytest.skip("numba is not importable")
    g = np.random.default_rng(7)
    for n_rows, n_keys, k in ((40, 30, 5), (7, 3, 5), (25, 200, 1), (60, 64, 8)):
        p = g.random((n_rows, n_keys))
        p_hat = p + 0.1 * g.random((n_rows, n_keys))
        if ties:
            p, p_hat = np.round(p, 1), np.round(p_hat, 1)
        mask = None
        if masked:
            mask = g.random((n_rows, n_keys)) < 0.5
            mask[:, 0] = True
        monkeypatch.setattr(metrics_module, "TOPK_KERNEL_MIN", 0)
        fast = topk_recall(p, p_hat, k, mask)
        monkeypatch.setattr(metrics_module, "TOPK_KERNEL_MIN", 1 << 62)
        ref = topk_recall(p, p_hat, k, mask)
        assert fast.dtype == ref.dtype and np.array_equal(fast, ref)


def test_distribution_distances_masked_path_is_bit_identical(monkeypatch) -> None:
    """Under a mostly-dead mask (the causal real rows) the live-entries path gives the full
    path's numbers (the reference, forced by a zero threshold) exactly."""
    import kvasym.metrics as metrics_module
    from kvasym.attention import log_softmax

    g = np.random.default_rng(21)
    n = 48
    mask = np.tile(np.tril(np.ones((n, n), dtype=bool)), (3, 1))
    for scale in (0.1, 3.0, 40.0):
        logits = g.normal(size=mask.shape) * scale
        lp = log_softmax(np.where(mask, logits, -np.inf))
        lq = log_softmax(np.where(mask, logits + scale * 0.3 * g.normal(size=mask.shape), -np.inf))
        lq[4, :2] = -np.inf  # q = 0 where p > 0
        assert np.count_nonzero(mask) < metrics_module.LIVE_SHARE_COMPRESSED * mask.size  # fast path
        fast = distribution_distances(lp, lq, mask)
        monkeypatch.setattr(metrics_module, "LIVE_SHARE_COMPRESSED", 0.0)
        ref = distribution_distances(lp, lq, mask)
        monkeypatch.undo()
        for key in ("tv", "js", "top1"):
            assert np.array_equal(fast[key], ref[key]), key
