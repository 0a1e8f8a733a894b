"""Bit packing: layout checked against np.packbits of an explicitly built little-endian bit stream."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvasym.packing import pack_codes, pack_signs, packed_row_bytes, unpack_codes, unpack_signs

LENGTHS = [*range(1, 71), 1024]


def reference_pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Row bit stream: bit k of code j at position b*j + k; bytes filled from their low bit."""
    codes = np.asarray(codes, dtype=np.int64)
    rows, n = codes.shape
    stream = np.zeros((rows, n * bits), dtype=np.uint8)
    for j in range(n):
        for k in range(bits):
            stream[:, bits * j + k] = (codes[:, j] >> k) & 1
    return np.packbits(stream, axis=1, bitorder="little")


def reference_pack_loop(codes: np.ndarray, bits: int) -> np.ndarray:
    """Same layout through Python big integers: row value = sum code_j << (b*j), little-endian bytes."""
    rows, n = codes.shape
    nbytes = -(-n * bits // 8)
    out = np.zeros((rows, nbytes), dtype=np.uint8)
    for r in range(rows):
        value = 0
        for j in range(n):
            value |= int(codes[r, j]) << (bits * j)
        out[r] = np.frombuffer(value.to_bytes(nbytes, "little"), dtype=np.uint8)
    return out


def random_codes(rows: int, n: int, bits: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1 << bits, size=(rows, n), dtype=np.uint8)


@pytest.mark.parametrize("bits", range(1, 9))
def test_round_trip_and_layout_all_lengths(bits: int) -> None:
    for n in LENGTHS:
        codes = random_codes(3, n, bits, seed=1000 * bits + n)
        packed = pack_codes(codes, bits)
        assert packed.dtype == np.uint8
        assert packed.shape == (3, -(-n * bits // 8)) == (3, packed_row_bytes(n, bits))
        np.testing.assert_array_equal(packed, reference_pack(codes, bits), err_msg=f"bits={bits} n={n}")
        back = unpack_codes(packed, bits, n)
        assert back.dtype == np.uint8 and back.shape == codes.shape
        np.testing.assert_array_equal(back, codes, err_msg=f"bits={bits} n={n}")


@pytest.mark.parametrize("bits", range(1, 9))
def test_layout_matches_big_integer_reference(bits: int) -> None:
    for n in (1, 5, 8, 13, 24, 33):
        codes = random_codes(2, n, bits, seed=n)
        np.testing.assert_array_equal(pack_codes(codes, bits), reference_pack_loop(codes, bits))


@pytest.mark.parametrize("bits", range(1, 9))
def test_extreme_codes(bits: int) -> None:
    top = (1 << bits) - 1
    for n in (1, 7, 8, 9, 64, 65):
        for fill in (0, top):
            codes = np.full((2, n), fill, dtype=np.uint8)
            packed = pack_codes(codes, bits)
            # all-ones codes set exactly n*b bits, padding bits stay zero
            assert int(np.unpackbits(packed, axis=1).sum()) == (2 * n * bits if fill else 0)
            np.testing.assert_array_equal(unpack_codes(packed, bits, n), codes)
        alternating = np.tile(np.array([0, top], dtype=np.uint8), (1, n))[:, :n]
        np.testing.assert_array_equal(unpack_codes(pack_codes(alternating, bits), bits, n), alternating)


def test_known_bytes() -> None:
    # 3-bit codes 1..8 (mod 8): bit stream 100 010 110 001 101 011 111 000 (LSB first per code)
    codes = np.array([[1, 2, 3, 4, 5, 6, 7, 0]], dtype=np.uint8)
    value = sum(int(c) << (3 * j) for j, c in enumerate(codes[0]))
    assert pack_codes(codes, 3).tolist() == [list(value.to_bytes(3, "little"))]
    assert pack_codes(np.array([[1, 2, 3, 0]], dtype=np.uint8), 2).tolist() == [[0b00111001]]
    assert pack_codes(np.array([[0xA, 0x5]], dtype=np.uint8), 4).tolist() == [[0x5A]]
    assert pack_codes(np.array([[1, 0, 0, 0, 0, 0, 0, 0, 1]], dtype=np.uint8), 1).tolist() == [[1, 1]]


def test_rows_are_independent() -> None:
    codes = random_codes(5, 13, 5, seed=3)
    packed = pack_codes(codes, 5)
    for r in range(5):
        np.testing.assert_array_equal(pack_codes(codes[r : r + 1], 5), packed[r : r + 1])


def test_zero_rows_and_zero_codes() -> None:
    assert pack_codes(np.zeros((0, 5), dtype=np.uint8), 3).shape == (0, 2)
    assert unpack_codes(np.zeros((0, 2), dtype=np.uint8), 3, 5).shape == (0, 5)
    assert pack_codes(np.zeros((2, 0), dtype=np.uint8), 3).shape == (2, 0)


@pytest.mark.parametrize("bits", [0, 9, -1])
def test_bad_bits(bits: int) -> None:
    with pytest.raises(ValueError):
        pack_codes(np.zeros((1, 4), dtype=np.uint8), bits)
    with pytest.raises(ValueError):
        unpack_codes(np.zeros((1, 4), dtype=np.uint8), bits, 4)


def test_unpack_wrong_shape() -> None:
    packed = pack_codes(random_codes(2, 10, 3, 0), 3)
    with pytest.raises(ValueError):
        unpack_codes(packed[:, :-1], 3, 10)
    with pytest.raises(ValueError):
        unpack_codes(packed, 3, 20)
    with pytest.raises(ValueError):
        unpack_codes(packed.ravel(), 3, 10)


@pytest.mark.parametrize("m", [*range(1, 71), 1024])
def test_signs_round_trip_and_layout(m: int) -> None:
    neg = np.random.default_rng(m).random((4, m)) < 0.5
    packed = pack_signs(neg)
    assert packed.dtype == np.uint8 and packed.shape == (4, -(-m // 8))
    # same layout as 1-bit codes
    np.testing.assert_array_equal(packed, reference_pack(neg.astype(np.uint8), 1))
    back = unpack_signs(packed, m)
    assert back.dtype == bool
    np.testing.assert_array_equal(back, neg)


@settings(max_examples=60, deadline=None)
@given(
    bits=st.integers(1, 8),
    rows=st.integers(0, 4),
    n=st.integers(0, 200),
    seed=st.integers(0, 2**32 - 1),
)
def test_property_round_trip(bits: int, rows: int, n: int, seed: int) -> None:
    codes = random_codes(rows, n, bits, seed)
    packed = pack_codes(codes, bits)
    assert packed.shape == (rows, packed_row_bytes(n, bits))
    np.testing.assert_array_equal(packed, reference_pack(codes, bits))
    np.testing.assert_array_equal(unpack_codes(packed, bits, n), codes)
