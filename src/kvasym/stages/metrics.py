"""Stage ``metrics`` (rule ``metrics``): the cells of a query-model variant, from its parent's caches.

A query-model variant ``<parent>+<model>`` (config key ``query_models``, :mod:`kvasym.querymodel`)
has its parent's keys and values and queries of its own, so its cells measure the parent's packed
caches (written by the parent's ``cells`` job, :mod:`kvasym.stages.cells`) against other
queries. One job per (variant, dim): it draws the variant's trials once (writing its data
manifest, ``results/data/<variant>/d<dim>.json``), reads the parent's packed caches of every
scheme and budget from the parent's folder (each checked to be the one that cell's quantizer
writes: same shape, scheme side, budget, norm storage and identity-derived seeds) and writes one
per-query and one per-key Parquet file per cell, in the folders
``results/metrics/{per_query,per_key}/<variant>/d<dim>/<scheme>/n<budget>.parquet``.

The per-cell tables (:class:`CellTables`, used by the ``cells`` stage too) are built whole: one
array per column and part, concatenated, never row by row.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..atomic import atomic_folder, write_json_atomic
from ..cache import PackedCache, load_packed
from ..dataset import PER_KEY_SCHEMA, PER_QUERY_SCHEMA, provenance, to_table, write_parquet_atomic
from ..distributions import TrialData
from ..errors import DamagedFile, KvasymError
from ..evaluate import dequantize_with
from ..manifest import DATA_KEYS, build_manifest
from ..metrics import TrialReference, trial_metrics_multi, trial_reference
from ..schemes import Scheme, scheme_from_dict
from ..seeds import derived_seed
from ._slice import add_slice_arguments, stage_slice

def cache_identity_name(slice_: Mapping[str, Any]) -> str:
    """The distribution name in the rotation and QJL seeds of a cell: the parent's for a
    query-model variant (``keys_of``: same keys, so the same packed caches), else its own."""
    return slice_["distribution"].get("keys_of") or slice_["distribution"]["name"]


def packed_cache_name(trial: int, side: str) -> str:
    """The name of one trial's cache side inside a cell's packed file."""
    return f"t{trial}.{side}"


def cell_file(folder: str | os.PathLike, scheme: str, budget: int, suffix: str) -> Path:
    """A cell's file in a unit's folder: ``<folder>/<scheme>/n<budget><suffix>``."""
    return Path(folder) / scheme / f"n{budget}{suffix}"


def data_slice_of(unit: Mapping[str, Any]) -> dict[str, Any]:
    """The data slice of a unit (what its manifest is made for)."""
    return {key: unit[key] for key in DATA_KEYS}


def unit_cells(unit: Mapping[str, Any]) -> Iterator[tuple[Scheme, int, dict[str, Any]]]:
    """(scheme, budget, cell slice) of every cell of a unit, schemes in slice order, budgets
    within: the unit's ``budgets``, then the scheme's ``extra_budgets`` (the frontier's only,
    :meth:`kvasym.study.Study.extra_budgets_on`; a key only some units' slices have). A cell
    slice is what :meth:`kvasym.study.Study.metrics_slice` gives for the cell (the data slice,
    the scheme's spec, the budget and the metric settings), an extra cell's too."""
    extra = unit.get("extra_budgets", {})
    for entry in unit["schemes"]:
        spec = dict(entry)
        scheme = scheme_from_dict(spec.pop("name"), spec)
        for budget in [*unit["budgets"], *extra.get(entry["name"], [])]:
            cell = data_slice_of(unit)
            cell.update(scheme=dict(entry), budget=int(budget), norm_dtype=unit["norm_dtype"],
                        sharpness=list(unit["sharpness"]), per_key_trials=unit["per_key_trials"])
            yield scheme, int(budget), cell


class CellTables:
    """The per-query and per-key rows of one cell, trial by trial.

    Parameters
    ----------
    cell : mapping
        The cell's slice (:func:`unit_cells`); its provenance goes into both files' metadata.
    """

    def __init__(self, cell: Mapping[str, Any]) -> None:
        self.cell = cell
        self.ident = {
            "distribution": cell["distribution"]["name"],
            "kind": cell["distribution"]["kind"],
            "dim": cell["dim"],
            "scheme": cell["scheme"]["name"],
            "budget": cell["budget"],
        }
        self.query_parts: list[dict[str, np.ndarray]] = []
        self.key_parts: list[dict[str, np.ndarray]] = []

    def add_trial(self, trial: int, data: TrialData, k_cache: PackedCache, v_cache: PackedCache,
                  reference: TrialReference | None = None) -> None:
        """Measure one trial (:meth:`trial_parts`) and keep its rows."""
        self.add_parts(self.trial_parts(trial, data, k_cache, v_cache, reference))

    def add_parts(self, parts: tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]]) -> None:
        """Keep one trial's per-query and per-key rows (:meth:`trial_parts`, perhaps computed in a
        worker process); trials are added in trial order."""
        query_parts, key_parts = parts
        self.query_parts.extend(query_parts)
        self.key_parts.extend(key_parts)

    def trial_parts(self, trial: int, data: TrialData, k_cache: PackedCache, v_cache: PackedCache,
                    reference: TrialReference | None = None
                    ) -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]]:
        """Measure one trial: reconstruct both caches (the compiled kernels when numba imports,
        :func:`kvasym.kernels.auto_kernel`) and compare them with the data at every
        sharpness (the compiled attention-row pass when numba imports). ``reference``: the trial's
        :func:`kvasym.metrics.trial_reference` (of ``data`` and every sharpness of the cell),
        shared by the cells of a unit. Returns the trial's per-query and per-key row parts (one
        per sharpness; per-key rows only for the first ``per_key_trials`` trials), without
        keeping them."""
        keys_hat, values_hat = dequantize_with(k_cache, "auto"), dequantize_with(v_cache, "auto")
        bits = {}
        for side, cache in (("k", k_cache), ("v", v_cache)):
            stored = cache.bits_per_coordinate()
            bits.update({f"{side}_bits_payload": stored["payload"], f"{side}_bits_side": stored["side"],
                         # what float16 norms would cost: total bits at norm_dtype float16
                         f"{side}_bits_side16": cache.bits_per_coordinate("float16")["side"]})
        sharpness = self.cell["sharpness"]
        results = trial_metrics_multi(data.queries, data.keys, data.values, keys_hat, values_hat, sharpness,
                                      kernel="auto", reference=reference)
        query_parts, key_parts = [], []
        for value, (per_query, per_key) in zip(sharpness, results):
            rows = len(per_query["kl"])
            common = {**self.ident, "sharpness": value, "trial": trial}
            query_parts.append(
                {**{k: np.full(rows, v) for k, v in common.items()}, **per_query,
                 **{k: np.full(rows, v) for k, v in bits.items()}}
            )
            if trial < self.cell["per_key_trials"]:
                n_keys = len(per_key["key"])
                key_parts.append({**{k: np.full(n_keys, v) for k, v in common.items()}, **per_key})
        return query_parts, key_parts

    def write(self, per_query: str | os.PathLike, per_key: str | os.PathLike) -> None:
        """Write the two Parquet files (atomically), with the cell's provenance."""
        meta = provenance(self.cell)
        write_parquet_atomic(to_table(_concat(self.query_parts, PER_QUERY_SCHEMA), PER_QUERY_SCHEMA), per_query, meta)
        write_parquet_atomic(to_table(_concat(self.key_parts, PER_KEY_SCHEMA), PER_KEY_SCHEMA), per_key, meta)


def check_cache_matches(
    cache: PackedCache,
    shape: tuple[int, ...],
    cell: Mapping[str, Any],
    scheme: Scheme,
    trial: int,
    side: str,
    path: str | os.PathLike,
) -> None:
    """The packed cache must be the one this cell's quantizer writes: same shape, scheme side,
    budget, norm storage and the seeds derived from (distribution, dim, trial, side). A stale
    file or one copied from another cell would otherwise be measured and labelled as this cell.
    A query-model variant reads its parent's caches (:func:`cache_identity_name`)."""
    spec = scheme.side(side)
    budget = cell["budget"]
    identity = (cache_identity_name(cell), cell["dim"], trial)
    base = cell["base_seed"]
    expected: dict[str, Any] = {
        "rows": shape[0],
        "dim": shape[1],
        "budget": budget - spec.spend_offset,  # a side that spends n-k is stored at budget n-k
        "rotate": spec.rotate,
        "scalar_bits": spec.scalar_bits(budget),
        "qjl": spec.qjl,
        "sketch": spec.sketch if spec.qjl else "gaussian",
        "primitives": spec.primitives(),
        "norm_dtype": cell["norm_dtype"],
        "rotation_seed": derived_seed(base, "rotation", *identity, side) if spec.seeded_transform else 0,
        "qjl_seed": derived_seed(base, "qjl", *identity, side) if spec.qjl else 0,
    }
    for key, want in expected.items():
        got = getattr(cache, key)
        if got != want:
            raise DamagedFile(
                path, f"trial {trial} side {side} has {key} = {got!r} but cell {scheme.name} n={budget} "
                f"needs {want!r}: the file is stale or from another cell"
            )


def _concat(parts: list[dict[str, np.ndarray]], schema: pa.Schema) -> dict[str, np.ndarray]:
    """The columns of ``schema`` from every part; with no part (``per_key_trials: 0`` writes no
    per-key row), empty columns of the schema's types, so the file is a valid empty table."""
    if not parts:
        return {f.name: np.zeros(0, dtype=object if pa.types.is_string(f.type) else f.type.to_pandas_dtype())
                for f in schema}
    return {f.name: np.concatenate([np.asarray(p[f.name]) for p in parts]) for f in schema}


def run_metrics(
    unit: Mapping[str, Any],
    packed_dir: str | os.PathLike,
    out_manifest: str | os.PathLike,
    out_per_query: str | os.PathLike,
    out_per_key: str | os.PathLike,
) -> None:
    """The data manifest and the per-query and per-key files of every cell of a query-model
    variant's unit ``unit``, measuring the packed caches in ``packed_dir`` (its parent's folder,
    ``<scheme>/n<budget>.npz``). The two output folders appear complete or not at all."""
    if not unit["distribution"].get("keys_of"):
        raise KvasymError(f"the metrics stage measures query-model variants; {unit['distribution']['name']!r} has "
                          "no parent (keys_of): its cells are the cells stage's")
    cells = list(unit_cells(unit))
    packed: dict[tuple[str, int], tuple[Path, dict[str, PackedCache]]] = {}
    for scheme, budget, _ in cells:
        path = cell_file(packed_dir, scheme.name, budget, ".npz")
        packed[scheme.name, budget] = (path, load_packed(path))
    tables = {(scheme.name, budget): CellTables(cell) for scheme, budget, cell in cells}

    def measure(trial: int, data: TrialData) -> None:
        reference = trial_reference(data.queries, data.keys, data.values, unit["sharpness"], kernel="auto")
        for scheme, budget, cell in cells:
            path, caches = packed[scheme.name, budget]
            try:
                k_cache, v_cache = caches[packed_cache_name(trial, "K")], caches[packed_cache_name(trial, "V")]
            except KeyError:
                raise DamagedFile(path, f"no packed caches for trial {trial}") from None
            for side, cache, matrix in (("K", k_cache, data.keys), ("V", v_cache, data.values)):
                check_cache_matches(cache, matrix.shape, cell, scheme, trial, side, path)
            tables[scheme.name, budget].add_trial(trial, data, k_cache, v_cache, reference)

    manifest = build_manifest(data_slice_of(unit), measure)
    with atomic_folder(out_per_query) as pq_dir, atomic_folder(out_per_key) as pk_dir:
        for (scheme, budget), table in tables.items():
            table.write(cell_file(pq_dir, scheme, budget, ".parquet"), cell_file(pk_dir, scheme, budget, ".parquet"))
    write_json_atomic(manifest, out_manifest)


#: Arguments naming files (or folders) other rules write (moved aside when damaged: kvasym.stages).
INTERMEDIATE_INPUTS = ("packed",)


def add_unit_arguments(parser: argparse.ArgumentParser, stage: str, packed: str) -> None:
    """The flags of a unit job (stages cells and metrics): its slice, ``--packed`` (``packed``
    says what that folder is to the stage), the manifest it writes and its two metrics folders."""
    add_slice_arguments(parser, stage)
    parser.add_argument("--packed", required=True, help=packed)
    parser.add_argument("--manifest", required=True, help="the unit's data manifest (.json) to write")
    for table in ("per_query", "per_key"):
        parser.add_argument(f"--{table.replace('_', '-')}", dest=table, required=True,
                            help=f"the {table.replace('_', '-')} folder to write (<scheme>/n<budget>.parquet)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_unit_arguments(parser, "metrics", "the parent's packed-caches folder to read (<scheme>/n<budget>.npz)")


def run(args: argparse.Namespace) -> None:
    run_metrics(stage_slice(args, "metrics"), args.packed, args.manifest, args.per_query, args.per_key)
