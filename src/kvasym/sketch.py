"""The 1-bit QJL sketch of a residual.

For a residual ``r`` in R^D, the sketch stores ``sign(S r)`` (m bits, packed) and ``||r||``,
with ``S`` an ``m x D`` matrix of i.i.d. N(0, 1) entries rebuilt from a seed. The estimate

    r_hat = sqrt(pi/2) / m * ||r|| * S^T sign(S r)

is unbiased: for a row s of S, E[s sign(<s, r>)] = sqrt(2/pi) r / ||r||. For a fixed query q,

    Var <q, r_hat> = [(pi/2) ||q||^2 ||r||^2 - <q, r>^2] / m,

about ``(pi/2) ||r||^2 ||q||^2 / m``: the sketch trades the residual's magnitude information for
sign bits, and its inner products carry pi/2 times the variance of a residual of the same norm
spread evenly, the mechanism behind claim C1. ``sign(0)`` is taken as +1.

References
----------
.. [1] Zandieh, A., Daliri, M., Han, I. (2024/2025) "QJL: 1-Bit Quantized JL Transform for KV
   Cache Quantization with Zero Overhead", arXiv:2406.03482.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .packing import pack_signs, unpack_signs

__all__ = ["SQRT_HALF_PI", "gaussian_matrix", "QJLSketch"]

SQRT_HALF_PI = float(np.sqrt(np.pi / 2))


@lru_cache(maxsize=8)
def gaussian_matrix(rows: int, cols: int, seed: int, dtype: str = "float32") -> np.ndarray:
    """The seeded N(0, 1) sketch matrix (read-only). Entries are float64 draws rounded to
    float32 whatever ``dtype`` is asked, so encoding and decoding in different precisions use
    the very same matrix.

    Parameters
    ----------
    rows : int
        Number of sign bits ``m``.
    cols : int
        Residual dimension ``D``.
    seed : int
        Seed of ``Generator(PCG64(seed)).standard_normal((rows, cols))``.
    dtype : str, optional
        Output dtype name (default ``"float32"``); values are the float32-rounded draws.

    Returns
    -------
    numpy.ndarray
        The ``(rows, cols)`` matrix ``S`` (read-only; the last 8 are memoized).
    """
    gen = np.random.Generator(np.random.PCG64(seed))
    matrix = gen.standard_normal((rows, cols)).astype(np.float32).astype(dtype)
    matrix.setflags(write=False)
    return matrix


@dataclass(frozen=True)
class QJLSketch:
    """A QJL sketch of dimension ``dim`` with ``rows`` sign bits, rebuilt from ``seed``.

    Parameters
    ----------
    dim : int
        Residual dimension ``D``.
    rows : int
        Number of sign bits ``m`` per residual.
    seed : int
        Seed of the Gaussian matrix ``S`` (:func:`gaussian_matrix`).

    Notes
    -----
    ``r_hat = sqrt(pi/2) / m * ||r|| * S^T sign(S r)``, unbiased because
    ``E[s sign(<s, r>)] = sqrt(2/pi) r / ||r||`` for ``s ~ N(0, I)``; for a fixed query ``q``,
    ``Var <q, r_hat> = [(pi/2) ||q||^2 ||r||^2 - <q, r>^2] / m``.

    References
    ----------
    .. [1] Zandieh, A., Daliri, M., Han, I. (2024/2025) "QJL: 1-Bit Quantized JL Transform for
       KV Cache Quantization with Zero Overhead", arXiv:2406.03482.
    """

    dim: int
    rows: int
    seed: int

    def matrix(self, dtype: str = "float32") -> np.ndarray:
        """The ``(rows, dim)`` Gaussian matrix ``S`` in ``dtype`` (see :func:`gaussian_matrix`).

        Parameters
        ----------
        dtype : str, optional
            Output dtype name (default ``"float32"``).

        Returns
        -------
        numpy.ndarray
            The read-only matrix, the same float32-rounded values in every dtype.
        """
        return gaussian_matrix(self.rows, self.dim, int(self.seed), dtype)

    def encode(self, residual: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(packed signs (N, ceil(rows/8)) uint8, residual norms (N,) float64) of residual rows.

        Parameters
        ----------
        residual : array_like
            ``(N, dim)`` residual rows; the projections ``S r`` are computed in their dtype.

        Returns
        -------
        signs : numpy.ndarray
            ``pack_signs(S r < 0)``: bit set = negative projection (``sign(0) = +1``).
        norms : numpy.ndarray
            ``||r||`` of each row, accumulated in float64.
        """
        residual = np.asarray(residual)
        s = self.matrix(residual.dtype.name)
        projections = residual @ s.T
        norms = np.sqrt(np.einsum("ij,ij->i", residual, residual, dtype=np.float64))
        return pack_signs(projections < 0), norms

    def decode(self, packed_signs: np.ndarray, norms: np.ndarray, dtype: str = "float32") -> np.ndarray:
        """r_hat rows (N, dim) from packed signs and residual norms.

        Parameters
        ----------
        packed_signs : numpy.ndarray
            Packed signs from :meth:`encode`.
        norms : array_like
            Residual norms ``||r||`` (N,).
        dtype : str, optional
            Arithmetic and output dtype (default ``"float32"``).

        Returns
        -------
        numpy.ndarray
            ``r_hat = sqrt(pi/2) / m * ||r|| * S^T sign(S r)``, shape ``(N, dim)``.
        """
        s = self.matrix(dtype)
        signs = 1 - 2 * unpack_signs(packed_signs, self.rows).astype(dtype)
        scale = (SQRT_HALF_PI / self.rows) * np.asarray(norms, dtype=np.float64)
        return (signs @ s) * scale.astype(dtype)[:, None]
