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
from kvasym.sketch import (
    SQRT_HALF_PI,
    HadamardSketch,
    QJLSketch,
    gaussian_matrix,
    hadamard_error_energy,
    residual_sketch,
)

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


# ------------------------------------------------------------------------- the hadamard sketch
# W = R_2 R_1 (two randomized Hadamard rotations), stored sign(W r) and rho = sqrt(D)||r||^2/||W r||_1,
# r_hat = rho / sqrt(D) W^T sign(W r). Closed forms (kvasym.sketch.HadamardSketch): <r_hat, r> = ||r||^2
# exactly; Var <q, r_hat> = c_D (||q||^2 ||r||^2 - <q, r>^2) / (D - 1); E||r_hat - r||^2 = c_D ||r||^2.


def dense_hadamard_sketch(dim: int, seed: int) -> np.ndarray:
    """W as a dense matrix from scipy's Sylvester Hadamard and the two sign vectors."""
    from scipy.linalg import hadamard

    from kvasym.rotation import RandomizedHadamard
    from kvasym.seeds import derived_seed

    h = hadamard(dim).astype(np.float64) / math.sqrt(dim)
    d1, d2 = (RandomizedHadamard(dim, derived_seed(seed, "hadamard-sketch", k)).signs for k in (1, 2))
    return (h * d2) @ (h * d1)  # R_k = H diag(d_k) / sqrt(D)


def realistic_residuals(dim: int, rows: int, bits: int = 2, seed: int = 0) -> np.ndarray:
    """Residuals of the rotated Lloyd-Max quantizer of unit vectors, as the pipeline sketches them."""
    from kvasym.codebook import lloyd_max_codebook
    from kvasym.rotation import RandomizedHadamard
    from kvasym.scalar import ThresholdEncoder

    x = np.random.default_rng(seed).standard_normal((rows, dim))
    u = RandomizedHadamard(dim, seed + 1).forward(x / np.linalg.norm(x, axis=1, keepdims=True))
    book = lloyd_max_codebook(dim, bits)
    return u - book.centroids[ThresholdEncoder(book.thresholds).encode(u)]


def test_hadamard_sketch_matches_its_dense_definition_and_is_orthogonal() -> None:
    dim, seed = 32, 41
    w = dense_hadamard_sketch(dim, seed)
    np.testing.assert_allclose(w @ w.T, np.eye(dim), atol=1e-13)
    r = np.random.default_rng(0).standard_normal((5, dim))
    sketch = HadamardSketch(dim, seed)
    signs, rho = sketch.encode(r)
    projections = r @ w.T
    np.testing.assert_array_equal(unpack_signs(signs, dim), projections < 0)
    want_rho = math.sqrt(dim) * np.sum(r * r, axis=1) / np.abs(projections).sum(axis=1)
    np.testing.assert_allclose(rho, want_rho, rtol=1e-13)
    want = (want_rho / math.sqrt(dim))[:, None] * (np.where(projections < 0, -1.0, 1.0) @ w)
    got = sketch.decode(signs, rho, "float64")
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), rho, rtol=1e-12)  # rho is ||r_hat||
    assert sketch.rows == dim and residual_sketch("hadamard", dim, seed) == sketch


def test_hadamard_sketch_is_exact_along_the_residual_for_every_draw() -> None:
    """<r_hat, r> = ||r||^2 whatever the signs: the error lies orthogonal to r. The Gaussian
    sketch has no such property (teeth)."""
    r = realistic_residuals(64, 6)
    for seed in range(5):
        h = HadamardSketch(64, seed)
        along = np.einsum("ij,ij->i", h.decode(*h.encode(r), "float64"), r)
        np.testing.assert_allclose(along, np.sum(r * r, axis=1), rtol=1e-12)
    g = QJLSketch(64, 64, seed=0)
    along_g = np.einsum("ij,ij->i", g.decode(*g.encode(r), "float64"), r)
    assert np.max(np.abs(along_g / np.sum(r * r, axis=1) - 1)) > 0.02


def hadamard_estimates(dim: int, r: np.ndarray, q: np.ndarray, n_seeds: int) -> np.ndarray:
    """<q_i, r_hat_i> for each row i of (r, q), over n_seeds independent sketches: (n_seeds, rows)."""
    out = np.empty((n_seeds, r.shape[0]))
    for seed in range(n_seeds):
        h = HadamardSketch(dim, 50_000 + seed)
        out[seed] = np.einsum("ij,ij->i", h.decode(*h.encode(r), "float64"), q)
    return out


def test_hadamard_sketch_unbiased_and_variance_over_seeds() -> None:
    """Over 12,000 seeds, for three realistic residuals (those of the rotated Lloyd-Max quantizer)
    and two sparse ones: the mean of <q, r_hat> is <q, r> within 4 standard errors for all five;
    for the realistic ones the variance is the closed form c_D (||q||^2||r||^2 - <q,r>^2) / (D - 1)
    within 6% (the estimate's own sd is ~1.3%; the closed form is for a Haar W, which the
    Hadamard product approximates on dense residuals: within ~3% at D = 64, ~2% at D = 128, but
    +-13% at D = 16; on a 2-sparse residual the variance for a given q departs from it by up to
    ~2x at D = 16, see kvasym.sketch). Teeth:
    the Gaussian sketch's variance formula, and a single randomized Hadamard rotation with the
    same scale, which is biased on the sparse residual."""
    dim, n_seeds = 64, 12_000
    r = np.vstack([realistic_residuals(dim, 3) * 3.0,
                   np.r_[1.0, 1.0, np.zeros(dim - 2)],
                   np.r_[3.0, 1.0, 0.5, np.zeros(dim - 3)]])
    q = np.random.default_rng(7).standard_normal(r.shape)
    est = hadamard_estimates(dim, r, q, n_seeds)
    truth = np.einsum("ij,ij->i", q, r)
    c = hadamard_error_energy(dim)
    var = c * (np.sum(q * q, 1) * np.sum(r * r, 1) - truth**2) / (dim - 1)
    z = (est.mean(axis=0) - truth) / np.sqrt(var / n_seeds)
    assert np.max(np.abs(z)) < 4, z
    ratio = est.var(axis=0, ddof=1) / var
    np.testing.assert_allclose(ratio[:3], 1.0, atol=0.06)
    # the Gaussian sketch's variance formula is ~2.75x this one: the test tells them apart
    gauss = (math.pi / 2 * np.sum(q * q, 1) * np.sum(r * r, 1) - truth**2) / dim
    assert np.all(est.var(axis=0, ddof=1)[:3] / gauss[:3] < 0.5)
    # teeth: one rotation instead of two
    from kvasym.rotation import RandomizedHadamard

    sparse, q_sparse = r[4], q[4]
    single = np.empty(4000)
    for seed in range(4000):
        rot = RandomizedHadamard(dim, 90_000 + seed)
        w = rot.forward(sparse[None, :])
        rho = math.sqrt(dim) * (sparse @ sparse) / np.abs(w).sum()
        single[seed] = (rho / math.sqrt(dim)) * rot.inverse(np.where(w < 0, -1.0, 1.0))[0] @ q_sparse
    assert abs(single.mean() - truth[4]) > 8 * single.std(ddof=1) / math.sqrt(4000)


@pytest.mark.parametrize("dim", [16, 64, 128, 1024])
def test_hadamard_error_energy_matches_monte_carlo_to_two_percent(dim: int) -> None:
    """E||r_hat - r||^2 / ||r||^2 over realistic residuals and 4 seeds, against c_D; and c_D
    itself against an independent Monte Carlo of E[D/||z||_1^2] - 1 for Haar z."""
    rows = max(64, 16_384 // dim)
    r = realistic_residuals(dim, rows, bits=3, seed=dim)
    energy = []
    for seed in range(4):
        h = HadamardSketch(dim, seed)
        err = h.decode(*h.encode(r), "float64") - r
        energy.append(np.sum(err * err, axis=1) / np.sum(r * r, axis=1))
    measured = float(np.mean(energy))
    assert measured == pytest.approx(hadamard_error_energy(dim), rel=0.02)
    # teeth: the Gaussian sketch's pi/2 - 1/D is 2.75x larger
    assert abs(measured / (math.pi / 2 - 1 / dim) - 1) > 0.5
    g = np.random.default_rng(dim).standard_normal((200_000 // max(1, dim // 16), dim))
    haar = float(np.mean(dim * np.sum(g * g, 1) / np.abs(g).sum(1) ** 2) - 1)
    assert hadamard_error_energy(dim) == pytest.approx(haar, rel=0.005)


def test_hadamard_sketch_zero_rows_determinism_and_refusals() -> None:
    h = HadamardSketch(32, 5)
    signs, rho = h.encode(np.zeros((2, 32)))
    assert not signs.any() and rho.tolist() == [0.0, 0.0]
    np.testing.assert_array_equal(h.decode(signs, rho, "float64"), np.zeros((2, 32)))
    r = np.random.default_rng(4).standard_normal((1, 32))
    np.testing.assert_array_equal(h.encode(r)[0], HadamardSketch(32, 5).encode(r)[0])
    assert not np.array_equal(h.encode(r)[0], HadamardSketch(32, 6).encode(r)[0])
    assert h.decode(*h.encode(r.astype(np.float32))).dtype == np.float32
    from kvasym.errors import KvasymError

    with pytest.raises(KvasymError, match="power-of-two residual dimension.*got 24"):
        HadamardSketch(24, 1)
    with pytest.raises(KvasymError, match="sketch must be one of gaussian, hadamard, got 'haar'"):
        residual_sketch("haar", 16, 1)
    assert isinstance(residual_sketch("gaussian", 24, 1), QJLSketch)
