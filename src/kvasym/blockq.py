"""llama.cpp's KV-cache types: ggml's "type-0" block quantizers q4_0/q5_0 and q8_0, at any width.

llama.cpp quantizes its KV cache (``--cache-type-k``/``--cache-type-v``) with the weight formats
of ggml: each block of 32 consecutive values of a row (one token's channels of one head) stores
one float16 scale ``d`` and ``b``-bit integer codes, and is reconstructed as ``x_hat = d * q``.
Two rules choose ``d`` and the codes (ggml-quants.c, ``quantize_row_q4_0_ref``,
``quantize_row_q5_0_ref``, ``quantize_row_q8_0_ref``; all arithmetic in float32):

- ``q_0`` (q4_0 at ``b = 4``, q5_0 at ``b = 5``), with ``B = 2^(b-1)``: ``m`` is the block's
  entry of largest magnitude (the first one on a tie), ``d = m / -B``, ``q = min(2B - 1,
  trunc(x / d + B + 0.5))`` and ``x_hat = (q - B) d_s``: the extreme entry lands exactly on the
  level ``-B`` (2^b levels, the range asymmetric by one level);
- ``q8_0`` (q8_0 at ``b = 8``), with ``Q = 2^(b-1) - 1``: ``d = max|x| / Q``, ``q =
  round(x / d)`` (half away from zero) in ``-Q..Q`` and ``x_hat = q d_s``: symmetric, 2^b - 1
  levels.

``x / d`` is ggml's ``x * (1/d)`` with the float32 ``d`` (not the stored one), and ``d_s`` is
``d`` rounded to float16, so the stored scale's rounding shifts every level of the block by the
same relative amount, as in llama.cpp. Codes are kept unsigned: ``q`` for ``q_0`` and ``q + B``
for ``q8_0`` (both in ``0..2^b - 1``). A block is ``group`` consecutive entries along ``axis``
(:func:`kvasym.minmax.group_shape`; llama.cpp's is ``axis="token"``, ``group=32``). Side
information: 16 bits per block, 0.5 bits per value at 32 (q4_0 is 4.5 bits per value, q8_0 8.5).

References
----------
.. [1] G. Gerganov et al., ggml, ``src/ggml-quants.c``: ``quantize_row_q4_0_ref``,
   ``quantize_row_q5_0_ref``, ``quantize_row_q8_0_ref`` and ``dequantize_row_q4_0`` (block
   ``QK4_0 = QK8_0 = 32``, ``ggml_fp16_t d``), https://github.com/ggml-org/ggml.
.. [2] llama.cpp, ``--cache-type-k`` / ``--cache-type-v`` (``f16``, ``q8_0``, ``q4_0``, ``q4_1``,
   ``iq4_nl``, ``q5_0``, ``q5_1``), https://github.com/ggml-org/llama.cpp.
"""

from __future__ import annotations

import numpy as np

from .errors import KvasymError
from .minmax import SCALE_DTYPE, as_groups, from_groups
from .rows import check_stored_precision

__all__ = ["BLOCK_RULES", "LLAMA_CPP_TYPES", "block_dequantize", "block_quantize"]

#: The rules: ggml's q4_0/q5_0 (``q_0``) and q8_0 (``q8_0``).
BLOCK_RULES = ("q_0", "q8_0")
#: llama.cpp's cache types this module is: type name -> (rule, bits per value before the scale).
LLAMA_CPP_TYPES = {"q4_0": ("q_0", 4), "q5_0": ("q_0", 5), "q8_0": ("q8_0", 8)}


def _check(bits: int, rule: str, group: int) -> None:
    if rule not in BLOCK_RULES:
        raise KvasymError(f"block rule must be one of {', '.join(BLOCK_RULES)}, got {rule!r}")
    low = 2 if rule == "q8_0" else 1  # q8_0 at 1 bit would have the one level 0
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not low <= bits <= 8:
        raise KvasymError(f"{rule} bits must be an integer in {low}..8, got {bits!r}")
    if isinstance(group, bool) or not isinstance(group, (int, np.integer)) or group < 1:
        raise KvasymError(f"{rule} group must be a positive integer, got {group!r}")


def block_quantize(x: np.ndarray, bits: int, rule: str, axis: str, group: int) -> tuple[np.ndarray, np.ndarray]:
    """Codes and stored float16 scales of ``x`` under ggml's rule ``rule``.

    Parameters
    ----------
    x : numpy.ndarray
        ``(rows, dim)`` finite matrix (rounded to float32, as llama.cpp's cache rows are).
    bits : int
        Bits per entry ``b``: 1..8 for ``q_0``, 2..8 for ``q8_0``.
    rule : {"q_0", "q8_0"}
        How a block's scale and codes are chosen (module docstring).
    axis : {"channel", "token"}
        Direction the blocks run along (llama.cpp: ``"token"``, each token's channels).
    group : int
        Entries per block (llama.cpp: 32).

    Returns
    -------
    codes : numpy.ndarray
        ``(rows, dim)`` uint8 codes in ``0..2^b - 1``.
    scale : numpy.ndarray
        float16 block scales ``d_s``, shape :func:`kvasym.minmax.group_shape`.

    Raises
    ------
    KvasymError
        If ``bits``, ``rule`` or ``group`` is out of range, a block's scale exceeds float16's
        range, or the stored scales move a block's levels by more than
        :data:`kvasym.rows.SIDE_PRECISION` of the cache's largest ``|x|`` (values in float16's
        subnormal range).
    """
    _check(bits, rule, group)
    x32 = np.asarray(x, dtype=np.float32)
    rows, dim = x32.shape
    g = as_groups(x32, axis, int(group))  # (..., group); a short last block repeats its last entry
    half = np.float32(1 << (int(bits) - 1))
    if rule == "q_0":
        first = np.argmax(np.abs(g), axis=-1)  # the first entry of largest magnitude, as ggml's loop
        extreme = np.take_along_axis(g, first[..., None], axis=-1)[..., 0]
        d = extreme / -half
    else:
        d = np.max(np.abs(g), axis=-1) / (half - np.float32(1))
    limit = float(np.finfo(SCALE_DTYPE).max)
    if np.any(np.abs(d) > limit):
        raise KvasymError(f"a {rule} block's scale exceeds float16's range ({limit:.3g}); rescale the cache")
    # the stored scale moves the block's extreme level by (its level) |d_s - d|: in float16's
    # subnormal range (a cache below 6.1e-5) that is of the size of the values, and the cache is
    # refused as minmax's is (kvasym.rows.check_stored_precision); llama.cpp would store zeros
    stored = d.astype(SCALE_DTYPE).astype(np.float64)
    moved = np.abs(stored - d.astype(np.float64)) * float(half)
    check_stored_precision(moved, float(np.max(np.abs(g), initial=0.0)), f"{rule} block scales", SCALE_DTYPE)
    with np.errstate(divide="ignore"):
        inverse = np.where(d != 0, np.float32(1) / np.where(d != 0, d, np.float32(1)), np.float32(0)).astype(np.float32)
    t = g * inverse[..., None]  # float32, as ggml's x * id
    if rule == "q_0":
        codes = np.minimum(np.float32(2) * half - 1, np.trunc(t + (half + np.float32(0.5))))
    else:
        whole = np.trunc(t)  # C's roundf (half away from zero), exactly: t - trunc(t) is exact
        codes = np.where(np.abs(t - whole) >= np.float32(0.5), whole + np.sign(t), whole) + half
    return from_groups(codes.astype(np.uint8), rows, dim, axis), d.astype(SCALE_DTYPE)


def block_dequantize(codes: np.ndarray, scale: np.ndarray, bits: int, axis: str, group: int) -> np.ndarray:
    """``x_hat = (q - 2^(b-1)) d_s`` per entry (both rules, their codes kept unsigned), in float64.

    Parameters
    ----------
    codes : numpy.ndarray
        ``(rows, dim)`` codes of :func:`block_quantize`.
    scale : numpy.ndarray
        Stored float16 scales, shape :func:`kvasym.minmax.group_shape`.
    bits : int
        Bits per entry ``b``.
    axis : {"channel", "token"}
        Direction the blocks run along.
    group : int
        Entries per block.

    Returns
    -------
    numpy.ndarray
        ``(rows, dim)`` float64 reconstruction (ggml's float32 product ``(q - B) * d_s`` is exact
        in float64 too: an 8-bit integer times a float16).
    """
    rows, dim = codes.shape
    s = np.asarray(scale, dtype=np.float64)
    q = codes.astype(np.float64) - float(1 << (int(bits) - 1))
    if axis == "channel":
        return q * s[np.arange(rows) // group, :]
    return q * s[:, np.arange(dim) // group]
