"""The sequence-length sweep (issue 14, point 9): attention damage against the number of keys.

At one (distribution, d, sharpness) the sweep draws, for every sequence length ``L`` and trial
``t``, a fresh cache of ``L`` keys and values and its queries (seeds keyed by the sweep, the
distribution, ``d``, ``L`` and ``t``: never by execution order), quantizes it with each scheme at
each budget (rotation and sketch seeds keyed the same way plus the cache side), and records per
trial the mean over its queries of the KL divergence of attention and of the output direction
error ``eps_dir^T = 1 - cos(T, T_hat)`` (:func:`sweep_trial_rows`).

The sharpness is held fixed: queries are scaled so that ``q.k / sqrt(d)`` has standard deviation
1 over each trial's keys (:func:`kvasym.distributions.rescale_queries`), so only ``L`` changes.
To second order in the logit error ``delta l``, ``KL ~ (s^2/2) Var_p(delta l)``: for errors
independent of the weights ``p`` the variance does not depend on ``L`` once attention spreads
over many keys, so the prediction is a slope of 0 of ``log KL`` on ``log L``.

:func:`length_slopes` fits, per (scheme, budget, metric), the OLS slope of the log of each trial's
mean metric on ``log L`` with a trial-cluster bootstrap interval
(:func:`kvasym.stats.linear_slope_ci`): the trials are the units, resampled whole (every length
of a trial index together).

References
----------
.. [1] Cover, T. M. and Thomas, J. A. (2006) *Elements of Information Theory*, 2nd ed., Wiley
   (the second-order expansion of KL between nearby distributions).
.. [2] Efron, B. and Tibshirani, R. J. (1993) *An Introduction to the Bootstrap*, Chapman & Hall
   (percentile intervals; resampling clusters).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from .errors import KvasymError

__all__ = ["SWEEP_METRICS", "length_slopes", "sweep_summary", "sweep_trial_rows"]

#: The per-query metrics the sweep records (trial means).
SWEEP_METRICS: tuple[str, ...] = ("kl", "t_eps_dir")


def sweep_trial_rows(spec: Any, dim: int, seq_len: int, n_queries: int, trials: int, schemes: Mapping[str, Any],
                     budgets: Sequence[int], sharpness: float, *, base_seed: int,
                     norm_dtype: str = "float32", kernel: str = "numpy") -> pd.DataFrame:
    """Per-trial means of :data:`SWEEP_METRICS` at one sequence length, for every scheme and budget.

    Parameters
    ----------
    spec : kvasym.distributions.DistributionSpec
        The distribution.
    dim, seq_len, n_queries, trials : int
        Head dimension, keys per trial, queries per trial, trials.
    schemes : mapping of str to Scheme
        The schemes, by name.
    budgets : sequence of int
        Budgets ``n``.
    sharpness : float
        Logit standard deviation ``s``.
    base_seed : int
        The study's base seed.
    norm_dtype : str, optional
        Storage of the norms.
    kernel : str, optional
        As :func:`kvasym.evaluate.quantize_pair` (``"auto"``: the compiled kernels where they
        implement the side, for quantizing and dequantizing; the DAG's stage passes it).

    Returns
    -------
    pandas.DataFrame
        Columns ``distribution, dim, sharpness, seq_len, scheme, budget, trial, n_queries, kl,
        t_eps_dir, kl_p99`` (``kl_p99``: the trial's 99th percentile of per-query KL).
    """
    from .distributions import generate_trial
    from .evaluate import dequantize_with, quantize_pair
    from .metrics import trial_metrics

    from dataclasses import replace

    rows = []
    # the sweep's own data: the length is part of the seed identity (the data's name
    # ``<name>.L<seq_len>``), so each length is a fresh draw, independent of the grid's trials
    own = replace(spec, keys_of=f"{spec.name}.L{int(seq_len)}")
    for trial in range(trials):
        data = generate_trial(own, dim, seq_len, n_queries, base_seed, trial)
        identity = ("seq_len_sweep", own.data_name, dim, trial)
        for name, scheme in schemes.items():
            for budget in budgets:
                pair = quantize_pair(data.keys, data.values, scheme, int(budget), base_seed=base_seed,
                                     identity=identity, norm_dtype=norm_dtype, kernel=kernel)
                per_query, _ = trial_metrics(data.queries, data.keys, data.values, dequantize_with(pair["K"], kernel),
                                             dequantize_with(pair["V"], kernel), float(sharpness))
                kl = np.asarray(per_query["kl"], dtype=np.float64)
                rows.append({"distribution": spec.name, "dim": int(dim), "sharpness": float(sharpness),
                             "seq_len": int(seq_len), "scheme": name, "budget": int(budget), "trial": trial,
                             "n_queries": int(kl.size), "kl": float(np.mean(kl)),
                             "t_eps_dir": float(np.mean(per_query["t_eps_dir"])),
                             "kl_p99": float(np.quantile(kl, 0.99))})
    return pd.DataFrame(rows)


def sweep_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Mean over trials of each metric per (scheme, budget, seq_len), with the trials' standard
    error (``<metric>_se``) and ``n_trials``: the sweep's table."""
    keys = ["distribution", "dim", "sharpness", "scheme", "budget", "seq_len"]
    grouped = rows.groupby(keys, sort=True)
    out = grouped[list(SWEEP_METRICS)].mean()
    for metric in SWEEP_METRICS:
        out[f"{metric}_se"] = grouped[metric].std(ddof=1) / np.sqrt(grouped[metric].count())
    out["n_trials"] = grouped["trial"].nunique()
    return out.reset_index()


def length_slopes(rows: pd.DataFrame, *, n_boot: int, base_seed: int) -> pd.DataFrame:
    """Slope of ``log`` (trial mean metric) on ``log seq_len`` per (scheme, budget, metric).

    The points are one per (trial, length); the interval resamples trials (clusters) whole.

    Parameters
    ----------
    rows : pandas.DataFrame
        :func:`sweep_trial_rows` of every length.
    n_boot : int
        Bootstrap replicates.
    base_seed : int
        Base seed of the bootstrap (identity: the scheme, budget and metric).

    Returns
    -------
    pandas.DataFrame
        ``distribution, dim, sharpness, scheme, budget, metric, slope, low, high, n_lengths,
        n_trials, min_seq_len, max_seq_len`` (``slope`` NaN where a value is not positive or
        fewer than two lengths exist).
    """
    from .stats import linear_slope_ci

    need = {"distribution", "dim", "sharpness", "seq_len", "scheme", "budget", "trial", *SWEEP_METRICS}
    absent = sorted(need - set(rows.columns))
    if absent:
        raise KvasymError(f"sequence-length slopes: no column(s) {', '.join(absent)}")
    out = []
    for (dist, dim, sharp, scheme, budget), g in rows.groupby(["distribution", "dim", "sharpness", "scheme",
                                                               "budget"], sort=True):
        for metric in SWEEP_METRICS:
            y = g[metric].to_numpy(dtype=np.float64)
            lengths = g["seq_len"].to_numpy(dtype=np.float64)
            row = {"distribution": dist, "dim": int(dim), "sharpness": float(sharp), "scheme": scheme,
                   "budget": int(budget), "metric": metric, "slope": np.nan, "low": np.nan, "high": np.nan,
                   "n_lengths": int(np.unique(lengths).size), "n_trials": int(g["trial"].nunique()),
                   "min_seq_len": int(lengths.min()), "max_seq_len": int(lengths.max())}
            if row["n_lengths"] >= 2 and np.all(y > 0) and np.all(np.isfinite(y)):
                fit = linear_slope_ci(np.log(lengths), np.log(y), n_boot=n_boot, base_seed=base_seed,
                                      clusters=g["trial"].to_numpy(),
                                      identity=("seq_len_sweep", dist, int(dim), scheme, int(budget), metric))
                low, high = (fit["low"], fit["high"]) if fit["n_clusters"] >= 2 else (np.nan, np.nan)
                row.update(slope=float(fit["slope"]), low=float(low), high=float(high))
            out.append(row)
    return pd.DataFrame(out)
