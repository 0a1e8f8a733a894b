"""Float64 attention against brute-force references."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import softmax

from kvasym.attention import AttentionResult, attend, attention_logits, log_softmax
from kvasym.errors import KvasymError


def brute_force_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, sharpness: float
) -> np.ndarray:
    """Explicit loops over queries and keys with math.exp (the textbook definition)."""
    d = q.shape[1]
    out = np.zeros((q.shape[0], v.shape[1]))
    for i in range(q.shape[0]):
        logits = [
            sharpness * sum(q[i, c] * k[j, c] for c in range(d)) / math.sqrt(d)
            for j in range(k.shape[0])
        ]
        top = max(logits)
        w = [math.exp(x - top) for x in logits]
        total = sum(w)
        for j in range(k.shape[0]):
            out[i] += w[j] / total * v[j]
    return out


def test_logits_match_definition() -> None:
    gen = np.random.default_rng(0)
    q, k = gen.standard_normal((3, 5)), gen.standard_normal((4, 5))
    expected = np.array([[2.5 * np.dot(qi, kj) / math.sqrt(5) for kj in k] for qi in q])
    np.testing.assert_allclose(attention_logits(q, k, 2.5), expected, rtol=1e-13)


def test_attend_matches_brute_force_and_scipy() -> None:
    gen = np.random.default_rng(1)
    q, k, v = gen.standard_normal((4, 6)), gen.standard_normal((7, 6)), gen.standard_normal((7, 3))
    res = attend(q, k, v, sharpness=3.0)
    assert isinstance(res, AttentionResult)
    assert res.weights.shape == (4, 7) and res.output.shape == (4, 3)
    np.testing.assert_allclose(
        res.output, brute_force_attention(q, k, v, 3.0), rtol=1e-12, atol=1e-14
    )
    np.testing.assert_allclose(
        res.weights, softmax(3.0 * q @ k.T / math.sqrt(6), axis=1), rtol=1e-12
    )
    np.testing.assert_allclose(np.exp(res.log_weights), res.weights, rtol=1e-15)
    np.testing.assert_allclose(res.weights.sum(axis=1), 1.0, rtol=1e-14)


def test_log_softmax_matches_scipy_and_rows_sum_to_one() -> None:
    gen = np.random.default_rng(2)
    x = gen.standard_normal((20, 50)) * 30
    from scipy.special import log_softmax as reference

    np.testing.assert_allclose(log_softmax(x), reference(x, axis=1), rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(np.exp(log_softmax(x)).sum(axis=1), 1.0, rtol=1e-14)


def test_log_softmax_is_stable_for_huge_logits() -> None:
    x = np.array([[1e30, -1e30, 0.0], [1e30, 1e30, -1e30], [-1e30, -1e30, -1e30]])
    out = log_softmax(x)
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out[0], [0.0, -2e30, -1e30])
    np.testing.assert_allclose(out[1, :2], -math.log(2))
    np.testing.assert_allclose(out[2], -math.log(3))
    np.testing.assert_allclose(np.exp(out).sum(axis=1), 1.0)


def test_mask_gives_exact_zeros() -> None:
    gen = np.random.default_rng(3)
    q, k, v = gen.standard_normal((4, 8)), gen.standard_normal((4, 8)), gen.standard_normal((4, 8))
    causal = np.tril(np.ones((4, 4), dtype=bool))
    res = attend(q, k, v, 2.0, mask=causal)
    assert np.all(res.weights[~causal] == 0.0)
    assert np.all(np.isneginf(res.log_weights[~causal]))
    assert np.all(np.isfinite(res.log_weights[causal]))
    np.testing.assert_allclose(res.weights.sum(axis=1), 1.0, rtol=1e-14)
    # Each masked row equals unmasked attention over its allowed prefix.
    for i in range(4):
        sub = attend(q[i : i + 1], k[: i + 1], v[: i + 1], 2.0)
        np.testing.assert_allclose(res.output[i], sub.output[0], rtol=1e-12)
    assert res.output[0] == pytest.approx(v[0], rel=1e-15)


def test_bad_inputs_raise() -> None:
    q, k = np.ones((2, 4)), np.ones((3, 4))
    with pytest.raises(KvasymError, match="dim"):
        attention_logits(q, np.ones((3, 5)), 1.0)
    with pytest.raises(KvasymError, match="sharpness"):
        attention_logits(q, k, float("inf"))
    with pytest.raises(KvasymError, match="values"):
        attend(q, k, np.ones((2, 4)), 1.0)
    with pytest.raises(KvasymError, match="mask"):
        attend(q, k, k, 1.0, mask=np.ones((2, 3)))
    with pytest.raises(KvasymError, match="mask row 1"):
        attend(q, k, k, 1.0, mask=np.array([[True, False, False], [False, False, False]]))
