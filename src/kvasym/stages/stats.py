"""Stage ``stats`` (rule ``stats``): the statistics of one (distribution, dim).

Reads the (distribution, dim)'s per-query files, one budget at a time (each file holds one
(scheme, budget), checked against the cell it is filed under), and writes what
:func:`kvasym.cell_statistics.cell_statistics` measures from them: the scheme-pair comparisons,
the per-cell summaries and the per-trial means.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from ..artifacts import add_input_arguments
from ..cells import iter_cell_tables, parse_cells
from ..dataset import provenance, write_frame_atomic
from ._slice import add_slice_arguments, hand_run_cells, stage_slice


def run_stats(
    slice_: Mapping[str, Any],
    per_query_paths: Sequence[str | os.PathLike],
    out_comparisons: str | os.PathLike,
    out_summary: str | os.PathLike,
    out_trials: str | os.PathLike,
    cells: list | None = None,
) -> None:
    """Comparisons, summaries and per-trial means of one (distribution, dim); ``cells`` is the
    (scheme, budget) each per-query file is filed under (:func:`kvasym.cells.iter_cell_tables`)."""
    from ..cell_statistics import cell_statistics, trial_texts  # the Snakefile imports this module (INPUTS)

    # each file holds one (scheme, budget): the cells are measured one budget at a time, from
    # that budget's files alone (a real cell's 12 files are 25M rows: one concatenation of all
    # of them doubled the job's peak memory)
    by_budget: dict[int, list[pd.DataFrame]] = {}
    for _, part in iter_cell_tables(list(per_query_paths), "per-query", ("scheme", "budget"), cells=cells,
                                    distribution=slice_["distribution"], dim=int(slice_["dim"])):
        by_budget.setdefault(int(part["budget"].iloc[0]), []).append(part)
    texts = trial_texts(list(per_query_paths))
    comparisons, summaries, trial_means = cell_statistics(slice_, ((b, by_budget.pop(b)) for b in sorted(by_budget)),
                                                          texts)
    meta = provenance(slice_)
    write_frame_atomic(comparisons, out_comparisons, meta)
    write_frame_atomic(summaries, out_summary, meta)
    write_frame_atomic(trial_means, out_trials, meta)


#: The stage's inputs: argument -> artifact (kvasym.artifacts); a damaged one is moved aside.
INPUTS = {"per_query": "per_query"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_slice_arguments(parser, "stats")
    add_input_arguments(parser, INPUTS, required=INPUTS, many=INPUTS,
                        notes={"per_query": "every scheme and budget of the (distribution, dim)"})
    parser.add_argument("--cells", help='JSON list: the {"scheme", "budget"} each --per-query file is filed under')
    parser.add_argument("--comparisons", required=True)
    parser.add_argument("--summary", required=True)
    parser.add_argument("--trials", required=True)


def run(args: argparse.Namespace) -> None:
    # by hand from --config: each cell's digest computed as the DAG would give it (hand_run_cells)
    cells = hand_run_cells(args, args.per_query, parse_cells(args.cells, "cells"))
    run_stats(stage_slice(args, "stats"), args.per_query, args.comparisons, args.summary, args.trials, cells)
