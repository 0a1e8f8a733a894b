"""Quantizing one cache side whose spec uses the composable primitives (numpy reference and compiled row passes).

A side spec whose :meth:`~kvasym.schemes.SideSpec.primitives` is empty takes the original path
of :func:`kvasym.cache.quantize` (bit-identical to before the primitives existed). Otherwise the
rows ``x`` of the ``(rows, dim)`` block go through, in float64:

1. ``center``: ``x <- x - mu_s`` (:mod:`kvasym.centering`; ``mu_s`` stored in ``norm_dtype``,
   array ``mean``, ``dim`` floats per block);
2. ``transform``: ``z = R x`` (``wht``, padded to a power of two, from the rotation seed), or
   ``z = Q^T x`` (``klt``: ``Q`` from the stored basis, array ``basis``, ``dim^2`` floats in
   ``transform_dtype``, :mod:`kvasym.klt`), or ``z = Q x`` (``haar``: ``Q`` Haar-random from the
   rotation seed, :class:`kvasym.rotation.HaarRotation`, no side bits but the seed), or ``z = x``;
3. the scalar quantizer at ``b = n - sketch bits`` bits per coordinate:

   - ``lloyd_max``: stored norm ``||z||`` and ``u = z / ||z||``; ``uniform`` allocation codes
     ``u`` with the Beta Lloyd-Max codebook of the working dimension (as the original
     pipeline); ``waterfill`` stores ``sigma_j = sqrt(mean_i u_ij^2)`` (array ``coord_std``,
     ``norm_dtype``), gives coordinate ``j`` ``b_j`` bits by
     :func:`~kvasym.waterfill.integer_allocation` over ``sigma_j^2`` (``sum b_j = b D``
     exactly; recomputed by the decoder from the stored ``sigma``) and codes it with the N(0, 1)
     Lloyd-Max codebook scaled by ``sigma_j`` (the Beta codebook is the law of a *rotated*
     coordinate; a KLT or raw coordinate has its own variance, and a Gaussian of that variance
     is the law the codebook should fit); the ``rescale`` factor ``s`` (:mod:`kvasym.rescale`)
     is folded into the stored norm (no extra side bits);
   - ``minmax``: group-wise asymmetric uniform codes of ``z`` (:mod:`kvasym.minmax`; arrays
     ``group_scale`` and ``group_zero``, float16); no norms;

4. ``qjl``: the residual (``u - c`` or ``z - c``) sketched with ``m = sketch_m * D`` sign bits
   (Gaussian; or the hadamard sketch at ``m = D``) and one float per row.

Payload is exactly ``n`` bits per working coordinate (codes and sign bits); everything else is
side information, measured by :attr:`kvasym.cache.PackedCache.side_bits`.

With ``kernel="numba"`` the row passes run compiled (:mod:`kvasym.kernels`), the rest as above:
a ``lloyd_max`` side with ``uniform`` allocation and float32 norms is normalized, rotated (for
``wht``; a ``klt`` or ``haar`` transform stays the BLAS product before it), coded and packed in
the fused row pass of the original pipeline, and decoded by its inverse; a ``waterfill`` side is
coded and packed, and decoded, by :func:`kvasym.kernels.encode_columns` and
:func:`~kvasym.kernels.decode_columns` (the same comparisons and lookups, so the same codes).
The fused pass normalizes before it rotates where the reference rotates first, and sums the WHT
in another order: codes agree but for near-ties at a threshold, reconstructions to float
rounding. Centring, the transforms' matrices, min-max groups, the rescale and the sketches are
the same code on both paths.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from .centering import add_mean, block_mean, subtract_mean
from .codebook import lloyd_max_codebook
from .errors import KvasymError
from .klt import klt_basis, orthonormalize, store_basis
from .minmax import SCALE_DTYPE, group_shape, minmax_dequantize, minmax_quantize
from .packing import pack_codes, pack_widths, unpack_codes, unpack_widths
from .rescale import rescale_factors
from .rotation import HaarRotation, RandomizedHadamard, next_power_of_two
from .scalar import ThresholdEncoder
from .schemes import SideSpec
from .sketch import QJLSketch, residual_sketch

if TYPE_CHECKING:
    from .cache import PackedCache

__all__ = ["quantize_composed", "dequantize_composed", "spec_of", "expected_extras"]


def spec_of(rotate: bool, budget: int, scalar_bits: int, qjl: bool, sketch: str, primitives: Mapping) -> SideSpec:
    """The side spec a cache's header describes (raises KvasymError for an impossible record).

    Parameters
    ----------
    rotate : bool
        Header ``rotate``.
    budget, scalar_bits : int
        Header ``budget`` and ``scalar_bits``.
    qjl : bool
        Header ``qjl``.
    sketch : str
        Header ``sketch``.
    primitives : mapping
        Header ``primitives`` (see :meth:`~kvasym.schemes.SideSpec.primitives`).

    Returns
    -------
    SideSpec
    """
    from .schemes import PRIMITIVE_KEYS

    unknown = set(primitives) - set(PRIMITIVE_KEYS)
    if unknown:
        raise KvasymError(f"unknown primitive(s) {sorted(unknown)}")
    spec = SideSpec(rotate=rotate, scalar_offset=budget - scalar_bits, qjl=qjl, sketch=sketch, **dict(primitives))
    if spec.primitives() != dict(primitives):
        raise KvasymError(f"primitives {dict(primitives)} are not in canonical form ({spec.primitives()})")
    return spec


def _work_dim(dim: int, spec: SideSpec) -> int:
    return next_power_of_two(dim) if spec.transform == "wht" else dim


def expected_extras(rows: int, dim: int, spec: SideSpec, norm_dtype: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """Name -> (shape, dtype) of every side array a composed cache of this spec holds.

    Parameters
    ----------
    rows, dim : int
        Shape of the quantized block.
    spec : SideSpec
        The side spec.
    norm_dtype : str
        Storage dtype of norms (and of the mean and coordinate scales).

    Returns
    -------
    dict
    """
    work = _work_dim(dim, spec)
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    if spec.center:
        out["mean"] = ((dim,), norm_dtype)
    if spec.transform == "klt":
        out["basis"] = ((dim, dim), spec.transform_dtype)
    if spec.allocation == "waterfill":
        out["coord_std"] = ((work,), norm_dtype)
    if spec.scalar == "minmax":
        shape = group_shape(rows, work, spec.axis, spec.group)
        out["group_scale"] = (shape, SCALE_DTYPE)
        out["group_zero"] = (shape, SCALE_DTYPE)
    return out


def _sketch(spec: SideSpec, work: int, seed: int) -> QJLSketch | object:
    if spec.sketch_m == 2:
        return QJLSketch(work, 2 * work, seed)
    return residual_sketch(spec.sketch, work, seed)


# the water-filling modules import scipy: only a water-filling side pays for it
def _waterfill_allocation(coord_std: np.ndarray, scalar_bits: int) -> np.ndarray:
    from .waterfill import integer_allocation

    return integer_allocation(np.asarray(coord_std, dtype=np.float64) ** 2, scalar_bits * coord_std.size)


def _waterfill_reconstruct(codes: np.ndarray, widths: np.ndarray, std: np.ndarray) -> np.ndarray:
    from .gaussian_codebook import gaussian_codebook

    out = np.zeros(codes.shape, dtype=np.float64)
    for w in np.unique(widths):
        cols = np.flatnonzero(widths == w)
        out[:, cols] = gaussian_codebook(int(w)).centroids[codes[:, cols]] * std[cols]
    return out


def _waterfill_encode(unit: np.ndarray, widths: np.ndarray, std: np.ndarray, kernel: str
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Codes of each coordinate against its width's N(0, 1) thresholds scaled by ``std[j]``
    (``np.searchsorted``, side left), and their packing at a width per column."""
    from .gaussian_codebook import gaussian_codebook

    if kernel == "numba":
        from . import kernels

        thresholds = [gaussian_codebook(int(w)).thresholds * std[j] for j, w in enumerate(widths)]
        return kernels.encode_columns(unit, thresholds, widths)
    codes = np.zeros(unit.shape, dtype=np.int64)
    for w in np.unique(widths):
        cols = np.flatnonzero(widths == w)
        book = gaussian_codebook(int(w))
        for j in cols:
            codes[:, j] = np.searchsorted(book.thresholds * std[j], unit[:, j])
    return codes, pack_widths(codes, widths)


def _waterfill_decode(packed: np.ndarray, widths: np.ndarray, std: np.ndarray, kernel: str) -> np.ndarray:
    """The reconstruction ``centroids_{b_j}[c_ij] * std[j]`` of water-filling codes."""
    if kernel == "numba":
        from . import kernels
        from .gaussian_codebook import gaussian_codebook

        tables = [gaussian_codebook(int(w)).centroids * std[j] for j, w in enumerate(widths)]
        return kernels.decode_columns(packed, widths, tables)
    return _waterfill_reconstruct(unpack_widths(packed, widths), widths, std)


def _fused_lloyd(z: np.ndarray, spec: SideSpec, rotation_seed: int, scalar_bits: int, norm_dtype: str,
                 kernel: str, want_unit: bool) -> tuple | None:
    """The compiled row pass of a ``lloyd_max``/``uniform`` side (rotating if ``wht``): packed
    codes, stored norms, and when ``want_unit`` the unit rows, their reconstruction and the
    residual (a rescale or a sketch needs them); None where the reference path must run (numpy kernel,
    float16 norms, or a row the pass declines, which the reference then rescales or refuses)."""
    if (kernel != "numba" or norm_dtype != "float32" or scalar_bits == 0 or spec.scalar != "lloyd_max"
            or spec.allocation == "waterfill"):
        return None
    from . import kernels
    from .cache import check_stored_precision

    rotate = spec.transform == "wht"
    work = next_power_of_two(z.shape[1]) if rotate else z.shape[1]
    if work < 3:
        return None
    book = lloyd_max_codebook(work, scalar_bits)
    fused = kernels.encode_batch_with_norms(z, RandomizedHadamard(z.shape[1], rotation_seed).signs if rotate else None,
                                            book.thresholds, scalar_bits,
                                            centroids=book.centroids if want_unit else None)
    if fused is None:
        return None
    packed, residual, exact, norms = fused
    check_stored_precision(np.abs(norms - exact), float(np.max(exact, initial=0.0)), "norms", norm_dtype)
    if not want_unit:
        return packed, norms, None, None, None
    recon = book.centroids[unpack_codes(packed, scalar_bits, work)]
    return packed, norms, recon + residual, recon, residual


def quantize_composed(x: np.ndarray, spec: SideSpec, budget: int, *, rotation_seed: int, qjl_seed: int,
                      norm_dtype: str, meta: Mapping | None = None, kernel: str = "numpy") -> PackedCache:
    """Quantize the rows of ``x`` with a spec that uses primitives (see the module docstring).

    Parameters
    ----------
    x : numpy.ndarray
        ``(rows, dim)`` finite matrix (already checked by :func:`kvasym.cache.quantize`).
    spec : SideSpec
        The side spec (with at least one primitive).
    budget : int
        Bits per coordinate ``n``.
    rotation_seed, qjl_seed : int
        Seeds of the WHT rotation and of the sketch (stored only when used).
    norm_dtype : str
        Storage dtype of norms, residual norms, the mean and the coordinate scales.
    meta : mapping, optional
        Metadata kept in the header.
    kernel : {"numpy", "numba"}, optional
        The reference passes (default) or the compiled row passes (module docstring).

    Returns
    -------
    PackedCache
    """
    from .cache import PackedCache, row_norms, store_norms

    rows, dim = x.shape
    scalar_bits = spec.scalar_bits(budget)
    extras: dict[str, np.ndarray] = {}
    z = np.asarray(x, dtype=np.float64)
    if spec.center:
        extras["mean"] = block_mean(z, norm_dtype)
        z = subtract_mean(z, extras["mean"])
    want_unit = spec.qjl or spec.rescale != "none"
    fused = None
    if spec.transform == "wht":
        fused = _fused_lloyd(z, spec, rotation_seed, scalar_bits, norm_dtype, kernel, want_unit)
    if spec.transform == "wht" and fused is None:
        z = RandomizedHadamard(dim, rotation_seed).forward(z)
    elif spec.transform == "haar":
        z = HaarRotation(dim, rotation_seed).forward(z)
    elif spec.transform == "klt":
        extras["basis"] = store_basis(klt_basis(z)[1], spec.transform_dtype)
        z = z @ orthonormalize(extras["basis"])
    if spec.transform in ("haar", "klt", "none"):
        fused = _fused_lloyd(z, spec, rotation_seed, scalar_bits, norm_dtype, kernel, want_unit)
    work = _work_dim(dim, spec)
    if work < 3:
        raise KvasymError(f"vectors must have at least 3 coordinates, got {dim}")
    if spec.scalar == "minmax":
        codes, extras["group_scale"], extras["group_zero"] = minmax_quantize(z, scalar_bits, spec.axis, spec.group)
        recon = minmax_dequantize(codes, extras["group_scale"], extras["group_zero"], spec.axis, spec.group)
        packed_codes = pack_codes(codes, scalar_bits)
        norms = np.zeros(0, dtype=norm_dtype)
        residual = z - recon
    elif fused is not None:
        packed_codes, norms, unit, recon, residual = fused
        stored = norms.astype(np.float64)
    else:
        exact = row_norms(z)
        norms = store_norms(exact, norm_dtype, "norm")
        stored = norms.astype(np.float64)
        unit = z * np.divide(1.0, stored, out=np.zeros_like(stored), where=stored > 0)[:, None]
        if scalar_bits == 0:
            recon = np.zeros_like(unit)
            packed_codes = np.zeros((rows, 0), dtype=np.uint8)
        elif spec.allocation == "waterfill":
            extras["coord_std"] = store_norms(np.sqrt(np.mean(unit**2, axis=0)), norm_dtype, "coordinate scale")
            std = extras["coord_std"].astype(np.float64)
            widths = _waterfill_allocation(extras["coord_std"], scalar_bits)
            codes, packed_codes = _waterfill_encode(unit, widths, std, kernel)
            recon = _waterfill_reconstruct(codes, widths, std) if want_unit else None
        else:
            book = lloyd_max_codebook(work, scalar_bits)
            codes = ThresholdEncoder(book.thresholds).encode(unit)
            recon = book.centroids[codes]
            packed_codes = pack_codes(codes, scalar_bits)
    if spec.scalar != "minmax":
        if spec.rescale != "none":
            scaled = stored * rescale_factors(unit, recon, spec.rescale)
            norms = store_norms(scaled, norm_dtype, "rescaled norm")
        if fused is None:
            residual = unit - recon if want_unit else None
    if spec.qjl:
        signs, residual_norms = _sketch(spec, work, qjl_seed).encode(residual)
        residual_norms = store_norms(residual_norms, norm_dtype, "residual norm")
    else:
        signs = np.zeros((rows, 0), dtype=np.uint8)
        residual_norms = np.zeros(0, dtype=norm_dtype)
    return PackedCache(
        dim=dim, rows=rows, budget=budget, rotate=spec.rotate, scalar_bits=scalar_bits, qjl=spec.qjl,
        rotation_seed=int(rotation_seed) if spec.seeded_transform else 0, qjl_seed=int(qjl_seed) if spec.qjl else 0,
        norm_dtype=norm_dtype, codes=packed_codes, norms=norms, qjl_signs=signs, residual_norms=residual_norms,
        meta=dict(meta or {}), sketch=spec.sketch if spec.qjl else "gaussian", primitives=spec.primitives(),
        extras=extras,
    )


def dequantize_composed(cache: PackedCache, dtype: str = "float64", kernel: str = "numpy") -> np.ndarray:
    """Reconstruct the ``(rows, dim)`` block of a composed cache from its packed data alone.

    Parameters
    ----------
    cache : PackedCache
        A cache with primitives.
    dtype : str, optional
        Output dtype (the arithmetic is float64).
    kernel : {"numpy", "numba"}, optional
        The reference passes (default) or the compiled row passes (module docstring).

    Returns
    -------
    numpy.ndarray
        ``x_hat = mu_s + T^{-1}(norm * (c + r_hat))`` (lloyd_max) or ``mu_s + T^{-1}(c + r_hat)``
        (minmax), each term present when its primitive is.
    """
    spec = cache.spec()
    work = cache.work_dim
    extras = cache.extras
    b = cache.scalar_bits
    r_hat = _sketch(spec, work, cache.qjl_seed).decode(cache.qjl_signs, cache.residual_norms.astype(np.float64),
                                                       "float64") if cache.qjl else None
    fused = kernel == "numba" and spec.scalar == "lloyd_max" and spec.allocation != "waterfill" and b > 0
    if fused:  # codes, sketch term, norms (and the WHT) in the compiled row pass
        from . import kernels

        rotate = spec.transform == "wht"
        unit = kernels.decode_batch(cache.codes, b, lloyd_max_codebook(work, b).centroids,
                                    RandomizedHadamard(cache.dim, cache.rotation_seed).signs if rotate else None,
                                    cache.norms, cache.dim if rotate else work, "float64", add=r_hat)
    elif spec.scalar == "minmax":
        codes = unpack_codes(cache.codes, b, work)
        unit = minmax_dequantize(codes, extras["group_scale"], extras["group_zero"], spec.axis, spec.group)
    elif b == 0:
        unit = np.zeros((cache.rows, work))
    elif spec.allocation == "waterfill":
        widths = _waterfill_allocation(extras["coord_std"], b)
        unit = _waterfill_decode(cache.codes, widths, extras["coord_std"].astype(np.float64), kernel)
    else:
        unit = lloyd_max_codebook(work, b).centroids[unpack_codes(cache.codes, b, work)]
    if r_hat is not None and not fused:
        unit = unit + r_hat
    if spec.scalar != "minmax" and not fused:
        unit = unit * cache.norms.astype(np.float64)[:, None]
    if spec.transform == "wht" and not fused:
        unit = RandomizedHadamard(cache.dim, cache.rotation_seed).inverse(unit)
    elif spec.transform == "haar":
        unit = HaarRotation(cache.dim, cache.rotation_seed).inverse(unit)
    elif spec.transform == "klt":
        unit = unit @ orthonormalize(extras["basis"]).T
    if spec.center:
        unit = add_mean(unit, extras["mean"])
    return unit.astype(dtype)
