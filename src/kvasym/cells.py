"""The one cell accessor of the gathered tables, and the one orientation of scheme-pair ratios.

A *cell* is a row set of a gathered table picked by column values: (distribution, dim, budget,
sharpness, scheme ...). Claims, tables and figures select rows only with :func:`select_cells`,
which compares floats with :func:`numpy.isclose` (a sharpness of 2 matches 2.0000000001), takes a
list as "any of", ``None`` as "any", and raises :class:`MissingCell` naming the table and the
cell when nothing matches (unless ``required=False``, for a figure panel that may be empty).

The ``stats`` stage stores a pair's KL ratio once, as ``scheme_a / scheme_b`` with ``a`` before
``b`` in config order. Whoever prints or tests a ratio reads it with :func:`pair_ratio`, which
returns it in the orientation asked for (inverting the estimate and swapping the interval's
ends when the pair is stored the other way round): the claims, the tests table and the
sharpness figure print the same number for the same pair.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .errors import DamagedFile, KvasymError

__all__ = ["MissingCell", "PairRatio", "pair_ratio", "select_cells"]


class MissingCell(KvasymError):
    """The cell asked for has no rows in this table (a smaller grid, or a typo in a cell)."""


def select_cells(frame: pd.DataFrame, what: str, *, required: bool = True, **conditions: Any) -> pd.DataFrame:
    """Rows of ``frame`` where every condition holds.

    Parameters
    ----------
    frame
        A gathered table (summary, comparisons, trials, theory) or a metrics table.
    what
        The table's name, for the error message.
    required
        Raise :class:`MissingCell` when no row matches (default); ``False`` returns the empty frame.
    **conditions
        Column -> value. Floats are compared with :func:`numpy.isclose`; lists, tuples and sets
        mean "any of"; ``None`` means "any value".

    Raises
    ------
    KvasymError
        A condition names a column the table lacks.
    MissingCell
        ``required`` and no row matches.
    """
    mask = np.ones(len(frame), dtype=bool)
    for key, value in conditions.items():
        if value is None:
            continue
        if key not in frame.columns:
            raise KvasymError(f"the {what} table has no column {key!r} (columns: {', '.join(map(str, frame.columns))})")
        column = frame[key]
        if isinstance(value, (list, tuple, set)):
            mask &= column.isin(list(value)).to_numpy()
        elif isinstance(value, float):
            mask &= np.isclose(column.to_numpy(dtype=float), value)
        else:
            mask &= (column == value).to_numpy()
    out = frame[mask]
    if out.empty and required:
        shown = ", ".join(f"{k}={v}" for k, v in conditions.items() if v is not None)
        raise MissingCell(f"no {what} rows for {shown}")
    return out


class PairRatio(dict):
    """``estimate``, ``low``, ``high`` of a ratio ``a / b``, ``swapped`` (stored as ``b / a``)
    and ``row`` (the comparisons row it came from)."""


def pair_ratio(comparisons: pd.DataFrame, a: str, b: str, *, metric: str = "kl", which: str = "mean",
               **cell: Any) -> PairRatio:
    """The ratio of scheme ``a``'s statistic over scheme ``b``'s in one cell, with its CI.

    Parameters
    ----------
    comparisons
        The gathered comparisons table (columns ``scheme_a``, ``scheme_b``, ``metric``,
        ``ratio_<which>``, ``ratio_<which>_low``, ``ratio_<which>_high``).
    a, b
        The numerator and denominator schemes, in the orientation to print.
    which
        ``mean`` or ``p99`` (the statistic whose ratio the stats stage bootstrapped).
    **cell
        The cell's columns (distribution, dim, budget, sharpness), as for :func:`select_cells`.

    Notes
    -----
    If the table stores the pair as ``b / a`` with interval ``[l, h]``, the ratio ``a / b`` is
    ``1 / estimate`` with interval ``[1 / h, 1 / l]`` (the map x -> 1/x is decreasing on x > 0,
    so a percentile interval maps to the percentile interval of the inverse).
    """
    rows = select_cells(comparisons, "comparisons", metric=metric, **cell)
    forward = rows[(rows["scheme_a"] == a) & (rows["scheme_b"] == b)]
    backward = rows[(rows["scheme_a"] == b) & (rows["scheme_b"] == a)]
    if forward.empty and backward.empty:
        shown = ", ".join(f"{k}={v}" for k, v in cell.items() if v is not None)
        raise MissingCell(f"no comparisons rows for the pair {a}/{b}, metric={metric}, {shown}")
    swapped = forward.empty
    row = (backward if swapped else forward).iloc[0]
    est, low, high = (float(row[f"ratio_{which}{suffix}"]) for suffix in ("", "_low", "_high"))
    if swapped:
        est, low, high = _inverse(est), _inverse(high), _inverse(low)
    return PairRatio(estimate=est, low=low, high=high, swapped=swapped, row=row)


def _inverse(x: float) -> float:
    return math.nan if not math.isfinite(x) or x == 0 else 1.0 / x


def cell_of(mapping: Mapping[str, Any], keys: tuple[str, ...] = ("distribution", "dim", "budget", "sharpness")
            ) -> dict[str, Any]:
    """The cell columns of ``mapping`` (a claim's ``where``, a headline), sharpness as float."""
    out = {key: mapping[key] for key in keys if key in mapping}
    if "sharpness" in out:
        out["sharpness"] = float(out["sharpness"])
    return out


#: Hex digits of a cell's slice digest that the DAG passes to the readers (``slice_sha256`` of a
#: ``--cells`` entry): 64 bits tell an accidental mismatch apart, and keep the command lines of
#: stages that read hundreds of cells short.
SLICE_DIGEST_CHARS = 16


def slice_digest(config_slice: Any) -> str:
    """The first :data:`SLICE_DIGEST_CHARS` hex digits of the SHA-256 of ``config_slice`` as
    canonical JSON (keys sorted, no spaces): what a cell table's provenance is compared by."""
    import hashlib
    import json

    text = json.dumps(config_slice, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()[:SLICE_DIGEST_CHARS]


def check_provenance(path: Any, want: str, what: str) -> None:
    """Refuse a cell table whose provenance's config slice is not the one its cell is computed
    from (digest ``want``, :func:`slice_digest`): a table of the right cell made under another
    configuration (another base seed, trial count, sharpness list, ...) that ``results/`` copied
    from another run, or a cell redone by hand with another ``--config``, would otherwise be
    read as this run's (issue 33, point 7). A :class:`~kvasym.errors.DamagedFile`: inside
    ``results/`` it is moved aside and rebuilt."""
    import json

    from .dataset import read_metadata

    try:
        meta = read_metadata(path)
        stored = json.loads(meta["config_slice"])
    except KeyError:
        raise DamagedFile(path, f"the {what} table has no config_slice in its provenance") from None
    except (OSError, ValueError) as exc:
        raise DamagedFile(path, f"the {what} table's provenance is not readable ({exc})") from None
    got = slice_digest(stored)
    if got != want:
        shown = ", ".join(f"{k} = {stored[k]!r}" for k in ("base_seed", "trials", "seq_len", "n_queries", "sharpness")
                          if isinstance(stored, dict) and k in stored)
        raise DamagedFile(path, f"was made under another configuration: its provenance's config slice (digest "
                          f"{got}{'; ' + shown if shown else ''}) is not this cell's (digest {want})")


def read_cell_tables(paths: list, what: str, keys: tuple[str, ...], *, cells: list | None = None,
                     columns: list[str] | None = None, **expected: Any) -> pd.DataFrame:
    """Read the per-cell tables a stage combines, refusing a file filed under the wrong cell.

    Each file must hold exactly one cell (one value of each of ``keys``), agree with
    ``expected`` (column -> value, e.g. the job's distribution and dim) and hold a cell no other
    file holds (:func:`check_cell_file`). A valid table copied from another cell over this one,
    or two files of the same cell, would otherwise be measured and labelled as this cell.

    ``cells`` (optional, one mapping per path, e.g. ``{"scheme": "KV", "budget": 2}``) is the
    cell the DAG filed each path under: with it, a file holding another cell is itself the one
    refused (a :class:`~kvasym.errors.DamagedFile`, moved aside by ``kvasym stage``), where
    without it only the clash of two files holding the same cell is seen. A cell's
    ``slice_sha256`` (:func:`slice_digest` of the config slice the cell is computed from) is
    checked against the file's provenance (:func:`check_provenance`). ``columns``: read only
    these (with the cell columns).

    Raises
    ------
    KvasymError
        Naming the file, the column, what it holds and what was expected
        (:class:`~kvasym.errors.DamagedFile` when one file is at fault).
    """
    return pd.concat([frame for _, frame in iter_cell_tables(paths, what, keys, cells=cells, columns=columns,
                                                            **expected)], ignore_index=True)


def iter_cell_tables(paths: list, what: str, keys: tuple[str, ...], *, cells: list | None = None,
                     columns: list[str] | None = None, **expected: Any) -> Iterator[tuple[Any, pd.DataFrame]]:
    """:func:`read_cell_tables` one ``(path, frame)`` at a time, each checked as it is read (for
    a stage that cannot hold every table at once: the frontier reads the real rows' files)."""
    from .dataset import read_metrics_file

    seen: dict[tuple, Any] = {}
    if cells is not None and len(cells) != len(paths):
        raise KvasymError(f"{len(paths)} {what} files but {len(cells)} cells they are filed under")
    needed = None if columns is None else list(dict.fromkeys([*columns, *keys, *expected]))
    for index, path in enumerate(paths):
        cell = dict(cells[index]) if cells is not None else {}
        digest = cell.pop("slice_sha256", None)
        frame = read_metrics_file(path, columns=needed)
        check_cell_file(frame, path, what, keys, seen, **expected, **cell)
        if digest is not None:
            check_provenance(path, str(digest), what)
        yield path, frame


#: A cell file's place in the layout every stage writes: ``<table>/<distribution>/d<dim>/<scheme>/n<budget>.parquet``.
_CELL_PATH = re.compile(r"(?:^|/)(?P<distribution>[^/]+)/d(?P<dim>\d+)/(?P<scheme>[^/]+)/n(?P<budget>\d+)\.parquet$")


def cell_of_path(path: Any) -> dict[str, Any]:
    """The cell a metrics file is filed under, from its path in the results layout
    (``.../<distribution>/d<dim>/<scheme>/n<budget>.parquet``)."""
    match = _CELL_PATH.search(str(path).replace("\\", "/"))
    if match is None:
        raise KvasymError(f"{path}: not a cell file of the results layout (<distribution>/d<dim>/<scheme>/n<budget>"
                          ".parquet)")
    return {"distribution": match["distribution"], "dim": int(match["dim"]), "scheme": match["scheme"],
            "budget": int(match["budget"])}


def part_cells(artifact: str, parts: Iterable[Any], job_slice: Callable[[str, dict[str, Any]], Any],
               flag: str | None = None) -> list[dict[str, Any]]:
    """Each part's ``{distribution, dim}`` (a per-unit file of a stats or theory ``artifact``, read
    from its place in the results layout) and the digest of the slice of the job that writes it,
    ``job_slice(writer, cell)``: what the gather stage checks each part's provenance against.

    Raises
    ------
    KvasymError
        A part not in the results layout of ``artifact`` (naming ``flag``, the flag that would
        give its cells instead, when given).
    """
    from .artifacts import ARTIFACTS, template_regex

    (writer,) = ARTIFACTS[artifact].writers
    regex = re.compile(rf"(?:^|/){template_regex(artifact).pattern}$")
    cells = []
    for part in parts:
        match = regex.search(Path(part).as_posix())
        if match is None:
            hint = f"; give {flag}" if flag else ""
            raise KvasymError(f"{part}: not a part of the results layout ({ARTIFACTS[artifact].template}){hint}")
        cell = {"distribution": match["distribution"], "dim": int(match["dim"])}
        cells.append({**cell, "slice_sha256": slice_digest(job_slice(writer, cell))})
    return cells


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python value (messages show 64, not np.int32(64))."""
    return value.item() if isinstance(value, np.generic) else value


def parse_cells(text: str | None, what: str) -> list[dict[str, Any]] | None:
    """The ``--cells`` flag of a stage: a JSON list of objects (the cell of each input file)."""
    import json

    if text is None:
        return None
    try:
        cells = json.loads(text)
    except ValueError as exc:
        raise KvasymError(f"--{what} is not valid JSON ({exc})") from None
    if not isinstance(cells, list) or not all(isinstance(c, dict) for c in cells):
        raise KvasymError(f"--{what} must be a JSON list of objects (one cell per input file)")
    return cells


def check_cell_file(frame: pd.DataFrame, path: Any, what: str, keys: tuple[str, ...], seen: dict[tuple, Any],
                    **expected: Any) -> None:
    """Check that ``frame``, read from ``path``, holds one cell (one value of each of ``keys`` and
    of the ``expected`` columns), agrees with ``expected`` and is not a cell of ``seen`` (cell ->
    path of the files checked before; updated). An empty frame holds no cell and passes."""
    if not len(frame):
        return
    for column in (*expected, *keys):
        if column not in frame.columns:
            raise DamagedFile(path, f"the {what} table has no column {column!r}")
        values = pd.unique(frame[column])
        if len(values) != 1:
            raise DamagedFile(path, f"holds {column} = {sorted(map(str, values))}, not one cell")
    for column, want in expected.items():
        got = _plain(frame[column].iloc[0])
        if not (np.isclose(float(got), float(want)) if isinstance(want, float) else got == want):
            raise DamagedFile(path, f"holds {column} = {got!r} but is filed under {column} = {want!r}: "
                              "it is another cell's file")
    cell = tuple(_plain(frame[key].iloc[0]) for key in keys)
    if cell in seen:
        shown = ", ".join(f"{k} = {v!r}" for k, v in zip(keys, cell))
        raise KvasymError(f"{path} and {seen[cell]} both hold the cell {shown}: one of them is another "
                          "cell's file; delete the wrong one (or both) and rerun to rebuild it")
    seen[cell] = path


def read_metrics_rows(sources: list, table: str, keep: Mapping[str, Any], *, root: Any = None,
                      digests: Mapping[str, str] | None = None) -> pd.DataFrame:
    """The rows of a metrics table matching ``keep``, read file by file so that the whole table
    never sits in memory.

    Parameters
    ----------
    sources : list of path-like
        Metrics files (each holding one cell, checked to be the cell its path files it under and
        a cell no other file holds: a cell's file copied over another's would otherwise be read
        under the other's label) or folders (read whole, :func:`kvasym.dataset.read_table_folder`).
        Empty: the dataset under ``root``.
    table : str
        ``per_query`` or ``per_key``.
    keep : mapping
        Column -> the values kept (``sharpness`` compared with :func:`numpy.isclose`); None keeps all.
    root : path-like, optional
        The metrics dataset's root (``results/metrics``), read when ``sources`` is empty.
    digests : mapping, optional
        File -> :func:`slice_digest` of its cell's slice (the DAG's): the file's provenance must
        be this configuration's (:func:`check_provenance`).

    Returns
    -------
    pandas.DataFrame
        The kept rows of every source, concatenated.

    Raises
    ------
    KvasymError
        Neither ``sources`` nor ``root``; a file holding another cell, or made under another
        configuration (:class:`~kvasym.errors.DamagedFile`).
    """
    from pathlib import Path

    from .dataset import read_metrics_file, read_table, read_table_folder

    if not sources and root is None:
        raise KvasymError(f"no {table} metrics: give their files or the dataset's root")
    what = table.replace("_", "-")
    seen: dict[tuple, Any] = {}
    out = []
    for src in [Path(s) for s in sources] or [None]:
        if src is None:
            frame = read_table(root, table)
        elif src.is_dir():
            frame = read_table_folder(src, table)
        else:
            frame = read_metrics_file(src)
            check_cell_file(frame, src, what, ("distribution", "dim", "scheme", "budget"), seen, **cell_of_path(src))
            if str(src) in (digests or {}):  # the DAG's digest of the cell's slice (issue 33, point 7)
                check_provenance(src, str(digests[str(src)]), what)
        mask = np.ones(len(frame), dtype=bool)
        for column, allowed in keep.items():
            if allowed is None:
                continue
            values = frame[column].to_numpy()
            if column == "sharpness":
                mask &= np.isclose(values.astype(float)[:, None], np.asarray(allowed, dtype=float)[None, :]).any(axis=1)
            else:
                mask &= np.isin(values, list(allowed))
        out.append(frame[mask])
    return pd.concat(out, ignore_index=True)
