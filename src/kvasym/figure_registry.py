"""The figure registry: every figure family of the paper in one table, and the cells it reads.

Each family is one Snakemake rule (``figure_<family>``, one job) that runs ``kvasym stage figure
--family <family>`` (:mod:`kvasym.stages.figure`) and writes ``<name>.pdf`` and ``<name>.png``
for each of its figures. :data:`FIGURE_FAMILIES` says, per family, which figures it draws,
which inputs it reads (so a rule declares, and a rerun is triggered by, only those) and under
which heading the Snakemake report shows it. :func:`figures_slice` is the stage's config slice.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


from .errors import KvasymError

__all__ = ["E2E_FAMILIES", "FAMILIES", "FIGURE_CELL_INPUTS", "FIGURE_INPUTS",
           "FRONTIER_FAMILIES", "FAMILY_INPUTS", "FIGURES", "FIGURE_FAMILIES", "FORMATS",
           "REAL_FAMILIES",
           "FigureFamily",
           "dag_families", "family_cells", "figure_files", "figures_slice"]


@dataclass(frozen=True)
class FigureFamily:
    """One figure family: its figure names, the inputs it reads and its report heading.

    ``inputs``: ``summary``, ``comparisons``, ``theory``, ``trials`` (gathered tables), ``per_query`` /
    ``per_key`` (metrics files of :func:`family_cells`), ``data`` (manifests of
    :func:`family_cells`), ``real_per_query`` (the real rows' per-query files at the headline
    budget, every scheme), ``e2e_summary`` / ``e2e_sensitivity`` (tables of stage e2e_stats),
    ``frontier_points`` (the points of stage frontier).
    """

    names: tuple[str, ...]
    inputs: tuple[str, ...]
    report_group: str


#: What a family's inputs are: input name (the stage's argument) -> artifact (kvasym.artifacts).
FIGURE_INPUTS: dict[str, str] = {
    "summary": "summary", "comparisons": "comparisons", "theory": "theory", "trials": "trials",
    "per_query": "per_query", "per_key": "per_key", "data": "data", "real_per_query": "per_query",
    "e2e_summary": "e2e_summary", "e2e_sensitivity": "e2e_sensitivity", "frontier_points": "frontier_points",
}
#: The inputs that are lists of per-cell files (the others are one gathered table each).
FIGURE_CELL_INPUTS: tuple[str, ...] = ("per_query", "per_key", "data", "real_per_query")

#: Every figure family, in drawing order.
FIGURE_FAMILIES: dict[str, FigureFamily] = {
    "shannon_phi": FigureFamily(("shannon_phi_k", "shannon_phi_v", "shannon_phi_t"), ("per_query",),
                                "Errors at the headline cell"),
    "kl_ecdf": FigureFamily(("kl_ecdf",), ("per_query",), "Errors at the headline cell"),
    "budget_crossover": FigureFamily(("budget_crossover",), ("summary",), "Sweeps"),
    "tail_sweep": FigureFamily(("tail_sweep",), ("summary",), "Sweeps"),
    "rank_sweep": FigureFamily(("rank_sweep",), ("summary",), "Sweeps"),
    "query_model": FigureFamily(("query_model",), ("trials",), "Sweeps"),
    "sharpness_sweep": FigureFamily(("sharpness_sweep",), ("summary", "comparisons"), "Sweeps"),
    "theory_check": FigureFamily(("theory_check",), ("theory",), "Theory checks"),
    "marginals": FigureFamily(("marginals",), ("data", "theory"), "Theory checks"),
    "jensen_bias": FigureFamily(("jensen_bias",), ("per_key", "theory"), "Theory checks"),
    "real_heatmap": FigureFamily(("real_kl_heatmap",), ("real_per_query",), "Real model"),
    "e2e": FigureFamily(("e2e_ppl_bits", "e2e_layer_sensitivity"), ("e2e_summary", "e2e_sensitivity"),
                        "Real model"),
    "frontier": FigureFamily(("frontier_kl", "frontier_kl_p99", "frontier_recall", "frontier_t_eps_dir"),
                             ("frontier_points",), "Rate-distortion frontier"),
}
#: Family -> its figure names (a view of :data:`FIGURE_FAMILIES`).
FAMILIES: dict[str, tuple[str, ...]] = {f: spec.names for f, spec in FIGURE_FAMILIES.items()}
#: Family -> the inputs it reads (a view of :data:`FIGURE_FAMILIES`).
FAMILY_INPUTS: dict[str, tuple[str, ...]] = {f: spec.inputs for f, spec in FIGURE_FAMILIES.items()}
#: Families drawn from the real-model rows: in the DAG only when those rows are.
REAL_FAMILIES: tuple[str, ...] = tuple(f for f, inputs in FAMILY_INPUTS.items() if "real_per_query" in inputs)
#: Families drawn from the end-to-end passes: in the DAG only when those passes are.
E2E_FAMILIES: tuple[str, ...] = tuple(f for f, inputs in FAMILY_INPUTS.items() if "e2e_summary" in inputs)
#: Families drawn from the frontier's points: in the DAG only when frontier.schemes is set.
FRONTIER_FAMILIES: tuple[str, ...] = tuple(f for f, inputs in FAMILY_INPUTS.items() if "frontier_points" in inputs)
#: Figure names, in drawing order.
FIGURES: tuple[str, ...] = tuple(name for names in FAMILIES.values() for name in names)
#: The files of a figure ``<name>``: its drawing (PDF, PNG) and the factual part of its caption
#: (``<name>.caption.tex``, :mod:`kvasym.figure_captions`).
FORMATS: tuple[str, ...] = ("pdf", "png", "caption.tex")
MAX_FACETS = 4


def figure_files(out_dir: str | os.PathLike, families: Sequence[str] | None = None) -> list[str]:
    """Every file the stage writes under ``out_dir`` for ``families`` (default: all)."""
    names = FIGURES if families is None else [n for f in _check_families(families) for n in FAMILIES[f]]
    return [str(Path(out_dir) / f"{name}.{fmt}") for name in names for fmt in FORMATS]


def dag_families(with_real: bool, with_e2e: bool | None = None,
                 with_frontier: bool = True) -> dict[str, tuple[str, ...]]:
    """The families (and their figures) of a DAG: every family, less :data:`REAL_FAMILIES`
    when the DAG has no real-model rows, less :data:`E2E_FAMILIES` when it has no end-to-end
    passes (``with_e2e``; default: ``with_real``), less :data:`FRONTIER_FAMILIES` when it has no
    frontier (``with_frontier``)."""
    with_e2e = with_real if with_e2e is None else with_e2e
    return {f: names for f, names in FAMILIES.items()
            if (with_real or f not in REAL_FAMILIES) and (with_e2e or f not in E2E_FAMILIES)
            and (with_frontier or f not in FRONTIER_FAMILIES)}


def _check_families(families: Sequence[str]) -> list[str]:
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise KvasymError(f"unknown figure family {unknown[0]!r}; known: {', '.join(FAMILIES)}")
    return list(families)


def family_cells(slice_: Mapping[str, Any], family: str) -> list[dict[str, Any]]:
    """The metrics cells (``{distribution, dim, budget}``; budget None = every budget) and data
    cells a family reads: the facet distributions at the headline dim. Per-query figures facet
    by budget; the Jensen figure shows the headline budget; the marginal figure needs the data
    manifests only (budget None)."""
    _check_families([family])
    inputs = FAMILY_INPUTS[family]
    if not ({"per_query", "per_key", "data"} & set(inputs)):
        return []
    head = slice_["headline"]
    dims = {d["name"]: d["dims"] for d in slice_["distributions"]}
    budget = int(head["budget"]) if "per_key" in inputs else None
    return [{"distribution": name, "dim": int(head["dim"]), "budget": budget}
            for name in slice_["facet_distributions"] if int(head["dim"]) in dims.get(name, [])]


def _extreme(specs: Sequence[Mapping[str, Any]], kind: str) -> list[str]:
    """Instances of ``kind`` from the most to the least extreme."""
    items = [s for s in specs if s["kind"] == kind]
    if kind == "student_t":
        items.sort(key=lambda s: float(s["params"]["nu"]))
    elif kind == "low_rank":
        items.sort(key=lambda s: int(s["params"]["rank"]))
    elif kind == "concentrated":
        items.sort(key=lambda s: -float(s["params"]["outlier_scale"]) ** 2 * int(s["params"]["n_outliers"]))
    return [s["name"] for s in items]


def _paper_kl_ratio(study: Any) -> float | None:
    """The ``paper_value`` of the claims file's mean-KL ratio claim of QKQV over KQV (C2 in the
    paper's ledger), or None when the claims file has none."""
    from .claims import load_claims

    for claim in load_claims(study.claims_file, study.headline):
        where = claim["where"]
        if (claim["statistic"] == "kl_ratio" and where.get("a") == "QKQV" and where.get("b") == "KQV"
                and where.get("which", "mean") == "mean" and claim.get("paper_value") is not None):
            return float(claim["paper_value"])
    return None


def figures_slice(study: Any) -> dict[str, Any]:
    """The figure stage's slice from a :class:`kvasym.study.Study`: the grid, the study's
    headline cell (:attr:`~kvasym.study.Study.headline`), the facet distributions and the
    rank-sweep references."""
    variants = getattr(study, "query_variants", {})
    distributions = [
        {**study.distributions[name].to_dict(), "dims": list(study.distribution_dims[name])}
        for name in study.distributions if name not in variants
    ]
    head = dict(study.headline)
    dim = int(head["dim"])
    at_dim = [d for d in distributions if dim in d["dims"]]
    facets = [head["distribution"]]
    for kind in ("student_t", "low_rank", "concentrated", "gaussian"):
        for name in _extreme(at_dim, kind)[:1]:
            if name not in facets and len(facets) < MAX_FACETS:
                facets.append(name)
    # rank sweep references: at each dim with low-rank data, its heaviest-tailed Student-t
    references: list[str] = []
    for d in sorted({d for spec in distributions if spec["kind"] == "low_rank" for d in spec["dims"]}):
        heaviest = _extreme([spec for spec in distributions if d in spec["dims"]], "student_t")[:1]
        references += [name for name in heaviest if name not in references]
    return {
        "schemes": list(study.schemes),
        "budgets": list(study.budgets),
        "sharpness": list(study.sharpness),
        "distributions": distributions,
        "base_seed": int(study.base_seed),
        "seq_len": int(study.seq_len),
        "n_queries": int(study.n_queries),
        "trials": int(study.trials),
        "headline": {"distribution": head["distribution"], "dim": dim, "sharpness": float(head["sharpness"]),
                     "budget": int(head["budget"])},
        "facet_distributions": facets,
        "rank_references": references,
        "marginal_trials": int(min(study.trials, study.theory.get("trials", study.trials), 4)),
        # the paper's QKQV/KQV mean-KL ratio, a reference line of the sharpness sweep
        "paper_kl_ratio": _paper_kl_ratio(study),
        # query-model variants of the low-rank distributions (kvasym.study): the query_model figure
        "query_variants": [{**study.distributions[name].to_dict(), "dims": list(study.distribution_dims[name])}
                           for name in variants],
        "jensen_bins": 20,
        "max_points": 300,
    }


