"""The statistics of one (distribution, dim): every scheme pair's tests and ratio intervals, the
energy test of the six error coordinates, per-cell summaries and per-trial means, from the cells'
per-query rows (stage ``stats``, :mod:`kvasym.stages.stats`, reads the files and writes the tables).

For every budget, sharpness and pair of schemes (in config order, ``a`` before ``b``), the tests
of :func:`kvasym.stats.compare` on each metric, per query and per unit; paired CIs of the
ratio of mean KL (Fieller's, over units) and of p99 KL (percentile cluster bootstrap), both
from :func:`kvasym.stats.bootstrap_ratio_ci` (stored as ``a / b``: read them
oriented with :func:`kvasym.cells.pair_ratio`) beside its second-order prediction from the key
sides' closed-form error energies (``ratio_theory``, :func:`kvasym.theory.predicted_kl_ratio`);
the energy test of the six-dimensional error summaries with units as its points
(:func:`kvasym.stats.energy_test_paired`: one point per unit and scheme, the within-unit swap
null, enough permutations for its Holm family, which is this job's: every (budget, sharpness,
scheme pair) of the (distribution, dim), so adding a distribution to the grid changes no
existing p); per-cell summaries (KL, and the bounded measures TV and JS by mean and p99, top-1
agreement and the catastrophic share) and per-trial means (with the trial's ``text``: its unit
for real rows, empty for synthetic ones).

The independent unit of the per-unit tests and intervals is the trial for synthetic
distributions (every trial an independent draw) and the TEXT for real-model ones, whose trials
are (text, layer, KV head) caches nested in texts (their files map trials to texts in the
``trial_map`` metadata, :func:`trial_texts`): a text's caches are resampled together and enter
the paired tests as one mean. Each comparison row says which (``unit``: trial or text, the
energy test's too) and how many (``n_units``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd

from . import stats
from .errors import KvasymError
from .schemes import scheme_from_dict
from .theory import predicted_kl_ratio

__all__ = ["COMPARED_METRICS", "ERROR_6D", "PER_TRIAL_ONLY", "SUMMARY_METRICS", "TAIL_METRICS", "cell_statistics",
           "trial_texts", "unit_summaries"]

#: Metrics compared between schemes. The K and V ones are per-trial aggregates repeated on each
#: query row, so only their per-trial tests are meaningful (the per-query ones are reported but
#: flagged by ``per_trial_only``).
COMPARED_METRICS = ("kl", "recall_top5", "t_eps_dir", "t_snr_db", "k_eps_dir", "k_snr_db", "v_eps_dir", "v_snr_db")
PER_TRIAL_ONLY = {"k_eps_dir", "k_snr_db", "v_eps_dir", "v_snr_db"}
#: The six coordinates of the error framework: scale (Shannon bits) and direction at K, V, T.
ERROR_6D = ("k_eff_bits", "k_phi", "v_eff_bits", "v_phi", "t_eff_bits", "t_phi")
SUMMARY_METRICS = (
    "recall_top5", "top1", "catastrophic", "t_eps_dir", "t_phi", "t_snr_db", "t_eff_bits", "k_eps_dir", "k_phi",
    "k_snr_db", "k_eff_bits", "v_eps_dir", "v_phi", "v_snr_db", "v_eff_bits",
    "k_bits_payload", "k_bits_side", "v_bits_payload", "v_bits_side", "k_bits_side16", "v_bits_side16",
)
#: Bounded per-query measures summarised beside KL by their mean and 99th percentile (issue 14,
#: point 7: KL reaches 1e3-1e5 nats on near-one-hot cells; TV is in [0, 1], JS in [0, ln 2]).
TAIL_METRICS = ("tv", "js")
#: Family-wise level the energy test's permutations are sized for (:func:`kvasym.stats.permutations_for_family`).
ENERGY_ALPHA = 0.05


def _by_trial(frame: pd.DataFrame, metric: str) -> list[np.ndarray]:
    return [g[metric].to_numpy() for _, g in frame.groupby("trial", sort=True)]


class _SplitScheme:
    """One scheme's rows of a cell, sorted by (trial, query), cut into trials and units once.

    :func:`_by_trial` and :func:`_by_unit` (the reference) run a pandas groupby per metric and
    pair, a third of a synthetic stats job; the rows of a trial are contiguous here (sorted by
    trial), so the same arrays are slices of the column at the trial boundaries, and a unit's
    array is its trials' slices in trial order, units sorted by label: what the groupby gives.
    """

    def __init__(self, frame: pd.DataFrame, texts: Mapping[int, str] | None) -> None:
        self.frame = frame
        trial = frame["trial"].to_numpy()
        self.bounds = np.flatnonzero(trial[1:] != trial[:-1]) + 1
        self.units: list[list[int]] | None = None
        if texts is not None:
            labels = [texts[int(t)] for t in trial[np.concatenate([[0], self.bounds])]] if trial.size else []
            by_label: dict[str, list[int]] = {}
            for index, label in enumerate(labels):
                by_label.setdefault(label, []).append(index)
            self.units = [by_label[label] for label in sorted(by_label)]
        self._cache: dict[str, list[np.ndarray]] = {}

    def by_trial(self, metric: str) -> list[np.ndarray]:
        """The metric's values of each trial (trials sorted), queries in order."""
        if metric not in self._cache:
            self._cache[metric] = np.split(self.frame[metric].to_numpy(), self.bounds)
        return self._cache[metric]

    def by_unit(self, metric: str) -> list[np.ndarray]:
        """The metric's values of each unit (texts sorted by name, or trials), queries in order."""
        parts = self.by_trial(metric)
        if self.units is None:
            return parts
        return [np.concatenate([parts[i] for i in unit]) for unit in self.units]


def _by_unit(frame: pd.DataFrame, metric: str, texts: Mapping[int, str] | None) -> list[np.ndarray]:
    """The metric's values of each unit (texts sorted by name, or trials), queries in order."""
    if texts is None:
        return _by_trial(frame, metric)
    unit = frame["trial"].map(texts)
    return [g[metric].to_numpy() for _, g in frame.assign(_unit=unit).groupby("_unit", sort=True)]


def unit_summaries(frame: pd.DataFrame, texts: Mapping[int, str] | None) -> np.ndarray:
    """``(units, 6)``: per unit (trial, or text for real rows; sorted) the mean of each of the six
    error coordinates (:data:`ERROR_6D`) over its queries; K and V are per-trial constants, so
    for a trial their mean is that constant."""
    unit = frame["trial"] if texts is None else frame["trial"].map(texts)
    return frame.assign(_unit=unit).groupby("_unit", sort=True)[list(ERROR_6D)].mean().to_numpy()


def trial_texts(paths: Sequence[str | os.PathLike]) -> dict[int, str] | None:
    """The text of every trial from the per-query files' ``trial_map`` metadata (real-model
    files), or None when no file has one (synthetic: each trial is its own unit).

    Raises
    ------
    KvasymError
        Naming the file, when some files have a map and others not, a map is not a JSON list
        of objects with an integer ``trial`` and a string ``text``, or two files map a trial to
        different texts.
    """
    import pyarrow.parquet as pq

    maps: dict[int, str] = {}
    with_map = []
    for path in paths:
        raw = (pq.read_schema(path).metadata or {}).get(b"trial_map")
        with_map.append(raw is not None)
        if raw is None:
            continue
        try:
            entries = json.loads(raw)
        except ValueError as exc:
            raise KvasymError(f"{path}: its trial_map is not valid JSON ({exc})") from None
        for entry in entries if isinstance(entries, list) else [None]:
            trial = entry.get("trial") if isinstance(entry, dict) else None
            text = entry.get("text") if isinstance(entry, dict) else None
            if isinstance(trial, bool) or not isinstance(trial, int) or not isinstance(text, str):
                raise KvasymError(f"{path}: its trial_map must list {{trial: int, text: str}} objects, got {entry!r}")
            if maps.setdefault(trial, text) != text:
                raise KvasymError(f"{path}: its trial_map puts trial {trial} in text {text!r}, another file in "
                                  f"{maps[trial]!r}")
    if any(with_map) and not all(with_map):
        missing = [str(p) for p, has in zip(paths, with_map) if not has]
        raise KvasymError(f"{missing[0]}: no trial_map, where the other per-query files of its cell have one")
    return maps if any(with_map) else None


def _in_trial_query_order(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` sorted by (trial, query): as it is when its file was written in that order (the
    stages write it so), checked in one pass, since sorting a real cell's 516,096 rows per
    scheme and sharpness (argsort and a copy of every column) was a quarter of the real stats
    job; otherwise ``sort_values`` (stable: the same rows in the same order either way)."""
    trial = frame["trial"].to_numpy()
    query = frame["query"].to_numpy()
    step_t, step_q = np.diff(trial), np.diff(query)
    if np.all((step_t > 0) | ((step_t == 0) & (step_q > 0))):
        return frame
    return frame.sort_values(["trial", "query"])


def cell_statistics(
    slice_: Mapping[str, Any], budget_frames: Iterable[tuple[int, list[pd.DataFrame]]],
    texts: Mapping[int, str] | None,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Comparisons, summaries and per-trial means of one (distribution, dim) (module docstring).

    Parameters
    ----------
    slice_ : mapping
        The stats job's slice: ``distribution``, ``dim``, ``schemes`` (in config order),
        ``scheme_specs``, ``base_seed`` and ``stats`` (``n_boot``, ``n_permutations``).
    budget_frames : iterable of (int, list of DataFrame)
        Each budget's per-query frames (one per scheme), budgets in increasing order; a budget's
        frames are dropped once measured (a real cell's 12 files are 25M rows).
    texts : mapping or None
        Each trial's text (:func:`trial_texts`): real rows' unit; None: each trial its own unit.

    Returns
    -------
    comparisons, summaries, trial_means : DataFrame
        One row per (cell, scheme pair, metric), per (cell, scheme), per (cell, scheme, trial).

    Raises
    ------
    KvasymError
        A scheme of the slice with no rows, or a trial missing from ``texts``.
    """
    by_budget = dict(budget_frames)
    settings = slice_["stats"]
    schemes = list(slice_["schemes"])
    missing = set(schemes) - {str(part["scheme"].iloc[0]) for parts in by_budget.values() for part in parts}
    if missing:
        raise KvasymError(f"metrics of scheme(s) {sorted(missing)} are missing from the stats inputs")
    specs = {name: scheme_from_dict(name, slice_["scheme_specs"][name]) for name in schemes}
    trials = {int(t) for parts in by_budget.values() for part in parts for t in part["trial"].unique()}
    unmapped = set() if texts is None else trials - set(texts)
    if unmapped:
        raise KvasymError(f"trial(s) {sorted(unmapped)[:5]} of the per-query files are not in their trial_map")
    unit = {"unit": "trial" if texts is None else "text"}
    rows: list[dict[str, Any]] = []
    summaries: list[dict[str, Any]] = []
    trial_parts: list[pd.DataFrame] = []
    n_cells = sum(len(set().union(*(part["sharpness"].unique().tolist() for part in parts)))
                  for parts in by_budget.values())
    # the energy test's Holm family: this (distribution, dim)'s cells times its scheme pairs
    energy_family = n_cells * len(list(combinations(schemes, 2)))
    n_swaps = max(int(settings["n_permutations"]), stats.permutations_for_family(max(energy_family, 1), ENERGY_ALPHA))
    for budget_key in sorted(by_budget):
        frame = pd.concat(by_budget.pop(budget_key), ignore_index=True)
        _measure_budget(frame, slice_, settings, schemes, specs, texts, unit, energy_family, n_swaps, rows,
                        summaries)
        trial_parts.append(
            frame.groupby(["distribution", "kind", "dim", "scheme", "budget", "sharpness", "trial"], sort=True)[
                ["kl", *TAIL_METRICS, *SUMMARY_METRICS]
            ]
            .mean()
            .reset_index()
        )
        del frame
    energy_rows = [r for r in rows if r["metric"] == "error6d"]
    adjusted = stats.holm_log10([r["energy_log10_p"] for r in energy_rows])
    for r, value in zip(energy_rows, adjusted):
        r["energy_log10_p_holm"] = float(value)
    trial_means = pd.concat(trial_parts, ignore_index=True).sort_values(
        ["distribution", "kind", "dim", "scheme", "budget", "sharpness", "trial"], kind="stable").reset_index(drop=True)
    # the independent unit each trial belongs to: its text for real rows ("" for synthetic ones,
    # whose every trial is its own unit), so that claims over per-trial means (distribution_ratio)
    # can resample and pair texts, not the caches nested in them
    trial_means["text"] = "" if texts is None else trial_means["trial"].map(texts).astype(str)
    return pd.DataFrame(rows), pd.DataFrame(summaries), trial_means


def _measure_budget(frame: pd.DataFrame, slice_: Mapping[str, Any], settings: Mapping[str, Any], schemes: list[str],
                    specs: Mapping[str, Any], texts: Mapping[int, str] | None, unit: Mapping[str, str],
                    energy_family: int, n_swaps: int, rows: list[dict[str, Any]],
                    summaries: list[dict[str, Any]]) -> None:
    """The comparison and summary rows of one budget's cells (one per sharpness), appended."""
    for (budget, sharpness), group in frame.groupby(["budget", "sharpness"], sort=True):
        cell = {
            "distribution": slice_["distribution"],
            "kind": str(group["kind"].iloc[0]),
            "dim": int(slice_["dim"]),
            "budget": int(budget),
            "sharpness": float(sharpness),
        }
        per_scheme = {s: _in_trial_query_order(g) for s, g in group.groupby("scheme")}
        for scheme in schemes:
            g = per_scheme[scheme]
            summary = stats.cell_summary(
                g["kl"].to_numpy(), g["recall_top5"].to_numpy(), {m: g[m].to_numpy() for m in SUMMARY_METRICS},
                {m: g[m].to_numpy() for m in TAIL_METRICS},
            )
            summaries.append({**cell, "scheme": scheme, "n_trials": int(g["trial"].nunique()), "n_queries": len(g),
                              **summary})
        split = {s: _SplitScheme(g, texts) for s, g in per_scheme.items()}
        for a, b in combinations(schemes, 2):
            ga, gb = per_scheme[a], per_scheme[b]
            identity = (slice_["distribution"], int(slice_["dim"]), int(budget), float(sharpness).hex(), a, b)
            trials_a = sorted(ga["trial"].unique().tolist())
            units = None if texts is None else [texts[t] for t in trials_a]
            for metric in COMPARED_METRICS:
                result = stats.compare(split[a].by_trial(metric), split[b].by_trial(metric), units=units)
                row = {**cell, "scheme_a": a, "scheme_b": b, "metric": metric,
                       "per_trial_only": metric in PER_TRIAL_ONLY, **unit, **result}
                if metric == "kl":
                    for label, statistic in (("mean", "mean"), ("p99", ("quantile", 0.99))):
                        ci = stats.bootstrap_ratio_ci(
                            split[a].by_unit("kl"), split[b].by_unit("kl"), statistic=statistic,
                            n_boot=settings["n_boot"], base_seed=slice_["base_seed"],
                            identity=(*identity, "kl", label), paired=True, undefined="nan",
                        )
                        row.update({f"ratio_{label}": ci["estimate"], f"ratio_{label}_low": ci["low"],
                                    f"ratio_{label}_high": ci["high"]})
                    # what the key sides' closed-form error energies predict (NaN if unrotated)
                    row["ratio_theory"] = predicted_kl_ratio(specs[a].K, specs[b].K, int(budget), int(slice_["dim"]))
                rows.append(row)
            energy = stats.energy_test_paired(
                unit_summaries(ga, texts), unit_summaries(gb, texts), n_permutations=n_swaps,
                base_seed=slice_["base_seed"], identity=(*identity, "error6d"),
            )
            rows.append({**cell, "scheme_a": a, "scheme_b": b, "metric": "error6d", "per_trial_only": False,
                         **unit, "n_units": energy["n_units"], "n_trials": len(trials_a),
                         "energy": energy["statistic"], "energy_p": energy["p"],
                         "energy_log10_p": energy["log10_p"], "energy_n_permutations": energy["n_permutations"],
                         "energy_exact": energy["exact"], "energy_family_size": energy_family,
                         "n_a": len(ga), "n_b": len(gb)})
