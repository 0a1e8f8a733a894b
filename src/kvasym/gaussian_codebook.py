"""Lloyd-Max codebooks for the standard normal law N(0, 1), 0 to 8 bits.

Used for coordinates that are not those of a rotated unit vector (the Beta codebooks of
:mod:`kvasym.codebook` then do not apply): a coordinate of standard deviation ``sigma`` is
quantized with the N(0, 1) codebook scaled by ``sigma``, which is the Lloyd-Max quantizer of
N(0, sigma^2). Zero bits is the single centroid 0 (distortion ``sigma^2``).

Lloyd's iteration: thresholds are midpoints of neighbouring centroids, centroids are the
conditional means ``(phi(a) - phi(b)) / (Phi(b) - Phi(a))`` of their cells; started from the
quantiles of N(0, 3) (the asymptotically optimal point density, proportional to phi^(1/3)),
iterated until the centroids move by less than 1e-10.
The distortion is summed cell by cell from the closed forms of the truncated normal's moments
(``int_a^b t^2 phi = P + a phi(a) - b phi(b)``), which avoids the cancellation in ``1 - sum_k P_k c_k^2``.

References
----------
.. [1] Max, J. (1960) "Quantizing for minimum distortion", IRE Trans. Information Theory
   6(1):7-12 (Table I: 1 bit +-0.7979, MSE 0.3634; 2 bits +-0.4528, +-1.510, MSE 0.1175).
.. [2] Lloyd, S. (1982) "Least squares quantization in PCM", IEEE Trans. Information Theory
   28(2):129-137.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.special import ndtr, ndtri

from .errors import KvasymError

__all__ = ["GaussianCodebook", "gaussian_codebook", "gaussian_mse_table"]

MAX_BITS = 8
_TOL = 1e-10
_MAX_ITER = 200_000


@dataclass(frozen=True)
class GaussianCodebook:
    """The ``bits``-bit Lloyd-Max quantizer of N(0, 1).

    Parameters
    ----------
    bits : int
        Bits per coordinate, 0..8.
    centroids : numpy.ndarray
        ``(2**bits,)`` increasing reconstruction levels.
    thresholds : numpy.ndarray
        ``(2**bits - 1,)`` increasing cell boundaries.
    mse : float
        ``E (X - Q(X))^2`` for ``X ~ N(0, 1)``.
    """

    bits: int
    centroids: np.ndarray
    thresholds: np.ndarray
    mse: float


def _phi(t: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * t * t) / np.sqrt(2.0 * np.pi)


#: Version of the on-disk entries (``gaussian_lloyd_max_v<N>_b<bits>.json`` in
#: :func:`kvasym.codebook.cache_dir`).
CACHE_FORMAT = 1
#: A cached entry is used only if one more Lloyd step moves no centroid by more than this.
VERIFY_TOLERANCE = 1e-9


def _lloyd_step(centroids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One Lloyd step: (new centroids, cell masses, cell edges, thresholds) of ``centroids``."""
    thresholds = 0.5 * (centroids[1:] + centroids[:-1])
    edges = np.concatenate(([-np.inf], thresholds, [np.inf]))
    mass = ndtr(edges[1:]) - ndtr(edges[:-1])
    new = (_phi(edges[:-1]) - _phi(edges[1:])) / mass
    return 0.5 * (new - new[::-1]), mass, edges, thresholds


def _from_disk(bits: int) -> np.ndarray | None:
    """Centroids cached on disk by an earlier process, if they are still a Lloyd-Max fixed point."""
    import json

    from .codebook import cache_dir

    path = cache_dir() / f"gaussian_lloyd_max_v{CACHE_FORMAT}_b{bits}.json"
    try:
        data = json.loads(path.read_text())
        centroids = np.asarray(data["centroids"], dtype=np.float64)
        if data.get("format") != CACHE_FORMAT or data.get("bits") != bits or centroids.shape != (1 << bits,):
            return None
        if not np.all(np.diff(centroids) > 0):
            return None
        if np.max(np.abs(_lloyd_step(centroids)[0] - centroids)) > VERIFY_TOLERANCE:
            return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return centroids


def _to_disk(bits: int, centroids: np.ndarray) -> None:
    from .codebook import cache_dir, write_cache_entry

    path = cache_dir() / f"gaussian_lloyd_max_v{CACHE_FORMAT}_b{bits}.json"
    write_cache_entry(path, {"format": CACHE_FORMAT, "bits": bits, "centroids": centroids.tolist()})


@lru_cache(maxsize=None)
def gaussian_codebook(bits: int) -> GaussianCodebook:
    """The Lloyd-Max codebook of N(0, 1) with ``bits`` bits (cached in memory, and on disk beside
    the Beta codebooks: an entry is used only if it is still a Lloyd fixed point to 1e-9).

    Parameters
    ----------
    bits : int
        Bits per coordinate, 0..8.

    Returns
    -------
    GaussianCodebook

    Raises
    ------
    KvasymError
        If ``bits`` is not an integer in 0..8.
    """
    if isinstance(bits, bool) or not isinstance(bits, int) or not 0 <= bits <= MAX_BITS:
        raise KvasymError(f"Gaussian codebook bits must be an integer in 0..{MAX_BITS}, got {bits!r}")
    levels = 1 << bits
    if levels == 1:
        return GaussianCodebook(0, np.zeros(1), np.zeros(0), 1.0)
    cached = _from_disk(bits)
    centroids = cached if cached is not None else np.sqrt(3.0) * ndtri((np.arange(levels) + 0.5) / levels)
    for _ in range(0 if cached is not None else _MAX_ITER):
        new = _lloyd_step(centroids)[0]  # symmetrised: exact symmetry about 0
        moved = float(np.max(np.abs(new - centroids)))
        centroids = new
        if moved < _TOL:
            break
    if cached is None:
        _to_disk(bits, centroids)
    _, mass, edges, thresholds = _lloyd_step(centroids)
    # E (X - c_k)^2 on [a, b]: P + a phi(a) - b phi(b) - 2 c (phi(a) - phi(b)) + c^2 P (no cancellation)
    lo, hi = edges[:-1], edges[1:]
    finite_lo, finite_hi = np.where(np.isfinite(lo), lo, 0.0), np.where(np.isfinite(hi), hi, 0.0)
    t_phi_lo, t_phi_hi = finite_lo * _phi(finite_lo), finite_hi * _phi(finite_hi)
    cells = mass + t_phi_lo - t_phi_hi - 2.0 * centroids * (_phi(lo) - _phi(hi)) + centroids**2 * mass
    mse = float(np.sum(cells))
    for array in (centroids, thresholds):
        array.setflags(write=False)
    return GaussianCodebook(bits, centroids, thresholds, mse)


def gaussian_mse_table(max_bits: int = MAX_BITS) -> np.ndarray:
    """Distortions ``D(b)`` of the N(0, 1) Lloyd-Max quantizers for ``b = 0..max_bits``.

    Parameters
    ----------
    max_bits : int, optional
        Largest width (default 8).

    Returns
    -------
    numpy.ndarray
        ``(max_bits + 1,)`` decreasing distortions, ``D(0) = 1``.
    """
    return np.array([gaussian_codebook(b).mse for b in range(max_bits + 1)])
