"""Dual scaling (KVarN-style variance normalization): per-token scales from alternating row and
column normalization of each block of tokens.

A block ``B`` is ``g`` consecutive rows (tokens) of the ``(rows, dim)`` matrix, after the
randomized Walsh-Hadamard rotation. Dual scaling looks for positive row scales ``r`` (``g``)
and column scales ``c`` (``dim``) such that ``B_ij / (r_i c_j)`` has the same spread in every
row and every column, by alternating (a Sinkhorn-type iteration in the log domain):

.. math::

    c_j \\leftarrow c_j\\,\\sigma_i\\bigl(B_{ij} / (r_i c_j)\\bigr), \\qquad
    r_i \\leftarrow r_i\\,\\sigma_j\\bigl(B_{ij} / (r_i c_j)\\bigr),

``sigma`` the population standard deviation along the axis, from ``r = c = 1``, for
``iterations`` rounds; of the iterates (the start included) the one of least imbalance
``max_j s_j / min_j s_j + max_i t_i / min_i t_i`` (``s``, ``t`` the column and row spreads of
the scaled block) is kept, as the authors' reference does [1]_. A row or column of spread 0
(all its entries equal) keeps its scale. The product ``r_i c_j`` is defined up to a factor
moved between ``r`` and ``c``: ``r`` is normalized to geometric mean 1 over the block's rows
that are not all zero; an all-zero row gets ``r = 0`` (stored as float16's smallest normal
number), so that it comes back as about 0 rather than as the nearest of its channels' levels.

Why only ``r`` is stored: the scalar quantizer that follows is KIVI's per-channel asymmetric
min-max over the same block of tokens (:mod:`kvasym.minmax`, ``axis="channel"``,
``group = g``), whose codes do not change when a column is multiplied by a positive number
(its minimum, maximum and levels scale with it). The column scales would be folded into the
group scales and zero points; they act only through the row scales they lead to. So a side
with ``normalize: dual`` stores, beyond KIVI's two float16 numbers per (block, channel), one
float16 scale per token: ``16 / dim`` bits per coordinate more (0.125 at ``dim`` 128).

Differences from the authors' kernel [1]_ (a reimplementation from the paper's description and
its public reference test, not their code): no clamping of the log scales (theirs clamps to
``[-0.3, 10]``, tuned to float16 caches of their models' magnitude), population rather than
sample standard deviations (a constant factor on every row of a block, which the
normalization removes), the geometric-mean normalization, and any block length ``g`` (theirs
is 128 tokens).

References
----------
.. [1] Muller, L. K., Bich, P., Boretti, C., Chang, H.-M., Zhuang, J., Cavigelli, L. (2026)
   "KVarN: Variance-Normalized KV-Cache Quantization Mitigates Error Accumulation in
   Reasoning Tasks", arXiv:2606.03458 (Hadamard rotation, then dual-scaling variance
   normalization over both axes, then round-to-nearest; reference at github.com/huawei-csl/KVarN).
"""

from __future__ import annotations

import numpy as np

__all__ = ["DUAL_ITERATIONS", "TOKEN_SCALE_DTYPE", "dual_scales", "token_scales"]

#: Alternating rounds per block (the authors' default, 16).
DUAL_ITERATIONS = 16
#: Storage dtype of the per-token scales.
TOKEN_SCALE_DTYPE = "float16"


def _spread(m: np.ndarray, axis: int) -> np.ndarray:
    """Population standard deviation along ``axis``; 1 where it is 0 (the scale is kept)."""
    s = np.std(m, axis=axis)
    return np.where(s > 0, s, 1.0)


def _imbalance(m: np.ndarray) -> float:
    """``max/min`` of the column spreads plus ``max/min`` of the row spreads (spreads of 0 left out)."""
    total = 0.0
    for axis in (0, 1):
        s = np.std(m, axis=axis)
        s = s[s > 0]
        total += float(s.max() / s.min()) if s.size else 1.0
    return total


def dual_scales(block: np.ndarray, iterations: int = DUAL_ITERATIONS) -> tuple[np.ndarray, np.ndarray]:
    """Row and column scales of one block by alternating variance normalization (module docstring).

    Parameters
    ----------
    block : numpy.ndarray
        ``(g, dim)`` finite matrix (float64 arithmetic).
    iterations : int, optional
        Alternating rounds (default :data:`DUAL_ITERATIONS`); 0 gives ``r = c = 1``.

    Returns
    -------
    row_scale : numpy.ndarray
        ``(g,)`` float64, geometric mean 1 over the rows that are not all zero; 0 for an all-zero
        row.
    col_scale : numpy.ndarray
        ``(dim,)`` positive float64, such that ``block / (row_scale[:, None] * col_scale)`` is the
        kept iterate.
    """
    b = np.asarray(block, dtype=np.float64)
    log_r = np.zeros(b.shape[0])
    log_c = np.zeros(b.shape[1])
    best = (_imbalance(b), log_r.copy(), log_c.copy())
    for _ in range(int(iterations)):
        log_c += np.log(_spread(b / np.exp(log_r)[:, None] / np.exp(log_c), axis=0))
        log_r += np.log(_spread(b / np.exp(log_r)[:, None] / np.exp(log_c), axis=1))
        score = _imbalance(b / np.exp(log_r)[:, None] / np.exp(log_c))
        if score <= best[0]:
            best = (score, log_r.copy(), log_c.copy())
    _, log_r, log_c = best
    live = np.any(b != 0, axis=1)
    shift = float(np.mean(log_r[live])) if live.any() else 0.0
    # an all-zero token is reconstructed as (its level) * r: r = 0 (clipped to float16's smallest
    # normal number when stored) keeps it near 0 instead of a whole level away
    return np.where(live, np.exp(log_r - shift), 0.0), np.exp(log_c + shift)


def token_scales(x: np.ndarray, group: int, iterations: int = DUAL_ITERATIONS) -> np.ndarray:
    """The stored per-token scales of a ``(rows, dim)`` matrix, block by block of ``group`` rows.

    Parameters
    ----------
    x : numpy.ndarray
        ``(rows, dim)`` finite matrix; the last block may be shorter than ``group``.
    group : int
        Rows per block (the min-max group length along the token axis).
    iterations : int, optional
        Alternating rounds per block (default :data:`DUAL_ITERATIONS`).

    Returns
    -------
    numpy.ndarray
        ``(rows,)`` float16: each block's :func:`dual_scales` row scales, clipped to float16's
        normal range ``[6.1e-5, 65504]`` so that every stored scale is positive and finite (the
        encoder divides by the stored value, so a clipped scale costs accuracy, never
        consistency).
    """
    x = np.asarray(x, dtype=np.float64)
    out = np.empty(x.shape[0], dtype=np.float64)
    for start in range(0, x.shape[0], int(group)):
        out[start:start + group] = dual_scales(x[start:start + group], iterations)[0]
    info = np.finfo(TOKEN_SCALE_DTYPE)
    return np.clip(out, float(info.tiny), float(info.max)).astype(TOKEN_SCALE_DTYPE)
