"""Stage ``card`` (rule ``card``): the KV-cache card of one model and its measured allocation.

One job per model: reads every calibration text's sensitivity table (stage ``sensitivity``: its parts
joined), measures the calibration texts' per-head cache statistics, chooses at each budget's
uniform rate the widths of least predicted KL (:func:`kvasym.real.mixed.measured_allocation`),
runs on every end-to-end text and draw the uniform map (the ``e2e`` stage's pass of the scheme,
bit for bit), the allocation's map and the map of the allocation with one width per layer (K and
V tied, at granularity ``layer_side``: what K != V widths add) (:func:`kvasym.real.card.evaluation_rows`;
3 passes x budgets x texts x draws, ~3 CPU-s each at 512 tokens on SmolLM2), and writes the
per-position rows, their summary and paired comparisons (:mod:`kvasym.real.endtoend_stats`: the
allocation against the uniform map, then against the tied one), the allocation tables, the
head statistics, and the card's measurements as JSON (:func:`kvasym.real.card.card_measurements`).
It reads no end-to-end result, so that it runs beside the end-to-end jobs: stage ``card_page``
completes the card with the end-to-end summary (stage ``e2e_stats``) as its frontier, and
renders its page.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from ..artifacts import add_input_arguments
from ._slice import add_slice_arguments, add_workers_argument, stage_slice

#: Columns of the per-layer sensitivity table (the calibration texts' means per layer, side, width).
LAYER_COLUMNS = ("layer", "side", "width", "bits", "kl", "dnll", "top1")

OUTPUTS = ("measurements", "allocation", "allocation_tied", "layers", "passes", "summary", "comparisons", "heads")


def run_card(slice_: dict[str, Any], sensitivity_paths: Sequence[str], out: dict[str, str],
             model_file: str | None = None, workers: int = 1) -> None:
    """The card's tables and pages (``out``: output name -> path); ``slice_`` holds ``texts``
    (evaluation), ``calibration_texts``, ``max_tokens``, ``scheme`` (a scheme dict), ``budgets``,
    ``widths``, ``granularity``, ``draws``, ``base_seed``, ``norm_dtype``.

    ``sensitivity_paths``: the calibration texts' sensitivity tables (stage ``sensitivity``), each
    text's parts joined row for row (:func:`kvasym.real.jobparts.read_job_parts`). The per-head
    cache statistics of the calibration texts (:func:`kvasym.real.card.head_statistics`, one
    full-precision pass a text) are computed here, where the model is loaded anyway, so that a
    sensitivity job can be cut into parts. The model is ``slice_["model"]`` (absent: the primary),
    read from ``model_file`` when assembled from chunk packages. ``workers`` processes run each
    text's evaluation passes (the rows do not depend on their number)."""
    import json

    import pandas as pd

    from ..atomic import write_text_atomic
    from ..dataset import provenance, write_frame_atomic
    from ..real.card import (
        ALLOCATION_PURPOSE,
        allocated_label,
        card_measurements,
        evaluation_rows,
        head_statistics,
        model_description,
        tied_label,
    )
    from ..real.endtoend_stats import compare_schemes, summarize
    from ..real.models import slice_model
    from ..real.jobparts import read_job_parts
    from ..real.mixed import measured_allocation
    from ..real.querybases import check_disjoint, text_token_ids
    from ..schemes import scheme_from_dict

    texts = [str(t) for t in slice_["texts"]]
    calibration = [str(t) for t in slice_["calibration_texts"]]
    check_disjoint(calibration, texts, ALLOCATION_PURPOSE)
    spec = dict(slice_["scheme"])
    reference = str(spec["name"])
    scheme = scheme_from_dict(spec.pop("name"), spec)
    budgets = [int(b) for b in slice_["budgets"]]
    sensitivity = read_job_parts(sensitivity_paths, ["layer", "side", "kv_head", "width"])  # per text
    model = slice_model(slice_, model_file)
    calibration_ids = text_token_ids(model, calibration, int(slice_["max_tokens"]))
    heads = pd.concat([head_statistics(model, calibration_ids[text], text) for text in calibration],
                      ignore_index=True)
    c = model.config
    granularity = str(slice_["granularity"])
    allocation = measured_allocation(sensitivity, len(model.layers), c.n_kv_heads, granularity, budgets)
    # one width per layer (K and V tied), from the same sensitivities: what K != V widths add
    tied = (measured_allocation(sensitivity, len(model.layers), c.n_kv_heads, granularity, budgets, tie_sides=True)
            if granularity != "layer" else None)
    passes = evaluation_rows(model, text_token_ids(model, texts, int(slice_["max_tokens"])), allocation, scheme,
                             reference=reference, budgets=budgets, draws=int(slice_["draws"]),
                             base_seed=int(slice_["base_seed"]), norm_dtype=str(slice_["norm_dtype"]), tied=tied,
                             workers=workers)
    summary = summarize(passes)
    label = allocated_label(reference)
    # the allocation against the uniform map, then (with K and V apart) against the tied allocation
    comparisons = pd.concat([compare_schemes(passes, [label, reference]),
                             *([compare_schemes(passes, [label, tied_label(reference)])] if tied is not None else [])],
                            ignore_index=True)
    settings = {"calibration_texts": calibration, "evaluation_texts": texts, "tokens": int(slice_["max_tokens"]),
                "budgets": budgets, "widths": [int(w) for w in slice_["widths"]],
                "granularity": str(slice_["granularity"]), "reference": reference, "draws": int(slice_["draws"]),
                "base_seed": int(slice_["base_seed"]), "norm_dtype": str(slice_["norm_dtype"])}
    card = card_measurements(model=model_description(model), settings=settings, heads=heads, sensitivity=sensitivity,
                             allocation=allocation, comparisons=comparisons, reference=reference)
    meta = {**provenance(slice_), "model_sha256": model.model_sha256}
    layers = pd.DataFrame(card["layer_sensitivity"], columns=list(LAYER_COLUMNS))
    no_tied = allocation.iloc[:0]  # granularity "layer": nothing to tie (the columns and dtypes kept)
    for name, frame in (("allocation", allocation), ("allocation_tied", no_tied if tied is None else tied),
                        ("layers", layers), ("passes", passes), ("summary", summary), ("comparisons", comparisons),
                        ("heads", heads)):
        write_frame_atomic(frame, out[name], meta)
    write_text_atomic(json.dumps(card, indent=1, sort_keys=True) + "\n", out["measurements"])


#: The stage's inputs: argument -> artifact (kvasym.artifacts); a damaged one is moved aside.
INPUTS = {"sensitivity": "card_sensitivity", "model_file": "model_file"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_slice_arguments(parser, "card")
    add_workers_argument(parser)
    add_input_arguments(parser, INPUTS, required=("sensitivity",), many=("sensitivity",))
    for name in OUTPUTS:
        parser.add_argument(f"--out-{name.replace('_', '-')}", required=True, help=f"the card's {name} output")


def run(args: argparse.Namespace) -> None:
    run_card(stage_slice(args, "card"), args.sensitivity,
             {name: getattr(args, f"out_{name}") for name in OUTPUTS}, args.model_file, args.workers)
