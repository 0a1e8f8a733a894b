"""The numba-jitted row kernels of :mod:`kvasym.kernels` (imported only when they are used).

They live at module level so that numba's on-disk cache (``cache=True``) finds them again in a
fresh process: functions defined inside another function are recompiled by every job (1.6 s).
The arithmetic and its equality with the numpy reference are documented in :mod:`kvasym.kernels`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: Rows per block inside a kernel: the (D, BLOCK) buffer stays in L2 for D <= 1024 (32 measured
#: fastest of 8, 16, 32 and 64 at d = 128 and 1024 on this 2-core machine).
BLOCK = 32
#: Coordinates per tile of a transpose between a row and the (D, BLOCK) buffer: the TILE buffer
#: lines a tile touches stay in L1 while the block's rows pass (at D = 1024 a row-by-row
#: transpose touched all 1024 lines of the 128 KiB buffer per row and took 4x as long).
TILE = 16
#: Rows of the (D, BLOCK) buffer that the WHT's first stages (h < SLAB) finish before it moves
#: on: 32 rows of 32 float32 or float64 are 4-8 KiB, in L1 with room to spare.
SLAB = 32


@njit(cache=True, nogil=True)
def fwht_block(u, width):
    # u is (D, BLOCK): one column per row of the batch, so every butterfly is a contiguous
    # vector over the block's rows (SIMD), not a scalar walk along one row. The stages h < SLAB
    # run slab by slab (SLAB rows of the buffer, which stay in L1 through all of them), the
    # rest over the whole buffer, three at a time as radix-8 passes: each butterfly adds the
    # same numbers in the same order as the textbook radix-2 sequence (so the same bits), with
    # fewer trips of the buffer through the cache (at D = 1024 it does not fit L1)
    n = u.shape[0]
    if n > SLAB:
        for base in range(0, n, SLAB):
            fwht_stages(u, width, 1, base, SLAB)
        fwht_stages(u, width, SLAB, 0, n)
    else:
        fwht_stages(u, width, 1, 0, n)


@njit(cache=True, nogil=True)
def fwht_stages(u, width, h, base, n):
    # the butterfly stages h, 2h, ... < n of rows base .. base + n of u
    while 8 * h <= n:  # stages h, 2h, 4h in registers: one pass instead of three
        for i in range(base, base + n, 8 * h):
            for j in range(i, i + h):
                for b in range(width):
                    a0, a1 = _sum_diff(u[j, b], u[j + h, b])  # stage h
                    a2, a3 = _sum_diff(u[j + 2 * h, b], u[j + 3 * h, b])
                    a4, a5 = _sum_diff(u[j + 4 * h, b], u[j + 5 * h, b])
                    a6, a7 = _sum_diff(u[j + 6 * h, b], u[j + 7 * h, b])
                    c0, c2 = _sum_diff(a0, a2)  # stage 2h
                    c1, c3 = _sum_diff(a1, a3)
                    c4, c6 = _sum_diff(a4, a6)
                    c5, c7 = _sum_diff(a5, a7)
                    u[j, b], u[j + 4 * h, b] = _sum_diff(c0, c4)  # stage 4h
                    u[j + h, b], u[j + 5 * h, b] = _sum_diff(c1, c5)
                    u[j + 2 * h, b], u[j + 6 * h, b] = _sum_diff(c2, c6)
                    u[j + 3 * h, b], u[j + 7 * h, b] = _sum_diff(c3, c7)
        h *= 8
    if 4 * h <= n:  # two stages left
        for i in range(base, base + n, 4 * h):
            for j in range(i, i + h):
                for b in range(width):
                    a0, a1 = _sum_diff(u[j, b], u[j + h, b])
                    a2, a3 = _sum_diff(u[j + 2 * h, b], u[j + 3 * h, b])
                    u[j, b], u[j + 2 * h, b] = _sum_diff(a0, a2)
                    u[j + h, b], u[j + 3 * h, b] = _sum_diff(a1, a3)
    elif 2 * h <= n:  # one stage left
        for j in range(base, base + h):
            for b in range(width):
                u[j, b], u[j + h, b] = _sum_diff(u[j, b], u[j + h, b])


@njit(cache=True, nogil=True, inline="always")
def _sum_diff(a, c):
    # one butterfly: (a + c, a - c)
    return a + c, a - c


@njit(cache=True, nogil=True)
def fwht_scale_block(u, factors, width):
    # u <- diag(factors) H u: an inverse rotation's WHT and its premultiplied signs / sqrt(D)
    fwht_block(u, width)
    for j in range(u.shape[0]):
        f = factors[j]
        for b in range(width):
            u[j, b] = u[j, b] * f


@njit(cache=True, nogil=True)
def store_scaled_rows(u, factors, row_scale, out, start, width, dim):
    # rows start .. start + width of out <- the block's first dim coordinates times their row's
    # scale; with factors (None is pruned when compiling) (u * factors[j]) * scale, the two
    # roundings of fwht_scale_block's pass and the store in their order (so the same bits),
    # without a pass over the buffer between them. Unsigned indices: no wraparound code
    first = np.uint64(start)
    for b in range(width):
        row = first + np.uint64(b)
        lane = np.uint64(b)
        c = row_scale[row]
        for j in range(dim):
            uj = np.uint64(j)
            if factors is None:
                out[row, uj] = u[uj, lane] * c
            else:
                out[row, uj] = (u[uj, lane] * factors[uj]) * c


@njit(cache=True, nogil=True)
def load_rows(x, u, start, width, dim):
    # u[:dim, :width] <- rows start .. start + width of x, transposed tile by tile. The indices
    # are unsigned, which spares numba's negative-index wraparound (a shift, an and and an add
    # per index of this scalar loop): alone over a float32 batch streamed from memory 0.44
    # instead of 0.66 ns per coordinate at d = 128, 0.44 instead of 0.63 at 1024. (Row by row,
    # reading the batch in order, took 0.33 alone at d = 128 but made the RKV encode slower)
    first = np.uint64(start)
    for j0 in range(0, dim, TILE):
        j1 = min(j0 + TILE, dim)
        for b in range(width):
            row = first + np.uint64(b)
            lane = np.uint64(b)
            for j in range(j0, j1):
                uj = np.uint64(j)
                u[uj, lane] = x[row, uj]


@njit(cache=True, nogil=True)
def block_norms(u, dim, width, is_f32, f32_max, exact, stored, inv, start):
    # float64 sums of squares over the block's rows (one sequential sum per row, the rows as
    # vector lanes), their norms, the float32-stored norms and the reciprocals the encode uses;
    # False when a row needs the reference path (non-finite, outside the plain sum's safe range
    # for float64 input, a norm float32 cannot keep, or a float32 1/norm that overflows)
    squares = np.zeros(BLOCK)
    for j in range(dim):
        for b in range(width):
            v = np.float64(u[j, b])
            squares[b] += v * v
    ok = True
    for b in range(width):
        sq = squares[b]
        if not np.isfinite(sq):
            ok = False
        elif not is_f32 and sq != 0.0 and not (sq > 1e-290 and sq < 1e290):
            ok = False
        elif not is_f32 and sq == 0.0:
            # every square underflowed (entries below ~1e-162) or the row is zero: only a zero
            # row may be stored with norm 0; the reference rescales the others (and refuses
            # what float32 cannot keep), so they take its path (issue 33, point 2)
            for j in range(dim):
                if u[j, b] != 0.0:
                    ok = False
                    break
        norm = np.sqrt(sq)
        kept = np.float32(norm)
        k64 = np.float64(kept)
        if norm > f32_max or (norm > 0.0 and k64 == 0.0):  # as store_norms: above max, not rounded to it
            ok = False
        r = 1.0 / k64 if k64 > 0.0 else 0.0
        if is_f32 and r > f32_max:
            ok = False
        exact[start + b] = norm
        stored[start + b] = kept
        inv[start + b] = r
    return ok


@njit(cache=True, nogil=True)
def threshold_codes(u, codes, counts, thresholds, width, work):
    # code = #{t <= u} (searchsorted side="right"), branch-free over the block's rows. A
    # codebook of b <= 4 bits has 2^b - 1 = 1, 3, 7 or 15 thresholds: each count is written out
    # with the thresholds as scalars, vectorised over the rows (the loop over the thresholds,
    # adding into an int32 count array, was slower: a 4-bit quantize of 8M float32
    # coordinates at d = 1024 took 29.5 ms with it, 22.5 ms with this)
    n_t = thresholds.size
    if n_t == 1:
        t0 = thresholds[0]
        for j in range(work):
            for b in range(width):
                codes[j, b] = np.uint8(_ge(u[j, b], t0))
    elif n_t == 3:
        t0, t1, t2 = thresholds[0], thresholds[1], thresholds[2]
        for j in range(work):
            for b in range(width):
                x = u[j, b]
                codes[j, b] = np.uint8(_ge(x, t0) + _ge(x, t1) + _ge(x, t2))
    elif n_t == 7:  # in halves, as 15 below: a compare with t3, then 3 (0.20 instead of 0.59 ns)
        t0, t1, t2, t3, t4, t5, t6 = (thresholds[0], thresholds[1], thresholds[2], thresholds[3], thresholds[4],
                                      thresholds[5], thresholds[6])
        for j in range(work):
            for b in range(width):
                x = u[j, b]
                up = x >= t3
                codes[j, b] = np.uint8(4 * np.int32(up) + _ge(x, t4 if up else t0) + _ge(x, t5 if up else t1)
                                       + _ge(x, t6 if up else t2))
    elif n_t == 15:
        # the thresholds increase, so a value at or above the middle one, t7, is at or above
        # t0 .. t7 and its code is 8 + its count over t8 .. t14; one below t7 is below t8 ..
        # t14 and counts over t0 .. t6. So a compare with t7 picks the half, one with its
        # middle (t11 or t3, blended into the lanes) the quarter, and its 3 thresholds are
        # counted: 5 compares and 10 blends instead of 15 compares, the same code (ties and NaN
        # too). Alone on an L1 block at d = 128: 0.38 instead of 0.62 ns per coordinate (7
        # compares in halves, 0.44)
        t0, t1, t2, t3, t4, t5, t6, t7 = (thresholds[0], thresholds[1], thresholds[2], thresholds[3], thresholds[4],
                                          thresholds[5], thresholds[6], thresholds[7])
        t8, t9, t10, t11, t12, t13, t14 = (thresholds[8], thresholds[9], thresholds[10], thresholds[11],
                                           thresholds[12], thresholds[13], thresholds[14])
        for j in range(work):
            for b in range(width):
                x = u[j, b]
                up = x >= t7
                up2 = x >= (t11 if up else t3)
                c0 = (t12 if up2 else t8) if up else (t4 if up2 else t0)
                c1 = (t13 if up2 else t9) if up else (t5 if up2 else t1)
                c2 = (t14 if up2 else t10) if up else (t6 if up2 else t2)
                codes[j, b] = np.uint8(8 * np.int32(up) + 4 * np.int32(up2) + _ge(x, c0) + _ge(x, c1) + _ge(x, c2))
    elif n_t < 15:  # not a codebook's count, kept general: the counts in int32 lanes
        for j in range(work):
            for b in range(width):
                counts[b] = 0
            for k in range(n_t):
                t = thresholds[k]
                for b in range(width):
                    counts[b] += np.int32(u[j, b] >= t)
            for b in range(width):
                codes[j, b] = counts[b]
    else:  # a binary search over the 2^bits - 1 thresholds, one step per bit
        for j in range(work):
            for b in range(width):
                codes[j, b] = 0
            step = (n_t + 1) >> 1
            while step > 0:
                for b in range(width):
                    codes[j, b] += step * (thresholds[codes[j, b] + step - 1] <= u[j, b])
                step >>= 1


@njit(cache=True, nogil=True, inline="always")
def _ge(x, t):
    # 1 if the threshold t is at or below x (a value equal to a threshold goes up), as an int32
    return np.int32(x >= t)


@njit(cache=True, nogil=True)
def encode_rows(x, inv, signs, scale, rotate, thresholds, bits, out, centroids, resid, want_resid, fuse_norms,
                exact, stored, ok, sketch, sk_s1, sk_s2, sk_out, sk_rho, r0, r1):
    # with fuse_norms the norms are computed here (exact, stored, inv are outputs); ok[0] is
    # cleared and the kernel stops at the first block with a row the caller must redo; with
    # sketch the residual's hadamard sketch (sk_out, sk_rho) is taken from the block buffer
    # (the residual never goes to memory)
    dim = x.shape[1]
    work = signs.size if rotate else dim
    u = np.zeros((work, BLOCK), dtype=x.dtype)
    codes = np.zeros((work, BLOCK), dtype=np.uint8)
    groups = np.zeros(BLOCK, dtype=np.uint64)
    words = np.zeros(BLOCK, dtype=np.uint32)
    row_inv = np.zeros(BLOCK, dtype=x.dtype)
    counts = np.zeros(BLOCK, dtype=np.int32)
    squares = np.zeros(BLOCK)
    l1 = np.zeros(BLOCK)
    sk_acc = np.zeros(BLOCK, dtype=np.uint8)
    sk_root = np.sqrt(np.float64(work))
    is_f32 = x.itemsize == 4
    f32_max = np.float64(np.finfo(np.float32).max)
    for start in range(r0, r1, BLOCK):
        width = min(BLOCK, r1 - start)
        load_rows(x, u, start, width, dim)
        if fuse_norms and not block_norms(u, dim, width, is_f32, f32_max, exact, stored, inv, start):
            ok[0] = False
            return
        for b in range(width):
            row_inv[b] = inv[start + b]  # rounded to the dtype, as the reference's inv.astype
        normalize_block(u, row_inv, signs, rotate, dim, work, width)
        if rotate:
            fwht_block(u, width)
            for j in range(work):
                for b in range(width):
                    u[j, b] = u[j, b] * scale
        threshold_codes(u, codes, counts, thresholds, width, work)
        if want_resid:
            for j0 in range(0, work, TILE):
                for b in range(width):
                    for j in range(j0, min(j0 + TILE, work)):
                        resid[start + b, j] = u[j, b] - centroids[codes[j, b]]
        if sketch:
            for j in range(work):
                for b in range(width):
                    u[j, b] = u[j, b] - centroids[codes[j, b]]
            sketch_block(u, width, sk_s1, sk_s2, scale, sk_root, sk_out, sk_rho, start, squares, l1, sk_acc)
        if work % 32 == 0:
            pack_words(codes, out.view(np.uint32), start, width, work, bits, words)
            continue
        if work % 8 == 0:
            pack_groups(codes, out, start, width, work, bits, groups)
        else:
            pack_stream(codes, out, start, width, work, bits)


@njit(cache=True, nogil=True, inline="always")
def normalize_block(u, row_inv, signs, rotate, dim, work, width):
    # each row of the block times its inverse norm (rounded to the dtype, as the reference's
    # inv.astype), with the rotation's sign flip, which is exact, in the same product; the rows
    # zero-padded from dim to the work length
    if rotate:
        for j in range(dim):
            sj = signs[j]
            for b in range(width):
                u[j, b] = (u[j, b] * row_inv[b]) * sj
    else:
        for j in range(dim):
            for b in range(width):
                u[j, b] = u[j, b] * row_inv[b]
    for j in range(dim, work):
        for b in range(width):
            u[j, b] = 0


@njit(cache=True, nogil=True, inline="always")
def pack_groups(codes, out, start, width, work, bits, groups):
    # 8 codes fill exactly `bits` bytes: build each group as a uint64 over the block's rows
    # (vector lanes), then split it into its bytes
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


@njit(cache=True, nogil=True, inline="always")
def pack_stream(codes, out, start, width, work, bits):
    # any other length: each row's codes as one little-endian bit stream, byte by byte
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
def pack_words(codes, out32, start, width, work, bits, acc):
    # 32 codes of a row fill exactly `bits` little-endian uint32 words of its packed bytes
    # (out32 is the packed array viewed as uint32): each word is built over the block's rows in
    # uint32 lanes and stored whole (byte by byte, a strided store per byte from uint64 lanes,
    # took 2.4x as long at d = 128, 4 bits); a code that straddles two words starts the next
    # with its high bits. Which codes straddle depends on t only, so every branch is uniform
    # over the lanes
    first = np.uint64(start)
    k = np.uint64(0)
    for g in range(work // 32):
        for b in range(width):
            acc[b] = 0
        filled = 0
        for t in range(32):
            j = 32 * g + t
            shift = np.uint32(filled)
            filled += bits
            if filled < 32:
                for b in range(width):
                    acc[b] |= np.uint32(codes[j, b]) << shift
            else:
                filled -= 32  # the code's bits left over for the next word
                carry = np.uint32(bits - filled)
                for b in range(width):
                    c = np.uint32(codes[j, b])
                    out32[first + np.uint64(b), k] = acc[b] | (c << shift)  # unsigned: no wraparound
                    acc[b] = c >> carry
                k += np.uint64(1)


@njit(cache=True, nogil=True)
def unpack_words(packed32, start, width, work, bits, centroids, u, wbuf):
    # the inverse of pack_words fused with the centroid lookup: u[j, b] = centroids[code j of
    # row start + b]. A group's `bits` words are read into wbuf ((8, BLOCK) uint32, a row per
    # word, the block's rows as lanes), then every code is shifted out of its word (or of two
    # words when it straddles, again a choice that depends on t only). Carrying the bits left
    # over in a lane array took 1.6x as long at d = 128, bytes into uint64 lanes 1.5x
    mask = np.uint32((1 << bits) - 1)
    first = np.uint64(start)
    for g in range(work // 32):
        for q in range(bits):
            col = np.uint64(g * bits + q)
            for b in range(width):
                wbuf[q, b] = packed32[first + np.uint64(b), col]  # unsigned: no wraparound
        for t in range(32):
            p = t * bits
            q = p >> 5
            off = np.uint32(p & 31)
            j = 32 * g + t
            if (p & 31) + bits <= 32:
                for b in range(width):
                    u[j, b] = centroids[(wbuf[q, b] >> off) & mask]
            else:
                back = np.uint32(32 - (p & 31))
                for b in range(width):
                    u[j, b] = centroids[((wbuf[q, b] >> off) | (wbuf[q + 1, b] << back)) & mask]


@njit(cache=True, nogil=True)
def decode_rows(packed, bits, centroids, add, has_add, sign_scale, rotate, norms, out, sketch, sk_packed,
                sk_scale2, sk_scale1, sk_row_scale, r0, r1):
    # with sketch the hadamard sketch's residual estimate is decoded block by block and added
    # to the centroids (as the add array would be, without it going to memory)
    dim = out.shape[1]
    work = sign_scale.size if rotate else dim
    mask = np.uint64((1 << bits) - 1)
    u = np.zeros((work, BLOCK), dtype=out.dtype)
    w = np.zeros((work if sketch else 1, BLOCK), dtype=out.dtype)
    groups = np.zeros(BLOCK, dtype=np.uint64)
    words = np.zeros(BLOCK, dtype=np.uint32)
    wbuf = np.zeros((8, BLOCK), dtype=np.uint32)
    for start in range(r0, r1, BLOCK):
        width = min(BLOCK, r1 - start)
        if work % 32 == 0:
            unpack_words(packed.view(np.uint32), start, width, work, bits, centroids, u, wbuf)
        elif work % 8 == 0:  # the inverse of encode_rows' grouped packing, over the block's rows
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
            for j0 in range(0, work, TILE):
                for b in range(width):
                    for j in range(j0, min(j0 + TILE, work)):
                        u[j, b] = u[j, b] + add[start + b, j]
        if sketch:
            sketch_decode_block(sk_packed, start, width, w, sk_scale2, words)
            for j in range(work):
                f = sk_scale1[j]
                for b in range(width):
                    w[j, b] = (w[j, b] * f) * sk_row_scale[start + b]  # rounded, as the stored add is
                    u[j, b] = u[j, b] + w[j, b]
        if rotate:
            fwht_block(u, width)
            store_scaled_rows(u, sign_scale, norms, out, start, width, dim)
        else:
            store_scaled_rows(u, None, norms, out, start, width, dim)


@njit(cache=True, nogil=True)
def sketch_block(u, width, s1, s2, scale, root, out, rho, start, squares, l1, acc):
    # u[:, :width] holds the block's residuals r (overwritten): W r = R2 R1 r with R_k = H
    # diag(s_k) / sqrt(D), then the sign bits (set = negative, bit j of byte j // 8) and
    # rho = sqrt(D) ||r||^2 / ||W r||_1, both sums in float64 in coordinate order
    work = u.shape[0]
    n_bytes = out.shape[1]
    for b in range(width):
        squares[b] = 0.0
    for j in range(work):
        sj = s1[j]
        for b in range(width):
            r = u[j, b]
            squares[b] += np.float64(r) * np.float64(r)
            u[j, b] = r * sj
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
def sketch_encode_rows(resid, s1, s2, scale, out, rho, r0, r1):
    # the hadamard sketch of stored residual rows (every pass after the load runs over the
    # block's rows as the inner, vector, loop)
    work = resid.shape[1]
    root = np.sqrt(np.float64(work))
    u = np.zeros((work, BLOCK), dtype=resid.dtype)
    squares = np.zeros(BLOCK)
    l1 = np.zeros(BLOCK)
    acc = np.zeros(BLOCK, dtype=np.uint8)
    for start in range(r0, r1, BLOCK):
        width = min(BLOCK, r1 - start)
        load_rows(resid, u, start, width, work)
        sketch_block(u, width, s1, s2, scale, root, out, rho, start, squares, l1, acc)


@njit(cache=True, nogil=True)
def sketch_decode_block(packed, start, width, w, sign_scale2, words):
    # w[:, :width] <- H R2^T sign of the block's rows, R_k^T = diag(s_k) H / sqrt(D): the passes
    # of two RandomizedHadamard.inverse calls (signs and 1/sqrt(D) premultiplied in the dtype)
    # but the last factor diag(s_1) / sqrt(D), which the caller applies, then the row's
    # rho / sqrt(D), in its next pass: (w * sign_scale1[j]) * row scale, the same two roundings
    work = w.shape[0]
    n_bytes = packed.shape[1]
    if work % 32 == 0:
        # 32 signs of a row at a time: its 4 bytes as one little-endian uint32 word (bit j of
        # byte j // 8 is bit j of the word), each bit expanded over the block's rows in the
        # 32-bit lanes the data's float32 shares (byte by byte, the shifts ran in narrow lanes:
        # the hadamard-sketch dequantize of 8M float32 coordinates at d = 1024 took 40 ms, now 32)
        one = w.dtype.type(1)
        two = w.dtype.type(2)
        for g in range(work // 32):
            for b in range(width):
                row = start + b
                words[b] = (np.uint32(packed[row, 4 * g]) | (np.uint32(packed[row, 4 * g + 1]) << np.uint32(8))
                            | (np.uint32(packed[row, 4 * g + 2]) << np.uint32(16))
                            | (np.uint32(packed[row, 4 * g + 3]) << np.uint32(24)))
            for t in range(32):
                shift = np.uint32(t)
                for b in range(width):
                    w[32 * g + t, b] = one - two * w.dtype.type((words[b] >> shift) & np.uint32(1))
    else:
        for k in range(n_bytes):
            for t in range(min(8, work - 8 * k)):
                j = 8 * k + t
                for b in range(width):
                    w[j, b] = 1 - 2 * ((packed[start + b, k] >> t) & 1)
    fwht_scale_block(w, sign_scale2, width)
    fwht_block(w, width)  # the caller multiplies by sign_scale1 in its next pass (one pass less)


@njit(cache=True, nogil=True)
def sketch_decode_rows(packed, sign_scale2, sign_scale1, row_scale, out, r0, r1):
    # r_hat = rho / sqrt(D) * R1^T R2^T sign of every row
    work = out.shape[1]
    u = np.zeros((work, BLOCK), dtype=out.dtype)
    words = np.zeros(BLOCK, dtype=np.uint32)
    for start in range(r0, r1, BLOCK):
        width = min(BLOCK, r1 - start)
        sketch_decode_block(packed, start, width, u, sign_scale2, words)
        store_scaled_rows(u, sign_scale1, row_scale, out, start, width, work)


@njit(cache=True, nogil=True)
def column_encode_rows(x, thresholds, t_start, widths, bit_start, codes, packed, r0, r1):
    # per column j of width w > 0: code = #{t < x_ij} over its 2^w - 1 sorted thresholds
    # thresholds[t_start[j]:...] (np.searchsorted's side="left"); the code goes to codes and to
    # bits bit_start[j] .. + w - 1 of the row's little-endian stream (kvasym.packing.pack_widths'
    # layout). packed must be zeroed. A block of rows is transposed into a (n, BLOCK) buffer so
    # that a column's thresholds are counted, each a compare over the vector of the block's rows:
    # for 1M coordinates 6 ms at 4 bits and 42 ms at 8 (a binary search per value, a chain of
    # dependent loads, took 23 ms at 4 bits and 36 at 6).
    n = x.shape[1]
    buf = np.empty((n, BLOCK), dtype=np.float64)
    count = np.empty(BLOCK, dtype=np.int64)
    for start in range(r0, r1, BLOCK):
        width = min(BLOCK, r1 - start)
        for j0 in range(0, n, TILE):
            for b in range(width):
                for j in range(j0, min(j0 + TILE, n)):
                    buf[j, b] = x[start + b, j]
        for j in range(n):
            w = widths[j]
            base = t_start[j]
            n_t = (1 << w) - 1
            for b in range(width):
                count[b] = 0
            for k in range(n_t):
                t = thresholds[base + k]
                for b in range(width):
                    count[b] += np.int64(t < buf[j, b])
            for b in range(width):
                codes[start + b, j] = count[b]
        for b in range(width):
            i = start + b
            for j in range(n):
                w = widths[j]
                if w == 0:
                    continue
                p = bit_start[j]
                shifted = np.int64(codes[i, j]) << (p & 7)
                packed[i, p >> 3] |= np.uint8(shifted & 0xFF)
                if shifted > 0xFF:  # the code crosses into the next byte, which then exists
                    packed[i, (p >> 3) + 1] |= np.uint8(shifted >> 8)


@njit(cache=True, nogil=True)
def column_decode_rows(packed, widths, bit_start, table, c_start, out, r0, r1):
    # the inverse: column j's code read from its bits, out_ij = table[c_start[j] + code]
    n = out.shape[1]
    n_bytes = packed.shape[1]
    for i in range(r0, r1):
        for j in range(n):
            w = widths[j]
            if w == 0:
                out[i, j] = table[c_start[j]]
                continue
            p = bit_start[j]
            k = p >> 3
            word = np.int64(packed[i, k])
            if k + 1 < n_bytes:
                word |= np.int64(packed[i, k + 1]) << 8
            code = (word >> (p & 7)) & ((1 << w) - 1)
            out[i, j] = table[c_start[j] + code]
