"""Input rows and their norms: the checks of a matrix to quantize, row norms, and the storage
of float side information (norms, residual norms, scales).

Every float a packed cache stores beside its codes goes through :func:`store_norms` (or, for
min-max group parameters, :func:`check_stored_precision`): refused, naming the row and the
remedy, when its storage dtype cannot keep it. This module sits low in the import graph: the
packed cache (:mod:`kvasym.cache`), the composed sides (:mod:`kvasym.composed`), the backends
(:mod:`kvasym.backends`), the plan (:mod:`kvasym.plan`) and the min-max quantizer (:mod:`kvasym.minmax`) all use it.
"""

from __future__ import annotations

import numpy as np

from .errors import KvasymError

__all__ = ["NORM_DTYPES", "SIDE_PRECISION", "check_matrix", "check_finite", "row_norms", "store_norms",
           "check_stored_precision", "norms_and_reciprocals"]

NORM_DTYPES = ("float16", "float32")


def check_matrix(x: object, what: str = "input", *, finite: bool = True) -> np.ndarray:
    """A finite 2-D float matrix with at least one row and one column, or a clear KvasymError.

    Parameters
    ----------
    x : object
        Anything ``numpy.asarray`` accepts.
    what : str, optional
        Name used in error messages (default ``"input"``).
    finite : bool, optional
        Scan for non-finite values (default True). A caller that passes False must call
        :func:`check_finite` itself before it uses a value (the fused numba encode does so
        when its own sums of squares show a non-finite row, saving a pass over the batch).

    Returns
    -------
    numpy.ndarray
        ``x`` itself as float32 or float64; integer arrays are converted to float64.

    Raises
    ------
    KvasymError
        If ``x`` is not numeric (bool included), not 2-D, empty, or has a non-finite value.
    """
    array = np.asarray(x)
    if array.dtype.kind not in "fiu" or array.dtype.kind == "b":
        raise KvasymError(f"{what} must be a numeric array, got dtype {array.dtype}")
    if array.ndim != 2:
        raise KvasymError(f"{what} must be 2-D (rows are vectors), got shape {array.shape}")
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise KvasymError(f"{what} is empty (shape {array.shape})")
    if array.dtype not in (np.float32, np.float64):
        array = array.astype(np.float64)
    if finite:
        check_finite(array, what)
    return array


def check_finite(array: np.ndarray, what: str = "input") -> None:
    """Raise a KvasymError naming the count and the first position of non-finite values."""
    bad = ~np.isfinite(array)
    if bad.any():
        row, col = (int(i) for i in np.argwhere(bad)[0])
        raise KvasymError(f"{what} has {int(bad.sum())} non-finite values (first at row {row}, column {col})")


def row_norms(x: np.ndarray) -> np.ndarray:
    """Euclidean row norms in float64, without overflow for entries up to float64's range.

    float32 rows are summed in float64 (their squares cannot overflow it); float64 rows whose
    sum of squares leaves float64's safe range are rescaled by their max |entry| first.

    Parameters
    ----------
    x : numpy.ndarray
        2-D float32 or float64 matrix.

    Returns
    -------
    numpy.ndarray
        ``(rows,)`` float64 norms ``sqrt(sum_j x_ij^2)``; for a rescaled row
        ``m * sqrt(sum_j (x_ij / m)^2)`` with ``m = max_j |x_ij|``.
    """
    squares = np.einsum("ij,ij->i", x, x, dtype=np.float64)
    risky = ~((squares > 1e-290) & (squares < 1e290)) & (x.dtype != np.float32)
    norms = np.sqrt(squares)
    if np.any(risky):
        rows = np.asarray(x[risky], dtype=np.float64)
        peak = np.max(np.abs(rows), axis=1)
        safe = np.where(peak > 0, peak, 1.0)
        scaled = rows / safe[:, None]
        norms[risky] = peak * np.sqrt(np.einsum("ij,ij->i", scaled, scaled))
    return norms


def store_norms(norms: np.ndarray, norm_dtype: str, what: str) -> np.ndarray:
    """``norms`` in their storage dtype ``norm_dtype``; a :class:`KvasymError` naming the row and
    ``what`` (norm, residual norm, ...) when a value is beyond the dtype's range, a non-zero one
    would be stored as 0, or the storage error exceeds :func:`check_stored_precision`'s bound."""
    if norm_dtype not in NORM_DTYPES:
        raise KvasymError(f"norm_dtype must be one of {', '.join(NORM_DTYPES)}, got {norm_dtype!r}")
    limit = float(np.finfo(norm_dtype).max)
    too_big = norms > limit
    if np.any(too_big):
        row = int(np.argmax(too_big))
        # float32 is the widest storage offered, so past its range only rescaling helps.
        remedy = "use norm_dtype float32 or rescale the cache" if norm_dtype == "float16" else "rescale the cache"
        raise KvasymError(f"{what} of row {row} is {norms[row]:.3g}, beyond {norm_dtype}'s range ({limit:.3g}); "
                          f"{remedy}")
    stored = norms.astype(norm_dtype)
    _check_norms_kept(norms, stored, norm_dtype, what)
    check_stored_precision(np.abs(stored - norms), float(np.max(norms, initial=0.0)), f"{what}s", norm_dtype)
    return stored


#: The largest error a float side array (norms, residual norms, coordinate scales, min-max group
#: parameters) may take on from its storage dtype, relative to the largest value of its kind in
#: the block. In a dtype's normal range rounding is at most 2^-11 (float16) of a value, so only
#: a block whose values sit in the subnormal range, where the resolution is absolute (6e-8 for
#: float16), can reach it: such a cache would be reconstructed with errors of its own size.
SIDE_PRECISION = 2.0 ** -9


def check_stored_precision(error: np.ndarray, scale: float, what: str, dtype: str) -> None:
    """Refuse side information that ``dtype`` cannot keep to :data:`SIDE_PRECISION` of ``scale``
    (the block's largest value of that kind): ``max error > SIDE_PRECISION * scale``.

    Parameters
    ----------
    error : numpy.ndarray
        What storing moves each value (or what it moves the reconstruction by), ``>= 0``, any
        shape: ``|stored - exact|`` for a norm.
    scale : float
        The magnitude the errors are measured against (0: nothing to check).
    what : str
        The values' name, for the message.
    dtype : str
        Their storage dtype.

    Raises
    ------
    KvasymError
        Naming the error, the scale and the remedy.
    """
    if not scale > 0 or error.size == 0:
        return
    error = float(np.max(error))
    if error > SIDE_PRECISION * scale:
        tiny = float(np.finfo(dtype).tiny)
        remedy = "use norm_dtype float32 or rescale the cache" if dtype == "float16" else "rescale the cache"
        raise KvasymError(
            f"{what} stored in {dtype} would be off by up to {error:.2g}, {error / scale:.1%} of the largest "
            f"({scale:.3g}): below {tiny:.3g} {dtype} keeps only an absolute resolution, and this cache's values "
            f"sit there; {remedy}"
        )


def _check_norms_kept(norms: np.ndarray, stored: np.ndarray, norm_dtype: str, what: str = "norm") -> None:
    """A non-zero row whose norm rounds to 0 in ``norm_dtype`` would dequantize to the zero
    vector: the whole row silently lost. Refuse it (subnormal norms pass, and are refused by
    :func:`check_stored_precision` only when the whole block is that small)."""
    lost = (norms > 0) & (stored == 0)
    if np.any(lost):
        row = int(np.argmax(lost))
        smallest = float(np.finfo(norm_dtype).smallest_subnormal)
        remedy = "use norm_dtype float32 or rescale the cache" if norm_dtype == "float16" else "rescale the cache"
        lost_what = "the row lost" if what == "norm" else f"the row's {what} lost"
        raise KvasymError(
            f"{what} of row {row} is {norms[row]:.3g}, below {norm_dtype}'s smallest positive value "
            f"({smallest:.3g}): it would be stored as 0 and {lost_what}; {remedy}"
        )


def norms_and_reciprocals(x: np.ndarray, norm_dtype: str) -> tuple[np.ndarray, np.ndarray, bool]:
    """The stored norms of the rows of ``x`` (refused when ``norm_dtype`` cannot keep one), the
    float64 reciprocals ``1 / stored`` (0 for a zero row), and whether a float32 batch must be
    normalized in float64 because such a reciprocal overflows float32 (a norm below ~3e-39)."""
    exact_norms = row_norms(x)
    norms = store_norms(exact_norms, norm_dtype, "norm")
    stored = norms.astype(np.float64)
    inv = np.divide(1.0, stored, out=np.zeros_like(stored), where=stored > 0)
    tiny_norms = bool(x.dtype == np.float32 and np.any(inv > np.finfo(np.float32).max))
    return norms, inv, tiny_norms
