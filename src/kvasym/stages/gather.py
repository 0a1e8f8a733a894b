"""Stage ``gather`` (rule ``gather``): the study-wide tables.

Concatenates the per-(distribution, dim) tables of one kind (comparisons, summary, trials,
theory) and, for the comparisons, adds a Holm-adjusted column for each p-value family of
:data:`HOLM_FAMILIES`. From the gathered trials it also writes the query-model table
(``--out-query-model``, artifact ``query_model``): C5's ratio under each query model with the
claims' own interval (:func:`kvasym.claims.query_model_points`), the numbers the query-model
figure draws, so that rendering reads them instead of recomputing a claim.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..artifacts import add_input_arguments
from .. import stats
from ..cells import parse_cells, read_cell_tables
from ..dataset import write_frame_atomic

#: The gathered tables (one ``gather`` call each) and the log10-p columns Holm-adjusted in them.
#: A family is one (metric, test) across the whole study: every distribution, dim, budget,
#: sharpness and scheme pair of that metric (Holm 1979 controls the family-wise error rate).
#: The energy test is not here: its family is declared per (distribution, dim) and adjusted by
#: the stats stage (``energy_log10_p_holm``), so adding a distribution changes no existing p.
HOLM_FAMILIES: dict[str, tuple[str, ...]] = {
    "comparisons": ("q_log10_p", "t_wilcoxon_log10_p", "t_mw_log10_p", "q_ks_log10_p"),
    "summary": (),
    "trials": (),
    "theory": (),
}


def gather(paths: Sequence[str | os.PathLike], out: str | os.PathLike, holm_columns: Sequence[str] = (),
           cells: list | None = None) -> pd.DataFrame:
    """Concatenate tables; for each ``holm_columns`` log10-p column add a Holm-adjusted one.

    Families: one per (metric, test) across the whole study, i.e. all distributions, dims,
    budgets, sharpness values and scheme pairs of that metric. ``cells``: the (distribution,
    dim) each part is filed under. Returns the table written.
    """
    # one part per (distribution, dim): a part copied over another would count a cell twice
    frame = read_cell_tables(list(paths), "stats part", ("distribution", "dim"), cells=cells)
    for column in holm_columns:
        adjusted = np.full(len(frame), np.nan)
        for _, index in frame.groupby("metric").groups.items():
            values = frame.loc[index, column].to_numpy(dtype=float)
            adjusted[np.asarray(index)] = stats.holm_log10(values)
        frame[f"{column}_holm"] = adjusted
    write_frame_atomic(frame, out, {"sources": str(len(paths))})
    return frame


#: The keys of ``--query-model-slice`` (:meth:`kvasym.study.Study.query_model_slice`): the keyword
#: arguments of :func:`kvasym.claims.query_model_points`.
QUERY_MODEL_KEYS = ("parents", "variants", "references", "scheme", "budget", "sharpness", "n_boot", "base_seed")


def write_query_model(trials: pd.DataFrame, slice_: Mapping[str, Any], out: str | os.PathLike) -> None:
    """Write the query-model table of the gathered ``trials`` (:func:`kvasym.claims.query_model_points`
    with the slice's arguments) to ``out``."""
    from ..claims import query_model_points
    from ..dataset import provenance
    from ..errors import KvasymError

    missing = [k for k in QUERY_MODEL_KEYS if k not in slice_]
    if missing:
        raise KvasymError(f"--query-model-slice lacks key(s) {', '.join(missing)}")
    points = query_model_points(trials, **{k: slice_[k] for k in QUERY_MODEL_KEYS})
    write_frame_atomic(points, out, provenance(dict(slice_)))


#: The stage's inputs: argument -> artifact (kvasym.artifacts); a damaged one is moved aside.
INPUTS = {table: f"{table}_part" for table in HOLM_FAMILIES}
#: Its outputs (argument -> artifact) and the argument listing what each input or output is made
#: from (the DAG's flags follow from these, kvasym.artifacts.stage_flags).
OUTPUTS = {**{f"out_{table}": table for table in HOLM_FAMILIES}, "out_query_model": "query_model"}
LISTINGS = {**{table: f"{table}_cells" for table in HOLM_FAMILIES}, "out_query_model": "query_model_slice"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_input_arguments(parser, INPUTS, many=INPUTS)
    for table in HOLM_FAMILIES:
        parser.add_argument(f"--out-{table}", dest=f"out_{table}", help=f"the gathered {table} table")
        parser.add_argument(f"--{table}-cells", dest=f"{table}_cells",
                            help=f'JSON list: the {{"distribution", "dim"}} each --{table} part is filed under')
    parser.add_argument("--out-query-model", dest="out_query_model",
                        help="the query-model table, from the gathered trials (needs --trials)")
    parser.add_argument("--query-model-slice", dest="query_model_slice",
                        help="its arguments as JSON (kvasym.study.Study.query_model_slice): "
                             + ", ".join(QUERY_MODEL_KEYS))


def run(args: argparse.Namespace) -> None:
    from ..errors import KvasymError
    from ._slice import parse_slice

    if bool(args.out_query_model) != bool(args.query_model_slice) or (args.out_query_model and not args.out_trials):
        raise KvasymError("the query-model table needs --out-query-model, --query-model-slice and the trials "
                          "(--trials, --out-trials)")
    done = 0
    for table, holm in HOLM_FAMILIES.items():
        parts, out = getattr(args, table), getattr(args, f"out_{table}")
        if bool(parts) != bool(out):
            raise KvasymError(f"give both --{table} and --out-{table}, or neither")
        if out:
            frame = gather(parts, out, holm, parse_cells(getattr(args, f"{table}_cells"), f"{table}-cells"))
            if table == "trials" and args.out_query_model:
                write_query_model(frame, parse_slice(args.query_model_slice), args.out_query_model)
            done += 1
    if not done:
        raise KvasymError("nothing to gather: give --TABLE inputs and --out-TABLE for at least one of "
                          + ", ".join(HOLM_FAMILIES))
