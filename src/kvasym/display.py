"""The figures' display aggregates: the summaries of raw rows that a figure draws.

Rendering reads numbers; it never recomputes (issue 30). A figure that draws a summary of the
per-query or per-key rows (a median cross, a density contour, a binned mean) reads it from a
table the gather stage writes (:mod:`kvasym.stages.gather`) with the functions here, each with
its definition stated: which quantile method, which bins. The figures still draw raw rows where
the drawing IS the rows (a scatter of points, an empirical CDF).

Tables (artifacts of :mod:`kvasym.artifacts`, written by stage ``gather``):

``phi_summary`` (:data:`PHI_SUMMARY_COLUMNS`, :func:`shannon_phi_summary`)
    Per Shannon-phi site (K, V, T), cell and scheme: the quartiles of the direction error
    (degrees) and of the Shannon effective bits over the points (queries; trials for the
    per-trial K and V errors), whether the points are drawn as a density, and its levels.
``phi_density`` (:data:`PHI_DENSITY_COLUMNS`)
    The smoothed density grid (:func:`density_levels`) of each dense (site, cell, scheme).
``jensen_bins`` (:data:`JENSEN_BIN_COLUMNS`, :func:`jensen_bins`)
    The Jensen figure's binned means of the per-key points.

The KL ECDF figure's mean and 99th-percentile lines are the gathered summary's ``kl_mean`` and
``kl_p99`` (:func:`kvasym.stats.cell_summary`): the ledger's numbers, not a second copy.

The tables' aggregates are here too (:func:`median_iqr`, :func:`side_bit_ledger`), called by the
table contexts of :mod:`kvasym.render`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from .errors import KvasymError

__all__ = ["DENSITY_BINS", "DENSITY_MASSES", "DENSITY_POINTS", "DENSITY_SMOOTH", "JENSEN_BINS", "JENSEN_BIN_COLUMNS",
           "PHI_DENSITY_COLUMNS", "PHI_SITES", "PHI_SUMMARY_COLUMNS", "QUANTILE_METHOD", "density_levels",
           "jensen_bins", "jensen_bins_table", "level_column", "median_iqr", "quartiles", "shannon_phi_summary",
           "side_bit_ledger"]

#: The quantile method of every display quantile (``numpy.percentile`` / ``numpy.quantile``):
#: linear interpolation between order statistics (Hyndman and Fan's type 7, numpy's default).
QUANTILE_METHOD = "linear"
#: The Shannon-phi sites: the key and value caches (per-trial errors) and the attention output.
PHI_SITES = ("k", "v", "t")
#: Above this many points of one scheme in one panel, the Shannon-phi plane draws their
#: density's contours instead of the points.
DENSITY_POINTS = 200
#: The contours enclose the densest regions holding these fractions of the points.
DENSITY_MASSES = (0.5, 0.9)
#: The density grid: bins per axis, and the Gaussian kernel's standard deviation in bins.
DENSITY_BINS = 40
DENSITY_SMOOTH = 1.5
#: The Jensen figure's quantile bins of the logit-error variance (the figures slice's ``jensen_bins``).
JENSEN_BINS = 20

#: The cell of a display row (the metrics rows' cell columns, without ``kind``).
_CELL = ("distribution", "dim", "budget", "sharpness", "scheme")


def level_column(mass: float) -> str:
    """The ``phi_summary`` column of the density level holding ``mass`` of the points (``level_50``)."""
    return f"level_{round(100 * mass):d}"


#: The columns of the ``phi_summary`` table (:func:`shannon_phi_summary`).
PHI_SUMMARY_COLUMNS: tuple[str, ...] = (
    "site", *_CELL, "n_points", "density_points", "phi_q25", "phi_q50", "phi_q75", "bits_q25", "bits_q50", "bits_q75",
    "dense", *(level_column(m) for m in DENSITY_MASSES),
)
#: The columns of the ``phi_density`` table: one row per grid point (``iy`` major, then ``ix``)
#: of each dense (site, cell, scheme) whose contours can be drawn.
PHI_DENSITY_COLUMNS: tuple[str, ...] = ("site", *_CELL, "iy", "ix", "phi", "bits", "density")
#: The columns of the ``jensen_bins`` table (:func:`jensen_bins`).
JENSEN_BIN_COLUMNS: tuple[str, ...] = (*_CELL, "n_bins", "bin", "n_keys", "var_geomean", "excess_mean", "excess_se")


def _finite_1d(values: ArrayLike, name: str) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1:
        raise KvasymError(f"{name} must be 1-D, got shape {arr.shape}")
    return arr[np.isfinite(arr)]


def quartiles(values: ArrayLike) -> tuple[float, float, float]:
    """The 25th, 50th and 75th percentiles of ``values``.

    Parameters
    ----------
    values : array_like
        1-D, finite (a figure passes the finite points it draws).

    Returns
    -------
    tuple of float
        ``numpy.percentile(values, [25, 50, 75], method="linear")`` (:data:`QUANTILE_METHOD`).

    Raises
    ------
    KvasymError
        If ``values`` is empty, not 1-D or holds a non-finite value.
    """
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1 or arr.size == 0 or not np.all(np.isfinite(arr)):
        raise KvasymError(f"quartiles: need a non-empty 1-D array of finite values, got shape {arr.shape}")
    q = np.percentile(arr, [25, 50, 75], method=QUANTILE_METHOD)
    return float(q[0]), float(q[1]), float(q[2])


def median_iqr(values: ArrayLike) -> tuple[float, float]:
    """(median, interquartile range) of the finite values of ``values``.

    Parameters
    ----------
    values : array_like
        1-D; NaN and infinite values are left out.

    Returns
    -------
    tuple of float
        ``(q50, q75 - q25)`` with ``numpy.quantile(..., method="linear")``; ``(nan, nan)`` when
        no value is finite.
    """
    arr = _finite_1d(values, "median_iqr: values")
    if arr.size == 0:
        return math.nan, math.nan
    q25, q50, q75 = np.quantile(arr, [0.25, 0.5, 0.75], method=QUANTILE_METHOD)
    return float(q50), float(q75 - q25)


def density_levels(x: ArrayLike, y: ArrayLike, masses: Sequence[float] = DENSITY_MASSES, *, bins: int = DENSITY_BINS,
                   smooth: float = DENSITY_SMOOTH) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[float]]:
    """A smoothed 2-D histogram of points and its highest-density levels.

    Parameters
    ----------
    x, y : array_like
        The points' coordinates, 1-D, same length, finite.
    masses : sequence of float
        Fractions of the points in (0, 1]: per mass, the level whose super-level set holds it.
    bins : int
        Bins per axis.
    smooth : float
        The Gaussian kernel's standard deviation, in bins (truncated at ``ceil(3 smooth)`` bins).

    Returns
    -------
    x_centres, y_centres : numpy.ndarray
        The bin centres (``bins`` each).
    density : numpy.ndarray
        ``(bins, bins)``, indexed ``[y, x]``: the smoothed counts divided by the number of points
        (the points outside the range count in the divisor).
    levels : list of float
        Per mass, in the order of ``masses``: the largest density value ``v`` such that the grid
        cells of density >= ``v`` hold at least that mass (cumulative sum of the densities in
        decreasing order, the first index reaching it, clipped to the last cell).

    Notes
    -----
    The range of each axis is its 0.5th to 99.5th percentile (``numpy.percentile``, linear
    method) padded by 15% of its width on each side (by 5% of ``max(|lo|, 1)`` when the width
    is 0): the few extreme points left out would otherwise set the panel's range. The kernel is
    applied along x then y with ``numpy.convolve(..., mode="same")`` (zero outside the grid).
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.ndim != 1 or x.shape != y.shape or x.size == 0:
        raise KvasymError(f"density_levels: x and y must be 1-D of one non-zero length, got {x.shape} and {y.shape}")
    ranges = []
    for v in (x, y):
        lo, hi = (float(q) for q in np.percentile(v, [0.5, 99.5], method=QUANTILE_METHOD))
        pad = 0.15 * (hi - lo) if hi > lo else max(abs(lo), 1.0) * 0.05
        ranges.append((lo - pad, hi + pad))
    hist, xe, ye = np.histogram2d(x, y, bins=bins, range=ranges)
    radius = max(1, int(math.ceil(3 * smooth)))
    kernel = np.exp(-0.5 * (np.arange(-radius, radius + 1) / smooth) ** 2)
    kernel /= kernel.sum()
    for axis in (0, 1):
        hist = np.apply_along_axis(lambda r: np.convolve(r, kernel, mode="same"), axis, hist)
    density = hist / x.size  # a fraction of every point, those outside the range included
    ordered = np.sort(density.ravel())[::-1]
    cumulative = np.cumsum(ordered)
    levels = [float(ordered[min(int(np.searchsorted(cumulative, m)), ordered.size - 1)]) for m in masses]
    return (xe[:-1] + xe[1:]) / 2, (ye[:-1] + ye[1:]) / 2, density.T, levels


def _drawable(x: np.ndarray, y: np.ndarray, levels: Sequence[float]) -> bool:
    """Whether contours can be drawn: the points spread, the levels are distinct and positive."""
    if np.ptp(x) == 0 and np.ptp(y) == 0:
        return False
    unique = np.unique(np.asarray(levels))
    return unique.size == len(levels) and unique[0] > 0


def _cells(frame: pd.DataFrame) -> list[tuple[tuple[Any, ...], pd.DataFrame]]:
    """The rows of each (distribution, dim, budget, sharpness, scheme), cells in sorted order."""
    if frame.empty:
        return []
    return [(key, g) for key, g in frame.groupby(list(_CELL), sort=True)]


def shannon_phi_summary(per_query: pd.DataFrame, *,
                        density_points: int = DENSITY_POINTS) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The Shannon-phi planes' display numbers of per-query metrics rows.

    Parameters
    ----------
    per_query : pandas.DataFrame
        Per-query rows (:data:`kvasym.dataset.PER_QUERY_SCHEMA`): the cell columns, ``trial`` and
        ``<site>_phi`` (radians), ``<site>_eff_bits`` for each site of :data:`PHI_SITES`.
    density_points : int
        Above this many points of a (site, cell, scheme), its points are drawn as a density.

    Returns
    -------
    summary : pandas.DataFrame
        :data:`PHI_SUMMARY_COLUMNS`, one row per site, cell and scheme with a finite point:
        ``n_points`` finite points (x = ``degrees(<site>_phi)``, y = ``<site>_eff_bits``, both
        finite; for the per-trial K and V errors, the first row of each trial), their
        :func:`quartiles` (``phi_*`` of x in degrees, ``bits_*`` of y), ``dense`` (more than
        ``density_points`` points, drawn as a density), and the :func:`density_levels` of
        :data:`DENSITY_MASSES` of the dense ones whose contours can be drawn (points spread, levels
        distinct and positive; NaN otherwise).
    density : pandas.DataFrame
        :data:`PHI_DENSITY_COLUMNS`: the grid of each row with levels (``iy``-major).

    Raises
    ------
    KvasymError
        If a site's columns are missing.
    """
    missing = [c for c in (*_CELL, "trial", *(f"{s}_{m}" for s in PHI_SITES for m in ("phi", "eff_bits")))
               if c not in per_query.columns]
    if missing:
        raise KvasymError(f"shannon_phi_summary: the per-query rows lack column(s) {', '.join(missing)}")
    rows: list[dict[str, Any]] = []
    grids: list[pd.DataFrame] = []
    cells = _cells(per_query)
    for site in PHI_SITES:
        for key, g in cells:
            if site in ("k", "v"):
                g = g.drop_duplicates(["trial"])  # a per-trial error repeated on each query row
            x = np.degrees(g[f"{site}_phi"].to_numpy(dtype=float))
            y = g[f"{site}_eff_bits"].to_numpy(dtype=float)
            ok = np.isfinite(x) & np.isfinite(y)
            x, y = x[ok], y[ok]
            if x.size == 0:
                continue
            cell = dict(zip(_CELL, key))
            qx, qy = quartiles(x), quartiles(y)
            dense = bool(x.size > density_points)
            row = {"site": site, **cell, "n_points": int(x.size), "density_points": int(density_points),
                   "phi_q25": qx[0], "phi_q50": qx[1], "phi_q75": qx[2],
                   "bits_q25": qy[0], "bits_q50": qy[1], "bits_q75": qy[2], "dense": dense,
                   **{level_column(m): math.nan for m in DENSITY_MASSES}}
            if dense:
                xc, yc, density, levels = density_levels(x, y, DENSITY_MASSES)
                if _drawable(x, y, levels):
                    row.update({level_column(m): v for m, v in zip(DENSITY_MASSES, levels)})
                    iy, ix = np.meshgrid(np.arange(yc.size), np.arange(xc.size), indexing="ij")
                    grids.append(pd.DataFrame({"site": site, **{c: [v] * density.size for c, v in cell.items()},
                                               "iy": iy.ravel(), "ix": ix.ravel(), "phi": xc[ix.ravel()],
                                               "bits": yc[iy.ravel()], "density": density.ravel()}))
            rows.append(row)
    summary = pd.DataFrame(rows, columns=list(PHI_SUMMARY_COLUMNS))
    density = (pd.concat(grids, ignore_index=True) if grids
               else pd.DataFrame({c: pd.Series(dtype=summary[c].dtype if c in summary else float)
                                  for c in PHI_DENSITY_COLUMNS}))
    return summary, density[list(PHI_DENSITY_COLUMNS)]


def jensen_bins(var: ArrayLike, excess: ArrayLike, n_bins: int = JENSEN_BINS) -> pd.DataFrame:
    """Means of the Jensen points over quantile bins of their logit-error variance.

    Parameters
    ----------
    var, excess : array_like
        The per-key points (:func:`kvasym.theory.jensen_points`): logit-error variance and log
        weight excess, 1-D, same length. Keys with ``var <= 0`` are left out (a log axis).
    n_bins : int
        Quantile bins (>= 1).

    Returns
    -------
    pandas.DataFrame
        ``bin, n_keys, var_geomean, excess_mean, excess_se``, one row per non-empty bin in
        increasing order; empty with fewer than 2 keys left.

    Notes
    -----
    The edges are the distinct values of ``numpy.quantile(var, linspace(0, 1, n_bins + 1))``
    (linear method; ties merge bins, so there may be fewer than ``n_bins``). A key is in bin
    ``clip(searchsorted(edges, var, side="right") - 1, 0, len(edges) - 2)``: bins are closed on
    the left, the last also on the right. Per bin: the geometric mean of ``var`` (``exp`` of the
    mean log), the mean of ``excess`` and its standard error ``std(excess, ddof=1) / sqrt(n)``
    (0 for a bin of one key).
    """
    var, excess = np.asarray(var, dtype=float), np.asarray(excess, dtype=float)
    if var.ndim != 1 or var.shape != excess.shape:
        raise KvasymError(f"jensen_bins: var and excess must be 1-D of one length, got {var.shape} and {excess.shape}")
    if int(n_bins) < 1:
        raise KvasymError(f"jensen_bins: n_bins must be >= 1, got {n_bins}")
    keep = var > 0
    var, excess = var[keep], excess[keep]
    columns = ["bin", "n_keys", "var_geomean", "excess_mean", "excess_se"]
    if var.size < 2:
        return pd.DataFrame({c: pd.Series(dtype=np.int64 if c in ("bin", "n_keys") else float) for c in columns})
    edges = np.unique(np.quantile(var, np.linspace(0, 1, int(n_bins) + 1), method=QUANTILE_METHOD))
    which = np.clip(np.searchsorted(edges, var, side="right") - 1, 0, max(len(edges) - 2, 0))
    rows = []
    for b in np.unique(which):
        sel = which == b
        n = int(sel.sum())
        rows.append({"bin": int(b), "n_keys": n, "var_geomean": float(np.exp(np.mean(np.log(var[sel])))),
                     "excess_mean": float(np.mean(excess[sel])),
                     "excess_se": float(np.std(excess[sel], ddof=1) / math.sqrt(n)) if n > 1 else 0.0})
    return pd.DataFrame(rows, columns=columns)


def jensen_bins_table(per_key: pd.DataFrame, n_bins: int = JENSEN_BINS) -> pd.DataFrame:
    """:func:`jensen_bins` of each cell and scheme of per-key metrics rows.

    Parameters
    ----------
    per_key : pandas.DataFrame
        Per-key rows (:data:`kvasym.dataset.PER_KEY_SCHEMA`): the cell columns and the columns of
        :func:`kvasym.theory.jensen_points`.
    n_bins : int
        Quantile bins per cell and scheme.

    Returns
    -------
    pandas.DataFrame
        :data:`JENSEN_BIN_COLUMNS`, cells in sorted order, a cell with fewer than 2 keys of
        positive variance absent.
    """
    from .theory import jensen_points

    missing = [c for c in (*_CELL, "weight_ref_mean", "weight_hat_mean", "logit_err_var") if c not in per_key.columns]
    if missing:
        raise KvasymError(f"jensen_bins_table: the per-key rows lack column(s) {', '.join(missing)}")
    parts = []
    for key, g in _cells(per_key):
        var, excess, _ = jensen_points(g)
        bins = jensen_bins(var, excess, n_bins)
        if not bins.empty:
            parts.append(bins.assign(**dict(zip(_CELL, key)), n_bins=int(n_bins)))
    if not parts:
        return pd.DataFrame({c: pd.Series(dtype=float) for c in JENSEN_BIN_COLUMNS})
    return pd.concat(parts, ignore_index=True)[list(JENSEN_BIN_COLUMNS)]


def side_bit_ledger(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Mean measured side bits and total bits per scheme (the frontier table's side-bit ledger).

    Parameters
    ----------
    frame : pandas.DataFrame
        Frontier points with ``scheme``, ``budget``, ``bits_side`` and ``bits_total``.

    Returns
    -------
    list of dict
        Per scheme in order of first appearance: ``{"scheme", "side": mean bits_side over its
        rows, "total_at": {budget: mean bits_total over its rows at that budget}}``, budgets in
        increasing order (arithmetic means, pandas' ``mean``).
    """
    ledger = []
    for scheme, g in frame.groupby("scheme", sort=False):
        ledger.append({"scheme": str(scheme), "side": float(g["bits_side"].mean()),
                       "total_at": {int(b): float(gb["bits_total"].mean()) for b, gb in g.groupby("budget")}})
    return ledger

