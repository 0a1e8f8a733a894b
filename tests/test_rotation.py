"""Randomized Walsh-Hadamard rotation: checked against scipy's Hadamard matrix and the butterfly.

The reference is ``R x = (x_padded * signs) @ H / sqrt(P)`` with ``H = scipy.linalg.hadamard(P)``
(symmetric, ``H H = P I``), so ``R`` is orthogonal and its inverse is ``(y @ H) * signs / sqrt(P)``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
from hypothesis import given, settings
from hypothesis import strategies as st

from kvasym.errors import KvasymError
from kvasym.rotation import (
    MAX_FACTOR,
    RandomizedHadamard,
    _factors,
    fwht,
    fwht_butterfly,
    hadamard_matrix,
    next_power_of_two,
)

DIMS = [1, 2, 3, 4, 8, 31, 32, 33, 64, 100, 128, 1000, 1024]
TOL = {np.float64: 1e-12, np.float32: 2e-6}


def reference_forward(x: np.ndarray, dim: int, signs: np.ndarray) -> np.ndarray:
    """Dense float64 reference of the forward rotation (zero padding, signs, H / sqrt(P))."""
    padded = 1 << (dim - 1).bit_length()
    pad = np.zeros((*x.shape[:-1], padded))
    pad[..., :dim] = x
    h = scipy.linalg.hadamard(padded).astype(np.float64)
    return (pad * signs) @ h / math.sqrt(padded)


def test_next_power_of_two() -> None:
    expected = {1: 1, 2: 2, 3: 4, 4: 4, 5: 8, 100: 128, 128: 128, 129: 256, 1000: 1024, 1024: 1024}
    for dim, want in expected.items():
        assert next_power_of_two(dim) == want
    for bad in (0, -1, -128):
        with pytest.raises(KvasymError):
            next_power_of_two(bad)


@pytest.mark.parametrize("order", [1, 2, 4, 8, 16, 32, 64, 256])
def test_hadamard_matrix_equals_scipy(order: int) -> None:
    np.testing.assert_array_equal(hadamard_matrix(order), scipy.linalg.hadamard(order))
    h = hadamard_matrix(order)
    np.testing.assert_array_equal(h @ h, order * np.eye(order))


@pytest.mark.parametrize("order", [0, 3, 6, 12, 100])
def test_hadamard_matrix_rejects_non_power_of_two(order: int) -> None:
    with pytest.raises(KvasymError):
        hadamard_matrix(order)


def test_kronecker_factors_multiply_to_order() -> None:
    for k in range(0, 21):
        order = 1 << k
        factors = _factors(order)
        assert math.prod(factors) == order
        assert all(f <= MAX_FACTOR and f & (f - 1) == 0 for f in factors)


@pytest.mark.parametrize("order", [1, 2, 4, 8, 32, 64, 512, 2048, 1 << 13])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_fwht_equals_butterfly_and_dense_hadamard(order: int, dtype: type) -> None:
    rng = np.random.default_rng(order)
    x = rng.standard_normal((3, order)).astype(dtype)
    got = fwht(x)
    assert got.dtype == dtype and got.shape == x.shape
    butterfly = fwht_butterfly(x.astype(np.float64))
    scale = math.sqrt(order)  # entries of H x have size ~ sqrt(order) * |x|
    np.testing.assert_allclose(got, butterfly, rtol=0, atol=TOL[dtype] * 10 * scale)
    if order <= 2048:
        dense = x.astype(np.float64) @ scipy.linalg.hadamard(order)
        np.testing.assert_allclose(butterfly, dense, rtol=0, atol=1e-12 * scale)


def test_fwht_handles_leading_batch_axes() -> None:
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 64))
    got = fwht(x)
    assert got.shape == x.shape
    np.testing.assert_allclose(got, x @ scipy.linalg.hadamard(64), atol=1e-12)


@pytest.mark.parametrize("dim", DIMS)
def test_forward_equals_dense_reference(dim: int) -> None:
    rot = RandomizedHadamard(dim, seed=1234 + dim)
    x = np.random.default_rng(dim).standard_normal((5, dim))
    got = rot.forward(x)
    assert got.shape == (5, rot.padded_dim) == (5, next_power_of_two(dim))
    np.testing.assert_allclose(got, reference_forward(x, dim, rot.signs), rtol=0, atol=1e-12)
    # and through the independent butterfly
    pad = np.zeros((5, rot.padded_dim))
    pad[:, :dim] = x
    butterfly = fwht_butterfly(pad * rot.signs) / math.sqrt(rot.padded_dim)
    np.testing.assert_allclose(got, butterfly, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_round_trip(dim: int, dtype: type) -> None:
    rot = RandomizedHadamard(dim, seed=7)
    x = np.random.default_rng(dim + 1).standard_normal((6, dim)).astype(dtype)
    y = rot.forward(x)
    back = rot.inverse(y)
    assert y.dtype == dtype and back.dtype == dtype
    assert back.shape == x.shape
    np.testing.assert_allclose(back, x, rtol=0, atol=TOL[dtype] * 10)


@pytest.mark.parametrize("dim", [3, 64, 100, 1000])
def test_inverse_equals_dense_transpose(dim: int) -> None:
    rot = RandomizedHadamard(dim, seed=99)
    padded = rot.padded_dim
    y = np.random.default_rng(5).standard_normal((4, padded))
    h = scipy.linalg.hadamard(padded).astype(np.float64)
    want = ((y @ h) * rot.signs / math.sqrt(padded))[:, :dim]
    np.testing.assert_allclose(rot.inverse(y), want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dim", [1, 3, 4, 100, 128, 1000])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_forward_of_identity_is_orthonormal(dim: int, dtype: type) -> None:
    rot = RandomizedHadamard(dim, seed=3)
    m = rot.forward(np.eye(dim, dtype=dtype)).astype(np.float64)  # rows: images of basis vectors
    tol = 1e-12 if dtype is np.float64 else 1e-5
    np.testing.assert_allclose(m @ m.T, np.eye(dim), rtol=0, atol=tol)
    if dim == rot.padded_dim:  # square: a full orthogonal matrix
        np.testing.assert_allclose(m.T @ m, np.eye(dim), rtol=0, atol=tol)
    # every image of a basis vector is flat: entries +-1/sqrt(P)
    np.testing.assert_allclose(np.abs(m), 1 / math.sqrt(rot.padded_dim), rtol=0, atol=tol)


@pytest.mark.parametrize("dim", [5, 64, 100])
def test_norms_and_inner_products_preserved(dim: int) -> None:
    rot = RandomizedHadamard(dim, seed=11)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((20, dim)) * rng.uniform(0.1, 100, size=(20, 1))
    y = rot.forward(x)
    np.testing.assert_allclose(np.linalg.norm(y, axis=1), np.linalg.norm(x, axis=1), rtol=1e-13)
    np.testing.assert_allclose(y @ y.T, x @ x.T, rtol=1e-12, atol=1e-9)


def test_batch_axes_and_1d_input() -> None:
    rot = RandomizedHadamard(100, seed=5)
    x = np.random.default_rng(1).standard_normal((2, 3, 100))
    y = rot.forward(x)
    assert y.shape == (2, 3, 128)
    np.testing.assert_allclose(y.reshape(6, 128), rot.forward(x.reshape(6, 100)), atol=1e-14)
    np.testing.assert_allclose(rot.forward(x[0, 0]), y[0, 0], atol=1e-14)
    np.testing.assert_allclose(rot.inverse(y), x, atol=1e-12)


def test_integer_input_is_rotated_as_float64() -> None:
    rot = RandomizedHadamard(8, seed=2)
    xi = np.arange(16).reshape(2, 8)
    got = rot.forward(xi)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, rot.forward(xi.astype(np.float64)), atol=0)


def test_signs_deterministic_by_seed_and_balanced() -> None:
    a = RandomizedHadamard(1000, seed=42).signs
    b = RandomizedHadamard(1000, seed=42).signs
    c = RandomizedHadamard(1000, seed=43).signs
    assert a.shape == (1024,)
    assert set(np.unique(a)) == {-1.0, 1.0}
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    # Fair coin: |sum| of 4096 signs is < 5 standard deviations (sd = 64).
    big = RandomizedHadamard(4096, seed=0).signs
    assert abs(big.sum()) < 5 * 64
    x = np.random.default_rng(0).standard_normal((3, 1000))
    np.testing.assert_array_equal(RandomizedHadamard(1000, 42).forward(x), RandomizedHadamard(1000, 42).forward(x))
    assert not np.allclose(RandomizedHadamard(1000, 42).forward(x), RandomizedHadamard(1000, 43).forward(x))


def test_seed_changes_rotation_for_every_small_dim() -> None:
    for dim in (2, 3, 4, 8, 16):
        outs = {RandomizedHadamard(dim, s).signs.tobytes() for s in range(40)}
        assert len(outs) > 1


def test_wrong_length_raises() -> None:
    rot = RandomizedHadamard(100, seed=0)
    with pytest.raises(KvasymError, match="100"):
        rot.forward(np.zeros((2, 99)))
    with pytest.raises(KvasymError, match="100"):
        rot.forward(np.zeros((2, 128)))
    with pytest.raises(KvasymError, match="128"):
        rot.inverse(np.zeros((2, 100)))
    with pytest.raises(KvasymError):
        RandomizedHadamard(0, seed=0).forward(np.zeros((1, 0)))


@settings(max_examples=40, deadline=None)
@given(
    dim=st.integers(min_value=1, max_value=300),
    rows=st.integers(min_value=1, max_value=4),
    seed=st.integers(min_value=0, max_value=2**63 - 1),
    scale=st.floats(min_value=1e-6, max_value=1e6),
    use32=st.booleans(),
)
def test_round_trip_property(dim: int, rows: int, seed: int, scale: float, use32: bool) -> None:
    dtype = np.float32 if use32 else np.float64
    x = (np.random.default_rng(seed % 1000).standard_normal((rows, dim)) * scale).astype(dtype)
    rot = RandomizedHadamard(dim, seed)
    y = rot.forward(x)
    assert y.shape == (rows, next_power_of_two(dim))
    norm_x = np.linalg.norm(x.astype(np.float64), axis=1)
    tol = 1e-12 if dtype is np.float64 else 3e-6
    np.testing.assert_allclose(np.linalg.norm(y.astype(np.float64), axis=1), norm_x, rtol=tol * 10)
    back = rot.inverse(y)
    err = np.max(np.abs(back.astype(np.float64) - x), axis=1)
    assert np.all(err <= tol * 10 * norm_x)
