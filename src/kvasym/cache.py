"""Packed caches: quantizing one K or V matrix, and the compact artifact it yields.

Quantizing rows ``x`` (vectors of length ``dim``) with a :class:`~kvasym.schemes.SideSpec` at
budget ``n``:

1. norm ``||x||`` (computed in float64, stored in ``norm_dtype``); ``u = x / ||x||`` (zero rows
   stay zero);
2. if ``rotate``: ``u <- R u`` with the randomized WHT (zero-padded to ``padded_dim``);
3. scalar codes of ``u`` against the Lloyd-Max codebook for unit-vector coordinates in the
   working dimension (``padded_dim`` when rotated, ``dim`` otherwise), ``n`` or ``n - 1`` bits;
4. if ``qjl``: the 1-bit sketch of the residual ``u - centroids[codes]`` (``m`` = working
   dimension sign bits and one float per row, stored in ``norm_dtype``): QJL's Gaussian sketch
   (the residual norm) or the orthogonal hadamard sketch (the estimate's norm), recorded in the
   header as ``sketch`` (:mod:`kvasym.sketch`; files without the key are Gaussian).

Dequantization uses only what the packed cache holds (codes, stored norms, seeds): what
``quantize`` returns and what :func:`load_packed` reads back give bit-identical reconstructions.
The measured size is split into payload (codes and sign bits, padding included) and side
information (norms, residual norms and the two 64-bit seeds), both in bits per coordinate of
the original ``rows x dim`` matrix.

References
----------
.. [1] Zandieh, A., Daliri, M., Hadian, M., Mirrokni, V. (2025) "TurboQuant: Online Vector
   Quantization with Near-optimal Distortion Rate", arXiv:2504.19874 (norm, rotation, Beta
   codebook).
.. [2] Zandieh, A., Daliri, M., Han, I. (2024/2025) "QJL: 1-Bit Quantized JL Transform for KV
   Cache Quantization with Zero Overhead", arXiv:2406.03482 (the residual sketch).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .atomic import atomic_target
from .backends import execute
from .codebook import lloyd_max_codebook
from .errors import DamagedFile, KvasymError
from .packing import packed_row_bytes, unpack_codes
from .plan import check_kernel, expected_extras, resolve_plan
from .rotation import RandomizedHadamard, next_power_of_two
from .rows import (NORM_DTYPES, SIDE_PRECISION, check_finite, check_matrix, check_stored_precision, row_norms,
                   store_norms)
from .schemes import GROUPED_SCALARS, SideSpec, spec_of
from .sketch import SKETCH_KINDS, HadamardSketch, QJLSketch, residual_sketch

__all__ = [
    "PACKED_FORMAT",
    "EXTRA_ARRAYS",
    "NORM_DTYPES",
    "SEED_BITS",
    "PackedCache",
    "row_norms",
    "check_matrix",
    "check_finite",
    "quantize",
    "store_norms",
    "SIDE_PRECISION",
    "check_stored_precision",
    "save_packed",
    "read_npz_arrays",
    "load_packed",
]

#: 2: the header carries a SHA-256 of its fields and of every array (:func:`content_digest`).
PACKED_FORMAT = 2
#: The primitives' side arrays stored in the cache's ``norm_dtype`` (:mod:`kvasym.composed`):
#: the block mean of ``center`` and the coordinate scales of ``allocation: waterfill``.
NORM_DTYPE_EXTRAS = ("mean", "coord_std")
SEED_BITS = 64


@dataclass(frozen=True)
class PackedCache:
    """One quantized matrix: bit-packed codes, norms, QJL signs and the seeds to rebuild R, S.

    Parameters
    ----------
    dim : int
        Columns of the original matrix.
    rows : int
        Rows (vectors) of the original matrix.
    budget : int
        Bits per coordinate ``n`` of the scheme.
    rotate : bool
        Whether the rows were rotated (randomized WHT, zero-padded to a power of two).
    scalar_bits : int
        Lloyd-Max bits per coordinate (0 for pure QJL).
    qjl : bool
        Whether a QJL sketch of the residual is stored.
    rotation_seed, qjl_seed : int
        Seeds of the rotation and of the residual sketch (0 when unused).
    norm_dtype : str
        Storage dtype of the norms, ``"float16"`` or ``"float32"``.
    codes : numpy.ndarray
        ``(rows, packed_row_bytes(work_dim, scalar_bits))`` uint8 packed codes.
    norms : numpy.ndarray
        ``(rows,)`` row norms in ``norm_dtype``.
    qjl_signs : numpy.ndarray
        ``(rows, ceil(work_dim / 8))`` uint8 packed signs, empty when not ``qjl``.
    residual_norms : numpy.ndarray
        ``(rows,)`` the sketch's float per row in ``norm_dtype``, empty when not ``qjl``: the
        residual norm ``||r||`` (gaussian) or the estimate's norm ``||r_hat||`` (hadamard, see
        :class:`~kvasym.sketch.HadamardSketch`).
    meta : dict, optional
        Free metadata stored in the header (not compared).
    sketch : {"gaussian", "hadamard"}, optional
        The residual sketch when ``qjl`` (default ``"gaussian"``).
    primitives : dict, optional
        The side's composable primitives (:meth:`~kvasym.schemes.SideSpec.primitives`; empty,
        the default, for the original pipeline), recorded in the header.
    extras : dict of str to numpy.ndarray, optional
        The primitives' side arrays (``mean``, ``basis``, ``coord_std``, ``group_scale``,
        ``group_zero``; :mod:`kvasym.composed`), stored beside the data arrays.
    """

    dim: int
    rows: int
    budget: int
    rotate: bool
    scalar_bits: int
    qjl: bool
    rotation_seed: int
    qjl_seed: int
    norm_dtype: str
    codes: np.ndarray  # (rows, packed_row_bytes(work_dim, scalar_bits)) uint8
    norms: np.ndarray  # (rows,) norm_dtype
    qjl_signs: np.ndarray  # (rows, ceil(work_dim / 8)) uint8, empty when not qjl
    residual_norms: np.ndarray  # (rows,) norm_dtype, empty when not qjl
    meta: dict = field(default_factory=dict, compare=False)
    sketch: str = "gaussian"
    primitives: dict = field(default_factory=dict)
    extras: dict = field(default_factory=dict, compare=False)

    def spec(self) -> SideSpec:
        """The side spec this cache was quantized with (its scalar offset from the budget).

        Returns
        -------
        SideSpec
        """
        return spec_of(self.rotate, self.budget, self.scalar_bits, self.qjl, self.sketch, self.primitives)

    def _sketch(self) -> QJLSketch | HadamardSketch:
        return residual_sketch(self.sketch, self.work_dim, self.qjl_seed)

    @property
    def work_dim(self) -> int:
        """Coordinates quantized per row: padded to a power of two when rotated (else ``dim``)."""
        return next_power_of_two(self.dim) if self.rotate else self.dim

    @property
    def payload_bits(self) -> int:
        """Bits of codes and QJL signs, padding included: ``8 * (codes.size + qjl_signs.size)``."""
        return 8 * (self.codes.size + self.qjl_signs.size)

    @property
    def side_bits(self) -> int:
        """Bits of side information: stored norms, residual norms, the primitives' side arrays
        (mean, KLT basis, coordinate scales, group scales and zero points) and one 64-bit seed
        per random map in use (rotation, QJL)."""
        norm_bits = 8 * (self.norms.nbytes + self.residual_norms.nbytes)
        norm_bits += 8 * sum(array.nbytes for array in self.extras.values())
        seeds = (1 if self.rotate or self.primitives.get("transform") == "haar" else 0) + (1 if self.qjl else 0)
        return norm_bits + SEED_BITS * seeds

    def side_bits_at(self, norm_dtype: str) -> int:
        """:attr:`side_bits` with every array this cache stores in its ``norm_dtype`` (norms,
        residual norms, and the primitives' mean and coordinate scales,
        :data:`NORM_DTYPE_EXTRAS`) counted at ``norm_dtype``'s width instead: the side bits of
        the same cache quantized with ``norm_dtype`` (the KLT basis and min-max scales keep
        their own dtypes).

        Raises
        ------
        KvasymError
            If ``norm_dtype`` is not one of :data:`NORM_DTYPES`.
        """
        if norm_dtype not in NORM_DTYPES:
            raise KvasymError(f"norm_dtype must be one of {', '.join(NORM_DTYPES)}, got {norm_dtype!r}")
        width = np.dtype(norm_dtype).itemsize
        governed = [self.norms, self.residual_norms] + [a for k, a in self.extras.items() if k in NORM_DTYPE_EXTRAS]
        return self.side_bits + sum(8 * a.size * (width - a.itemsize) for a in governed)

    def bits_per_coordinate(self, norm_dtype: str | None = None) -> dict[str, float]:
        """Measured bits per original coordinate: payload, side information and their total.

        Parameters
        ----------
        norm_dtype : {"float16", "float32"}, optional
            Count the side information as if the norms were stored in this dtype
            (:meth:`side_bits_at`); default: as stored.

        Returns
        -------
        dict of str to float
            ``payload = payload_bits / (rows * dim)``, ``side = side_bits / (rows * dim)`` and
            ``total = payload + side`` (the denominator is at least 1).
        """
        coords = max(self.rows * self.dim, 1)
        payload = self.payload_bits / coords
        side = (self.side_bits if norm_dtype is None else self.side_bits_at(norm_dtype)) / coords
        return {"payload": payload, "side": side, "total": payload + side}

    def dequantize(self, dtype: str = "float64", *, kernel: str = "numpy", threads: int = 1) -> np.ndarray:
        """Reconstruct the (rows, dim) matrix from the packed data alone.

        Parameters
        ----------
        dtype : str, optional
            Arithmetic and output dtype (default ``"float64"``).
        kernel : {"numpy", "numba"}, optional
            The reference passes (default) or the fused compiled row pass of
            :mod:`kvasym.kernels` (equal to float rounding).
        threads : int, optional
            Threads over rows for the ``"numba"`` kernel (default 1).

        Returns
        -------
        numpy.ndarray
            ``x_hat = ||x|| * R^{-1}(centroids[codes] + r_hat)`` per row, with ``r_hat`` the QJL
            estimate of the residual (if ``qjl``) and ``R^{-1}`` the inverse rotation (if
            ``rotate``); norms are the stored (rounded) ones.
        """
        work = self.work_dim
        if self.primitives:
            from .composed import dequantize_composed

            return dequantize_composed(self, dtype, check_kernel(kernel, threads))
        if check_kernel(kernel, threads) == "numba" and self.scalar_bits > 0:
            from . import kernels

            add = hadamard = None
            if self.qjl and self.sketch == "hadamard":  # decoded inside the row pass
                hadamard = (self.qjl_signs, self.residual_norms.astype(np.float64), *self._sketch().rotation_signs)
            elif self.qjl:
                add = self._sketch().decode(self.qjl_signs, self.residual_norms.astype(np.float64), dtype)
            signs = RandomizedHadamard(self.dim, self.rotation_seed).signs if self.rotate else None
            return kernels.decode_batch(self.codes, self.scalar_bits,
                                        lloyd_max_codebook(work, self.scalar_bits).centroids, signs, self.norms,
                                        self.dim, dtype, add=add, hadamard_sketch=hadamard, threads=threads)
        if self.scalar_bits > 0:
            book = lloyd_max_codebook(work, self.scalar_bits)
            codes = unpack_codes(self.codes, self.scalar_bits, work)
            unit = book.centroids.astype(dtype)[codes]
        else:
            unit = np.zeros((self.rows, work), dtype=dtype)
        if self.qjl:
            unit += self._sketch().decode(self.qjl_signs, self.residual_norms.astype(np.float64), dtype)
        if self.rotate:
            unit = RandomizedHadamard(self.dim, self.rotation_seed).inverse(unit)
        unit *= self.norms.astype(dtype)[:, None]
        return unit

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays written by :func:`save_packed`.

        Returns
        -------
        dict of str to numpy.ndarray
            ``header`` (UTF-8 JSON as uint8: format, shape, scheme side, seeds as decimal
            strings, ``norm_dtype``, ``meta`` and, with ``qjl``, ``sketch``), ``codes``,
            ``norms``, ``qjl_signs`` and ``residual_norms``.
        """
        header = {
            "format": PACKED_FORMAT,
            "dim": self.dim,
            "rows": self.rows,
            "budget": self.budget,
            "rotate": self.rotate,
            "scalar_bits": self.scalar_bits,
            "qjl": self.qjl,
            "rotation_seed": str(self.rotation_seed),
            "qjl_seed": str(self.qjl_seed),
            "norm_dtype": self.norm_dtype,
            "meta": self.meta,
        }
        if self.qjl:
            header["sketch"] = self.sketch
        if self.primitives:
            header["primitives"] = dict(self.primitives)
        data = {name: getattr(self, name) for name in _DATA_ARRAYS}
        data.update(self.extras)
        header["sha256"] = content_digest(header, data)
        return {"header": np.frombuffer(json.dumps(header, sort_keys=True).encode("utf-8"), dtype=np.uint8), **data}


#: The data arrays of a packed cache, in the order :func:`content_digest` hashes them.
_DATA_ARRAYS = ("codes", "norms", "qjl_signs", "residual_norms")
#: The side arrays of the scheme primitives (:mod:`kvasym.composed`), hashed after the data
#: arrays in this order when present.
EXTRA_ARRAYS = ("mean", "basis", "coord_std", "group_scale", "group_zero", "token_scale")


def content_digest(header: Mapping[str, object], arrays: Mapping[str, np.ndarray]) -> str:
    """SHA-256 of a packed cache's header fields (all but ``sha256``, as sorted JSON) and of its
    arrays (dtype, shape and little-endian C-order bytes of each of ``codes``, ``norms``,
    ``qjl_signs``, ``residual_norms``, then of the primitives' side arrays present, by name).

    It catches an edited or corrupted file whose shapes still agree with its header (e.g. a
    ``dim`` changed within the same padded width, or edited norms): a guard against accidents,
    not against an adversary who recomputes it.
    """
    import hashlib

    h = hashlib.sha256(json.dumps({k: v for k, v in header.items() if k != "sha256"}, sort_keys=True).encode())
    for name in _DATA_ARRAYS + tuple(sorted(name for name in EXTRA_ARRAYS if name in arrays)):
        array = np.asarray(arrays[name])
        h.update(f"{name}:{array.dtype.str}:{array.shape}".encode())
        h.update(np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False).tobytes())
    return h.hexdigest()


def _header_int(header: Mapping[str, object], key: str, low: int, high: int) -> int:
    """A JSON integer (not a bool, float or string) in [low, high]; seeds are decimal strings."""
    value = header[key]
    if key.endswith("_seed") and isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"header {key} = {value!r} is not an integer in {low}..{high}")
    return value


def _header_bool(header: Mapping[str, object], key: str) -> bool:
    value = header[key]
    if not isinstance(value, bool):
        raise ValueError(f"header {key} = {value!r} is not true or false")
    return value


def quantize(
    x: np.ndarray,
    spec: SideSpec,
    budget: int,
    *,
    rotation_seed: int,
    qjl_seed: int,
    norm_dtype: str = "float32",
    meta: Mapping | None = None,
    kernel: str = "numpy",
    threads: int = 1,
) -> PackedCache:
    """Quantize the rows of ``x`` (float32 or float64; arithmetic in that dtype) into a cache.

    The side spec is applied as given at ``budget``; checking that a scheme spends exactly the
    budget is :meth:`Scheme.validate_budget`'s job (the theory stage quantizes with an
    (n-1)-bit scalar side on purpose). A side that declares a lower spend (``spend: n-k``,
    :meth:`SideSpec.spent_at`) is quantized as the same side at budget ``n - k``: its header
    records that budget.

    Parameters
    ----------
    x : array_like
        ``(rows, dim)`` finite matrix, one vector per row.
    spec : SideSpec
        How the side is quantized (rotation, scalar width, QJL).
    budget : int
        Bits per coordinate ``n``; the scalar width is ``spec.scalar_bits(budget)``.
    rotation_seed : int
        Seed of the rotation (stored only when ``spec.rotate``).
    qjl_seed : int
        Seed of the residual sketch (stored only when ``spec.qjl``; ``spec.sketch`` says which).
    norm_dtype : str, optional
        Storage dtype of the norms, ``"float32"`` (default) or ``"float16"``.
    meta : mapping, optional
        Metadata kept in the cache header.
    kernel : {"numpy", "numba"}, optional
        ``"numpy"`` (default), the reference whole-array passes, or ``"numba"``, the fused
        compiled row pass of :mod:`kvasym.kernels` for the rotation, encoding, packing and the
        residual, and its hadamard sketch kernel (same codes up to near-ties at a threshold, same
        sketch bits up to projections within rounding of 0, see there); the Gaussian sketch is
        the same BLAS product on either path.
    threads : int, optional
        Threads over rows for the ``"numba"`` kernel (default 1).

    Returns
    -------
    PackedCache
        The packed codes, stored norms, QJL signs and residual norms, and the seeds.

    Raises
    ------
    KvasymError
        If ``x`` is not a finite non-empty 2-D numeric matrix, the spec is impossible at
        ``budget`` (scalar width < 0 or > 8, or nothing stored), the working dimension is
        below 3, ``norm_dtype`` is unknown, or a norm (or residual norm) is beyond the range of
        ``norm_dtype`` or a non-zero norm would be stored as 0.

    Notes
    -----
    Per row: ``u = x / ||x||``; ``u <- R u`` if rotated; ``codes = Q_b(u)`` with the Lloyd-Max
    codebook of the working dimension; if ``qjl``, ``sign(S r)`` and ``||r||`` of the residual
    ``r = u - centroids[codes]`` with ``m`` = working dimension sign bits.

    References
    ----------
    .. [1] Zandieh, A., Daliri, M., Hadian, M., Mirrokni, V. (2025) "TurboQuant: Online Vector
       Quantization with Near-optimal Distortion Rate", arXiv:2504.19874.
    .. [2] Zandieh, A., Daliri, M., Han, I. (2024/2025) "QJL: 1-Bit Quantized JL Transform for
       KV Cache Quantization with Zero Overhead", arXiv:2406.03482.
    """
    # the numba backend's fused pass sees a non-finite value in its float64 sums of squares: it
    # scans only where that pass does not run
    x = check_matrix(x, finite=not (isinstance(kernel, str) and kernel == "numba"))
    plan = resolve_plan(spec, budget, x.shape[1], rotation_seed=rotation_seed, qjl_seed=qjl_seed,
                        norm_dtype=norm_dtype, kernel=kernel, threads=threads)
    encoded = execute(plan, x)
    return PackedCache(rows=x.shape[0], **plan.header_fields(), codes=encoded.codes, norms=encoded.norms,
                       qjl_signs=encoded.qjl_signs, residual_norms=encoded.residual_norms, meta=dict(meta or {}),
                       extras=encoded.extras)


def _from_arrays(arrays: Mapping[str, np.ndarray], where: str) -> PackedCache:
    try:
        header = json.loads(bytes(np.asarray(arrays["header"], dtype=np.uint8)).decode("utf-8"))
        fields = _header_fields(header, where)
        cache = PackedCache(
            **fields,
            codes=np.asarray(arrays["codes"]),
            norms=np.asarray(arrays["norms"]),
            qjl_signs=np.asarray(arrays["qjl_signs"]),
            residual_norms=np.asarray(arrays["residual_norms"]),
            meta=dict(header.get("meta") or {}),
            extras=_extras(arrays, header),
        )
        if cache.primitives:
            try:
                cache.spec()
            except KvasymError as exc:
                raise ValueError(f"header primitives {cache.primitives}: {exc}") from None
    except KvasymError:
        raise
    except (KeyError, ValueError, TypeError, UnicodeDecodeError) as exc:
        raise KvasymError(f"{where} is not a kvasym packed cache ({type(exc).__name__}: {exc})") from None
    _check_consistent(cache, where)
    _check_digest(header, cache, where)
    for name in ("norms", "residual_norms"):
        values = getattr(cache, name).astype(np.float64)
        bad = np.flatnonzero(~np.isfinite(values) | (values < 0))
        if bad.size:
            raise KvasymError(f"{where}: {name}[{bad[0]}] = {values[bad[0]]!r} is not a finite norm >= 0")
    return cache


def _header_fields(header: object, where: str) -> dict:
    """The :class:`PackedCache` fields a stored header gives (all but the arrays and ``meta``),
    each checked: a ValueError (TypeError, KeyError) names the first field out of place."""
    if not isinstance(header, dict):
        raise TypeError(f"header is a {type(header).__name__}, not an object")
    if header.get("norm_dtype") not in NORM_DTYPES:
        raise ValueError(f"norm_dtype {header.get('norm_dtype')!r} is not one of {NORM_DTYPES}")
    if header.get("format") != PACKED_FORMAT:
        raise KvasymError(f"{where}: packed format {header.get('format')!r}, expected {PACKED_FORMAT}")
    from .codebook import MAX_DIM, MIN_DIM
    from .schemes import MAX_BUDGET, MIN_BUDGET

    budget = _header_int(header, "budget", MIN_BUDGET, MAX_BUDGET)
    qjl = _header_bool(header, "qjl")
    scalar_bits = _header_int(header, "scalar_bits", 0, MAX_BUDGET)
    # files written before the primitives have no "primitives" key: the original pipeline
    primitives = header.get("primitives", {})
    if not isinstance(primitives, dict) or ("primitives" in header and not primitives):
        raise ValueError(f"header primitives {primitives!r} is not a non-empty mapping")
    sketch_bits = int(qjl) * (2 if primitives.get("sketch_m") == 2 else 1)
    if scalar_bits + sketch_bits != budget:
        raise ValueError(f"header scalar_bits {scalar_bits} + qjl {sketch_bits} is not the budget {budget}")
    # files written before the hadamard sketch have no "sketch" key: theirs is Gaussian
    sketch = header.get("sketch", "gaussian")
    if sketch not in SKETCH_KINDS or ("sketch" in header and not qjl):
        raise ValueError(f"header sketch {sketch!r} is not one of {SKETCH_KINDS} on a side with qjl")
    return {
        "dim": _header_int(header, "dim", MIN_DIM, MAX_DIM),
        "rows": _header_int(header, "rows", 0, 2**40),
        "budget": budget,
        "rotate": _header_bool(header, "rotate"),
        "scalar_bits": scalar_bits,
        "qjl": qjl,
        "rotation_seed": _header_int(header, "rotation_seed", 0, 2**SEED_BITS - 1),
        "qjl_seed": _header_int(header, "qjl_seed", 0, 2**SEED_BITS - 1),
        "norm_dtype": str(header["norm_dtype"]),
        "sketch": sketch,
        "primitives": primitives,
    }


def _check_digest(header: Mapping[str, object], cache: PackedCache, where: str) -> None:
    """The header's content digest present and equal to the cache's (:func:`content_digest`)."""
    if "sha256" not in header:
        raise KvasymError(f"{where}: its header has no content digest (sha256); rebuild it")
    if header.get("sha256") != content_digest(header, {**{name: getattr(cache, name) for name in _DATA_ARRAYS},
                                                     **cache.extras}):
        raise KvasymError(f"{where}: its content does not match the digest in its header (the file was edited "
                          "or corrupted); rebuild it")


def _extras(arrays: Mapping[str, np.ndarray], header: Mapping[str, object]) -> dict[str, np.ndarray]:
    """The primitives' side arrays of a stored cache; an array nobody wrote is refused."""
    unknown = sorted(set(arrays) - {"header", *_DATA_ARRAYS, *EXTRA_ARRAYS})
    if unknown:
        raise ValueError(f"unknown arrays {unknown}")
    return {name: np.asarray(arrays[name]) for name in EXTRA_ARRAYS if name in arrays}


def _check_consistent(cache: PackedCache, where: str) -> None:
    """Shapes and dtypes of a stored cache's arrays, from its header (and its primitives')."""
    work = cache.work_dim
    if cache.qjl and cache.sketch == "hadamard" and work & (work - 1):
        raise KvasymError(f"{where}: the hadamard sketch needs a power-of-two working dimension, not {work}")
    expected = _composed_layout(cache, where) if cache.primitives else _plain_layout(cache, where)
    arrays = {**{name: getattr(cache, name) for name in _DATA_ARRAYS}, **cache.extras}
    for name, (shape, dtype) in expected.items():
        array = arrays[name]
        if array.shape != shape or array.dtype != dtype:
            raise KvasymError(
                f"{where}: {name} has shape {array.shape} dtype {array.dtype}, expected {shape} {np.dtype(dtype)}"
            )
    for name in ("mean", "coord_std", "group_scale", "group_zero", "token_scale", "basis"):
        if name in cache.extras and not np.all(np.isfinite(cache.extras[name].astype(np.float64))):
            raise KvasymError(f"{where}: {name} holds a non-finite value")
    if "token_scale" in cache.extras and not np.all(cache.extras["token_scale"] > 0):
        raise KvasymError(f"{where}: token_scale holds a value <= 0 (a dual scale divides the token)")


def _plain_layout(cache: PackedCache, where: str) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Name -> (shape, dtype) of the arrays of a cache of the original pipeline."""
    if cache.extras:
        raise KvasymError(f"{where}: arrays {sorted(cache.extras)} belong to primitives its header does not record")
    work = cache.work_dim
    return {
        "codes": ((cache.rows, packed_row_bytes(work, cache.scalar_bits) if cache.scalar_bits else 0), np.uint8),
        "norms": ((cache.rows,), np.dtype(cache.norm_dtype)),
        "qjl_signs": ((cache.rows, -(-work // 8) if cache.qjl else 0), np.uint8),
        "residual_norms": ((cache.rows if cache.qjl else 0,), np.dtype(cache.norm_dtype)),
    }


def _composed_layout(cache: PackedCache, where: str) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Name -> (shape, dtype) of the arrays of a composed cache, from its header's primitives."""
    spec = cache.spec()
    work = cache.work_dim
    norms_rows = 0 if spec.scalar in GROUPED_SCALARS else cache.rows
    expected = {
        "codes": ((cache.rows, packed_row_bytes(work, cache.scalar_bits)), np.uint8),
        "norms": ((norms_rows,), np.dtype(cache.norm_dtype)),
        "qjl_signs": ((cache.rows, -(-work * spec.sketch_m // 8) if cache.qjl else 0), np.uint8),
        "residual_norms": ((cache.rows if cache.qjl else 0,), np.dtype(cache.norm_dtype)),
    }
    extras = expected_extras(cache.rows, cache.dim, spec, cache.norm_dtype)
    if set(extras) != set(cache.extras):
        raise KvasymError(f"{where}: side arrays {sorted(cache.extras)}, but its primitives need {sorted(extras)}")
    expected.update({name: (shape, np.dtype(dtype)) for name, (shape, dtype) in extras.items()})
    return expected


def save_packed(path: str | os.PathLike, caches: Mapping[str, PackedCache]) -> None:
    """Write named caches into one .npz atomically (a temporary file renamed into place).

    Parameters
    ----------
    path : str or os.PathLike
        Destination ``.npz`` file (written as given, no suffix added).
    caches : mapping of str to PackedCache
        Caches by name; array ``<name>/<key>`` holds each of :meth:`PackedCache.arrays`.

    Raises
    ------
    ValueError
        If a cache name contains ``"/"``.
    """
    for name in caches:  # checked before anything is written
        if "/" in name:
            raise ValueError(f"cache name {name!r} must not contain '/'")
    writer = PackedFileWriter(path)
    try:
        for name, cache in caches.items():
            writer.add(name, cache)
    except BaseException:
        writer.abort()
        raise
    writer.close()


class PackedFileWriter:
    """A packed-caches ``.npz`` written cache by cache, as :func:`save_packed` writes it whole.

    The archive's members are ``<name>/<key>.npy`` in the order the caches are added (stored
    uncompressed, zip64: the layout of ``numpy.savez``), so :func:`load_packed` reads it back
    bit-identical. :func:`save_packed` is this writer over a mapping of caches; a job that
    quantizes trial by trial (``kvasym stage cells``) adds each trial's caches as it makes them
    and holds one trial in memory instead of a whole cell. The file is written under a hidden
    temporary name and renamed onto ``path`` only by :meth:`close` (a writer left unclosed, or
    :meth:`abort`-ed, leaves nothing under the final name).

    Parameters
    ----------
    path : str or os.PathLike
        Destination ``.npz`` file.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        import zipfile

        self.path = Path(path)
        self._target = atomic_target(self.path)
        self._tmp = self._target.__enter__()
        self._names: set[str] = set()
        self._zip = zipfile.ZipFile(self._tmp, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True)

    def add(self, name: str, cache: PackedCache) -> None:
        """Append cache ``name`` (its :meth:`PackedCache.arrays`); a name is written once."""
        if "/" in name:
            raise ValueError(f"cache name {name!r} must not contain '/'")
        if name in self._names:
            raise ValueError(f"cache name {name!r} written twice")
        self._names.add(name)
        for key, value in cache.arrays().items():
            with self._zip.open(f"{name}/{key}.npy", "w", force_zip64=True) as fid:
                np.lib.format.write_array(fid, np.asanyarray(value), allow_pickle=False)

    def close(self) -> None:
        """Finish the archive and rename it onto its path."""
        self._zip.close()
        self._target.__exit__(None, None, None)

    def abort(self) -> None:
        """Drop the partial archive (nothing is left under the final name)."""
        self._zip.close()
        error = KvasymError("aborted")
        self._target.__exit__(KvasymError, error, None)  # deletes the temporary file


def read_npz_arrays(path: str | os.PathLike, what: str) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` file (no pickles), or a KvasymError naming the file and what
    it should have been (``what``, e.g. "kvasym packed cache") when it is missing, a plain
    ``.npy`` array, or not a readable archive.

    Parameters
    ----------
    path : str or os.PathLike
        The file to read (``allow_pickle=False``).
    what : str
        What the file should be, for error messages.

    Returns
    -------
    dict of str to numpy.ndarray
        Every array of the archive, loaded into memory.

    Raises
    ------
    KvasymError
        If the file is missing, is a plain ``.npy`` array, or cannot be parsed as an ``.npz``.
    """
    path = Path(path)
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise KvasymError(f"{path} is a plain .npy array, not a {what} (.npz)")
        with loaded as npz:
            return {key: npz[key] for key in npz.files}
    except KvasymError:
        raise
    except FileNotFoundError:
        raise KvasymError(f"{path}: no such file") from None
    except Exception as exc:  # noqa: BLE001 - any failure to parse the file is the file's fault
        # zipfile and numpy raise many types for corrupt archives (BadZipFile, EOFError,
        # NotImplementedError for a mangled compression field, zlib.error, ValueError for an
        # object array refused by allow_pickle=False...)
        reason = str(exc)
        if "pickled" in reason or "allow_pickle" in reason:
            # numpy's advice to load it unsafely is not one kvasym will follow
            reason = "it holds pickled (object) data, which kvasym never loads"
        raise DamagedFile(path, f"not a readable .npz {what} ({type(exc).__name__}: {reason})") from None


def load_packed(path: str | os.PathLike) -> dict[str, PackedCache]:
    """Read every named cache of a file written by :func:`save_packed`.

    Parameters
    ----------
    path : str or os.PathLike
        An ``.npz`` file written by :func:`save_packed`.

    Returns
    -------
    dict of str to PackedCache
        The caches by name (sorted), bit-identical to those saved.

    Raises
    ------
    KvasymError
        If the file is unreadable, holds no cache, a header is malformed or of another
        :data:`PACKED_FORMAT`, or an array's shape or dtype disagrees with its header.
    """
    path = Path(path)
    arrays = read_npz_arrays(path, "packed cache")
    names = sorted({key.split("/", 1)[0] for key in arrays if "/" in key})
    if not names:
        raise KvasymError(f"{path} holds no packed cache")
    out = {}
    for name in names:
        prefix = f"{name}/"
        sub = {key[len(prefix) :]: value for key, value in arrays.items() if key.startswith(prefix)}
        try:
            out[name] = _from_arrays(sub, f"{path}[{name}]")
        except KvasymError as exc:
            # whatever is wrong inside a cache, the file as a whole is what must be rebuilt
            where = f"{path}[{name}]"
            raise DamagedFile(path, str(exc).removeprefix(where).lstrip(": "), where=where) from None
    return out
