"""Stage ``calibrate`` (rule ``calibrate``): the query-aware bases of one model (default SmolLM2-135M).

One job: the model is loaded once, every calibration text (shipped texts disjoint from the
end-to-end texts, checked here again) is run through the full-precision model, and per (layer,
KV head) the eigenbasis of the post-RoPE queries' second moment is written as ``.npz``
(:func:`kvasym.real.querybases.calibrate`, :func:`~kvasym.real.querybases.save_query_bases`;
about 30 CPU-s for 15 texts of 512 tokens). The e2e, long-context and passkey jobs read it for
the query-aware variants QRKV and QWF (:mod:`kvasym.real.queryaware`).
"""

from __future__ import annotations

import argparse
from typing import Any

from ..artifacts import add_input_arguments
from ._slice import add_slice_arguments, stage_slice

#: The stage's inputs: argument -> artifact; the model file only for an assembled model.
INPUTS = {"model_file": "model_file"}


def run_calibrate(slice_: dict[str, Any], out: str, model_file: str | None = None) -> None:
    """Calibrate on ``slice_["texts"]`` (their first ``max_tokens`` tokens) and write ``out``,
    refusing texts that are also ``slice_["evaluation_texts"]``; the model is
    ``slice_["model"]`` (:func:`kvasym.real.models.slice_model`, read from ``model_file`` when it
    is assembled from chunk packages)."""
    from ..real.models import slice_model
    from ..real.querybases import calibrate, check_disjoint, save_query_bases, text_token_ids

    texts = [str(t) for t in slice_["texts"]]
    check_disjoint(texts, [str(t) for t in slice_["evaluation_texts"]])
    model = slice_model(slice_, model_file)
    bases = calibrate(model, text_token_ids(model, texts, int(slice_["max_tokens"])))
    save_query_bases(bases, out)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_slice_arguments(parser, "calibrate")
    add_input_arguments(parser, INPUTS)
    parser.add_argument("--out", required=True, help="the query-bases file to write (.npz)")


def run(args: argparse.Namespace) -> None:
    run_calibrate(stage_slice(args, "calibrate"), args.out, args.model_file)
