"""Stage ``file_metrics`` (rule ``file_metrics``): per-query metrics of one bring-your-own cache cell.

A distribution of kind ``file`` names a dumped cache (:mod:`kvasym.cachefile`); each (layer, KV
head) of it is one trial, read by its own queries or by queries drawn from its keys' Gaussian,
and the rows are written in the study's per-query schema with the trial map in the metadata.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..cachefile import evaluate_cache_file, load_cache_file
from ..errors import KvasymError
from ._slice import add_slice_arguments, slice_scheme, stage_slice


def run_file_metrics(slice_: Mapping[str, Any], path: str, out_per_query: str) -> None:
    """The per-query metrics table of one file cell (distribution, scheme, budget) in the
    study's schema (:data:`kvasym.dataset.PER_QUERY_SCHEMA`), the trial map in its metadata.

    ``slice_``: ``distribution`` (its dict: name, kind ``file``, params with ``path`` and
    ``causal``), ``dim`` (the file's head_dim, checked), ``scheme`` (its dict), ``budget``,
    ``sharpness`` (list), ``n_queries``, ``base_seed``, ``norm_dtype``; from the DAG also
    ``content_sha256``, the file's digest (a job keyed on content, not mtime: checked here).
    """
    from ..dataset import PER_QUERY_SCHEMA, provenance, to_table, write_parquet_atomic

    dist = slice_["distribution"]
    want = slice_.get("content_sha256")  # the DAG's: the file's digest when the DAG was built
    if want is not None:
        from ..cachefile import file_content_sha256

        got = file_content_sha256(path)
        if got != want:
            raise KvasymError(f"cache file {path} changed since the DAG was built (SHA-256 {got[:12]}..., the DAG "
                              f"planned {str(want)[:12]}...): rerun snakemake")
    cache = load_cache_file(path)
    if cache.head_dim != int(slice_["dim"]):
        raise KvasymError(f"cache file {path}: head_dim {cache.head_dim}, but the DAG planned d={slice_['dim']} "
                          "(the file changed since the DAG was built: rerun)")
    scheme = slice_scheme(slice_)
    budget = int(slice_["budget"])
    scheme.validate_budget(budget)
    columns, trial_map = evaluate_cache_file(
        cache, scheme, budget, name=dist["name"], base_seed=int(slice_["base_seed"]),
        n_queries=int(slice_["n_queries"]), sharpness=slice_["sharpness"],
        causal=bool(dist["params"].get("causal", True)), norm_dtype=slice_["norm_dtype"])
    n = columns["trial"].size
    columns.update({
        "distribution": np.full(n, dist["name"], dtype=object), "kind": np.full(n, "file", dtype=object),
        "dim": np.full(n, cache.head_dim, dtype=np.int32), "scheme": np.full(n, scheme.name, dtype=object),
        "budget": np.full(n, budget, dtype=np.int32),
    })
    missing = [key for key in PER_QUERY_SCHEMA.names if key not in columns]
    if missing:  # a bug, not an input error: the schema and this function disagree
        raise RuntimeError(f"file metrics lack columns {missing}")
    meta = {**provenance(slice_), "trial_map": json.dumps(trial_map)}
    write_parquet_atomic(to_table({key: columns[key] for key in PER_QUERY_SCHEMA.names}, PER_QUERY_SCHEMA),
                         out_per_query, meta)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_slice_arguments(parser, "file_metrics")
    parser.add_argument("--cache", required=True, help="the cache file (.npz/.safetensors/.npy)")
    parser.add_argument("--out", required=True, help="the per-query Parquet file")


def run(args: argparse.Namespace) -> None:
    run_file_metrics(stage_slice(args, "file_metrics"), args.cache, args.out)
