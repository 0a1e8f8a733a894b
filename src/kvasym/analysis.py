"""The statistics and theory stages: from the metrics dataset to comparison tables.

- :func:`run_stats` (one job per (distribution, dim)): for every budget, sharpness and pair of
  schemes (in config order, ``a`` before ``b``), the tests of :func:`kvasym.stats.compare` on
  each metric, per query and per trial; cluster-bootstrap CIs of the ratio of mean and of p99
  KL; the energy distance between the six-dimensional error clouds; per-cell summaries and
  per-trial means.
- :func:`run_theory` (one job per (distribution, dim)): measured QJL variance ratios against
  their closed forms, the KS test of rotated coordinates against the Beta law, and the
  Jensen-bias slope from the per-key tables.
- :func:`gather` concatenates the per-(distribution, dim) tables and adds Holm-adjusted p-values
  per family (one family per metric and test across the whole study).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd

from . import stats
from .dataset import provenance, read_parquet_checked, write_frame_atomic
from .errors import KvasymError
from .pipeline import load_manifest, verified_trial
from .seeds import derived_seed
from .theory import inner_product_errors, jensen_points, ks_against_beta, qjl_closed_forms, rotated_marginal_sample

#: Metrics compared between schemes. The K and V ones are per-trial aggregates repeated on each
#: query row, so only their per-trial tests are meaningful (the per-query ones are reported but
#: flagged by ``per_trial_only``).
COMPARED_METRICS = ("kl", "recall_top5", "t_eps_dir", "t_snr_db", "k_eps_dir", "k_snr_db", "v_eps_dir", "v_snr_db")
PER_TRIAL_ONLY = {"k_eps_dir", "k_snr_db", "v_eps_dir", "v_snr_db"}
#: The six coordinates of the error framework: scale (Shannon bits) and direction at K, V, T.
ERROR_6D = ("k_eff_bits", "k_phi", "v_eff_bits", "v_phi", "t_eff_bits", "t_phi")
SUMMARY_METRICS = (
    "recall_top5", "t_eps_dir", "t_phi", "t_snr_db", "t_eff_bits", "k_eps_dir", "k_phi", "k_snr_db",
    "k_eff_bits", "v_eps_dir", "v_phi", "v_snr_db", "v_eff_bits",
    "k_bits_payload", "k_bits_side", "v_bits_payload", "v_bits_side",
)
CELL = ["distribution", "kind", "dim", "budget", "sharpness"]


def _by_trial(frame: pd.DataFrame, metric: str) -> list[np.ndarray]:
    return [g[metric].to_numpy() for _, g in frame.groupby("trial", sort=True)]


def run_stats(
    slice_: Mapping[str, Any],
    per_query_paths: Sequence[str | os.PathLike],
    out_comparisons: str | os.PathLike,
    out_summary: str | os.PathLike,
    out_trials: str | os.PathLike,
) -> None:
    """Comparisons, summaries and per-trial means of one (distribution, dim)."""
    frame = pd.concat([read_parquet_checked(p) for p in per_query_paths], ignore_index=True)
    settings = slice_["stats"]
    schemes = list(slice_["schemes"])
    missing = set(schemes) - set(frame["scheme"].unique())
    if missing:
        raise KvasymError(f"metrics of scheme(s) {sorted(missing)} are missing from the stats inputs")
    rows: list[dict[str, Any]] = []
    summaries: list[dict[str, Any]] = []
    for (budget, sharpness), group in frame.groupby(["budget", "sharpness"], sort=True):
        cell = {
            "distribution": slice_["distribution"],
            "kind": str(group["kind"].iloc[0]),
            "dim": int(slice_["dim"]),
            "budget": int(budget),
            "sharpness": float(sharpness),
        }
        per_scheme = {s: g.sort_values(["trial", "query"]) for s, g in group.groupby("scheme")}
        for scheme in schemes:
            g = per_scheme[scheme]
            summary = stats.cell_summary(
                g["kl"].to_numpy(), g["recall_top5"].to_numpy(), {m: g[m].to_numpy() for m in SUMMARY_METRICS}
            )
            summaries.append({**cell, "scheme": scheme, "n_trials": int(g["trial"].nunique()), "n_queries": len(g), **summary})
        for a, b in combinations(schemes, 2):
            ga, gb = per_scheme[a], per_scheme[b]
            identity = (slice_["distribution"], int(slice_["dim"]), int(budget), float(sharpness).hex(), a, b)
            for metric in COMPARED_METRICS:
                result = stats.compare(_by_trial(ga, metric), _by_trial(gb, metric))
                row = {**cell, "scheme_a": a, "scheme_b": b, "metric": metric, "per_trial_only": metric in PER_TRIAL_ONLY, **result}
                if metric == "kl":
                    for label, statistic in (("mean", "mean"), ("p99", ("quantile", 0.99))):
                        ci = stats.bootstrap_ratio_ci(
                            _by_trial(ga, "kl"), _by_trial(gb, "kl"), statistic=statistic,
                            n_boot=settings["n_boot"], base_seed=slice_["base_seed"],
                            identity=(*identity, "kl", label), paired=True,
                        )
                        row.update({f"ratio_{label}": ci["estimate"], f"ratio_{label}_low": ci["low"], f"ratio_{label}_high": ci["high"]})
                rows.append(row)
            energy = stats.energy_distance(
                ga[list(ERROR_6D)].to_numpy(), gb[list(ERROR_6D)].to_numpy(),
                n_permutations=settings["n_permutations"], base_seed=slice_["base_seed"],
                identity=(*identity, "error6d"), max_n=settings["energy_max_n"],
            )
            rows.append({**cell, "scheme_a": a, "scheme_b": b, "metric": "error6d", "per_trial_only": False,
                         "energy": energy["statistic"], "energy_p": energy["p"],
                         "energy_log10_p": energy["log10_p"], "n_a": energy["n_x"], "n_b": energy["n_y"]})
    trial_means = (
        frame.groupby(["distribution", "kind", "dim", "scheme", "budget", "sharpness", "trial"], sort=True)[
            ["kl", *SUMMARY_METRICS]
        ]
        .mean()
        .reset_index()
    )
    meta = provenance(slice_)
    write_frame_atomic(pd.DataFrame(rows), out_comparisons, meta)
    write_frame_atomic(pd.DataFrame(summaries), out_summary, meta)
    write_frame_atomic(trial_means, out_trials, meta)


def run_theory(
    slice_: Mapping[str, Any],
    data_json: str | os.PathLike,
    per_key_paths: Sequence[str | os.PathLike],
    out: str | os.PathLike,
) -> None:
    """Theory checks of one (distribution, dim): QJL ratios, Beta marginals, Jensen slopes."""
    digests = load_manifest(data_json, slice_)
    name, dim, base = slice_["distribution"]["name"], int(slice_["dim"]), int(slice_["base_seed"])
    settings = slice_["theory"]
    rows: list[dict[str, Any]] = []
    n_trials = min(int(settings["trials"]), int(slice_["trials"]))
    sums: dict[int, list[dict[str, float]]] = {b: [] for b in slice_["budgets"]}
    marginal: list[np.ndarray] = []
    work_dim = dim
    for trial in range(n_trials):
        data = verified_trial(slice_, trial, digests)
        identity = (name, dim, trial)
        for budget in slice_["budgets"]:
            sums[budget].append(
                inner_product_errors(data.keys, budget, base_seed=base, identity=identity, n_probes=settings["n_probes"])
            )
        sample, work_dim = rotated_marginal_sample(data.keys, derived_seed(base, "rotation", *identity, "K"))
        marginal.append(sample)
    base_row = {"distribution": name, "kind": slice_["distribution"]["kind"], "dim": dim}
    for budget, per_trial in sums.items():
        theory = qjl_closed_forms(dim, budget)
        for check, num, den, key in (
            ("qjl_vs_residual", "ss_qjl", "ss_residual", "vs_residual"),
            ("qjl_vs_nbit", "ss_qjl", "ss_nbit", "vs_nbit"),
        ):
            # ratio of mean squared errors, clusters = trials (sums over (probe, key) pairs)
            a = [np.array([t[num] / t["n"]]) for t in per_trial]
            b = [np.array([t[den] / t["n"]]) for t in per_trial]
            ci = stats.bootstrap_ratio_ci(a, b, statistic="mean", n_boot=settings["n_boot"], base_seed=base,
                                          identity=(name, dim, budget, check), paired=True)
            rows.append({**base_row, "check": check, "scheme": "", "budget": budget, "sharpness": np.nan,
                         "estimate": ci["estimate"], "low": ci["low"], "high": ci["high"], "theory": theory[key],
                         "statistic": np.nan, "p": np.nan, "n": float(len(per_trial))})
    ks = ks_against_beta(np.concatenate(marginal), work_dim)
    rows.append({**base_row, "check": "ks_beta", "scheme": "", "budget": -1, "sharpness": np.nan,
                 "estimate": ks["statistic"], "low": np.nan, "high": np.nan, "theory": np.nan,
                 "statistic": ks["statistic"], "p": ks["p"], "n": ks["n"]})
    keys = pd.concat([read_parquet_checked(p) for p in per_key_paths], ignore_index=True)
    for (scheme, budget, sharpness), g in keys.groupby(["scheme", "budget", "sharpness"], sort=True):
        var, excess, kept = jensen_points(g)
        trials = g["trial"].to_numpy()[kept]
        if var.size < 3 or np.ptp(var) == 0:
            continue  # no variance to regress on (e.g. a lossless cell)
        fit = stats.linear_slope_ci(var, excess, n_boot=settings["n_boot"], base_seed=base,
                                    identity=(name, dim, scheme, int(budget), float(sharpness).hex(), "jensen"),
                                    clusters=trials)
        # one trial gives no between-cluster spread: report the slope without an interval
        low, high = (fit["low"], fit["high"]) if fit["n_clusters"] >= 2 else (np.nan, np.nan)
        rows.append({**base_row, "check": "jensen_slope", "scheme": scheme, "budget": int(budget),
                     "sharpness": float(sharpness), "estimate": fit["slope"], "low": low, "high": high,
                     "theory": np.nan, "statistic": fit["r"], "p": np.nan, "n": float(fit["n"])})
    write_frame_atomic(pd.DataFrame(rows), out, provenance(slice_))


def gather(paths: Sequence[str | os.PathLike], out: str | os.PathLike, holm_columns: Sequence[str] = ()) -> None:
    """Concatenate tables; for each ``holm_columns`` log10-p column add a Holm-adjusted one.

    Families: one per (metric, test) across the whole study, i.e. all distributions, dims,
    budgets, sharpness values and scheme pairs of that metric.
    """
    frame = pd.concat([read_parquet_checked(p) for p in paths], ignore_index=True)
    for column in holm_columns:
        adjusted = np.full(len(frame), np.nan)
        for _, index in frame.groupby("metric").groups.items():
            values = frame.loc[index, column].to_numpy(dtype=float)
            adjusted[np.asarray(index)] = stats.holm_log10(values)
        frame[f"{column}_holm"] = adjusted
    write_frame_atomic(frame, out, {"sources": str(len(paths))})
