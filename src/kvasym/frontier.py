"""The rate-distortion frontier: attention damage against measured total bits per coordinate.

Every scheme is one point per budget ``n``: its rate is the TOTAL bits per coordinate of the
packed K and V caches, payload plus side information (norms, residual norms, means, KLT bases,
coordinate scales, group scales and zero points, seeds), as the metrics stage measured them from
the packed files (:meth:`kvasym.cache.PackedCache.bits_per_coordinate`), never the nominal ``n``:

.. math::

    R = \\tfrac12 \\left(b^K_{\\mathrm{payload}} + b^K_{\\mathrm{side}}
        + b^V_{\\mathrm{payload}} + b^V_{\\mathrm{side}}\\right),

the bits of one K coordinate and one V coordinate averaged (both caches have ``rows x d``
coordinates). Its distortions are the attention measures: mean KL, p99 KL (lower is better),
top-5 routing recall (higher is better) and the attention output's direction error
``eps_dir^T = 1 - cos(T, T_hat)`` (lower is better).

:func:`pareto_mask` marks the points no other point dominates (at most the rate and at most the
distortion, one of them strictly); :func:`frontier_points` builds the per-cell table and its
Pareto flags per (distribution, dim, sharpness); :func:`unit_values` the per-unit (trial, or
text for real caches) values the equal-rate claims resample; :func:`interpolate_at_rate`
evaluates a scheme between two of its budgets at another scheme's rate; :func:`best_per_budget`
is the frontier table (the best scheme within each rate allowance).

A scheme may have points beyond the grid's budgets (config key ``frontier.extra_budgets``, e.g.
RKV at n = 5, so that its measured rates reach past KQV's n = 4 rate): the frontier stage marks
them in the column :data:`EXTRA` of both tables. They are points of the frontier like any other
(Pareto sets, allowances, interpolation ranges), but not nominal budgets of its own: the table's
rows and an every-cell claim's cells are the grid's budgets (:func:`grid_points`).

References
----------
.. [1] Cover, T. M. and Thomas, J. A. (2006) *Elements of Information Theory*, 2nd ed., ch. 10
   (rate-distortion; the operational frontier is the lower envelope of achievable points).
.. [2] Kung, H. T., Luccio, F. and Preparata, F. P. (1975) "On finding the maxima of a set of
   vectors", J. ACM 22(4):469-476 (the sort-and-sweep Pareto set in two dimensions).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from .errors import KvasymError

__all__ = ["BITS_COLUMNS", "DISTORTIONS", "EXTRA", "RATE_SLACK", "best_per_budget", "equal_rate_pairs",
           "frontier_points", "grid_points", "interpolate_at_rate",
           "mark_pareto", "pareto_mask", "total_bits", "unit_values"]

#: The measured bit columns of a per-query table (per trial, repeated on its query rows).
BITS_COLUMNS: tuple[str, ...] = ("k_bits_payload", "k_bits_side", "v_bits_payload", "v_bits_side")
#: Frontier distortion -> (per-query source column, True if higher is better).
DISTORTIONS: dict[str, tuple[str, bool]] = {
    "kl_mean": ("kl", False),
    "kl_p99": ("kl", False),
    "recall_mean": ("recall_top5", True),
    "t_eps_dir_mean": ("t_eps_dir", False),
}
#: The rate allowance of the frontier table above each nominal budget n: n payload bits plus half
#: a bit of side information per coordinate (what a rotated scheme's float32 norms cost at
#: d = 64 is 0.5, at d = 128 0.25): a scheme whose side bits exceed it is judged at a higher n.
RATE_SLACK = 0.5
CELL = ("distribution", "dim", "sharpness")
#: The column of the frontier's points and units tables (stage frontier) that is True for a
#: point at one of its scheme's ``frontier.extra_budgets``, False at a budget of the grid's.
EXTRA = "extra_budget"


def grid_points(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of a frontier points or units table at the grid's budgets: those whose
    :data:`EXTRA` is False (every row of a table without the column, e.g. one made by hand)."""
    return frame[~frame[EXTRA].to_numpy(dtype=bool)] if EXTRA in frame.columns else frame


def total_bits(k_payload: Any, k_side: Any, v_payload: Any, v_side: Any) -> np.ndarray:
    """Total bits per coordinate of the KV cache, ``(K payload + K side + V payload + V side) / 2``.

    Parameters
    ----------
    k_payload, k_side, v_payload, v_side : array_like
        Measured bits per coordinate of each part (broadcast together).

    Returns
    -------
    numpy.ndarray
        The rate ``R`` of the module docstring, float64.
    """
    parts = [np.asarray(x, dtype=np.float64) for x in (k_payload, k_side, v_payload, v_side)]
    return (parts[0] + parts[1] + parts[2] + parts[3]) / 2.0


def pareto_mask(rate: Any, loss: Any) -> np.ndarray:
    """Points of the two-objective frontier: minimise ``rate`` and ``loss``.

    Point i is dominated if some j has ``rate_j <= rate_i`` and ``loss_j <= loss_i`` with at
    least one strict; the mask is True for the points no other point dominates (two identical
    points do not dominate each other: both are kept). Negate a higher-is-better measure.

    Parameters
    ----------
    rate, loss : array_like
        1-D, the same length, finite (a NaN would make domination undefined).

    Returns
    -------
    numpy.ndarray of bool

    Notes
    -----
    Sort by (rate, loss) and sweep (Kung et al. 1975): with ``m`` the smallest loss among points
    of strictly smaller rate and ``g`` the smallest loss among points of the same rate, point i is
    on the frontier iff ``loss_i == g`` and ``loss_i < m``. O(N log N).
    """
    r = np.asarray(rate, dtype=np.float64)
    v = np.asarray(loss, dtype=np.float64)
    if r.ndim != 1 or r.shape != v.shape:
        raise KvasymError(f"pareto_mask needs two 1-D arrays of one length, got shapes {r.shape} and {v.shape}")
    if not (np.all(np.isfinite(r)) and np.all(np.isfinite(v))):
        raise KvasymError("pareto_mask: rates and losses must be finite (a NaN or inf point cannot be ranked)")
    mask = np.zeros(r.size, dtype=bool)
    order = np.lexsort((v, r))
    best_before = np.inf
    i = 0
    while i < order.size:
        j = i
        while j < order.size and r[order[j]] == r[order[i]]:
            j += 1
        group = order[i:j]
        group_min = v[group[0]]  # sorted by loss within a rate
        if group_min < best_before:
            mask[group[v[group] == group_min]] = True
        best_before = min(best_before, group_min)
        i = j
    return mask


def _need(frame: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    absent = [c for c in columns if c not in frame.columns]
    if absent:
        raise KvasymError(f"{what}: no column(s) {', '.join(absent)}")


def frontier_points(per_query: pd.DataFrame) -> pd.DataFrame:
    """One frontier point per (distribution, dim, sharpness, scheme, budget) of a per-query table.

    Columns: the cell, ``n_trials``, ``n_queries``, ``bits_payload``, ``bits_side`` and
    ``bits_total`` (means over trials of the measured per-trial bits, K and V averaged),
    ``k_bits_total``, ``v_bits_total``, the :data:`DISTORTIONS` (``kl_p99`` is
    ``numpy.quantile(kl, 0.99)`` over every query of the cell, as in
    :func:`kvasym.stats.cell_summary`) and ``pareto_<distortion>``: on the frontier of its
    (distribution, dim, sharpness) among every scheme and budget (:func:`pareto_mask`; recall
    negated).
    """
    _need(per_query, [*CELL, "scheme", "budget", "trial", "kl", "recall_top5", "t_eps_dir", *BITS_COLUMNS],
          "frontier points")
    rows = []
    keys = [*CELL, "scheme", "budget"]
    for key, g in per_query.groupby(keys, sort=True):
        per_trial = g.groupby("trial", sort=True)[list(BITS_COLUMNS)].first()
        k_tot = (per_trial["k_bits_payload"] + per_trial["k_bits_side"]).to_numpy()
        v_tot = (per_trial["v_bits_payload"] + per_trial["v_bits_side"]).to_numpy()
        kl = g["kl"].to_numpy(dtype=np.float64)
        rows.append({
            **dict(zip(keys, key)),
            "n_trials": int(per_trial.shape[0]),
            "n_queries": int(len(g)),
            "bits_payload": float(np.mean((per_trial["k_bits_payload"] + per_trial["v_bits_payload"]) / 2)),
            "bits_side": float(np.mean((per_trial["k_bits_side"] + per_trial["v_bits_side"]) / 2)),
            "bits_total": float(np.mean(total_bits(per_trial["k_bits_payload"], per_trial["k_bits_side"],
                                                   per_trial["v_bits_payload"], per_trial["v_bits_side"]))),
            "k_bits_total": float(np.mean(k_tot)),
            "v_bits_total": float(np.mean(v_tot)),
            "kl_mean": float(np.mean(kl)),
            "kl_p99": float(np.quantile(kl, 0.99)),
            "recall_mean": float(np.mean(g["recall_top5"].to_numpy(dtype=np.float64))),
            "t_eps_dir_mean": float(np.mean(g["t_eps_dir"].to_numpy(dtype=np.float64))),
        })
    points = pd.DataFrame(rows)
    if points.empty:
        raise KvasymError("frontier points: the per-query table has no rows")
    return mark_pareto(points)


def mark_pareto(points: pd.DataFrame) -> pd.DataFrame:
    """``points`` with a ``pareto_<distortion>`` column per :data:`DISTORTIONS`: True for the
    points on the frontier of their (distribution, dim, sharpness) (:func:`pareto_mask` of
    ``bits_total`` against the distortion; recall negated). Points computed file by file
    (:func:`frontier_points` of each cell) are marked together here."""
    _need(points, [*CELL, "bits_total", *DISTORTIONS], "frontier Pareto flags")
    points = points.reset_index(drop=True).copy()
    for name, (_, higher) in DISTORTIONS.items():
        flags = np.zeros(len(points), dtype=bool)
        for _, index in points.groupby(list(CELL), sort=False).groups.items():
            idx = np.asarray(index)
            loss = points.loc[idx, name].to_numpy(dtype=np.float64)
            flags[idx] = pareto_mask(points.loc[idx, "bits_total"].to_numpy(), -loss if higher else loss)
        points[f"pareto_{name}"] = flags
    return points


def unit_values(per_query: pd.DataFrame, units: Mapping[int, str] | None = None) -> pd.DataFrame:
    """Per-unit means of one table: the unit is the trial, or the text of ``units`` (trial ->
    text, real caches) whose trials are pooled query by query.

    Columns: the cell, ``scheme``, ``budget``, ``unit`` (str), ``bits_total`` (the unit's mean
    measured rate), ``kl``, ``recall_top5`` and ``t_eps_dir`` (means over the unit's queries).
    """
    _need(per_query, [*CELL, "scheme", "budget", "trial", "kl", "recall_top5", "t_eps_dir", *BITS_COLUMNS],
          "frontier unit values")
    frame = per_query.assign(bits_total=total_bits(*(per_query[c] for c in BITS_COLUMNS)))
    unit = frame["trial"].map(units) if units is not None else frame["trial"].map(lambda t: f"trial{int(t):05d}")
    if unit.isna().any():
        raise KvasymError("frontier unit values: a trial has no text in the trial map")
    frame = frame.assign(unit=unit.astype(str))
    out = (frame.groupby([*CELL, "scheme", "budget", "unit"], sort=True)[["bits_total", "kl", "recall_top5",
                                                                           "t_eps_dir"]]
           .mean().reset_index())
    return out


def interpolate_at_rate(rates: Any, values: Any, at: Any, *, log: bool = True) -> np.ndarray:
    """A scheme's distortion at rate ``at`` from its points ``(rates, values)`` (its budgets).

    Linear in the rate between the two points that bracket ``at``; with ``log`` (default) the
    logarithm of the distortion is linear (distortions fall about geometrically with each bit:
    the Lloyd-Max MSE by about 4x per bit), i.e. ``v(at) = v_0^{1-w} v_1^w`` with
    ``w = (at - r_0) / (r_1 - r_0)``. No extrapolation: outside ``[min rates, max rates]`` the
    result is NaN.

    Parameters
    ----------
    rates, values : array_like
        1-D, one point per budget; ``rates`` strictly increasing after sorting (distinct).
    at : array_like
        Rates to evaluate at.

    Returns
    -------
    numpy.ndarray
        Same shape as ``at``; NaN outside the rate range.
    """
    r = np.asarray(rates, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    if r.ndim != 1 or r.shape != v.shape or r.size < 1:
        raise KvasymError(f"interpolate_at_rate needs 1-D rates and values of one length, got {r.shape}, {v.shape}")
    order = np.argsort(r)
    r, v = r[order], v[order]
    if np.any(np.diff(r) <= 0):
        raise KvasymError(f"interpolate_at_rate: rates must be distinct, got {r.tolist()}")
    if log:
        if np.any(v <= 0):
            raise KvasymError("interpolate_at_rate: log interpolation needs positive values")
        v = np.log(v)
    x = np.asarray(at, dtype=np.float64)
    out = np.interp(x, r, v)
    out = np.where((x < r[0]) | (x > r[-1]), np.nan, out)
    return np.exp(out) if log else out


def best_per_budget(points: pd.DataFrame, budgets: Sequence[int], *, distortion: str = "kl_mean",
                    slack: float = RATE_SLACK) -> pd.DataFrame:
    """The frontier table: per (distribution, dim, sharpness) and nominal budget ``n``, the point
    with the best ``distortion`` among those whose measured total rate is at most ``n + slack``.

    Columns: the cell, ``budget`` (n), ``allowance`` (``n + slack``), ``scheme``,
    ``scheme_budget`` (the n the scheme ran at), ``bits_total``, ``value``, ``runner_up`` and
    ``runner_up_value`` (the best point of another scheme; empty/NaN if none), ``n_points``.
    A cell and allowance no point fits gives ``scheme`` empty and NaNs.
    """
    if distortion not in DISTORTIONS:
        raise KvasymError(f"unknown frontier distortion {distortion!r}; known: {', '.join(DISTORTIONS)}")
    higher = DISTORTIONS[distortion][1]
    rows: list[dict[str, Any]] = []
    for key, g in points.groupby(list(CELL), sort=True):
        for n in budgets:
            allowance = float(n) + float(slack)
            fit = g[g["bits_total"] <= allowance + 1e-12]
            row: dict[str, Any] = {**dict(zip(CELL, key)), "budget": int(n), "allowance": allowance,
                                   "n_points": int(len(fit)), "scheme": "", "scheme_budget": -1,
                                   "bits_total": np.nan, "value": np.nan, "runner_up": "",
                                   "runner_up_value": np.nan}
            if len(fit):
                ranked = fit.sort_values([distortion, "bits_total", "scheme"], ascending=[not higher, True, True])
                best = ranked.iloc[0]
                row.update(scheme=str(best["scheme"]), scheme_budget=int(best["budget"]),
                           bits_total=float(best["bits_total"]), value=float(best[distortion]))
                others = ranked[ranked["scheme"] != best["scheme"]]
                if len(others):
                    row.update(runner_up=str(others.iloc[0]["scheme"]),
                               runner_up_value=float(others.iloc[0][distortion]))
            rows.append(row)
    return pd.DataFrame(rows)


def equal_rate_pairs(units: pd.DataFrame, *, a: str, b: str, budget: int, metric: str = "kl",
                     fixed: str = "same") -> pd.DataFrame:
    """Per unit, scheme ``a`` against scheme ``b`` at one rate: the pairs an equal-rate claim
    resamples (:func:`kvasym.stats.bootstrap_ratio_ci`, paired over units).

    Parameters
    ----------
    units : pandas.DataFrame
        :func:`unit_values` rows of ONE (distribution, dim, sharpness).
    a, b : str
        The schemes.
    budget : int
        The budget of the fixed point.
    metric : str
        ``kl``, ``recall_top5`` or ``t_eps_dir``.
    fixed : {"same", "a", "b"}
        ``same``: both at ``budget`` (equal payload; no interpolation). ``b``: ``b``'s point at
        ``budget`` is fixed and ``a`` is evaluated at that unit's rate of ``b`` by
        :func:`interpolate_at_rate` over ``a``'s budgets (log-linear, the same unit's points:
        the data of a unit are the same for every scheme); ``a``: the reverse.

    Returns
    -------
    pandas.DataFrame
        ``unit``, ``rate`` (the fixed point's), ``a``, ``b`` (values; NaN where the rate is
        outside the interpolated scheme's range: never extrapolated).
    """
    if fixed not in ("same", "a", "b"):
        raise KvasymError(f"fixed must be same, a or b, got {fixed!r}")
    if metric not in ("kl", "recall_top5", "t_eps_dir"):
        raise KvasymError(f"unknown frontier metric {metric!r}; known: kl, recall_top5, t_eps_dir")
    present = set(units["scheme"].unique())
    for scheme in (a, b):
        if scheme not in present:
            raise KvasymError(f"no frontier rows of scheme {scheme!r}")
    rows = []
    for unit, g in units.groupby("unit", sort=True):
        by = {s: gs.set_index("budget").sort_index() for s, gs in g.groupby("scheme")}
        if a not in by or b not in by:
            continue
        if fixed == "same":
            if budget not in by[a].index or budget not in by[b].index:
                continue
            rows.append({"unit": unit, "rate": float(by[b].loc[budget, "bits_total"]),
                         "a": float(by[a].loc[budget, metric]), "b": float(by[b].loc[budget, metric])})
            continue
        anchor, moving = (b, a) if fixed == "b" else (a, b)
        if budget not in by[anchor].index:
            continue
        rate = float(by[anchor].loc[budget, "bits_total"])
        pts = by[moving]
        value = float(interpolate_at_rate(pts["bits_total"].to_numpy(), pts[metric].to_numpy(), rate,
                                          log=metric != "recall_top5"))
        anchored = float(by[anchor].loc[budget, metric])
        rows.append({"unit": unit, "rate": rate, "a": anchored if anchor == a else value,
                     "b": anchored if anchor == b else value})
    return pd.DataFrame(rows, columns=["unit", "rate", "a", "b"])
