"""The Karhunen-Loeve transform (KLT) of a block: its own principal basis, stored as side bits.

For the ``(rows, dim)`` block ``X`` being quantized, the covariance
``C = (1/N) sum_i (x_i - xbar)(x_i - xbar)^T`` has eigendecomposition ``C = U diag(lambda) U^T``
(``lambda`` decreasing). The transform maps a row to ``z = U^T x`` (rows: ``Z = X U``); its
coordinates are uncorrelated with variances ``lambda``, which makes the KLT the optimal
orthogonal transform for Gaussian transform coding (Goyal 2001, Theorem 6).

``U`` is stored at a declared precision (float16 or float32): ``dim^2`` floats of side
information per block. Rounding breaks orthogonality slightly, so encoder and decoder both use
``Q = orthonormalize(U_s)``, the Q factor of the QR decomposition of the stored matrix with the
signs of ``diag(R)`` made positive: ``Q`` is orthogonal to float64 rounding, equal to ``U_s``
up to the storage rounding, and a deterministic function of the stored bits, so the round trip
``(X Q) Q^T = X`` is exact to float64 rounding whatever the storage precision.

Eigenvector signs are fixed (each column's entry of largest magnitude is made positive) so
the stored basis does not depend on the LAPACK build's sign convention.

Both decompositions are memoized on the content of their input (:func:`_memoized`: the last
few inputs, keyed by shape, dtype and a BLAKE2b digest of the bytes), because a unit job of the
DAG quantizes the same block at every budget and decodes what it encoded: at d = 1024 an
``eigh`` costs about 0.3 s and a QR 0.05 s, the digest of the 8 MB block 5 ms. The results are
the arrays the computation gives, copied out of the memo.

References
----------
.. [1] Goyal, V. K. (2001) "Theoretical foundations of transform coding", IEEE Signal
   Processing Magazine 18(5):9-21.
.. [2] Huang, J. J. Y., Schultheiss, P. M. (1963) "Block quantization of correlated Gaussian
   random variables", IEEE Trans. Communications Systems 11(3):289-296.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from .errors import KvasymError

__all__ = ["KLT_DTYPES", "klt_basis", "store_basis", "orthonormalize"]

#: Inputs remembered by :func:`_memoized` (a unit job's two sides of one trial, both transforms).
MEMO_SIZE = 8
_MEMO: OrderedDict[tuple, tuple[np.ndarray, ...]] = OrderedDict()


def _memoized(kind: str, array: np.ndarray, compute: Callable[[np.ndarray], tuple[np.ndarray, ...]]
              ) -> tuple[np.ndarray, ...]:
    """``compute(array)``, or a copy of what it returned for an input of the same bytes."""
    array = np.ascontiguousarray(array)
    key = (kind, array.shape, array.dtype.str, hashlib.blake2b(array.view(np.uint8), digest_size=16).digest())
    if key not in _MEMO:
        _MEMO[key] = compute(array)
        while len(_MEMO) > MEMO_SIZE:
            _MEMO.popitem(last=False)
    _MEMO.move_to_end(key)
    return tuple(a.copy() for a in _MEMO[key])


#: Storage precisions of the basis.
KLT_DTYPES = ("float16", "float32")


def klt_basis(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (decreasing) and eigenvectors (columns) of the covariance of the rows of ``x``.

    Parameters
    ----------
    x : numpy.ndarray
        ``(rows, dim)`` matrix (float64 arithmetic).

    Returns
    -------
    eigenvalues : numpy.ndarray
        ``(dim,)`` float64, decreasing (the coordinate variances after the transform).
    basis : numpy.ndarray
        ``(dim, dim)`` float64 orthogonal ``U``: column ``j`` is the ``j``-th principal direction,
        its largest-magnitude entry positive.
    """
    return _memoized("klt", np.asarray(x, dtype=np.float64), _klt_basis)  # type: ignore[return-value]


def _klt_basis(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    centred = x - x.mean(axis=0)
    cov = centred.T @ centred / max(x.shape[0], 1)
    values, vectors = np.linalg.eigh(cov)
    order = np.argsort(values, kind="stable")[::-1]
    values, vectors = values[order], vectors[:, order]
    peak = vectors[np.argmax(np.abs(vectors), axis=0), np.arange(vectors.shape[1])]
    vectors = vectors * np.where(peak < 0, -1.0, 1.0)[None, :]
    return np.maximum(values, 0.0), vectors


def store_basis(basis: np.ndarray, dtype: str) -> np.ndarray:
    """The basis rounded to its storage precision.

    Parameters
    ----------
    basis : numpy.ndarray
        ``(dim, dim)`` orthogonal matrix.
    dtype : {"float16", "float32"}
        Storage precision.

    Returns
    -------
    numpy.ndarray
        ``basis.astype(dtype)``.

    Raises
    ------
    KvasymError
        If ``dtype`` is not one of :data:`KLT_DTYPES`.
    """
    if dtype not in KLT_DTYPES:
        raise KvasymError(f"transform_dtype must be one of {', '.join(KLT_DTYPES)}, got {dtype!r}")
    return np.asarray(basis).astype(dtype)


def orthonormalize(stored: np.ndarray) -> np.ndarray:
    """The orthogonal matrix encoder and decoder use: ``Q`` of ``U_s = Q R`` with ``diag(R) > 0``.

    Parameters
    ----------
    stored : numpy.ndarray
        ``(dim, dim)`` stored basis (any float dtype).

    Returns
    -------
    numpy.ndarray
        ``(dim, dim)`` float64 ``Q`` with ``Q^T Q = I`` to float64 rounding.

    Raises
    ------
    KvasymError
        If the stored basis is singular (a damaged or foreign file).
    """
    # keyed by the stored bits (a float16 basis is a quarter of the bytes to digest)
    return _memoized("qr", np.asarray(stored), _orthonormalize)[0]


def _orthonormalize(stored: np.ndarray) -> tuple[np.ndarray]:
    q, r = np.linalg.qr(np.asarray(stored, dtype=np.float64))
    diag = np.diag(r)
    if np.any(np.abs(diag) < 1e-6):
        raise KvasymError("the stored KLT basis is singular: it is not a rounded orthogonal matrix")
    return (q * np.sign(diag)[None, :],)
