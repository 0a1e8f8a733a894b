"""The 1-bit QJL sketch: unbiasedness and variance over independent seeds, against closed forms.

For a fixed residual r and query q, over the Gaussian matrix S (one per seed),
E <q, r_hat> = <q, r> and Var <q, r_hat> = [(pi/2) ||q||^2 ||r||^2 - <q, r>^2] / m.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from kvasym.packing import unpack_signs
from kvasym.sketch import SQRT_HALF_PI, QJLSketch, gaussian_matrix

N_SEEDS = 4000


def fixed_pair(dim: int, cos: float, r_norm: float, q_norm: float) -> tuple[np.ndarray, np.ndarray]:
    """r and q in R^dim with the given norms and cosine (deterministic)."""
    rng = np.random.default_rng(dim)
    a, b = rng.standard_normal((2, dim))
    e1 = a / np.linalg.norm(a)
    b -= (b @ e1) * e1
    e2 = b / np.linalg.norm(b)
    r = r_norm * e1
    q = q_norm * (cos * e1 + math.sqrt(1 - cos * cos) * e2)
    return r, q


def estimates(dim: int, rows: int, r: np.ndarray, q: np.ndarray, dtype: str) -> np.ndarray:
    out = np.empty(N_SEEDS)
    for seed in range(N_SEEDS):
        sketch = QJLSketch(dim, rows, seed=10_000 + seed)
        signs, norms = sketch.encode(r[None, :].astype(dtype))
        out[seed] = float(sketch.decode(signs, norms, dtype=dtype)[0].astype(np.float64) @ q)
    return out


def theory_variance(q: np.ndarray, r: np.ndarray, m: int) -> float:
    return (math.pi / 2 * (q @ q) * (r @ r) - (q @ r) ** 2) / m


@pytest.mark.parametrize(("dim", "rows", "dtype"), [(16, 16, "float64"), (12, 40, "float64"), (16, 16, "float32")])
def test_unbiased_and_variance_over_seeds(dim: int, rows: int, dtype: str) -> None:
    r, q = fixed_pair(dim, cos=0.6, r_norm=2.5, q_norm=0.7)
    truth = float(q @ r)
    est = estimates(dim, rows, r, q, dtype)
    var = theory_variance(q, r, rows)
    se = math.sqrt(var / N_SEEDS)
    assert abs(est.mean() - truth) < 5 * se
    # teeth: without the sqrt(pi/2) factor (or with the norm squared) the mean is far off
    assert abs(est.mean() * math.sqrt(2 / math.pi) - truth) > 5 * se
    assert abs(est.mean() * 2.5 - truth) > 5 * se
    # variance: sample variance of ~Gaussian estimates has relative sd sqrt(2/(N-1)) ~ 2.2 %
    ratio = est.var(ddof=1) / var
    assert abs(ratio - 1) < 0.12, ratio
    # teeth: the variance without the pi/2 (||q||^2||r||^2 - <q,r>^2)/m is ~2x smaller
    alt = ((q @ q) * (r @ r) - (q @ r) ** 2) / rows
    assert abs(est.var(ddof=1) / alt - 1) > 0.5


def test_mean_vector_is_the_residual() -> None:
    dim, rows = 8, 8
    r = np.array([1.0, -2.0, 0.5, 0.0, 3.0, -0.25, 1.5, -1.0])
    acc = np.zeros((N_SEEDS, dim))
    for seed in range(N_SEEDS):
        sketch = QJLSketch(dim, rows, seed=seed)
        acc[seed] = sketch.decode(*sketch.encode(r[None, :]), dtype="float64")[0]
    # coordinate i: Var r_hat_i = [(pi/2)||r||^2 - r_i^2] / m
    var = (math.pi / 2 * (r @ r) - r**2) / rows
    se = np.sqrt(var / N_SEEDS)
    z = (acc.mean(axis=0) - r) / se
    assert np.max(np.abs(z)) < 4.5, z
    # E||r_hat - r||^2 = ||r||^2 (pi D / 2 - 1) / m
    mse = np.sum((acc - r) ** 2, axis=1)
    want = (r @ r) * (math.pi * dim / 2 - 1) / rows
    assert abs(mse.mean() - want) < 5 * mse.std(ddof=1) / math.sqrt(N_SEEDS)


def test_decode_formula_and_shapes() -> None:
    dim, rows = 20, 13
    sketch = QJLSketch(dim, rows, seed=5)
    x = np.random.default_rng(0).standard_normal((6, dim))
    signs, norms = sketch.encode(x)
    assert signs.shape == (6, 2) and signs.dtype == np.uint8
    assert norms.shape == (6,) and norms.dtype == np.float64
    np.testing.assert_allclose(norms, np.linalg.norm(x, axis=1), rtol=1e-15)
    s = sketch.matrix("float64")
    assert s.shape == (rows, dim)
    neg = unpack_signs(signs, rows)
    np.testing.assert_array_equal(neg, (x @ s.T) < 0)
    sign = np.where(neg, -1.0, 1.0)
    want = math.sqrt(math.pi / 2) / rows * norms[:, None] * (sign @ s)
    got = sketch.decode(signs, norms, dtype="float64")
    assert got.shape == (6, dim) and got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)
    assert sketch.decode(signs, norms).dtype == np.float32
    assert SQRT_HALF_PI == pytest.approx(math.sqrt(math.pi / 2), rel=1e-16)


def test_reconstruction_uses_only_signs_and_norm() -> None:
    sketch = QJLSketch(32, 32, seed=9)
    r = np.random.default_rng(1).standard_normal((3, 32))
    base = sketch.decode(*sketch.encode(r), dtype="float64")
    # flipping r flips every sign: r_hat flips exactly
    flipped = sketch.decode(*sketch.encode(-r), dtype="float64")
    np.testing.assert_array_equal(flipped, -base)
    # a positive power-of-two rescaling keeps the signs and scales the norm exactly
    signs_a, norms_a = sketch.encode(r)
    signs_b, norms_b = sketch.encode(8.0 * r)
    np.testing.assert_array_equal(signs_a, signs_b)
    np.testing.assert_array_equal(norms_b, 8.0 * norms_a)
    np.testing.assert_array_equal(sketch.decode(signs_b, norms_b, "float64"), 8.0 * base)
    # a different residual with the same signs and norm gives the same reconstruction
    s = sketch.matrix("float64")
    other = r + 1e-9 * np.random.default_rng(2).standard_normal(r.shape)
    assert np.array_equal(np.sign(other @ s.T), np.sign(r @ s.T))
    other *= (np.linalg.norm(r, axis=1) / np.linalg.norm(other, axis=1))[:, None]
    np.testing.assert_allclose(sketch.decode(*sketch.encode(other), "float64"), base, rtol=1e-12)
    # and it is not the residual itself (magnitude information is gone)
    assert not np.allclose(base, r, atol=0.1)


def test_zero_residual_signs_positive_and_decodes_to_zero() -> None:
    sketch = QJLSketch(16, 16, seed=3)
    signs, norms = sketch.encode(np.zeros((2, 16)))
    assert not signs.any()  # sign(0) = +1: no negative bit set
    assert norms.tolist() == [0.0, 0.0]
    np.testing.assert_array_equal(sketch.decode(signs, norms, "float64"), np.zeros((2, 16)))


def test_matrix_deterministic_gaussian_and_read_only() -> None:
    a = QJLSketch(64, 64, seed=123).matrix("float64")
    b = QJLSketch(64, 64, seed=123).matrix("float64")
    c = QJLSketch(64, 64, seed=124).matrix("float64")
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    assert not a.flags.writeable
    # float32 matrix is the float64 draw rounded
    np.testing.assert_array_equal(QJLSketch(64, 64, seed=123).matrix("float32"), a.astype(np.float32))
    # N(0, 1) entries: KS test over 4096 draws and moments
    assert stats.kstest(a.ravel(), "norm").pvalue > 1e-3
    assert abs(a.mean()) < 5 / 64
    assert abs(a.var() - 1) < 5 * math.sqrt(2 / 4096)
    # cached: same object for the same key
    assert gaussian_matrix(64, 64, 123, "float64") is gaussian_matrix(64, 64, 123, "float64")


def test_seed_changes_signs() -> None:
    r = np.random.default_rng(4).standard_normal((1, 64))
    a = QJLSketch(64, 64, seed=1).encode(r)[0]
    b = QJLSketch(64, 64, seed=1).encode(r)[0]
    c = QJLSketch(64, 64, seed=2).encode(r)[0]
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_float32_residual_uses_float32_matrix() -> None:
    sketch = QJLSketch(24, 24, seed=7)
    r = np.random.default_rng(5).standard_normal((4, 24)).astype(np.float32)
    signs, norms = sketch.encode(r)
    s32 = sketch.matrix("float32")
    np.testing.assert_array_equal(unpack_signs(signs, 24), (r @ s32.T) < 0)
    np.testing.assert_allclose(norms, np.linalg.norm(r.astype(np.float64), axis=1), rtol=1e-7)
