"""The resolved quantization plan of one cache side: every decision of :func:`kvasym.cache.quantize`
taken once, before any row is touched.

:func:`resolve_plan` takes what a caller gives (side spec, budget, row width, kernel, threads,
``norm_dtype``, seeds), validates all of it (each refusal a :class:`~kvasym.errors.KvasymError`
naming the key and the value) and resolves it into a :class:`QuantizePlan`:

- the side as quantized (a declared spend ``n - k`` becomes the same side at budget ``n - k``,
  :meth:`~kvasym.schemes.SideSpec.spent_at`);
- the working dimension (``dim`` padded to a power of two under the WHT, else ``dim``), the
  scalar width ``b = n - k``, the Beta Lloyd-Max codebook when the side codes with it;
- the residual sketch (``gaussian`` or ``hadamard``, ``m`` sign bits per row) or none;
- the primitives (:meth:`~kvasym.schemes.SideSpec.primitives`): none is the original pipeline
  (``path = "plain"``), any is the composed pipeline (``path = "composed"``, :mod:`kvasym.composed`);
- the backend (``kernel``: the numpy reference or the numba row passes, :mod:`kvasym.backends`)
  and whether its fused norm-and-code pass is tried (``fused``).

A backend executes a plan (:func:`kvasym.backends.execute`) and returns the arrays of the packed
cache (:class:`EncodedSide`); :func:`kvasym.cache.quantize` wraps them with the plan's header
fields (:meth:`QuantizePlan.header_fields`). The plan is also the layout a stored cache must have
(:func:`expected_extras`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .codebook import MAX_DIM, Codebook, lloyd_max_codebook
from .dualscale import TOKEN_SCALE_DTYPE
from .errors import KvasymError
from .kernels import KERNELS, check_threads
from .minmax import SCALE_DTYPE, group_shape
from .rows import NORM_DTYPES
from .rotation import RandomizedHadamard, next_power_of_two
from .schemes import GROUPED_SCALARS, MAX_SCALAR_BITS, SideSpec
from .sketch import HadamardSketch, QJLSketch, residual_sketch

__all__ = ["PATHS", "MIN_WORK_DIM", "QuantizePlan", "EncodedSide", "RowPasses", "resolve_plan", "check_kernel",
           "working_dim", "side_sketch", "expected_extras"]

#: The two pipelines a plan runs: the original one (norm, optional WHT, Lloyd-Max, sketch) and
#: the composed one (:mod:`kvasym.composed`).
PATHS = ("plain", "composed")
#: The smallest working dimension a side quantizes (a codebook needs 3 coordinates).
MIN_WORK_DIM = 3


def working_dim(dim: int, spec: SideSpec) -> int:
    """Coordinates quantized per row: ``dim`` padded to a power of two under the WHT, else ``dim``.

    Parameters
    ----------
    dim : int
        Row width of the block.
    spec : SideSpec
        The side spec.

    Returns
    -------
    int
    """
    return next_power_of_two(dim) if spec.transform == "wht" else dim


def check_kernel(kernel: object, threads: object) -> str:
    """``kernel`` as one of :data:`kvasym.kernels.KERNELS`, with ``threads`` checked too.

    Parameters
    ----------
    kernel : object
        ``"numpy"`` or ``"numba"``.
    threads : object
        An integer in 1..1024.

    Returns
    -------
    str

    Raises
    ------
    KvasymError
        Naming the kernel or threads value refused.
    """
    if not isinstance(kernel, str) or kernel not in KERNELS:  # an array would compare elementwise
        raise KvasymError(f"kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
    check_threads(threads)
    return str(kernel)


def side_sketch(spec: SideSpec, work: int, seed: int) -> QJLSketch | HadamardSketch:
    """The residual sketch of a side: QJL's Gaussian one at ``m = 2 D`` for ``sketch_m: 2d``,
    else :func:`kvasym.sketch.residual_sketch` of the side's kind at ``m = D``.

    Parameters
    ----------
    spec : SideSpec
        The side spec (``sketch``, ``sketch_m``).
    work : int
        The working dimension ``D``.
    seed : int
        The sketch's seed.

    Returns
    -------
    QJLSketch or HadamardSketch
    """
    if spec.sketch_m == 2:
        return QJLSketch(work, 2 * work, seed)
    return residual_sketch(spec.sketch, work, seed)


class RowPasses(Protocol):
    """The row passes a backend (:mod:`kvasym.backends`) offers the composed pipeline."""

    def fused_rows(self, plan: QuantizePlan, z: np.ndarray, *, centroids: bool,
                   sketch: bool = False) -> tuple | None:
        """The fused norm-and-code pass over ``z`` (None where the reference must run)."""

    def waterfill_codes(self, plan: QuantizePlan, unit: np.ndarray, widths: np.ndarray,
                        std: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Codes and packed codes of water-filling widths."""


@dataclass(frozen=True)
class QuantizePlan:
    """How one ``(rows, dim)`` block is quantized, resolved and validated (:func:`resolve_plan`).

    Parameters
    ----------
    spec : SideSpec
        The side as quantized (after :meth:`~kvasym.schemes.SideSpec.spent_at`).
    budget : int
        Bits per coordinate ``n`` as quantized (recorded in the header).
    dim : int
        Row width of the block.
    work_dim : int
        Coordinates quantized per row (:func:`working_dim`).
    scalar_bits : int
        Scalar bits per working coordinate (0: the sketch alone).
    sketch : {"gaussian", "hadamard"} or None
        The residual sketch, None without one.
    sketch_rows : int
        Sign bits per row of the sketch, ``m = sketch_m * work_dim`` (0 without a sketch).
    path : {"plain", "composed"}
        The original pipeline (no primitive) or the composed one (:mod:`kvasym.composed`).
    kernel : {"numpy", "numba"}
        The backend that executes the plan (:mod:`kvasym.backends`).
    threads : int
        Threads over rows of the numba backend's plain row passes.
    fused : bool
        Whether the numba backend tries its fused norm-and-code row pass first (float32 norms,
        Lloyd-Max codes with uniform allocation, at least one scalar bit); it falls back to the
        reference norms when the pass declines a row.
    norm_dtype : {"float16", "float32"}
        Storage dtype of norms, residual norms, the mean and coordinate scales.
    rotation_seed, qjl_seed : int
        The seeds as stored: the transform's when seeded (``wht``, ``haar``), the sketch's with
        one, else 0.
    codebook : Codebook or None
        The Beta Lloyd-Max codebook of ``(work_dim, scalar_bits)`` when the side codes with it
        (``lloyd_max`` scalar, ``uniform`` allocation, ``scalar_bits > 0``), else None.
    """

    spec: SideSpec
    budget: int
    dim: int
    work_dim: int
    scalar_bits: int
    sketch: str | None
    sketch_rows: int
    path: str
    kernel: str
    threads: int
    fused: bool
    norm_dtype: str
    rotation_seed: int
    qjl_seed: int
    codebook: Codebook | None = field(default=None, compare=False, repr=False)

    @property
    def composed(self) -> bool:
        """Whether the composed pipeline runs (the spec has primitives)."""
        return self.path == "composed"

    @property
    def primitives(self) -> dict:
        """The side's primitives as its header records them (empty on the plain path)."""
        return self.spec.primitives()

    @property
    def wants_residual(self) -> bool:
        """Whether the scalar stage must hand on its unit rows' residual (a sketch or rescale reads it)."""
        return self.spec.qjl or self.spec.rescale != "none"

    def rotation_signs(self) -> np.ndarray | None:
        """The WHT's random signs (``work_dim`` of them) under the ``wht`` transform, else None."""
        return RandomizedHadamard(self.dim, self.rotation_seed).signs if self.spec.transform == "wht" else None

    def sketch_operator(self) -> QJLSketch | HadamardSketch:
        """The residual sketch of the side (:func:`side_sketch`)."""
        return side_sketch(self.spec, self.work_dim, self.qjl_seed)

    def header_fields(self) -> dict:
        """The :class:`~kvasym.cache.PackedCache` fields the plan decides (all but the rows,
        arrays and ``meta``)."""
        return {"dim": self.dim, "budget": self.budget, "rotate": self.spec.rotate, "scalar_bits": self.scalar_bits,
                "qjl": self.spec.qjl, "rotation_seed": self.rotation_seed, "qjl_seed": self.qjl_seed,
                "norm_dtype": self.norm_dtype, "sketch": self.sketch or "gaussian", "primitives": self.primitives}


@dataclass
class EncodedSide:
    """The arrays a backend computes for one block (:class:`~kvasym.cache.PackedCache`'s).

    Parameters
    ----------
    codes : numpy.ndarray
        ``(rows, bytes)`` uint8 packed codes.
    norms : numpy.ndarray
        Stored row norms (empty for ``minmax``).
    qjl_signs : numpy.ndarray
        ``(rows, ceil(m / 8))`` uint8 packed sketch signs (``(rows, 0)`` without a sketch).
    residual_norms : numpy.ndarray
        The sketch's stored float per row (empty without a sketch).
    extras : dict of str to numpy.ndarray
        The primitives' side arrays (:func:`expected_extras`).
    """

    codes: np.ndarray
    norms: np.ndarray
    qjl_signs: np.ndarray
    residual_norms: np.ndarray
    extras: dict = field(default_factory=dict)


def _check_range(spec: SideSpec, budget: int, dim: int, scalar_bits: int) -> int:
    """The working dimension, after refusing a side the codebooks or the budget cannot serve."""
    work = working_dim(dim, spec)
    if work > MAX_DIM:
        padded = f", which the Hadamard rotation pads to {work}," if work != dim else ""
        raise KvasymError(f"rows of {dim} coordinates{padded} exceed the largest working dimension {MAX_DIM} "
                          f"(the codebooks' limit); split the rows into heads of at most {MAX_DIM} coordinates")
    if scalar_bits < 0 or scalar_bits > MAX_SCALAR_BITS or spec.stores_nothing_at(budget):
        raise KvasymError(f"side spec {spec.to_dict()} is impossible at budget {budget}")
    return work


def _check_composed(spec: SideSpec, budget: int, dim: int, scalar_bits: int) -> None:
    """Combinations of primitives the composed pipeline cannot run at this budget and width."""
    if scalar_bits == 0 and (spec.scalar in GROUPED_SCALARS or spec.allocation == "waterfill"):
        key = f"scalar {spec.scalar}" if spec.scalar in GROUPED_SCALARS else "allocation waterfill"
        raise KvasymError(f"side spec {spec.to_dict()} is impossible at budget {budget}: no scalar bits "
                          f"({key} needs at least one)")
    if spec.qjl and spec.sketch == "hadamard" and dim & (dim - 1) and spec.transform != "wht":
        raise KvasymError(f"the hadamard sketch needs a power-of-two working dimension, not {dim}")


def resolve_plan(spec: SideSpec, budget: int, dim: int, *, rotation_seed: int, qjl_seed: int,
                 norm_dtype: str = "float32", kernel: str = "numpy", threads: int = 1) -> QuantizePlan:
    """Validate a side's quantization request and resolve it into a :class:`QuantizePlan`.

    Parameters
    ----------
    spec : SideSpec
        How the side is quantized.
    budget : int
        The scheme's bits per coordinate ``n`` (a declared spend lowers it, :meth:`SideSpec.spent_at`).
    dim : int
        Row width of the block.
    rotation_seed, qjl_seed : int
        Seeds of the seeded transform and of the sketch (kept only where used).
    norm_dtype : {"float32", "float16"}, optional
        Storage dtype of the float side information (default ``"float32"``).
    kernel : {"numpy", "numba"}, optional
        The backend (default ``"numpy"``).
    threads : int, optional
        Threads of the numba backend (default 1).

    Returns
    -------
    QuantizePlan

    Raises
    ------
    KvasymError
        The working dimension is above the codebooks' limit or below 3; ``kernel``, ``threads``
        or ``norm_dtype`` is unknown; the scalar width is below 0 or above 8 or the side stores
        nothing at the budget; a ``minmax`` or ``waterfill`` side has no scalar bit; a hadamard
        sketch has no power-of-two working dimension.
    """
    spec, budget = spec.spent_at(budget)
    scalar_bits = spec.scalar_bits(budget)
    work = _check_range(spec, budget, dim, scalar_bits)
    kernel = check_kernel(kernel, threads)
    if norm_dtype not in NORM_DTYPES:
        raise KvasymError(f"norm_dtype must be one of {', '.join(NORM_DTYPES)}, got {norm_dtype!r}")
    if work < MIN_WORK_DIM:
        raise KvasymError(f"vectors must have at least {MIN_WORK_DIM} coordinates, got {dim}")
    composed = bool(spec.primitives())
    if composed:
        _check_composed(spec, budget, dim, scalar_bits)
    lloyd = spec.scalar == "lloyd_max" and spec.allocation == "uniform" and scalar_bits > 0
    return QuantizePlan(
        spec=spec, budget=budget, dim=dim, work_dim=work, scalar_bits=scalar_bits,
        sketch=spec.sketch if spec.qjl else None, sketch_rows=spec.sketch_bits * work,
        path=PATHS[composed], kernel=kernel, threads=int(threads),
        fused=kernel == "numba" and norm_dtype == "float32" and lloyd, norm_dtype=norm_dtype,
        rotation_seed=int(rotation_seed) if spec.seeded_transform else 0,
        qjl_seed=int(qjl_seed) if spec.qjl else 0,
        codebook=lloyd_max_codebook(work, scalar_bits) if lloyd else None,
    )


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
    work = working_dim(dim, spec)
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    if spec.center:
        out["mean"] = ((dim,), norm_dtype)
    if spec.transform == "klt":
        out["basis"] = ((dim, dim), spec.transform_dtype)
    if spec.allocation == "waterfill":
        out["coord_std"] = ((work,), norm_dtype)
    if spec.scalar in GROUPED_SCALARS:
        shape = group_shape(rows, work, spec.axis, spec.group)
        out["group_scale"] = (shape, SCALE_DTYPE)
        if spec.scalar == "minmax":  # llama.cpp's block types store the scale only
            out["group_zero"] = (shape, SCALE_DTYPE)
    if spec.normalize == "dual":
        out["token_scale"] = ((rows,), TOKEN_SCALE_DTYPE)
    return out
