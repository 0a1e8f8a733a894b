"""The metrics dataset: explicit Parquet schemas, atomic writes, provenance, one-call reads.

Every cell (distribution, dim, scheme, budget) writes one file per table under
``results/metrics/<table>/<distribution>/d<dim>/<scheme>/n<budget>.parquet``; each file carries
all its identifier columns, so the directory is one dataset that ``pandas.read_parquet`` (or
:func:`read_table`) reads in one call. Files are written to a temporary name and renamed, so a
killed job never leaves a truncated file under the final name, and they carry provenance in the
Parquet schema metadata (package version, git commit when known, the config slice).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from . import __version__
from .atomic import atomic_target
from .errors import DamagedFile, KvasymError
from .metrics import eps_dir_from_phi, snr_db_from_eff_bits

IDENTIFIERS = [
    pa.field("distribution", pa.string()),
    pa.field("kind", pa.string()),
    pa.field("dim", pa.int32()),
    pa.field("scheme", pa.string()),
    pa.field("budget", pa.int8()),
    pa.field("sharpness", pa.float64()),
    pa.field("trial", pa.int32()),
]
SITES = ("k", "v", "t")
ERROR_COORDINATES = ("snr_db", "eff_bits", "phi", "eps_dir")

#: The measured bits per coordinate of each packed side in the per-query table: payload, side
#: information as stored, and side information counted with float16 norms (issue 14, point 8).
BITS_PARTS = ("payload", "side", "side16")

#: The stored type of the measured values of the per-query and per-key tables (issue 29, point 4:
#: the paper grid's metrics were 2.7 of its 4.7 GB). Every value is computed in float64 and
#: rounded once, to the nearest float32, when its file is written: a relative change of at most
#: 2^-24 (6e-8), far below the spread of any of them over trials, queries or draws. Readers
#: (:func:`from_stored`) widen them back, so every statistic downstream accumulates in float64.
#: The identifiers and the measured bits per coordinate (a few distinct values per file, which
#: equal-rate interpolation reads) stay float64.
METRIC_TYPE = pa.float32()

#: Columns of a table that are functions of one stored column, so not stored (issue 29, point 4:
#: the two were 289 of the paper grid's 1,037 MB of per-query tables): table -> derived column ->
#: (stored column, function). The per-query output site ``t`` keeps the framework's coordinates,
#: Shannon bits and angle (:data:`kvasym.cell_statistics.ERROR_6D`); its decibels and ``1 - cos`` are
#: added, in float64, by every reader (:func:`from_stored`). The K and V sites keep all four: their
#: ``eps_dir`` is a mean over rows, no function of their mean angle.
DERIVED_COLUMNS: dict[str, dict[str, tuple[str, Callable[[np.ndarray], np.ndarray]]]] = {
    "per_query": {"t_snr_db": ("t_eff_bits", snr_db_from_eff_bits), "t_eps_dir": ("t_phi", eps_dir_from_phi)},
}
#: Derived column -> the stored column it is computed from (every table's).
_SOURCE_OF = {name: source for derived in DERIVED_COLUMNS.values() for name, (source, _) in derived.items()}

_PER_QUERY_FIELDS = (
    IDENTIFIERS
    + [pa.field("query", pa.int32()), pa.field("kl", METRIC_TYPE), pa.field("recall_top5", METRIC_TYPE)]
    + [pa.field(name, METRIC_TYPE) for name in ("tv", "js", "top1", "catastrophic")]
    + [pa.field(f"{site}_{name}", METRIC_TYPE) for site in SITES for name in ERROR_COORDINATES]
    # side16: the side bits the same cache would have with float16 norms (PackedCache.side_bits_at)
    + [pa.field(f"{side}_bits_{part}", pa.float64()) for side in ("k", "v") for part in BITS_PARTS]
)
#: The per-query file's schema: what is stored (every column of :data:`PER_QUERY_COLUMNS` but the
#: derived ones).
PER_QUERY_SCHEMA = pa.schema([f for f in _PER_QUERY_FIELDS if f.name not in DERIVED_COLUMNS["per_query"]])
#: The per-query table's columns as every reader returns them: the stored ones and the derived ones.
PER_QUERY_COLUMNS: tuple[str, ...] = tuple(f.name for f in _PER_QUERY_FIELDS)

PER_KEY_SCHEMA = pa.schema(
    IDENTIFIERS
    + [pa.field("key", pa.int32()), pa.field("n_queries", pa.int32())]
    + [
        pa.field(name, METRIC_TYPE)
        for name in (
            "logit_err_mean",
            "logit_err_var",
            "weight_ref_mean",
            "weight_hat_mean",
            "log_weight_excess",
            "k_eps_dir",
            "k_snr_db",
            "key_norm",
        )
    ]
)

SCHEMAS = {"per_query": PER_QUERY_SCHEMA, "per_key": PER_KEY_SCHEMA}


@lru_cache(maxsize=1)
def git_commit() -> str:
    """The commit of the checkout we run from ($KVASYM_GIT_COMMIT overrides), or 'unknown'."""
    env = os.environ.get("KVASYM_GIT_COMMIT")
    if env:
        return env
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def provenance(config_slice: Mapping[str, Any]) -> dict[str, str]:
    return {
        "kvasym_version": __version__,
        "git_commit": git_commit(),
        "config_slice": json.dumps(config_slice, sort_keys=True),
    }


def to_table(columns: Mapping[str, np.ndarray], schema: pa.Schema) -> pa.Table:
    """Columns -> a table with exactly ``schema`` (missing, extra or uncastable columns fail)."""
    names = set(columns)
    expected = set(schema.names)
    if names != expected:
        raise KvasymError(
            f"table columns differ from the schema: missing {sorted(expected - names)}, "
            f"extra {sorted(names - expected)}"
        )
    arrays = [_arrow_column(np.asarray(columns[f.name]), f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def _arrow_column(values: np.ndarray, type_: pa.DataType) -> pa.Array:
    """One column as an Arrow array of ``type_``, whole-array (no per-row Python work).

    ``pa.array`` imports pandas on every call (about 0.2 to 0.5 s of a metrics job that never
    uses it), so the columns the metrics tables hold are assembled from their buffers instead:
    numbers of the field's width, integers checked to fit it first, floats rounded to the
    nearest value of a narrower float field (``numpy.ndarray.astype``, as ``pa.array`` rounds);
    text (a NumPy ``str`` array) as UTF-8 bytes and offsets. The result equals
    ``pa.array(values, type=type_, safe=True)``; anything else (an integer out of range, a float
    for an integer field, object arrays, nulls) goes to ``pa.array``, which converts or refuses
    it as before.
    """
    n = len(values)
    if values.ndim == 1 and pa.types.is_string(type_) and (values.dtype.kind == "U" or n == 0):
        # a table's text columns hold a few distinct names: encode those, then index rows into them
        names, inverse = np.unique(values.astype("U1" if n == 0 else values.dtype), return_inverse=True)
        encoded = [str(name).encode("utf-8") for name in names]
        width = max((len(e) for e in encoded), default=1) or 1
        table = np.frombuffer(b"".join(e.ljust(width, b"\0") for e in encoded), dtype=np.uint8).reshape(-1, width)
        lengths = np.array([len(e) for e in encoded], dtype=np.int64)[inverse.reshape(-1)]
        offsets = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(lengths)])
        if offsets[-1] < 2**31:
            grid = table[inverse.reshape(-1)]
            data = grid[np.arange(width) < lengths[:, None]]  # row-major: the strings' bytes in order
            buffers = [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)]
            return pa.Array.from_buffers(type_, n, buffers)
    elif values.ndim == 1 and (pa.types.is_floating(type_) or pa.types.is_integer(type_)):
        target = np.dtype(type_.to_pandas_dtype())
        kind = values.dtype.kind
        fits = kind == "f" and target.kind == "f"
        if kind in "iu" and target.kind in "iu":
            info = np.iinfo(target)
            fits = n == 0 or (int(values.min()) >= info.min and int(values.max()) <= info.max)
        if fits:
            data = np.ascontiguousarray(values, dtype=target)
            return pa.Array.from_buffers(type_, n, [None, pa.py_buffer(data)])
    return pa.array(values, type=type_, safe=True)


#: A float column whose evenly spaced sample of about this many values repeats itself (at most half
#: of the sample distinct) is dictionary-encoded; any other float column is byte-stream split.
DICTIONARY_SAMPLE = 4096


def parquet_encodings(table: pa.Table) -> dict[str, Any]:
    """``pyarrow.parquet.write_table`` options: the lossless encoding of each column.

    Continuous float columns (KL, angles, SNRs: nearly every value distinct) are written
    BYTE_STREAM_SPLIT without a dictionary: their bytes regrouped by significance compress
    under zstd to about 7 of their 8 bytes, where a dictionary that overflows and falls back to
    PLAIN left about 9 (the paper grid's per-query tables 15% smaller, its per-key tables 28%).
    Float columns that repeat their values (recall, top-1, per-trial or per-cell values
    repeated over rows: at most half of a sample distinct) and every other column keep the
    dictionary, which stores a repeated value once. The choice is made from a
    fixed, evenly spaced sample, so it is the same on every run; either way the values read back
    are the same bits.
    """
    dictionary = []
    split = []
    for field, column in zip(table.schema, table.columns):
        if not pa.types.is_floating(field.type):
            dictionary.append(field.name)
            continue
        sample = _float_values(column)[::max(1, len(column) // DICTIONARY_SAMPLE)]
        if 2 * len(np.unique(sample)) <= len(sample):
            dictionary.append(field.name)
        else:
            split.append(field.name)
    return {"compression": "zstd", "use_dictionary": dictionary, "use_byte_stream_split": split}


def _float_values(column: pa.ChunkedArray) -> np.ndarray:
    """A float column's values as one array, read from its buffers (``to_numpy`` imports pandas,
    which a cells job never needs otherwise); nulls read as whatever their slot holds, which only
    counts toward the sample of :func:`parquet_encodings`."""
    dtype = np.dtype(column.type.to_pandas_dtype())
    parts = [np.frombuffer(chunk.buffers()[1], dtype=dtype, count=len(chunk), offset=chunk.offset * dtype.itemsize)
             for chunk in column.chunks if len(chunk)]
    return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)


def write_parquet_atomic(table: pa.Table, path: str | os.PathLike, metadata: Mapping[str, str]) -> None:
    """Write ``table`` with ``metadata`` to ``path`` via a temporary file and a rename, each
    column in its lossless encoding (:func:`parquet_encodings`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(table.schema.metadata or {})
    meta.update({k.encode(): v.encode() for k, v in metadata.items()})
    table = table.replace_schema_metadata(meta)
    with atomic_target(path) as tmp:
        pq.write_table(table, tmp, **parquet_encodings(table))


def write_frame_atomic(frame: "pd.DataFrame", path: str | os.PathLike, metadata: Mapping[str, str]) -> None:  # noqa: F821
    """Write a DataFrame (schema inferred, index dropped) atomically with ``metadata``."""
    write_parquet_atomic(pa.Table.from_pandas(frame, preserve_index=False), path, metadata)


def from_stored(frame: "pd.DataFrame") -> "pd.DataFrame":  # noqa: F821
    """A metrics table as stored -> as read, in place: float32 columns widened to float64
    (exactly: every float32 is a float64; the measured values are stored as float32,
    :data:`METRIC_TYPE`, and every statistic of them is computed in float64), then each derived
    column of :data:`DERIVED_COLUMNS` whose stored column is there and which is not, computed
    from the widened values (a table of another kind is only widened)."""
    narrow = [name for name, dtype in frame.dtypes.items() if dtype == np.float32]
    if narrow:
        frame[narrow] = frame[narrow].astype(np.float64)
    for derived in DERIVED_COLUMNS.values():
        for name, (source, function) in derived.items():
            if source in frame.columns and name not in frame.columns:
                frame[name] = function(frame[source].to_numpy(dtype=np.float64))
    return frame


def stored_columns(columns: Iterable[str], held: Iterable[str] = ()) -> list[str]:
    """The stored columns to read for ``columns`` of a metrics table: each derived column
    (:data:`DERIVED_COLUMNS`) replaced by the column it is computed from unless the file holds
    it (``held``: a table written with it, e.g. by a user's own code), order kept, once each."""
    held = set(held)
    return list(dict.fromkeys(name if name in held else _SOURCE_OF.get(name, name) for name in columns))


def read_metrics_file(path: str | os.PathLike, columns: list[str] | None = None) -> "pd.DataFrame":  # noqa: F821
    """One metrics file as read (:func:`from_stored`): ``columns`` (None: all) may name derived
    columns, read through their stored ones; errors as :func:`read_parquet_checked`."""
    if columns is not None:
        try:
            held = pq.read_schema(path).names
        except (OSError, ValueError, pa.ArrowException):
            held = None  # read_parquet_checked names what is wrong with the file
        if held is not None:
            absent = [name if name not in _SOURCE_OF else f"{name} (or {_SOURCE_OF[name]}, which it is derived from)"
                      for name in columns if name not in held and _SOURCE_OF.get(name) not in held]
            if absent:
                raise DamagedFile(path, f"has no column(s) {', '.join(absent)}")
        columns = stored_columns(columns, held or ())
    return from_stored(read_parquet_checked(path, columns=columns))


def read_table(root: str | os.PathLike, table: str = "per_query") -> "pd.DataFrame":  # noqa: F821
    """Read a whole metrics table (every cell) from ``results/metrics`` in one call."""
    if table not in SCHEMAS:
        raise KvasymError(f"unknown table {table!r}; known: {', '.join(SCHEMAS)}")
    return read_table_folder(Path(root) / table, table)


def read_table_folder(folder: str | os.PathLike, table: str) -> "pd.DataFrame":  # noqa: F821
    """Every Parquet file under ``folder`` as one ``table`` (a key of :data:`SCHEMAS`); a
    :class:`DamagedFile` naming the first unreadable file."""
    folder = Path(folder)
    if not folder.is_dir():
        raise KvasymError(f"{folder}: no such metrics table (run the pipeline first)")
    try:
        return from_stored(pq.read_table(folder, schema=SCHEMAS[table]).to_pandas())
    except (OSError, ValueError, pa.ArrowException) as exc:
        # a truncated or foreign file somewhere in the dataset: find it, so the error names it
        for part in sorted(folder.rglob("*.parquet")):
            read_parquet_checked(part)
        raise KvasymError(f"{folder}: a file of the {table} table is not readable ({exc})") from None


def read_parquet_checked(path: str | os.PathLike, columns: list[str] | None = None) -> "pd.DataFrame":  # noqa: F821
    """One Parquet file as a DataFrame (``columns``: only these), or a KvasymError naming it when
    it is missing, truncated, not Parquet or without a column asked for (a file tampered with
    between runs: the stage reading it stops here)."""
    import pandas as pd

    p = Path(path)
    if not p.is_file():
        if p.with_name(f".{p.name}.damaged").is_file():
            raise KvasymError(f"{p}: another job found it damaged and moved it aside to .{p.name}.damaged; "
                              "rerun to rebuild it")
        raise KvasymError(f"{p}: no such file")
    if columns is not None:
        try:
            names = pq.read_schema(p).names
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise DamagedFile(p, f"not a readable Parquet table ({type(exc).__name__}: {exc})") from None
        absent = [c for c in columns if c not in names]
        if absent:
            raise DamagedFile(p, f"has no column(s) {', '.join(absent)}")
    try:
        return pd.read_parquet(p, columns=columns)
    except (OSError, ValueError, pa.ArrowException) as exc:
        # pyarrow raises ArrowInvalid (a ValueError) or OSError for truncated or foreign files
        raise DamagedFile(p, f"not a readable Parquet table ({type(exc).__name__}: {exc})") from None


def read_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The provenance metadata of one Parquet file."""
    raw = pq.read_schema(path).metadata or {}
    return {k.decode(): v.decode() for k, v in raw.items() if not k.startswith(b"ARROW")}
