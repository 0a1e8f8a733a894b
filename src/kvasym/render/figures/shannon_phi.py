"""Family ``shannon_phi``: the Shannon-phi planes at K, V and T (scale error against direction error).

Per site (:data:`SITE_NAMES`), one figure of the facet distributions (rows) by budget (columns)
at the headline dim and sharpness: each scheme's median and interquartile range over its
queries (or trials, for the per-trial K and V errors), over its points or, when they are many,
the contours of their density (:func:`density_levels`). Angles in degrees; Shannon effective
bits are ``0.5 log2 SNR`` in bits.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ...seeds import rng
from ._style import (
    TEXT_WIDTH,
    bottom_xlabel,
    choose_value,
    figure_legend,
    margin_title,
    nested_size,
    new_figure,
    nothing_to_show,
    palette,
    present_values,
    scheme_handles,
    scheme_order,
    select_rows,
    short_number,
    styled,
    suptitle,
    tag_scheme,
)


#: The three sites of a Shannon-phi plane: the key and value caches and the attention output.
SITE_NAMES = {"k": "K (key cache)", "v": "V (value cache)", "t": "T (attention output)"}


@styled
def shannon_phi_plane(
    per_query: pd.DataFrame,
    site: str,
    *,
    sharpness: float | None = None,
    dim: int | None = None,
    distributions: Sequence[str] | None = None,
    budgets: Sequence[int] | None = None,
    colors: Mapping[str, str] | None = None,
    max_points: int = 300,
    seed: int = 0,
    density_points: int | None = None,
) -> Figure:
    """Scale error (Shannon effective bits) against direction error phi (degrees) at ``site``.

    Rows: distributions; columns: budgets; one sharpness and one dim. Per scheme and panel: the
    median with its interquartile range as a cross, over either its points (a light random
    subsample of at most ``max_points``, seeded by the panel's identity) or, with more than
    ``density_points`` points (default :data:`DENSITY_POINTS`), the contours of their density
    around the regions holding :data:`DENSITY_MASSES` of them (:func:`_density_contours`): a
    scatter of thousands of queries hides every scheme but the last drawn. The K and V errors
    are per-trial aggregates (repeated on each query row), so for those sites each point is one
    trial, and the rows are low.
    """
    density_points = DENSITY_POINTS if density_points is None else int(density_points)
    if site not in SITE_NAMES:
        raise ValueError(f"site must be one of {', '.join(SITE_NAMES)}, got {site!r}")
    title = f"Shannon–φ plane at {SITE_NAMES[site]}"
    x_col, y_col = f"{site}_phi", f"{site}_eff_bits"
    dim, dim_note = choose_value(per_query, "dim", dim)
    frame = select_rows(per_query, dim=dim)
    sharpness, s_note = choose_value(frame, "sharpness", sharpness)
    frame = select_rows(frame, sharpness=None if sharpness is None else float(sharpness))
    rows = present_values(frame, "distribution", distributions)
    cols = present_values(frame, "budget", budgets)
    if frame.empty or not rows or not cols or x_col not in frame.columns:
        return nothing_to_show(title, f"no per-query rows for d = {dim}, sharpness = {sharpness}, "
                                      f"distributions {list(distributions) if distributions else 'any'}")
    colors, markers = palette(frame["scheme"].unique(), colors)
    schemes = scheme_order(frame["scheme"].unique())
    # a page-wide grid: at column width the panels of a 3-budget grid were 1 inch wide
    wide = len(cols) > 1
    per_trial = site in ("k", "v")
    # the K and V planes show a few tight clusters of trials: low rows, so each figure takes
    # part of a page instead of a whole one (issue 15)
    row_height = (1.0 if per_trial else 1.4) if wide else 1.6
    fig, axes = new_figure(len(rows), len(cols), width=TEXT_WIDTH, row_height=row_height, extra=0.75,
                           sharex="row", sharey="row")
    densities = 0
    for i, dist in enumerate(rows):
        for j, budget in enumerate(cols):
            ax = axes[i, j]
            cell = select_rows(frame, distribution=dist, budget=budget)
            for scheme in schemes:
                g = cell[cell["scheme"] == scheme]
                if per_trial:
                    g = g.drop_duplicates(["trial"])
                x = np.degrees(g[x_col].to_numpy(dtype=float))
                y = g[y_col].to_numpy(dtype=float)
                ok = np.isfinite(x) & np.isfinite(y)
                x, y = x[ok], y[ok]
                if x.size == 0:
                    continue
                if x.size > density_points:
                    # thousands of queries overplot each other: the density's contours instead
                    if tag_scheme(_density_contours(ax, x, y, colors[scheme]), scheme) is not None:
                        densities += 1
                else:
                    if x.size > max_points:
                        pick = rng(seed, "figure", "shannon_phi", site, str(dist), int(budget), scheme).choice(
                            x.size, max_points, replace=False)
                        xs, ys = x[pick], y[pick]
                    else:
                        xs, ys = x, y
                    tag_scheme(ax.scatter(xs, ys, s=4 if wide else 2.5, color=colors[scheme], alpha=0.3, linewidths=0,
                                          rasterized=True, zorder=2), scheme)
                qx, qy = np.percentile(x, [25, 50, 75]), np.percentile(y, [25, 50, 75])
                # later schemes get smaller markers, so coinciding medians (e.g. KQV and RKV share
                # their K side) stay visible as nested markers
                size = nested_size(schemes, scheme, 7.0 if wide else 5.5, 1.0 if wide else 0.8, 3.0 if wide else 2.5)
                tag_scheme(ax.errorbar(qx[1], qy[1], xerr=[[qx[1] - qx[0]], [qx[2] - qx[1]]],
                                       yerr=[[qy[1] - qy[0]], [qy[2] - qy[1]]], fmt=markers[scheme],
                                       color=colors[scheme], markeredgecolor="black", markeredgewidth=0.4,
                                       markersize=size, elinewidth=1.0, capsize=0,
                                       zorder=4 + 0.1 * schemes.index(scheme)), scheme)
            if i == 0:
                ax.set_title(f"n = {budget} bits")
            if j == len(cols) - 1:
                margin_title(ax, str(dist))
            ax.tick_params(labelbottom=True)
            ax.margins(0.08, 0.14)  # room for the large median markers at the edges of the low rows
    S = site.upper()
    bottom_xlabel(axes, rf"direction error $\varphi_{S}$ (degrees)")
    fig.supylabel(rf"Shannon effective bits $0.5\,\log_2\,\mathrm{{SNR}}_{S}$ (bits)")
    note = "points: trials" if per_trial else "points: queries"
    if densities:
        masses = " and ".join(f"{m:.0%}" for m in DENSITY_MASSES)
        note = (f"contours: the densest regions holding {masses} of a scheme's queries "
                f"(above {density_points} per panel; fewer: points)")
    suptitle(fig, (f"{title}: d = {dim}{dim_note}, sharpness {short_number(float(sharpness))}{s_note}; "
                           f"{note}; cross: median and IQR"))
    figure_legend(fig, scheme_handles(schemes, colors, markers, line=False), schemes)
    return fig


#: Above this many points of one scheme in one panel, the Shannon-phi plane draws their
#: density's contours instead of the points.
DENSITY_POINTS = 200
#: The contours enclose the densest regions holding these fractions of the points.
DENSITY_MASSES = (0.5, 0.9)


def density_levels(x: np.ndarray, y: np.ndarray, masses: Sequence[float] = DENSITY_MASSES, *, bins: int = 40,
                   smooth: float = 1.5) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[float]]:
    """A smoothed 2-D histogram of the points (``bins`` per axis over their central 99% range
    padded by 15%, a Gaussian kernel of ``smooth`` bins; the few extreme points left out would
    otherwise set the panel's range) and, per mass in ``masses``, the density level whose
    super-level set holds that fraction of all the points (the highest-density region):
    ``(x_centres, y_centres, density[y, x], levels)`` with the levels in the order of ``masses``."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ranges = []
    for v in (x, y):
        lo, hi = (float(q) for q in np.percentile(v, [0.5, 99.5]))
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


def _density_contours(ax: Any, x: np.ndarray, y: np.ndarray, color: str) -> Any:
    """The contours of :func:`density_levels` (the larger mass thinner), or None when the points
    have no spread to draw a density of."""
    if np.ptp(x) == 0 and np.ptp(y) == 0:
        return None
    xc, yc, density, levels = density_levels(x, y)
    order = np.argsort(levels)  # contour needs increasing levels: the largest mass has the lowest
    unique = np.unique(np.asarray(levels)[order])
    if unique.size < len(levels) or unique[0] <= 0:
        return None
    widths = [0.6 + 0.6 * (1 - DENSITY_MASSES[k]) / (1 - min(DENSITY_MASSES)) for k in order]
    return ax.contour(xc, yc, density, levels=list(unique), colors=[color], linewidths=widths, zorder=2)
