"""Randomized Walsh-Hadamard rotation.

``R x = H D x / sqrt(D)`` where ``D`` is a diagonal of random signs (from a seed) and ``H`` the
Sylvester Hadamard matrix of order ``D`` (a power of two). ``R`` is orthogonal, so the inverse
is ``D H y / sqrt(D)`` (``H`` is symmetric and ``H H = D I``).

Non-power-of-two dimensions are zero-padded to the next power of two before rotating: the
rotated vector has ``padded_dim`` coordinates, all of which are stored by the quantizer (the
measured bits per coordinate of a packed cache include that padding overhead), and the inverse
drops the padding again, so ``inverse(forward(x)) == x`` up to float rounding.

The fast transform uses the Kronecker factorisation ``H_D = H_a (x) H_b (x) ...`` with factors
of order at most :data:`MAX_FACTOR`: each factor is one small BLAS matmul over a reshaped view of
the batch. With bounded factor order this is ``O(d log d)`` per row like the butterfly, but
makes ``log_F d`` passes over memory instead of ``log_2 d``, which is what costs time in numpy.
:func:`fwht_butterfly` is the textbook butterfly, kept as the independent reference in tests.

References
----------
.. [1] Ailon, N., Chazelle, B. (2009) "The fast Johnson-Lindenstrauss transform and approximate
   nearest neighbors", SIAM J. Comput. 39(1):302-322 (the randomized Hadamard transform ``H D``).
.. [2] Zandieh, A., Daliri, M., Hadian, M., Mirrokni, V. (2025) "TurboQuant: Online Vector
   Quantization with Near-optimal Distortion Rate", arXiv:2504.19874 (a random rotation before
   scalar quantization).
.. [3] Mezzadri, F. (2007) "How to generate random matrices from the classical compact groups",
   Notices of the AMS 54(5):592-604 (:func:`haar_orthogonal`: the QR factor of a Gaussian matrix
   with the signs of R's diagonal moved into Q is Haar-distributed).

:class:`HaarRotation` is the ablation's alternative (issue 14, point 9): a dense Haar-random
orthogonal matrix, ``O(d^2)`` per row and no padding, against which the WHT's structure is tested
(the WHT maps a one-hot vector to the flat vector ``+-1/sqrt(D)``; a Haar rotation maps it to a
uniform point of the sphere).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .errors import KvasymError

__all__ = [
    "MAX_FACTOR",
    "next_power_of_two",
    "hadamard_matrix",
    "fwht",
    "fwht_butterfly",
    "RandomizedHadamard",
    "haar_orthogonal",
    "HaarRotation",
]

#: Largest Hadamard factor applied as one matmul (a measured sweet spot for numpy + OpenBLAS).
MAX_FACTOR = 32


def next_power_of_two(dim: int) -> int:
    """Smallest power of two >= dim.

    Parameters
    ----------
    dim : int
        A positive dimension.

    Returns
    -------
    int
        ``2**ceil(log2 dim)`` (``dim`` itself when it is a power of two).

    Raises
    ------
    KvasymError
        If ``dim < 1``.
    """
    if dim < 1:
        raise KvasymError(f"dimension must be >= 1, got {dim}")
    return 1 << (int(dim) - 1).bit_length()


@lru_cache(maxsize=None)
def hadamard_matrix(order: int, dtype: str = "float64") -> np.ndarray:
    """Unnormalized Sylvester Hadamard matrix of a power-of-two order (entries +-1).

    Parameters
    ----------
    order : int
        Matrix order, a power of two.
    dtype : str, optional
        Output dtype name (default ``"float64"``).

    Returns
    -------
    numpy.ndarray
        ``H_order`` (read-only, memoized), with ``H_1 = [1]`` and
        ``H_2k = [[H_k, H_k], [H_k, -H_k]]``; symmetric, ``H H = order * I``.

    Raises
    ------
    KvasymError
        If ``order`` is not a positive power of two.
    """
    if order < 1 or order & (order - 1):
        raise KvasymError(f"Hadamard order must be a power of two, got {order}")
    h = np.ones((1, 1), dtype=np.float64)
    while h.shape[0] < order:
        h = np.block([[h, h], [h, -h]])
    out = h.astype(dtype)
    out.setflags(write=False)
    return out


def _factors(order: int) -> tuple[int, ...]:
    """Split a power of two into near-equal power-of-two factors, each <= MAX_FACTOR."""
    log = order.bit_length() - 1
    max_log = MAX_FACTOR.bit_length() - 1
    count = max(1, -(-log // max_log))
    base, extra = divmod(log, count)
    return tuple(1 << (base + (1 if i < extra else 0)) for i in range(count))


def fwht(x: np.ndarray) -> np.ndarray:
    """Unnormalized Walsh-Hadamard transform along the last axis (length a power of two).

    Returns a new array ``x @ H`` in the dtype of ``x`` (float32 or float64).

    Parameters
    ----------
    x : numpy.ndarray
        Float32 or float64 array whose last axis has power-of-two length ``D``.

    Returns
    -------
    numpy.ndarray
        ``x @ H_D`` (same shape and dtype as ``x``).

    Notes
    -----
    ``H_D`` is the Kronecker product of Sylvester factors ``H_f`` (``f <= MAX_FACTOR``), each
    applied as one matmul over a reshaped view: ``O(D log D)`` work per row.
    """
    order = x.shape[-1]
    lead = x.shape[:-1]
    rows = int(np.prod(lead, dtype=np.int64))
    y = np.ascontiguousarray(x).reshape(rows, order)
    factors = _factors(order)
    dtype = y.dtype.name
    after = order
    for f in factors:
        after //= f
        h = hadamard_matrix(f, dtype)
        if after == 1:
            # last factor: contract the innermost axis with a plain (rows*., f) @ (f, f) matmul
            y = (y.reshape(-1, f) @ h).reshape(rows, order)
        else:
            y = (h @ y.reshape(-1, f, after)).reshape(rows, order)
    return y.reshape(*lead, order)


def fwht_butterfly(x: np.ndarray) -> np.ndarray:
    """Textbook in-place butterfly WHT (unnormalized), the reference for :func:`fwht`.

    Parameters
    ----------
    x : array_like
        Array whose last axis has power-of-two length ``D``.

    Returns
    -------
    numpy.ndarray
        ``x @ H_D`` in float64, by ``log2 D`` stages of ``(a, b) -> (a + b, a - b)``.
    """
    y = np.array(x, dtype=np.float64, copy=True)
    order = y.shape[-1]
    h = 1
    while h < order:
        y = y.reshape(*y.shape[:-1], order // (2 * h), 2, h)
        a = y[..., 0, :].copy()
        b = y[..., 1, :]
        y[..., 0, :] = a + b
        y[..., 1, :] = a - b
        y = y.reshape(*y.shape[:-3], order)
        h *= 2
    return y


@dataclass(frozen=True)
class RandomizedHadamard:
    """The rotation of one cache side, rebuilt exactly from (dim, seed).

    ``forward`` maps rows of length ``dim`` to rows of length ``padded_dim``; ``inverse`` maps
    back. Both keep the input's float dtype (float32 or float64).

    Parameters
    ----------
    dim : int
        Length of the input rows.
    seed : int
        Seed of the random signs: ``Generator(PCG64(seed)).integers(0, 2, padded_dim)``, 1 -> +1
        and 0 -> -1.

    Notes
    -----
    ``R x = H_D S x / sqrt(D)`` with ``S = diag(signs)`` and ``D = padded_dim``; ``R`` is
    orthogonal and ``R^{-1} y = S H_D y / sqrt(D)``. Rows shorter than ``D`` are zero-padded.

    References
    ----------
    .. [1] Ailon, N., Chazelle, B. (2009) "The fast Johnson-Lindenstrauss transform and
       approximate nearest neighbors", SIAM J. Comput. 39(1):302-322.
    """

    dim: int
    seed: int

    @property
    def padded_dim(self) -> int:
        """Working dimension ``D``: ``dim`` rounded up to a power of two."""
        return next_power_of_two(self.dim)

    @property
    def signs(self) -> np.ndarray:
        """The ``padded_dim`` random signs (+-1.0, float64, read-only) drawn from ``seed``."""
        return _signs(self.padded_dim, int(self.seed))

    def forward(self, x: np.ndarray) -> np.ndarray:
        """Rotate rows: ``y = H_D S pad(x) / sqrt(D)``.

        Parameters
        ----------
        x : array_like
            Rows of length ``dim`` (any leading shape); non-float input is cast to float64.

        Returns
        -------
        numpy.ndarray
            Rows of length ``padded_dim``, in the dtype of ``x`` (float32 or float64).

        Raises
        ------
        KvasymError
            If the last axis of ``x`` is not ``dim``.
        """
        x = _as_float(x)
        if x.shape[-1] != self.dim:
            raise KvasymError(f"rotation expects rows of length {self.dim}, got {x.shape[-1]}")
        padded = self.padded_dim
        if padded != self.dim:
            pad = np.zeros((*x.shape[:-1], padded), dtype=x.dtype)
            pad[..., : self.dim] = x
            x = pad
        scaled = x * self.signs.astype(x.dtype, copy=False)
        return fwht(scaled) * x.dtype.type(1.0 / np.sqrt(padded))

    def inverse(self, y: np.ndarray) -> np.ndarray:
        """Undo :meth:`forward`: ``x = (S H_D y / sqrt(D))[..., :dim]``.

        Parameters
        ----------
        y : array_like
            Rows of length ``padded_dim``.

        Returns
        -------
        numpy.ndarray
            Rows of length ``dim`` (the padding coordinates dropped), dtype of ``y``.

        Raises
        ------
        KvasymError
            If the last axis of ``y`` is not ``padded_dim``.
        """
        y = _as_float(y)
        padded = self.padded_dim
        if y.shape[-1] != padded:
            raise KvasymError(f"inverse rotation expects rows of length {padded}, got {y.shape[-1]}")
        x = fwht(y)
        x *= (self.signs * (1.0 / np.sqrt(padded))).astype(y.dtype, copy=False)
        return x[..., : self.dim]


@lru_cache(maxsize=64)
def _signs(order: int, seed: int) -> np.ndarray:
    gen = np.random.Generator(np.random.PCG64(seed))
    signs = np.where(gen.integers(0, 2, size=order, dtype=np.int8) == 1, 1.0, -1.0)
    signs.setflags(write=False)
    return signs


def _as_float(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float64)
    return x


@lru_cache(maxsize=8)
def _haar(dim: int, seed: int) -> np.ndarray:
    gen = np.random.Generator(np.random.PCG64(seed))
    q, r = np.linalg.qr(gen.standard_normal((dim, dim)))
    q = q * np.where(np.diag(r) < 0, -1.0, 1.0)[None, :]  # Mezzadri's fix: Q diag(sign(diag R))
    q.setflags(write=False)
    return q


def haar_orthogonal(dim: int, seed: int) -> np.ndarray:
    """A Haar-distributed ``dim x dim`` orthogonal matrix drawn from ``seed``.

    ``G`` has i.i.d. N(0, 1) entries (``Generator(PCG64(seed)).standard_normal``), ``G = Q R`` its
    QR decomposition, and the result is ``Q Lambda`` with ``Lambda = diag(sign(R_ii))``: the
    decomposition with a positive diagonal of ``R`` is unique, and ``G`` is invariant under left
    multiplication by any orthogonal matrix, so ``Q Lambda`` is too (Mezzadri 2007). Without the
    sign fix LAPACK's Householder QR gives a ``Q`` that is not Haar (its first column's first
    entry has one sign).

    Parameters
    ----------
    dim : int
        Order, at least 1.
    seed : int
        Seed of the Gaussian matrix (derived from the cell's identity and side, like the WHT's).

    Returns
    -------
    numpy.ndarray
        ``(dim, dim)`` float64, read-only, orthogonal to rounding (``Q^T Q = I``).
    """
    if dim < 1:
        raise KvasymError(f"dimension must be >= 1, got {dim}")
    return _haar(int(dim), int(seed))


@dataclass(frozen=True)
class HaarRotation:
    """A Haar-random rotation of one cache side, rebuilt exactly from (dim, seed): ``y = Q x``.

    No padding (the working dimension is ``dim``), no side bits beyond the seed; ``O(dim^2)`` per
    row and one ``O(dim^3)`` QR per (dim, seed). Under it a unit vector becomes a uniform point of
    the sphere whatever its direction, so each coordinate follows the Beta law of the Lloyd-Max
    codebook exactly (for the WHT this holds only for vectors in general position).

    Parameters
    ----------
    dim : int
        Vector dimension.
    seed : int
        Seed of :func:`haar_orthogonal`.
    """

    dim: int
    seed: int

    @property
    def matrix(self) -> np.ndarray:
        """``Q``, the ``(dim, dim)`` orthogonal matrix (read-only)."""
        return haar_orthogonal(self.dim, self.seed)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """Rotate rows: ``y = Q x`` (``x @ Q^T``), in float64."""
        x = np.asarray(x, dtype=np.float64)
        if x.shape[-1] != self.dim:
            raise KvasymError(f"rows must have {self.dim} coordinates, got {x.shape[-1]}")
        return x @ self.matrix.T

    def inverse(self, y: np.ndarray) -> np.ndarray:
        """Undo :meth:`forward`: ``x = Q^T y`` (``y @ Q``), in float64."""
        y = np.asarray(y, dtype=np.float64)
        if y.shape[-1] != self.dim:
            raise KvasymError(f"rows must have {self.dim} coordinates, got {y.shape[-1]}")
        return y @ self.matrix
