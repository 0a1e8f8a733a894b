"""Stage ``passkey`` (rule ``passkey``): passkey retrieval trials of one model at one length.

One job per model and length ``L`` (or, with ``real.e2e.passkey.parts`` ``P > 1``, ``P`` jobs, part ``p``
running trials ``p, p + P, ...``: :mod:`kvasym.real.jobparts`, joined by ``e2e_stats``): the
model is loaded once; every (depth, trial) prompt is built once
(:func:`kvasym.real.passkey.make_trial`) and scored by greedy decoding of the key's digits in
one teacher-forced pass in full precision (pass ``fp``) and with each scheme's (and
query-aware variant's) cache at each budget (pass ``<scheme>@<budget>``; every trial its own
draw of rotations and sketches), :func:`kvasym.real.passkey_grid.run_grid`. About 3.5 CPU-s a
pass at 1K tokens. The per-trial table is written atomically as Parquet without the passes'
CPU times (kept out so the same config gives the same bytes; each job's log has its cost).
"""

from __future__ import annotations

import argparse
from typing import Any

from ..artifacts import add_input_arguments
from ._slice import add_slice_arguments, add_workers_argument, slice_schemes, stage_slice


def pass_name(scheme: str, budget: int) -> str:
    """The name of a quantized pass: ``"<scheme>@<budget>"``."""
    return f"{scheme}@{int(budget)}"


def run_passkey(slice_: dict[str, Any], out: str, query_bases: str | None = None,
                model_file: str | None = None, workers: int = 1) -> None:
    """Every passkey trial of length ``slice_["length"]`` under every pass.

    ``slice_``: ``length``, ``depths``, ``trials``, ``schemes`` (scheme dicts),
    ``query_variants``, ``budgets``, ``base_seed``, ``norm_dtype``, with ``part`` ``[p, P]``
    this job's share of the trials (:func:`kvasym.real.jobparts.part_slice`); ``query_bases`` the
    calibrated bases' file when ``query_variants`` is not empty; the model is ``slice_["model"]``
    (absent: the primary), read from ``model_file`` when assembled from chunk packages;
    ``workers`` processes run the trials (the rows do not depend on their number).
    """
    import pandas as pd

    from ..dataset import provenance, write_frame_atomic
    from ..real.endtoend import CacheQuantization
    from ..real.models import slice_model
    from ..real.passkey_grid import FP_PASS, run_grid
    from .e2e import check_bases_given, load_bases

    variants = list(slice_["query_variants"])
    check_bases_given(query_bases, variants)
    model = slice_model(slice_, model_file)
    bases = load_bases(model, query_bases, variants)
    base_seed = int(slice_["base_seed"])
    passes: dict[str, Any] = {FP_PASS: None}
    for budget in slice_["budgets"]:
        for scheme in slice_schemes(slice_):
            passes[pass_name(scheme.name, budget)] = CacheQuantization(
                scheme, int(budget), base_seed, "passkey", norm_dtype=slice_["norm_dtype"])
        for variant in variants:
            passes[pass_name(variant, budget)] = query_aware_quantization(variant, int(budget), base_seed, bases,
                                                                          slice_["norm_dtype"])
    frame = run_grid(model, [int(slice_["length"])], [float(d) for d in slice_["depths"]], int(slice_["trials"]),
                     passes, base_seed=base_seed, part=slice_.get("part", (0, 1)), workers=workers)
    frame = frame.drop(columns=["cpu_s"])
    write_frame_atomic(pd.DataFrame(frame), out, {**provenance(slice_), "model_sha256": model.model_sha256})


def query_aware_quantization(variant: str, budget: int, base_seed: int, bases: Any, norm_dtype: str) -> Any:
    """The :class:`~kvasym.real.endtoend.CacheQuantization` of a query-aware variant."""
    from ..real.endtoend import CacheQuantization
    from ..real.queryaware import variant_scheme

    return CacheQuantization(variant_scheme(variant), budget, base_seed, "passkey", norm_dtype=norm_dtype,
                             query_variant=variant, query_bases=bases)


#: The stage's inputs: argument -> artifact (kvasym.artifacts); the bases only with query-aware
#: variants, the model file only for a model assembled from chunk packages.
INPUTS = {"query_bases": "query_bases", "model_file": "model_file"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_slice_arguments(parser, "passkey")
    add_workers_argument(parser)
    add_input_arguments(parser, INPUTS)
    parser.add_argument("--out", required=True, help="the per-trial Parquet file of this length")


def run(args: argparse.Namespace) -> None:
    run_passkey(stage_slice(args, "passkey"), args.out, args.query_bases, args.model_file, args.workers)
