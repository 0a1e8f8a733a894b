"""The compiled attention-row pass (kvasym._metrics_numba) against its numpy reference.

The compiled loops use libm's exponentials and logarithms and sum in row order, so they agree
with the numpy reference to rounding, not bit for bit: every float column within 1e-12 relative
(or 1e-15 absolute where the value is a rounding-level zero), every discrete column (top-1,
top-5 recall, catastrophic) equal on inputs without exact ties. The Jensen-Shannon term's
series branch is checked against mpmath at 50 digits.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from kvasym.errors import KvasymError
from kvasym.metrics import trial_metrics_multi, trial_reference

numba = pytest.importorskip("numba")
from kvasym import _metrics_numba  # noqa: E402

SHARPNESS = [1.0, 2.0, 8.0]
DISCRETE = {"query", "top1", "recall_top5", "catastrophic", "key", "n_queries"}


def _trial(rng, n_q=96, n_k=80, d=32, noise=0.05, scale=1.0):
    q = rng.standard_normal((n_q, d)) * scale
    k = rng.standard_normal((n_k, d))
    v = rng.standard_normal((n_k, d))
    k_hat = k + noise * rng.standard_normal(k.shape)
    v_hat = v + noise * rng.standard_normal(v.shape)
    return q, k, v, k_hat, v_hat


def _causal(n_q, n_k):
    # a real capture's mask: the stacked query heads each see the keys up to their position
    return np.arange(n_k)[None, :] <= (np.arange(n_q)[:, None] % n_k)


def _assert_close_columns(a, b):
    """Equal to rounding, each column at the scale its conditioning allows: the kernel moves a
    weight by an ulp, which moves a probability-weighted sum (KL, TV, JS, per-key means of
    weights or log-ratios) by about 1e-15 absolute, and the attention output by 1e-16 of its
    norm, which is all of a 1e-9 output error's last 7 digits: the SNR columns (of the keys, the
    values and the output, whose norms the kernel sums in row order) are compared as the relative
    error norm 10 ** (-snr_db / 20) they come from. An angle between unit vectors is known to an
    absolute 1e-16 whatever its size (a norm's last bit scales a unit vector by 1 + 1e-16), so
    phi is compared absolutely, and eps_dir = 2 sin^2(phi / 2) as the chord 2 sin(phi / 2)."""
    assert a.keys() == b.keys()
    for name in a:
        x, y = np.asarray(a[name]), np.asarray(b[name])
        site, _, coordinate = name.partition("_")
        if site in ("k", "v", "t") and coordinate in ("snr_db", "eff_bits"):
            db, db_y = (x, y) if coordinate == "snr_db" else (x * 20 * math.log10(2), y * 20 * math.log10(2))
            np.testing.assert_allclose(10 ** (-db / 20), 10 ** (-db_y / 20), rtol=1e-12, atol=1e-14, err_msg=name)
        elif site in ("k", "v", "t") and coordinate == "phi":
            np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-14, err_msg=name)
        elif site in ("k", "v", "t") and coordinate == "eps_dir":
            np.testing.assert_allclose(np.sqrt(2 * x), np.sqrt(2 * y), rtol=1e-12, atol=1e-14, err_msg=name)
        elif name in DISCRETE or name.startswith("logit_err") or name == "key_norm":
            # discrete, or computed from the caches alone by the same code on both paths
            np.testing.assert_array_equal(x, y, err_msg=name)
        else:
            np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-13, equal_nan=True, err_msg=name)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("noise", [1e-9, 0.05, 1.0])
def test_compiled_rows_match_the_numpy_reference(masked, noise):
    rng = np.random.default_rng(int(noise * 1e9) + masked)
    q, k, v, k_hat, v_hat = _trial(rng, noise=noise)
    mask = _causal(q.shape[0], k.shape[0]) if masked else None
    ref = trial_metrics_multi(q, k, v, k_hat, v_hat, SHARPNESS, mask, kernel="numpy")
    fast = trial_metrics_multi(q, k, v, k_hat, v_hat, SHARPNESS, mask, kernel="numba")
    for (pq_ref, pk_ref), (pq_fast, pk_fast) in zip(ref, fast):
        _assert_close_columns(pq_ref, pq_fast)
        _assert_close_columns(pk_ref, pk_fast)


def test_compiled_rows_match_on_sharp_attention_with_underflowing_weights():
    # logits of spread ~200 at sharpness 8: most weights underflow to 0 and the KL of a row
    # reaches hundreds of nats; the live entries still agree
    rng = np.random.default_rng(3)
    q, k, v, k_hat, v_hat = _trial(rng, n_q=40, n_k=300, d=64, noise=0.3, scale=4.0)
    ref = trial_metrics_multi(q, k, v, k_hat, v_hat, [8.0], kernel="numpy", per_key=False)
    fast = trial_metrics_multi(q, k, v, k_hat, v_hat, [8.0], kernel="numba", per_key=False)
    assert np.max(ref[0][0]["kl"]) > 10.0
    assert np.mean(ref[0][0]["top1"]) < 1.0  # some top-1 flips: the comparison sees both values
    _assert_close_columns(ref[0][0], fast[0][0])


def test_identical_caches_give_zero_distances_on_both_paths():
    rng = np.random.default_rng(4)
    q, k, v, _, _ = _trial(rng)
    for kernel in ("numpy", "numba"):
        ((per_query, _),) = trial_metrics_multi(q, k, v, k.copy(), v.copy(), [2.0], kernel=kernel)
        assert np.all(per_query["kl"] == 0.0) and np.all(per_query["tv"] == 0.0)
        assert np.all(per_query["js"] == 0.0) and np.all(per_query["top1"] == 1.0)


@pytest.mark.parametrize("r", [0.0, 1e-300, 1e-12, 1e-8, 1e-3, 0.0999999, 0.1, 0.1000001, 0.5, 0.9,
                               1 - 1e-9, 1 - 2**-52, 1.0])
@pytest.mark.parametrize("m", [0.3, 1e-5, 1e-200])
def test_js_term_against_mpmath(r, m):
    # one entry's m g(r) from weights p = m (1 + r), q = m (1 - r) and their exact logarithms
    mpmath.mp.dps = 50
    for x in (r, -r):
        p, q = m * (1 + x), m * (1 - x)
        pm, qm = mpmath.mpf(p), mpmath.mpf(q)
        log_p = float(mpmath.log(pm)) if p > 0 else -math.inf
        log_q = float(mpmath.log(qm)) if q > 0 else -math.inf
        got = _metrics_numba.js_term(p, q, log_p if p > 0 else -1e300, log_q if q > 0 else -1e300)
        mm = (pm + qm) / 2
        exact = (pm * mpmath.log(pm / mm) if p > 0 else 0) + (qm * mpmath.log(qm / mm) if q > 0 else 0)
        assert got >= 0.0
        # a few ulp of the result, plus, above the series, a few ulp of m |log m|: log p and
        # log m each carry eps |log m|, which their difference keeps (the weights a softmax gives
        # are no more exact than that: p = exp(log p) carries the same relative error)
        assert abs(got - float(exact)) <= 8e-16 * float(exact) + 6e-16 * m * (abs(math.log(m)) + 1), (x, m, got)


def test_js_of_nearly_equal_rows_is_accurate():
    # p and q agreeing to 1e-8: JS ~ 1e-17 nats, where the naive p log(2p / (p + q)) + ... returns
    # noise of either sign; the kernel's JS of its own weights is right to a few ulp
    logits = np.random.default_rng(5).standard_normal((1, 50))
    p = np.exp(logits - np.log(np.exp(logits).sum()))
    logits_hat = logits + 1e-8 * np.random.default_rng(6).standard_normal(logits.shape)
    allowed = np.ones(logits.shape, dtype=bool)
    out = [np.empty(1) for _ in range(4)]
    log_q, q = np.empty_like(p), np.empty_like(p)
    top_p = np.empty((1, 5), dtype=np.int64)
    k_row = np.array([5])
    _metrics_numba.topk_rows(p, allowed, k_row, top_p)
    _metrics_numba.hat_row_measures(logits_hat, 1.0, allowed, np.log(p), p, log_q, q, *out, top_p, k_row,
                                    np.empty(1, dtype=np.int64))
    js = out[2][0]
    mpmath.mp.dps = 50
    pm, qm = [mpmath.mpf(float(x)) for x in p[0]], [mpmath.mpf(float(x)) for x in q[0]]
    exact = sum(a * mpmath.log(2 * a / (a + b)) + b * mpmath.log(2 * b / (a + b)) for a, b in zip(pm, qm)) / 2
    assert 1e-18 < js < 1e-15
    assert abs(js - float(exact)) <= 1e-13 * float(exact)


def test_a_shared_reference_gives_the_same_columns():
    rng = np.random.default_rng(7)
    q, k, v, k_hat, v_hat = _trial(rng)
    mask = _causal(q.shape[0], k.shape[0])
    for kernel in ("numpy", "numba"):
        reference = trial_reference(q, k, v, SHARPNESS, mask, kernel=kernel)
        shared = trial_metrics_multi(q, k, v, k_hat, v_hat, SHARPNESS, mask, reference=reference)
        alone = trial_metrics_multi(q, k, v, k_hat, v_hat, SHARPNESS, mask, kernel=kernel)
        for (a_q, a_k), (b_q, b_k) in zip(shared, alone):
            for x, y in ((a_q, b_q), (a_k, b_k)):
                assert x.keys() == y.keys()
                for name in x:
                    np.testing.assert_array_equal(x[name], y[name], err_msg=f"{kernel} {name}")


def test_a_reference_of_other_inputs_or_sharpness_is_refused():
    rng = np.random.default_rng(8)
    q, k, v, k_hat, v_hat = _trial(rng)
    reference = trial_reference(q, k, v, [1.0], kernel="numpy")
    with pytest.raises(KvasymError, match="built from other"):
        trial_metrics_multi(q, k.copy(), v, k_hat, v_hat, [1.0], reference=reference)
    with pytest.raises(KvasymError, match="no attention at sharpness"):
        trial_metrics_multi(q, k, v, k_hat, v_hat, [2.0], reference=reference)


def test_unknown_kernel_and_missing_numba_are_named(monkeypatch):
    rng = np.random.default_rng(9)
    q, k, v, k_hat, v_hat = _trial(rng)
    with pytest.raises(KvasymError, match="metrics kernel must be one of"):
        trial_metrics_multi(q, k, v, k_hat, v_hat, [1.0], kernel="cuda")
    import kvasym.metrics as metrics

    monkeypatch.setattr(metrics, "compiled_metric_loops", lambda: None)
    with pytest.raises(KvasymError, match="needs numba"):
        trial_metrics_multi(q, k, v, k_hat, v_hat, [1.0], kernel="numba")
    # auto falls back to the reference, bit for bit
    auto = trial_metrics_multi(q, k, v, k_hat, v_hat, [1.0], kernel="auto")
    ref = trial_metrics_multi(q, k, v, k_hat, v_hat, [1.0], kernel="numpy")
    for name in ref[0][0]:
        np.testing.assert_array_equal(auto[0][0][name], ref[0][0][name])


def test_log_softmax_rows_sums_to_one_and_masks():
    rng = np.random.default_rng(10)
    scores = rng.standard_normal((30, 20)) * 50
    allowed = _causal(30, 20)
    log_w, w = np.empty_like(scores), np.empty_like(scores)
    _metrics_numba.log_softmax_rows(scores, 2.0, allowed, log_w, w)
    assert np.all(w[~allowed] == 0.0) and np.all(log_w[~allowed] == -np.inf)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=1e-14)
    np.testing.assert_allclose(np.exp(log_w[allowed]), w[allowed], rtol=1e-13, atol=1e-300)
    assert math.isfinite(float(log_w[allowed].min()))


@pytest.mark.parametrize("masked", [False, True])
def test_top5_sets_break_ties_like_the_reference(masked):
    # integer logits: many exact ties inside and at the edge of the top 5, equal on both paths
    # (equal logits give equal weights), so the recall must be equal to the last bit
    rng = np.random.default_rng(11)
    n_q, n_k, d = 64, 40, 8
    q = rng.integers(-2, 3, (n_q, d)).astype(float)
    k = rng.integers(-1, 2, (n_k, d)).astype(float) * math.sqrt(d)
    k_hat = k.copy()
    k_hat[rng.random(k.shape) < 0.2] += math.sqrt(d)
    v = rng.standard_normal((n_k, d))
    mask = _causal(n_q, n_k) if masked else None
    ref = trial_metrics_multi(q, k, v, k_hat, v, [1.0], mask, kernel="numpy", per_key=False)
    fast = trial_metrics_multi(q, k, v, k_hat, v, [1.0], mask, kernel="numba", per_key=False)
    recall = ref[0][0]["recall_top5"]
    assert 0.0 < np.mean(recall) < 1.0
    np.testing.assert_array_equal(recall, fast[0][0]["recall_top5"])
    np.testing.assert_array_equal(ref[0][0]["top1"], fast[0][0]["top1"])


def test_row_errors_match_the_reference_and_hand_it_the_rows_it_cannot_sum():
    """The compiled per-row norms and angles (the cache and output error coordinates) against
    kvasym.metrics.error_coordinates: zero rows, one zero side, equal, opposite and orthogonal
    rows; a row whose squares leave float64's safe range makes the pass decline, and the
    coordinates are then the reference's bit for bit."""
    from kvasym.metrics import _error_coordinates, error_coordinates

    rng = np.random.default_rng(8)
    a = rng.standard_normal((12, 24))
    b = a + 0.1 * rng.standard_normal(a.shape)
    a[0], b[0] = 0.0, 0.0  # both zero: phi 0
    a[1] = 0.0  # one zero: phi pi/2
    b[2] = a[2]  # equal: phi 0, snr at its cap
    b[3] = -a[3]  # opposite: phi pi
    b[4] = np.roll(a[4], 1) - a[4] * (a[4] @ np.roll(a[4], 1)) / (a[4] @ a[4])  # orthogonal
    ref = error_coordinates(a, b)
    fast = _error_coordinates(a, b, a - b, _metrics_numba)
    assert ref.keys() == fast.keys()
    assert fast["phi"][0] == 0.0 and fast["phi"][1] == math.pi / 2 and fast["phi"][2] == 0.0
    np.testing.assert_allclose(fast["phi"][3:5], [math.pi, math.pi / 2], rtol=1e-15)
    np.testing.assert_allclose(fast["phi"], ref["phi"], rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(fast["snr_db"], ref["snr_db"], rtol=1e-13, atol=1e-13)
    out = np.empty(12), np.empty(12), np.empty(12)
    assert _metrics_numba.row_errors(a, b, *out)
    for scale in (1e200, 1e-160):
        big = a.copy()
        big[5] *= scale
        assert not _metrics_numba.row_errors(big, b, *out)
        fallback, reference = _error_coordinates(big, b, big - b, _metrics_numba), error_coordinates(big, b)
        for name in reference:
            np.testing.assert_array_equal(fallback[name], reference[name], err_msg=name)
