"""The numba-jitted loops of :mod:`kvasym.stats` and :mod:`kvasym.metrics` (imported only when used).

Module level, like :mod:`kvasym._kernels_numba`, so that numba's on-disk cache (``cache=True``)
finds them again in a fresh process. Each one repeats, operation for operation, the numpy loop
it replaces (kept in :mod:`kvasym.stats` as the reference): the same IEEE additions,
multiplications and divisions on the same float64 values in the same order (numba does not
fuse a multiply and an add unless asked to, and nothing here asks), and numpy's pairwise
summation (:func:`pairwise_sum`) where numpy sums an array, so the results are bit-identical
(``tests/test_stats.py`` compares them with ``==``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: numpy's pairwise summation block (``PW_BLOCKSIZE`` in numpy's ``loops_utils.h.src``).
_PW_BLOCKSIZE = 128


@njit(cache=True, nogil=True)
def _block_sum(a, lo, n):
    # numpy's leaf (n <= 128): a plain loop below 8, else 8 interleaved accumulators
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    r0 = a[lo]
    r1 = a[lo + 1]
    r2 = a[lo + 2]
    r3 = a[lo + 3]
    r4 = a[lo + 4]
    r5 = a[lo + 5]
    r6 = a[lo + 6]
    r7 = a[lo + 7]
    i = 8
    end = n - (n % 8)
    while i < end:
        r0 += a[lo + i]
        r1 += a[lo + i + 1]
        r2 += a[lo + i + 2]
        r3 += a[lo + i + 3]
        r4 += a[lo + i + 4]
        r5 += a[lo + i + 5]
        r6 += a[lo + i + 6]
        r7 += a[lo + i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


@njit(cache=True, nogil=True)
def pairwise_sum(a, lo, n):
    """``np.sum(a[lo:lo + n])`` of a contiguous float64 array, with numpy's exact order of
    additions: 8 interleaved accumulators on blocks of at most 128, halves (rounded down to a
    multiple of 8) above that, ``sum(left) + sum(right)``.

    The halving recursion runs on an explicit stack (:func:`pairwise_sum_windows`, with one window
    covering the whole range)."""
    return pairwise_sum_windows(a, lo, n, lo, lo + n, 0, 0)


@njit(cache=True, nogil=True)
def ks_exact_ties_tail(is_end, i_all, x_step, i_times_n, m, n, h_obs):
    """The exiting mass ``p`` of :func:`kvasym.stats.ks_2samp_exact_ties`'s lattice recursion
    (its numpy loop, step for step; the arguments are the arrays that loop builds).

    Step k computes each ``new[i] = (u[i] (i + n - k + 1) + u[i - 1] (m - i + 1)) / (N - k + 1)``
    with the numpy loop's roundings, only where it can be non-zero: inside the band ``max(0, k -
    n) <= i <= min(k, m)`` of lattice points and inside the support of ``u`` grown by one (each
    step moves mass from ``i - 1`` to ``i`` at most). Everywhere else the numpy loop multiplies
    zeros and gets +0. At a block end the boundary hits are the two index ranges
    ``|i N - k m| >= h``, ``i <= A`` and ``i >= B``; they are summed pairwise as numpy sums
    ``new[hit]``, zeros included, except that a sub-range of the pairwise tree holding only
    zeros is not visited (numpy's sum of it is +0, and ``x + 0 = x``), and what stays is the new
    support: paths that stay inside the band. With continuous data (every step an end) the
    support is the band of width about ``2 D m``, so the work is ``D`` of the full lattice's,
    and once every path has exited the loop stops.
    """
    big_n = m + n
    u = np.zeros(m + 1)
    u[0] = 1.0
    new = np.zeros(m + 1)
    hit = np.zeros(m + 1)  # zero but where a block end writes its hits (and clears them again)
    lo = 0  # u is zero outside [lo, hi]
    hi = 0
    dirty_lo = 0  # new (u two steps ago) may be non-zero only in [dirty_lo, dirty_hi]
    dirty_hi = -1
    p = 0.0
    for k in range(1, big_n + 1):
        c = float(n - k + 1)
        d = float(big_n - k + 1)
        a0 = max(max(0, k - n), lo)
        a1 = min(min(k, m), hi + 1)
        for i in range(dirty_lo, min(dirty_hi, a0 - 1) + 1):  # stale values left of the new support
            new[i] = 0.0
        for i in range(max(dirty_lo, a1 + 1), dirty_hi + 1):  # and right of it
            new[i] = 0.0
        if a0 == 0:
            new[0] = u[0] * (i_all[0] + c) / d
            first = 1
        else:
            first = a0
        for i in range(first, a1 + 1):
            new[i] = (u[i] * (i_all[i] + c) + u[i - 1] * x_step[i]) / d
        dirty_lo, dirty_hi = lo, hi
        lo, hi = a0, a1
        if is_end[k]:
            km = k * m
            # hits: i N <= k m - h (i <= low_end) and i N >= k m + h (i >= high_start)
            low_end = (km - h_obs) // big_n if km >= h_obs else -1
            low_end = min(low_end, m)
            high_start = max(-(-(km + h_obs) // big_n), low_end + 1)
            count = (low_end + 1) + max(0, m - high_start + 1)
            # the non-zero hits: positions [w0, w1) (from i in [lo, min(hi, low_end)]) and
            # [w2, w3) (from i in [max(lo, high_start), hi]), offset by the low range's length
            w0 = lo
            w1 = min(hi, low_end) + 1
            if w1 < w0:
                w1 = w0
            h0 = max(lo, high_start)
            w2 = (low_end + 1) + (h0 - high_start)
            w3 = (low_end + 1) + (hi - high_start) + 1
            if w3 < w2:
                w3 = w2
            for q in range(w0, w1):
                hit[q] = new[q]
                new[q] = 0.0
            for q in range(w2, w3):
                i = high_start + (q - low_end - 1)
                hit[q] = new[i]
                new[i] = 0.0
            p += pairwise_sum_windows(hit, 0, count, w0, w1, w2, w3)
            for q in range(w0, w1):
                hit[q] = 0.0
            for q in range(w2, w3):
                hit[q] = 0.0
            lo = max(lo, low_end + 1)
            hi = min(hi, high_start - 1)
        u, new = new, u
        if lo > hi:  # every path has exited: nothing more can be added
            break
    return p


@njit(cache=True, nogil=True)
def pairwise_sum_windows(a, lo, n, w0, w1, w2, w3):
    """``np.sum(a[lo:lo + n])`` in numpy's pairwise order (a leaf of up to 128 values summed by
    :func:`_block_sum`, a longer range split at half its length rounded down to a multiple of
    8) of an array that is zero outside ``[w0, w1)`` and ``[w2, w3)``: a node of the tree whose
    range misses both windows is +0 (what numpy's sum of zeros gives) and is not visited. The
    halving recursion runs on an explicit stack: numba's disk cache crashes the process
    (segmentation fault) when it reloads a recursive function."""
    if n <= _PW_BLOCKSIZE:
        return _block_sum(a, lo, n)
    f_lo = np.empty(64, dtype=np.int64)
    f_n = np.empty(64, dtype=np.int64)
    f_left = np.empty(64)
    f_stage = np.zeros(64, dtype=np.int64)
    top = 0
    f_lo[0] = lo
    f_n[0] = n
    while True:
        cn = f_n[top]
        clo = f_lo[top]
        empty = not ((clo < w1 and w0 < clo + cn and w0 < w1) or (clo < w3 and w2 < clo + cn and w2 < w3))
        if cn > _PW_BLOCKSIZE and not empty:  # descend into the left half
            half = cn // 2
            half -= half % 8
            top += 1
            f_lo[top] = clo
            f_n[top] = half
            f_stage[top] = 0
            continue
        value = 0.0 if empty else _block_sum(a, clo, cn)
        top -= 1
        while top >= 0 and f_stage[top] == 1:
            value = f_left[top] + value
            top -= 1
        if top < 0:
            return value
        f_left[top] = value
        f_stage[top] = 1
        half = f_n[top] // 2
        half -= half % 8
        top += 1
        f_lo[top] = f_lo[top - 1] + half
        f_n[top] = f_n[top - 1] - half
        f_stage[top] = 0


@njit(cache=True, nogil=True, inline="always")
def top_insert(vals, idx, count, k, v, j):
    """Keep the running top ``k`` of a row scanned in index order (values ``vals``, indices
    ``idx``, ``count`` kept so far): the rule of :func:`topk_overlap`, an entry
    enters only if strictly above the current k-th (an equal earlier entry ranks first).
    Returns the new count."""
    if count == k and not v > vals[k - 1]:
        return count
    pos = count if count < k else k - 1
    while pos > 0 and vals[pos - 1] < v:
        vals[pos] = vals[pos - 1]
        idx[pos] = idx[pos - 1]
        pos -= 1
    vals[pos] = v
    idx[pos] = j
    return count + 1 if count < k else count


@njit(cache=True, nogil=True)
def topk_overlap(p, p_hat, allowed, k_row):
    """Per row i, ``|topk(p_i) & topk(p_hat_i)|`` over the allowed entries, ``k_row[i]`` each, ties
    to the lower index: :func:`kvasym.metrics.topk_recall`'s sets (the first ``k`` of a stable
    descending sort of the row, masked entries below every allowed one), by one scan per row
    that keeps the running top ``k`` (an entry enters only if strictly above the current k-th,
    since an equal earlier entry ranks first). Pure comparisons: the counts are exact."""
    n_rows, n_keys = p.shape
    out = np.zeros(n_rows, dtype=np.int64)
    kmax = 1
    for i in range(n_rows):
        kmax = max(kmax, k_row[i])
    vals = np.empty(kmax)
    idx_a = np.empty(kmax, dtype=np.int64)
    idx_b = np.empty(kmax, dtype=np.int64)
    for i in range(n_rows):
        k = k_row[i]
        for side in range(2):
            row = p[i] if side == 0 else p_hat[i]
            idx = idx_a if side == 0 else idx_b
            count = 0
            for j in range(n_keys):
                if allowed[i, j]:
                    count = top_insert(vals, idx, count, k, row[j], j)
        same = 0
        for a in range(k):
            for b in range(k):
                if idx_a[a] == idx_b[b]:
                    same += 1
                    break
        out[i] = same
    return out
