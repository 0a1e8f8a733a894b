"""Stage ``gather`` (rule ``gather``): the study-wide tables.

Concatenates the per-(distribution, dim) tables of one kind (comparisons, summary, trials,
theory) and, for the comparisons, adds a Holm-adjusted column for each p-value family of
:data:`HOLM_FAMILIES`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

import numpy as np

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
           cells: list | None = None) -> None:
    """Concatenate tables; for each ``holm_columns`` log10-p column add a Holm-adjusted one.

    Families: one per (metric, test) across the whole study, i.e. all distributions, dims,
    budgets, sharpness values and scheme pairs of that metric. ``cells``: the (distribution,
    dim) each part is filed under.
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


#: The stage's inputs: argument -> artifact (kvasym.artifacts); a damaged one is moved aside.
INPUTS = {table: f"{table}_part" for table in HOLM_FAMILIES}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_input_arguments(parser, INPUTS, many=INPUTS)
    for table in HOLM_FAMILIES:
        parser.add_argument(f"--out-{table}", dest=f"out_{table}", help=f"the gathered {table} table")
        parser.add_argument(f"--{table}-cells", dest=f"{table}_cells",
                            help=f'JSON list: the {{"distribution", "dim"}} each --{table} part is filed under')


def run(args: argparse.Namespace) -> None:
    from ..errors import KvasymError

    done = 0
    for table, holm in HOLM_FAMILIES.items():
        parts, out = getattr(args, table), getattr(args, f"out_{table}")
        if bool(parts) != bool(out):
            raise KvasymError(f"give both --{table} and --out-{table}, or neither")
        if out:
            gather(parts, out, holm, parse_cells(getattr(args, f"{table}_cells"), f"{table}-cells"))
            done += 1
    if not done:
        raise KvasymError("nothing to gather: give --TABLE inputs and --out-TABLE for at least one of "
                          + ", ".join(HOLM_FAMILIES))
