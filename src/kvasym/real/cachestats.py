"""Descriptive statistics of real caches: :func:`kvasym.cachestats.cache_statistics` of every
(text, layer, head) matrix of SmolLM2 captures, for comparison with the synthetic families.

For every capture (one text) and every captured layer, each of these tensors is summarized per
head, one (tokens, head_dim) matrix at a time (all tokens of the text):

===================  ====================  ===============================================
``tensor``           heads                 what
===================  ====================  ===============================================
``k_post_rope``      KV heads              keys as the cache stores them (after RoPE)
``k_pre_rope``       KV heads              keys before RoPE
``v``                KV heads              values
``q_post_rope``      query heads           queries after RoPE
``q_pre_rope``       query heads           queries before RoPE
===================  ====================  ===============================================

Columns of the table (:data:`COLUMNS`): ``text``, ``layer`` (the model's layer number),
``kv_head`` (for queries: the KV head the query head reads), ``head`` (the head within its
tensor: the KV head for K and V, the query head for Q), ``tensor``, ``head_dim``, ``n_rows``
(tokens), the statistics of :func:`kvasym.cachestats.cache_statistics` (``tail_index``,
``participation_ratio``, ``top_channel_energy``, ``mean_energy``) and, for the queries only,
``alignment``: the mean over the text's positions of the query's alignment with the covariance of
the keys it reads (:func:`kvasym.querymodel.query_alignment`: ``a = q^T C_K q / (||q||^2 tr C_K /
d)``, ``C_K`` the centred covariance of all the text's keys of its KV head, the same RoPE mode;
1 for a query direction unrelated to the keys, ``d / r`` for one inside rank-``r`` keys), the
quantity the synthetic query models set (:mod:`kvasym.querymodel`); NaN for K and V rows. The
causal mask is ignored here: every position is measured against the whole text's keys.

The statistics are computed for all heads of a layer at once
(:func:`kvasym.cachestats.batched_cache_statistics`, one layer in memory at a time).

The DAG's rule ``real_cachestats`` writes them with ``kvasym stage real_cachestats``
(:mod:`kvasym.stages.real_cachestats`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..cachestats import STATISTICS, batched_cache_statistics
from ..errors import KvasymError
from ..querymodel import query_alignment
from .capture import HEAD_ARRAYS, Capture

#: Tensors summarized, in table order: keys after and before RoPE, values, queries.
TENSORS = ("k_post_rope", "k_pre_rope", "v", "q_post_rope", "q_pre_rope")
KEY_COLUMNS = ("text", "layer", "kv_head", "head", "tensor")
COLUMNS = (*KEY_COLUMNS, "head_dim", "n_rows", *STATISTICS, "alignment")
#: The keys each query tensor's alignment is measured against (same RoPE mode).
QUERY_KEYS = {"q_post_rope": "k_post_rope", "q_pre_rope": "k_pre_rope"}
CACHESTATS_FORMAT = "kvasym.real.cachestats/2"


def capture_statistics(capture: Capture, text: str, tensors: Sequence[str] = TENSORS) -> dict[str, np.ndarray]:
    """The statistics of every (layer, head) matrix of ``tensors`` in one capture, as columns
    (:data:`COLUMNS`), in the order tensor, layer, head."""
    unknown = [t for t in tensors if t not in HEAD_ARRAYS]
    if unknown:
        raise KvasymError(f"unknown tensor(s) {unknown}; a capture holds {list(HEAD_ARRAYS)}")
    kv_of_query = np.asarray(capture.kv_head_of_query_head, dtype=np.int64)
    parts: dict[str, list[np.ndarray]] = {c: [] for c in COLUMNS}
    for tensor in tensors:
        array = getattr(capture, tensor)  # (L, H, T, D)
        n_layers, n_heads, n_rows, head_dim = array.shape
        heads = np.arange(n_heads)
        kv_heads = kv_of_query[heads] if HEAD_ARRAYS[tensor] == "n_heads" else heads
        for li in range(n_layers):
            stats = batched_cache_statistics(array[li])  # one layer in float64 at a time
            parts["text"].append(np.full(n_heads, text, dtype=object))
            parts["layer"].append(np.full(n_heads, int(capture.layers[li]), dtype=np.int64))
            parts["kv_head"].append(kv_heads.astype(np.int64))
            parts["head"].append(heads.astype(np.int64))
            parts["tensor"].append(np.full(n_heads, tensor, dtype=object))
            parts["head_dim"].append(np.full(n_heads, head_dim, dtype=np.int64))
            parts["n_rows"].append(np.full(n_heads, n_rows, dtype=np.int64))
            for name in STATISTICS:
                parts[name].append(stats[name])
            alignment = np.full(n_heads, np.nan)
            if tensor in QUERY_KEYS:
                keys = getattr(capture, QUERY_KEYS[tensor])[li]  # (KV heads, T, D)
                for head in heads:
                    a = query_alignment(array[li, head], keys[kv_heads[head]])
                    alignment[head] = float(np.mean(a[np.isfinite(a)])) if np.isfinite(a).any() else np.nan
            parts["alignment"].append(alignment)
    return {c: np.concatenate(v) if v else np.array([]) for c, v in parts.items()}


def captures_statistics(capture_paths: Sequence[str | os.PathLike]) -> Any:
    """:func:`capture_statistics` of every capture file (read with
    :func:`kvasym.real.capture.load_capture`, which names a bad file), as one DataFrame.
    The text is the capture's metadata ``name`` (else the file stem)."""
    import pandas as pd

    from .capture import load_capture

    if not capture_paths:
        raise KvasymError("real cache statistics need at least one capture file")
    frames = []
    seen: dict[str, str] = {}
    for path in capture_paths:
        capture = load_capture(path)
        text = str(capture.metadata.get("name") or Path(path).stem)
        if text in seen:
            raise KvasymError(f"{path}: text {text!r} was already read from {seen[text]}")
        seen[text] = str(path)
        frames.append(pd.DataFrame(capture_statistics(capture, text)))
        del capture
    frame = pd.concat(frames, ignore_index=True)
    return frame[list(COLUMNS)]
