"""Stage ``e2e_stats`` (rule ``e2e_stats``): the end-to-end results of every text, summarized.

Reads the per-position tables of the ``e2e`` jobs (one per text) and the gathered per-head
summary (for the real rows' mean attention KL), and writes five tables
(:mod:`kvasym.real.endtoend_stats`; the unit of every interval and test is a (text, draw)
pair): ``summary`` (llama.cpp's measures: perplexity ratio, next-token KL mean and
percentiles, top-1 agreement and flip share, RMS Δp, the measured bits per value and the
whole cache's bytes per token at 4K tokens, per model, scheme, budget and RoPE
mode), ``comparisons`` (scheme pairs at the same budget), ``equal_bits`` (ordered scheme
pairs at the first scheme's measured rate, the second interpolated), ``sensitivity`` (layer by
scheme) and ``agreement`` (Spearman's rho between the end-to-end and the per-head ranking of
the cells, per RoPE mode, measure (perplexity, KL) and scope (the study's schemes, all)); with
long-context windows (stage ``e2e_long``) ``long_summary`` (the same measures per window length,
windows as units), ``long_positions`` (the damage against the context a position has
read) and ``long_comparisons`` (every scheme against RKV per window length, paired by window),
and with passkey trials (stage ``passkey``) ``passkey_summary`` (accuracy with Clopper-Pearson
intervals, McNemar's exact test against full precision).
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Sequence
from typing import Any

from ..artifacts import add_input_arguments
from ..errors import KvasymError
from ._slice import add_slice_arguments, add_workers_argument, stage_slice

OUTPUTS = ("summary", "comparisons", "equal_bits", "sensitivity", "agreement")

#: Outputs written only with the input named: output -> input argument.
OPTIONAL_OUTPUTS = {"long_summary": "long", "long_positions": "long", "long_comparisons": "long",
                    "passkey_summary": "passkey"}


def model_tables(frame: Any, schemes: Sequence[str], study_schemes: Sequence[str], attention: Any,
                 settings: dict[str, int], memory_tokens: int, model: str) -> dict[str, Callable[[], Any]]:
    """What makes the summary (with the cache's memory at ``memory_tokens`` tokens), comparisons,
    equal-bits, sensitivity and (with per-head rows of the model) agreement tables of one model's
    passes: table name -> a function of no argument returning it (so that the tables can be
    computed on worker processes, :func:`kvasym.workers.map_ordered`)."""
    import pandas as pd

    from ..real.endtoend_stats import (
        AGREEMENT_COLUMNS,
        ATTENTION_DISTRIBUTION,
        compare_equal_bits,
        compare_schemes,
        memory_columns,
        pareto_front,
        rank_agreement,
        sensitivity,
        summarize,
    )
    from ..real.models import model_entry

    def agreement() -> Any:
        rows = []
        for rope in sorted(frame["rope"].unique()) if attention is not None else ():
            rows_of = attention[(attention["distribution"] == ATTENTION_DISTRIBUTION[rope])
                                & (attention["sharpness"] == 1.0)]
            if rows_of.empty:
                continue  # the per-head real rows of this RoPE mode are not in the gathered summary
            for scope, chosen in (("study", list(study_schemes)), ("all", list(schemes))):
                for measure in ("ppl", "kl"):
                    rows.append(rank_agreement(frame, rows_of, rope, measure=measure, schemes=chosen, scope=scope,
                                               **settings))
        return pd.DataFrame(rows, columns=list(AGREEMENT_COLUMNS))

    return {
        "summary": lambda: pareto_front(memory_columns(summarize(frame), frame, model_entry(model), memory_tokens)),
        "comparisons": lambda: compare_schemes(frame, schemes),
        "equal_bits": lambda: compare_equal_bits(frame, schemes),
        "sensitivity": lambda: sensitivity(frame),
        "agreement": agreement,
    }


def run_e2e_stats(slice_: dict[str, Any], text_paths: Sequence[str], gathered_summary: str | None,
                  out: dict[str, str], long_paths: Sequence[str] = (), passkey_paths: Sequence[str] = (),
                  frontier_points: str | None = None, workers: int = 1) -> None:
    """The five end-to-end tables of ``text_paths`` (``out``: table name -> path), and the
    long-context and passkey tables of ``long_paths`` and ``passkey_paths`` when given.

    The texts, windows and trials of every model (:func:`kvasym.real.models.text_model`: the primary's, then those
    of ``slice_["models"]``) are summarized apart and their tables stacked with a ``model``
    column first. The per-head mean attention KL of the rank agreement (the primary model only: its
    captures give the per-head rows) comes from ``frontier_points`` when given (stage
    ``frontier``: every scheme measured on the real rows, the frontier's and the query-aware
    variants' too), else from ``gathered_summary`` (the grid's schemes only); one of the two is
    needed (the DAG gives the summary only to a config without a frontier,
    :meth:`kvasym.wiring.Wiring.e2e_attention_summary`)."""
    import pandas as pd

    from ..dataset import provenance, read_parquet_checked, write_frame_atomic
    from ..real.jobparts import read_job_parts
    from ..real.model_registry import MEMORY_TOKENS, PRIMARY
    from ..real.models import with_model
    from ..workers import map_ordered

    if not text_paths:
        raise KvasymError("e2e_stats needs at least one per-text table (--texts)")
    if not frontier_points and not gathered_summary:
        raise KvasymError("e2e_stats needs the real rows' attention KL: --frontier (the frontier's points) or "
                          "--summary (the gathered summary)")
    models = {PRIMARY: {"schemes": slice_["schemes"], "study_schemes": slice_["study_schemes"]},
              **dict(slice_.get("models") or {})}
    paths_of = _by_model(text_paths, list(models))
    settings = {key: int(slice_[key]) for key in ("n_boot", "base_seed")}
    memory_tokens = int(slice_.get("memory_tokens", MEMORY_TOKENS))
    # every (table, model) as a function, in the order the tables stack; then run on the workers
    makers: list[tuple[str, str, Callable[[], Any]]] = []
    for model in paths_of:
        frame = pd.concat([read_parquet_checked(p) for p in paths_of[model]], ignore_index=True)
        attention = (read_parquet_checked(frontier_points if frontier_points else gathered_summary)
                     if model == PRIMARY else None)
        makers += [(name, model, make) for name, make in model_tables(
            frame, models[model]["schemes"], models[model]["study_schemes"], attention, settings, memory_tokens,
            model).items()]
    if long_paths:
        from ..real.endtoend_stats import compare_long, damage_by_position, summarize_long

        for model, paths in _by_model(long_paths, list(models)).items():
            long = read_job_parts(paths, ["window"])  # one job (or its parts) per length
            makers += [("long_summary", model, functools.partial(summarize_long, long)),
                       ("long_positions", model, functools.partial(damage_by_position, long)),
                       ("long_comparisons", model, functools.partial(compare_long, long))]
    if passkey_paths:
        from ..real.passkey_grid import summarize_grid

        for model, paths in _by_model(passkey_paths, list(models)).items():
            trials = read_job_parts(paths, ["depth", "trial"])  # one job (or its parts) per length
            makers.append(("passkey_summary", model, functools.partial(summarize_grid, trials)))
    parts: dict[str, list[Any]] = {}
    computed = map_ordered(lambda maker: maker[2](), makers, workers)
    for (name, model, _), table in zip(makers, computed):
        parts.setdefault(name, []).append(with_model(table, model))
    tables = {name: pd.concat(frames, ignore_index=True) for name, frames in parts.items()}
    meta = provenance(slice_)
    for name in tables:
        write_frame_atomic(tables[name], out[name], meta)


def _by_model(paths: Sequence[str], models: Sequence[str]) -> dict[str, list[str]]:
    """``paths`` grouped by their model (:func:`kvasym.real.models.text_model`), in ``models``'
    order, each group in the paths' order; a model the slice does not name is refused, naming the
    file."""
    from ..real.models import text_model

    paths_of: dict[str, list[str]] = {}
    for p in paths:
        model = text_model(p)
        if model not in models:
            raise KvasymError(f"{p}: passes of model {model!r}, which the slice's models {sorted(models)} do not "
                              "name (slice key models)")
        paths_of.setdefault(model, []).append(p)
    return {model: paths_of[model] for model in models if model in paths_of}


#: The stage's inputs: argument -> artifact (kvasym.artifacts); a damaged one is moved aside.
INPUTS = {"texts": "e2e_text", "summary": "summary", "long": "e2e_long_window", "passkey": "passkey_trials",
          "frontier": "frontier_points"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_slice_arguments(parser, "e2e_stats")
    add_workers_argument(parser)
    add_input_arguments(parser, INPUTS, required=("texts",), many=("texts", "long", "passkey"),
                        notes={"summary": "read without --frontier only", "frontier": "read in place of --summary"})
    for name in (*OUTPUTS, *OPTIONAL_OUTPUTS):
        parser.add_argument(f"--out-{name.replace('_', '-')}", required=name in OUTPUTS,
                            help=f"the end-to-end {name} table (Parquet)"
                            + (f"; with --{OPTIONAL_OUTPUTS[name]} only" if name in OPTIONAL_OUTPUTS else ""))


def run(args: argparse.Namespace) -> None:
    for name, given in OPTIONAL_OUTPUTS.items():
        if bool(getattr(args, given)) != bool(getattr(args, f"out_{name}")):
            raise KvasymError(f"e2e_stats: --out-{name.replace('_', '-')} goes with --{given} (one was given "
                              "without the other)")
    run_e2e_stats(stage_slice(args, "e2e_stats"), args.texts, args.summary,
                  {name: getattr(args, f"out_{name}") for name in (*OUTPUTS, *OPTIONAL_OUTPUTS)},
                  args.long, args.passkey, args.frontier, args.workers)
