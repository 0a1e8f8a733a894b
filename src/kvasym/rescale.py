"""Per-vector scale corrections of a quantized direction (EDEN and least squares).

With ``z`` the (rotated) vector being quantized and ``c`` its codebook reconstruction, the
reconstruction is ``s c`` with one scalar ``s`` per vector:

- ``none``: ``s = 1`` (TurboQuant's MSE quantizer);
- ``eden``: ``s = ||z||^2 / <z, c>`` (EDEN's unbiased scale: for a uniformly random rotation
  ``R``, ``E[R^T s c] = x`` for every ``x``; for a unit ``z``, ``s = 1 / <z, c>``);
- ``lsq``: ``s = <z, c> / ||c||^2``, the least-squares scale minimising ``||z - s c||``;
- ``norm``: ``s = ||z|| / ||c||``, which restores the norm.

Ben-Basat et al. (2026) note that TurboQuant's MSE quantizer is EDEN without this correction.
The scale is folded into the stored per-row norm, so it costs no side bits beyond the norm
every scheme already stores. A vector whose denominator is 0 (``c = 0``, or ``<z, c> = 0``)
keeps ``s = 1``.

References
----------
.. [1] Vargaftik, S., Ben-Basat, R., Portnoy, A., Mendelson, G., Ben-Itzhak, Y.,
   Mitzenmacher, M. (2022) "EDEN: Communication-Efficient and Robust Distributed Mean
   Estimation for Federated Learning", ICML 2022, PMLR 162:21984-22014.
.. [2] Vargaftik, S., Ben-Basat, R., Portnoy, A., Mendelson, G., Ben-Itzhak, Y.,
   Mitzenmacher, M. (2021) "DRIVE: One-bit Distributed Mean Estimation", NeurIPS 2021.
"""

from __future__ import annotations

import numpy as np

from .errors import KvasymError

__all__ = ["RESCALE_KINDS", "rescale_factors"]

#: The scale corrections offered.
RESCALE_KINDS = ("none", "eden", "lsq", "norm")


def rescale_factors(z: np.ndarray, c: np.ndarray, kind: str) -> np.ndarray:
    """One scale ``s`` per row for the reconstruction ``s c`` of ``z``.

    Parameters
    ----------
    z : numpy.ndarray
        ``(rows, D)`` vectors being quantized.
    c : numpy.ndarray
        ``(rows, D)`` their codebook reconstructions.
    kind : {"none", "eden", "lsq", "norm"}
        Which correction (see the module docstring for the formulas).

    Returns
    -------
    numpy.ndarray
        ``(rows,)`` float64 scales (1 where the formula's denominator is 0).

    Raises
    ------
    KvasymError
        If ``kind`` is unknown.
    """
    if kind not in RESCALE_KINDS:
        raise KvasymError(f"rescale must be one of {', '.join(RESCALE_KINDS)}, got {kind!r}")
    z = np.asarray(z, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    rows = z.shape[0]
    if kind == "none":
        return np.ones(rows)
    zc = np.einsum("ij,ij->i", z, c)
    zz = np.einsum("ij,ij->i", z, z)
    cc = np.einsum("ij,ij->i", c, c)
    if kind == "eden":
        num, den = zz, zc
    elif kind == "lsq":
        num, den = zc, cc
    else:
        num, den = np.sqrt(zz), np.sqrt(cc)
    ok = den != 0
    return np.where(ok, num / np.where(ok, den, 1.0), 1.0)
