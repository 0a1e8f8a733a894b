"""Descriptive statistics of a K (or V) cache: how far it is from an isotropic Gaussian.

Used to compare synthetic families with each other and, later, with real caches: tail weight
(excess kurtosis of the coordinates), effective dimension (participation ratio of the
covariance spectrum), outlier channels (share of energy in the top channels) and the share of
energy carried by the mean vector.
"""

from __future__ import annotations

import numpy as np

from .errors import KvasymError

#: Channels counted as "top" in :func:`cache_statistics` (energy share of the strongest ones).
TOP_CHANNELS = 4
#: The statistics, in the order :func:`cache_statistics` returns them.
STATISTICS = ("excess_kurtosis", "participation_ratio", "top_channel_energy", "mean_energy")


def cache_statistics(x: np.ndarray) -> dict[str, float]:
    """Statistics of a (rows, dim) matrix, float64; all finite for finite input with >= 2 rows.

    - ``excess_kurtosis``: of all coordinates pooled after centring each channel (0 for a
      Gaussian; +inf-like for heavy tails, reported as computed);
    - ``participation_ratio``: (sum lambda)^2 / sum lambda^2 of the channel covariance, in
      1..dim (dim for isotropic data, ~rank for low-rank data);
    - ``top_channel_energy``: share of sum x^2 in the TOP_CHANNELS strongest channels;
    - ``mean_energy``: ||mean row||^2 * rows / sum ||x||^2, the share of energy in the mean.
    """
    return {name: float(value) for name, value in batched_cache_statistics(np.asarray(x)).items()}


def batched_cache_statistics(x: np.ndarray) -> dict[str, np.ndarray]:
    """:func:`kvasym.cachestats.cache_statistics` of each (rows, dim) matrix of a
    (..., rows, dim) stack: a dict of arrays of shape ``x.shape[:-2]``, float64.

    Vectorized over the leading axes; each matrix is scaled by its own peak first.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim < 2:
        raise KvasymError(f"batched_cache_statistics needs a (..., rows, dim) array, got shape {x.shape}")
    rows, dim = x.shape[-2:]
    batch = x.shape[:-2]
    if rows == 0 or dim == 0:
        zeros = np.zeros(batch)
        return {name: zeros.copy() for name in STATISTICS}
    peak = np.max(np.abs(x), axis=(-2, -1), keepdims=True)
    z = np.divide(x, peak, out=x.copy(), where=peak > 0)
    energy = np.sum(z * z, axis=-2)  # (..., dim)
    total = np.sum(energy, axis=-1)
    mean_row = z.mean(axis=-2, keepdims=True)
    centred = z - mean_row
    m2 = np.mean(centred**2, axis=(-2, -1))
    m4 = np.mean(centred**4, axis=(-2, -1))
    safe_m2 = np.where(m2 > 0, m2, 1.0)
    kurtosis = np.where(m2 > 0, m4 / safe_m2**2 - 3.0, 0.0)
    ct = np.swapaxes(centred, -1, -2)
    gram = ct @ centred if dim <= rows else centred @ ct
    frob2 = np.sum(gram * gram, axis=(-2, -1))
    trace = np.trace(gram, axis1=-2, axis2=-1)
    ok = (frob2 > 0) & (rows >= 2)
    pr = np.where(ok, trace**2 / np.where(ok, frob2, 1.0), 0.0)
    top = np.sum(np.sort(energy, axis=-1)[..., ::-1][..., :TOP_CHANNELS], axis=-1)
    has = total > 0
    safe_total = np.where(has, total, 1.0)
    top_share = np.where(has, top / safe_total, 0.0)
    mean_share = np.where(has, rows * np.sum(mean_row[..., 0, :] ** 2, axis=-1) / safe_total, 0.0)
    return {
        "excess_kurtosis": kurtosis,
        "participation_ratio": pr,
        "top_channel_energy": top_share,
        "mean_energy": mean_share,
    }
