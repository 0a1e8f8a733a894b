"""Stage ``e2e_join`` (rule ``e2e_join``): one text's end-to-end passes from the parts rule ``e2e`` ran.

With ``real.e2e.parts = P``, the passes of one (model, text) run as ``P`` jobs side by side, part
``p`` taking passes ``p, p + P, ...`` of the text's plan (:func:`kvasym.real.endtoend.select_part`).
This stage checks that each part file is part ``p`` of ``P`` of this very text and configuration
(its provenance slice is the text's slice plus ``"part": [p, P]``; with ``P = 1``, the text's
slice itself) and of one model file, puts their rows back in the plan's order
(:func:`kvasym.real.endtoend.join_parts`) and writes the text's per-position table atomically with
the text's slice as its provenance: row for row what one job running every pass writes.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..errors import KvasymError
from ._slice import add_slice_arguments, stage_slice


def part_slice(slice_: dict[str, Any], part: int, parts: int) -> dict[str, Any]:
    """The provenance slice of part ``part`` of ``parts`` of the text whose slice is ``slice_``
    (:func:`kvasym.real.jobparts.part_slice`, the one rule of every model job's parts)."""
    from ..real.jobparts import part_slice as job_part_slice

    return job_part_slice(slice_, (part, parts))


def join_text(slice_: dict[str, Any], part_paths: list[str], out: str) -> None:
    """Check the parts' provenance, join their rows and write the text's table (module docstring)."""
    import pandas as pd

    from ..dataset import provenance, read_metadata, read_parquet_checked, write_frame_atomic
    from ..real.endtoend import join_parts

    if not part_paths:
        raise KvasymError("e2e_join needs at least one part (--parts)")
    parts = len(part_paths)
    models = set()
    for p, path in enumerate(part_paths):
        meta = read_metadata(path)
        try:
            got = json.loads(meta.get("config_slice", "null"))
        except ValueError:
            raise KvasymError(f"{path}: its provenance (config_slice) is not JSON") from None
        if got != part_slice(slice_, p, parts):
            raise KvasymError(f"{path}: not part {p} of {parts} of text {slice_.get('text')!r} under this "
                              "configuration (its provenance slice differs); rerun rule e2e for it")
        models.add(meta.get("model_sha256"))
    if len(models) != 1:
        raise KvasymError(f"the parts {part_paths} were run on different model files ({sorted(map(str, models))})")
    frames = [read_parquet_checked(path) for path in part_paths]
    n_positions = int(frames[0]["position"].max()) + 1 if len(frames[0]) else 0
    if n_positions < 1:
        raise KvasymError(f"{part_paths[0]}: holds no pass")
    joined = join_parts(frames, n_positions)
    write_frame_atomic(pd.DataFrame(joined), out, {**provenance(slice_), "model_sha256": models.pop()})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_slice_arguments(parser, "e2e_join")
    parser.add_argument("--parts", nargs="+", required=True,
                        help="the text's part files (rule e2e), part 0 first")
    parser.add_argument("--out", required=True, help="the per-position Parquet file of the text")


def run(args: argparse.Namespace) -> None:
    join_text(stage_slice(args, "e2e_join"), list(args.parts), args.out)
