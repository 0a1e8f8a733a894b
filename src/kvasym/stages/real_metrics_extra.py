"""Stage ``real_metrics_extra`` (rule ``real_metrics_extra``): a real-model cell at one of its
scheme's frontier extra budgets (config key ``frontier.extra_budgets``).

The real rows' job of stage ``real_metrics`` writes one scheme's cells at every budget of the
grid, a fixed set of files; a scheme's extra budgets (e.g. RKV at n = 5, so that its measured
rates on the real rows reach past QWF's and KQV's n = 4 rates) are cells of their own, one job
each, computed by the same function (:func:`kvasym.stages.real_metrics.run_real_metrics`) with
the one budget. Rotation and QJL seeds derive from (base seed, text, layer, KV head, side), not
from the budgets a job runs, so the file equals what a ``real_metrics`` job with that budget
among its budgets would write. The cells enter the frontier (points, units, equal-rate claims)
only, like the synthetic cells' extra budgets.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

from ..artifacts import add_input_arguments
from ..errors import KvasymError
from ._slice import add_slice_arguments, stage_slice
from .real_metrics import run_real_metrics

#: The stage's inputs: argument -> artifact (kvasym.artifacts); a damaged one is moved aside.
INPUTS = {"captures": "captures"}


def run_real_metrics_extra(slice_: dict[str, Any], capture_paths: Sequence[str], out: str | os.PathLike) -> None:
    """The per-query metrics file ``out`` of one real cell at an extra budget: ``slice_`` is a
    ``real_metrics`` slice whose ``budgets`` is that one budget (:meth:`kvasym.study.Study.job_slice`)."""
    budgets = slice_.get("budgets")
    if not isinstance(budgets, list) or len(budgets) != 1:
        raise KvasymError(f"--slice budgets must name the one extra budget of the cell, got {budgets!r}")
    run_real_metrics(slice_, capture_paths, {int(budgets[0]): out})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_slice_arguments(parser, "real_metrics_extra")
    add_input_arguments(parser, INPUTS, required=INPUTS, many=INPUTS)
    parser.add_argument("--out", required=True, help="the cell's per-query Parquet file")


def run(args: argparse.Namespace) -> None:
    run_real_metrics_extra(stage_slice(args, "real_metrics_extra"), args.captures, args.out)
