"""Stage ``frontier`` (rule ``frontier``): the rate-distortion frontier of every scheme.

Reads the per-query files of every scheme (the grid's and the frontier's, ``frontier.schemes``)
and budget of the frontier's distributions and of the real rows, and writes two tables
(:mod:`kvasym.frontier`):

``points``
    one row per (distribution, dim, sharpness, scheme, budget): the measured total bits per
    coordinate (payload + side, from the packed caches), mean KL, p99 KL, top-5 recall, output
    direction error and the Pareto flags (:func:`kvasym.frontier.frontier_points`);
``units``
    the per-unit means (trials; texts for real caches, from the files' ``trial_map``) that the
    equal-rate claims resample (:func:`kvasym.frontier.unit_values`).

No pairwise test is computed here: the frontier's cost grows linearly with its schemes.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from ..errors import KvasymError

#: The per-query columns the frontier reads.
COLUMNS: tuple[str, ...] = ("distribution", "dim", "scheme", "budget", "sharpness", "trial", "kl", "recall_top5",
                            "t_eps_dir", "k_bits_payload", "k_bits_side", "v_bits_payload", "v_bits_side")


def run_frontier(slice_: Mapping[str, Any], per_query_paths: Sequence[str | os.PathLike],
                 out_points: str | os.PathLike, out_units: str | os.PathLike) -> None:
    """Frontier points and per-unit values of the per-query files ``per_query_paths``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ..dataset import provenance, write_frame_atomic
    from ..errors import DamagedFile
    from ..frontier import frontier_points, mark_pareto, unit_values
    from .stats import trial_texts

    if not per_query_paths:
        raise KvasymError("the frontier stage needs --per-query files")
    parts, unit_parts = [], []
    wanted = set(slice_["schemes"])
    for path in per_query_paths:
        try:
            schema = pq.read_schema(path)
            absent = [c for c in COLUMNS if c not in schema.names]
            if absent:
                raise KvasymError(f"{path}: no column(s) {', '.join(absent)} (not a per-query metrics file?)")
            frame = pq.read_table(path, columns=list(COLUMNS)).to_pandas()
        except (OSError, pa.ArrowException) as exc:
            # the words of kvasym.dataset's reader: whichever consumer meets the file first says the same
            raise DamagedFile(path, f"not a readable Parquet table ({type(exc).__name__}: {exc})") from None
        unknown = set(frame["scheme"].unique()) - wanted
        if unknown:
            raise KvasymError(f"{path}: scheme(s) {sorted(unknown)} are not in the frontier's schemes")
        # a file is one cell: its points (p99 over its queries) need no other file
        parts.append(frontier_points(frame))
        unit_parts.append(unit_values(frame, trial_texts([path])))
    meta = provenance(slice_)
    write_frame_atomic(mark_pareto(pd.concat(parts, ignore_index=True)), out_points, meta)
    write_frame_atomic(pd.concat(unit_parts, ignore_index=True), out_units, meta)


#: Arguments naming files other rules write (moved aside when damaged: kvasym.stages).
INTERMEDIATE_INPUTS = ("per_query",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--slice", required=True, help="the frontier slice as JSON (Snakemake passes it)")
    parser.add_argument("--per-query", dest="per_query", nargs="+", required=True,
                        help="the per-query files of every scheme and budget of the frontier's cells")
    parser.add_argument("--points", required=True, help="the frontier points table to write")
    parser.add_argument("--units", required=True, help="the per-unit values table to write")


def run(args: argparse.Namespace) -> None:
    from ._slice import parse_slice

    run_frontier(parse_slice(args.slice), args.per_query, args.points, args.units)
