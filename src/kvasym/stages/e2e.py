"""Stage ``e2e`` (rule ``e2e``): the end-to-end passes of one model over one shipped text.

One job per text: the model is loaded once (~1.8 CPU-s) and the reference pass (its residual streams
and next-token logits) serves every quantized pass of the text: each RoPE mode x draw x scheme
x budget with every layer's cache quantized, then each sensitivity scheme with one layer at a
time quantized at the lowest budget (:func:`kvasym.real.endtoend.evaluate_text`; about 3 CPU-s
a pass at 512 tokens). The per-position table (text, draw, position, scheme, budget, rope, own,
layer, nll, nll_ref, kl, top1 and the measured bits per coordinate) is written atomically as
Parquet with the slice in its metadata.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..artifacts import add_input_arguments
from ..errors import KvasymError
from ._slice import add_slice_arguments, add_workers_argument, slice_schemes, stage_slice


def check_bases_given(path: str | None, variants: list[str]) -> None:
    """A KvasymError, before any model is loaded, when query-aware variants are asked for
    without the query-bases file."""
    if variants and path is None:
        raise KvasymError(f"query-aware variants {variants} need the query-bases file (--query-bases, rule calibrate)")


def load_bases(model: Any, path: str | None, variants: list[str]) -> Any:
    """The query-aware bases at ``path`` for ``model`` (None without variants); a KvasymError
    naming the slice key when variants are asked for without the file."""
    check_bases_given(path, variants)
    if not variants:
        return None
    from ..real.querybases import load_query_bases

    c = model.config
    return load_query_bases(path, model.model_sha256, (len(model.layers), c.n_kv_heads, c.head_dim))


def run_e2e(slice_: dict[str, Any], out: str, query_bases: str | None = None, model_file: str | None = None,
            workers: int = 1) -> None:
    """Every end-to-end pass of the text ``slice_["text"]`` (its first ``max_tokens`` tokens) on
    the model ``slice_["model"]`` (absent: the primary, SmolLM2-135M; another is read from
    ``model_file``, :func:`kvasym.real.models.slice_model`).

    ``slice_``: ``text``, ``max_tokens``, ``schemes`` (list of scheme dicts), ``budgets``,
    ``base_seed``, ``norm_dtype`` and ``e2e`` (``draws``, ``rope`` (mode -> schemes),
    ``extra_budgets``, ``own``, ``sensitivity_layers``, ``sensitivity_schemes``, ``query_aware``,
    ``recent_windows``, ``causal_chunks``, optionally ``global_only``), optionally ``part`` (``[p, P]``: only
    part ``p`` of ``P`` of the passes, :func:`kvasym.real.endtoend.select_part`, joined by stage ``e2e_join``);
    ``query_bases`` the calibrated bases' file when ``query_aware`` names variants; ``workers``
    processes run the quantized passes (the rows do not depend on their number).
    """
    import pandas as pd

    from ..dataset import provenance, write_frame_atomic
    from ..real import TEXTS_DIR
    from ..real.endtoend import evaluate_text
    from ..real.models import slice_model
    path = TEXTS_DIR / f"{slice_['text']}.txt"
    if not path.is_file():
        raise KvasymError(f"{path}: no such shipped text (slice key text)")
    check_bases_given(query_bases, list(slice_["e2e"].get("query_aware", [])))
    schemes = slice_schemes(slice_)
    settings = slice_["e2e"]
    budgets = [int(b) for b in slice_["budgets"]]
    model = slice_model(slice_, model_file)
    ids = model.encode(path.read_text(encoding="utf-8"))[: int(slice_["max_tokens"])]
    rope = settings["rope"]
    variants = list(settings.get("query_aware", []))
    bases = load_bases(model, query_bases, variants)
    columns = evaluate_text(model, ids, schemes, budgets, text=str(slice_["text"]), base_seed=int(slice_["base_seed"]),
                            ropes=list(rope), rope_schemes=rope, own=settings["own"], draws=int(settings["draws"]),
                            extra_budgets=settings["extra_budgets"], sensitivity_budget=min(budgets),
                            sensitivity_layers=settings["sensitivity_layers"],
                            sensitivity_schemes=settings["sensitivity_schemes"], norm_dtype=slice_["norm_dtype"],
                            query_bases=bases, query_variants=variants,
                            recent_windows=settings.get("recent_windows") or None,
                            causal_chunks=settings.get("causal_chunks") or None,
                            global_only=list(settings.get("global_only", ())),
                            part=tuple(slice_.get("part", (0, 1))), workers=workers)
    write_frame_atomic(pd.DataFrame(columns), out, {**provenance(slice_), "model_sha256": model.model_sha256})


#: The stage's inputs: argument -> artifact (kvasym.artifacts); the bases only with query-aware
#: variants, the model file only for a model assembled from chunk packages.
INPUTS = {"query_bases": "query_bases", "model_file": "model_file"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_slice_arguments(parser, "e2e")
    add_workers_argument(parser)
    add_input_arguments(parser, INPUTS)
    parser.add_argument("--out", required=True, help="the per-position Parquet file of the text")


def run(args: argparse.Namespace) -> None:
    run_e2e(stage_slice(args, "e2e"), args.out, args.query_bases, args.model_file, args.workers)
