"""One cell's files, written as the DAG writes them (``kvasym stage cells`` on a unit cut to
that cell), for tests that need a cell's manifest, packed caches and metrics tables."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvasym.stages.cells import run_cells
from kvasym.study import Study


#: Relative tolerance of a stored metric against its float64 reference: the metrics tables store
#: float32 (kvasym.dataset.METRIC_TYPE), each value rounded to nearest (at most 2^-24 relative),
#: beside the ~1e-12 by which the compiled and numpy paths differ.
FLOAT32_RTOL = 2.0**-23
#: A column derived from a float32 one by a function that at most doubles relative errors
#: (kvasym.dataset.DERIVED_COLUMNS: t_eps_dir = 2 sin^2(t_phi / 2) at small angles).
DERIVED_RTOL = 2.0**-22


@dataclass(frozen=True)
class CellFiles:
    manifest: Path
    packed: Path
    per_query: Path
    per_key: Path


def one_unit(study: Study, distribution: str, dim: int, root: Path, *, schemes: list[str] | None = None,
             budgets: list[int] | None = None) -> dict[tuple[str, int], CellFiles]:
    """Run the cells stage for (distribution, dim), cut to ``schemes`` and ``budgets`` (default:
    the unit's), into ``root``: {(scheme, budget): CellFiles}."""
    unit = study.unit_slice(distribution, dim)
    if schemes is not None:
        unit["schemes"] = [s for s in unit["schemes"] if s["name"] in schemes]
    if budgets is not None:
        unit["budgets"] = list(budgets)
    # every cell's packed caches, the frontier's too (the tests read them; the paper grid keeps
    # the grid's only, frontier.keep_packed)
    unit["packed_schemes"] = [s["name"] for s in unit["schemes"]]
    root = Path(root)
    manifest = root / "data" / distribution / f"d{dim}.json"
    folders = {name: root / name / distribution / f"d{dim}" for name in ("packed", "per_query", "per_key")}
    run_cells(unit, manifest, folders["packed"], folders["per_query"], folders["per_key"])
    return {(s["name"], b): CellFiles(manifest, folders["packed"] / s["name"] / f"n{b}.npz",
                                      folders["per_query"] / s["name"] / f"n{b}.parquet",
                                      folders["per_key"] / s["name"] / f"n{b}.parquet")
            for s in unit["schemes"] for b in unit["budgets"]}


def one_cell(study: Study, distribution: str, dim: int, scheme: str, budget: int, root: Path) -> CellFiles:
    """The files of one cell (its unit cut to it)."""
    return one_unit(study, distribution, dim, root, schemes=[scheme], budgets=[budget])[scheme, budget]
