"""One cache, one scheme, one budget: quantize K and V and measure the damage to attention.

This is the unit of work shared by the pipeline (one trial of a cell) and by ``kvasym
evaluate`` (a cache dumped from the user's own model).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from .cache import PackedCache, quantize
from .errors import KvasymError
from .kernels import auto_kernel
from .metrics import TrialReference, trial_metrics, trial_metrics_multi
from .schemes import SIDES, Scheme
from .seeds import derived_seed


def quantize_pair(
    keys: np.ndarray,
    values: np.ndarray,
    scheme: Scheme,
    budget: int,
    *,
    base_seed: int,
    identity: tuple[str | int, ...] = (),
    norm_dtype: str = "float32",
    kernel: str = "numpy",
) -> dict[str, PackedCache]:
    """Packed K and V caches. Rotation and QJL seeds depend on (identity, side) only, not on
    the scheme or budget, so every scheme sees the same random rotation of the same data.
    ``kernel`` is that of :func:`kvasym.cache.quantize`, or ``"auto"``: per side
    :func:`kvasym.kernels.auto_kernel` (the compiled kernels when numba imports)."""
    scheme.validate_budget(budget)
    out = {}
    for side, matrix in zip(SIDES, (keys, values)):
        spec = scheme.side(side)
        try:
            out[side] = quantize(
                matrix,
                spec,
                budget,
                rotation_seed=derived_seed(base_seed, "rotation", *identity, side),
                qjl_seed=derived_seed(base_seed, "qjl", *identity, side),
                norm_dtype=norm_dtype,
                meta={"scheme": scheme.name, "side": side},
                kernel=auto_kernel() if kernel == "auto" else kernel,
            )
        except KvasymError as exc:
            raise KvasymError(f"{'keys' if side == 'K' else 'values'}: {exc}") from None
    return out


def dequantize_with(cache: PackedCache, kernel: str = "numpy") -> np.ndarray:
    """``cache`` reconstructed in float64 with ``kernel`` (``"auto"``: :func:`kvasym.kernels.auto_kernel`)."""
    return cache.dequantize("float64", kernel=auto_kernel() if kernel == "auto" else kernel)


def head_metrics(
    stored_keys: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    queries: np.ndarray,
    scheme: Scheme,
    budget: int,
    *,
    base_seed: int,
    identity: tuple[str | int, ...],
    sharpness: Sequence[float],
    mask: np.ndarray | None = None,
    norm_dtype: str = "float32",
    reconstruct_keys: Callable[[np.ndarray], np.ndarray] | None = None,
    kernel: str = "numpy",
    reference: TrialReference | None = None,
) -> list[tuple[dict[str, np.ndarray], dict[str, float]]]:
    """One attention head of a real cache: quantize ``stored_keys`` and ``values`` with
    ``scheme`` at ``budget``, read them with ``queries`` against the reference ``keys``, and
    return, per sharpness, the per-query metric columns and the measured bits per coordinate
    (``k_bits_payload``, ``k_bits_side``, ``v_bits_payload``, ``v_bits_side``, and ``k_bits_side16``,
    ``v_bits_side16``: the side bits with float16 norms, :meth:`kvasym.cache.PackedCache.side_bits_at`).

    ``reconstruct_keys`` maps the dequantized stored keys to the space of ``keys`` (e.g. RoPE
    for keys stored before it); ``mask`` (n_queries, n_keys) says which keys each query sees.
    ``kernel``: as :func:`quantize_pair` (``"auto"``: the compiled kernels where they implement
    the side, for quantizing and dequantizing, and the compiled attention-row pass of
    :func:`kvasym.metrics.trial_metrics_multi`). ``reference``: the head's
    :func:`kvasym.metrics.trial_reference` (of ``queries``, ``keys``, ``values``, ``mask`` and
    every sharpness), built once by a caller that measures the head with several schemes or
    budgets.
    """
    packed = quantize_pair(stored_keys, values, scheme, int(budget), base_seed=base_seed,
                           identity=identity, norm_dtype=norm_dtype, kernel=kernel)
    keys_hat = dequantize_with(packed["K"], kernel)
    if reconstruct_keys is not None:
        keys_hat = reconstruct_keys(keys_hat)
    values_hat = dequantize_with(packed["V"], kernel)
    bits = {f"{side.lower()}_bits_{part}": packed[side].bits_per_coordinate()[part]
            for side in SIDES for part in ("payload", "side")}
    bits.update({f"{side.lower()}_bits_side16": packed[side].bits_per_coordinate("float16")["side"]
                 for side in SIDES})
    return reconstruction_metrics(queries, keys, values, keys_hat, values_hat, bits, sharpness=sharpness,
                                  mask=mask, kernel=kernel, reference=reference)


def reconstruction_metrics(
    queries: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    keys_hat: np.ndarray,
    values_hat: np.ndarray,
    bits: dict[str, float],
    *,
    sharpness: Sequence[float],
    mask: np.ndarray | None = None,
    kernel: str = "numpy",
    reference: TrialReference | None = None,
) -> list[tuple[dict[str, np.ndarray], dict[str, float]]]:
    """:func:`head_metrics` of reconstructions made elsewhere (e.g. a query-aware quantizer,
    :func:`kvasym.real.queryaware.quantize_pair_query_aware`): per sharpness, the per-query
    metric columns of ``queries`` reading ``keys_hat``, ``values_hat`` against ``keys``,
    ``values`` (:func:`kvasym.metrics.trial_metrics_multi`), each with ``bits``."""
    # only the per-query columns are kept: skip the per-key table (a fifth of the work)
    results = trial_metrics_multi(queries, keys, values, keys_hat, values_hat, list(sharpness), mask=mask,
                                  per_key=False, kernel=kernel, reference=reference)
    return [(per_query, bits) for per_query, _per_key in results]


def causal_mask(n_queries: int, n_keys: int) -> np.ndarray:
    """Query i (the last n_queries positions of the sequence) sees keys 0..n_keys-n_queries+i."""
    if n_queries > n_keys:
        raise KvasymError(f"a causal mask needs n_queries <= n_keys, got {n_queries} > {n_keys}")
    offset = n_keys - n_queries
    return np.arange(n_keys)[None, :] <= (np.arange(n_queries)[:, None] + offset)


def evaluate_cache(
    keys: np.ndarray,
    values: np.ndarray,
    queries: np.ndarray,
    scheme: Scheme,
    budget: int,
    *,
    sharpness: float = 1.0,
    seed: int = 0,
    norm_dtype: str = "float32",
    causal: bool = False,
) -> dict[str, float | int | str]:
    """Summary metrics of one scheme on one (K, V, queries) cache."""
    if keys.shape[0] != values.shape[0]:
        raise KvasymError(f"keys have {keys.shape[0]} rows but values have {values.shape[0]}")
    if queries.shape[1] != keys.shape[1]:
        raise KvasymError(f"queries have head_dim {queries.shape[1]} but keys have {keys.shape[1]}")
    if keys.shape[1] < 3 or values.shape[1] < 3:
        raise KvasymError("keys and values need at least 3 coordinates per vector")
    if keys.shape[0] < 2:
        # over one key every attention weight is 1: KL 0 and recall 1 for any scheme, a
        # measurement of nothing (the study's seq_len and a cache file's T have the same floor)
        raise KvasymError(f"keys need at least 2 rows (positions), got {keys.shape[0]}")
    caches = quantize_pair(keys, values, scheme, budget, base_seed=seed, norm_dtype=norm_dtype)
    mask = causal_mask(queries.shape[0], keys.shape[0]) if causal else None
    per_query, _ = trial_metrics(
        queries,
        keys,
        values,
        caches["K"].dequantize("float64"),
        caches["V"].dequantize("float64"),
        sharpness,
        mask,
    )
    kl = per_query["kl"]
    summary: dict[str, float | int | str] = {
        "scheme": scheme.name,
        "budget": budget,
        "n_keys": int(keys.shape[0]),
        "n_queries": int(queries.shape[0]),
        "kl_mean": float(np.mean(kl)),
        "kl_median": float(np.median(kl)),
        "kl_p99": float(np.quantile(kl, 0.99)),
        "kl_max": float(np.max(kl)),
        "recall_top5_mean": float(np.mean(per_query["recall_top5"])),
    }
    for site in ("k", "v", "t"):
        for name in ("snr_db", "eff_bits", "phi", "eps_dir"):
            summary[f"{site}_{name}_mean"] = float(np.mean(per_query[f"{site}_{name}"]))
    for side in SIDES:
        for part, value in caches[side].bits_per_coordinate().items():
            summary[f"{side.lower()}_bits_{part}"] = value
    return summary
