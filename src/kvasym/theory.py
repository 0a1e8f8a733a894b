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
   Jensen's prediction for the slope is :data:`JENSEN_SLOPE` = 1/2 (diffuse attention, small
   zero-mean errors); ``jensen_slope_adjusted`` is the same slope holding the key's log
   reference weight fixed (a key's weight confounds its error and its excess: e.g. a reconstruction
   that shrinks every key lowers the dominant keys' logits, hence their weights).

References
----------
.. [1] Zandieh, A., Daliri, M., Han, I. (2024/2025) "QJL: 1-Bit Quantized JL Transform for KV
   Cache Quantization with Zero Overhead", arXiv:2406.03482.
.. [2] Zandieh, A., Daliri, M., Hadian, M., Mirrokni, V. (2025) "TurboQuant: Online Vector
   Quantization with Near-optimal Distortion Rate", arXiv:2504.19874.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .cache import quantize
from .codebook import coordinate_cdf, lloyd_max_codebook
from .errors import KvasymError
from .rotation import HaarRotation, RandomizedHadamard
from .schemes import SideSpec
from .seeds import derived_seed, rng
from .sketch import SKETCH_KINDS, hadamard_error_energy

__all__ = [
    "THEORY_CHECKS",
    "THEORY_CHECK_WORDS",
    "qjl_closed_forms",
    "sketch_error_energy",
    "key_error_energy",
    "predicted_kl_ratio",
    "inner_product_errors",
    "rotated_marginal_sample",
    "ks_against_beta",
    "ks_beta_distance",
    "jensen_points",
    "JENSEN_SLOPE",
]

JENSEN_SLOPE = 0.5
"""Jensen's prediction of the slope of the log weight excess on the logit-error variance.

For key j, p_hat_ij = p_ij exp(e_ij) / Z_i with Z_i = sum_k p_ik exp(e_ik). If over the
queries i the error e_ij has mean 0 and variance s_j^2, independently of p_ij, and attention is
diffuse (every p_ik small, so Z_i barely depends on e_ij), then mean_i p_hat_ij ~= mean_i p_ij
E exp(e_ij) / Z = mean_i p_ij exp(s_j^2 / 2 + O(s_j^4)) / Z, so ``log(mean p_hat / mean p) =
s_j^2 / 2 - log Z``: slope 1/2 against s_j^2 (exactly 1/2 for Gaussian errors). Concentrated
attention attenuates it (the j-th term of Z_i moves with e_ij: a correction -p_ij s_j^2), and a
non-zero mean error (a biased reconstruction) adds a term the slope does not predict. Measured on
unbiased per-key Gaussian noise (d = 64, 512 keys, 4 trials): 0.48 at sharpness 1, 0.39 at 2,
0.20 at 4.

Why the scalar schemes' slopes are negative (issue 14, point 6; measured outside the grid,
Gaussian data, d = 64, 512 keys, 256 queries, 4 trials as bootstrap clusters, slope [95% CI]): a
Lloyd-Max reconstruction shrinks each key, ``<k_hat, k> / |k|^2 ~= 1 - D(n)`` (0.884 at n = 2,
0.992 at n = 4), so the logit error carries a bias ``-(1 - c) l_ij`` proportional to the logit:
the keys whose logits vary most over the queries, which are also the ones that dominate, lose
weight. EDEN's unbiased scale (scheme RKV-EDEN: the same codes, the norm divided by ``c``)
removes the shrinkage and the sign flips back to Jensen's:

===========  =======================  =======================  ======================
cell         RKV                      RKV-EDEN                 QKQV (QJL: unbiased)
===========  =======================  =======================  ======================
n = 4, s = 1 -1.97 [-2.26, -1.75]     +0.48 [+0.31, +0.68]     +0.49 [+0.44, +0.56]
n = 4, s = 2 -1.68 [-1.99, -1.50]     +0.39 [+0.23, +0.59]     +0.42 [+0.36, +0.50]
n = 2, s = 1 -0.75 [-0.81, -0.69]     +0.42 [+0.37, +0.46]     +0.42 [+0.40, +0.45]
n = 2, s = 2 -0.64 [-0.69, -0.59]     +0.33 [+0.27, +0.37]     +0.27 [+0.25, +0.30]
===========  =======================  =======================  ======================

Holding the key's log norm fixed (``jensen_slope_norm``) leaves RKV's slope negative (-2.45
[-3.05, -2.08] at n = 4, s = 1; -0.93 at n = 2) and RKV-EDEN's at +0.47: the key norm is not the
confounder, the shrinkage bias is (test: ``test_jensen_slope_sign_flips_with_edens_unbiased_rescale``)."""


#: The checks of the theory table (stage ``theory``), one row each per cell where they apply:
#: the two QJL variance ratios against their closed forms, the same two with the orthogonal
#: hadamard sketch in place of QJL's Gaussian one (:mod:`kvasym.sketch`), the KS test of the rotated marginal
#: against Beta, and the Jensen slope of KL excess on logit-error variance, alone, holding
#: the log reference weight fixed and holding the log key norm fixed (absent without per-key
#: rows, NaN where its points have no spread); and the two QJL ratios and the KS distance under a
#: Haar-random rotation in place of the WHT (issue 14's ablation, ``haar_*``, ``ks_beta_haar``).
THEORY_CHECKS: tuple[str, ...] = ("qjl_vs_residual", "qjl_vs_nbit", "hadamard_vs_residual", "hadamard_vs_nbit",
                                   "ks_beta", "jensen_slope", "jensen_slope_adjusted", "jensen_slope_norm",
                                   "haar_vs_residual", "haar_vs_nbit", "ks_beta_haar")

_RATIO = "variance ratio vs closed form"
#: The words of each theory check, the one source of what the ledger (:func:`kvasym.render.ledger.test_and_unit`)
#: and the theory table (template ``table_theory.tex.j2``) say it is: ``(what is measured against what,
#: the interval's method)``. The variance ratios have Fieller intervals over trials; the KS
#: distances and the Jensen slopes cluster-bootstrap ones (:func:`kvasym.stats.ks_distance_ci`,
#: :func:`kvasym.stats.linear_slope_ci`).
THEORY_CHECK_WORDS: dict[str, tuple[str, str]] = {
    "qjl_vs_residual": (_RATIO, "Fieller"),
    "qjl_vs_nbit": (_RATIO, "Fieller"),
    "hadamard_vs_residual": (_RATIO, "Fieller"),
    "hadamard_vs_nbit": (_RATIO, "Fieller"),
    "haar_vs_residual": (f"{_RATIO} (Haar rotation)", "Fieller"),
    "haar_vs_nbit": (f"{_RATIO} (Haar rotation)", "Fieller"),
    "ks_beta": ("Kolmogorov distance from Beta law", "bootstrap"),
    "ks_beta_haar": ("Kolmogorov distance from Beta law (Haar rotation)", "bootstrap"),
    "jensen_slope": ("regression slope", "bootstrap"),
    "jensen_slope_adjusted": ("regression slope at fixed reference weight", "bootstrap"),
    "jensen_slope_norm": ("regression slope at fixed key norm", "bootstrap"),
}


def sketch_error_energy(sketch: str, work: int) -> float:
    """``E ||r_hat - r||^2 / ||r||^2`` of a 1-bit residual sketch with ``m = work`` sign bits:
    ``pi/2 - 1/work`` for QJL's Gaussian sketch, ``c_work`` for the hadamard one
    (:func:`kvasym.sketch.hadamard_error_energy`).

    Raises
    ------
    KvasymError
        If ``sketch`` is not one of :data:`kvasym.sketch.SKETCH_KINDS`.
    """
    if sketch == "gaussian":
        return math.pi / 2 - 1 / work
    if sketch == "hadamard":
        return hadamard_error_energy(work)
    raise KvasymError(f"sketch must be one of {', '.join(SKETCH_KINDS)}, got {sketch!r}")


def qjl_closed_forms(dim: int, budget: int, sketch: str = "gaussian") -> dict[str, float]:
    """Theory of the two variance ratios at ``budget`` (uses the working dimension's codebooks).

    Parameters
    ----------
    dim : int
        Head dimension ``d`` of the keys. The working dimension is the next power of two,
        ``w = 2**ceil(log2 d)`` (the rotation's zero padding).
    budget : int
        Bits per coordinate ``n`` (1..8): the QJL side spends ``n - 1`` scalar bits + 1 sign bit.
    sketch : {"gaussian", "hadamard"}, optional
        The residual sketch (default ``"gaussian"``, QJL's; :mod:`kvasym.sketch`).

    Returns
    -------
    dict of str to float
        ``vs_residual``: predicted ``MSE(QJL-corrected) / MSE((n-1)-bit scalar residual)``;
        ``vs_nbit``: predicted ``MSE(QJL-corrected) / MSE(n-bit scalar)``, both for the
        inner product with an isotropic probe ``q ~ N(0, I)``.

    Raises
    ------
    KvasymError
        If the working dimension or a needed codebook width is outside the codebook's range
        (``budget`` outside 1..8, ``w < 3`` or ``w > MAX_DIM``).

    Notes
    -----
    With ``m = w`` sign bits, ``E_q Var_S <q, r_hat> = ((pi/2) w - 1) ||r||^2 / m`` against
    ``E_q <q, r>^2 = ||r||^2``, hence

        vs_residual = pi/2 - 1/w,
        vs_nbit     = (pi/2 - 1/w) * D(n-1) / D(n),

    with ``D(b)`` the per-vector MSE of the ``b``-bit Lloyd-Max codebook in dimension ``w``
    (:attr:`~kvasym.codebook.Codebook.mse_per_vector`) and ``D(0) = 1`` (no scalar bits: the
    residual is the whole unit vector). As ``w -> inf``, ``vs_residual -> pi/2`` and ``D(b)``
    tends to the Gaussian Lloyd-Max MSE (Max 1960), e.g. ``vs_nbit(n=1) -> (pi/2) / (1 - 2/pi)``;
    as ``n`` grows ``D(n-1)/D(n) -> 4`` and ``vs_nbit -> 4 (pi/2 - 1/w) ~ 2 pi``. Exact for
    power-of-two ``dim``; for other ``dim`` an approximation (the padding is not modelled).

    With the orthogonal ``hadamard`` sketch the error energy is ``c_w ||r||^2`` instead,
    ``c_w = pi/2 - 1 + (3 pi^2/4 - 5 pi/2) / w + O(w^-2)``
    (:func:`kvasym.sketch.hadamard_error_energy`), so ``vs_residual = c_w`` and
    ``vs_nbit = c_w D(n-1) / D(n)``: about 2.06 at ``w = 128, n = 4``, against 5.70 for the
    Gaussian sketch (the paper's "2.25" is within reach of an orthogonal sketch only).

    References
    ----------
    .. [1] Zandieh, A., Daliri, M., Han, I. (2024/2025) "QJL: 1-Bit Quantized JL Transform for
       KV Cache Quantization with Zero Overhead", arXiv:2406.03482.
    .. [2] Max, J. (1960) "Quantizing for minimum distortion", IRE Trans. Inf. Theory
       6(1):7-12.
    """
    work = 1 << (dim - 1).bit_length()
    residual = sketch_error_energy(sketch, work)
    d_lower = 1.0 if budget == 1 else lloyd_max_codebook(work, budget - 1).mse_per_vector
    d_full = lloyd_max_codebook(work, budget).mse_per_vector
    return {"vs_residual": residual, "vs_nbit": residual * d_lower / d_full}


def key_error_energy(spec: SideSpec, budget: int, dim: int) -> float:
    """Closed-form error energy ``E ||u_hat - u||^2`` of a unit key on a rotated side.

    Parameters
    ----------
    spec : SideSpec
        The key side (rotation, scalar width, sketch).
    budget : int
        Bits per coordinate ``n``.
    dim : int
        Head dimension ``d`` (working dimension ``w``: the next power of two).

    Returns
    -------
    float
        ``D(b)`` for a ``b``-bit scalar side; ``D(b) (pi/2 - 1/w)`` with the Gaussian sketch and
        ``D(b) c_w`` with the hadamard one (:func:`kvasym.sketch.hadamard_error_energy`), with
        ``D(0) = 1``; NaN for an unrotated side, whose error depends on the data's own marginals.

    Notes
    -----
    On a rotated side the coordinates follow the Beta law whatever the data (for vectors in
    general position), which is what makes the energy a closed form. To second order in the
    logit error, the KL divergence of a query's attention is ``(s^2/2) Var_p(delta l)`` with
    ``delta l_j = <q, k_hat_j - k_j> / sqrt(d)``; for errors isotropic in the rotated frame its
    expectation is proportional to the key error energy, so the ratio of two schemes' KL is the
    ratio of their energies (:func:`predicted_kl_ratio`).
    """
    if not spec.rotate:
        return math.nan
    work = 1 << (dim - 1).bit_length()
    bits = spec.scalar_bits(budget)
    scalar = 1.0 if bits == 0 else lloyd_max_codebook(work, bits).mse_per_vector
    if not spec.qjl:
        return scalar
    return scalar * sketch_error_energy(spec.sketch, work)


def predicted_kl_ratio(key_a: SideSpec, key_b: SideSpec, budget: int, dim: int) -> float:
    """Second-order prediction of the KL ratio of scheme ``a`` over scheme ``b``: the ratio of
    their key sides' error energies (:func:`key_error_energy`), NaN when either is unrotated.

    Parameters
    ----------
    key_a, key_b : SideSpec
        The key sides of the two schemes.
    budget : int
        Bits per coordinate ``n``.
    dim : int
        Head dimension ``d``.

    Returns
    -------
    float
        E.g. QKQV over KQV: ``(pi/2 - 1/w) D(n-1)/D(n)`` (5.70 at d = 128, n = 4); RKV over KQV:
        1 (the same key side).

    References
    ----------
    .. [1] Cover, T. M., Thomas, J. A. (2006) "Elements of Information Theory", 2nd ed., Wiley
       (KL between nearby distributions: half the Fisher-metric quadratic form).
    """
    return key_error_energy(key_a, budget, dim) / key_error_energy(key_b, budget, dim)


def inner_product_errors(
    keys: np.ndarray,
    budget: int,
    *,
    base_seed: int,
    identity: Sequence[str | int],
    n_probes: int = 256,
    hadamard: bool = False,
    transform: str = "wht",
) -> dict[str, float]:
    """Mean squared inner-product errors of one trial's keys under the three K quantizers.

    Returns the sums of squared errors (``ss_qjl``, ``ss_residual``, ``ss_nbit``) over all
    (probe, key) pairs and their count ``n``: the (n-1)-bit scalar + QJL side, the same
    (n-1)-bit scalar without correction, and the n-bit scalar side, all rotated and sharing
    the rotation and QJL seeds of the pipeline's K side.

    Parameters
    ----------
    keys : numpy.ndarray
        Keys of one trial, shape ``(n_keys, dim)`` (computed in float64).
    budget : int
        Bits per coordinate ``n``.
    base_seed : int
        The study's base seed.
    identity : sequence of (str or int)
        The trial's identity ``(distribution, dim, trial)``: the rotation and QJL seeds are
        ``derived_seed(base_seed, "rotation" | "qjl", *identity, "K")`` (those of the pipeline's
        K side) and the probes come from ``rng(base_seed, "theory-probes", *identity)``.
    n_probes : int, optional
        Number of probe queries ``q ~ N(0, I_dim)`` (default 256).
    hadamard : bool, optional
        Also measure the QJL side with the hadamard sketch (same rotation, scalar codes and
        sketch seed) as ``ss_qjl_hadamard`` (default False).
    transform : {"wht", "haar"}, optional
        The rotation of the three sides: the pipeline's randomized WHT (default) or a Haar-random
        orthogonal matrix from the same rotation seed (the ablation of issue 14, point 9: under
        it every unit key's coordinates follow the Beta law exactly, near-one-hot keys too).

    Returns
    -------
    dict of str to float
        ``ss_qjl``, ``ss_residual``, ``ss_nbit``: ``sum_{q, k} <q, k_hat - k>^2`` under each
        quantizer; ``n = n_probes * n_keys``. ``ss / n`` is the mean squared inner-product error.

    Raises
    ------
    KvasymError
        If the keys are not a finite 2-D matrix, or a norm does not fit the float32 storage.

    Notes
    -----
    At ``budget = 1`` the uncorrected residual side has no bits at all: its estimate is the zero
    vector, so ``ss_residual = sum <q, k>^2`` (the convention ``D(0) = 1`` of
    :func:`qjl_closed_forms`). For isotropic keys and power-of-two ``dim``,
    ``E[ss_qjl] = (pi/2 - 1/dim) E[ss_residual]`` and
    ``E[ss_residual] / E[ss_nbit] = D(n-1) / D(n)``.

    References
    ----------
    .. [1] Zandieh, A., Daliri, M., Han, I. (2024/2025) "QJL: 1-Bit Quantized JL Transform for
       KV Cache Quantization with Zero Overhead", arXiv:2406.03482.
    """
    keys = np.asarray(keys, dtype=np.float64)
    dim = keys.shape[1]
    probes = rng(base_seed, "theory-probes", *identity).standard_normal((n_probes, dim))
    seeds = {
        "rotation_seed": derived_seed(base_seed, "rotation", *identity, "K"),
        "qjl_seed": derived_seed(base_seed, "qjl", *identity, "K"),
    }
    out: dict[str, float] = {}
    if transform not in ("wht", "haar"):
        raise KvasymError(f"transform must be wht or haar, got {transform!r}")
    rot = {"rotate": transform == "wht", "transform": transform}
    variants = {
        "ss_qjl": SideSpec(scalar_offset=1, qjl=True, **rot),
        "ss_residual": SideSpec(scalar_offset=1, qjl=False, **rot),
        "ss_nbit": SideSpec(scalar_offset=0, qjl=False, **rot),
    }
    if hadamard:
        variants["ss_qjl_hadamard"] = SideSpec(scalar_offset=1, qjl=True, sketch="hadamard", **rot)
    for name, spec in variants.items():
        if spec.stores_nothing_at(budget):
            estimate = np.zeros_like(keys)  # no bits at all: the residual is the whole vector
        else:
            estimate = quantize(keys, spec, budget, **seeds).dequantize("float64")
        err = probes @ (estimate - keys).T
        out[name] = float(np.sum(err * err))
    out["n"] = float(n_probes * keys.shape[0])
    return out


def rotated_marginal_sample(keys: np.ndarray, rotation_seed: int, transform: str = "wht") -> tuple[np.ndarray, int]:
    """One rotated unit-vector coordinate per key (index ``key mod D``) and the dimension D.

    Parameters
    ----------
    keys : numpy.ndarray
        Keys, shape ``(n_keys, dim)``.
    rotation_seed : int
        Seed of the :class:`~kvasym.rotation.RandomizedHadamard` rotation (the pipeline's K-side
        rotation seed).
    transform : {"wht", "haar"}, optional
        The rotation: the randomized WHT (default) or :class:`~kvasym.rotation.HaarRotation`
        from the same seed (no padding: ``D = dim``; its coordinates follow ``f_D`` for every
        non-zero key, whatever its direction).

    Returns
    -------
    sample : numpy.ndarray
        ``(R u_i)[i mod D]`` for every key ``i`` with a non-zero norm, ``u_i = k_i / ||k_i||``
        (zero keys are dropped; the index still counts them), float64.
    work_dim : int
        The working dimension ``D`` (``dim`` padded to a power of two).

    Notes
    -----
    If the ``u_i`` are uniform on the sphere ``S^{D-1}`` (e.g. isotropic Gaussian keys of a
    power-of-two dimension), each sample follows ``f_D(x) = c_D (1 - x^2)^((D-3)/2)``, i.e.
    ``(x + 1)/2 ~ Beta((D-1)/2, (D-1)/2)``; taking a different coordinate per key keeps two
    samples from ever coming from the same vector.
    """
    keys = np.asarray(keys, dtype=np.float64)
    norms = np.linalg.norm(keys, axis=1)
    unit = keys / np.where(norms > 0, norms, 1.0)[:, None]
    if transform == "haar":
        rotated = HaarRotation(keys.shape[1], rotation_seed).forward(unit)
    elif transform == "wht":
        rotated = RandomizedHadamard(keys.shape[1], rotation_seed).forward(unit)
    else:
        raise KvasymError(f"transform must be wht or haar, got {transform!r}")
    work = rotated.shape[1]
    picks = rotated[np.arange(keys.shape[0]), np.arange(keys.shape[0]) % work]
    return picks[norms > 0], work



def marginal_samples(slice_: Mapping[str, Any], manifests: Sequence[Any]) -> dict[str, tuple[np.ndarray, int]]:
    """Rotated key coordinates of each facet distribution at the headline dim, for the marginal figure.

    Each distribution's trials are regenerated from its data slice, checked against its manifest
    (:func:`kvasym.manifest.verified_trial`) and rotated with the pipeline's K-side rotation seed
    (``derived_seed(base, "rotation", name, dim, trial, "K")``), as the theory stage rotates them
    for the ``ks_beta`` check: :func:`rotated_marginal_sample` of the first ``marginal_trials``
    trials.

    Parameters
    ----------
    slice_ : mapping
        The figures slice (:func:`kvasym.render.figures.figure_slice.figures_slice`): its
        ``distributions``, ``headline``, ``facet_distributions``, ``seq_len``, ``n_queries``,
        ``trials``, ``base_seed`` and ``marginal_trials``.
    manifests : sequence of path-like
        Data manifests (``<name>/d<dim>.json``) or folders holding them (``results/data``).

    Returns
    -------
    dict
        Distribution -> (coordinates, working dimension), for each facet distribution whose
        manifest at the headline dim is among ``manifests`` (the others are left out).
    """
    from pathlib import Path

    from .manifest import load_manifest, verified_trial

    specs = {d["name"]: d for d in slice_["distributions"]}
    dim = int(slice_["headline"]["dim"])
    base = int(slice_["base_seed"])
    out: dict[str, tuple[np.ndarray, int]] = {}
    for name in slice_["facet_distributions"]:
        spec = specs[name]
        path = _manifest_path([Path(m) for m in manifests], name, dim)
        if path is None:
            continue
        data_slice = {
            "distribution": {k: spec[k] for k in ("name", "kind", "params")},
            "dim": dim,
            "seq_len": int(slice_["seq_len"]),
            "n_queries": int(slice_["n_queries"]),
            "trials": int(slice_["trials"]),
            "base_seed": base,
        }
        digests = load_manifest(path, data_slice)
        parts, work = [], dim
        for trial in range(min(int(slice_["marginal_trials"]), int(slice_["trials"]))):
            data = verified_trial(data_slice, trial, digests)
            sample, work = rotated_marginal_sample(data.keys, derived_seed(base, "rotation", name, dim, trial, "K"))
            parts.append(sample)
        if parts:
            out[name] = (np.concatenate(parts), int(work))
    return out


def _manifest_path(manifests: Sequence[Any], name: str, dim: int) -> Any:
    """The manifest of (``name``, ``dim``) among ``manifests`` (files, or folders holding
    ``<name>/d<dim>.json``), or None."""
    for path in manifests:
        if path.is_dir():
            candidate = path / name / f"d{dim}.json"
            if candidate.is_file():
                return candidate
        elif path.name == f"d{dim}.json" and path.parent.name == name:
            return path
    return None


def ks_against_beta(sample: np.ndarray, work_dim: int) -> dict[str, float]:
    """One-sample KS of coordinates against the unit-vector coordinate law in ``work_dim``.

    Parameters
    ----------
    sample : numpy.ndarray
        Coordinates, 1-D (e.g. from :func:`rotated_marginal_sample`).
    work_dim : int
        Dimension ``D`` of the law ``(x + 1)/2 ~ Beta((D-1)/2, (D-1)/2)``.

    Returns
    -------
    dict of str to float
        ``statistic``: ``sup_t |F_n(t) - F_D(t)|``; ``p``: two-sided p-value of
        ``scipy.stats.kstest``; ``n``: sample size.

    Raises
    ------
    KvasymError
        If the sample has fewer than two values.
    """
    from scipy import stats as sps

    if sample.size < 2:
        raise KvasymError("the KS test needs at least two coordinates")
    result = sps.kstest(sample, lambda t: coordinate_cdf(t, work_dim))
    p = float(result.pvalue)
    return {"statistic": float(result.statistic), "p": p, "n": float(sample.size)}


def ks_beta_distance(samples_by_trial: Sequence[np.ndarray], work_dim: int, *, n_boot: int, base_seed: int,
                     identity: tuple) -> dict[str, float]:
    """Kolmogorov distance of rotated coordinates from the Beta law, with its interval and KS p.

    The one procedure behind the theory table's ``ks_beta`` row, claims C5m/C5h and the
    marginals figure: ``D = sup_t |F_n(t) - F_D(t)|`` on the pooled sample (``F_D`` the
    coordinate law of :func:`ks_against_beta`), a percentile cluster-bootstrap interval with
    the trial as the cluster (:func:`kvasym.stats.ks_distance_ci`: keys of one trial share its
    draw, e.g. its low-rank subspace), and the one-sample KS p-value of the pooled sample.

    Parameters
    ----------
    samples_by_trial : sequence of numpy.ndarray
        Rotated coordinates per trial (:func:`rotated_marginal_sample`).
    work_dim : int
        Dimension ``D`` of the Beta law.
    n_boot : int
        Bootstrap replicates.
    base_seed : int
        Base seed of the study.
    identity : tuple
        The cell's identity (distribution, dim).

    Returns
    -------
    dict of str to float
        ``statistic`` (``D``), ``low``, ``high``, ``p``, ``n``.
    """
    from .stats import ks_distance_ci

    parts = [np.asarray(x, dtype=np.float64) for x in samples_by_trial]
    pooled = np.concatenate(parts) if parts else np.empty(0)
    ks = ks_against_beta(pooled, work_dim)
    if len(parts) < 2:
        return {**ks, "low": math.nan, "high": math.nan}
    ci = ks_distance_ci([coordinate_cdf(x, work_dim) for x in parts], n_boot=n_boot, base_seed=base_seed,
                        identity=(*identity, "ks-beta"))
    return {**ks, "statistic": ci["estimate"], "low": ci["low"], "high": ci["high"]}


def jensen_points(per_key: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(logit-error variance, log weight excess, mask of the rows kept): finite keys only.

    Parameters
    ----------
    per_key : mapping of str to array_like
        Per-key columns of :func:`kvasym.metrics.trial_metrics` (a dict or a DataFrame):
        ``weight_ref_mean``, ``weight_hat_mean`` and ``logit_err_var``.

    Returns
    -------
    var : numpy.ndarray
        ``logit_err_var`` of the rows kept.
    excess : numpy.ndarray
        ``log(weight_hat_mean) - log(weight_ref_mean)`` of the rows kept.
    kept : numpy.ndarray
        Boolean mask over the input rows: both values finite (a zero or NaN weight mean, or a
        NaN variance, drops the row).

    Notes
    -----
    Jensen's inequality: a zero-mean logit error ``e`` multiplies a key's unnormalized weight
    by ``exp(e)``, and ``E exp(e) > exp(E e) = 1`` (``exp(s^2/2)`` for Gaussian ``e`` of
    variance ``s^2``), so keys with noisier logits gain weight on average. The study regresses
    ``excess`` on ``var`` (claim C9: a positive slope).
    """
    ref = np.asarray(per_key["weight_ref_mean"], dtype=np.float64)
    hat = np.asarray(per_key["weight_hat_mean"], dtype=np.float64)
    var = np.asarray(per_key["logit_err_var"], dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        excess = np.log(hat) - np.log(ref)
    ok = np.isfinite(excess) & np.isfinite(var)
    return var[ok], excess[ok], ok
