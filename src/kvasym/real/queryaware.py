"""Query-aware key quantization: keys coded in the eigenbasis of the queries' second moment.

Per (layer ``l``, KV head ``h``) the calibrated second moment ``M = E[q q^T] = U diag(lam) U^T``
(:mod:`kvasym.real.querybases`) says what attention reads of a key error ``e = k - k_hat``:
``E[(q . e)^2] = e^T M e = sum_i lam_i (u_i . e)^2``. Two key quantizers use ``U`` and ``lam``
on a ``(T, d)`` block ``K`` (float64); the values are quantized by RKV's V side in both, and
each side spends ``n`` payload bits per coordinate plus its measured side bits.

``QRKV`` (OSCAR's construction [1]_ with our quantizer)
    ``Y = K U``, quantized by RKV's K side (randomized WHT, per-row norm, ``n``-bit Beta
    Lloyd-Max codebook) with the seeds :func:`kvasym.evaluate.quantize_pair` derives from the
    same identity; ``K_hat = Y_hat U^T``. Expected, and tested as a property rather than
    assumed: after the randomized WHT the scalar error of a row is close to isotropic (each
    rotated coordinate mixes all of ``Y``'s), so an orthogonal ``U`` in front of it changes
    little: ``E[(q . e)^2] ~ trace(M) E|e|^2 / d`` whatever ``U``. The measurement says how
    little on SmolLM2 (benchmarks/bench_queryaware.py).

``QWF`` (query-weighted water-filling, the attention-aware analogue of SKLT)
    ``s_i = sqrt(max(lam_i, eps lam_1) / lam_1)`` (:func:`query_scales`, ``eps`` =
    :data:`SCALE_FLOOR`), ``Y = K U diag(s)``, quantized by a side that centres (stores the
    block mean of ``Y``), applies *no* transform of its own, stores per-row norms and
    reverse-water-fills ``n d`` bits over the coordinate variances of the unit rows with
    Gaussian Lloyd-Max codebooks (SKLT's side with ``transform: none``:
    :data:`QWF_KEY_SIDE`, :mod:`kvasym.composed`); ``K_hat = Y_hat diag(1/s) U^T``.

    Why it is attention-aware. The error of ``Y`` is ``eps = e U diag(s)``, so
    ``u_i . e = eps_i / s_i`` and, for every coordinate above the floor (``s_i^2 = lam_i / lam_1``),
    ``e^T M e = sum_i lam_i eps_i^2 / s_i^2 = lam_1 |eps|^2``: the attention-weighted key error
    is ``lam_1`` times the plain squared error of ``Y``. Reverse water-filling gives coordinate
    ``i`` ``b_i`` bits to minimise ``sum_i var(Y_i) D(b_i)`` (``D`` the N(0, 1) Lloyd-Max
    distortion, :mod:`kvasym.waterfill`), the Gaussian model's ``E|eps|^2``; with
    ``var(Y_i) = s_i^2 sigma_i^2``, ``sigma_i^2 = var(u_i . k)``, that is
    ``sum_i lam_i sigma_i^2 D(b_i) / lam_1 = E[(q . e)^2] / lam_1`` when ``M`` is diagonal in
    ``U`` (it is, by construction, for the calibration queries). SKLT water-fills the same way
    over its own KLT coordinates, minimising ``E|e|^2``: the key error as if every direction
    were read equally. Approximations: the evaluation queries' ``M`` is the calibration's only
    approximately; rows are normalized first (the allocation uses the unit rows' variances);
    ``D`` is the Gaussian's.

    The floor. Directions with ``lam_i < eps lam_1`` are scaled by ``sqrt(eps) = 1e-3`` instead
    of ``sqrt(lam_i / lam_1)``: it keeps ``diag(s)`` invertible (the decoder divides by ``s``;
    calibration eigenvalues can be 0 or round-off), bounds its condition number by ``1e3`` so
    float64 round-off in ``Y diag(1/s)`` stays ~1e-13 relative, and keeps such a coordinate's
    stored scale within float16's normal range. It costs nothing measurable: directions under
    the floor carry less than ``d eps = 6.4e-5`` of the query energy together. Dividing by
    ``lam_1`` (``s_1 = 1``) keeps ``|Y| <= |K|``, so the norms and means stored in ``norm_dtype``
    keep ``K``'s range; a common factor does not change the quantizer otherwise (rows are
    normalized and the water-filling is scale invariant).

The basis and the scales are a per-model constant, like the weights, not per-cache side
information: they are not in the measured bits. :func:`basis_bytes` states their size.

References
----------
.. [1] Zhou et al. (2026) "OSCAR", arXiv:2605.17757.
.. [2] Zandieh, A., Daliri, M., Hadian, M., Mirrokni, V. (2025) "TurboQuant: Online Vector
   Quantization with Near-optimal Distortion Rate", arXiv:2504.19874 (RKV's rotated scalar).
.. [3] Cover, T. M., Thomas, J. A. (2006) "Elements of Information Theory", 2nd ed., Wiley,
   section 10.3.3 (reverse water-filling).
"""

from __future__ import annotations

import numpy as np

from ..errors import KvasymError
from ..evaluate import dequantize_with, quantize_pair
from ..schemes import SIDES, Scheme, SideSpec, get_scheme
from .querybases import (
    QueryBases,
    bases_from_moments,
    calibrate,
    check_disjoint,
    default_calibration_texts,
    load_query_bases,
    query_second_moments,
    save_query_bases,
    text_token_ids,
)

__all__ = ["VARIANTS", "SCALE_FLOOR", "QWF_KEY_SIDE", "variant_scheme", "query_scales",
           "quantize_pair_query_aware", "basis_bytes", "query_weighted_error", "QueryBases",
           "query_second_moments", "bases_from_moments", "calibrate", "save_query_bases", "load_query_bases",
           "check_disjoint", "default_calibration_texts", "text_token_ids"]

VARIANTS = ("QRKV", "QWF")
#: What each variant stores, in one line (the paper's scheme table).
VARIANT_DESCRIPTIONS = {
    "QRKV": "keys in the eigenbasis of their queries' second moment (calibrated on other texts), then RKV; "
            "RKV values",
    "QWF": "keys in their queries' eigenbasis scaled by the query spectrum, centred, then reverse water-filling "
           "with Gaussian codebooks; RKV values",
}
#: ``eps`` of :func:`query_scales`: eigenvalues below ``eps lam_1`` are raised to it (module docstring).
SCALE_FLOOR = 1e-6
#: QWF's key side: SKLT's (centre, water-filling, Gaussian codebooks, no sketch) without its KLT.
QWF_KEY_SIDE = SideSpec(rotate=False, scalar_offset=0, qjl=False, center=True, transform="none",
                        allocation="waterfill")


def variant_scheme(variant: str) -> Scheme:
    """The scheme that stores a variant's ``Y`` (K side) and values (V side, RKV's).

    ``QRKV``: RKV itself (so its seeds are RKV's). ``QWF``: :data:`QWF_KEY_SIDE` and RKV's V.
    """
    rkv = get_scheme("RKV")
    if variant == "QRKV":
        return rkv
    if variant == "QWF":
        return Scheme("QWF", QWF_KEY_SIDE, rkv.V, "query-weighted water-filling of keys; RKV values")
    raise KvasymError(f"query-aware variant must be one of {', '.join(VARIANTS)}, got {variant!r}")


def query_scales(eigenvalues: np.ndarray, floor: float = SCALE_FLOOR) -> np.ndarray:
    """``s_i = sqrt(max(lam_i, floor lam_1) / lam_1)`` (module docstring), ``lam_1 = max lam``.

    With no query energy at all (``lam = 0``) every direction is equally irrelevant: ``s = 1``.
    """
    lam = np.asarray(eigenvalues, dtype=np.float64)
    if lam.ndim != 1 or not np.all(np.isfinite(lam)) or np.any(lam < 0):
        raise KvasymError(f"eigenvalues must be a finite 1-D array >= 0, got shape {lam.shape}")
    if not 0 < floor <= 1:
        raise KvasymError(f"floor must be in (0, 1], got {floor!r}")
    top = float(lam.max())
    if top == 0.0:
        return np.ones_like(lam)
    return np.sqrt(np.maximum(lam, floor * top) / top)


def _check_block(keys: np.ndarray, values: np.ndarray, bases: QueryBases, layer: int, kv_head: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    n_layers, n_kv, head_dim = bases.shape
    if not 0 <= int(layer) < n_layers:
        raise KvasymError(f"layer {layer} out of range 0..{n_layers - 1} of the query bases")
    if not 0 <= int(kv_head) < n_kv:
        raise KvasymError(f"kv_head {kv_head} out of range 0..{n_kv - 1} of the query bases")
    k = np.asarray(keys, dtype=np.float64)
    if k.ndim != 2 or k.shape[1] != head_dim:
        raise KvasymError(f"keys must be (T, {head_dim}) to match the query bases, got shape {k.shape}")
    return k, np.asarray(values, dtype=np.float64)


def quantize_pair_query_aware(keys: np.ndarray, values: np.ndarray, variant: str, budget: int,
                              bases: QueryBases, layer: int, kv_head: int, *, base_seed: int,
                              identity: tuple[str | int, ...], norm_dtype: str = "float32",
                              kernel: str = "auto", side16: bool = False
                              ) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """Keys quantized by a query-aware variant and values by RKV, dequantized, with their bits.

    Parameters
    ----------
    keys, values : numpy.ndarray
        ``(T, head_dim)`` key and value rows of layer ``layer``, KV head ``kv_head``.
    variant : {"QRKV", "QWF"}
        The key quantizer (module docstring).
    budget : int
        Bits per coordinate ``n`` of each side's payload.
    bases : QueryBases
        The calibrated bases (``bases.bases[layer, kv_head]``, ``bases.eigenvalues[layer, kv_head]``).
    layer, kv_head : int
        Which basis.
    base_seed : int
        The study's base seed.
    identity : tuple
        Seed identity, as :func:`kvasym.evaluate.quantize_pair` takes it (e.g. ``(text, layer,
        kv_head)``): the WHT of ``Y`` (QRKV) and of the values use the seeds RKV would.
    norm_dtype : {"float32", "float16"}, optional
        Storage dtype of norms, means and coordinate scales.
    kernel : str, optional
        As :func:`kvasym.evaluate.quantize_pair` (default ``"auto"``).
    side16 : bool, optional
        Also return ``k_bits_side16`` and ``v_bits_side16``: the side bits with float16 norms
        (:meth:`kvasym.cache.PackedCache.side_bits_at`), as :func:`kvasym.evaluate.head_metrics`
        reports them for the per-head real rows.

    Returns
    -------
    k_hat, v_hat : numpy.ndarray
        ``(T, head_dim)`` float64 reconstructions.
    bits : dict of str to float
        ``k_bits_payload``, ``k_bits_side``, ``v_bits_payload``, ``v_bits_side``: bits per
        coordinate measured from the packed caches (the basis is not among them: :func:`basis_bytes`).
    """
    scheme = variant_scheme(variant)
    k, v = _check_block(keys, values, bases, layer, kv_head)
    basis = bases.bases[int(layer), int(kv_head)]
    scales = query_scales(bases.eigenvalues[int(layer), int(kv_head)]) if variant == "QWF" else None
    y = k @ basis if scales is None else (k @ basis) * scales
    packed = quantize_pair(y, v, scheme, int(budget), base_seed=base_seed, identity=identity,
                           norm_dtype=norm_dtype, kernel=kernel)
    y_hat = dequantize_with(packed["K"], kernel)
    k_hat = (y_hat if scales is None else y_hat / scales) @ basis.T
    bits = {f"{side.lower()}_bits_{part}": packed[side].bits_per_coordinate()[part]
            for side in SIDES for part in ("payload", "side")}
    if side16:
        bits.update({f"{side.lower()}_bits_side16": packed[side].bits_per_coordinate("float16")["side"]
                     for side in SIDES})
    return k_hat, dequantize_with(packed["V"], kernel), bits


def basis_bytes(bases: QueryBases, dtype: str = "float16", variant: str = "QRKV") -> int:
    """Bytes of the per-model constant a variant needs, stored in ``dtype``: every ``U``
    (``n_layers n_kv d^2`` numbers), plus, for QWF, every scale vector ``s`` (``n_layers n_kv d``)."""
    variant_scheme(variant)  # refuses an unknown variant
    n_layers, n_kv, head_dim = bases.shape
    numbers = n_layers * n_kv * head_dim * (head_dim + (1 if variant == "QWF" else 0))
    return numbers * np.dtype(dtype).itemsize


def query_weighted_error(queries: np.ndarray, keys: np.ndarray, keys_hat: np.ndarray) -> float:
    """Mean over every (query, key) pair of ``(q_i . (k_j - k_hat_j))^2``.

    Computed as ``(1/(N_q N_k)) sum_j e_j^T (Q^T Q) e_j`` (the same sum, regrouped).

    Parameters
    ----------
    queries : numpy.ndarray
        ``(N_q, d)`` queries.
    keys, keys_hat : numpy.ndarray
        ``(N_k, d)`` keys and their reconstruction.

    Returns
    -------
    float
        In squared logit units times ``d`` (the logit is ``q . k / sqrt(d)``).
    """
    q = np.asarray(queries, dtype=np.float64)
    e = np.asarray(keys, dtype=np.float64) - np.asarray(keys_hat, dtype=np.float64)
    if q.ndim != 2 or e.ndim != 2 or q.shape[1] != e.shape[1] or not q.shape[0] or not e.shape[0]:
        raise KvasymError(f"queries {q.shape} and keys {e.shape} must be non-empty (N, d) with the same d")
    return float(np.einsum("ji,ik,jk->", e, q.T @ q, e) / (q.shape[0] * e.shape[0]))
