"""Family ``jensen_bias``: the attention-weight excess against the logit-error variance, per key.

Binned means (with standard errors) of the per-key points of the headline budget and sharpness,
read from the display table ``jensen_bins`` of stage gather (:func:`kvasym.display.jensen_bins`);
each panel's fitted slope is read from the theory table (``jensen_slope`` rows, claim C9's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..format import sig
from ._style import (
    TEXT_WIDTH,
    bottom_xlabel,
    choose_value,
    figure_legend,
    log_axis,
    nested_size,
    new_figure,
    nothing_to_show,
    palette,
    present_values,
    safe_text,
    scheme_handles,
    scheme_order,
    select_rows,
    short_number,
    styled,
    suptitle,
    tag_scheme,
)


def _slope_text(slopes: pd.DataFrame | None, scheme: str, **cell: Any) -> str | None:
    """``<scheme> $<fitted slope>$`` of the theory table's ``jensen_slope`` row (the paper's
    number formatter, :func:`kvasym.render.format.sig`, as mathtext; the ledger prints its
    interval), or None."""
    if slopes is None or slopes.empty or "check" not in slopes.columns:
        return None
    row = select_rows(slopes, check="jensen_slope", scheme=scheme, **cell)
    if row.empty or not np.isfinite(float(row["estimate"].iloc[0])):
        return None
    return f"{safe_text(scheme)} ${sig(float(row['estimate'].iloc[0]))}$"


@styled
def jensen_bias(
    bins: pd.DataFrame,
    *,
    budget: int | None = None,
    sharpness: float | None = None,
    dim: int | None = None,
    distributions: Sequence[str] | None = None,
    slopes: pd.DataFrame | None = None,
    colors: Mapping[str, str] | None = None,
) -> Figure:
    """Per key: log(mean attention weight quantized / reference) against the variance of its
    logit error, as means over quantile bins of the variance with standard errors (``bins``:
    the ``jensen_bins`` table, :func:`kvasym.display.jensen_bins_table`, its ``n_bins`` bins),
    one line per scheme, one panel per distribution, one budget and sharpness. With ``slopes``
    (the theory table), each panel's title gives the fitted Jensen slope of each scheme; one
    figure legend below the panels names the schemes."""
    title = "Jensen bias"
    dim, dim_note = choose_value(bins, "dim", dim)
    frame = select_rows(bins, dim=dim)
    budget, b_note = choose_value(frame, "budget", budget)
    budget = None if budget is None else int(budget)
    frame = select_rows(frame, budget=budget)
    sharpness, s_note = choose_value(frame, "sharpness", sharpness)
    frame = select_rows(frame, sharpness=None if sharpness is None else float(sharpness))
    dists = present_values(frame, "distribution", distributions)
    if frame.empty or not dists:
        return nothing_to_show(title, f"no binned per-key points for d = {dim}, n = {budget}, sharpness = {sharpness}")
    colors, markers = palette(frame["scheme"].unique(), colors)
    schemes = scheme_order(frame["scheme"].unique())
    with_slopes = slopes is not None and not slopes.empty and "check" in slopes.columns
    # two panels per row at text width (a single column of four panels was taller than a page);
    # one figure legend for the schemes, and each panel's fitted slopes (they differ by
    # distribution) in its title: per-panel legends filled a third of each panel (issue 15)
    ncols = 2 if len(dists) > 1 else 1
    nrows = -(-len(dists) // ncols)
    fig, axes = new_figure(nrows, ncols, width=TEXT_WIDTH, row_height=1.75, extra=0.75)
    for ax in axes.flat[len(dists):]:
        ax.set_axis_off()
    for ax, dist in zip(axes.flat, dists):
        fitted, shown = [], []
        cell = select_rows(frame, distribution=dist)
        for scheme in schemes:
            g = cell[cell["scheme"] == scheme]
            if g.empty:  # fewer than 2 keys of positive logit-error variance
                continue
            xs = g["var_geomean"].to_numpy(dtype=float).tolist()
            ys = g["excess_mean"].to_numpy(dtype=float).tolist()
            es = g["excess_se"].to_numpy(dtype=float).tolist()
            tag_scheme(ax.errorbar(xs, ys, yerr=es, color=colors[scheme], marker=markers[scheme],
                                   markersize=nested_size(schemes, scheme, 4.2, 0.6, 2.2),
                                   lw=nested_size(schemes, scheme, 1.5, 0.25, 0.7), elinewidth=0.7, capsize=0,
                                   zorder=3 + 0.1 * schemes.index(scheme)), scheme)
            shown.extend(xs)
            text = _slope_text(slopes, scheme, distribution=dist, dim=dim, budget=budget,
                               sharpness=None if sharpness is None else float(sharpness)) if with_slopes else None
            if text:
                fitted.append(text)
        ax.axhline(0.0, color="0.4", lw=0.7, ls="-", zorder=1)
        if shown:
            log_axis(ax, "x", shown)
        else:
            ax.text(0.5, 0.5, "no keys with positive logit-error variance", ha="center", va="center",
                    transform=ax.transAxes)
        # two slopes per line: a half-width panel holds about 45 characters at 8 pt
        slope_lines = [", ".join(fitted[k:k + 2]) for k in range(0, len(fitted), 2)]
        ax.set_title(safe_text(str(dist)) + ("\nslope: " + ",\n".join(slope_lines) if fitted else ""))
    bottom_xlabel(axes, "logit-error variance over queries (logit², log scale)")
    fig.supylabel("ln(mean ŵ / mean w) (nats)")
    figure_legend(fig, scheme_handles(schemes, colors, markers), schemes)
    slope_note = "; slope: linear fit of the per-key points" if with_slopes else ""
    suptitle(fig, f"{title}: d = {dim}{dim_note}, n = {budget}{b_note}, "
                  f"sharpness {short_number(float(sharpness))}{s_note}; "
                  f"means of {int(frame['n_bins'].iloc[0])} quantile bins ± s.e.{slope_note}")
    return fig
