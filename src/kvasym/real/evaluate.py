"""The study's metrics on a real capture: every (layer, KV head) cache of a SmolLM2 capture,
quantized by each scheme and budget, read by its own model's queries.

For layer ``l`` and KV head ``h`` the cache is ``K = k_post_rope[l, h]`` and ``V = v[l, h]``
(T, head_dim); the queries are those of every query head ``g`` with
``kv_head_of_query_head[g] == h`` (grouped-query attention: ``g // group``), stacked, each
under the capture's causal mask (query ``i`` sees key ``j`` iff ``positions[j] <=
positions[i]``). Logits are ``q.k / sqrt(head_dim)``: sharpness 1 is the model's own attention.

``rope="pre"`` quantizes the keys before RoPE (``k_pre_rope``) and rotates the reconstruction
with the capture's RoPE tables, the way a cache that stores pre-RoPE keys would be read; the
reference is the same in both cases (the post-RoPE keys). Rotation and QJL seeds derive from
(base seed, text, layer, KV head, side), so every scheme and budget sees the same random
rotation of the same cache (the paired design of the synthetic study).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import KvasymError
from ..evaluate import head_metrics, reconstruction_metrics
from ..metrics import trial_reference
from ..schemes import Scheme
from . import REAL_POST_ROPE, REAL_PRE_ROPE
from .capture import Capture
from .queryaware import VARIANTS, quantize_pair_query_aware
from .querybases import QueryBases

ROPE_MODES = ("post", "pre")


def capture_cells(capture: Capture, layers: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """The (layer, KV head) pairs to evaluate: ``layers`` (model layer numbers, default all
    captured) times every KV head."""
    captured = [int(x) for x in capture.layers]
    chosen = captured if layers is None else [int(x) for x in layers]
    missing = sorted(set(chosen) - set(captured))
    if missing:
        raise KvasymError(f"layers {missing} are not in the capture (captured: {captured})")
    return [(layer, head) for layer in chosen for head in range(capture.k_post_rope.shape[1])]


def evaluate_capture(
    capture: Capture,
    schemes: Sequence[Scheme],
    budgets: Sequence[int],
    *,
    name: str,
    base_seed: int,
    layers: Sequence[int] | None = None,
    rope: str = "post",
    sharpness: Sequence[float] = (1.0,),
    norm_dtype: str = "float32",
    kernel: str = "numpy",
    query_variants: Sequence[str] = (),
    query_bases: QueryBases | None = None,
) -> dict[str, np.ndarray]:
    """Per-query metrics of every scheme and budget on every (layer, KV head) of ``capture``
    (``kernel``: as :func:`kvasym.evaluate.head_metrics`).

    ``query_variants`` (names of :data:`kvasym.real.queryaware.VARIANTS`, RoPE mode ``post``
    only) are measured after the schemes, each with keys quantized by
    :func:`kvasym.real.queryaware.quantize_pair_query_aware` in ``query_bases`` (a
    :class:`kvasym.real.querybases.QueryBases` indexed by the capture's layer order,
    ``capture.layers``; e.g. :func:`kvasym.real.querybases.leave_one_text_out_bases`), seed
    identity ``(name, layer, kv_head)`` as every scheme's; scheme column the variant's name.

    Returns columns (equal length): identifiers ``text`` (= ``name``), ``layer``, ``kv_head``,
    ``query_head``, ``position``, ``scheme``, ``budget``, ``rope``, ``sharpness``, then every
    per-query column of :func:`kvasym.metrics.trial_metrics_multi` (KL, top-5 recall, the
    six-dimensional error framework). A query at position 0 sees one key: its KL is 0 by
    construction, and it is kept (dropping it would bias nothing and hide the mask).
    """
    if rope not in ROPE_MODES:
        raise KvasymError(f"rope must be one of {ROPE_MODES}, got {rope!r}")
    if not (schemes or query_variants) or not budgets:
        raise KvasymError("evaluate_capture needs at least one scheme and one budget")
    if query_variants:
        unknown = sorted(set(query_variants) - set(VARIANTS))
        if unknown:
            raise KvasymError(f"query_variants {unknown} are not among {list(VARIANTS)}")
        if rope != "post":
            raise KvasymError(f"query_variants {list(query_variants)} run with rope 'post' only (their bases are of "
                              f"post-RoPE queries), got rope {rope!r}")
        expected = (len(capture.layers), capture.k_post_rope.shape[1], capture.k_post_rope.shape[-1])
        if query_bases is None or tuple(query_bases.shape) != expected:
            raise KvasymError(f"query_variants {list(query_variants)} need query_bases of shape (captured layers, "
                              f"kv_heads, head_dim) = {expected}, got "
                              f"{None if query_bases is None else tuple(query_bases.shape)}")
    cells = capture_cells(capture, layers)
    layer_index = {int(x): i for i, x in enumerate(capture.layers)}
    heads = np.asarray(capture.kv_head_of_query_head)
    positions = np.asarray(capture.positions)
    n_tokens = positions.size
    sliding = {int(i) for i in capture.metadata.get("sliding_layers", ())}
    if rope == "pre":
        from .gguf_model import apply_rope, rope_tables  # pure numpy: no model needed

        def layer_tables(layer: int) -> tuple[np.ndarray, np.ndarray]:
            # rope_freq_factors: a scaled-RoPE model's per-frequency divisors (absent when unscaled;
            # never on a sliding layer, whose local RoPE is unscaled)
            factors = None if layer in sliding else capture.metadata.get("rope_freq_factors")
            return rope_tables(positions, capture.k_post_rope.shape[-1], capture.rope_base(layer), np.float64, factors)
    columns: dict[str, list[np.ndarray]] = {}

    def add(name_: str, value: np.ndarray) -> None:
        columns.setdefault(name_, []).append(value)

    for layer, kv_head in cells:
        li = layer_index[layer]
        query_heads = np.flatnonzero(heads == kv_head)
        if query_heads.size == 0:
            raise KvasymError(f"no query head reads KV head {kv_head} (kv_head_of_query_head = {heads.tolist()})")
        keys = np.asarray(capture.k_post_rope[li, kv_head], dtype=np.float64)
        stored = keys if rope == "post" else np.asarray(capture.k_pre_rope[li, kv_head], dtype=np.float64)
        values = np.asarray(capture.v[li, kv_head], dtype=np.float64)
        queries = np.concatenate([np.asarray(capture.q_post_rope[li, g], dtype=np.float64) for g in query_heads])
        # the layer's own mask: a sliding-window layer's queries read only its window (Gemma 3)
        mask = np.tile(capture.causal_mask(layer), (query_heads.size, 1))
        reconstruct = None
        if rope == "pre":
            tables = layer_tables(layer)

            def reconstruct(k_hat: np.ndarray, tables: tuple[np.ndarray, np.ndarray] = tables) -> np.ndarray:
                return apply_rope(k_hat, *tables)
        # the reference attention of this head, once for every scheme and budget
        reference = trial_reference(queries, keys, values, list(sharpness), mask, kernel=kernel)
        passes = [(scheme.name, scheme, budget) for scheme in schemes for budget in budgets]
        passes += [(variant, None, budget) for variant in query_variants for budget in budgets]
        for scheme_name, scheme, budget in passes:
            if scheme is not None:
                results = head_metrics(stored, keys, values, queries, scheme, int(budget), base_seed=base_seed,
                                       identity=(name, layer, kv_head), sharpness=list(sharpness), mask=mask,
                                       norm_dtype=norm_dtype, reconstruct_keys=reconstruct, kernel=kernel,
                                       reference=reference)
            else:
                k_hat, v_hat, bits = quantize_pair_query_aware(
                    keys, values, scheme_name, int(budget), query_bases, li, kv_head, base_seed=base_seed,
                    identity=(name, layer, kv_head), norm_dtype=norm_dtype, kernel=kernel, side16=True)
                results = reconstruction_metrics(queries, keys, values, k_hat, v_hat, bits,
                                                 sharpness=list(sharpness), mask=mask, kernel=kernel,
                                                 reference=reference)
            for s, (per_query, bits) in zip(sharpness, results):
                n = queries.shape[0]
                for key, value in bits.items():
                    add(key, np.full(n, value))
                add("text", np.full(n, name, dtype=object))
                add("layer", np.full(n, layer, dtype=np.int32))
                add("kv_head", np.full(n, kv_head, dtype=np.int32))
                add("query_head", np.repeat(query_heads.astype(np.int32), n_tokens))
                add("position", np.tile(positions.astype(np.int32), query_heads.size))
                add("scheme", np.full(n, scheme_name, dtype=object))
                add("budget", np.full(n, int(budget), dtype=np.int32))
                add("rope", np.full(n, rope, dtype=object))
                add("sharpness", np.full(n, float(s)))
                for key, column in per_query.items():
                    add(key, np.asarray(column))
    return {key: np.concatenate(parts) for key, parts in columns.items()}


def summarize(columns: dict[str, Any]) -> Any:
    """Mean and 99th-percentile KL, mean top-5 recall and mean output direction error per
    (text, layer, kv_head, scheme, budget, rope, sharpness): the heat-map table."""
    import pandas as pd

    frame = pd.DataFrame(columns)
    keys = ["text", "layer", "kv_head", "scheme", "budget", "rope", "sharpness"]
    grouped = frame.groupby(keys, sort=True)
    out = grouped.agg(kl_mean=("kl", "mean"), recall_top5_mean=("recall_top5", "mean"),
                      t_eps_dir_mean=("t_eps_dir", "mean"), n_queries=("kl", "size"))
    out["kl_p99"] = grouped["kl"].quantile(0.99)
    return out.reset_index()


#: Distribution names of the real rows in the study's tables: keys quantized after RoPE (what a
#: deployed cache stores) and before it.
REAL_DISTRIBUTIONS: dict[str, str] = {REAL_POST_ROPE: "post", REAL_PRE_ROPE: "pre"}
REAL_KIND = "smollm2"
