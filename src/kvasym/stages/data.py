"""Stage ``data`` (rule ``data``): the data manifest and the trials of one (distribution, dim).

Draws every trial from its identity-keyed seeds and writes ``results/data/<dist>/d<dim>.json``
with each trial's SHA-256 digest and K/V statistics (:func:`kvasym.manifest.build_manifest`),
and the digest of all that (``content_sha256``), which every reader checks
(:func:`kvasym.manifest.read_manifest`): a statistic edited by hand is refused, not tabled.
Beside it, ``d<dim>.trials.npy`` holds the drawn K, V and Q of every trial
(:func:`kvasym.manifest.write_trials`), which the cell's quantize and metrics jobs read instead
of drawing them again.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from ..manifest import write_trials
from ._slice import add_slice_arguments, stage_slice


def run_data(slice_: Mapping[str, Any], out_json: str, out_trials: str | None = None) -> None:
    """Write the manifest of the data of ``slice_`` to ``out_json`` and its trials to
    ``out_trials`` (default: beside it, :func:`kvasym.manifest.trials_path`), atomically."""
    write_trials(slice_, out_json, out_trials)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_slice_arguments(parser, "data")
    parser.add_argument("--out", required=True, help="the manifest (.json)")
    parser.add_argument("--trials", help="the trials (.npy; default: beside --out, d<dim>.trials.npy)")


def run(args: argparse.Namespace) -> None:
    run_data(stage_slice(args, "data"), args.out, args.trials)
