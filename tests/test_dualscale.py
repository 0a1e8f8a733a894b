"""KVarN-style dual scaling (kvasym.dualscale) and the KVarN scheme against a direct implementation.

The direct implementation below is written from the method's description alone, entry by entry
with Python loops (no shared helper with the library): rotate each row with the randomized
Hadamard matrix built densely, find each block's row and column scales by alternating
variance normalization, keep the iterate of least imbalance, normalize the row scales to
geometric mean 1, store them in float16, and quantize each channel of the block between its
float16 minimum and maximum.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvasym.cache import quantize
from kvasym.dualscale import DUAL_ITERATIONS, dual_scales, token_scales
from kvasym.rotation import RandomizedHadamard
from kvasym.schemes import get_scheme


def _std(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def _direct_row_scales(block: np.ndarray, iterations: int) -> list[float]:
    g, d = block.shape
    r, c = [1.0] * g, [1.0] * d

    def scaled(i: int, j: int) -> float:
        return float(block[i, j]) / (r[i] * c[j])

    def imbalance() -> float:
        cols = [_std([scaled(i, j) for i in range(g)]) for j in range(d)]
        rows = [_std([scaled(i, j) for j in range(d)]) for i in range(g)]
        cols, rows = [s for s in cols if s > 0], [s for s in rows if s > 0]
        return (max(cols) / min(cols) if cols else 1.0) + (max(rows) / min(rows) if rows else 1.0)

    best, best_r = imbalance(), list(r)
    for _ in range(iterations):
        spreads = [_std([scaled(i, j) for i in range(g)]) for j in range(d)]
        c = [c[j] * (spreads[j] if spreads[j] > 0 else 1.0) for j in range(d)]
        spreads = [_std([scaled(i, j) for j in range(d)]) for i in range(g)]
        r = [r[i] * (spreads[i] if spreads[i] > 0 else 1.0) for i in range(g)]
        score = imbalance()
        if score <= best:
            best, best_r = score, list(r)
    geometric = math.exp(sum(math.log(v) for v in best_r) / g)
    return [v / geometric for v in best_r]


def _direct_kvarn(x: np.ndarray, bits: int, group: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Reconstruction and stored token scales of x under WHT + dual scaling + per-channel min-max."""
    rows, dim = x.shape
    rotation = RandomizedHadamard(dim, seed)
    dense = rotation.forward(np.eye(dim))  # row i is R e_i: z = x @ dense
    z = x @ dense
    levels = 2**bits - 1
    recon = np.zeros_like(z)
    stored_r = np.zeros(rows)
    for start in range(0, rows, group):
        block = z[start:start + group]
        r = [float(np.float16(v)) for v in _direct_row_scales(block, DUAL_ITERATIONS)]
        stored_r[start:start + len(r)] = r
        for j in range(z.shape[1]):
            column = [block[i, j] / r[i] for i in range(len(r))]
            lo = float(np.float16(min(column)))
            scale = float(np.float16((max(column) - lo) / levels))
            for i, value in enumerate(column):
                q = 0 if scale == 0 else min(max(round((value - lo) / scale), 0), levels)
                recon[start + i, j] = (lo + q * scale) * r[i]
    return recon @ dense.T, stored_r


@pytest.mark.parametrize(("rows", "dim", "bits", "group"), [(70, 16, 2, 32), (45, 8, 3, 16), (33, 32, 4, 128)])
def test_kvarn_scheme_equals_a_direct_implementation(rows: int, dim: int, bits: int, group: int) -> None:
    rng = np.random.default_rng(rows + dim)
    x = rng.standard_normal((rows, dim)) * np.exp(rng.standard_normal((rows, 1))) * np.exp(rng.standard_normal(dim))
    spec = get_scheme("KVarN").side("K")
    if group != spec.group:
        from dataclasses import replace

        spec = replace(spec, group=group)
    cache = quantize(x, spec, bits, rotation_seed=11, qjl_seed=12)
    expected, stored_r = _direct_kvarn(x, bits, group, 11)
    assert np.array_equal(cache.extras["token_scale"].astype(np.float64), stored_r)
    np.testing.assert_allclose(cache.dequantize(), expected, rtol=1e-9, atol=1e-12 * np.abs(expected).max())


def test_side_bits_are_the_token_scales_and_group_parameters_by_hand_count() -> None:
    x = np.random.default_rng(3).standard_normal((300, 64))
    for bits in (2, 3, 4):
        cache = quantize(x, get_scheme("KVarN").side("V"), bits, rotation_seed=1, qjl_seed=2)
        kivi = quantize(x, get_scheme("KIVI128").side("K"), bits, rotation_seed=1, qjl_seed=2)
        assert cache.payload_bits == 300 * 64 * bits
        token_bits = 300 * 16  # one float16 per token
        group_bits = math.ceil(300 / 128) * 64 * 2 * 16  # scale and zero per (block, channel)
        seed_bits = cache.side_bits - token_bits - group_bits
        assert seed_bits == 64  # the rotation seed, which KIVI (unrotated) does not store
        assert kivi.side_bits == group_bits


def test_row_scales_recover_a_separable_magnitude_profile() -> None:
    """On B_ij = a_i b_j G_ij (G i.i.d. Gaussian), the balanced scales are a and b up to a
    common factor: r / a is constant to within the sampling spread of G's row deviations."""
    rng = np.random.default_rng(5)
    a = np.exp(rng.uniform(-3, 3, 128))
    b = np.exp(rng.uniform(-2, 2, 256))
    block = a[:, None] * b * rng.standard_normal((128, 256))
    r, c = dual_scales(block)
    ratio = r / a
    assert np.std(np.log(ratio)) < 0.1
    assert np.std(np.log(c / b)) < 0.15
    assert abs(np.mean(np.log(r))) < 1e-12  # geometric mean 1
    balanced = block / r[:, None] / c
    spreads = balanced.std(axis=1)
    assert spreads.max() / spreads.min() < 1.05  # the last update balanced the rows exactly
    assert np.array_equal(dual_scales(block, iterations=0)[0], np.ones(128))


def test_token_scales_are_invariant_to_the_block_magnitude_and_positive() -> None:
    rng = np.random.default_rng(9)
    x = rng.standard_normal((200, 32)) * np.exp(rng.standard_normal((200, 1)))
    base = token_scales(x, 64)
    assert base.dtype == np.float16 and base.shape == (200,)
    assert np.array_equal(token_scales(x * 1024.0, 64), base)
    x[10] = 0.0  # a zero token keeps a finite positive scale
    scaled = token_scales(x, 64)
    assert np.all(np.isfinite(scaled.astype(np.float64))) and np.all(scaled > 0)
    spec = get_scheme("KVarN").side("K")
    cache = quantize(x, spec, 2, rotation_seed=1, qjl_seed=2)
    assert np.allclose(cache.dequantize()[10], 0.0, atol=1e-2 * np.abs(x).max())
