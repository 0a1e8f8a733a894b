"""Compiled (numba) kernels for the scalar quantizer's hot path, beside the numpy reference.

The numpy backend of :func:`kvasym.cache.quantize` (:class:`kvasym.backends.ReferenceBackend`)
and the numpy path of :meth:`kvasym.cache.PackedCache.dequantize` are the reference: a chain of
whole-array passes (scale, pad, signs, a Walsh-Hadamard transform as factored matmuls, threshold
encoding, bit packing), each of which reads and writes the whole batch. The kernels here do the
same arithmetic row by row in one pass, so that a row stays in cache from its norm to its packed
bytes:

``encode_rows`` (per row ``i`` of ``x``, ``D`` the working dimension)
    ``u = x_i * inv_i`` (in the dtype of ``x``, ``inv_i = 1 / stored norm``), zero-padded to
    ``D``; if rotated, ``u <- (H_D (s * u)) * D^{-1/2}`` by an in-place butterfly WHT; codes
    ``c_j = #{t : t <= u_j}`` against the thresholds in the dtype of ``x`` (a value equal to a
    threshold goes up, as ``np.searchsorted(..., side="right")``); the codes are packed into the
    row's bytes in :mod:`kvasym.packing`'s layout (code ``j`` at bits ``b j .. b j + b - 1`` of
    the row's little-endian bit stream).
    Optionally it also writes the residual ``u_j - centroids[c_j]`` (in the dtype), which a QJL
    side sketches. :func:`encode_batch_with_norms` computes the norms in the same pass (float64
    sum of squares in row order, ``float32`` storage, ``inv = 1 / stored``), which saves the
    reference's separate finiteness scan and norm pass over the batch; it declines (and the
    caller runs the reference passes) on any row those passes would rescale or refuse.
``decode_rows``
    the inverse: unpack, centroid lookup (plus an optional additive term, the QJL residual
    estimate), if rotated ``u <- s * (H_D u) * D^{-1/2}`` (the signs and the scale premultiplied
    in float64 and rounded to the dtype, as the reference does), truncate to ``dim`` and
    multiply by the stored norm.
``sketch_encode_rows`` / ``sketch_decode_rows`` (and, fused into the two above, ``sketch_block``
/ ``sketch_decode_block``)
    the hadamard residual sketch of :class:`kvasym.sketch.HadamardSketch`: ``W r`` by two
    in-place butterfly rotations, its sign bits in :func:`kvasym.packing.pack_signs`'s layout and
    ``rho = sqrt(D) ||r||^2 / ||W r||_1`` (sums in float64); and ``r_hat = rho D^{-1/2} W^T
    sign`` with the passes of two :meth:`~kvasym.rotation.RandomizedHadamard.inverse` calls. The
    Gaussian sketch stays a dense BLAS product (:class:`kvasym.sketch.QJLSketch`), which no
    row kernel would beat.

Layout. A block of ``BLOCK`` rows is transposed into a ``(D, BLOCK)`` buffer, ``TILE``
coordinates at a time, so that every butterfly, threshold comparison and packing step is a
vector over the block's rows; the WHT's stages go three at a time as radix-8 passes (the same
additions in the same order as radix-2 stages, a third of the passes over the buffer), the
threshold counts of a codebook of up to 4 bits are written out with its 1, 3, 7 or 15
thresholds in registers, and the sketch's sign bits are expanded 32 at a time from a uint32
word. On a hadamard-sketch side the residual is sketched from the block buffer, and on decoding
its estimate is added there: it never goes to memory.
``benchmarks/bench_quantize.py`` measures the result against a copy and the dense reference.

Equality with the reference. Every step but the WHT is the same operation on the same values
in the same dtype. The WHT adds the same numbers in another order (butterfly against blocked
matmul), so a rotated coordinate of a unit vector can differ by up to about ``2 log2(D)`` units
of the dtype's epsilon; a code can then differ (by one) only for a coordinate that close to a
threshold. For float64 data (the study's) that is ~1e-13 of the coordinates and the packed
files are byte-identical in practice (``tests/test_kernels.py`` requires it on every width and
dimension it tries); for float32 input about one coordinate in 10^6 moves (the test counts
them and checks each is such a near-tie). A sketch sign can likewise flip only for a projection
within rounding of 0, and ``rho``'s float64 sums differ in their last bits, which the float32
or float16 storage almost always absorbs. Reconstructions agree to float rounding.

Compilation is cached on disk (numba ``cache=True``): the first process on a machine compiles
(about 2 s), later ones load the cached code (about 0.5 s with numba's import). That fixed cost
is why the CLI and the library default to the numpy path; the DAG's stages, whose jobs quantize
many blocks, ask for ``"auto"`` (:func:`auto_kernel`). ``benchmarks/bench_quantize.py`` measures
both.

``encode_columns`` / ``decode_columns``
    codes at a width per column, each column against its own sorted thresholds (the
    water-filling encoder of :mod:`kvasym.composed`): ``#{t < x}`` as ``np.searchsorted`` (side
    left) counts it, the same comparisons of the same values, so the codes and the packed bytes
    (:func:`kvasym.packing.pack_widths`' layout) are equal, not only close; decoding unpacks and
    looks each code up in its column's table. The kernels release the GIL;
:func:`encode_batch` and :func:`decode_batch` split rows over ``threads`` Python threads.

The loops of :mod:`kvasym._stats_numba` (:func:`compiled_loops`) are another matter: they are
bit-identical to their numpy references (pure comparisons, or the same IEEE operations in the
same order with numpy's pairwise summation), so :mod:`kvasym.stats` (the exact KS recursion)
and :func:`kvasym.metrics.topk_recall` (real-model sized matrices) use them whenever numba
imports, and jobs that never reach them never import numba.

References
----------
.. [1] Lam, S. K., Pitrou, A., Seibert, S. (2015) "Numba: a LLVM-based Python JIT compiler",
   Proc. LLVM-HPC '15.
.. [2] Fino, B. J., Algazi, V. R. (1976) "Unified matrix treatment of the fast Walsh-Hadamard
   transform", IEEE Trans. Computers C-25(11):1142-1146.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from .errors import KvasymError

__all__ = ["KERNELS", "available", "decode_batch", "decode_columns", "encode_batch", "encode_batch_with_norms",
           "encode_columns", "hadamard_sketch_encode", "hadamard_sketch_decode"]

#: Implementations a caller can choose: the numpy reference and the compiled kernels.
KERNELS: tuple[str, ...] = ("numpy", "numba")

_COMPILED = None


_OPTIONAL: dict[str, Any] = {}  # module name -> the module, or None when numba does not import


def _optional_module(name: str) -> Any:
    """``kvasym.<name>`` (a module of numba-jitted loops), imported once on first use, or None
    when numba does not import: jobs that never reach a compiled loop never pay numba's import."""
    if name not in _OPTIONAL:
        import importlib

        try:
            _OPTIONAL[name] = importlib.import_module(f"{__package__}.{name}")
        except ImportError:
            _OPTIONAL[name] = None
    return _OPTIONAL[name]


def compiled_loops() -> Any:
    """The compiled statistics and metric loops (:mod:`kvasym._stats_numba`), or None when
    numba does not import (callers then run their numpy reference loop)."""
    return _optional_module("_stats_numba")


def compiled_metric_loops() -> Any:
    """The compiled attention-row pass of the metrics (:mod:`kvasym._metrics_numba`: equal to
    its numpy reference to rounding, not bit for bit), or None when numba does not import."""
    return _optional_module("_metrics_numba")


def available() -> bool:
    """Whether numba imports here (the kernels need it; the numpy reference never does)."""
    try:
        _compiled()
    except KvasymError:
        return False
    return True


def auto_kernel() -> str:
    """The kernel ``"auto"`` means (the DAG's stages run every side with it): ``"numba"`` when
    numba imports here, else the numpy reference. The compiled path covers the original pipeline
    (optional WHT, Lloyd-Max codes, gaussian or hadamard residual sketch) and, through
    :mod:`kvasym.composed`, the row passes of the composed sides (Lloyd-Max coding after
    centring or a KLT, Haar or WHT transform, with or without a rescale; water-filling codes);
    their other steps are the same code on both paths."""
    return "numba" if available() else "numpy"


def _compiled():
    """The jitted functions (compiled, or loaded from numba's on-disk cache, on first use)."""
    global _COMPILED
    if _COMPILED is None:
        try:
            from . import _kernels_numba
        except ImportError as exc:
            raise KvasymError(f"kernel 'numba' needs numba ({exc}); pip install 'kvasym[fast]' or use "
                              "kernel 'numpy'") from None

        _COMPILED = (_kernels_numba.encode_rows, _kernels_numba.decode_rows, _kernels_numba.sketch_encode_rows,
                     _kernels_numba.sketch_decode_rows, _kernels_numba.column_encode_rows,
                     _kernels_numba.column_decode_rows)
    return _COMPILED


def _blocks(rows: int, threads: int) -> list[tuple[int, int]]:
    parts = max(1, min(int(threads), rows))
    edges = np.linspace(0, rows, parts + 1).astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def _run(kernel, args: tuple, rows: int, threads: int) -> None:
    blocks = _blocks(rows, threads)
    if len(blocks) <= 1:
        for r0, r1 in blocks:
            kernel(*args, r0, r1)
        return
    with ThreadPoolExecutor(max_workers=len(blocks)) as pool:
        for future in [pool.submit(kernel, *args, r0, r1) for r0, r1 in blocks]:
            future.result()


def check_threads(threads: object) -> int:
    """``threads`` as a positive int, or a :class:`KvasymError` naming it (the bounds of
    :func:`kvasym.workers.check_workers`)."""
    from .workers import check_workers

    return check_workers(threads, "threads")


def _encode(x: np.ndarray, inv: np.ndarray | None, signs: np.ndarray | None, thresholds: np.ndarray, bits: int,
            threads: int, centroids: np.ndarray | None, sketch_signs: tuple[np.ndarray, np.ndarray] | None = None):
    encode_rows = _compiled()[0]
    if thresholds.size != (1 << bits) - 1:  # the binary search's probes stay inside the array
        raise KvasymError(f"{bits}-bit codes need {(1 << bits) - 1} thresholds, got {thresholds.size}")
    dtype = x.dtype
    rows = x.shape[0]
    rotate = signs is not None
    work = signs.size if rotate else x.shape[1]
    out = np.empty((rows, -(-work * bits // 8)), dtype=np.uint8)
    sign_arr = (signs if rotate else np.ones(1)).astype(dtype)
    scale = dtype.type(1.0 / np.sqrt(work))
    sketch = sketch_signs is not None
    want_resid = centroids is not None and not sketch  # a fused sketch keeps the residual in the kernel
    if sketch and centroids is None:
        raise KvasymError("the fused hadamard sketch needs the codebook's centroids")
    resid = np.empty((rows, work) if want_resid else (1, 1), dtype=dtype)
    books = np.asarray(centroids if centroids is not None else np.zeros(1), dtype=np.float64).astype(dtype)
    fuse = inv is None
    if fuse:
        inv = np.empty(rows, dtype=np.float64)
    exact = np.empty(rows if fuse else 1, dtype=np.float64)
    stored = np.empty(rows if fuse else 1, dtype=np.float32)
    ok = np.ones(1, dtype=np.bool_)
    cut = np.ascontiguousarray(thresholds, dtype=np.float64).astype(dtype)
    if sketch:
        s1, s2 = (np.asarray(v).astype(dtype) for v in sketch_signs)
    else:
        s1 = s2 = np.ones(1, dtype=dtype)
    sk_out = np.empty((rows, -(-work // 8)) if sketch else (1, 1), dtype=np.uint8)
    sk_rho = np.empty(rows if sketch else 1, dtype=np.float64)
    args = (np.ascontiguousarray(x), np.ascontiguousarray(inv, dtype=np.float64), sign_arr, scale, rotate, cut,
            int(bits), out, books, resid, want_resid, fuse, exact, stored, ok, sketch, s1, s2, sk_out, sk_rho)
    _run(encode_rows, args, rows, check_threads(threads))
    sketched = (sk_out, sk_rho) if sketch else None
    return out, (resid if want_resid else None), exact, stored, bool(ok[0]), sketched


def encode_batch(x: np.ndarray, inv: np.ndarray, signs: np.ndarray | None, thresholds: np.ndarray,
                 bits: int, *, threads: int = 1, centroids: np.ndarray | None = None
                 ) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Packed codes of the rows of ``x`` (see the module docstring for the arithmetic).

    Parameters
    ----------
    x : numpy.ndarray
        ``(rows, dim)`` float32 or float64 matrix (C-contiguous or not).
    inv : numpy.ndarray
        ``(rows,)`` reciprocal stored norms, float64 (0 for a zero row); rounded to ``x.dtype``.
    signs : numpy.ndarray or None
        The rotation's ``D`` random signs (+-1), or None for an unrotated side.
    thresholds : numpy.ndarray
        The codebook's ``2**bits - 1`` increasing thresholds (cast to ``x.dtype``).
    bits : int
        Bits per code, 1..8.
    threads : int, optional
        Python threads over blocks of rows (default 1).
    centroids : numpy.ndarray, optional
        The codebook's ``2**bits`` centroids: when given, the residuals are returned too.

    Returns
    -------
    numpy.ndarray or (numpy.ndarray, numpy.ndarray)
        ``(rows, ceil(D * bits / 8))`` uint8, byte for byte :func:`kvasym.packing.pack_codes`
        of the reference's codes (up to the near-ties of the module docstring); with
        ``centroids``, also the ``(rows, D)`` residuals ``u - centroids[codes]`` in ``x.dtype``.
    """
    out, resid, _, _, _, _ = _encode(x, np.asarray(inv, dtype=np.float64), signs, thresholds, bits, threads,
                                     centroids)
    return (out, resid) if centroids is not None else out


def encode_batch_with_norms(x: np.ndarray, signs: np.ndarray | None, thresholds: np.ndarray, bits: int, *,
                            threads: int = 1, centroids: np.ndarray | None = None,
                            hadamard_sketch: tuple[np.ndarray, np.ndarray] | None = None
                            ) -> tuple[np.ndarray, Any, np.ndarray, np.ndarray] | None:
    """:func:`encode_batch` with the float32-stored norms computed in the same pass.

    With ``hadamard_sketch = (signs1, signs2)`` (and ``centroids``) the residual is not returned
    but sketched in the same pass: the second item is then ``(sketch signs, rho)`` of
    :func:`hadamard_sketch_encode`, bit for bit what that function gives for the residuals.

    Per row, ``||x||`` is a float64 sum of the squares in row order, ``stored = float32(||x||)``
    and ``inv = 1 / stored`` (0 for a zero row), as :func:`kvasym.cache.quantize` computes them
    (its sum is numpy's ``einsum``, whose order differs: a stored norm can differ only when the
    two float64 norms straddle a float32 rounding boundary, about 2^-29 of the rows).

    Returns
    -------
    tuple or None
        ``(packed, residuals or None, exact_norms, stored_norms)``; None when a row needs the
        reference path: a non-finite value, float64 squares outside ``(1e-290, 1e290)``, a norm
        float32 cannot keep (overflow, or a non-zero norm stored as 0), or a float32 ``1/norm``
        that overflows. The caller then runs the reference passes, which raise or rescale.
    """
    out, resid, exact, stored, ok, sketched = _encode(x, None, signs, thresholds, bits, threads, centroids,
                                                      hadamard_sketch)
    if hadamard_sketch is not None:
        resid = sketched
    return (out, resid, exact, stored) if ok else None


def decode_batch(packed: np.ndarray, bits: int, centroids: np.ndarray, signs: np.ndarray | None, norms: np.ndarray,
                 dim: int, dtype: str, *, add: np.ndarray | None = None,
                 hadamard_sketch: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None,
                 threads: int = 1) -> np.ndarray:
    """Reconstruct ``(rows, dim)`` rows of ``dtype`` from packed codes (module docstring).

    ``add`` is an optional ``(rows, D)`` term added to the centroids before the inverse rotation
    (the QJL residual estimate); ``hadamard_sketch = (packed signs, rho, signs1, signs2)``
    decodes that term from the hadamard sketch in the same pass instead (the same values as
    ``add=hadamard_sketch_decode(...)``, without the array); ``norms`` are the stored norms
    (cast to ``dtype``).
    """
    decode_rows = _compiled()[1]
    dt = np.dtype(dtype)
    if hadamard_sketch is not None:
        if add is not None:
            raise KvasymError("decode_batch takes add or hadamard_sketch, not both")
        sk_packed, sk_rho, sk_signs1, sk_signs2 = hadamard_sketch
        sk_args = (True, np.ascontiguousarray(sk_packed), *_sketch_decode_scales(sk_rho, sk_signs1, sk_signs2, dt))
    else:
        sk_args = (False, np.zeros((1, 1), dtype=np.uint8), np.ones(1, dtype=dt), np.ones(1, dtype=dt),
                   np.ones(1, dtype=dt))
    rows = packed.shape[0]
    rotate = signs is not None
    work = signs.size if rotate else dim
    out = np.empty((rows, dim), dtype=dt)
    sign_scale = ((signs * (1.0 / np.sqrt(work))) if rotate else np.ones(1)).astype(dt)
    has_add = add is not None
    add_arr = np.ascontiguousarray(add, dtype=dt) if has_add else np.zeros((1, 1), dtype=dt)
    args = (np.ascontiguousarray(packed), int(bits), np.asarray(centroids, dtype=np.float64).astype(dt), add_arr,
            has_add, sign_scale, rotate, np.asarray(norms).astype(dt), out, *sk_args)
    _run(decode_rows, args, rows, check_threads(threads))
    return out


def _sketch_decode_scales(rho: np.ndarray, signs1: np.ndarray, signs2: np.ndarray, dt: np.dtype
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The hadamard decode's premultiplied factors, with the reference's roundings: each
    rotation's signs times 1/sqrt(D), and rho divided by sqrt(D), all rounded to ``dt``."""
    work = np.asarray(signs1).size
    root = 1.0 / np.sqrt(work)
    return ((np.asarray(signs2) * root).astype(dt), (np.asarray(signs1) * root).astype(dt),
            (np.asarray(rho, dtype=np.float64) / np.sqrt(work)).astype(dt))


def hadamard_sketch_encode(residual: np.ndarray, signs1: np.ndarray, signs2: np.ndarray, *,
                           threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Packed signs and ``rho`` of the hadamard sketch of residual rows (module docstring).

    Parameters
    ----------
    residual : numpy.ndarray
        ``(rows, D)`` float32 or float64 residuals, ``D`` a power of two.
    signs1, signs2 : numpy.ndarray
        The ``D`` random signs of the sketch's first and second rotation.
    threads : int, optional
        Python threads over blocks of rows (default 1).

    Returns
    -------
    signs : numpy.ndarray
        ``(rows, ceil(D / 8))`` uint8, as :meth:`kvasym.sketch.HadamardSketch.encode`.
    rho : numpy.ndarray
        ``(rows,)`` float64 ``sqrt(D) ||r||^2 / ||W r||_1`` (0 for a zero row).
    """
    encode = _compiled()[2]
    residual = np.ascontiguousarray(residual)
    rows, work = residual.shape
    dtype = residual.dtype
    out = np.empty((rows, -(-work // 8)), dtype=np.uint8)
    rho = np.empty(rows, dtype=np.float64)
    args = (residual, np.asarray(signs1).astype(dtype), np.asarray(signs2).astype(dtype),
            dtype.type(1.0 / np.sqrt(work)), out, rho)
    _run(encode, args, rows, check_threads(threads))
    return out, rho


def hadamard_sketch_decode(packed: np.ndarray, rho: np.ndarray, signs1: np.ndarray, signs2: np.ndarray,
                           dtype: str, *, threads: int = 1) -> np.ndarray:
    """``r_hat`` rows ``(rows, D)`` of ``dtype`` from the hadamard sketch's packed signs and
    ``rho`` (the arithmetic of :meth:`kvasym.sketch.HadamardSketch.decode`, module docstring)."""
    decode = _compiled()[3]
    dt = np.dtype(dtype)
    work = np.asarray(signs1).size
    out = np.empty((packed.shape[0], work), dtype=dt)
    args = (np.ascontiguousarray(packed), *_sketch_decode_scales(rho, signs1, signs2, dt), out)
    _run(decode, args, packed.shape[0], check_threads(threads))
    return out


def _column_starts(widths: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Widths as int64, each column's first bit in the row's stream, and the row's byte count."""
    widths = np.ascontiguousarray(widths, dtype=np.int64)
    if widths.ndim != 1 or np.any(widths < 0) or np.any(widths > 8):
        raise KvasymError(f"column widths must be a 1-D array of integers in 0..8, got {widths!r}")
    bit_start = np.concatenate(([0], np.cumsum(widths)[:-1])).astype(np.int64)
    return widths, bit_start, -(-int(widths.sum()) // 8)


def encode_columns(x: np.ndarray, thresholds: list[np.ndarray], widths: np.ndarray, *, threads: int = 1
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Codes of each column against its own thresholds, packed at a width per column.

    The compiled form of the water-filling encoder of :mod:`kvasym.composed`: column ``j`` of
    width ``w_j`` has the ``2**w_j - 1`` sorted thresholds ``thresholds[j]``, and its code is
    ``c_ij = #{t in thresholds[j] : t < x_ij}``, ``np.searchsorted(thresholds[j], x[:, j])``
    (``side="left"``), counted over the column's thresholds: the same comparisons of the same
    float64 values, so the codes are equal, not only close.

    Parameters
    ----------
    x : numpy.ndarray
        ``(rows, n)`` finite values (float64 arithmetic).
    thresholds : list of numpy.ndarray
        Per column its ``2**widths[j] - 1`` increasing thresholds (empty for width 0).
    widths : numpy.ndarray
        ``(n,)`` bits per column, 0..8.
    threads : int, optional
        Python threads over blocks of rows (default 1).

    Returns
    -------
    codes : numpy.ndarray
        ``(rows, n)`` uint8 codes (0 in width-0 columns).
    packed : numpy.ndarray
        ``(rows, ceil(sum(widths) / 8))`` uint8, byte for byte :func:`kvasym.packing.pack_widths`.
    """
    encode = _compiled()[4]
    widths, bit_start, n_bytes = _column_starts(widths)
    x = np.ascontiguousarray(x, dtype=np.float64)
    rows, n = x.shape
    if len(thresholds) != n or widths.size != n:
        raise KvasymError(f"{n} columns need {n} widths and threshold arrays, got {widths.size} and {len(thresholds)}")
    for j, (t, w) in enumerate(zip(thresholds, widths)):
        if np.size(t) != (1 << int(w)) - 1:  # the kernel counts 2^w - 1 of them from the column's start
            raise KvasymError(f"column {j}: {int(w)}-bit codes need {(1 << int(w)) - 1} thresholds, got {np.size(t)}")
    flat = np.concatenate([np.asarray(t, dtype=np.float64).ravel() for t in thresholds] + [np.zeros(0)])
    t_start = np.concatenate(([0], np.cumsum([np.size(t) for t in thresholds])[:-1])).astype(np.int64)
    codes = np.empty((rows, n), dtype=np.uint8)
    packed = np.zeros((rows, n_bytes), dtype=np.uint8)
    _run(encode, (x, flat, t_start, widths, bit_start, codes, packed), rows, check_threads(threads))
    return codes, packed


def decode_columns(packed: np.ndarray, widths: np.ndarray, tables: list[np.ndarray], *, threads: int = 1
                   ) -> np.ndarray:
    """Values of codes packed at a width per column: ``out_ij = tables[j][c_ij]`` (float64).

    The inverse of :func:`encode_columns`' packing (:func:`kvasym.packing.unpack_widths`)
    fused with the lookup, each column in its own table of ``2**widths[j]`` values (one value
    for width 0): the same values as unpacking and indexing, exactly.
    """
    decode = _compiled()[5]
    widths, bit_start, n_bytes = _column_starts(widths)
    packed = np.ascontiguousarray(packed, dtype=np.uint8)
    if packed.ndim != 2 or packed.shape[1] != n_bytes:
        raise KvasymError(f"codes of widths summing to {int(widths.sum())} bits need {n_bytes} bytes per row, "
                          f"got shape {packed.shape}")
    for j, (t, w) in enumerate(zip(tables, widths)):
        if np.size(t) != 1 << int(w):
            raise KvasymError(f"column {j}: {int(w)}-bit codes need {1 << int(w)} table values, got {np.size(t)}")
    if len(tables) != widths.size:
        raise KvasymError(f"{widths.size} columns need {widths.size} tables, got {len(tables)}")
    flat = np.concatenate([np.asarray(t, dtype=np.float64).ravel() for t in tables])
    c_start = np.concatenate(([0], np.cumsum([np.size(t) for t in tables])[:-1])).astype(np.int64)
    out = np.empty((packed.shape[0], widths.size), dtype=np.float64)
    _run(decode, (packed, widths, bit_start, flat, c_start, out), packed.shape[0], check_threads(threads))
    return out
