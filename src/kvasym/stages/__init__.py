"""The DAG's stages: one module per Snakemake rule (or rule family), one entry point each.

A stage's name is its rule's name, its module's name and its ``kvasym stage`` subcommand:
rule ``metrics`` runs ``kvasym stage metrics``, implemented by :mod:`kvasym.stages.metrics`;
the figure rules ``figure_<family>`` run ``kvasym stage figure --family <family>``
(:mod:`kvasym.stages.figure`). Every stage module defines

- ``add_arguments(parser)``: its flags (inputs, outputs and, for grid stages, ``--slice``, the
  narrow config slice the job depends on, as JSON);
- ``run(args)``: reads its inputs, calls the library and writes its outputs atomically.

Stages hold no maths: that lives in the library modules they call. The registry below maps a
stage to its one-line description; modules are imported only when their stage runs, so a
``kvasym stage data`` job does not pay for pandas or matplotlib.
"""

from __future__ import annotations

import argparse
import importlib
from types import ModuleType

__all__ = ["STAGES", "add_stage_parsers", "stage_module"]

#: Stage (= rule = module) name -> what it does, in DAG order.
STAGES: dict[str, str] = {
    "data": "data manifest of one (distribution, dim): per-trial digests and statistics",
    "quantize": "packed K and V caches of every trial of one cell",
    "metrics": "per-query and per-key metrics of one cell, as Parquet",
    "capture": "real K, V and queries of SmolLM2-135M for one shipped text (needs the real extra)",
    "real_metrics": "per-query metrics of one real-model cell (SmolLM2 captures)",
    "real_cachestats": "statistics of the real caches per text, layer and head",
    "file_metrics": "per-query metrics of one bring-your-own cache cell (distribution kind file)",
    "stats": "scheme-pair tests, KL ratio intervals and summaries of one (distribution, dim)",
    "theory": "QJL variance ratios against closed forms, Beta marginals, Jensen slope of one (distribution, dim)",
    "gather": "concatenate the per-(distribution, dim) tables, adding Holm-adjusted p-values",
    "claims": "evaluate the claims ledger from the gathered tables",
    "figure": "draw the figures of one figure family (or all) from the gathered tables",
    "tables": "the paper's LaTeX tables (jinja2) from the gathered tables",
    "numbers": "numbers.tex: a macro for every number and name the paper's prose quotes",
    "paper": "the paper PDF (latexmk) from its sources and the generated parts",
}


def stage_module(name: str) -> ModuleType:
    """The module of stage ``name`` (imported now)."""
    if name not in STAGES:
        raise KeyError(name)
    return importlib.import_module(f"{__name__}.{name}")


def add_stage_parsers(subparsers: argparse._SubParsersAction, only: str | None = None) -> None:
    """One subparser per stage; with ``only``, only that stage imports its module and declares
    its flags (the others are listed with their description, for ``--help``)."""
    for name, description in STAGES.items():
        parser = subparsers.add_parser(name, help=description, description=description)
        if only is None or name == only:
            module = stage_module(name)
            module.add_arguments(parser)
            parser.set_defaults(func=module.run, stage_name=name)
