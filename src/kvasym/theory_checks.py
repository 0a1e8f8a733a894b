"""The theory checks of one (distribution, dim) (stage ``theory``, :mod:`kvasym.stages.theory`, reads
the trials and per-key tables and writes the table).

Measured QJL inner-product error-variance ratios against their closed forms
(:func:`kvasym.theory.qjl_closed_forms`), for QJL's Gaussian sketch and for the orthogonal
hadamard sketch (checks ``hadamard_vs_*``; same keys, probes, rotation and scalar codes), the
KS test of rotated key coordinates against the Beta law, the same QJL ratios and Beta distance
under a Haar-random rotation in place of the WHT (checks ``haar_vs_residual``, ``haar_vs_nbit``,
``ks_beta_haar``: issue 14's ablation; same keys, probes and seeds), and the Jensen-bias slope of the
attention-weight excess on the logit error variance from the per-key tables, for every scheme,
alone (``jensen_slope``), holding the key's log reference weight fixed
(``jensen_slope_adjusted``) and holding its log norm fixed (``jensen_slope_norm``), each beside
Jensen's prediction 1/2 (``theory``, :data:`kvasym.theory.JENSEN_SLOPE`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from . import stats
from .errors import KvasymError
from .seeds import derived_seed
from .theory import (
    JENSEN_SLOPE,
    inner_product_errors,
    jensen_points,
    ks_beta_distance,
    qjl_closed_forms,
    rotated_marginal_sample,
)

__all__ = ["theory_checks"]


def theory_checks(slice_: Mapping[str, Any], trial_data: Callable[[int], Any], keys: pd.DataFrame) -> pd.DataFrame:
    """The theory checks of one (distribution, dim) (module docstring), one row per check.

    Parameters
    ----------
    slice_ : mapping
        The theory job's slice: ``distribution`` (name, kind), ``dim``, ``base_seed``,
        ``budgets``, ``trials`` and ``theory`` (``trials``, ``n_probes``, ``n_boot``).
    trial_data : callable
        Trial index -> its data (``.keys``, (n, dim)), for trials ``0 .. min(theory.trials,
        trials) - 1`` (:func:`kvasym.manifest.verified_trial`).
    keys : DataFrame
        The per-key rows of every scheme and budget of the (distribution, dim).

    Returns
    -------
    DataFrame
        Columns distribution, kind, dim, check, scheme, budget, sharpness, estimate, low, high,
        theory, statistic, p, n.
    """
    name, dim, base = slice_["distribution"]["name"], int(slice_["dim"]), int(slice_["base_seed"])
    settings = slice_["theory"]
    rows: list[dict[str, Any]] = []
    n_trials = min(int(settings["trials"]), int(slice_["trials"]))
    sums: dict[int, list[dict[str, float]]] = {b: [] for b in slice_["budgets"]}
    haar: dict[int, list[dict[str, float]]] = {b: [] for b in slice_["budgets"]}
    marginal: list[np.ndarray] = []
    marginal_haar: list[np.ndarray] = []
    work_dim = dim
    for trial in range(n_trials):
        data = trial_data(trial)
        identity = (name, dim, trial)
        for budget in slice_["budgets"]:
            sums[budget].append(
                inner_product_errors(data.keys, budget, base_seed=base, identity=identity,
                                     n_probes=settings["n_probes"], hadamard=True)
            )
            haar[budget].append(
                inner_product_errors(data.keys, budget, base_seed=base, identity=identity,
                                     n_probes=settings["n_probes"], transform="haar")
            )
        rotation_seed = derived_seed(base, "rotation", *identity, "K")
        sample, work_dim = rotated_marginal_sample(data.keys, rotation_seed)
        marginal.append(sample)
        marginal_haar.append(rotated_marginal_sample(data.keys, rotation_seed, "haar")[0])
    base_row = {"distribution": name, "kind": slice_["distribution"]["kind"], "dim": dim}
    for budget, per_trial in sums.items():
        closed = {"gaussian": qjl_closed_forms(dim, budget), "hadamard": qjl_closed_forms(dim, budget, "hadamard")}
        # under the Haar rotation the working dimension is d itself: the closed form (that of d's
        # codebook) is the Gaussian sketch's at a power-of-two d, and not computed otherwise
        closed["haar"] = closed["gaussian"] if dim & (dim - 1) == 0 else {"vs_residual": np.nan, "vs_nbit": np.nan}
        for check, num, den, sketch, key in (
            ("qjl_vs_residual", "ss_qjl", "ss_residual", "gaussian", "vs_residual"),
            ("qjl_vs_nbit", "ss_qjl", "ss_nbit", "gaussian", "vs_nbit"),
            ("hadamard_vs_residual", "ss_qjl_hadamard", "ss_residual", "hadamard", "vs_residual"),
            ("hadamard_vs_nbit", "ss_qjl_hadamard", "ss_nbit", "hadamard", "vs_nbit"),
            ("haar_vs_residual", "ss_qjl", "ss_residual", "haar", "vs_residual"),
            ("haar_vs_nbit", "ss_qjl", "ss_nbit", "haar", "vs_nbit"),
        ):
            source = haar[budget] if sketch == "haar" else per_trial
            # ratio of mean squared errors, clusters = trials (sums over (probe, key) pairs)
            a = [np.array([t[num] / t["n"]]) for t in source]
            b = [np.array([t[den] / t["n"]]) for t in source]
            ci = stats.bootstrap_ratio_ci(a, b, statistic="mean", n_boot=settings["n_boot"], base_seed=base,
                                          identity=(name, dim, budget, check), paired=True)
            rows.append({**base_row, "check": check, "scheme": "", "budget": budget, "sharpness": np.nan,
                         "estimate": ci["estimate"], "low": ci["low"], "high": ci["high"],
                         "theory": closed[sketch][key],
                         "statistic": np.nan, "p": np.nan, "n": float(len(per_trial))})
    # the Kolmogorov distance from the Beta law with its cluster-bootstrap interval (trials as
    # clusters): what "follows the Beta law" claims are decided on, as an equivalence margin
    ks = ks_beta_distance(marginal, work_dim, n_boot=settings["n_boot"], base_seed=base, identity=(name, dim))
    rows.append({**base_row, "check": "ks_beta", "scheme": "", "budget": -1, "sharpness": np.nan,
                 "estimate": ks["statistic"], "low": ks["low"], "high": ks["high"], "theory": np.nan,
                 "statistic": ks["statistic"], "p": ks["p"], "n": ks["n"]})
    ks = ks_beta_distance(marginal_haar, dim, n_boot=settings["n_boot"], base_seed=base, identity=(name, dim, "haar"))
    rows.append({**base_row, "check": "ks_beta_haar", "scheme": "", "budget": -1, "sharpness": np.nan,
                 "estimate": ks["statistic"], "low": ks["low"], "high": ks["high"], "theory": np.nan,
                 "statistic": ks["statistic"], "p": ks["p"], "n": ks["n"]})
    for (scheme, budget, sharpness), g in keys.groupby(["scheme", "budget", "sharpness"], sort=True):
        var, excess, kept = jensen_points(g)
        trials = g["trial"].to_numpy()[kept]
        log_ref = np.log(g["weight_ref_mean"].to_numpy(dtype=float)[kept])
        with np.errstate(divide="ignore"):
            log_norm = np.log(g["key_norm"].to_numpy(dtype=float)[kept])
        cell_row = {**base_row, "scheme": scheme, "budget": int(budget), "sharpness": float(sharpness),
                    "theory": JENSEN_SLOPE, "p": np.nan}
        for check, controls in (("jensen_slope", None), ("jensen_slope_adjusted", log_ref),
                                ("jensen_slope_norm", log_norm)):
            fit = None
            if var.size >= 3 and np.ptp(var) > 0:
                try:
                    fit = stats.linear_slope_ci(
                        var, excess, n_boot=settings["n_boot"], base_seed=base, clusters=trials, controls=controls,
                        identity=(name, dim, scheme, int(budget), float(sharpness).hex(), "jensen"))
                except KvasymError:  # the variance collinear with the control (or a zero key): no partial slope
                    fit = None
            if fit is None:
                # no variance to regress on (a lossless cell, two keys per trial): the row says the
                # slope is undefined, and a claim on it is inconclusive rather than an unknown check
                rows.append({**cell_row, "check": check, "estimate": np.nan, "low": np.nan, "high": np.nan,
                             "statistic": np.nan, "n": float(var.size)})
                continue
            # one trial gives no between-cluster spread: report the slope without an interval
            low, high = (fit["low"], fit["high"]) if fit["n_clusters"] >= 2 else (np.nan, np.nan)
            rows.append({**cell_row, "check": check, "estimate": fit["slope"], "low": low, "high": high,
                         "statistic": fit["r"], "n": float(fit["n"])})
    return pd.DataFrame(rows)
