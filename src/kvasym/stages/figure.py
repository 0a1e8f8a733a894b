"""Stage ``figure`` (rules ``figure_<family>``): the figures of the paper, one job per family.

:func:`run_figures` loads the inputs of the requested families (:func:`load_inputs`), has each
family draw its figures (the registry's drawing callable,
:attr:`kvasym.render.figures.registry.FigureFamily.draw`) and writes ``<out_dir>/<name>.pdf``,
``.png`` and ``.caption.tex`` for each (:func:`kvasym.render.figures.files.write_figures`).
Each family reads only its :data:`FAMILY_INPUTS`, so the DAG runs one small job per family.
The stage parses its flags, calls the library and writes; the numbers it draws are computed by
the stages that write its inputs (the gathered summary, comparisons, theory and query-model
tables, and the display tables of :mod:`kvasym.display`: the Shannon-phi quartiles and
densities, the Jensen figure's binned means) or by library functions (:func:`kvasym.real.layer_means.real_kl_means`,
:func:`kvasym.theory.marginal_samples`).

The slice (:func:`figures_slice`, built from the study and the ``defaults`` of its claims file)
holds everything the figures depend on besides their input files:

``schemes``
    the study's schemes in config order (their colours: :func:`kvasym.render.figures._style.scheme_colors`).
``distributions``
    ``[{name, kind, params, dims}]``: the kind and params give nu (tail sweep) and rank (rank
    sweep); name, kind, params and dim rebuild each data slice for the marginal figure.
``base_seed``, ``seq_len``, ``n_queries``, ``trials``
    the data slice's other keys (checked against the manifests).
``headline``
    ``{distribution, dim, sharpness, budget}``: the cell most figures show. From the claims
    file's ``defaults`` where they are in the grid, else the first distribution, its first dim,
    the config's first sharpness, and budget 4 (the paper's headline) or the largest budget.
``facet_distributions``
    the distributions faceted by the Shannon-phi, ECDF, marginal, Jensen and sharpness figures
    (at most 4 at the headline dim: the headline one, then the most extreme instance of each
    other kind: smallest nu, smallest rank, most outlier energy).
``rank_references``
    the heavy-tailed distributions drawn as reference lines in the rank sweep: at each dim
    with low-rank data, the Student-t instance with the smallest nu there (the query-model
    table's denominators, :meth:`kvasym.study.Study.rank_references`).
``marginal_trials``, ``jensen_bins``, ``max_points``
    the marginal figure's trials (one coordinate per key per trial), the Jensen figure's bins
    (the ``jensen_bins`` table's, stage gather),
    and the points per scheme and panel of the Shannon-phi planes.

The real-model heat map (family ``real_heatmap``) reads the per-query files of the real rows
(:data:`kvasym.real.evaluate.REAL_DISTRIBUTIONS`) at the headline budget; it exists in the DAG
only when the real rows do (:func:`dag_families`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..artifacts import add_input_arguments
from ..errors import KvasymError
from ..render.figures.registry import (
    FAMILY_INPUTS,
    FIGURE_CELL_INPUTS,
    FIGURE_FAMILIES,
    FIGURE_INPUTS,
    check_families,
)


def _files(value: Any) -> list[Path]:
    if value is None:
        return []
    if isinstance(value, (str, os.PathLike)):
        return [Path(value)]
    return [Path(v) for v in value]


def load_inputs(slice_: Mapping[str, Any], inputs: Mapping[str, Any], needed: set[str]) -> dict[str, Any]:
    """The ``needed`` inputs of a figure job, loaded: input name -> what the families draw from.

    Parameters
    ----------
    slice_ : mapping
        The figures slice (its headline cell and facets select the metrics rows read).
    inputs : mapping
        Input name -> its file(s), as the flags give them: ``summary``, ``theory``,
        ``comparisons``, ``query_model``, ``frontier_points``, ``e2e_summary``,
        ``e2e_sensitivity``, ``phi_summary``, ``phi_density``, ``jensen_bins`` (one gathered
        table each; the optional ones may be absent); ``per_query`` (metrics files or folders,
        else ``metrics``: the dataset's root) with ``cell_digests``; ``data`` (manifests, or ``results/data``);
        ``real_per_query`` (the real rows' per-query files at the headline budget).
    needed : set of str
        The inputs of the families drawn.

    Returns
    -------
    dict
        The gathered tables as DataFrames (None when one is not given), the per-query metrics
        rows at the headline cell's dim and sharpness of the facet distributions, ``data`` as
        the marginal samples (:func:`kvasym.theory.marginal_samples`) and ``real_per_query``
        as the real means (:func:`kvasym.real.layer_means.real_kl_means`).

    Raises
    ------
    KvasymError
        No metrics for a per-query family; a damaged or misfiled input file.
    """
    from ..cells import read_metrics_rows
    from ..dataset import read_parquet_checked
    from ..real.layer_means import real_kl_means
    from ..theory import marginal_samples

    head = slice_["headline"]
    dim, sharpness, budget = int(head["dim"]), float(head["sharpness"]), int(head["budget"])
    facets = list(slice_["facet_distributions"])

    def table(key: str) -> Any:
        return read_parquet_checked(inputs[key]) if inputs.get(key) else None

    def metrics(key: str, keep: Mapping[str, Any]) -> Any:
        sources = _files(inputs.get(key))
        if not sources and inputs.get("metrics") is None:
            raise KvasymError(f"the figures stage needs the {key} metrics (inputs['{key}'] or inputs['metrics'])")
        return read_metrics_rows(sources, key, keep, root=inputs.get("metrics"), digests=inputs.get("cell_digests"))

    loaders: dict[str, Callable[[], Any]] = {
        # the grid's schemes and budgets: read from the dataset's root, the frontier's cells (its
        # schemes, and frontier.extra_budgets) would join the files the DAG gives
        "per_query": lambda: metrics("per_query", {"dim": [dim], "sharpness": [sharpness], "distribution": facets,
                                                   "scheme": slice_.get("schemes"), "budget": slice_.get("budgets")}),
        "data": lambda: marginal_samples(slice_, _files(inputs.get("data"))),
        "real_per_query": lambda: real_kl_means(inputs.get("real_per_query"), budget=budget),
    }
    return {key: loaders[key]() if key in loaders else table(key) for key in sorted(needed)}


def run_figures(slice_: Mapping[str, Any], inputs: Mapping[str, Any], out_dir: str | os.PathLike,
                families: Sequence[str] | None = None) -> list[Path]:
    """Draw the figures of ``families`` (default: every family of :data:`FIGURE_FAMILIES`) and
    write their files; returns the files written (pdf, png and caption of each figure).

    ``inputs`` as :func:`load_inputs` takes them; only those of :data:`FAMILY_INPUTS` for the
    families drawn are read, each once.
    """
    from ..dataset import provenance
    from ..render.figures.files import write_figures

    families = list(FIGURE_FAMILIES) if families is None else check_families(families)
    # the gathered tables a family cannot draw without
    for key in ("summary", "theory", "phi_summary", "phi_density", "jensen_bins"):
        if inputs.get(key) is None and any(key in FAMILY_INPUTS[f] for f in families):
            raise KvasymError(f"the figures {', '.join(f for f in families if key in FAMILY_INPUTS[f])} "
                              f"need inputs['{key}'] (--{key.replace('_', '-')})")
    loaded = load_inputs(slice_, inputs, {key for family in families for key in FAMILY_INPUTS[family]})
    # every file says what made it: version, commit, the slice (with its base seed)
    made_by = provenance(slice_)
    written: list[Path] = []
    for family in families:
        written += write_figures(FIGURE_FAMILIES[family].figures(slice_, loaded), out_dir, made_by)
    return written


#: The stage's inputs: argument -> artifact (kvasym.artifacts); a damaged one is moved aside.
INPUTS = FIGURE_INPUTS
#: The argument listing the cell digest of each metrics file (kvasym.artifacts.stage_flags).
LISTINGS = {"per_query": "cell_digests"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``kvasym stage figure`` (what workflow/rules/figures.smk passes)."""
    from ._slice import add_config_argument

    parser.add_argument("--slice", default=None,
                        help="the figures slice as JSON (Snakemake passes it; by hand: or --config)")
    add_config_argument(parser, "--slice and --cell-digests")
    parser.add_argument("--family", dest="families", action="append", choices=list(FIGURE_FAMILIES),
                        help="draw only this figure family (repeatable; default: every family)")
    add_input_arguments(parser, FIGURE_INPUTS, many=FIGURE_CELL_INPUTS,
                        notes={"query_model": "the query-model figure", "data": "the marginal figure",
                               "real_per_query": "the real heat map: every scheme at the headline budget"})
    parser.add_argument("--cell-digests", dest="cell_digests", default=None,
                        help="JSON object: each --per-query file -> the digest of its cell's slice "
                             "(kvasym.cells.slice_digest); the file's provenance must match")
    parser.add_argument("--out-dir", dest="out_dir", required=True)


def run_from_args(args: argparse.Namespace) -> list[Path]:
    """Run the stage from parsed :func:`add_arguments` flags: by hand with ``--config``, the slice
    and the ``--per-query`` files' digests not given are the DAG's (issue 51, point 2)."""
    from ..render.figures.figure_slice import figures_slice
    from ._slice import config_cell_digests, config_slice, parse_cell_digests

    slice_ = config_slice(args, figures_slice)
    inputs: dict[str, Any] = {k: getattr(args, k) for k in FIGURE_INPUTS}
    if args.cell_digests is not None:
        inputs["cell_digests"] = parse_cell_digests(args.cell_digests)
    elif args.config is not None:
        inputs["cell_digests"] = config_cell_digests(args.config, _files(args.per_query))
    written = run_figures(slice_, inputs, args.out_dir, args.families)
    for path in written:
        print(path)
    return written


def run(args: argparse.Namespace) -> None:
    """The stage's entry point (``kvasym stage figure``): :func:`run_from_args`."""
    run_from_args(args)  # prints each file written
