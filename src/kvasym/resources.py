"""What each DAG job asks a scheduler for: memory (MB) and runtime (minutes), per stage.

Grid stages (cells, metrics, theory) scale with their slice (:func:`job_resources`);
the others have a fixed request (:data:`FIXED_RESOURCES`), set above the peaks that the paper
run's ``benchmark:`` files record; ``file_metrics`` grows with its cache file. On one machine
Snakemake uses ``mem_mb`` only to avoid running jobs that would not fit together; on Slurm
these are the job's ``--mem`` and ``--time``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["FIXED_RESOURCES", "MODEL_RESOURCES", "MODEL_STAGES", "SLICE_STAGES", "STAGE_THREADS",
           "WORKER_MEMORY_FLOOR_MB", "WORKER_MEMORY_SHARE", "job_resources", "stage_threads"]

#: Stages whose request follows the size of their config slice.
SLICE_STAGES = ("cells", "metrics", "theory")
#: Stage -> (mem_mb, runtime in minutes) of the stages with a fixed request. Measured peaks
#: (paper grid, 2 cores): figure families at most 18 s and 351 MB RSS; capture 1.43 GB and 54 s
#: for the first four shipped texts at every layer; real_metrics 16 s and 220 MB; the rest under 400 MB.
#: With the 16 shipped texts (336 caches per real cell): real_metrics 78 s CPU and 549 MB; the
#: real stats job 1.7 GB RSS per budget of its cells, so about 5 GB with the paper's three
#: budgets: above the stats request, kept at 4000 MB because a single-node test cluster must fit
#: every job (workflow/scripts/local_slurm.sh); a request that follows the input size is to do.
FIXED_RESOURCES: dict[str, tuple[int, int]] = {
    "stats": (4000, 30),
    "gather": (2000, 10),
    # frontier: one per-query file in memory at a time (real cells: ~0.5 M rows x 13 columns)
    "frontier": (2000, 20),
    "claims": (2000, 10),
    # seq_len_sweep: one trial at the longest length in float64 (16k x 128: K, V, their
    # reconstructions, a 64 x 16k attention matrix), about 0.2 GB; ~115 CPU-s at the paper's sweep
    "seq_len_sweep": (2000, 30),
    "figure": (1500, 10),
    "tables": (1000, 5),
    "numbers": (1000, 5),
    "reproduce": (1000, 5),
    # crate: hashes every file of the run (5 GB on the paper grid, about 1 GB/s), one at a time
    "crate": (1000, 10),
    "paper": (2000, 10),
    "capture": (3000, 20),
    "real_metrics": (3000, 30),
    # real_metrics_extra: a real_metrics job of one budget
    "real_metrics_extra": (3000, 30),
    "real_cachestats": (3000, 10),
    # e2e: the model (~0.9 GB; Gemma 3 270M ~1.3 GB), the reference logits and probabilities of one
    # text (T x vocab float32 each: 0.2 GB for SmolLM2 at 512 tokens, 1.1 GB for Gemma's 262,144
    # tokens) and one quantized pass; e2e_stats: the per-position tables of every text
    "e2e": (5000, 120),
    "e2e_join": (2000, 10),
    "e2e_stats": (2000, 10),
    # calibrate: the model and one text's forward pass (15 texts of 512 tokens, ~30 CPU-s)
    "calibrate": (3000, 20),
    # model_file: a 253 MB copy through a 4 MB buffer (the floor every job gets: 600 MB)
    "model_file": (600, 5),
    # e2e_long: the reference's float32 logits and float64 probabilities of one window, T x 49152
    # each (2.4 GB at 4K tokens, 4.8 GB at 8K), the model and one pass; up to ~95 CPU-s a pass at 8K
    "e2e_long": (8000, 240),
    # passkey: the model and one pass (only the answer's five rows meet the output matrix): one
    # trial's two passes on SmolLM2 peaked at 956, 1,004 and 1,115 MiB at 1K, 2K and 4K tokens
    # (about 55 MiB more per 1K tokens, so about 1.3 GB at 8K), Gemma 3 270M's at 2,258 MiB at 1K;
    # one request covers every length of config/long.yaml
    "passkey": (3000, 240),
    # greedy: the model, one prompt's full-precision steps and one pass at a time (short sequences)
    "greedy": (3000, 60),
    # sensitivity: the model, one text's reference pass and one partial pass (~0.8 CPU-s each, 360
    # at the paper's settings); card: the model and one pass at a time (~3 CPU-s, 48 passes)
    "sensitivity": (3000, 60),
    "card": (3000, 60),
    # card_page: the card's JSON and four matplotlib figures
    "card_page": (1000, 10),
    "file_metrics": (1000, 30),
}
#: file_metrics holds the cache in float64 beside its reconstruction: MB per MB of file.
FILE_MEMORY_FACTOR = 3
#: The model-level stages whose request depends on the job's model (its slice's ``model``, absent
#: for the primary model) and, for ``e2e_long``, the window length (its slice's ``length``).
MODEL_STAGES = ("e2e", "e2e_long", "passkey", "greedy", "sensitivity", "card", "calibrate")
#: Per further model: (mem_mb, runtime) of the stages whose measured peak exceeds the primary
#: model's request. Gemma 3 270M's vocabulary is 5.3 times SmolLM2's (262,144 logits a row) and
#: its jobs of config/long.yaml peaked above them (benchmark files of the run of 2026-12-06, on a
#: shared 2-core machine): 4K windows 7.2-11.6 GB against 8 GB, the card 5.5 GB against 3 GB,
#: its calibration 3.9 GB against 3 GB. Requests here are those peaks plus about a third.
MODEL_RESOURCES: dict[str, dict[str, tuple[int, int]]] = {
    "gemma3-270m": {"e2e_long": (16000, 240), "card": (8000, 60), "sensitivity": (6000, 60)},
}
#: Window length the e2e_long requests are for; a longer window asks for proportionally more
#: memory (its logits and probabilities grow with it: SmolLM2's 4K windows peaked at 4.9 GB), a
#: shorter one for the model's end-to-end request (the model and a 512-token pass) plus its share
#: of the rest (a 64-token window of Gemma asked 16 GB, more than a single-node Slurm offered).
E2E_LONG_REFERENCE_LENGTH = 4096


#: Stage -> the ``threads`` its rule declares: the processes its job runs its independent units on
#: (:func:`kvasym.workers.map_ordered`: a text's quantized passes, the card's evaluation passes,
#: the sensitivity rows, the greedy prompts, the passkey trials, each window's passes, the
#: end-to-end tables, a synthetic unit's trials; the output does not depend on them). They let a
#: long job use cores the DAG leaves idle (the end of the paper DAG is a few such jobs, and its
#: longest chain begins with the d = 1024 synthetic units) and ask a Slurm job for that many
#: CPUs. Snakemake scales them down to ``--cores``; ``--set-threads card=1`` overrides one.
#: A synthetic unit's worker takes a trial whole (every cell of it: the trial's QJL matrices are
#: drawn once, as in one process). An earlier version that spread a trial's cells over the workers
#: (4107477) was slower than one process: a cell of a trial is small (~55 ms) and each worker drew
#: the trial's QJL matrices again.
STAGE_THREADS: dict[str, int] = {"e2e": 4, "sensitivity": 4, "card": 8, "greedy": 4, "e2e_long": 4, "passkey": 4,
                                 "e2e_stats": 4, "cells": 4}
#: What each worker beyond the first adds to a model job's request: a forked worker shares the
#: model and the reference pass with its parent and holds one pass's working set of its own (its
#: hidden states, caches and a block of logits). Measured by benchmarks/bench_workers.py on the
#: paper run's jobs (the process tree's proportional set size with two workers minus one's):
#: 183 MiB for SmolLM2's greedy prompts (request 3,000 MB), 175 and 134 MiB for its 1K and 4K
#: windows (5,750 and 8,000 MB). The request is a tenth of the one-process request, at least
#: WORKER_MEMORY_FLOOR_MB: 2.7 to 6 times those.
WORKER_MEMORY_SHARE = 0.1
WORKER_MEMORY_FLOOR_MB = 500


def stage_threads(stage: str) -> int:
    """The ``threads`` the rule of ``stage`` declares (:data:`STAGE_THREADS`; 1 for the others)."""
    return STAGE_THREADS.get(stage, 1)


def job_resources(stage: str, slice_: Mapping[str, Any] | None = None, input_mb: float = 0.0,
                  workers: int = 1) -> dict[str, int]:
    """Memory (MB) and runtime (minutes) to request for one job of ``stage``.

    Parameters
    ----------
    stage
        A stage of :data:`kvasym.stages.STAGES`.
    slice_
        The job's config slice (needed by :data:`SLICE_STAGES`): ``dim``, ``seq_len``,
        ``n_queries``, ``trials`` and optionally ``sharpness``. For :data:`MODEL_STAGES`
        (optional): its ``model`` (a further model's requests, :data:`MODEL_RESOURCES`) and, for
        ``e2e_long``, its window ``length``: at :data:`E2E_LONG_REFERENCE_LENGTH` the stage's
        request, beyond it proportionally more, below it the model's ``e2e`` request plus the
        length's share of the difference.
    input_mb
        The size of the job's input files (``file_metrics``: the cache file).
    workers
        The job's worker processes (its threads after Snakemake scaled them): each beyond the
        first adds :data:`WORKER_MEMORY_SHARE` of the one-process request, at least
        :data:`WORKER_MEMORY_FLOOR_MB`.

    Notes
    -----
    Grid jobs loop over trials, so memory follows one trial's float64 arrays (K, V, Q, their
    reconstructions and the ``n_queries x seq_len`` attention matrices) plus the tables of the
    unit's cells and, for metrics, its parent's packed caches (cells streams them to disk);
    runtime follows the total work over the unit's cells. The constants are
    conservative guesses, not a fit: the paper run's ``benchmark:`` files show a peak RSS of
    403 MB for any job, below the 600 MB floor requested here.
    """
    if stage in SLICE_STAGES:
        if slice_ is None:
            raise ValueError(f"the resources of stage {stage} follow its slice; give it")
        dim, seq, nq, trials = slice_["dim"], slice_["seq_len"], slice_["n_queries"], slice_["trials"]
        per_trial = 8 * (6 * seq * dim + 2 * nq * dim + 12 * nq * seq)
        packed = trials * 2 * seq * (dim + 64)  # <= 8 bits per coordinate + norms, both sides
        # the grid's cells and, in a frontier unit, its schemes' extra budgets (frontier.extra_budgets)
        n_extra = sum(len(b) for b in slice_.get("extra_budgets", {}).values())
        n_cells = max(len(slice_.get("schemes", ())) * len(slice_.get("budgets", ())) + n_extra, 1)
        n_sharp = len(slice_.get("sharpness", [])) or 1
        # the cells' tables until they are written: ~40 float64 columns per query row, ~10 per key row
        tables = n_cells * n_sharp * 8 * (40 * trials * nq + 10 * slice_.get("per_key_trials", 0) * seq)
        # cells streams each cell's packed file trial by trial; metrics holds its parent's caches
        held = n_cells * packed if stage == "metrics" else 2 * packed
        mem_mb = 600 + (3 * per_trial + held + tables) // 2**20
        work = n_cells * trials * seq * dim * (1 + n_sharp)
        mem_mb, runtime = int(mem_mb), int(2 + work // 50_000_000)
    elif stage not in FIXED_RESOURCES:
        raise ValueError(f"no resource model for stage {stage!r}")
    else:
        mem_mb, runtime = FIXED_RESOURCES[stage]
    if stage == "file_metrics":
        mem_mb += int(FILE_MEMORY_FACTOR * input_mb)
    if stage in MODEL_STAGES and slice_ is not None:
        model = MODEL_RESOURCES.get(str(slice_.get("model", "")), {})
        mem_mb, runtime = model.get(stage, (mem_mb, runtime))
        length = int(slice_.get("length", 0) or 0)
        if stage == "e2e_long" and length > E2E_LONG_REFERENCE_LENGTH:
            mem_mb = -(-mem_mb * length // E2E_LONG_REFERENCE_LENGTH)
        elif stage == "e2e_long" and 0 < length < E2E_LONG_REFERENCE_LENGTH:
            floor = model.get("e2e", FIXED_RESOURCES["e2e"])[0]
            mem_mb = floor + -(-(mem_mb - floor) * length // E2E_LONG_REFERENCE_LENGTH)
    if stage in STAGE_THREADS and workers > 1:
        mem_mb += (int(workers) - 1) * max(WORKER_MEMORY_FLOOR_MB, math.ceil(mem_mb * WORKER_MEMORY_SHARE))
    return {"mem_mb": int(mem_mb), "runtime": int(runtime)}
