"""Stage ``gather`` (rule ``gather``): the study-wide tables.

Concatenates the per-(distribution, dim) tables of one kind (comparisons, summary, trials,
theory) and, for the comparisons, adds a Holm-adjusted column for each p-value family of
:data:`HOLM_FAMILIES`. From the gathered trials it also writes the query-model table
(``--out-query-model``, artifact ``query_model``): C5's ratio under each query model with the
claims' own interval (:func:`kvasym.claims.query_model_points`), the numbers the query-model
figure draws, so that rendering reads them instead of recomputing a claim. From the metrics rows
of the figures' facet cells (``--display-per-query``, ``--display-per-key``) it writes the
figures' display aggregates (:mod:`kvasym.display`): the Shannon-phi planes' quartiles and
densities (artifacts ``phi_summary``, ``phi_density``) and the Jensen figure's binned means
(``jensen_bins``).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..artifacts import add_input_arguments
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
    from .. import stats  # here, not at the top: the Snakefile imports this module (INPUTS)

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


#: The keys of ``--display-slice``: those of the figures slice
#: (:func:`kvasym.render.figures.figure_slice.figures_slice`) that select the rows summarised.
DISPLAY_SLICE_KEYS = ("headline", "facet_distributions", "jensen_bins")
#: The display tables: output argument -> (artifact, the metrics table it summarises).
DISPLAY_OUTPUTS = {"out_phi_summary": ("phi_summary", "per_query"), "out_phi_density": ("phi_density", "per_query"),
                   "out_jensen_bins": ("jensen_bins", "per_key")}


def write_display(per_query: Sequence[str | os.PathLike], per_key: Sequence[str | os.PathLike],
                  slice_: Mapping[str, Any], outs: Mapping[str, str | os.PathLike | None],
                  digests: Mapping[str, str] | None = None) -> None:
    """Write the figures' display tables (:mod:`kvasym.display`) of the facet cells' metrics rows.

    Parameters
    ----------
    per_query, per_key : sequence of path-like
        The metrics files of the figures' facet cells (the Shannon-phi and Jensen figures' inputs).
    slice_ : mapping
        :data:`DISPLAY_SLICE_KEYS` of the figures slice: the rows kept are the facet
        distributions' at the headline dim and sharpness (per key: and budget), as the figure
        stage keeps them (:func:`kvasym.stages.figure.load_inputs`); ``jensen_bins`` bins.
    outs : mapping
        Keys of :data:`DISPLAY_OUTPUTS` -> the file to write (None: not written).
    digests : mapping, optional
        Metrics file -> the slice digest of its cell (provenance checked).

    Raises
    ------
    KvasymError
        A missing slice key; no metrics files for a table asked for; a damaged or misfiled file.
    """
    from .. import display
    from ..cells import read_metrics_rows
    from ..dataset import provenance
    from ..errors import KvasymError

    missing = [k for k in DISPLAY_SLICE_KEYS if k not in slice_]
    if missing:
        raise KvasymError(f"--display-slice lacks key(s) {', '.join(missing)}")
    head = slice_["headline"]
    keep = {"dim": [int(head["dim"])], "sharpness": [float(head["sharpness"])],
            "distribution": list(slice_["facet_distributions"])}
    meta = provenance(dict(slice_))

    def rows(table: str, files: Sequence[str | os.PathLike], extra: Mapping[str, Any]) -> pd.DataFrame:
        if not files:
            flag = "--display-" + table.replace("_", "-")
            raise KvasymError(f"the display tables need the facet cells' {table} files ({flag})")
        return read_metrics_rows(list(files), table, {**keep, **extra}, digests=digests)

    if outs.get("out_phi_summary") or outs.get("out_phi_density"):
        summary, density = display.shannon_phi_summary(rows("per_query", per_query, {}))
        for key, frame in (("out_phi_summary", summary), ("out_phi_density", density)):
            if outs.get(key):
                write_frame_atomic(frame, outs[key], meta)
    if outs.get("out_jensen_bins"):
        frame = rows("per_key", per_key, {"budget": [int(head["budget"])]})
        write_frame_atomic(display.jensen_bins_table(frame, int(slice_["jensen_bins"])), outs["out_jensen_bins"], meta)


#: The stage's inputs: argument -> artifact (kvasym.artifacts); a damaged one is moved aside.
INPUTS = {**{table: f"{table}_part" for table in HOLM_FAMILIES},
          "display_per_query": "per_query", "display_per_key": "per_key"}
#: Its outputs (argument -> artifact) and the argument listing what each input or output is made
#: from (the DAG's flags follow from these, kvasym.artifacts.stage_flags; the display inputs'
#: cell digests are merged into one --cell-digests, the display tables share --display-slice).
OUTPUTS = {**{f"out_{table}": table for table in HOLM_FAMILIES}, "out_query_model": "query_model",
           **{dest: name for dest, (name, _) in DISPLAY_OUTPUTS.items()}}
LISTINGS = {**{table: f"{table}_cells" for table in HOLM_FAMILIES}, "out_query_model": "query_model_slice",
            "display_per_query": "cell_digests", "display_per_key": "cell_digests",
            **{dest: "display_slice" for dest in DISPLAY_OUTPUTS}}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ._slice import add_config_argument

    add_input_arguments(parser, INPUTS, many=INPUTS)
    add_config_argument(parser, "--TABLE-cells, --cell-digests, --query-model-slice and --display-slice")
    for table in HOLM_FAMILIES:
        parser.add_argument(f"--out-{table}", dest=f"out_{table}", help=f"the gathered {table} table")
        parser.add_argument(f"--{table}-cells", dest=f"{table}_cells",
                            help=f'JSON list: the {{"distribution", "dim"}} each --{table} part is filed under')
    parser.add_argument("--out-query-model", dest="out_query_model",
                        help="the query-model table, from the gathered trials (needs --trials)")
    parser.add_argument("--query-model-slice", dest="query_model_slice",
                        help="its arguments as JSON (kvasym.study.Study.query_model_slice): "
                             + ", ".join(QUERY_MODEL_KEYS))
    for dest, (name, table) in DISPLAY_OUTPUTS.items():
        parser.add_argument("--" + dest.replace("_", "-"), dest=dest,
                            help=f"the display table {name} (kvasym.display), from --display-{table.replace('_', '-')}")
    parser.add_argument("--display-slice", dest="display_slice",
                        help="the rows the display tables summarise, as JSON: " + ", ".join(DISPLAY_SLICE_KEYS)
                             + " of the figures slice")
    parser.add_argument("--cell-digests", dest="cell_digests", default=None,
                        help="JSON object: each --display-per-query/--display-per-key file -> the digest of its "
                             "cell's slice (kvasym.cells.slice_digest); the file's provenance must match")


def part_cells(config: str | os.PathLike, table: str, parts: Sequence[str | os.PathLike]) -> list[dict[str, Any]]:
    """The ``--TABLE-cells`` the DAG's rule gives (:meth:`kvasym.wiring.Wiring.part_cells`),
    for a run by hand with ``--config``: :func:`kvasym.cells.part_cells` with the slices of the
    study ``config`` describes.

    Raises
    ------
    KvasymError
        A part not in the results layout of its artifact (``results/stats/<table>/...``).
    """
    from ..cells import part_cells as cells_of_parts
    from ..study import load_study_file

    study = load_study_file(config)
    return cells_of_parts(INPUTS[table], parts, study.job_slice, flag=f"--{table}-cells")


def _table_cells(args: argparse.Namespace, table: str) -> list | None:
    """``--TABLE-cells``, else by hand with ``--config`` the DAG's (:func:`part_cells`)."""
    given = getattr(args, f"{table}_cells")
    if given is None and args.config is not None:
        return part_cells(args.config, table, getattr(args, table))
    return parse_cells(given, f"{table}-cells")


def _display_digests(args: argparse.Namespace) -> dict[str, Any] | None:
    """``--cell-digests``, else by hand with ``--config`` the DAG's
    (:func:`kvasym.stages._slice.config_cell_digests` of the display inputs)."""
    from ._slice import config_cell_digests, parse_cell_digests

    if args.cell_digests is None and args.config is not None:
        return config_cell_digests(args.config, [*(args.display_per_query or []), *(args.display_per_key or [])])
    return parse_cell_digests(args.cell_digests)


def _display_slice(study: Any) -> dict[str, Any]:
    """The ``--display-slice`` the DAG gives: :data:`DISPLAY_SLICE_KEYS` of the figures slice."""
    from ..render.figures.figure_slice import figures_slice

    return {key: value for key, value in figures_slice(study).items() if key in DISPLAY_SLICE_KEYS}


def _check_flags(args: argparse.Namespace, outs: Mapping[str, Any]) -> None:
    """Refuse an output without what it is made from (a slice, or ``--config``), or the reverse."""
    from ..errors import KvasymError

    by_hand = args.config is not None
    if (args.query_model_slice and not args.out_query_model) or (
            args.out_query_model and not ((args.query_model_slice or by_hand) and args.out_trials)):
        raise KvasymError("the query-model table needs --out-query-model, --query-model-slice (or --config) and the "
                          "trials (--trials, --out-trials)")
    if (args.display_slice and not any(outs.values())) or (any(outs.values()) and not (args.display_slice or by_hand)):
        raise KvasymError("the display tables need --display-slice (or --config) and at least one of "
                          + ", ".join("--" + d.replace("_", "-") for d in DISPLAY_OUTPUTS))


def run(args: argparse.Namespace) -> None:
    from ..errors import KvasymError
    from ._slice import config_slice

    outs = {dest: getattr(args, dest) for dest in DISPLAY_OUTPUTS}
    _check_flags(args, outs)
    done = 0
    if any(outs.values()):
        write_display(args.display_per_query, args.display_per_key,
                      config_slice(args, _display_slice, "--display-slice"), outs, _display_digests(args))
        done += 1
    for table, holm in HOLM_FAMILIES.items():
        parts, out = getattr(args, table), getattr(args, f"out_{table}")
        if bool(parts) != bool(out):
            raise KvasymError(f"give both --{table} and --out-{table}, or neither")
        if out:
            frame = gather(parts, out, holm, _table_cells(args, table))
            if table == "trials" and args.out_query_model:
                qm_slice = config_slice(args, lambda study: study.query_model_slice(), "--query-model-slice")
                write_query_model(frame, qm_slice, args.out_query_model)
            done += 1
    if not done:
        raise KvasymError("nothing to gather: give --TABLE inputs and --out-TABLE for at least one of "
                          + ", ".join(HOLM_FAMILIES))
