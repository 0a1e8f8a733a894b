"""Group-wise asymmetric min-max uniform quantization (KIVI-style), with float16 scales.

A group is ``group`` consecutive entries of the matrix ``X`` (``rows`` tokens by ``dim``
channels) along one axis:

- ``axis="channel"`` (KIVI's keys): for each channel, ``group`` consecutive tokens share a
  scale, i.e. group ``(g, j)`` is ``X[g*group:(g+1)*group, j]``; scales ``(ceil(rows/group), dim)``;
- ``axis="token"`` (KIVI's values): for each token, ``group`` consecutive channels share a
  scale, i.e. group ``(i, g)`` is ``X[i, g*group:(g+1)*group]``; scales ``(rows, ceil(dim/group))``.

The last group along the axis may be shorter. With ``L = 2^b`` levels, each group stores its
zero point ``z = min`` and scale ``s = (max - z) / (L - 1)`` in float16 (side information,
32 bits per group); an entry is coded ``q = clip(round((x - z_s) / s_s), 0, L - 1)`` against
the *stored* ``z_s, s_s`` (so the nearest stored level is chosen) and reconstructed as
``x_hat = z_s + q s_s``. A group whose stored scale is 0 (all entries equal, or a range below
float16's resolution) is coded 0 and reconstructed as ``z_s``. A block whose values all sit
below float16's normal range (6.1e-5), where its resolution is absolute, is refused: its groups'
levels would move by the size of the values (:func:`kvasym.rows.check_stored_precision`).

References
----------
.. [1] Liu, Z., Yuan, J., Jin, H., Zhong, S., Xu, Z., Braverman, V., Chen, B., Hu, X. (2024)
   "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache", ICML 2024,
   arXiv:2402.02750 (per-channel keys, per-token values, group size 32, residual window of
   full-precision recent tokens, which this module does not implement).
"""

from __future__ import annotations

import numpy as np

from .errors import KvasymError
from .rows import check_stored_precision

__all__ = ["MINMAX_AXES", "SCALE_DTYPE", "as_groups", "from_groups", "group_shape", "minmax_quantize",
           "minmax_dequantize"]

#: Axes a group runs along.
MINMAX_AXES = ("channel", "token")
#: Storage dtype of the scales and zero points.
SCALE_DTYPE = "float16"


def group_shape(rows: int, dim: int, axis: str, group: int) -> tuple[int, int]:
    """Shape of the scale (and zero-point) array of a ``(rows, dim)`` matrix.

    Parameters
    ----------
    rows, dim : int
        Shape of the quantized matrix.
    axis : {"channel", "token"}
        Direction the groups run along.
    group : int
        Entries per group (>= 1).

    Returns
    -------
    tuple of int
        ``(ceil(rows/group), dim)`` for ``"channel"``, ``(rows, ceil(dim/group))`` for ``"token"``.
    """
    if axis == "channel":
        return -(-rows // group), dim
    if axis == "token":
        return rows, -(-dim // group)
    raise KvasymError(f"minmax axis must be one of {', '.join(MINMAX_AXES)}, got {axis!r}")


def as_groups(x: np.ndarray, axis: str, group: int) -> np.ndarray:
    """``x`` as ``(*group_shape, group)``, the last group padded by repeating its last entry."""
    m = x.T if axis == "channel" else x  # groups run along the last axis of m
    lead, length = m.shape
    padded = -(-length // group) * group
    if padded != length:
        m = np.concatenate([m, np.repeat(m[:, -1:], padded - length, axis=1)], axis=1)
    g = m.reshape(lead, padded // group, group)
    return np.swapaxes(g, 0, 1) if axis == "channel" else g


def from_groups(g: np.ndarray, rows: int, dim: int, axis: str) -> np.ndarray:
    """The ``(rows, dim)`` matrix of per-group entries ``g`` (:func:`as_groups`'s layout), the
    padding of the last group dropped."""
    if axis == "channel":
        m = np.swapaxes(g, 0, 1).reshape(dim, -1)[:, :rows]
        return m.T
    return g.reshape(rows, -1)[:, :dim]


def minmax_quantize(x: np.ndarray, bits: int, axis: str, group: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes, stored scales and stored zero points of ``x``.

    Parameters
    ----------
    x : numpy.ndarray
        ``(rows, dim)`` finite matrix (float64 arithmetic).
    bits : int
        Bits per entry ``b``, 1..8.
    axis : {"channel", "token"}
        Direction the groups run along.
    group : int
        Entries per group (>= 1).

    Returns
    -------
    codes : numpy.ndarray
        ``(rows, dim)`` uint8 codes in ``0..2^b - 1``.
    scale : numpy.ndarray
        float16 scales, shape :func:`group_shape`.
    zero : numpy.ndarray
        float16 zero points (group minima), same shape.

    Raises
    ------
    KvasymError
        If ``bits`` or ``group`` is out of range, a group's minimum or scale is beyond
        float16's range, or the stored parameters move a group's levels by more than
        :data:`kvasym.rows.SIDE_PRECISION` of the block's largest ``|x|`` (a block whose values
        sit in float16's subnormal range, below 6.1e-5).
    """
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 1 <= bits <= 8:
        raise KvasymError(f"minmax bits must be an integer in 1..8, got {bits!r}")
    if isinstance(group, bool) or not isinstance(group, (int, np.integer)) or group < 1:
        raise KvasymError(f"minmax group must be a positive integer, got {group!r}")
    x = np.asarray(x, dtype=np.float64)
    rows, dim = x.shape
    levels = (1 << int(bits)) - 1
    g = as_groups(x, axis, int(group))
    lo, hi = g.min(axis=-1), g.max(axis=-1)
    limit = float(np.finfo(SCALE_DTYPE).max)
    if np.any(np.abs(lo) > limit) or np.any(np.abs(hi) > limit):
        raise KvasymError(f"a minmax group's range exceeds float16's ({limit:.3g}); rescale the cache")
    zero = lo.astype(SCALE_DTYPE)
    z = zero.astype(np.float64)
    exact_scale = (hi - z) / levels
    scale = exact_scale.astype(SCALE_DTYPE)
    s = scale.astype(np.float64)
    # codes are chosen against the stored parameters, so their rounding moves the top level by
    # |z_s - min| + levels |s_s - s|: in float16's subnormal range (below 6.1e-5) that is of the
    # size of the values themselves (a cache near 1e-7 came back with relative errors of 1 to
    # 1.8, issue 33, point 3); such a cache is refused, a small group in a larger cache is not
    moved = np.abs(z - lo) + levels * np.abs(s - exact_scale)
    check_stored_precision(moved, float(np.max(np.abs(g), initial=0.0)), "minmax group zero points and scales",
                           SCALE_DTYPE)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(s[..., None] > 0, (g - z[..., None]) / np.where(s > 0, s, 1.0)[..., None], 0.0)
    codes = np.clip(np.rint(t), 0, levels).astype(np.uint8)
    return from_groups(codes, rows, dim, axis), scale, zero


def minmax_dequantize(codes: np.ndarray, scale: np.ndarray, zero: np.ndarray, axis: str, group: int) -> np.ndarray:
    """``x_hat = z_s + q s_s`` per entry, in float64.

    Parameters
    ----------
    codes : numpy.ndarray
        ``(rows, dim)`` codes.
    scale, zero : numpy.ndarray
        Stored scales and zero points, shape :func:`group_shape`.
    axis : {"channel", "token"}
        Direction the groups run along.
    group : int
        Entries per group.

    Returns
    -------
    numpy.ndarray
        ``(rows, dim)`` float64 reconstruction.
    """
    rows, dim = codes.shape
    s = np.asarray(scale, dtype=np.float64)
    z = np.asarray(zero, dtype=np.float64)
    if axis == "channel":
        idx = np.arange(rows) // group
        return z[idx, :] + codes * s[idx, :]
    idx = np.arange(dim) // group
    return z[:, idx] + codes * s[:, idx]
