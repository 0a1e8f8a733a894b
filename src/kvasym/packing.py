"""Bit packing of b-bit codes (1 <= b <= 8) and of sign bits, row by row.

A row of ``n`` codes of ``b`` bits takes exactly ``ceil(n * b / 8)`` bytes, little-endian
within the row: code ``j`` occupies bits ``b*j .. b*j + b - 1`` of the row's bit stream. Widths
that divide 8 (1, 2, 4, 8) pack inside bytes with uint8 shifts; the others go through groups of
eight codes, which make one ``8b``-bit integer, i.e. exactly ``b`` bytes. Both give the same
layout (the tests check it against ``np.packbits`` of the explicit bit stream).
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "packed_row_bytes",
    "pack_codes",
    "unpack_codes",
    "pack_signs",
    "unpack_signs",
    "pack_widths",
    "unpack_widths",
]


def packed_row_bytes(n_codes: int, bits: int) -> int:
    """Bytes one packed row of ``n_codes`` codes of ``bits`` bits occupies.

    Parameters
    ----------
    n_codes : int
        Codes per row.
    bits : int
        Bits per code.

    Returns
    -------
    int
        ``ceil(n_codes * bits / 8)``.
    """
    return -(-n_codes * bits // 8)


def _check_bits(bits: int) -> None:
    if not 1 <= bits <= 8:
        raise ValueError(f"bits must be in 1..8, got {bits}")


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack a (rows, n) array of codes < 2**bits into (rows, packed_row_bytes(n, bits)) uint8.

    Parameters
    ----------
    codes : array_like
        2-D array of codes, cast to uint8; each must be ``< 2**bits`` (not checked: higher bits
        would spill into the neighbouring code).
    bits : int
        Bits per code, 1..8.

    Returns
    -------
    numpy.ndarray
        ``(rows, ceil(n * bits / 8))`` uint8; code ``j`` of a row occupies bits
        ``b*j .. b*j + b - 1`` of the row's little-endian bit stream, unused high bits are 0.

    Raises
    ------
    ValueError
        If ``bits`` is not in 1..8 (or ``codes`` is not 2-D).
    """
    _check_bits(bits)
    codes = np.asarray(codes, dtype=np.uint8)
    rows, n = codes.shape
    nbytes = packed_row_bytes(n, bits)
    if 8 % bits == 0:
        per_byte = 8 // bits
        padded = codes
        if n % per_byte:
            padded = np.zeros((rows, nbytes * per_byte), dtype=np.uint8)
            padded[:, :n] = codes
        grouped = padded.reshape(rows, nbytes, per_byte)
        out = grouped[:, :, 0].copy()
        for j in range(1, per_byte):  # at most 7 passes: one per code slot in a byte
            out |= grouped[:, :, j] << np.uint8(bits * j)
        return out
    groups = -(-n // 8)
    padded = codes
    if n % 8:
        padded = np.zeros((rows, groups * 8), dtype=np.uint8)
        padded[:, :n] = codes
    word_type = np.uint32 if bits <= 4 else np.uint64
    grouped = padded.reshape(rows, groups, 8)
    words = grouped[:, :, 0].astype(word_type)
    for j in range(1, 8):  # eight strided passes over n/8 values, not a loop over vectors
        words |= grouped[:, :, j].astype(word_type) << word_type(bits * j)
    out = np.empty((rows, groups, bits), dtype=np.uint8)
    for k in range(bits):
        out[:, :, k] = (words >> word_type(8 * k)).astype(np.uint8)
    return out.reshape(rows, groups * bits)[:, :nbytes].copy()


def unpack_codes(packed: np.ndarray, bits: int, n_codes: int) -> np.ndarray:
    """Inverse of :func:`pack_codes`: (rows, n_codes) uint8 codes.

    Parameters
    ----------
    packed : array_like
        ``(rows, packed_row_bytes(n_codes, bits))`` uint8.
    bits : int
        Bits per code, 1..8.
    n_codes : int
        Codes per row.

    Returns
    -------
    numpy.ndarray
        ``(rows, n_codes)`` uint8 codes in ``0..2**bits - 1``.

    Raises
    ------
    ValueError
        If ``bits`` is not in 1..8 or ``packed`` does not have the expected row length.
    """
    _check_bits(bits)
    packed = np.asarray(packed, dtype=np.uint8)
    rows = packed.shape[0]
    nbytes = packed_row_bytes(n_codes, bits)
    if packed.ndim != 2 or packed.shape[1] != nbytes:
        raise ValueError(f"packed rows have shape {packed.shape[1:]}, expected ({nbytes},)")
    mask = np.uint8((1 << bits) - 1)
    if 8 % bits == 0:
        per_byte = 8 // bits
        out = np.empty((rows, nbytes, per_byte), dtype=np.uint8)
        for j in range(per_byte):
            out[:, :, j] = (packed >> np.uint8(bits * j)) & mask
        return out.reshape(rows, nbytes * per_byte)[:, :n_codes]
    groups = -(-n_codes // 8)
    full = np.zeros((rows, groups * bits), dtype=np.uint8)
    full[:, :nbytes] = packed
    word_type = np.uint32 if bits <= 4 else np.uint64
    grouped = full.reshape(rows, groups, bits)
    words = grouped[:, :, 0].astype(word_type)
    for k in range(1, bits):
        words |= grouped[:, :, k].astype(word_type) << word_type(8 * k)
    out = np.empty((rows, groups, 8), dtype=np.uint8)
    for j in range(8):
        out[:, :, j] = (words >> word_type(bits * j)).astype(np.uint8) & mask
    return out.reshape(rows, groups * 8)[:, :n_codes]


def pack_signs(negative: np.ndarray) -> np.ndarray:
    """Pack a (rows, m) boolean array (True = negative sign) to (rows, ceil(m/8)) uint8.

    Parameters
    ----------
    negative : array_like
        Booleans (True = negative sign), packed along the last axis.

    Returns
    -------
    numpy.ndarray
        ``numpy.packbits(negative, axis=-1, bitorder="little")``: bit ``j`` of a row is bit
        ``j mod 8`` of byte ``j // 8``.
    """
    return np.packbits(np.asarray(negative, dtype=bool), axis=-1, bitorder="little")


def unpack_signs(packed: np.ndarray, m: int) -> np.ndarray:
    """Inverse of :func:`pack_signs`: (rows, m) booleans, True = negative.

    Parameters
    ----------
    packed : numpy.ndarray
        uint8 array from :func:`pack_signs`.
    m : int
        Number of signs per row.

    Returns
    -------
    numpy.ndarray
        Booleans, last axis of length ``m``.
    """
    return np.unpackbits(packed, axis=-1, count=m, bitorder="little").astype(bool)


def pack_widths(codes: np.ndarray, widths: np.ndarray) -> np.ndarray:
    """Pack a (rows, n) array of codes with a width per column into one bit stream per row.

    Parameters
    ----------
    codes : array_like
        2-D non-negative integer codes; column ``j`` must be ``< 2**widths[j]`` (not checked).
    widths : array_like
        ``(n,)`` bits per column, each in 0..8 (a width-0 column takes no bits).

    Returns
    -------
    numpy.ndarray
        ``(rows, ceil(sum(widths) / 8))`` uint8; column ``j`` occupies bits
        ``o_j .. o_j + w_j - 1`` (``o_j = sum_{k<j} w_k``, least significant bit first) of the
        row's little-endian bit stream: for equal widths ``b`` the layout of :func:`pack_codes`.
    """
    codes = np.asarray(codes, dtype=np.int64)
    widths = np.asarray(widths, dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(widths)[:-1]))
    total = int(widths.sum())
    stream = np.zeros((codes.shape[0], total), dtype=bool)
    for w in np.unique(widths[widths > 0]):
        cols = np.flatnonzero(widths == w)
        bits = (codes[:, cols, None] >> np.arange(w)) & 1
        stream[:, (offsets[cols, None] + np.arange(w)).ravel()] = bits.reshape(codes.shape[0], -1)
    return np.packbits(stream, axis=1, bitorder="little")


def unpack_widths(packed: np.ndarray, widths: np.ndarray) -> np.ndarray:
    """Inverse of :func:`pack_widths`: (rows, n) int64 codes.

    Parameters
    ----------
    packed : numpy.ndarray
        uint8 array from :func:`pack_widths`.
    widths : array_like
        ``(n,)`` bits per column.

    Returns
    -------
    numpy.ndarray
        ``(rows, n)`` int64 codes (0 in width-0 columns).
    """
    widths = np.asarray(widths, dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(widths)[:-1]))
    stream = np.unpackbits(packed, axis=1, count=int(widths.sum()), bitorder="little").astype(np.int64)
    codes = np.zeros((packed.shape[0], widths.size), dtype=np.int64)
    for w in np.unique(widths[widths > 0]):
        cols = np.flatnonzero(widths == w)
        bits = stream[:, (offsets[cols, None] + np.arange(w)).ravel()].reshape(packed.shape[0], cols.size, w)
        codes[:, cols] = np.sum(bits << np.arange(w), axis=2)
    return codes
