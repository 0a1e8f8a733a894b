"""Stage ``cells`` (rule ``cells``): every cell of one (distribution, dim), in one process.

A unit is a (distribution, dim) of the synthetic grid (not a query-model variant: those are the
``metrics`` stage's, :mod:`kvasym.stages.metrics`). Its job draws each trial once, from seeds
keyed by (distribution, dim, trial), and while the trial is in memory quantizes it with every
scheme of the unit (the grid's and the frontier's that run on the distribution) at every
budget, and at its ``frontier.extra_budgets`` in a unit of the frontier, and measures the
reconstructions against the data at every sharpness. It writes

- the data manifest ``results/data/<dist>/d<dim>.json`` (per-trial SHA-256 digests and
  statistics, :func:`kvasym.manifest.build_manifest`), which the theory, figure and table
  stages check their regenerated trials against;
- the packed caches of the unit's ``packed_schemes`` (the grid's; the frontier's, and every
  scheme's at its extra budgets, too with ``frontier.keep_packed``), one ``.npz`` per cell in
  the folder ``results/packed/<dist>/d<dim>`` (``<scheme>/n<budget>.npz``: trial ``t``'s sides
  as ``t<t>.K`` / ``t<t>.V``), the compressed artifact itself with its measured bits per
  coordinate, written trial by trial (:class:`kvasym.cache.PackedFileWriter`); a frontier cache
  not kept is measured, and its bits counted, in memory, exactly as a kept one;
- one per-query and one per-key Parquet file per cell in the folders
  ``results/metrics/{per_query,per_key}/<dist>/d<dim>`` (``<scheme>/n<budget>.parquet``):
  parts of the two datasets, read with one call as before.

Each folder appears complete or not at all (:func:`kvasym.atomic.atomic_folder`). Rotation and
QJL seeds come from (distribution, dim, trial, side), never from the order of work, so the
files are those a job per cell would write. Quantizing and dequantizing run the compiled
kernels when numba imports (:func:`kvasym.kernels.auto_kernel`: every side, the composed ones
included; the numpy reference without the ``fast`` extra); a trial is measured whole in one
process, which keeps its QJL matrices in :func:`kvasym.sketch` 's cache across the unit's schemes
and budgets.

The trials run on the rule's threads (``--workers``, :func:`kvasym.workers.imap_ordered`): a
worker draws, quantizes and measures a trial whole and hands back its manifest record, its kept
packed caches and its rows; the parent writes them in trial order, so every file is the one the
loop in one process writes, whatever the number of workers.

Why a (distribution, dim): its cells share their data and seeds; one job per cell paid a
process start, a data read and Snakemake's bookkeeping (about 3 CPU-s) for work of 1 to 10
CPU-s. The price is the granularity of reruns: a change to a unit's slice (a scheme added to
the grid or to the frontier on this distribution, a budget, a sharpness, a scheme's
``frontier.extra_budgets`` on a frontier distribution) reruns the unit whole; a unit to which
``frontier.extra_budgets`` adds no cell keeps its slice (the key is absent from it) and its files.
"""

from __future__ import annotations

import argparse
import itertools
import os
from collections.abc import Mapping
from typing import Any

from ..atomic import atomic_folder, write_json_atomic
from ..cache import PackedFileWriter
from ..errors import KvasymError
from ..evaluate import quantize_pair
from ..manifest import manifest_of, regenerate_trial, trial_record
from ..metrics import trial_reference
from ..workers import imap_ordered
from ._slice import add_workers_argument, stage_slice
from .metrics import (
    CellTables,
    add_unit_arguments,
    cache_identity_name,
    cell_file,
    data_slice_of,
    packed_cache_name,
    unit_cells,
)


def run_cells(
    unit: Mapping[str, Any],
    out_manifest: str | os.PathLike,
    out_packed: str | os.PathLike,
    out_per_query: str | os.PathLike,
    out_per_key: str | os.PathLike,
    workers: int = 1,
) -> None:
    """Draw, quantize and measure every cell of ``unit`` (a :meth:`kvasym.study.Study.unit_slice`):
    the manifest to ``out_manifest``, the packed caches and the two metrics tables into the
    three folders (``<scheme>/n<budget>.npz`` / ``.parquet``).

    ``workers``: processes the trials run on (:func:`kvasym.workers.imap_ordered`). A trial is
    drawn, quantized with every scheme at every budget and measured in one process, so its QJL
    matrices are drawn once for all its cells; the parent writes each trial's packed caches and
    keeps its rows in trial order, so the files do not depend on ``workers``."""
    if unit["distribution"].get("keys_of"):
        raise KvasymError(f"{unit['distribution']['name']!r} is a query-model variant (keys_of "
                          f"{unit['distribution']['keys_of']!r}): its cells are the metrics stage's")
    cells = list(unit_cells(unit))
    identity = cache_identity_name(unit)
    data_slice = data_slice_of(unit)
    # the packed caches of the unit's packed_schemes (Study.packed_schemes: the grid's, which the
    # query-model variants read; the frontier's only with frontier.keep_packed), at an extra
    # budget (a frontier cell: no variant reads it) only with packed_extra, which is
    # frontier.keep_packed
    kept = set(unit["packed_schemes"])
    unknown = sorted(kept - {s.name for s, _, _ in cells})
    if unknown:
        raise KvasymError(f"slice key packed_schemes names {unknown}, which are not schemes of the unit")
    extra = unit.get("extra_budgets", {})
    kept_cells = [(s.name, b) for s, b, _ in cells
                  if s.name in kept and (unit.get("packed_extra", False) or b not in extra.get(s.name, []))]
    kept_set = set(kept_cells)
    tables = {(s.name, b): CellTables(cell) for s, b, cell in cells}

    def measure_trial(trial: int) -> tuple[dict[str, Any], dict[tuple[str, int], Any], dict[tuple[str, int], Any]]:
        # one trial whole (in a worker with workers > 1): its manifest record, the packed caches
        # of the kept cells and every cell's rows
        data = regenerate_trial(data_slice, trial)
        # the reference attention of the trial, once for every scheme and budget of the unit
        reference = trial_reference(data.queries, data.keys, data.values, unit["sharpness"], kernel="auto")
        packed, rows = {}, {}
        for scheme, budget, _ in cells:
            pair = quantize_pair(data.keys, data.values, scheme, budget, base_seed=unit["base_seed"],
                                 identity=(identity, unit["dim"], trial), norm_dtype=unit["norm_dtype"],
                                 kernel="auto")
            if (scheme.name, budget) in kept_set:
                packed[scheme.name, budget] = pair
            rows[scheme.name, budget] = tables[scheme.name, budget].trial_parts(trial, data, pair["K"], pair["V"],
                                                                                reference)
        return trial_record(trial, data), packed, rows

    with (atomic_folder(out_packed) as packed_dir, atomic_folder(out_per_query) as pq_dir,
          atomic_folder(out_per_key) as pk_dir):
        writers = {key: PackedFileWriter(cell_file(packed_dir, *key, ".npz")) for key in kept_cells}
        records = []
        try:
            # trial 0 in this process first: it loads every compiled kernel and codebook the unit
            # uses, which the workers, forked after it, then share instead of each loading them
            # again (measured: about a tenth more CPU on a d = 128 unit without it)
            first = [measure_trial(0)] if unit["trials"] else []
            rest = imap_ordered(measure_trial, range(1, unit["trials"]), workers)
            for record, packed, rows in itertools.chain(first, rest):
                for key, pair in packed.items():
                    for side, cache in pair.items():
                        writers[key].add(packed_cache_name(record["trial"], side), cache)
                for key, parts in rows.items():
                    tables[key].add_parts(parts)
                records.append(record)
        except BaseException:
            for writer in writers.values():
                writer.abort()
            raise
        for writer in writers.values():
            writer.close()
        for (scheme, budget), table in tables.items():
            table.write(cell_file(pq_dir, scheme, budget, ".parquet"), cell_file(pk_dir, scheme, budget, ".parquet"))
    write_json_atomic(manifest_of(data_slice, records), out_manifest)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_unit_arguments(parser, "cells", "the packed-caches folder to write (<scheme>/n<budget>.npz)")
    add_workers_argument(parser)


def run(args: argparse.Namespace) -> None:
    run_cells(stage_slice(args, "cells"), args.manifest, args.packed, args.per_query, args.per_key,
              workers=args.workers)
