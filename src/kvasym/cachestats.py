"""Descriptive statistics of a K (or V) cache: how far it is from an isotropic Gaussian.

Used to compare synthetic families with each other and, later, with real caches: tail weight
(excess kurtosis of the coordinates), effective dimension (participation ratio of the
covariance spectrum), outlier channels (share of energy in the top channels) and the share of
energy carried by the mean vector.
"""

from __future__ import annotations

import numpy as np

#: Channels counted as "top" in :func:`cache_statistics` (energy share of the strongest ones).
TOP_CHANNELS = 4


def cache_statistics(x: np.ndarray) -> dict[str, float]:
    """Statistics of a (rows, dim) matrix, float64; all finite for finite input with >= 2 rows.

    - ``excess_kurtosis``: of all coordinates pooled after centring each channel (0 for a
      Gaussian; +inf-like for heavy tails, reported as computed);
    - ``participation_ratio``: (sum lambda)^2 / sum lambda^2 of the channel covariance, in
      1..dim (dim for isotropic data, ~rank for low-rank data);
    - ``top_channel_energy``: share of sum x^2 in the TOP_CHANNELS strongest channels;
    - ``mean_energy``: ||mean row||^2 * rows / sum ||x||^2, the share of energy in the mean.
    """
    x = np.asarray(x, dtype=np.float64)
    rows, dim = x.shape
    # Scale first: heavy tails (nu -> 1) reach 1e30 and their squares would overflow.
    peak = float(np.max(np.abs(x))) if x.size else 0.0
    z = x / peak if peak > 0 else x
    energy = np.sum(z * z, axis=0)
    total = float(np.sum(energy))
    centred = z - z.mean(axis=0)
    m2 = np.mean(centred**2)
    m4 = np.mean(centred**4)
    kurtosis = float(m4 / m2**2 - 3.0) if m2 > 0 else 0.0
    # (sum lambda)^2 / sum lambda^2 = trace(C)^2 / ||C||_F^2: no eigendecomposition needed;
    # the smaller of the two Gram matrices has the same non-zero spectrum.
    gram = centred.T @ centred if dim <= rows else centred @ centred.T
    frob2 = float(np.sum(gram * gram))
    pr = float(np.trace(gram) ** 2 / frob2) if rows >= 2 and frob2 > 0 else 0.0
    top = float(np.sum(np.sort(energy)[::-1][:TOP_CHANNELS]) / total) if total > 0 else 0.0
    mean_energy = float(rows * np.sum(z.mean(axis=0) ** 2) / total) if total > 0 else 0.0
    return {
        "excess_kurtosis": kurtosis,
        "participation_ratio": pr,
        "top_channel_energy": top,
        "mean_energy": mean_energy,
    }
