"""Stage ``quantize`` (rule ``quantize``): the packed K and V caches of one cell.

For every trial of (distribution, dim) the data are read from the data rule's stored trials and
checked against the manifest, then quantized with the cell's scheme and budget (rotation and QJL
seeds derived from the trial's identity and the cache side) and stored as ``t<trial>.K`` /
``t<trial>.V`` in one ``.npz``: the compressed artifact itself, with its measured bits per
coordinate.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

from ..cache import PackedCache, save_packed
from ..evaluate import quantize_pair
from ..manifest import load_manifest, stored_trials, trials_path
from ._slice import add_slice_arguments, slice_scheme, stage_slice


def cache_identity_name(slice_: Mapping[str, Any]) -> str:
    """The distribution name in the rotation and QJL seeds of a cell: the parent's for a
    query-model variant (``keys_of``: same keys, so the same packed caches), else its own."""
    return slice_["distribution"].get("keys_of") or slice_["distribution"]["name"]


def packed_cache_name(trial: int, side: str) -> str:
    """The name of one trial's cache side inside a cell's packed file."""
    return f"t{trial}.{side}"


def run_quantize(slice_: Mapping[str, Any], data_json: str | os.PathLike, out_npz: str | os.PathLike,
                 trials_npy: str | os.PathLike | None = None) -> None:
    """Packed K and V caches of every trial of one cell, in one .npz; the trials are read from
    ``trials_npy`` (default: beside the manifest, :func:`kvasym.manifest.trials_path`)."""
    digests = load_manifest(data_json, slice_)
    read_trial = stored_trials(slice_, trials_path(data_json) if trials_npy is None else trials_npy, digests)
    scheme = slice_scheme(slice_)
    caches: dict[str, PackedCache] = {}
    for trial in range(slice_["trials"]):
        data = read_trial(trial)
        identity = (cache_identity_name(slice_), slice_["dim"], trial)
        pair = quantize_pair(data.keys, data.values, scheme, slice_["budget"], base_seed=slice_["base_seed"],
                             identity=identity, norm_dtype=slice_["norm_dtype"])
        for side, cache in pair.items():
            caches[packed_cache_name(trial, side)] = cache
    save_packed(out_npz, caches)


#: Arguments naming files other rules write (moved aside when damaged: kvasym.stages).
INTERMEDIATE_INPUTS = ("data", "trials")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_slice_arguments(parser, "quantize")
    parser.add_argument("--data", required=True, help="the data manifest of the cell's (distribution, dim)")
    parser.add_argument("--trials", help="the trials of the data manifest (default: beside it, d<dim>.trials.npy)")
    parser.add_argument("--out", required=True, help="the packed caches (.npz)")


def run(args: argparse.Namespace) -> None:
    args.trials = args.trials or str(trials_path(args.data))  # named, so a damaged one is moved aside
    run_quantize(stage_slice(args, "quantize"), args.data, args.out, args.trials)
