"""Mean per-query KL per layer and KV head of the real model's caches, from the real rows' files.

The real rows' per-query files (:func:`kvasym.stages.real_metrics.run_real_metrics`) number
their trials; each file's ``trial_map`` (Parquet key-value metadata) maps a trial to its text,
layer and KV head. :func:`real_kl_means` pools every query of every text per (distribution,
scheme, layer, KV head): the numbers the real-model heat map draws
(:mod:`kvasym.render.figures.real_heatmap`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..dataset import from_stored
from ..errors import DamagedFile, KvasymError
from . import REAL_SHARPNESS

__all__ = ["REAL_COLUMNS", "read_trial_map", "real_kl_means"]

#: The columns the means read from a real per-query file.
REAL_COLUMNS: tuple[str, ...] = ("distribution", "scheme", "budget", "sharpness", "trial", "kl")


def read_trial_map(path: str | os.PathLike, metadata: Mapping[bytes, bytes] | None) -> pd.DataFrame:
    """The ``trial_map`` of a real per-query file (``trial``, ``layer``, ``kv_head``; one row per trial).

    Parameters
    ----------
    path : path-like
        The file (named in errors).
    metadata : mapping or None
        Its Parquet key-value metadata.

    Returns
    -------
    pandas.DataFrame
        Integer columns ``trial``, ``layer``, ``kv_head``.

    Raises
    ------
    KvasymError
        Naming the file, when the map is absent or malformed (not JSON, not a list of objects,
        a key missing, a value not an integer, a trial listed twice).
    """
    raw = (metadata or {}).get(b"trial_map")
    if raw is None:
        raise KvasymError(f"{path}: no trial_map in the Parquet metadata (real-model per-query files, written by "
                          "kvasym.real.evaluate.run_real_metrics, map each trial to its text, layer and KV head)")
    try:
        entries = json.loads(raw)
    except ValueError as exc:
        raise KvasymError(f"{path}: its trial_map is not valid JSON ({exc})") from None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise KvasymError(f"{path}: its trial_map must be a JSON list of {{trial, text, layer, kv_head}} objects")
    wanted = ["trial", "layer", "kv_head"]
    if not entries:
        return pd.DataFrame({k: np.zeros(0, dtype=np.int64) for k in wanted})
    frame = pd.DataFrame(entries)
    absent = [k for k in wanted if k not in frame.columns or frame[k].isna().any()]
    if absent:
        raise KvasymError(f"{path}: its trial_map lacks {', '.join(absent)} for some trial")
    frame = frame[wanted]
    numeric = frame.apply(pd.to_numeric, errors="coerce")
    if (numeric.isna().any().any()
            or not np.all(numeric.to_numpy(dtype=float) == np.round(numeric.to_numpy(dtype=float)))):
        raise KvasymError(f"{path}: its trial_map has a trial, layer or kv_head that is not an integer")
    frame = numeric.astype(np.int64)
    if frame["trial"].duplicated().any():
        raise KvasymError(f"{path}: its trial_map lists trial "
                          f"{int(frame.loc[frame['trial'].duplicated(), 'trial'].iloc[0])} twice")
    return frame


def real_kl_means(files: Any, *, budget: int, sharpness: float = REAL_SHARPNESS) -> pd.DataFrame:
    """Mean per-query KL per (distribution, scheme, layer, KV head) of real per-query files.

    The mean is over every query (query head, position) of every text at ``budget`` and
    ``sharpness`` (1: the model's own attention), each query weighing the same. Only
    :data:`REAL_COLUMNS` and the ``trial_map`` of each file are read.

    Parameters
    ----------
    files : path-like, sequence of path-like, or None
        The real rows' per-query files (:func:`kvasym.stages.real_metrics.run_real_metrics`).
    budget : int
        The budget whose rows are kept.
    sharpness : float, optional
        The sharpness whose rows are kept (default :data:`kvasym.real.REAL_SHARPNESS`).

    Returns
    -------
    pandas.DataFrame
        Columns ``distribution``, ``scheme``, ``budget``, ``layer``, ``kv_head``, ``kl_mean`` and
        ``n_queries``, sorted; empty (with those columns) without files.

    Raises
    ------
    KvasymError
        Naming the file: one without the map (:func:`read_trial_map`), without a column, or with
        a trial absent from its map; :class:`~kvasym.errors.DamagedFile` for an unreadable one.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    out_columns = ["distribution", "scheme", "budget", "layer", "kv_head", "kl_mean", "n_queries"]
    keys = ["distribution", "scheme", "layer", "kv_head"]
    parts = []
    if files is None:
        files = []
    paths = [Path(files)] if isinstance(files, (str, os.PathLike)) else [Path(f) for f in files]
    for path in paths:
        try:
            source = pq.ParquetFile(path)
            schema = source.schema_arrow
        except (OSError, pa.ArrowException) as exc:
            raise DamagedFile(path, f"not a readable real per-query file ({exc})") from None
        absent = [c for c in REAL_COLUMNS if c not in schema.names]
        if absent:
            raise KvasymError(f"{path}: no column(s) {', '.join(absent)} (not a per-query metrics file?)")
        trial_map = read_trial_map(path, schema.metadata)
        try:
            frame = from_stored(source.read(columns=list(REAL_COLUMNS)).to_pandas())
        except (OSError, pa.ArrowException) as exc:
            raise DamagedFile(path, f"not a readable real per-query file ({exc})") from None
        trials = np.unique(frame["trial"].to_numpy())
        unmapped = np.setdiff1d(trials, trial_map["trial"].to_numpy())
        if unmapped.size:
            shown = ", ".join(map(str, unmapped[:5].tolist())) + (", ..." if unmapped.size > 5 else "")
            raise KvasymError(f"{path}: trial(s) {shown} are not in its trial_map "
                              f"({unmapped.size} of {trials.size} trials)")
        keep = ((frame["budget"].to_numpy() == int(budget))
                & np.isclose(frame["sharpness"].to_numpy(dtype=float), float(sharpness)))
        sums = (frame[keep].groupby(["distribution", "scheme", "trial"], sort=False)["kl"]
                .agg(kl_sum="sum", n_queries="count").reset_index())
        parts.append(sums.merge(trial_map, on="trial", how="left", validate="many_to_one"))
    if not parts:
        return pd.DataFrame({c: [] for c in out_columns})
    pooled = pd.concat(parts, ignore_index=True).groupby(keys, sort=True)[["kl_sum", "n_queries"]].sum().reset_index()
    pooled = pooled[pooled["n_queries"] > 0]
    pooled["kl_mean"] = pooled["kl_sum"] / pooled["n_queries"]
    pooled["budget"] = int(budget)
    return (pooled[out_columns].astype({"layer": np.int64, "kv_head": np.int64, "n_queries": np.int64})
            .reset_index(drop=True))
