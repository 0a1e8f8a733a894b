"""Stage ``real_cachestats`` (rule ``real_cachestats``): statistics of the real caches.

Tail index (Hill), participation ratio, top-channel and mean-vector energy shares per text, layer,
head and tensor of the SmolLM2 captures (:func:`kvasym.real.cachestats.captures_statistics`),
for the real-vs-synthetic table.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path

from ..artifacts import add_input_arguments
from ..cachestats import TOP_CHANNELS
from ..real.cachestats import CACHESTATS_FORMAT, TENSORS, captures_statistics


def run_real_cachestats(capture_paths: Sequence[str | os.PathLike], out: str | os.PathLike) -> Path:
    """Write the statistics of every capture to ``out`` (Parquet, atomically) with provenance
    metadata (the captures' texts, files and the statistics' definition); returns ``out``."""
    from ..dataset import provenance, write_frame_atomic

    frame = captures_statistics(capture_paths)
    slice_ = {"format": CACHESTATS_FORMAT, "captures": [Path(p).name for p in capture_paths],
              "top_channels": TOP_CHANNELS, "tensors": list(TENSORS)}
    meta = {**provenance(slice_), "texts": json.dumps(sorted(set(frame["text"])))}
    write_frame_atomic(frame, out, meta)
    return Path(out)


#: The stage's inputs: argument -> artifact (kvasym.artifacts); a damaged one is moved aside.
INPUTS = {"captures": "captures"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_input_arguments(parser, INPUTS, required=INPUTS, many=INPUTS)
    parser.add_argument("--out", required=True, help="the Parquet table to write")


def run(args: argparse.Namespace) -> None:
    print(run_real_cachestats(args.captures, args.out))
