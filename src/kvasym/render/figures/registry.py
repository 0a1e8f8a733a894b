"""The figure registry: every figure family of the paper, the cells it reads and how it is drawn.

Each family is one Snakemake rule (``figure_<family>``, one job) that runs ``kvasym stage figure
--family <family>`` (:mod:`kvasym.stages.figure`) and writes ``<name>.pdf``, ``<name>.png`` and
``<name>.caption.tex`` for each of its figures. :data:`FIGURE_FAMILIES` says, per family, which
figures it draws, which inputs it reads (so a rule declares, and a rerun is triggered by, only
those), under which heading the Snakemake report shows it, and its drawing callable
(:attr:`FigureFamily.draw`). :func:`figures_slice` is the stage's config slice (defined in
:mod:`~kvasym.render.figures.figure_slice`, which the gather stage reads without this module).

The drawing callables live here, one per family, and import their family module
(``kvasym.render.figures.<family>``) only when called: Snakemake imports this module when it
parses the workflow, and must not pay for matplotlib there. Each maps the slice and the loaded
inputs onto its figure functions; every number it hands them is read from an input, never
computed (the statistics are the computing stages' tables).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import KvasymError
from .figure_slice import MAX_FACETS, figures_slice  # noqa: F401 (the stage's slice, re-exported)

__all__ = ["E2E_FAMILIES", "FAMILIES", "FIGURE_CELL_INPUTS", "FIGURE_INPUTS", "FRONTIER_FAMILIES", "FAMILY_INPUTS",
           "FIGURES", "FIGURE_FAMILIES", "FORMATS", "REAL_FAMILIES", "Drawn", "FigureFamily", "check_families",
           "dag_families", "facet_cells", "family_cells", "figure_files", "figures_slice"]

#: What a family's drawing callable yields: (figure name, figure), one figure at a time.
Drawn = Iterator[tuple[str, Any]]


@dataclass(frozen=True)
class FigureFamily:
    """One figure family: its figure names, the inputs it reads, its report heading and how it is drawn.

    Attributes
    ----------
    names : tuple of str
        Its figures, in drawing order (each is ``<name>.pdf``, ``.png`` and ``.caption.tex``).
    inputs : tuple of str
        What it reads (:data:`FIGURE_INPUTS`): ``summary``, ``comparisons``, ``theory``,
        ``query_model`` (gathered tables), ``phi_summary``, ``phi_density``, ``jensen_bins``
        (the display tables of stage gather, :mod:`kvasym.display`), ``per_query`` (metrics
        files of :func:`family_cells`), ``data`` (manifests of :func:`family_cells`), ``real_per_query``
        (the real rows' per-query files at the headline budget, every scheme), ``e2e_summary`` /
        ``e2e_sensitivity`` (tables of stage e2e_stats), ``frontier_points`` (the points of
        stage frontier).
    report_group : str
        The heading of the Snakemake report it is shown under.
    draw : callable
        ``draw(slice_, inputs)``: the figures slice (:func:`figures_slice`) and the loaded
        inputs (input name -> what :func:`kvasym.stages.figure.load_inputs` made of its files)
        to the family's figures, yielded as ``(name, figure)`` in the order of :attr:`names`.
    """

    names: tuple[str, ...]
    inputs: tuple[str, ...]
    report_group: str
    draw: Callable[[Mapping[str, Any], Mapping[str, Any]], Drawn]

    def figures(self, slice_: Mapping[str, Any], inputs: Mapping[str, Any]) -> Drawn:
        """:attr:`draw`, checked to yield exactly :attr:`names` in order (a family drawing another
        figure, or leaving one out, would write files its rule does not declare)."""
        expected = iter(self.names)
        for name, fig in self.draw(slice_, inputs):
            if name != next(expected, None):
                raise KvasymError(f"figure family {self.names}: drew {name!r} out of order or beyond its figures")
            yield name, fig
        missing = list(expected)
        if missing:
            raise KvasymError(f"figure family {self.names}: drew no {', '.join(missing)}")


# ----------------------------------------------------------------------------- drawing callables


def _headline(slice_: Mapping[str, Any]) -> tuple[str, int, float, int]:
    head = slice_["headline"]
    return str(head["distribution"]), int(head["dim"]), float(head["sharpness"]), int(head["budget"])


def _colors(slice_: Mapping[str, Any]) -> dict[str, str]:
    """Every scheme of the study its colour (a user scheme keeps it in a figure another lacks)."""
    from ._style import scheme_colors

    return scheme_colors(slice_["schemes"])


def _draw_shannon_phi(slice_: Mapping[str, Any], inputs: Mapping[str, Any]) -> Drawn:
    from .shannon_phi import shannon_phi_plane

    _, dim, sharpness, _ = _headline(slice_)
    for site in ("k", "v", "t"):
        yield f"shannon_phi_{site}", shannon_phi_plane(
            inputs["per_query"], site, summary=inputs["phi_summary"], density=inputs["phi_density"],
            sharpness=sharpness, dim=dim, distributions=list(slice_["facet_distributions"]),
            colors=_colors(slice_), max_points=slice_["max_points"], seed=slice_["base_seed"])


def _draw_kl_ecdf(slice_: Mapping[str, Any], inputs: Mapping[str, Any]) -> Drawn:
    from .kl_ecdf import kl_ecdf

    _, dim, sharpness, _ = _headline(slice_)
    yield "kl_ecdf", kl_ecdf(inputs["per_query"], summary=inputs["summary"], sharpness=sharpness, dim=dim,
                             distributions=list(slice_["facet_distributions"]), colors=_colors(slice_))


def _draw_budget_crossover(slice_: Mapping[str, Any], inputs: Mapping[str, Any]) -> Drawn:
    from .budget_crossover import budget_crossover

    dist, dim, sharpness, _ = _headline(slice_)
    yield "budget_crossover", budget_crossover(inputs["summary"], distribution=dist, dim=dim, sharpness=sharpness,
                                               colors=_colors(slice_))


def _draw_tail_sweep(slice_: Mapping[str, Any], inputs: Mapping[str, Any]) -> Drawn:
    from .tail_sweep import tail_sweep

    _, dim, sharpness, budget = _headline(slice_)
    nu = {d["name"]: float(d["params"]["nu"]) for d in slice_["distributions"] if d["kind"] == "student_t"}
    yield "tail_sweep", tail_sweep(inputs["summary"], nu, dim=dim, budget=budget, sharpness=sharpness,
                                   colors=_colors(slice_))


def _draw_rank_sweep(slice_: Mapping[str, Any], inputs: Mapping[str, Any]) -> Drawn:
    from .rank_sweep import rank_sweep

    _, _, sharpness, budget = _headline(slice_)
    rank = {d["name"]: int(d["params"]["rank"]) for d in slice_["distributions"] if d["kind"] == "low_rank"}
    yield "rank_sweep", rank_sweep(inputs["summary"], rank, slice_["rank_references"], budget=budget,
                                   sharpness=sharpness, colors=_colors(slice_))


def _draw_query_model(slice_: Mapping[str, Any], inputs: Mapping[str, Any]) -> Drawn:
    from .query_model import query_model_sweep

    yield "query_model", query_model_sweep(inputs["query_model"])


def _draw_sharpness_sweep(slice_: Mapping[str, Any], inputs: Mapping[str, Any]) -> Drawn:
    from .sharpness_sweep import sharpness_sweep

    _, dim, _, budget = _headline(slice_)
    yield "sharpness_sweep", sharpness_sweep(inputs["summary"], dim=dim, budget=budget,
                                             distributions=list(slice_["facet_distributions"]),
                                             comparisons=inputs.get("comparisons"), colors=_colors(slice_),
                                             paper_ratio=slice_.get("paper_kl_ratio"))


def _draw_theory_check(slice_: Mapping[str, Any], inputs: Mapping[str, Any]) -> Drawn:
    from .theory_check import theory_check

    _, dim, _, _ = _headline(slice_)
    yield "theory_check", theory_check(inputs["theory"], dim=dim,
                                       distributions=[d["name"] for d in slice_["distributions"] if dim in d["dims"]])


def _draw_marginals(slice_: Mapping[str, Any], inputs: Mapping[str, Any]) -> Drawn:
    from .marginals import marginals

    _, dim, _, _ = _headline(slice_)
    yield "marginals", marginals(inputs["data"], ks_rows=inputs["theory"], dim=dim)


def _draw_jensen_bias(slice_: Mapping[str, Any], inputs: Mapping[str, Any]) -> Drawn:
    from .jensen_bias import jensen_bias

    _, dim, sharpness, budget = _headline(slice_)
    yield "jensen_bias", jensen_bias(inputs["jensen_bins"], budget=budget, sharpness=sharpness, dim=dim,
                                     distributions=list(slice_["facet_distributions"]), slopes=inputs["theory"],
                                     colors=_colors(slice_))


def _draw_real_heatmap(slice_: Mapping[str, Any], inputs: Mapping[str, Any]) -> Drawn:
    from .real_heatmap import real_rows_heatmap

    yield "real_kl_heatmap", real_rows_heatmap(inputs["real_per_query"], slice_["schemes"], _headline(slice_)[3])


def _draw_e2e(slice_: Mapping[str, Any], inputs: Mapping[str, Any]) -> Drawn:
    from ...real import REAL_MODEL_NAME
    from ...real.model_registry import MODELS
    from ...real.models import primary_rows
    from .e2e import e2e_layer_sensitivity, e2e_pareto, e2e_ppl_bits

    # the tables hold every model's rows: the primary's figures, then the one across models
    summary, layers = inputs.get("e2e_summary"), inputs.get("e2e_sensitivity")
    yield "e2e_ppl_bits", e2e_ppl_bits(None if summary is None else primary_rows(summary), colors=_colors(slice_),
                                       model=REAL_MODEL_NAME)
    yield "e2e_layer_sensitivity", e2e_layer_sensitivity(None if layers is None else primary_rows(layers),
                                                         schemes=slice_["schemes"], model=REAL_MODEL_NAME)
    yield "e2e_pareto", e2e_pareto(summary, colors=_colors(slice_), names={k: m.name for k, m in MODELS.items()})


def _draw_e2e_context(slice_: Mapping[str, Any], inputs: Mapping[str, Any]) -> Drawn:
    from ...real import REAL_MODEL_NAME
    from ...real.models import primary_rows
    from .e2e import e2e_context

    positions = inputs.get("e2e_long_positions")  # every model's rows: the primary's figure
    yield "e2e_context", e2e_context(None if positions is None else primary_rows(positions), colors=_colors(slice_),
                                     model=REAL_MODEL_NAME)


def _draw_card(slice_: Mapping[str, Any], inputs: Mapping[str, Any]) -> Drawn:
    from ...real import REAL_MODEL_NAME
    from .card import card_allocation, card_sensitivity

    yield "card_sensitivity", card_sensitivity(inputs.get("card_layers"), model=REAL_MODEL_NAME)
    yield "card_allocation", card_allocation(inputs.get("card_allocation"), model=REAL_MODEL_NAME)


def _draw_frontier(slice_: Mapping[str, Any], inputs: Mapping[str, Any]) -> Drawn:
    from ...real import REAL_SHARPNESS
    from ...real.evaluate import REAL_DISTRIBUTIONS
    from .frontier import FRONTIER_FIGURES, frontier_figure

    _, _, sharpness, _ = _headline(slice_)
    for name in FRONTIER_FIGURES:
        yield name, frontier_figure(inputs.get("frontier_points"), name, sharpness=sharpness,
                                    real_sharpness=REAL_SHARPNESS, real_distributions=list(REAL_DISTRIBUTIONS),
                                    colors=_colors(slice_))


#: What a family's inputs are: input name (the stage's argument) -> artifact (kvasym.artifacts).
FIGURE_INPUTS: dict[str, str] = {
    "summary": "summary", "comparisons": "comparisons", "theory": "theory", "query_model": "query_model",
    "per_query": "per_query", "data": "data", "real_per_query": "per_query",
    "e2e_summary": "e2e_summary", "e2e_sensitivity": "e2e_sensitivity", "frontier_points": "frontier_points",
    "e2e_long_positions": "e2e_long_positions", "card_layers": "card_layers", "card_allocation": "card_allocation",
    "phi_summary": "phi_summary", "phi_density": "phi_density", "jensen_bins": "jensen_bins",
}
#: The inputs that are lists of per-cell files (the others are one gathered table each).
FIGURE_CELL_INPUTS: tuple[str, ...] = ("per_query", "data", "real_per_query")

#: Every figure family, in drawing order.
FIGURE_FAMILIES: dict[str, FigureFamily] = {
    "shannon_phi": FigureFamily(("shannon_phi_k", "shannon_phi_v", "shannon_phi_t"),
                                ("per_query", "phi_summary", "phi_density"), "Errors at the headline cell",
                                _draw_shannon_phi),
    "kl_ecdf": FigureFamily(("kl_ecdf",), ("per_query", "summary"), "Errors at the headline cell", _draw_kl_ecdf),
    "budget_crossover": FigureFamily(("budget_crossover",), ("summary",), "Sweeps", _draw_budget_crossover),
    "tail_sweep": FigureFamily(("tail_sweep",), ("summary",), "Sweeps", _draw_tail_sweep),
    "rank_sweep": FigureFamily(("rank_sweep",), ("summary",), "Sweeps", _draw_rank_sweep),
    "query_model": FigureFamily(("query_model",), ("query_model",), "Sweeps", _draw_query_model),
    "sharpness_sweep": FigureFamily(("sharpness_sweep",), ("summary", "comparisons"), "Sweeps",
                                    _draw_sharpness_sweep),
    "theory_check": FigureFamily(("theory_check",), ("theory",), "Theory checks", _draw_theory_check),
    "marginals": FigureFamily(("marginals",), ("data", "theory"), "Theory checks", _draw_marginals),
    "jensen_bias": FigureFamily(("jensen_bias",), ("jensen_bins", "theory"), "Theory checks", _draw_jensen_bias),
    "real_heatmap": FigureFamily(("real_kl_heatmap",), ("real_per_query",), "Real model", _draw_real_heatmap),
    "e2e": FigureFamily(("e2e_ppl_bits", "e2e_layer_sensitivity", "e2e_pareto"), ("e2e_summary", "e2e_sensitivity"),
                        "Real model", _draw_e2e),
    "e2e_context": FigureFamily(("e2e_context",), ("e2e_long_positions",), "Real model", _draw_e2e_context),
    "card": FigureFamily(("card_sensitivity", "card_allocation"), ("card_layers", "card_allocation"), "Real model",
                         _draw_card),
    "frontier": FigureFamily(("frontier_kl", "frontier_kl_p99", "frontier_recall", "frontier_t_eps_dir"),
                             ("frontier_points",), "Rate-distortion frontier", _draw_frontier),
}
#: Family -> its figure names (a view of :data:`FIGURE_FAMILIES`).
FAMILIES: dict[str, tuple[str, ...]] = {f: spec.names for f, spec in FIGURE_FAMILIES.items()}
#: Family -> the inputs it reads (a view of :data:`FIGURE_FAMILIES`).
FAMILY_INPUTS: dict[str, tuple[str, ...]] = {f: spec.inputs for f, spec in FIGURE_FAMILIES.items()}
#: Families drawn from the real-model rows: in the DAG only when those rows are.
REAL_FAMILIES: tuple[str, ...] = tuple(f for f, inputs in FAMILY_INPUTS.items() if "real_per_query" in inputs)
#: Families drawn from the end-to-end passes: in the DAG only when those passes are.
E2E_FAMILIES: tuple[str, ...] = tuple(f for f, inputs in FAMILY_INPUTS.items() if "e2e_summary" in inputs)
#: Families drawn from the long-context passes: in the DAG only when those passes are.
LONG_FAMILIES: tuple[str, ...] = tuple(f for f, inputs in FAMILY_INPUTS.items() if "e2e_long_positions" in inputs)
#: Families drawn from the model card: in the DAG only when real.card is on.
CARD_FAMILIES: tuple[str, ...] = tuple(f for f, inputs in FAMILY_INPUTS.items() if "card_layers" in inputs)
#: Families drawn from the frontier's points: in the DAG only when frontier.schemes is set.
FRONTIER_FAMILIES: tuple[str, ...] = tuple(f for f, inputs in FAMILY_INPUTS.items() if "frontier_points" in inputs)
#: Figure names, in drawing order.
FIGURES: tuple[str, ...] = tuple(name for names in FAMILIES.values() for name in names)
#: The files of a figure ``<name>``: its drawing (PDF, PNG) and the factual part of its caption
#: (``<name>.caption.tex``, :mod:`kvasym.render.figures.captions`).
FORMATS: tuple[str, ...] = ("pdf", "png", "caption.tex")


def figure_files(out_dir: str | os.PathLike, families: Sequence[str] | None = None) -> list[str]:
    """Every file the stage writes under ``out_dir`` for ``families`` (default: all)."""
    names = FIGURES if families is None else [n for f in check_families(families) for n in FAMILIES[f]]
    return [str(Path(out_dir) / f"{name}.{fmt}") for name in names for fmt in FORMATS]


def dag_families(with_real: bool, with_e2e: bool | None = None,
                 with_frontier: bool = True, with_long: bool | None = None,
                 with_card: bool | None = None) -> dict[str, tuple[str, ...]]:
    """The families (and their figures) of a DAG: every family, less :data:`REAL_FAMILIES`
    when the DAG has no real-model rows, less :data:`E2E_FAMILIES` when it has no end-to-end
    passes (``with_e2e``; default: ``with_real``), less :data:`FRONTIER_FAMILIES` when it has no
    frontier (``with_frontier``), less :data:`LONG_FAMILIES` when it has no long-context passes
    (``with_long``; default: ``with_e2e``), less :data:`CARD_FAMILIES` when it has no model card
    (``with_card``; default: ``with_e2e``)."""
    with_e2e = with_real if with_e2e is None else with_e2e
    with_long = with_e2e if with_long is None else with_long
    with_card = with_e2e if with_card is None else with_card
    return {f: names for f, names in FAMILIES.items()
            if (with_real or f not in REAL_FAMILIES) and (with_e2e or f not in E2E_FAMILIES)
            and (with_frontier or f not in FRONTIER_FAMILIES) and (with_long or f not in LONG_FAMILIES)
            and (with_card or f not in CARD_FAMILIES)}


def check_families(families: Sequence[str]) -> list[str]:
    """``families`` as a list, or a :class:`KvasymError` naming the first unknown one."""
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise KvasymError(f"unknown figure family {unknown[0]!r}; known: {', '.join(FAMILIES)}")
    return list(families)


def family_cells(slice_: Mapping[str, Any], family: str) -> list[dict[str, Any]]:
    """The metrics cells (``{distribution, dim, budget}``; budget None = every budget) and data
    cells a family reads: the facet distributions at the headline dim (:func:`facet_cells`).
    Per-query figures facet by budget; the marginal figure needs the data manifests only."""
    check_families([family])
    if not ({"per_query", "data"} & set(FAMILY_INPUTS[family])):
        return []
    return facet_cells(slice_, "per_query")


def facet_cells(slice_: Mapping[str, Any], table: str) -> list[dict[str, Any]]:
    """The cells ``{distribution, dim, budget}`` of the facet distributions at the headline dim
    whose ``table`` rows the figures show: ``per_query`` at every budget (budget None), ``per_key``
    at the headline budget (the Jensen figure's). Stage gather summarises these cells' rows into
    the display tables (:mod:`kvasym.display`)."""
    if table not in ("per_query", "per_key"):
        raise KvasymError(f"facet_cells: table must be per_query or per_key, got {table!r}")
    head = slice_["headline"]
    dims = {d["name"]: d["dims"] for d in slice_["distributions"]}
    budget = int(head["budget"]) if table == "per_key" else None
    return [{"distribution": name, "dim": int(head["dim"]), "budget": budget}
            for name in slice_["facet_distributions"] if int(head["dim"]) in dims.get(name, [])]
