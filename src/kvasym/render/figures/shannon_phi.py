"""Family ``shannon_phi``: the Shannon-phi planes at K, V and T (scale error against direction error).

Per site (:data:`SITE_NAMES`), one figure of the facet distributions (rows) by budget (columns)
at the headline dim and sharpness: each scheme's median and interquartile range over its
queries (or trials, for the per-trial K and V errors), over its points or, when they are many,
the contours of their density. The quartiles, the density grids and their levels are read from
the display tables of stage gather (``phi_summary``, ``phi_density``:
:func:`kvasym.display.shannon_phi_summary`); the points are the per-query rows. Angles in
degrees; Shannon effective bits are ``0.5 log2 SNR`` in bits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ...display import DENSITY_MASSES, level_column
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
    summary: pd.DataFrame,
    density: pd.DataFrame | None = None,
    sharpness: float | None = None,
    dim: int | None = None,
    distributions: Sequence[str] | None = None,
    budgets: Sequence[int] | None = None,
    colors: Mapping[str, str] | None = None,
    max_points: int = 300,
    seed: int = 0,
) -> Figure:
    """Scale error (Shannon effective bits) against direction error phi (degrees) at ``site``.

    Rows: distributions; columns: budgets; one sharpness and one dim. Per scheme and panel: the
    median with its interquartile range as a cross (``summary``, the ``phi_summary`` table),
    over either its points (a light random subsample of at most ``max_points`` of the per-query
    rows, seeded by the panel's identity) or, for a scheme the summary marks ``dense`` (more
    than its ``density_points`` points), the contours of their density around the regions
    holding :data:`~kvasym.display.DENSITY_MASSES` of them (``density``, the ``phi_density``
    table; :func:`_density_contours`): a scatter of thousands of queries hides every scheme but
    the last drawn. The K and V errors are per-trial aggregates (repeated on each query row),
    so for those sites each point is one trial, and the rows are low.
    """
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
    summary = select_rows(summary, site=site, dim=dim,
                          sharpness=None if sharpness is None else float(sharpness))
    density = select_rows(density, site=site, dim=dim, sharpness=None if sharpness is None else float(sharpness))
    density_points = int(summary["density_points"].iloc[0]) if len(summary) else None
    for i, dist in enumerate(rows):
        for j, budget in enumerate(cols):
            ax = axes[i, j]
            cell = select_rows(frame, distribution=dist, budget=budget)
            for scheme in schemes:
                shown = select_rows(summary, distribution=dist, budget=budget, scheme=scheme)
                if shown.empty:  # no finite point
                    continue
                quart = shown.iloc[0]
                if bool(quart["dense"]):
                    # thousands of queries overplot each other: the density's contours instead
                    grid = select_rows(density, distribution=dist, budget=budget, scheme=scheme)
                    if tag_scheme(_density_contours(ax, grid, quart, colors[scheme]), scheme) is not None:
                        densities += 1
                else:
                    g = cell[cell["scheme"] == scheme]
                    if per_trial:
                        g = g.drop_duplicates(["trial"])
                    x = np.degrees(g[x_col].to_numpy(dtype=float))
                    y = g[y_col].to_numpy(dtype=float)
                    ok = np.isfinite(x) & np.isfinite(y)
                    x, y = x[ok], y[ok]
                    if x.size > max_points:
                        pick = rng(seed, "figure", "shannon_phi", site, str(dist), int(budget), scheme).choice(
                            x.size, max_points, replace=False)
                        xs, ys = x[pick], y[pick]
                    else:
                        xs, ys = x, y
                    tag_scheme(ax.scatter(xs, ys, s=4 if wide else 2.5, color=colors[scheme], alpha=0.3, linewidths=0,
                                          rasterized=True, zorder=2), scheme)
                qx = [float(quart[f"phi_q{q}"]) for q in (25, 50, 75)]
                qy = [float(quart[f"bits_q{q}"]) for q in (25, 50, 75)]
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


def _density_contours(ax: Any, grid: pd.DataFrame, quart: pd.Series, color: str) -> Any:
    """The contours of a scheme's density grid (the ``phi_density`` rows of one site, cell and
    scheme, ``iy``-major) at its levels (the ``phi_summary`` row's, the larger mass thinner), or
    None when it has none (its points have no spread to draw a density of)."""
    levels = [float(quart[level_column(m)]) for m in DENSITY_MASSES]
    if grid.empty or not all(np.isfinite(levels)):
        return None
    nx = int(grid["ix"].iloc[-1]) + 1
    density = grid["density"].to_numpy(dtype=float).reshape(-1, nx)
    xc, yc = grid["phi"].to_numpy(dtype=float)[:nx], grid["bits"].to_numpy(dtype=float)[::nx]
    order = np.argsort(levels)  # contour needs increasing levels: the largest mass has the lowest
    widths = [0.6 + 0.6 * (1 - DENSITY_MASSES[k]) / (1 - min(DENSITY_MASSES)) for k in order]
    return ax.contour(xc, yc, density, levels=[levels[k] for k in order], colors=[color], linewidths=widths,
                      zorder=2)
