"""Stage ``real_metrics`` (rule ``real_metrics``): per-query metrics of the real-model cells of one scheme.

Every (text, layer, KV head) cache of the SmolLM2 captures is one trial of distribution
``smollm2`` (keys quantized after RoPE) or ``smollm2-prerope`` (before), read by its group's real
queries under the causal mask (:func:`kvasym.real.evaluate.evaluate_capture`), written in the
synthetic study's per-query schema so the stats, gather and claims stages read it like any
distribution.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..artifacts import add_input_arguments
from ..errors import KvasymError
from ..real.evaluate import REAL_DISTRIBUTIONS, REAL_KIND, evaluate_capture
from ._slice import add_slice_arguments, slice_scheme, stage_slice


def run_real_metrics(slice_: dict[str, Any], capture_paths: Sequence[str],
                     out_per_query: Mapping[int, str | os.PathLike]) -> None:
    """The per-query metrics tables of the real cells (distribution, scheme, budget) of every
    budget of ``slice_``, one file per budget (``out_per_query[budget]``), in the synthetic
    study's schema (:data:`kvasym.dataset.PER_QUERY_SCHEMA`), so the stats, gather and claims
    stages read real rows like any other distribution. One job per (distribution, scheme): each
    capture is loaded once for all budgets (issue 29).

    ``slice_``: ``distribution`` (a key of :data:`REAL_DISTRIBUTIONS`), ``scheme`` (its dict),
    ``budgets``, ``sharpness`` (list), ``base_seed``, ``norm_dtype``, ``layers`` (list or None),
    and for a query-aware variant (:data:`kvasym.real.queryaware.VARIANTS`; ``smollm2`` only)
    ``query_aware: {"variant": name, "calibration": "leave-one-text-out"}``: each text's keys
    are quantized in the bases of the other texts' captured queries
    (:func:`kvasym.real.querybases.leave_one_text_out_bases`), so the calibration of a text is
    never the text itself; every capture is read twice (the moments first, then the metrics).
    A trial is one (text, layer, KV head) cache, numbered in the order of ``capture_paths``, then
    layer, then KV head (the map is stored in each file's metadata as ``trial_map``); a query is
    one (query head, position) of the group reading that KV head. Each file's provenance is its
    cell's slice (``budget`` in place of ``budgets``).
    """
    from ..dataset import PER_QUERY_SCHEMA, provenance, to_table, write_parquet_atomic
    from ..real.capture import load_capture

    name = slice_["distribution"]
    if name not in REAL_DISTRIBUTIONS:
        raise KvasymError(f"real distribution must be one of {list(REAL_DISTRIBUTIONS)}, got {name!r}")
    scheme = slice_scheme(slice_)
    budgets = [int(b) for b in slice_["budgets"]]
    if sorted(out_per_query) != sorted(budgets):
        raise KvasymError(f"--out names budgets {sorted(out_per_query)}, the slice {sorted(budgets)}")
    parts: dict[int, list[dict[str, np.ndarray]]] = {b: [] for b in budgets}
    trial_map: list[dict[str, Any]] = []
    if not capture_paths:
        raise KvasymError("run_real_metrics needs at least one capture")
    query_aware = slice_.get("query_aware")
    if query_aware and query_aware.get("variant") != scheme.name:
        raise KvasymError(f"--slice names scheme {scheme.name!r} but query_aware.variant "
                          f"{query_aware.get('variant')!r}")
    bases_of = cross_fitted_bases(capture_paths, query_aware, name) if query_aware else {}
    for path in capture_paths:
        capture = load_capture(path)
        text = capture.metadata.get("name") or Path(path).stem
        variants = [query_aware["variant"]] if query_aware else []
        cols = evaluate_capture(capture, [] if query_aware else [scheme], budgets, name=str(text),
                                base_seed=int(slice_["base_seed"]), layers=slice_.get("layers"),
                                rope=REAL_DISTRIBUTIONS[name], sharpness=slice_["sharpness"],
                                norm_dtype=slice_["norm_dtype"], kernel="auto", query_variants=variants,
                                query_bases=bases_of.get(path))
        cells = list(dict.fromkeys(zip(cols["layer"].tolist(), cols["kv_head"].tolist())))
        index = {cell: len(trial_map) + i for i, cell in enumerate(cells)}
        trial_map += [{"trial": index[c], "text": str(text), "layer": c[0], "kv_head": c[1]} for c in cells]
        trial = np.array([index[c] for c in zip(cols["layer"].tolist(), cols["kv_head"].tolist())], dtype=np.int32)
        n = trial.size
        part = {key: cols[key] for key in PER_QUERY_SCHEMA.names if key in cols}
        part.update({
            "distribution": np.full(n, name, dtype=object), "kind": np.full(n, REAL_KIND, dtype=object),
            "dim": np.full(n, capture.k_post_rope.shape[-1], dtype=np.int32), "trial": trial,
        })
        for budget in budgets:  # the rows of one budget, in the order a job of that budget alone gives
            rows = np.asarray(cols["budget"]) == budget
            parts[budget].append({key: value[rows] for key, value in part.items()})
    cell = {k: v for k, v in slice_.items() if k != "budgets"}
    for budget in budgets:
        columns = {key: np.concatenate([p[key] for p in parts[budget]]) for key in PER_QUERY_SCHEMA.names}
        meta = {**provenance({**cell, "budget": budget}), "trial_map": json.dumps(trial_map)}
        write_parquet_atomic(to_table(columns, PER_QUERY_SCHEMA), out_per_query[budget], meta)


def cross_fitted_bases(capture_paths: Sequence[str], query_aware: Mapping[str, Any], distribution: str
                       ) -> dict[str, Any]:
    """Capture path -> the :class:`kvasym.real.querybases.QueryBases` its text is scored with:
    calibrated on every other capture's queries (``query_aware["calibration"]`` must be
    ``"leave-one-text-out"``)."""
    from ..real.capture import load_capture
    from ..real.queryaware import VARIANTS
    from ..real.querybases import capture_moment_sums, leave_one_text_out_bases

    variant, calibration = query_aware.get("variant"), query_aware.get("calibration")
    if variant not in VARIANTS:
        raise KvasymError(f"--slice query_aware.variant must be one of {list(VARIANTS)}, got {variant!r}")
    if calibration != "leave-one-text-out":
        raise KvasymError(f"--slice query_aware.calibration must be 'leave-one-text-out', got {calibration!r}")
    if REAL_DISTRIBUTIONS[distribution] != "post":
        raise KvasymError(f"query-aware variant {variant} runs on the post-RoPE rows only, not {distribution!r}")
    sums, shas, groups = {}, set(), set()
    for path in capture_paths:
        capture = load_capture(path)
        sums[path] = capture_moment_sums(capture)
        shas.add(str(capture.metadata.get("model_sha256")))
        groups.add(int(capture.q_post_rope.shape[1]) // int(capture.k_post_rope.shape[1]))
    if len(shas) != 1 or len(groups) != 1:
        raise KvasymError(f"the captures come from {len(shas)} models (sha256 {sorted(shas)}): a query basis is "
                          "calibrated on one model's queries")
    return leave_one_text_out_bases(sums, groups.pop(), shas.pop())


#: The stage's inputs: argument -> artifact (kvasym.artifacts); a damaged one is moved aside.
INPUTS = {"captures": "captures"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_slice_arguments(parser, "real_metrics")
    add_input_arguments(parser, INPUTS, required=INPUTS, many=INPUTS)
    parser.add_argument("--out", nargs="+", required=True, metavar="BUDGET=FILE",
                        help="the per-query Parquet file of each budget, as BUDGET=FILE")


def run(args: argparse.Namespace) -> None:
    outs: dict[int, str] = {}
    for item in args.out:
        budget, sep, path = item.partition("=")
        if not sep or not budget.isdigit() or not path:
            raise KvasymError(f"--out {item!r}: give BUDGET=FILE, e.g. 4=results/.../n4.parquet")
        outs[int(budget)] = path
    run_real_metrics(stage_slice(args, "real_metrics"), args.captures, outs)
