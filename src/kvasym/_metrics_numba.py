"""The compiled attention-row pass of :func:`kvasym.metrics.trial_metrics_multi` (imported only when used).

One pass over each row of a trial's logits computes what the numpy reference computes in a
dozen whole-matrix passes: the masked log-softmax and its weights, and against the reference
attention of the same row, ``KL(p || q)``, total variation, Jensen-Shannon divergence and top-1
agreement (:func:`kvasym.metrics.kl_divergence`, :func:`kvasym.metrics.distribution_distances`).
A real-model trial (1,536 x 512, four sharpness values, three budgets) spends 60% of its
metrics time in those passes on numpy.

Unlike :mod:`kvasym._stats_numba`, these loops are not bit-identical to their references: the
exponentials and logarithms are libm's, not numpy's SIMD loops, and sums run in row order. They
agree to rounding (a few units in the last place per term; ``tests/test_metrics_kernel.py``
compares each column with the reference at the scale its conditioning allows: 1e-12 relative,
1e-13 absolute for probability-weighted sums, on random, sharp and tied rows). The
formulas are the reference's, rearranged only where that removes transcendental calls without
losing accuracy (see :func:`hat_row_measures`).

Module level, with ``cache=True``, so that numba's on-disk cache finds the compiled code again in
a fresh process.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ._stats_numba import top_insert

#: Below this |r| the Jensen-Shannon term is summed from its Taylor series (:func:`js_term`).
_SERIES_R = 0.1


@njit(cache=True, nogil=True, inline="always")
def js_term(p, q, log_p, log_q):
    """``m g(r) = p log(p / m) + q log(q / m)`` of one entry, ``m = (p + q) / 2``, ``r = (p - q) /
    (p + q)``, for ``p + q > 0`` (the Jensen-Shannon divergence is half the sum over a row).

    Below ``|r| = 0.1``, ``m`` times the series ``g(r) = sum_k r^(2k) / (k (2k - 1))`` (8 terms:
    the first one left out, ``r^18 / 153``, is under 1e-17 of ``g`` at ``|r| = 0.1``), with no
    cancellation and no transcendental call; above it, the defining form with one logarithm,
    ``log m``, whose terms cancel by at most a factor ``1 / |r| <= 10``. The reference
    (:func:`kvasym.metrics.distribution_distances`) takes ``r`` from the log-probabilities and
    ``g`` from ``atanh`` and ``log1p``: two or three transcendental calls per entry.
    """
    s = p + q
    r = (p - q) / s
    if abs(r) < _SERIES_R:
        u = r * r
        return 0.5 * s * u * (1.0 + u * (1.0 / 6.0 + u * (1.0 / 15.0 + u * (1.0 / 28.0 + u * (
            1.0 / 45.0 + u * (1.0 / 66.0 + u * (1.0 / 91.0 + u * (1.0 / 120.0))))))))
    log_m = math.log(0.5 * s)
    return p * (log_p - log_m) + q * (log_q - log_m)


@njit(cache=True, nogil=True)
def topk_rows(w, allowed, k_row, top):
    """``top[i, :k_row[i]]``: the indices of the ``k_row[i]`` largest allowed entries of row ``i``
    of ``w``, ties to the lower index (the sets of :func:`kvasym.metrics.topk_recall`); the rest
    of the row is -1."""
    n_rows, n_keys = w.shape
    vals = np.empty(top.shape[1])
    for i in range(n_rows):
        k = k_row[i]
        top[i, :] = -1
        count = 0
        for j in range(n_keys):
            if allowed[i, j]:
                count = top_insert(vals, top[i], count, k, w[i, j], j)


@njit(cache=True, nogil=True, inline="always")
def _shifted_exp(row, sharpness, allowed, out):
    """``out_j = exp(sharpness row_j - M)`` on the allowed entries (0 elsewhere), ``M`` their
    maximum of ``sharpness row_j``; returns ``(M, sum_j out_j)``."""
    peak = -np.inf
    for j in range(row.size):
        if allowed[j]:
            x = sharpness * row[j]
            if x > peak:
                peak = x
    total = 0.0
    for j in range(row.size):
        if allowed[j]:
            e = math.exp(sharpness * row[j] - peak)
            out[j] = e
            total += e
        else:
            out[j] = 0.0
    return peak, total


@njit(cache=True, nogil=True)
def log_softmax_rows(scores, sharpness, allowed, log_w, w):
    """Row-wise masked log-softmax of ``sharpness * scores`` into ``log_w`` and its weights into
    ``w`` (both (n_rows, n_keys) float64, written): :func:`kvasym.attention.log_softmax` of the
    masked logits (``-inf`` where ``allowed`` is False), with ``w_j = exp(x_j - M) / sum_k exp(x_k
    - M)`` (``M`` the row's allowed maximum; one exponential per entry, where the reference takes
    a second one of ``log_w``). Every row must have an allowed entry and finite logits (the
    caller checks both)."""
    n_rows, n_keys = scores.shape
    for i in range(n_rows):
        peak, total = _shifted_exp(scores[i], sharpness, allowed[i], w[i])
        lse = math.log(total)
        inv = 1.0 / total
        for j in range(n_keys):
            if allowed[i, j]:
                log_w[i, j] = (sharpness * scores[i, j] - peak) - lse
                w[i, j] = w[i, j] * inv
            else:
                log_w[i, j] = -np.inf


@njit(cache=True, nogil=True)
def hat_row_measures(scores_hat, sharpness, allowed, log_p, p, log_q, q, kl, tv, js, top1, top_p, k_row, overlap,
                     keep_log_q=True):
    """The quantized side's attention and its distances to the reference, row by row.

    Writes ``log_q`` and ``q`` (as :func:`log_softmax_rows` of ``sharpness * scores_hat``) and per
    row ``kl = sum_j p_j (log p_j - log q_j)`` over ``p_j > 0``; ``tv = sum_j |p_j - q_j| / 2``;
    ``js = 1/2 sum_j m_j g(r_j)`` with ``m_j = (p_j + q_j) / 2`` and ``r_j = (p_j - q_j) /
    (p_j + q_j)`` (:func:`js_term`); ``top1`` = 1.0 when the first maxima of ``log_p`` and
    ``log_q`` over the allowed entries coincide; ``overlap``: how many of the reference's top
    ``k_row[i]`` (``top_p``, from :func:`topk_rows`) are among the ``k_row[i]`` largest ``q``
    (:func:`topk_rows`'s sets, kept while ``q`` is written). Masked entries count nowhere. With
    ``keep_log_q`` False, ``log_q`` is not written (a caller without a per-key table passes a
    ``(1, 1)`` array: the log-weights would be written only to be dropped). The reference
    takes ``m`` and ``r`` from the log-probabilities (``tanh`` of half their difference) to stay
    accurate where weights underflow; from the weights they agree to rounding wherever ``p_j +
    q_j`` is a normal number, and below that the term is under 1e-308. The clamps of the
    reference (KL rounding to 0, ``tv <= 1``, ``0 <= js <= ln 2``) are the caller's.
    """
    n_rows, n_keys = scores_hat.shape
    vals = np.empty(top_p.shape[1])
    top_q = np.empty(top_p.shape[1], dtype=np.int64)
    for i in range(n_rows):
        k = k_row[i]
        count = 0
        peak, total = _shifted_exp(scores_hat[i], sharpness, allowed[i], q[i])
        lse = math.log(total)
        inv = 1.0 / total
        kl_i = 0.0
        tv_i = 0.0
        js_i = 0.0
        best_p = -np.inf
        best_q = -np.inf
        arg_p = -1
        arg_q = -1
        for j in range(n_keys):
            if not allowed[i, j]:
                if keep_log_q:
                    log_q[i, j] = -np.inf
                continue
            lq = (sharpness * scores_hat[i, j] - peak) - lse
            qj = q[i, j] * inv
            if keep_log_q:
                log_q[i, j] = lq
            q[i, j] = qj
            count = top_insert(vals, top_q, count, k, qj, j)
            lp = log_p[i, j]
            pj = p[i, j]
            if pj > 0.0:
                kl_i += pj * (lp - lq)
            if pj + qj > 0.0:
                tv_i += abs(pj - qj)
                js_i += js_term(pj, qj, lp, lq)
            if lp > best_p:
                best_p = lp
                arg_p = j
            if lq > best_q:
                best_q = lq
                arg_q = j
        kl[i] = kl_i
        tv[i] = 0.5 * tv_i
        js[i] = 0.5 * js_i
        top1[i] = 1.0 if arg_p == arg_q else 0.0
        same = 0
        for a in range(k):
            for b in range(k):
                if top_p[i, a] == top_q[b]:
                    same += 1
                    break
        overlap[i] = same


#: Sums of squares inside this open interval need no rescaling (as :func:`kvasym.metrics._norms`).
_SAFE_LOW, _SAFE_HIGH = 1e-290, 1e290


@njit(cache=True, nogil=True, inline="always")
def _unsafe(squares):
    return squares != 0.0 and not (_SAFE_LOW < squares < _SAFE_HIGH)


@njit(cache=True, nogil=True)
def row_errors(a, b, norm_a, norm_diff, phi):
    """Per row of ``(rows, d)`` float64 ``a`` and its estimate ``b``: ``||a||``, ``||a - b||``
    and the angle ``2 atan2(||u - v||, ||u + v||)`` of the unit vectors (Kahan), as
    :func:`kvasym.metrics._error_coordinates` computes them in five whole-matrix passes; two
    passes over each row here, sums in row order. Returns False, having written part of the
    outputs, when a row's sum of squares (of a, b, a - b, u - v or u + v) is non-zero and outside
    ``(1e-290, 1e290)``: the reference then rescales, and the caller runs it instead."""
    rows, d = a.shape
    for i in range(rows):
        sa = 0.0
        sb = 0.0
        sd = 0.0
        for j in range(d):
            x = a[i, j]
            y = b[i, j]
            sa += x * x
            sb += y * y
            sd += (x - y) * (x - y)
        if _unsafe(sa) or _unsafe(sb) or _unsafe(sd):
            return False
        na = math.sqrt(sa)
        nb = math.sqrt(sb)
        norm_a[i] = na
        norm_diff[i] = math.sqrt(sd)
        if (na > 0.0) != (nb > 0.0):
            phi[i] = 0.5 * math.pi
            continue
        if na == 0.0:
            phi[i] = 0.0
            continue
        minus = 0.0
        plus = 0.0
        for j in range(d):
            u = a[i, j] / na
            v = b[i, j] / nb
            minus += (u - v) * (u - v)
            plus += (u + v) * (u + v)
        if _unsafe(minus) or _unsafe(plus):
            return False
        phi[i] = 2.0 * math.atan2(math.sqrt(minus), math.sqrt(plus))
    return True
