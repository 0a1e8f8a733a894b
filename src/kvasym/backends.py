"""The backends that execute a resolved quantization plan (:class:`~kvasym.plan.QuantizePlan`).

Two backends, chosen by the plan's ``kernel``:

- :class:`ReferenceBackend` (``"numpy"``): whole-array numpy passes, the reference;
- :class:`NumbaBackend` (``"numba"``): the compiled row passes of :mod:`kvasym.kernels` where
  they exist (the fused norm-rotate-code-pack pass, optionally sketching the residual with the
  hadamard sketch in the same pass; the code pass on reference norms; the hadamard sketch; the
  water-filling column codes), the reference for every other step. Codes agree with the
  reference's but for near-ties at a threshold (exactly on float64 data for the study's
  schemes; :mod:`kvasym.kernels`).

Both execute a plan in the same way (:meth:`ReferenceBackend.execute`): its ``plain`` path, the
original pipeline, here (:meth:`ReferenceBackend.encode_plain`), and its ``composed`` path with
:func:`kvasym.composed.encode_composed`, which calls back the backend's row passes
(:class:`~kvasym.plan.RowPasses`). A backend returns the arrays (:class:`~kvasym.plan.EncodedSide`);
:func:`kvasym.cache.quantize` makes the packed cache.

Original pipeline, per row ``x``: stored norm ``||x||``, ``u = x / ||x||`` (in ``x``'s dtype;
float64 when a float32 reciprocal would overflow), ``u <- R u`` if rotated, codes against the
Beta Lloyd-Max thresholds of the working dimension, and with a sketch, the sketch of
``r = u - centroids[codes]`` with its float per row stored in ``norm_dtype``.
"""

from __future__ import annotations

import numpy as np

from .composed import encode_composed
from .rows import check_finite, check_stored_precision, norms_and_reciprocals, store_norms
from .packing import pack_codes, pack_widths
from .plan import EncodedSide, QuantizePlan
from .rotation import RandomizedHadamard
from .scalar import ThresholdEncoder

__all__ = ["BACKENDS", "ReferenceBackend", "NumbaBackend", "backend_for", "execute"]


class ReferenceBackend:
    """The numpy reference: every step a whole-array numpy pass."""

    name = "numpy"

    def execute(self, plan: QuantizePlan, x: np.ndarray) -> EncodedSide:
        """The arrays of ``x`` quantized by ``plan``.

        Parameters
        ----------
        plan : QuantizePlan
            The resolved plan (:func:`kvasym.plan.resolve_plan`).
        x : numpy.ndarray
            ``(rows, plan.dim)`` float32 or float64 matrix, finite (the numba backend scans it
            itself where its fused pass does not).

        Returns
        -------
        EncodedSide
        """
        if plan.composed:
            return encode_composed(plan, x, self)
        return self.encode_plain(plan, x)

    def encode_plain(self, plan: QuantizePlan, x: np.ndarray) -> EncodedSide:
        """The original pipeline (module docstring) on reference norms.

        Parameters
        ----------
        plan : QuantizePlan
            A plan of the ``plain`` path.
        x : numpy.ndarray
            ``(rows, dim)`` finite float32 or float64 matrix.

        Returns
        -------
        EncodedSide
        """
        norms, inv, tiny_norms = norms_and_reciprocals(x, plan.norm_dtype)
        packed, residual = self.code_rows(plan, x, inv, tiny_norms)
        signs, residual_norms = self.sketch_rows(plan, residual) if plan.spec.qjl else (None, None)
        return _encoded(plan, x.shape[0], packed, norms, signs, residual_norms)

    def fused_rows(self, plan: QuantizePlan, z: np.ndarray, *, centroids: bool,
                   sketch: bool = False) -> tuple | None:
        """The fused norm-and-code pass: the reference has none (None: compute norms apart)."""
        return None

    def code_rows(self, plan: QuantizePlan, x: np.ndarray, inv: np.ndarray, tiny_norms: bool
                  ) -> tuple[np.ndarray, np.ndarray | None]:
        """Packed codes of the normalized (and, if rotated, rotated) rows, and their residual
        ``u - centroids[codes]`` when the plan sketches it (else None).

        Parameters
        ----------
        plan : QuantizePlan
            A plan of the ``plain`` path.
        x : numpy.ndarray
            The rows.
        inv : numpy.ndarray
            ``1 / stored norm`` per row, float64 (0 for a zero row).
        tiny_norms : bool
            Normalize in float64 (a float32 reciprocal would overflow).

        Returns
        -------
        tuple of numpy.ndarray
        """
        dtype = x.dtype
        if tiny_norms:
            unit = (x.astype(np.float64) * inv[:, None]).astype(dtype)
        else:
            unit = x * inv.astype(dtype)[:, None]
        if plan.spec.rotate:
            unit = RandomizedHadamard(plan.dim, plan.rotation_seed).forward(unit)
        if plan.scalar_bits == 0:
            return np.zeros((x.shape[0], 0), dtype=np.uint8), unit if plan.spec.qjl else None
        codes = ThresholdEncoder(plan.codebook.thresholds).encode(unit)
        residual = unit - plan.codebook.centroids.astype(dtype)[codes] if plan.spec.qjl else None
        return pack_codes(codes, plan.scalar_bits), residual

    def sketch_rows(self, plan: QuantizePlan, residual: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Packed sketch signs of the residual rows and their float per row (unstored, float64)."""
        return plan.sketch_operator().encode(residual)

    def waterfill_codes(self, plan: QuantizePlan, unit: np.ndarray, widths: np.ndarray,
                        std: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Codes of each coordinate against its width's N(0, 1) thresholds scaled by ``std[j]``
        (``np.searchsorted``, side left), and their packing at a width per column."""
        from .gaussian_codebook import gaussian_codebook

        codes = np.zeros(unit.shape, dtype=np.int64)
        for w in np.unique(widths):
            cols = np.flatnonzero(widths == w)
            book = gaussian_codebook(int(w))
            for j in cols:
                codes[:, j] = np.searchsorted(book.thresholds * std[j], unit[:, j])
        return codes, pack_widths(codes, widths)


class NumbaBackend(ReferenceBackend):
    """The compiled row passes of :mod:`kvasym.kernels`, the reference for the rest.

    ``x`` may reach :meth:`execute` unscanned for non-finite values: the fused pass declines
    such a row, and every path that does not run it scans first.
    """

    name = "numba"

    def encode_plain(self, plan: QuantizePlan, x: np.ndarray) -> EncodedSide:
        """The original pipeline in the fused row pass, or on reference norms where it declines a row."""
        sketch_in_pass = plan.sketch == "hadamard"
        fused = self.fused_rows(plan, x, centroids=plan.spec.qjl, sketch=sketch_in_pass)
        if fused is None:
            check_finite(x)
            return super().encode_plain(plan, x)
        packed, residual, _, norms = fused
        signs = residual_norms = None
        if sketch_in_pass:  # the kernel sketched the residual in the same pass
            signs, residual_norms = residual
        elif plan.spec.qjl:
            signs, residual_norms = self.sketch_rows(plan, residual)
        return _encoded(plan, x.shape[0], packed, norms, signs, residual_norms)

    def execute(self, plan: QuantizePlan, x: np.ndarray) -> EncodedSide:
        """:meth:`ReferenceBackend.execute` with the compiled row passes (class docstring)."""
        if plan.composed:
            check_finite(x)
        return super().execute(plan, x)

    def fused_rows(self, plan: QuantizePlan, z: np.ndarray, *, centroids: bool,
                   sketch: bool = False) -> tuple | None:
        """:func:`kvasym.kernels.encode_batch_with_norms` on ``z`` when the plan allows it
        (``plan.fused``): ``(packed, residual or (signs, rho) or None, exact norms, stored
        norms)``, the block's norm precision checked; None where the reference must run."""
        if not plan.fused:
            return None
        from . import kernels

        book = plan.codebook
        fused = kernels.encode_batch_with_norms(
            z, plan.rotation_signs(), book.thresholds, plan.scalar_bits, threads=plan.threads,
            centroids=book.centroids if centroids else None,
            hadamard_sketch=plan.sketch_operator().rotation_signs if sketch else None)
        if fused is not None:
            # the kernel's norms passed the checks of store_norms (it declines any row that would
            # not keep its norm), but for the block's precision, which needs every row's
            _, _, exact, norms = fused
            check_stored_precision(np.abs(norms - exact), float(np.max(exact, initial=0.0)), "norms",
                                   plan.norm_dtype)
        return fused

    def code_rows(self, plan: QuantizePlan, x: np.ndarray, inv: np.ndarray, tiny_norms: bool
                  ) -> tuple[np.ndarray, np.ndarray | None]:
        """:func:`kvasym.kernels.encode_batch` on the reference norms (the reference for a pure
        sketch or a float32 batch normalized in float64)."""
        if plan.scalar_bits == 0 or tiny_norms:
            return super().code_rows(plan, x, inv, tiny_norms)
        from . import kernels

        book = plan.codebook
        packed = kernels.encode_batch(x, inv, plan.rotation_signs(), book.thresholds, plan.scalar_bits,
                                      threads=plan.threads, centroids=book.centroids if plan.spec.qjl else None)
        return packed if plan.spec.qjl else (packed, None)

    def sketch_rows(self, plan: QuantizePlan, residual: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The hadamard sketch in its compiled pass (:func:`kvasym.kernels.hadamard_sketch_encode`);
        the Gaussian sketch is the reference's BLAS product."""
        if plan.sketch != "hadamard":
            return super().sketch_rows(plan, residual)
        from . import kernels

        return kernels.hadamard_sketch_encode(residual, *plan.sketch_operator().rotation_signs, threads=plan.threads)

    def waterfill_codes(self, plan: QuantizePlan, unit: np.ndarray, widths: np.ndarray,
                        std: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:func:`kvasym.kernels.encode_columns` (the reference's comparisons, compiled)."""
        from . import kernels
        from .gaussian_codebook import gaussian_codebook

        thresholds = [gaussian_codebook(int(w)).thresholds * std[j] for j, w in enumerate(widths)]
        return kernels.encode_columns(unit, thresholds, widths)


#: The backends by the plan's ``kernel``.
BACKENDS = {"numpy": ReferenceBackend(), "numba": NumbaBackend()}


def backend_for(plan: QuantizePlan) -> ReferenceBackend:
    """The backend of ``plan.kernel``.

    Parameters
    ----------
    plan : QuantizePlan

    Returns
    -------
    ReferenceBackend
        A :class:`ReferenceBackend` or :class:`NumbaBackend`.
    """
    return BACKENDS[plan.kernel]


def execute(plan: QuantizePlan, x: np.ndarray) -> EncodedSide:
    """Run ``plan`` on the rows of ``x`` with its backend (:meth:`ReferenceBackend.execute`).

    Parameters
    ----------
    plan : QuantizePlan
        The resolved plan.
    x : numpy.ndarray
        ``(rows, plan.dim)`` float32 or float64 matrix (finite, but for the numba backend,
        which scans it where its fused pass does not).

    Returns
    -------
    EncodedSide
    """
    return backend_for(plan).execute(plan, x)


def _encoded(plan: QuantizePlan, rows: int, packed: np.ndarray, norms: np.ndarray,
             signs: np.ndarray | None, residual_norms: np.ndarray | None) -> EncodedSide:
    """The plain path's arrays, the sketch's float stored in ``norm_dtype`` (empty arrays without one)."""
    if signs is None:
        return EncodedSide(packed, norms, np.zeros((rows, 0), dtype=np.uint8), np.zeros(0, dtype=plan.norm_dtype))
    return EncodedSide(packed, norms, signs, store_norms(residual_norms, plan.norm_dtype, "residual norm"))
