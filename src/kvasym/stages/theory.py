"""Stage ``theory`` (rule ``theory``): theory checks of one (distribution, dim).

Reads the (distribution, dim)'s trials (checked against its data manifest) and per-key tables
and writes what :func:`kvasym.theory_checks.theory_checks` measures: the QJL error-variance
ratios and Beta-marginal distances against their closed forms, and the Jensen-bias slopes.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ..artifacts import add_input_arguments
from ..cells import parse_cells, read_cell_tables
from ..dataset import provenance, write_frame_atomic
from ..manifest import load_manifest, verified_trial
from ._slice import add_slice_arguments, hand_run_cells, stage_slice


def run_theory(
    slice_: Mapping[str, Any],
    data_json: str | os.PathLike,
    per_key_paths: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    cells: list | None = None,
) -> None:
    """Theory checks of one (distribution, dim): QJL ratios, Beta marginals, Jensen slopes;
    ``cells`` is the (scheme, budget) each per-key file is filed under."""
    from ..theory_checks import theory_checks  # here, not at the top: the Snakefile imports this module (INPUTS)

    digests = load_manifest(data_json, slice_)
    name, dim = slice_["distribution"]["name"], int(slice_["dim"])
    keys = read_cell_tables(list(per_key_paths), "per-key", ("scheme", "budget"), cells=cells, distribution=name,
                            dim=dim)
    frame = theory_checks(slice_, lambda trial: verified_trial(slice_, trial, digests), keys)
    write_frame_atomic(frame, out, provenance(slice_))


#: The stage's inputs: argument -> artifact (kvasym.artifacts); a damaged one is moved aside.
INPUTS = {"data": "data", "per_key": "per_key"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_slice_arguments(parser, "theory")
    add_input_arguments(parser, INPUTS, required=INPUTS, many=("per_key",),
                        notes={"per_key": "every scheme and budget of the (distribution, dim)"})
    parser.add_argument("--cells", help='JSON list: the {"scheme", "budget"} each --per-key file is filed under')
    parser.add_argument("--out", required=True)


def run(args: argparse.Namespace) -> None:
    # by hand from --config: each cell's digest computed as the DAG would give it (hand_run_cells)
    cells = hand_run_cells(args, args.per_key, parse_cells(args.cells, "cells"))
    run_theory(stage_slice(args, "theory"), args.data, args.per_key, args.out, cells)
