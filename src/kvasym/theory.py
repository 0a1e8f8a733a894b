"""Measurements against closed forms: the QJL variance penalty, marginals, and Jensen's bias.

1. Inner-product error of a QJL-corrected key (claim C1). For a unit-norm-scaled residual ``r``
   of the (n-1)-bit scalar quantizer in the rotated domain and an isotropic probe query
   ``q ~ N(0, I_d)``, the sketch's error ``<q, r_hat - r>`` has mean square

       E_q Var_S <q, r_hat> = ((pi/2) d - 1) ||r||^2 / m,

   against ``E_q <q, r>^2 = ||r||^2`` for the uncorrected residual. With ``m = d`` sign bits:

       ratio to the (n-1)-bit scalar residual = pi/2 - 1/d,
       ratio to the n-bit scalar error        = (pi/2 - 1/d) * D(n-1) / D(n),

   with ``D(b)`` this project's per-vector codebook MSE (``D(0) = 1``: no scalar bits leaves the
   whole vector as residual). ``D(n-1)/D(n) -> 4`` (6 dB per bit), so the second ratio tends to
   ``2 pi``. The closed forms hold for power-of-two ``d`` (no padding); they are reported for
   other ``d`` too but are then approximate.
2. Marginals after rotation (premise of claim C5): one rotated coordinate per key (coordinate
   ``key index mod D``, so no two samples come from the same vector) against the Beta law of a
   unit vector's coordinate in the working dimension, by a one-sample KS test.
3. Jensen's bias (claim C9): per key, the log attention-weight excess
   ``log(mean_i p_hat_ij / mean_i p_ij)`` against the key's logit-error variance over queries;
   a positive slope means keys with noisier inner products are systematically over-weighted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .cache import quantize
from .codebook import coordinate_cdf, lloyd_max_codebook
from .errors import KvasymError
from .rotation import RandomizedHadamard
from .schemes import SideSpec
from .seeds import derived_seed, rng


def qjl_closed_forms(dim: int, budget: int) -> dict[str, float]:
    """Theory of the two variance ratios at ``budget`` (uses the working dimension's codebooks)."""
    work = 1 << (dim - 1).bit_length()
    residual = np.pi / 2 - 1 / work
    d_lower = 1.0 if budget == 1 else lloyd_max_codebook(work, budget - 1).mse_per_vector
    d_full = lloyd_max_codebook(work, budget).mse_per_vector
    return {"vs_residual": residual, "vs_nbit": residual * d_lower / d_full}


def inner_product_errors(
    keys: np.ndarray,
    budget: int,
    *,
    base_seed: int,
    identity: Sequence[str | int],
    n_probes: int = 256,
) -> dict[str, float]:
    """Mean squared inner-product errors of one trial's keys under the three K quantizers.

    Returns the sums of squared errors (``ss_qjl``, ``ss_residual``, ``ss_nbit``) over all
    (probe, key) pairs and their count ``n``: the (n-1)-bit scalar + QJL side, the same
    (n-1)-bit scalar without correction, and the n-bit scalar side, all rotated and sharing
    the rotation and QJL seeds of the pipeline's K side.
    """
    keys = np.asarray(keys, dtype=np.float64)
    dim = keys.shape[1]
    probes = rng(base_seed, "theory-probes", *identity).standard_normal((n_probes, dim))
    seeds = {
        "rotation_seed": derived_seed(base_seed, "rotation", *identity, "K"),
        "qjl_seed": derived_seed(base_seed, "qjl", *identity, "K"),
    }
    out: dict[str, float] = {}
    variants = {
        "ss_qjl": SideSpec(rotate=True, scalar_offset=1, qjl=True),
        "ss_residual": SideSpec(rotate=True, scalar_offset=1, qjl=False),
        "ss_nbit": SideSpec(rotate=True, scalar_offset=0, qjl=False),
    }
    for name, spec in variants.items():
        if spec.scalar_bits(budget) == 0 and not spec.qjl:
            estimate = np.zeros_like(keys)  # no bits at all: the residual is the whole vector
        else:
            estimate = quantize(keys, spec, budget, **seeds).dequantize("float64")
        err = probes @ (estimate - keys).T
        out[name] = float(np.sum(err * err))
    out["n"] = float(n_probes * keys.shape[0])
    return out


def rotated_marginal_sample(keys: np.ndarray, rotation_seed: int) -> tuple[np.ndarray, int]:
    """One rotated unit-vector coordinate per key (index ``key mod D``) and the dimension D."""
    keys = np.asarray(keys, dtype=np.float64)
    norms = np.linalg.norm(keys, axis=1)
    unit = keys / np.where(norms > 0, norms, 1.0)[:, None]
    rotated = RandomizedHadamard(keys.shape[1], rotation_seed).forward(unit)
    work = rotated.shape[1]
    picks = rotated[np.arange(keys.shape[0]), np.arange(keys.shape[0]) % work]
    return picks[norms > 0], work


def ks_against_beta(sample: np.ndarray, work_dim: int) -> dict[str, float]:
    """One-sample KS of coordinates against the unit-vector coordinate law in ``work_dim``."""
    from scipy import stats as sps

    if sample.size < 2:
        raise KvasymError("the KS test needs at least two coordinates")
    result = sps.kstest(sample, lambda t: coordinate_cdf(t, work_dim))
    p = float(result.pvalue)
    return {"statistic": float(result.statistic), "p": p, "n": float(sample.size)}


def jensen_points(per_key: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(logit-error variance, log weight excess, mask of the rows kept): finite keys only."""
    ref = np.asarray(per_key["weight_ref_mean"], dtype=np.float64)
    hat = np.asarray(per_key["weight_hat_mean"], dtype=np.float64)
    var = np.asarray(per_key["logit_err_var"], dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        excess = np.log(hat) - np.log(ref)
    ok = np.isfinite(excess) & np.isfinite(var)
    return var[ok], excess[ok], ok
