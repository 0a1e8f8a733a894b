"""The DAG's stages as library functions (Snakemake rules call them through ``kvasym stage``).

Each stage takes the narrow config slice it depends on (a canonical JSON dict from
:class:`kvasym.study.Study`) and writes its outputs atomically:

- :func:`run_data`: for one (distribution, dim), draws every trial and writes a JSON manifest
  with a SHA-256 digest of each trial's K, V and Q and descriptive statistics. The arrays
  themselves are not stored: regenerating them from their seeds inside each job is cheaper
  than reading them back (measured in the closing note of the DAG issue), and the digest
  guarantees every later job saw exactly the same data.
- :func:`run_quantize`: for one cell, the packed K and V caches of every trial in one .npz
  (the real compressed artifact) with their measured bits per coordinate.
- :func:`run_metrics`: for one cell, per-query and per-key Parquet tables, computed from the
  packed caches (dequantized from the file, never from memory) against regenerated data.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .atomic import atomic_target
from .cache import PackedCache, load_packed, save_packed
from .cachestats import cache_statistics
from .dataset import PER_KEY_SCHEMA, PER_QUERY_SCHEMA, provenance, to_table, write_parquet_atomic
from .distributions import DistributionSpec, TrialData, generate_trial
from .errors import KvasymError
from .evaluate import quantize_pair
from .metrics import trial_metrics_multi
from .schemes import Scheme, scheme_from_dict
from .seeds import derived_seed

DATA_FORMAT = 1


def _trial(slice_: Mapping[str, Any], trial: int) -> TrialData:
    spec = DistributionSpec.from_dict(slice_["distribution"])
    return generate_trial(
        spec, slice_["dim"], slice_["seq_len"], slice_["n_queries"], slice_["base_seed"], trial
    )


def trial_digest(data: TrialData) -> str:
    """SHA-256 of a trial's float64 K, V and Q bytes (little-endian, C order)."""
    h = hashlib.sha256()
    for array in (data.keys, data.values, data.queries):
        h.update(np.ascontiguousarray(array, dtype="<f8").tobytes())
    return h.hexdigest()


def _write_json_atomic(data: Mapping[str, Any], path: str | os.PathLike) -> None:
    write_text_atomic(json.dumps(data, indent=1, sort_keys=True) + "\n", path)


def write_text_atomic(text: str, path: str | os.PathLike) -> None:
    """Write a text file via a temporary name and a rename (no half-written file, ever)."""
    with atomic_target(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def run_data(slice_: Mapping[str, Any], out_json: str | os.PathLike) -> None:
    """Manifest of the data of one (distribution, dim): digests and statistics per trial."""
    trials = []
    for trial in range(slice_["trials"]):
        data = _trial(slice_, trial)
        trials.append(
            {
                "trial": trial,
                "sha256": trial_digest(data),
                "keys": cache_statistics(data.keys),
                "values": cache_statistics(data.values),
            }
        )
    _write_json_atomic({"format": DATA_FORMAT, "slice": dict(slice_), "trials": trials}, out_json)


def load_manifest(path: str | os.PathLike, slice_: Mapping[str, Any]) -> dict[str, str]:
    data_keys = ("distribution", "dim", "seq_len", "n_queries", "trials", "base_seed")
    try:
        manifest = json.loads(Path(path).read_text())
        digests = {int(t["trial"]): t["sha256"] for t in manifest["trials"]}
        made_for = {k: manifest["slice"].get(k) for k in data_keys}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise KvasymError(f"{path}: unreadable data manifest ({type(exc).__name__}: {exc}); delete it and rerun") from None
    if manifest.get("format") != DATA_FORMAT or any(made_for[k] != slice_[k] for k in data_keys):
        raise KvasymError(f"{path}: data manifest was made for another config slice; rerun the data rule")
    return {str(k): v for k, v in digests.items()}


def verified_trial(slice_: Mapping[str, Any], trial: int, digests: Mapping[str, str]) -> TrialData:
    data = _trial(slice_, trial)
    if trial_digest(data) != digests.get(str(trial)):
        raise KvasymError(
            f"regenerated data of {slice_['distribution']['name']} d={slice_['dim']} trial {trial} "
            "differs from its manifest digest: the manifest was changed, or the generator is not "
            "deterministic on this machine; delete the manifest and rerun"
        )
    return data


def _cache_name(trial: int, side: str) -> str:
    return f"t{trial}.{side}"


def run_quantize(slice_: Mapping[str, Any], data_json: str | os.PathLike, out_npz: str | os.PathLike) -> None:
    """Packed K and V caches of every trial of one cell, in one .npz."""
    digests = load_manifest(data_json, slice_)
    scheme_data = dict(slice_["scheme"])
    scheme = scheme_from_dict(scheme_data.pop("name"), scheme_data)
    caches: dict[str, PackedCache] = {}
    for trial in range(slice_["trials"]):
        data = verified_trial(slice_, trial, digests)
        identity = (slice_["distribution"]["name"], slice_["dim"], trial)
        pair = quantize_pair(
            data.keys,
            data.values,
            scheme,
            slice_["budget"],
            base_seed=slice_["base_seed"],
            identity=identity,
            norm_dtype=slice_["norm_dtype"],
        )
        for side, cache in pair.items():
            caches[_cache_name(trial, side)] = cache
    save_packed(out_npz, caches)


def run_metrics(
    slice_: Mapping[str, Any],
    data_json: str | os.PathLike,
    packed_npz: str | os.PathLike,
    out_per_query: str | os.PathLike,
    out_per_key: str | os.PathLike,
) -> None:
    """Per-query and per-key metrics of one cell, for every sharpness, as Parquet."""
    digests = load_manifest(data_json, slice_)
    try:
        caches = load_packed(packed_npz)
    except KvasymError as exc:
        raise KvasymError(f"{exc}; delete it and rerun to rebuild it") from None
    scheme_data = dict(slice_["scheme"])
    scheme = scheme_from_dict(scheme_data.pop("name"), scheme_data)
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
        data = verified_trial(slice_, trial, digests)
        try:
            k_cache, v_cache = caches[_cache_name(trial, "K")], caches[_cache_name(trial, "V")]
        except KeyError:
            raise KvasymError(f"{packed_npz}: no packed caches for trial {trial}; delete it and rerun to rebuild it") from None
        for side, cache, matrix in (("K", k_cache, data.keys), ("V", v_cache, data.values)):
            _check_cache_matches(cache, matrix.shape, slice_, scheme, trial, side, packed_npz)
        keys_hat = k_cache.dequantize("float64")
        values_hat = v_cache.dequantize("float64")
        bits = {
            f"{side}_bits_{part}": cache.bits_per_coordinate()[part]
            for side, cache in (("k", k_cache), ("v", v_cache))
            for part in ("payload", "side")
        }
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
    write_parquet_atomic(to_table(_concat(query_parts, PER_QUERY_SCHEMA.names), PER_QUERY_SCHEMA), out_per_query, meta)
    write_parquet_atomic(to_table(_concat(key_parts, PER_KEY_SCHEMA.names), PER_KEY_SCHEMA), out_per_key, meta)


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
    file or one copied from another cell would otherwise be measured and labelled as this cell."""
    spec = scheme.side(side)
    budget = slice_["budget"]
    identity = (slice_["distribution"]["name"], slice_["dim"], trial)
    base = slice_["base_seed"]
    expected: dict[str, Any] = {
        "rows": shape[0],
        "dim": shape[1],
        "budget": budget,
        "rotate": spec.rotate,
        "scalar_bits": spec.scalar_bits(budget),
        "qjl": spec.qjl,
        "norm_dtype": slice_["norm_dtype"],
        "rotation_seed": derived_seed(base, "rotation", *identity, side) if spec.rotate else 0,
        "qjl_seed": derived_seed(base, "qjl", *identity, side) if spec.qjl else 0,
    }
    for key, want in expected.items():
        got = getattr(cache, key)
        if got != want:
            raise KvasymError(
                f"{path}: trial {trial} side {side} has {key} = {got!r} but cell {scheme.name} n={budget} "
                f"needs {want!r}: the file is stale or from another cell; delete it and rerun to rebuild it"
            )


def _concat(parts: list[dict[str, np.ndarray]], names: list[str]) -> dict[str, np.ndarray]:
    if not parts:
        return {name: np.zeros(0) for name in names}
    return {name: np.concatenate([np.asarray(p[name]) for p in parts]) for name in names}
