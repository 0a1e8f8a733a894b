"""Stage ``data`` (rule ``data``): the data manifest of one (distribution, dim).

Draws every trial from its identity-keyed seeds and writes ``results/data/<dist>/d<dim>.json``
with each trial's SHA-256 digest and K/V statistics (:func:`kvasym.manifest.build_manifest`),
and the digest of all that (``content_sha256``), which every reader checks
(:func:`kvasym.manifest.read_manifest`): a statistic edited by hand is refused, not tabled.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from ..atomic import write_json_atomic
from ..manifest import build_manifest
from ._slice import add_slice_arguments, stage_slice


def run_data(slice_: Mapping[str, Any], out_json: str) -> None:
    """Write the manifest of the data of ``slice_`` to ``out_json`` (atomically)."""
    write_json_atomic(build_manifest(slice_), out_json)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_slice_arguments(parser, "data")
    parser.add_argument("--out", required=True, help="the manifest (.json)")


def run(args: argparse.Namespace) -> None:
    run_data(stage_slice(args, "data"), args.out)
