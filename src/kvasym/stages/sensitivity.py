"""Stage ``sensitivity`` (rule ``sensitivity``): the model card's calibration on one text.

``real.card.parts`` jobs per calibration text (shipped texts disjoint from the end-to-end
texts; one by default): the model is loaded once, its reference pass serves, per unit of the
allocation (each layer's K and V at granularity ``layer_side``) and per width, one pass with that
unit alone quantized, restarted from the reference's residual stream at the unit's layer
(:func:`kvasym.real.mixed.sensitivity`; about 0.8 CPU-s a pass at 512 tokens, 360 passes for 30
layers x 2 sides x 6 widths); part ``p`` of ``P`` runs (unit, width) rows ``p, p + P, ...``
(:mod:`kvasym.real.jobparts`), and stage ``card`` joins the parts row for row. Writes the table
atomically as Parquet with the slice (``"part": [p, P]`` with ``P > 1``) in its metadata.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..artifacts import add_input_arguments
from ..errors import KvasymError
from ._slice import add_slice_arguments, add_workers_argument, stage_slice


def run_sensitivity(slice_: dict[str, Any], out: str, model_file: str | None = None, workers: int = 1) -> None:
    """The sensitivity curves of ``slice_["text"]`` (its first ``max_tokens`` tokens), or this
    job's part of them: ``slice_`` holds ``text``, ``evaluation_texts`` (refused as a calibration
    text), ``max_tokens``, ``scheme`` (a scheme dict), ``widths``, ``granularity``, ``base_seed``,
    ``norm_dtype`` and, with parts, ``part`` ``[p, P]``; the model is ``slice_["model"]`` (absent:
    the primary), read from ``model_file`` when assembled from chunk packages; ``workers``
    processes run the rows (the table does not depend on their number)."""
    import pandas as pd

    from ..dataset import provenance, write_frame_atomic
    from ..real.endtoend import reference_pass
    from ..real.mixed import sensitivity
    from ..real.models import slice_model
    from ..real.querybases import text_token_ids
    from ..schemes import scheme_from_dict

    text = str(slice_["text"])
    if text in slice_["evaluation_texts"]:
        raise KvasymError(f"calibration text {text!r} is also an evaluation text (slice key evaluation_texts)")
    spec = dict(slice_["scheme"])
    scheme = scheme_from_dict(spec.pop("name"), spec)
    model = slice_model(slice_, model_file)
    ids = text_token_ids(model, [text], int(slice_["max_tokens"]))[text]
    table = sensitivity(model, reference_pass(model, ids), scheme, [int(w) for w in slice_["widths"]],
                        str(slice_["granularity"]), text=text, base_seed=int(slice_["base_seed"]),
                        norm_dtype=str(slice_["norm_dtype"]), part=slice_.get("part", (0, 1)), workers=workers)
    write_frame_atomic(pd.DataFrame(table), out, {**provenance(slice_), "model_sha256": model.model_sha256})


#: The stage's inputs: the model file only for a model assembled from chunk packages.
INPUTS = {"model_file": "model_file"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_slice_arguments(parser, "sensitivity")
    add_workers_argument(parser)
    add_input_arguments(parser, INPUTS)
    parser.add_argument("--out", required=True, help="the text's sensitivity table, or this part of it (Parquet)")


def run(args: argparse.Namespace) -> None:
    run_sensitivity(stage_slice(args, "sensitivity"), args.out, args.model_file, args.workers)
