"""The numba-jitted row kernels of :mod:`kvasym.kernels` (imported only when they are used).

They live at module level so that numba's on-disk cache (``cache=True``) finds them again in a
fresh process: functions defined inside another function are recompiled by every job (1.6 s).
The arithmetic and its equality with the numpy reference are documented in :mod:`kvasym.kernels`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: Rows per block inside a kernel: the (D, BLOCK) buffer stays in L2 for D <= 1024 (32 measured
#: fastest of 8, 16, 32 and 64 at d = 128 on this 2-core machine).
BLOCK = 32


@njit(cache=True, nogil=True)
def fwht_block(u, width):
    # u is (D, BLOCK): one column per row of the batch, so every butterfly is a contiguous
    # vector over the block's rows (SIMD), not a scalar walk along one row
    n = u.shape[0]
    h = 1
    while h < n:
        for i in range(0, n, 2 * h):
            for j in range(i, i + h):
                for b in range(width):
                    a = u[j, b]
                    c = u[j + h, b]
                    u[j, b] = a + c
                    u[j + h, b] = a - c
        h *= 2

@njit(cache=True, nogil=True)
def fwht_scale_block(u, factors, width):
    # u <- diag(factors) H u: an inverse rotation's WHT and its premultiplied signs / sqrt(D)
    fwht_block(u, width)
    for j in range(u.shape[0]):
        f = factors[j]
        for b in range(width):
            u[j, b] = u[j, b] * f


@njit(cache=True, nogil=True)
def store_scaled_rows(u, row_scale, out, start, width, dim):
    # rows start .. start + width of out <- the block's first dim coordinates times their scale
    for b in range(width):
        c = row_scale[start + b]
        for j in range(dim):
            out[start + b, j] = u[j, b] * c


@njit(cache=True, nogil=True)
def encode_rows(x, inv, signs, scale, rotate, thresholds, bits, out, centroids, resid, want_resid, r0, r1):
    dim = x.shape[1]
    work = signs.size if rotate else dim
    n_t = thresholds.size
    u = np.zeros((work, BLOCK), dtype=x.dtype)
    codes = np.zeros((work, BLOCK), dtype=np.uint8)
    groups = np.zeros(BLOCK, dtype=np.uint64)
    for start in range(r0, r1, BLOCK):
        width = min(BLOCK, r1 - start)
        for b in range(width):
            s = inv[start + b]
            if rotate:  # the sign flip is exact, so it joins the normalization
                for j in range(dim):
                    u[j, b] = (x[start + b, j] * s) * signs[j]
            else:
                for j in range(dim):
                    u[j, b] = x[start + b, j] * s
            for j in range(dim, work):
                u[j, b] = 0
        if rotate:
            fwht_block(u, width)
        # code = #{t <= u} (searchsorted side="right"), branch-free so that it runs as
        # vectors over the block: up to 15 thresholds, count them (compare-and-add, no
        # gather); beyond, a binary search over the 2^bits - 1 thresholds, one step per bit
        for j in range(work):
            for b in range(width):
                if rotate:
                    u[j, b] = u[j, b] * scale
                codes[j, b] = 0
            if n_t <= 15:
                for k in range(n_t):
                    t = thresholds[k]
                    for b in range(width):
                        codes[j, b] += u[j, b] >= t
            else:
                step = (n_t + 1) >> 1
                while step > 0:
                    for b in range(width):
                        codes[j, b] += step * (thresholds[codes[j, b] + step - 1] <= u[j, b])
                    step >>= 1
        if want_resid:
            for b in range(width):
                for j in range(work):
                    resid[start + b, j] = u[j, b] - centroids[codes[j, b]]
        if work % 8 == 0:
            # 8 codes fill exactly `bits` bytes: build each group as a uint64 over the block's
            # rows (vector lanes), then split it into its bytes
            for g in range(work // 8):
                for b in range(width):
                    groups[b] = 0
                for t in range(8):
                    shift = np.uint64(t * bits)
                    for b in range(width):
                        groups[b] |= np.uint64(codes[8 * g + t, b]) << shift
                for q in range(bits):
                    shift = np.uint64(8 * q)
                    for b in range(width):
                        out[start + b, g * bits + q] = np.uint8((groups[b] >> shift) & np.uint64(0xFF))
            continue
        for b in range(width):
            row = out[start + b]
            acc = np.uint64(0)
            filled = 0
            k = 0
            for j in range(work):
                acc |= np.uint64(codes[j, b]) << np.uint64(filled)
                filled += bits
                while filled >= 8:
                    row[k] = np.uint8(acc & np.uint64(0xFF))
                    acc >>= np.uint64(8)
                    filled -= 8
                    k += 1
            if filled > 0:
                row[k] = np.uint8(acc & np.uint64(0xFF))


@njit(cache=True, nogil=True)
def decode_rows(packed, bits, centroids, add, has_add, sign_scale, rotate, norms, out, r0, r1):
    dim = out.shape[1]
    work = sign_scale.size if rotate else dim
    mask = np.uint64((1 << bits) - 1)
    u = np.zeros((work, BLOCK), dtype=out.dtype)
    groups = np.zeros(BLOCK, dtype=np.uint64)
    for start in range(r0, r1, BLOCK):
        width = min(BLOCK, r1 - start)
        if work % 8 == 0:  # the inverse of encode_rows' grouped packing, over the block's rows
            for g in range(work // 8):
                for b in range(width):
                    groups[b] = 0
                for q in range(bits):
                    shift = np.uint64(8 * q)
                    for b in range(width):
                        groups[b] |= np.uint64(packed[start + b, g * bits + q]) << shift
                for t in range(8):
                    shift = np.uint64(t * bits)
                    for b in range(width):
                        u[8 * g + t, b] = centroids[(groups[b] >> shift) & mask]
        else:
            for b in range(width):
                row = packed[start + b]
                acc = np.uint64(0)
                filled = 0
                k = 0
                for j in range(work):
                    while filled < bits:
                        acc |= np.uint64(row[k]) << np.uint64(filled)
                        filled += 8
                        k += 1
                    u[j, b] = centroids[acc & mask]
                    acc >>= np.uint64(bits)
                    filled -= bits
        if has_add:
            for b in range(width):
                for j in range(work):
                    u[j, b] = u[j, b] + add[start + b, j]
        if rotate:
            fwht_scale_block(u, sign_scale, width)
        store_scaled_rows(u, norms, out, start, width, dim)


@njit(cache=True, nogil=True)
def sketch_encode_rows(resid, s1, s2, scale, out, rho, r0, r1):
    # W r = R2 R1 r with R_k = H diag(s_k) / sqrt(D), then the sign bits (set = negative, bit j
    # of byte j // 8) and rho = sqrt(D) ||r||^2 / ||W r||_1 accumulated in float64; every pass
    # after the first runs over the block's rows as the inner (vector) loop
    work = resid.shape[1]
    n_bytes = out.shape[1]
    root = np.sqrt(np.float64(work))
    u = np.zeros((work, BLOCK), dtype=resid.dtype)
    squares = np.zeros(BLOCK)
    l1 = np.zeros(BLOCK)
    acc = np.zeros(BLOCK, dtype=np.uint8)
    for start in range(r0, r1, BLOCK):
        width = min(BLOCK, r1 - start)
        for b in range(width):
            total = 0.0
            for j in range(work):
                r = resid[start + b, j]
                u[j, b] = r * s1[j]
                total += np.float64(r) * np.float64(r)
            squares[b] = total
        fwht_block(u, width)
        for j in range(work):
            sj = s2[j]
            for b in range(width):
                u[j, b] = (u[j, b] * scale) * sj
        fwht_block(u, width)
        for b in range(width):
            l1[b] = 0.0
        for j in range(work):
            for b in range(width):
                v = u[j, b] * scale
                u[j, b] = v
                l1[b] += np.float64(abs(v))
        for k in range(n_bytes):
            for b in range(width):
                acc[b] = 0
            for t in range(min(8, work - 8 * k)):
                j = 8 * k + t
                for b in range(width):
                    acc[b] |= np.uint8(u[j, b] < 0) << np.uint8(t)
            for b in range(width):
                out[start + b, k] = acc[b]
        for b in range(width):
            rho[start + b] = root * squares[b] / l1[b] if l1[b] > 0 else 0.0


@njit(cache=True, nogil=True)
def sketch_decode_rows(packed, sign_scale2, sign_scale1, row_scale, out, r0, r1):
    # r_hat = rho / sqrt(D) * R1^T R2^T sign, R_k^T = diag(s_k) H / sqrt(D): the same passes as
    # two RandomizedHadamard.inverse calls (signs and 1/sqrt(D) premultiplied in the dtype)
    work = out.shape[1]
    n_bytes = packed.shape[1]
    u = np.zeros((work, BLOCK), dtype=out.dtype)
    for start in range(r0, r1, BLOCK):
        width = min(BLOCK, r1 - start)
        for k in range(n_bytes):
            for t in range(min(8, work - 8 * k)):
                j = 8 * k + t
                for b in range(width):
                    u[j, b] = 1 - 2 * ((packed[start + b, k] >> t) & 1)
        fwht_scale_block(u, sign_scale2, width)
        fwht_scale_block(u, sign_scale1, width)
        store_scaled_rows(u, row_scale, out, start, width, work)
