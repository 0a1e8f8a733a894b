"""Centring a quantized block: subtract its mean vector, stored once as side information.

A block is one matrix quantized at once (one trial, or one layer and head of a real cache):
``(rows, dim)``. Real keys after RoPE are far from centred (most of their energy can sit in
the mean vector), which a per-row norm and a zero-symmetric codebook spend bits on in every row;
centring moves that energy into one stored vector of ``dim`` floats.

The mean is computed in float64 and rounded to its storage dtype; the rows are centred on the
*stored* mean, so the decoder, which only has the stored mean, adds back exactly what was taken
away: ``x = (x - mu_s) + mu_s`` up to float64 rounding.
"""

from __future__ import annotations

import numpy as np

from .errors import KvasymError

__all__ = ["MEAN_DTYPES", "block_mean", "subtract_mean", "add_mean"]

#: Storage dtypes of the mean vector.
MEAN_DTYPES = ("float16", "float32")


def block_mean(x: np.ndarray, dtype: str = "float32") -> np.ndarray:
    """The block's mean vector ``mu = (1/N) sum_i x_i``, computed in float64, stored in ``dtype``.

    Parameters
    ----------
    x : numpy.ndarray
        ``(rows, dim)`` finite matrix.
    dtype : {"float16", "float32"}, optional
        Storage dtype of the mean (default ``"float32"``).

    Returns
    -------
    numpy.ndarray
        ``(dim,)`` mean in ``dtype``.

    Raises
    ------
    KvasymError
        If ``dtype`` is unknown or a mean coordinate is beyond its range.
    """
    if dtype not in MEAN_DTYPES:
        raise KvasymError(f"the mean's dtype must be one of {', '.join(MEAN_DTYPES)}, got {dtype!r}")
    mean = np.mean(np.asarray(x, dtype=np.float64), axis=0)
    limit = float(np.finfo(dtype).max)
    if np.any(np.abs(mean) > limit):
        col = int(np.argmax(np.abs(mean)))
        raise KvasymError(f"mean of column {col} is {mean[col]:.3g}, beyond {dtype}'s range ({limit:.3g}); "
                          "use norm_dtype float32 or rescale the cache")
    return mean.astype(dtype)


def subtract_mean(x: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """``x - mu_s`` in float64 (``mu_s`` the stored mean).

    Parameters
    ----------
    x : numpy.ndarray
        ``(rows, dim)`` matrix.
    mean : numpy.ndarray
        ``(dim,)`` stored mean.

    Returns
    -------
    numpy.ndarray
        ``(rows, dim)`` float64 centred rows.
    """
    return np.asarray(x, dtype=np.float64) - np.asarray(mean, dtype=np.float64)[None, :]


def add_mean(x: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """``x + mu_s`` in ``x``'s dtype: the inverse of :func:`subtract_mean`.

    Parameters
    ----------
    x : numpy.ndarray
        ``(rows, dim)`` centred (reconstructed) rows.
    mean : numpy.ndarray
        ``(dim,)`` stored mean.

    Returns
    -------
    numpy.ndarray
        ``(rows, dim)`` rows with the mean added back.
    """
    return x + np.asarray(mean).astype(x.dtype)[None, :]
