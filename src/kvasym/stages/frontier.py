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

Both have the column ``extra_budget`` (:data:`kvasym.frontier.EXTRA`): True for a cell at one of
its scheme's ``frontier.extra_budgets`` (the slice's ``extra_budgets``), False at the grid's
budgets.

No pairwise test is computed here: the frontier's cost grows linearly with its schemes.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from ..artifacts import add_input_arguments
from ..errors import KvasymError

#: The per-query columns the frontier reads.
COLUMNS: tuple[str, ...] = ("distribution", "dim", "scheme", "budget", "sharpness", "trial", "kl", "recall_top5",
                            "t_eps_dir", "k_bits_payload", "k_bits_side", "v_bits_payload", "v_bits_side")


def run_frontier(slice_: Mapping[str, Any], per_query_paths: Sequence[str | os.PathLike],
                 out_points: str | os.PathLike, out_units: str | os.PathLike,
                 digests: Sequence[str] | None = None) -> None:
    """Frontier points and per-unit values of the per-query files ``per_query_paths``.

    Each file is read through :func:`kvasym.cells.iter_cell_tables`, like the stats stage's: it
    must hold the one cell its path files it under (:func:`kvasym.cells.cell_of_path`), no two
    files the same cell, and, with ``digests`` (one :func:`kvasym.cells.slice_digest` per file,
    the DAG's ``--cells``), provenance of this configuration (issue 33, point 9: a frontier-only
    scheme's n = 2 file copied over its n = 4 file was read as both).
    """
    from ..cells import cell_of_path, iter_cell_tables
    from ..dataset import provenance, write_frame_atomic
    from ..frontier import EXTRA, frontier_points, mark_pareto, unit_values
    from ..cell_statistics import trial_texts

    if not per_query_paths:
        raise KvasymError("the frontier stage needs --per-query files")
    if digests is not None and len(digests) != len(per_query_paths):
        raise KvasymError(f"{len(per_query_paths)} --per-query files but {len(digests)} --cells digests")
    cells = [{**cell_of_path(path), **({"slice_sha256": digests[i]} if digests is not None else {})}
             for i, path in enumerate(per_query_paths)]
    parts, unit_parts = [], []
    wanted = set(slice_["schemes"])
    extra = slice_.get("extra_budgets", {})
    for path, frame in iter_cell_tables(list(per_query_paths), "per-query", ("distribution", "dim", "scheme", "budget"),
                                        cells=cells, columns=list(COLUMNS)):
        unknown = set(frame["scheme"].unique()) - wanted
        if unknown:
            raise KvasymError(f"{path}: scheme(s) {sorted(unknown)} are not in the frontier's schemes")
        # a file is one cell: its points (p99 over its queries) need no other file
        cell = cell_of_path(path)  # the cell the file holds (iter_cell_tables checked it)
        flag = {EXTRA: cell["budget"] in extra.get(cell["scheme"], [])}
        parts.append(frontier_points(frame).assign(**flag))
        unit_parts.append(unit_values(frame, trial_texts([path])).assign(**flag))
    meta = provenance(slice_)
    write_frame_atomic(mark_pareto(pd.concat(parts, ignore_index=True)), out_points, meta)
    write_frame_atomic(pd.concat(unit_parts, ignore_index=True), out_units, meta)


#: The stage's inputs: argument -> artifact (kvasym.artifacts); a damaged one is moved aside.
INPUTS = {"per_query": "per_query"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ._slice import add_config_argument

    parser.add_argument("--slice", default=None,
                        help="the frontier slice as JSON (Snakemake passes it; by hand: or --config)")
    add_config_argument(parser, "--slice and --cells")
    add_input_arguments(parser, INPUTS, required=INPUTS, many=INPUTS,
                        notes={"per_query": "every scheme and budget of the frontier's cells"})
    parser.add_argument("--points", required=True, help="the frontier points table to write")
    parser.add_argument("--units", required=True, help="the per-unit values table to write")
    parser.add_argument("--cells", default=None,
                        help="JSON list: the slice digest (kvasym.cells.slice_digest) of each --per-query file's cell, "
                             "in order; each file's provenance must match")


def cell_digests(args: argparse.Namespace) -> list[str] | None:
    """The digest of each ``--per-query`` file's cell: ``--cells`` (the DAG's), else, by hand with
    ``--config``, those the DAG's rule would give (:func:`kvasym.stages._slice.cell_digester` of
    each file's cell, issue 51, point 2); None without either (no provenance check)."""
    import json

    from ..cells import cell_of_path
    from ._slice import cell_digester

    if args.cells is None:
        if args.config is None:
            return None
        digest = cell_digester(args.config)
        return [digest(cell_of_path(p)) for p in args.per_query]
    try:
        digests = json.loads(args.cells)
    except ValueError as exc:
        raise KvasymError(f"--cells is not valid JSON ({exc})") from None
    if not isinstance(digests, list) or not all(isinstance(d, str) for d in digests):
        raise KvasymError("--cells must be a JSON list of slice digests (strings), one per --per-query file")
    return digests


def run(args: argparse.Namespace) -> None:
    from ._slice import config_slice

    slice_ = config_slice(args, lambda study: study.frontier_slice())
    run_frontier(slice_, args.per_query, args.points, args.units, cell_digests(args))
