"""Stage ``seq_len_sweep`` (rule ``seq_len_sweep``): attention damage against the sequence length.

One job: for every sequence length of the config key ``seq_len_sweep`` (its distribution, dim,
sharpness, schemes, budgets and trials), fresh caches drawn, quantized and read
(:func:`kvasym.seqlen.sweep_trial_rows`), and three tables written:

``rows``
    one row per (seq_len, scheme, budget, trial): the trial's mean KL, mean output direction
    error and p99 KL;
``summary``
    their means over trials with standard errors per (scheme, budget, seq_len)
    (:func:`kvasym.seqlen.sweep_summary`);
``slopes``
    the slope of log (trial mean) on log seq_len per (scheme, budget, metric) with its
    trial-cluster bootstrap interval (:func:`kvasym.seqlen.length_slopes`), which the claims read.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any


def run_seq_len_sweep(slice_: Mapping[str, Any], out_rows: str, out_summary: str, out_slopes: str) -> None:
    """The sweep of ``slice_`` (:meth:`kvasym.study.Study.seq_len_sweep_slice`)."""
    import pandas as pd

    from ..dataset import provenance, write_frame_atomic
    from ..distributions import DistributionSpec
    from ..schemes import scheme_from_dict
    from ..seqlen import length_slopes, sweep_summary, sweep_trial_rows

    dist = slice_["distribution"]
    spec = DistributionSpec(dist["name"], dist["kind"], dict(dist.get("params") or {}))
    schemes = {s["name"]: scheme_from_dict(s["name"], s["spec"]) for s in slice_["schemes"]}
    parts = [sweep_trial_rows(spec, int(slice_["dim"]), int(seq_len), int(slice_["n_queries"]),
                              int(slice_["trials"]), schemes, slice_["budgets"], float(slice_["sharpness"]),
                              base_seed=int(slice_["base_seed"]), norm_dtype=slice_["norm_dtype"], kernel="auto")
             for seq_len in slice_["seq_lens"]]
    rows = pd.concat(parts, ignore_index=True)
    meta = provenance(slice_)
    write_frame_atomic(rows, out_rows, meta)
    write_frame_atomic(sweep_summary(rows), out_summary, meta)
    write_frame_atomic(length_slopes(rows, n_boot=int(slice_["n_boot"]), base_seed=int(slice_["base_seed"])),
                       out_slopes, meta)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--slice", required=True, help="the seq_len_sweep slice as JSON (Snakemake passes it)")
    parser.add_argument("--rows", required=True, help="the per-trial table to write")
    parser.add_argument("--summary", required=True, help="the per-length summary table to write")
    parser.add_argument("--slopes", required=True, help="the slopes table to write")


def run(args: argparse.Namespace) -> None:
    from ._slice import parse_slice

    run_seq_len_sweep(parse_slice(args.slice), args.rows, args.summary, args.slopes)
