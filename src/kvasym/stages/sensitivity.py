"""Stage ``sensitivity`` (rule ``sensitivity``): the model card's calibration on one text.

One job per calibration text (shipped texts disjoint from the end-to-end texts): the model is
loaded once, its reference pass serves, per unit of the allocation (each layer's K and V at
granularity ``layer_side``) and per width, one pass with that unit alone quantized, restarted
from the reference's residual stream at the unit's layer (:func:`kvasym.real.mixed.sensitivity`;
about 0.8 CPU-s a pass at 512 tokens, 360 passes for 30 layers x 2 sides x 6 widths); then the
per-head cache statistics of the same text (:func:`kvasym.real.card.head_statistics`). Writes
both tables atomically as Parquet with the slice in their metadata.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import KvasymError
from ._slice import add_slice_arguments, stage_slice


def run_sensitivity(slice_: dict[str, Any], out: str, out_heads: str) -> None:
    """The sensitivity curves and the head statistics of ``slice_["text"]`` (its first
    ``max_tokens`` tokens): ``slice_`` holds ``text``, ``evaluation_texts`` (refused as a
    calibration text), ``max_tokens``, ``scheme`` (a scheme dict), ``widths``, ``granularity``,
    ``base_seed``, ``norm_dtype``."""
    import pandas as pd

    from ..dataset import provenance, write_frame_atomic
    from ..real.card import head_statistics
    from ..real.endtoend import reference_pass
    from ..real.gguf_model import GGUFLlama
    from ..real.mixed import sensitivity
    from ..real.querybases import text_token_ids
    from ..schemes import scheme_from_dict

    text = str(slice_["text"])
    if text in slice_["evaluation_texts"]:
        raise KvasymError(f"calibration text {text!r} is also an evaluation text (slice key evaluation_texts)")
    spec = dict(slice_["scheme"])
    scheme = scheme_from_dict(spec.pop("name"), spec)
    model = GGUFLlama.load()
    ids = text_token_ids(model, [text], int(slice_["max_tokens"]))[text]
    table = sensitivity(model, reference_pass(model, ids), scheme, [int(w) for w in slice_["widths"]],
                        str(slice_["granularity"]), text=text, base_seed=int(slice_["base_seed"]),
                        norm_dtype=str(slice_["norm_dtype"]))
    meta = {**provenance(slice_), "model_sha256": model.model_sha256}
    write_frame_atomic(pd.DataFrame(table), out, meta)
    write_frame_atomic(head_statistics(model, ids, text), out_heads, meta)


INPUTS: dict[str, str] = {}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_slice_arguments(parser, "sensitivity")
    parser.add_argument("--out", required=True, help="the text's sensitivity table (Parquet)")
    parser.add_argument("--out-heads", required=True, help="the text's per-head cache statistics (Parquet)")


def run(args: argparse.Namespace) -> None:
    run_sensitivity(stage_slice(args, "sensitivity"), args.out, args.out_heads)
