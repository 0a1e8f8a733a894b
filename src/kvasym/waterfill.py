"""Bit allocation over transform coordinates by reverse water-filling, at a fixed total budget.

For independent Gaussian coordinates of variances ``sigma_i^2`` and a total of ``B`` bits, the
rate-distortion optimum (Cover & Thomas, Theorem 10.3.3) gives each coordinate the distortion
``D_i = min(theta, sigma_i^2)`` and the rate ``R_i = max(0, 1/2 log2(sigma_i^2 / theta))``, with
the water level ``theta`` solving ``sum_i R_i = B`` (:func:`reverse_waterfill`, in closed form:
over the active set ``A`` of the ``k`` largest variances,
``log2 theta = (sum_{i in A} log2 sigma_i^2 - 2 B) / k``).

A quantizer needs whole bits. :func:`integer_allocation` spends the ``B`` bits one at a time,
each to the coordinate whose distortion it lowers most, with the distortion of the actual
Lloyd-Max quantizer of a Gaussian, ``D_i(b) = sigma_i^2 D(b)`` (:mod:`kvasym.gaussian_codebook`).
Since ``D(b) - D(b+1)`` decreases in ``b``, this greedy allocation minimises
``sum_i sigma_i^2 D(b_i)`` over integer allocations summing to ``B`` with ``0 <= b_i <= 8``
(the marginal-return argument of Fox 1966). It sums to ``B`` exactly; ties go to the lower
coordinate index, so it is a deterministic function of the variances (the decoder recomputes it
from the stored ones).

References
----------
.. [1] Cover, T. M., Thomas, J. A. (2006) "Elements of Information Theory", 2nd ed., Wiley,
   section 10.3.3 (parallel Gaussian sources, reverse water-filling).
.. [2] Fox, B. (1966) "Discrete optimization via marginal analysis", Management Science
   13(3):210-216.
.. [3] Segall, A. (1976) "Bit allocation and encoding for vector sources", IEEE Trans.
   Information Theory 22(2):162-169.
"""

from __future__ import annotations

import heapq

import numpy as np

from .errors import KvasymError
from .gaussian_codebook import gaussian_codebook

__all__ = ["MAX_WIDTH_BITS", "reverse_waterfill", "integer_allocation"]

#: Largest width of one coordinate (bits), the widest Gaussian codebook an allocation uses. On
#: data of exact rank ``r`` every principal coordinate reaches it once ``B >= MAX_WIDTH_BITS * r``;
#: further bits fall on coordinates of zero variance and buy nothing.
MAX_WIDTH_BITS = 8


def reverse_waterfill(variances: np.ndarray, total_bits: float) -> tuple[float, np.ndarray]:
    """The water level and real rates of reverse water-filling for Gaussian coordinates.

    Parameters
    ----------
    variances : array_like
        ``(d,)`` coordinate variances ``sigma_i^2 >= 0``, at least one positive.
    total_bits : float
        Total rate ``B > 0`` in bits.

    Returns
    -------
    theta : float
        The water level: ``D_i = min(theta, sigma_i^2)``.
    rates : numpy.ndarray
        ``(d,)`` rates ``R_i = max(0, 1/2 log2(sigma_i^2 / theta))``, summing to ``B``.

    Raises
    ------
    KvasymError
        If ``total_bits <= 0``, or no variance is positive, or one is negative or not finite.
    """
    v = np.asarray(variances, dtype=np.float64)
    if not np.all(np.isfinite(v)) or np.any(v < 0) or not np.any(v > 0):
        raise KvasymError("reverse water-filling needs finite variances >= 0, at least one positive")
    if not total_bits > 0:
        raise KvasymError(f"reverse water-filling needs a positive total rate, got {total_bits!r}")
    order = np.sort(v[v > 0])[::-1]
    logs = np.log2(order)
    theta = float(order[0])
    for k in range(1, order.size + 1):
        log_theta = (np.sum(logs[:k]) - 2.0 * total_bits) / k
        theta = float(2.0**log_theta)
        if k == order.size or theta >= order[k]:  # the next variance is under water
            break
    rates = np.where(v > theta, 0.5 * np.log2(np.where(v > 0, v, 1.0) / theta), 0.0)
    return theta, rates


def integer_allocation(variances: np.ndarray, total_bits: int, max_bits: int = MAX_WIDTH_BITS) -> np.ndarray:
    """Whole bits per coordinate, summing to ``total_bits``, by greedy marginal returns.

    Parameters
    ----------
    variances : array_like
        ``(d,)`` coordinate variances ``>= 0``.
    total_bits : int
        Bits to spend, ``0 <= total_bits <= max_bits * d``.
    max_bits : int, optional
        Largest width of one coordinate (default :data:`MAX_WIDTH_BITS`).

    Returns
    -------
    numpy.ndarray
        ``(d,)`` int64 widths ``b_i`` in ``0..max_bits`` with ``sum b_i = total_bits`` that
        minimise ``sum_i sigma_i^2 D(b_i)``, ``D`` the N(0, 1) Lloyd-Max distortion.

    Raises
    ------
    KvasymError
        If ``total_bits`` is out of range or a variance is negative or not finite.
    """
    v = np.asarray(variances, dtype=np.float64)
    d = v.size
    if not np.all(np.isfinite(v)) or np.any(v < 0):
        raise KvasymError("bit allocation needs finite variances >= 0")
    if isinstance(total_bits, bool) or not isinstance(total_bits, (int, np.integer)) \
            or not 0 <= total_bits <= max_bits * d:
        raise KvasymError(f"bit allocation: total_bits must be an integer in 0..{max_bits * d}, got {total_bits!r}")
    bits = np.zeros(d, dtype=np.int64)
    table: dict[int, float] = {0: 1.0}

    def mse(b: int) -> float:
        if b not in table:
            table[b] = gaussian_codebook(b).mse
        return table[b]

    heap = [(-(vi * (1.0 - mse(1))), i) for i, vi in enumerate(v)]
    heapq.heapify(heap)
    for _ in range(int(total_bits)):
        _gain, i = heapq.heappop(heap)
        bits[i] += 1
        if bits[i] < max_bits:
            b = int(bits[i])
            heapq.heappush(heap, (-(v[i] * (mse(b) - mse(b + 1))), i))
    return bits
