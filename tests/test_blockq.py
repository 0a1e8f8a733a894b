"""llama.cpp's KV-cache types (kvasym.blockq) against a line-by-line transcription of ggml's C
reference quantizers (ggml-quants.c: quantize_row_q4_0_ref, quantize_row_q5_0_ref,
quantize_row_q8_0_ref, dequantize_row_q4_0/q8_0), one value at a time in float32."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvasym.blockq import block_dequantize, block_quantize
from kvasym.errors import KvasymError

F32 = np.float32


def _trunc_int8(value: np.float32) -> int:
    return int(math.trunc(float(value)))  # C's (int8_t) cast of a float in range


def ggml_q_0_row(x: np.ndarray, bits: int, qk: int = 32) -> tuple[list[int], list[np.float16]]:
    """quantize_row_q4_0_ref (bits 4) / quantize_row_q5_0_ref (bits 5), generalized to ``bits``:
    codes before nibble packing, and the fp16 scales."""
    half = 1 << (bits - 1)
    codes, scales = [], []
    for i in range(len(x) // qk):
        block = x[i * qk:(i + 1) * qk].astype(F32)
        amax, vmax = F32(0.0), F32(0.0)
        for v in block:
            if amax < abs(v):
                amax, vmax = abs(v), v
        d = F32(vmax / F32(-half))
        inv = F32(F32(1.0) / d) if d != 0 else F32(0.0)
        scales.append(np.float16(d))
        for v in block:
            x0 = F32(v * inv)
            codes.append(min(2 * half - 1, _trunc_int8(F32(x0 + F32(half + 0.5)))))
    return codes, scales


def ggml_q8_0_row(x: np.ndarray, bits: int = 8, qk: int = 32) -> tuple[list[int], list[np.float16]]:
    """quantize_row_q8_0_ref, generalized to ``bits``: signed codes, fp16 scales."""
    top = (1 << (bits - 1)) - 1
    codes, scales = [], []
    for i in range(len(x) // qk):
        block = x[i * qk:(i + 1) * qk].astype(F32)
        amax = F32(0.0)
        for v in block:
            amax = max(amax, abs(v))
        d = F32(amax / F32(top))
        inv = F32(F32(1.0) / d) if d != 0 else F32(0.0)
        scales.append(np.float16(d))
        for v in block:
            x0 = float(F32(v * inv))
            codes.append(int(math.copysign(math.floor(abs(x0) + 0.5), x0)))  # roundf
    return codes, scales


def _rows(seed: int, rows: int = 5, dim: int = 64) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, dim)) * rng.lognormal(0.0, 1.0, (rows, 1))
    x[0, 3], x[0, 7] = 2.5, -2.5  # a tie of magnitudes in a block: the first one decides the sign
    x[0, :32] /= np.abs(x[0, :32]).max() / 2.5  # ... and is the block's largest
    x[1, :32] = 0.0  # an all-zero block: scale 0, every value coded at the middle
    return x.astype(F32)


@pytest.mark.parametrize("bits", [4, 5, 2, 3, 8])
def test_q_0_equals_ggml_reference(bits):
    x = _rows(bits)
    codes, scales = block_quantize(x, bits, "q_0", "token", 32)
    half = 1 << (bits - 1)
    for r in range(x.shape[0]):
        ref_codes, ref_scales = ggml_q_0_row(x[r], bits)
        assert codes[r].tolist() == ref_codes
        assert scales[r].tolist() == [float(s) for s in ref_scales]
        # dequantize_row_q4_0: (q - 8) * d, with the fp16 d
        ref = [(q - half) * float(ref_scales[j // 32]) for j, q in enumerate(ref_codes)]
        np.testing.assert_array_equal(block_dequantize(codes, scales, bits, "token", 32)[r], ref)


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_q8_0_equals_ggml_reference(bits):
    x = _rows(100 + bits)
    codes, scales = block_quantize(x, bits, "q8_0", "token", 32)
    half = 1 << (bits - 1)
    for r in range(x.shape[0]):
        ref_codes, ref_scales = ggml_q8_0_row(x[r], bits)
        assert (codes[r].astype(int) - half).tolist() == ref_codes
        assert scales[r].tolist() == [float(s) for s in ref_scales]
        ref = [q * float(ref_scales[j // 32]) for j, q in enumerate(ref_codes)]
        np.testing.assert_array_equal(block_dequantize(codes, scales, bits, "token", 32)[r], ref)


def test_q4_0_worked_block():
    """One block by hand: its extreme -4 lands on the level -8 (d = -4 / -8 = 0.5), 1.3 on level 3
    (trunc(2.6 + 8.5) = 11, (11 - 8) * 0.5 = 1.5), and 3.9 on the clipped top level 7 (3.5): the
    range is asymmetric by one level."""
    x = np.zeros((1, 32), dtype=F32)
    x[0, :4] = [-4.0, 1.3, 3.9, -0.2]
    codes, scales = block_quantize(x, 4, "q_0", "token", 32)
    assert float(scales[0, 0]) == 0.5
    # x / d with d = 0.5: -8, 2.6, 7.8, -0.4; + 8.5 and truncated: 0, 11, 16 -> 15 (clipped), 8
    assert codes[0, :4].tolist() == [0, 11, 15, 8]
    np.testing.assert_array_equal(block_dequantize(codes, scales, 4, "token", 32)[0, :4], [-4.0, 1.5, 3.5, 0.0])


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([("q_0", 4), ("q_0", 5), ("q8_0", 8), ("q8_0", 4)]),
       st.sampled_from(["token", "channel"]), st.sampled_from([8, 32]))
def test_error_is_within_half_a_step_of_each_block(seed, rule_bits, axis, group):
    """Invariant of both rules: each value is within half a level (|d_s| / 2) of its reconstruction,
    up to the fp16 rounding of d (q4_0's clipped top code excepted: within one level)."""
    rule, bits = rule_bits
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((40, 48)) * 3).astype(F32)
    codes, scales = block_quantize(x, bits, rule, axis, group)
    recon = block_dequantize(codes, scales, bits, axis, group)
    s = np.abs(scales.astype(np.float64))
    step = s[np.arange(40) // group, :] if axis == "channel" else s[:, np.arange(48) // group]
    slack = 1.0 if rule == "q_0" else 0.5
    assert np.all(np.abs(recon - x) <= step * slack + np.abs(x) * 2e-3 + 1e-12)


def test_bits_rule_and_range_are_refused_by_name():
    x = np.ones((2, 32), dtype=F32)
    with pytest.raises(KvasymError, match="q8_0 bits must be an integer in 2..8"):
        block_quantize(x, 1, "q8_0", "token", 32)
    with pytest.raises(KvasymError, match="block rule must be one of q_0, q8_0"):
        block_quantize(x, 4, "q4_1", "token", 32)
    with pytest.raises(KvasymError, match="exceeds float16's range"):
        block_quantize(x * 1e6, 4, "q_0", "token", 32)
    with pytest.raises(KvasymError, match="q_0 block scales"):  # float16 cannot resolve it: refused, not zeros
        block_quantize(x * 1e-7, 4, "q_0", "token", 32)


@pytest.mark.parametrize("name, rule, budget", [("GGML-Q0", "q_0", 4), ("GGML-Q0", "q_0", 5), ("GGML-Q0", "q_0", 2),
                                                ("GGML-Q8", "q8_0", 8), ("GGML-Q8", "q8_0", 3)])
def test_the_ggml_schemes_are_llama_cpps_cache_types_through_the_cache(name, rule, budget):
    """The registry's GGML-Q0 at n = 4 is llama.cpp's q4_0 cache and GGML-Q8 at n = 8 its q8_0, on
    both sides: the packed cache reconstructs the reference's values exactly and costs n + 0.5
    measured bits per value (one float16 scale per 32 values, no norm, no seed)."""
    from kvasym.cache import quantize
    from kvasym.schemes import get_scheme

    x = _rows(7, rows=40, dim=64)
    scheme = get_scheme(name)
    scheme.validate_budget(budget)
    for side in ("K", "V"):
        cache = quantize(x, scheme.side(side), budget, rotation_seed=1, qjl_seed=2)
        codes, scales = block_quantize(x, budget, rule, "token", 32)
        np.testing.assert_array_equal(cache.dequantize(), block_dequantize(codes, scales, budget, "token", 32))
        assert cache.bits_per_coordinate() == {"payload": budget, "side": 0.5, "total": budget + 0.5}


def test_q8_0_at_one_bit_is_refused_by_the_registry():
    from kvasym.schemes import get_scheme

    with pytest.raises(KvasymError, match="a 1-bit q8_0 scalar .its one level is 0. and no QJL stores nothing"):
        get_scheme("GGML-Q8").validate_budget(1)
