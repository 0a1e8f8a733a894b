"""Stage ``metrics`` (rule ``metrics``): per-query and per-key metrics of one cell.

The packed caches of the cell are dequantized from the file (never from memory), checked to be
the ones this cell's quantize job writes, and compared with the data rule's stored trials
(checked against the manifest) at every sharpness of the slice: one per-query and one per-key
Parquet file, parts of the two datasets ``results/metrics/{per_query,per_key}``, whose columns
are built whole (one array per column and part, concatenated), never row by row.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from ..cache import PackedCache, load_packed
from ..dataset import PER_KEY_SCHEMA, PER_QUERY_SCHEMA, provenance, to_table, write_parquet_atomic
from ..errors import DamagedFile
from ..manifest import load_manifest, stored_trials, trials_path
from ..metrics import trial_metrics_multi
from ..schemes import Scheme
from ..seeds import derived_seed
from ._slice import add_slice_arguments, slice_scheme, stage_slice
from .quantize import cache_identity_name, packed_cache_name


def run_metrics(
    slice_: Mapping[str, Any],
    data_json: str | os.PathLike,
    packed_npz: str | os.PathLike,
    out_per_query: str | os.PathLike,
    out_per_key: str | os.PathLike,
    trials_npy: str | os.PathLike | None = None,
) -> None:
    """Per-query and per-key metrics of one cell, for every sharpness, as Parquet; the trials
    are read from ``trials_npy`` (default: beside the manifest)."""
    digests = load_manifest(data_json, slice_)
    read_trial = stored_trials(slice_, trials_path(data_json) if trials_npy is None else trials_npy, digests)
    caches = load_packed(packed_npz)
    scheme = slice_scheme(slice_)
    ident = {
        "distribution": slice_["distribution"]["name"],
        "kind": slice_["distribution"]["kind"],
        "dim": slice_["dim"],
        "scheme": slice_["scheme"]["name"],
        "budget": slice_["budget"],
    }
    query_parts: list[dict[str, np.ndarray]] = []
    key_parts: list[dict[str, np.ndarray]] = []
    for trial in range(slice_["trials"]):
        data = read_trial(trial)
        try:
            k_cache, v_cache = caches[packed_cache_name(trial, "K")], caches[packed_cache_name(trial, "V")]
        except KeyError:
            raise DamagedFile(packed_npz, f"no packed caches for trial {trial}") from None
        for side, cache, matrix in (("K", k_cache, data.keys), ("V", v_cache, data.values)):
            _check_cache_matches(cache, matrix.shape, slice_, scheme, trial, side, packed_npz)
        keys_hat = k_cache.dequantize("float64")
        values_hat = v_cache.dequantize("float64")
        bits = {}
        for side, cache in (("k", k_cache), ("v", v_cache)):
            stored = cache.bits_per_coordinate()
            bits.update({f"{side}_bits_payload": stored["payload"], f"{side}_bits_side": stored["side"],
                         # what float16 norms would cost: total bits at norm_dtype float16
                         f"{side}_bits_side16": cache.bits_per_coordinate("float16")["side"]})
        results = trial_metrics_multi(
            data.queries, data.keys, data.values, keys_hat, values_hat, slice_["sharpness"]
        )
        for sharpness, (per_query, per_key) in zip(slice_["sharpness"], results):
            rows = len(per_query["kl"])
            common = {**ident, "sharpness": sharpness, "trial": trial}
            query_parts.append(
                {**{k: np.full(rows, v) for k, v in common.items()}, **per_query,
                 **{k: np.full(rows, v) for k, v in bits.items()}}
            )
            if trial < slice_["per_key_trials"]:
                n_keys = len(per_key["key"])
                key_parts.append({**{k: np.full(n_keys, v) for k, v in common.items()}, **per_key})
    meta = provenance(slice_)
    write_parquet_atomic(to_table(_concat(query_parts, PER_QUERY_SCHEMA), PER_QUERY_SCHEMA), out_per_query, meta)
    write_parquet_atomic(to_table(_concat(key_parts, PER_KEY_SCHEMA), PER_KEY_SCHEMA), out_per_key, meta)


def _check_cache_matches(
    cache: PackedCache,
    shape: tuple[int, ...],
    slice_: Mapping[str, Any],
    scheme: Scheme,
    trial: int,
    side: str,
    path: str | os.PathLike,
) -> None:
    """The packed cache must be the one this cell's quantize job writes: same shape, scheme side,
    budget, norm storage and the seeds derived from (distribution, dim, trial, side). A stale
    file or one copied from another cell would otherwise be measured and labelled as this cell.
    A query-model variant reads its parent's caches (:func:`.quantize.cache_identity_name`)."""
    spec = scheme.side(side)
    budget = slice_["budget"]
    identity = (cache_identity_name(slice_), slice_["dim"], trial)
    base = slice_["base_seed"]
    expected: dict[str, Any] = {
        "rows": shape[0],
        "dim": shape[1],
        "budget": budget - spec.spend_offset,  # a side that spends n-k is stored at budget n-k
        "rotate": spec.rotate,
        "scalar_bits": spec.scalar_bits(budget),
        "qjl": spec.qjl,
        "sketch": spec.sketch if spec.qjl else "gaussian",
        "primitives": spec.primitives(),
        "norm_dtype": slice_["norm_dtype"],
        "rotation_seed": derived_seed(base, "rotation", *identity, side) if spec.seeded_transform else 0,
        "qjl_seed": derived_seed(base, "qjl", *identity, side) if spec.qjl else 0,
    }
    for key, want in expected.items():
        got = getattr(cache, key)
        if got != want:
            raise DamagedFile(
                path, f"trial {trial} side {side} has {key} = {got!r} but cell {scheme.name} n={budget} "
                f"needs {want!r}: the file is stale or from another cell"
            )


def _concat(parts: list[dict[str, np.ndarray]], schema: pa.Schema) -> dict[str, np.ndarray]:
    """The columns of ``schema`` from every part; with no part (``per_key_trials: 0`` writes no
    per-key row), empty columns of the schema's types, so the file is a valid empty table."""
    if not parts:
        return {f.name: np.zeros(0, dtype=object if pa.types.is_string(f.type) else f.type.to_pandas_dtype())
                for f in schema}
    return {f.name: np.concatenate([np.asarray(p[f.name]) for p in parts]) for f in schema}


#: Arguments naming files other rules write (moved aside when damaged: kvasym.stages).
INTERMEDIATE_INPUTS = ("data", "trials", "packed")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_slice_arguments(parser, "metrics")
    parser.add_argument("--data", required=True, help="the data manifest of the cell's (distribution, dim)")
    parser.add_argument("--trials", help="the trials of the data manifest (default: beside it, d<dim>.trials.npy)")
    parser.add_argument("--packed", required=True, help="the cell's packed caches (.npz)")
    parser.add_argument("--per-query", dest="per_query", required=True, help="the per-query Parquet file")
    parser.add_argument("--per-key", dest="per_key", required=True, help="the per-key Parquet file")


def run(args: argparse.Namespace) -> None:
    args.trials = args.trials or str(trials_path(args.data))  # named, so a damaged one is moved aside
    run_metrics(stage_slice(args, "metrics"), args.data, args.packed, args.per_query, args.per_key, args.trials)
