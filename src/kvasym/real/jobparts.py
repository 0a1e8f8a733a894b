"""One model job's units split round robin into parts, and the parts' rows joined back.

A long model-level job (the passkey trials of one length, the long-context windows of one
length) is a loop over independent units: trials ``(depth, trial)``, windows ``window``. Each
unit's rows depend on the unit's identity only (its prompt or window, its seeds
``(base seed, text, layer, KV head, side)`` with a text naming the unit), never on the units run
before it in the same process. So ``P`` jobs can run the units side by side: part ``p`` of ``P``
runs units ``p, p + P, p + 2P, ...`` of the one-job order (:func:`select_round_robin`: round
robin, so the parts' costs are about equal), and the parts' rows, concatenated and stably sorted
by the unit columns, are row for row the rows of the one job (:func:`join_by_units`), because
the one job visits its units in ascending order of those columns and writes each unit's rows
together.

A part records itself in its provenance slice as ``"part": [p, P]`` (:func:`part_slice`); the
job's slice without parts carries no such key, so a configuration with ``P = 1`` writes the
same slice as before parts existed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from ..errors import KvasymError

__all__ = ["check_parts", "join_by_units", "part_of", "part_slice", "read_job_parts", "select_round_robin"]

T = TypeVar("T")


def _check_part(part: Sequence[int]) -> tuple[int, int]:
    try:
        p, total = (int(v) for v in part)
    except (TypeError, ValueError):
        raise KvasymError(f"part must be a pair (p, P) of integers, got {part!r}") from None
    if not 0 <= p < total:
        raise KvasymError(f"part must be (p, P) with 0 <= p < P, got {(p, total)}")
    return p, total


def select_round_robin(units: Sequence[T], part: Sequence[int], what: str = "units") -> list[T]:
    """Part ``p`` of ``P`` of ``units``: ``units[p::P]``.

    Parameters
    ----------
    units : sequence
        Every unit of the job, in the one job's order.
    part : pair of int
        ``(p, P)`` with ``0 <= p < P <= len(units)``.
    what : str
        What the units are, for the error message (e.g. ``"passkey trials of length 1024"``).

    Returns
    -------
    list
        The units part ``p`` runs, in the one job's order.

    Raises
    ------
    KvasymError
        If ``part`` is not a pair with ``0 <= p < P`` or ``P`` exceeds the number of units (a
        part would run nothing).
    """
    p, total = _check_part(part)
    if total > len(units):
        raise KvasymError(f"part ({p}, {total}): the job has {len(units)} {what}, fewer than its {total} parts; "
                          "give fewer parts")
    return list(units[p::total])


def part_slice(slice_: Mapping[str, Any], part: Sequence[int]) -> dict[str, Any]:
    """The provenance slice of part ``(p, P)`` of the job whose slice is ``slice_``: the job's slice
    itself when ``P = 1``, else the job's slice plus ``"part": [p, P]``."""
    p, total = _check_part(part)
    return dict(slice_) if total == 1 else {**slice_, "part": [p, total]}


def part_of(slice_: Mapping[str, Any]) -> tuple[int, int]:
    """The ``(p, P)`` a provenance slice records (:func:`part_slice`); ``(0, 1)`` without one."""
    return _check_part(slice_.get("part", (0, 1)))


def _job_identity(slice_: Mapping[str, Any]) -> str:
    """What names a job whatever its part: its slice without ``part``, as a string."""
    return repr(sorted((k, repr(v)) for k, v in slice_.items() if k != "part"))


def check_parts(slices: Sequence[Mapping[str, Any]], names: Sequence[str]) -> None:
    """Refuse a set of part files that is not, for each job, its parts ``0..P-1`` exactly once.

    Parameters
    ----------
    slices : sequence of mapping
        Each file's provenance slice.
    names : sequence of str
        Each file's name, for the message.

    Raises
    ------
    KvasymError
        If two files are the same part of one job, or a job's parts do not all agree on ``P`` or
        miss one (the message names the job's files).
    """
    jobs: dict[str, dict[int, str]] = {}
    totals: dict[str, set[int]] = {}
    for slice_, name in zip(slices, names):
        p, total = part_of(slice_)
        job = _job_identity(slice_)
        if p in jobs.setdefault(job, {}):
            raise KvasymError(f"{name} and {jobs[job][p]} are both part {p} of one job")
        jobs[job][p] = name
        totals.setdefault(job, set()).add(total)
    for job, found in jobs.items():
        total = totals[job]
        if len(total) != 1 or set(found) != set(range(next(iter(total)))):
            raise KvasymError(f"the parts {sorted(found.values())} are parts {sorted(found)} of {sorted(total)}: "
                              "a job's parts must be 0..P-1 of one P (rerun the missing part)")


def join_by_units(frames: Sequence[Any], unit_columns: Sequence[str]) -> Any:
    """The rows of one job from its parts' rows: concatenated and stably sorted by ``unit_columns``.

    Parameters
    ----------
    frames : sequence of pandas.DataFrame
        The parts' frames (any order), each holding whole units.
    unit_columns : sequence of str
        The columns naming a unit; the one job visits its units in ascending order of them and
        writes a unit's rows together.

    Returns
    -------
    pandas.DataFrame
        The rows in the one job's order (index reset). A stable sort keeps each unit's rows in
        their order within its part.

    Raises
    ------
    KvasymError
        If a unit column is missing or one unit's rows lie in more than one frame.
    """
    import pandas as pd

    if not frames:
        raise KvasymError("join_by_units: no frames")
    keys = list(unit_columns)
    owner: dict[tuple, int] = {}
    for i, frame in enumerate(frames):
        missing = [c for c in keys if c not in frame.columns]
        if missing:
            raise KvasymError(f"join_by_units: part {i} lacks the unit columns {missing}")
        for unit in frame[keys].drop_duplicates().itertuples(index=False, name=None):
            if owner.setdefault(unit, i) != i:
                raise KvasymError(f"join_by_units: unit {dict(zip(keys, unit))} has rows in parts {owner[unit]} "
                                  f"and {i}")
    joined = pd.concat(list(frames), ignore_index=True)
    return joined.sort_values(keys, kind="mergesort").reset_index(drop=True)


def read_job_parts(paths: Sequence[str], unit_columns: Sequence[str]) -> Any:
    """The rows of the jobs whose part files are ``paths``, as the jobs would write them whole.

    Each file's provenance slice (its Parquet metadata ``config_slice``) names its job and part;
    every job's parts ``0..P-1`` must be there once (:func:`check_parts`). Each job's parts are
    joined by ``unit_columns`` (:func:`join_by_units`), and the jobs are concatenated in the order
    their first file appears in ``paths`` (the order one file per job was read in before parts).

    Parameters
    ----------
    paths : sequence of str
        Part files (Parquet, written with their slice in the metadata).
    unit_columns : sequence of str
        The columns naming a unit within one job, in whose ascending order the job writes them.

    Returns
    -------
    pandas.DataFrame

    Raises
    ------
    KvasymError
        If a file's provenance is missing or not JSON, or the parts are incomplete or repeated
        (the message names the files).
    """
    import json

    import pandas as pd

    from ..dataset import read_metadata, read_parquet_checked

    if not paths:
        raise KvasymError("read_job_parts: no part files")
    slices = []
    for path in paths:
        meta = read_metadata(path)
        if "config_slice" not in meta:
            raise KvasymError(f"{path}: no provenance (config_slice) to tell its job and part")
        try:
            slices.append(json.loads(meta["config_slice"]))
        except ValueError:
            raise KvasymError(f"{path}: its provenance (config_slice) is not JSON") from None
    check_parts(slices, list(paths))
    jobs: dict[str, list[Any]] = {}
    for path, slice_ in zip(paths, slices):
        jobs.setdefault(_job_identity(slice_), []).append(read_parquet_checked(path))
    return pd.concat([join_by_units(frames, unit_columns) for frames in jobs.values()], ignore_index=True)
