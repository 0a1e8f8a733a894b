"""Quantizing one cache side whose spec uses the composable primitives (numpy reference and compiled row passes).

A side spec whose :meth:`~kvasym.schemes.SideSpec.primitives` is empty is a plan of the
``plain`` path (:mod:`kvasym.plan`), the original pipeline of the backends (:mod:`kvasym.backends`,
bit-identical to before the primitives existed). Otherwise its plan is of the ``composed`` path,
which the backends run with :func:`encode_composed`, calling back their row passes: the rows
``x`` of the ``(rows, dim)`` block go through, in float64:

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
     ``group_scale`` and ``group_zero``, float16); no norms; with ``normalize: dual`` the codes
     are of ``z_i / r_i``, ``r_i`` the token's KVarN-style dual scale (:mod:`kvasym.dualscale`,
     array ``token_scale``, float16), and the reconstruction is multiplied back by ``r_i``;

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

from typing import Protocol

import numpy as np

from .centering import add_mean, block_mean, subtract_mean
from .codebook import lloyd_max_codebook
from .dualscale import token_scales
from .klt import klt_basis, orthonormalize, store_basis
from .blockq import BLOCK_RULES, block_dequantize, block_quantize
from .minmax import minmax_dequantize, minmax_quantize
from .packing import pack_codes, unpack_codes, unpack_widths
from .plan import EncodedSide, QuantizePlan, RowPasses, side_sketch
from .rescale import rescale_factors
from .rotation import HaarRotation, RandomizedHadamard
from .rows import row_norms, store_norms
from .scalar import ThresholdEncoder
from .schemes import GROUPED_SCALARS, SideSpec

__all__ = ["encode_composed", "dequantize_composed", "waterfill_allocation", "waterfill_reconstruct"]


# the water-filling modules import scipy: only a water-filling side pays for it
def waterfill_allocation(coord_std: np.ndarray, scalar_bits: int) -> np.ndarray:
    """Bits per coordinate of a water-filling side from its stored coordinate scales.

    Parameters
    ----------
    coord_std : numpy.ndarray
        The stored ``sigma_j`` (array ``coord_std``).
    scalar_bits : int
        Scalar bits per coordinate ``b``.

    Returns
    -------
    numpy.ndarray
        :func:`kvasym.waterfill.integer_allocation` over ``sigma_j^2`` of ``b D`` bits.
    """
    from .waterfill import integer_allocation

    return integer_allocation(np.asarray(coord_std, dtype=np.float64) ** 2, scalar_bits * coord_std.size)


def waterfill_reconstruct(codes: np.ndarray, widths: np.ndarray, std: np.ndarray) -> np.ndarray:
    """``centroids_{b_j}[c_ij] * std[j]``: the N(0, 1) Lloyd-Max centroids of each column's width.

    Parameters
    ----------
    codes : numpy.ndarray
        ``(rows, D)`` codes.
    widths : numpy.ndarray
        Bits of each column.
    std : numpy.ndarray
        Each column's scale.

    Returns
    -------
    numpy.ndarray
        ``(rows, D)`` float64.
    """
    from .gaussian_codebook import gaussian_codebook

    out = np.zeros(codes.shape, dtype=np.float64)
    for w in np.unique(widths):
        cols = np.flatnonzero(widths == w)
        out[:, cols] = gaussian_codebook(int(w)).centroids[codes[:, cols]] * std[cols]
    return out


def _waterfill_decode(packed: np.ndarray, widths: np.ndarray, std: np.ndarray, kernel: str) -> np.ndarray:
    """The reconstruction ``centroids_{b_j}[c_ij] * std[j]`` of water-filling codes."""
    if kernel == "numba":
        from . import kernels
        from .gaussian_codebook import gaussian_codebook

        tables = [gaussian_codebook(int(w)).centroids * std[j] for j, w in enumerate(widths)]
        return kernels.decode_columns(packed, widths, tables)
    return waterfill_reconstruct(unpack_widths(packed, widths), widths, std)


def encode_composed(plan: QuantizePlan, x: np.ndarray, backend: RowPasses) -> EncodedSide:
    """The arrays of ``x`` quantized by a plan of the ``composed`` path (module docstring).

    Parameters
    ----------
    plan : QuantizePlan
        The resolved plan (:func:`kvasym.plan.resolve_plan`), with at least one primitive.
    x : numpy.ndarray
        ``(rows, dim)`` finite matrix (arithmetic in float64).
    backend : RowPasses
        The backend whose row passes run (:mod:`kvasym.backends`).

    Returns
    -------
    EncodedSide
    """
    extras: dict[str, np.ndarray] = {}
    z = np.asarray(x, dtype=np.float64)
    if plan.spec.center:
        extras["mean"] = block_mean(z, plan.norm_dtype)
        z = subtract_mean(z, extras["mean"])
    z, fused = _transform(plan, z, extras, backend)
    if plan.spec.scalar in GROUPED_SCALARS:
        packed_codes, norms, residual = _grouped_stage(plan, z, extras)
    else:
        packed_codes, norms, residual = _lloyd_stage(plan, z, fused, extras, backend)
    if plan.spec.qjl:
        signs, residual_norms = plan.sketch_operator().encode(residual)
        residual_norms = store_norms(residual_norms, plan.norm_dtype, "residual norm")
    else:
        signs = np.zeros((z.shape[0], 0), dtype=np.uint8)
        residual_norms = np.zeros(0, dtype=plan.norm_dtype)
    return EncodedSide(packed_codes, norms, signs, residual_norms, extras)


def _transform(plan: QuantizePlan, z: np.ndarray, extras: dict, backend: RowPasses) -> tuple[np.ndarray, tuple | None]:
    """The transformed rows, and the backend's fused pass when it ran: before the WHT (which it
    applies itself), after a Haar or KLT product (or none)."""
    transform = plan.spec.transform
    if transform == "wht":
        fused = backend.fused_rows(plan, z, centroids=plan.wants_residual)
        return (z if fused is not None else RandomizedHadamard(plan.dim, plan.rotation_seed).forward(z)), fused
    if transform == "haar":
        z = HaarRotation(plan.dim, plan.rotation_seed).forward(z)
    elif transform == "klt":
        extras["basis"] = store_basis(klt_basis(z)[1], plan.spec.transform_dtype)
        z = z @ orthonormalize(extras["basis"])
    return z, backend.fused_rows(plan, z, centroids=plan.wants_residual)


def _grouped_stage(plan: QuantizePlan, z: np.ndarray, extras: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The group-wise codes of ``z`` (KIVI's minmax, or llama.cpp's block types), no norms, and
    the residual ``z - z_hat``."""
    spec = plan.spec
    if spec.scalar in BLOCK_RULES:
        codes, extras["group_scale"] = block_quantize(z, plan.scalar_bits, spec.scalar, spec.axis, spec.group)
    else:
        scaled = z
        if spec.normalize == "dual":
            extras["token_scale"] = token_scales(z, spec.group)
            scaled = z / extras["token_scale"].astype(np.float64)[:, None]
        codes, extras["group_scale"], extras["group_zero"] = minmax_quantize(scaled, plan.scalar_bits, spec.axis,
                                                                             spec.group)
    recon = _grouped_reconstruct(codes, extras, spec, plan.scalar_bits)
    return pack_codes(codes, plan.scalar_bits), np.zeros(0, dtype=plan.norm_dtype), z - recon


def _grouped_reconstruct(codes: np.ndarray, extras: dict, spec: SideSpec, bits: int) -> np.ndarray:
    """Each entry from its group's stored parameters: ``(q - 2^(b-1)) d_s`` for llama.cpp's block
    types; ``z_s + q s_s`` for minmax, times the token's stored dual scale when ``normalize: dual``."""
    if spec.scalar in BLOCK_RULES:
        return block_dequantize(codes, extras["group_scale"], bits, spec.axis, spec.group)
    recon = minmax_dequantize(codes, extras["group_scale"], extras["group_zero"], spec.axis, spec.group)
    if spec.normalize == "dual":
        recon = recon * extras["token_scale"].astype(np.float64)[:, None]
    return recon


def _lloyd_stage(plan: QuantizePlan, z: np.ndarray, fused: tuple | None, extras: dict, backend: RowPasses
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Packed codes, stored (rescaled) norms and the unit rows' residual (when a sketch or the
    rescale reads it) of a ``lloyd_max`` side, from the fused pass or the reference norms."""
    want = plan.wants_residual
    if fused is not None:
        packed_codes, residual, _, norms = fused
        recon = unit = None
        if want:
            recon = plan.codebook.centroids[unpack_codes(packed_codes, plan.scalar_bits, plan.work_dim)]
            unit = recon + residual
    else:
        norms = store_norms(row_norms(z), plan.norm_dtype, "norm")
        stored = norms.astype(np.float64)
        unit = z * np.divide(1.0, stored, out=np.zeros_like(stored), where=stored > 0)[:, None]
        packed_codes, recon = _code_units(plan, unit, extras, backend)
        residual = unit - recon if want else None
    if plan.spec.rescale != "none":
        scaled = norms.astype(np.float64) * rescale_factors(unit, recon, plan.spec.rescale)
        norms = store_norms(scaled, plan.norm_dtype, "rescaled norm")
    return packed_codes, norms, residual


def _code_units(plan: QuantizePlan, unit: np.ndarray, extras: dict, backend: RowPasses
                ) -> tuple[np.ndarray, np.ndarray | None]:
    """Packed codes of unit rows and their reconstruction (None for water-filling codes nobody reads)."""
    if plan.scalar_bits == 0:
        return np.zeros((unit.shape[0], 0), dtype=np.uint8), np.zeros_like(unit)
    if plan.spec.allocation == "waterfill":
        extras["coord_std"] = store_norms(np.sqrt(np.mean(unit**2, axis=0)), plan.norm_dtype, "coordinate scale")
        std = extras["coord_std"].astype(np.float64)
        widths = waterfill_allocation(extras["coord_std"], plan.scalar_bits)
        codes, packed_codes = backend.waterfill_codes(plan, unit, widths, std)
        return packed_codes, waterfill_reconstruct(codes, widths, std) if plan.wants_residual else None
    codes = ThresholdEncoder(plan.codebook.thresholds).encode(unit)
    return pack_codes(codes, plan.scalar_bits), plan.codebook.centroids[codes]


class StoredSide(Protocol):
    """What :func:`dequantize_composed` reads of a packed cache (:class:`kvasym.cache.PackedCache`)."""

    dim: int
    rows: int
    scalar_bits: int
    qjl: bool
    rotation_seed: int
    qjl_seed: int
    codes: np.ndarray
    norms: np.ndarray
    qjl_signs: np.ndarray
    residual_norms: np.ndarray
    extras: dict

    @property
    def work_dim(self) -> int:
        """Coordinates quantized per row."""

    def spec(self) -> SideSpec:
        """The side spec the cache was quantized with."""


def dequantize_composed(cache: StoredSide, dtype: str = "float64", kernel: str = "numpy") -> np.ndarray:
    """Reconstruct the ``(rows, dim)`` block of a composed cache from its packed data alone.

    Parameters
    ----------
    cache : StoredSide
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
    r_hat = side_sketch(spec, cache.work_dim, cache.qjl_seed).decode(
        cache.qjl_signs, cache.residual_norms.astype(np.float64), "float64") if cache.qjl else None
    if kernel == "numba" and spec.scalar == "lloyd_max" and spec.allocation != "waterfill" and cache.scalar_bits > 0:
        unit = _decode_fused(cache, spec, r_hat)
    else:
        unit = _decode_reference(cache, spec, r_hat, kernel)
    if spec.transform == "haar":
        unit = HaarRotation(cache.dim, cache.rotation_seed).inverse(unit)
    elif spec.transform == "klt":
        unit = unit @ orthonormalize(cache.extras["basis"]).T
    if spec.center:
        unit = add_mean(unit, cache.extras["mean"])
    return unit.astype(dtype)


def _decode_fused(cache: StoredSide, spec: SideSpec, r_hat: np.ndarray | None) -> np.ndarray:
    """Codes, sketch term, norms (and the inverse WHT) of a Lloyd-Max uniform side in the
    compiled row pass (:func:`kvasym.kernels.decode_batch`)."""
    from . import kernels

    work, b = cache.work_dim, cache.scalar_bits
    rotate = spec.transform == "wht"
    return kernels.decode_batch(cache.codes, b, lloyd_max_codebook(work, b).centroids,
                                RandomizedHadamard(cache.dim, cache.rotation_seed).signs if rotate else None,
                                cache.norms, cache.dim if rotate else work, "float64", add=r_hat)


def _decode_reference(cache: StoredSide, spec: SideSpec, r_hat: np.ndarray | None, kernel: str) -> np.ndarray:
    """The scalar reconstruction plus the sketch term, times the norms (not for ``minmax``),
    through the inverse WHT when rotated: the rows before a Haar or KLT inverse and the mean."""
    work, b, extras = cache.work_dim, cache.scalar_bits, cache.extras
    if spec.scalar in GROUPED_SCALARS:
        unit = _grouped_reconstruct(unpack_codes(cache.codes, b, work), extras, spec, b)
    elif b == 0:
        unit = np.zeros((cache.rows, work))
    elif spec.allocation == "waterfill":
        widths = waterfill_allocation(extras["coord_std"], b)
        unit = _waterfill_decode(cache.codes, widths, extras["coord_std"].astype(np.float64), kernel)
    else:
        unit = lloyd_max_codebook(work, b).centroids[unpack_codes(cache.codes, b, work)]
    if r_hat is not None:
        unit = unit + r_hat
    if spec.scalar not in GROUPED_SCALARS:
        unit = unit * cache.norms.astype(np.float64)[:, None]
    if spec.transform == "wht":
        unit = RandomizedHadamard(cache.dim, cache.rotation_seed).inverse(unit)
    return unit
