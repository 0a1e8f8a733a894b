"""Stage ``greedy`` (rule ``greedy``): greedy-decode agreement of one model's quantized caches.

One job per model (:meth:`kvasym.study.Study.greedy_slice`): every e2e text gives
``prompts_per_text`` prompts of ``prompt_tokens`` tokens; the full-precision model continues each
greedily for ``new_tokens`` tokens, and each scheme's cache at each budget is scored by the length
of the prefix its own greedy continuation shares with it, read from one teacher-forced pass over
prompt and continuation, beside the teacher-forced KL and top-1 flips on the same positions
(:func:`kvasym.real.greedy.greedy_grid`; the identity is in that module). Writes the per-prompt
table and the per-(scheme, budget) summary (:func:`kvasym.real.greedy.greedy_summary`, texts as
units), atomically.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..artifacts import add_input_arguments
from ..errors import KvasymError
from ._slice import add_slice_arguments, add_workers_argument, slice_schemes, stage_slice


def run_greedy(slice_: dict[str, Any], out_prompts: str, out_summary: str, model_file: str | None = None,
               workers: int = 1) -> None:
    """Every prompt of the slice's texts under every scheme and budget (module docstring).

    ``slice_``: ``texts``, ``prompt_tokens``, ``prompts_per_text``, ``new_tokens``, ``schemes``
    (scheme dicts), ``budgets``, ``causal_chunks``, ``base_seed``, ``norm_dtype``; the model is
    ``slice_["model"]`` (absent: the primary), read from ``model_file`` when assembled from chunk
    packages; ``workers`` processes run the prompts (the rows do not depend on their number).
    """
    from ..dataset import provenance, write_frame_atomic
    from ..real import TEXTS_DIR
    from ..real.greedy import greedy_grid, greedy_summary
    from ..real.models import slice_model

    texts = {}
    model = slice_model(slice_, model_file)
    for name in slice_["texts"]:
        path = TEXTS_DIR / f"{name}.txt"
        if not path.is_file():
            raise KvasymError(f"{path}: no such shipped text (slice key texts)")
        texts[str(name)] = model.encode(path.read_text(encoding="utf-8"))
    frame = greedy_grid(model, texts, prompt_tokens=int(slice_["prompt_tokens"]),
                        prompts_per_text=int(slice_["prompts_per_text"]), n_new=int(slice_["new_tokens"]),
                        schemes=slice_schemes(slice_), budgets=[int(b) for b in slice_["budgets"]],
                        base_seed=int(slice_["base_seed"]), norm_dtype=slice_["norm_dtype"],
                        causal_chunks={k: int(v) for k, v in slice_["causal_chunks"].items()}, workers=workers)
    meta = {**provenance(slice_), "model_sha256": model.model_sha256}
    write_frame_atomic(frame, out_prompts, meta)
    write_frame_atomic(greedy_summary(frame), out_summary, meta)


#: The stage's inputs: argument -> artifact (kvasym.artifacts); the model file only for a model
#: assembled from chunk packages.
INPUTS = {"model_file": "model_file"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_slice_arguments(parser, "greedy")
    add_workers_argument(parser)
    add_input_arguments(parser, INPUTS)
    parser.add_argument("--out-prompts", required=True, help="the per-prompt Parquet file")
    parser.add_argument("--out-summary", required=True, help="the per-(scheme, budget) summary Parquet file")


def run(args: argparse.Namespace) -> None:
    run_greedy(stage_slice(args, "greedy"), args.out_prompts, args.out_summary, args.model_file, args.workers)
