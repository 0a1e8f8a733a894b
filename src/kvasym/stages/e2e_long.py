"""Stage ``e2e_long`` (rule ``e2e_long``): long-context passes of one model at one window length.

One job per model and window length ``L`` (or, with ``real.e2e.long_context.parts`` ``P > 1``, ``P`` jobs,
part ``p`` running windows ``p, p + P, ...``: :mod:`kvasym.real.jobparts`, joined by
``e2e_stats``): the model is loaded once, the long offline text (Python's
pydoc topics, :mod:`kvasym.real.longtext`; its source and SHA-256 go into the table's metadata)
is cut into its first ``windows`` disjoint windows of ``L`` tokens, and every window runs the
reference pass and one all-layer pass per scheme (and query-aware variant) and budget, keys
after RoPE (:func:`kvasym.real.longcontext.evaluate_windows`; each window its own draw of
rotations and sketches: the unit of the long-context statistics). A pass costs about 3.6, 10,
28 and 95 CPU-s at 1K, 2K, 4K and 8K tokens (measured before cf068b6; 2.8, 19 and 66 s at
1K, 4K and 8K after). With ``calibration_windows`` the query-aware variants run a second time
with bases calibrated on the long text's last windows of this length (one full-precision pass
each, :func:`kvasym.real.longcontext.window_bases`). The per-position table (the e2e columns plus
``context`` and ``window``) is written atomically as Parquet with the slice in its metadata.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..artifacts import add_input_arguments
from ._slice import add_slice_arguments, add_workers_argument, slice_schemes, stage_slice


def run_e2e_long(slice_: dict[str, Any], out: str, query_bases: str | None = None,
                 model_file: str | None = None, workers: int = 1) -> None:
    """Every long-context pass of the windows of length ``slice_["length"]``.

    ``slice_``: ``length``, ``windows``, ``calibration_windows`` (the variants also run with
    bases calibrated on that many long-text windows of this length, scheme ``<variant>+W``),
    ``own``, ``schemes`` (scheme dicts), ``query_variants``, ``budgets``, ``base_seed``,
    ``norm_dtype``, with ``part`` ``[p, P]`` this job's share of the windows
    (:func:`kvasym.real.jobparts.part_slice`); ``query_bases`` the calibrated bases' file when ``query_variants`` is not
    empty; the model is ``slice_["model"]`` (absent: the primary), read from ``model_file`` when
    assembled from chunk packages (:func:`kvasym.real.models.slice_model`); ``workers`` processes
    run each window's quantized passes (the rows do not depend on their number).
    """
    import json

    import pandas as pd

    from ..dataset import provenance, write_frame_atomic
    from ..real.longcontext import evaluate_windows
    from ..real.longtext import long_text_ids, long_text_source
    from ..real.models import slice_model
    from .e2e import check_bases_given, load_bases

    variants = list(slice_["query_variants"])
    check_bases_given(query_bases, variants)
    model = slice_model(slice_, model_file)
    bases = load_bases(model, query_bases, variants)
    options: dict[str, Any] = {"query_bases": bases, "query_variants": variants} if variants else {}
    schemes = slice_schemes(slice_)
    columns = evaluate_windows(model, long_text_ids(model), [int(slice_["length"])], int(slice_["windows"]),
                               schemes, [int(b) for b in slice_["budgets"]], base_seed=int(slice_["base_seed"]),
                               own=slice_["own"], norm_dtype=slice_["norm_dtype"],
                               calibration_windows=int(slice_["calibration_windows"]), part=slice_.get("part", (0, 1)),
                               workers=workers, **options)
    source = long_text_source()
    meta = {**provenance(slice_), "model_sha256": model.model_sha256,
            "long_text": json.dumps({key: str(value) for key, value in vars(source).items()}, sort_keys=True)}
    write_frame_atomic(pd.DataFrame(columns), out, meta)


#: The stage's inputs: argument -> artifact (kvasym.artifacts); the bases only with query-aware
#: variants, the model file only for a model assembled from chunk packages.
INPUTS = {"query_bases": "query_bases", "model_file": "model_file"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_slice_arguments(parser, "e2e_long")
    add_workers_argument(parser)
    add_input_arguments(parser, INPUTS)
    parser.add_argument("--out", required=True, help="the per-position Parquet file of the windows of this length")


def run(args: argparse.Namespace) -> None:
    run_e2e_long(stage_slice(args, "e2e_long"), args.out, args.query_bases, args.model_file, args.workers)
