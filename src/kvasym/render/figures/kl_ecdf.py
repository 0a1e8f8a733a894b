"""Family ``kl_ecdf``: the empirical CDF of per-query KL at the headline cell's dim and sharpness.

KL in nats, on a log axis floored at :data:`KL_FLOOR` (a KL below it is drawn at it and the
title says how many queries are); each scheme's mean and 99th percentile are vertical lines,
read from the gathered summary (``kl_mean``, ``kl_p99``: :func:`kvasym.stats.cell_summary`, the
numbers the ledger and tables quote).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ._style import (
    bottom_xlabel,
    choose_value,
    figure_legend,
    log_axis,
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
    tick_label,
)


#: The ECDF figure's floor (nats): a per-query KL below it is drawn at it. By Pinsker's
#: inequality such a query's attention moves by a total variation of at most
#: sqrt(1e-4 / 2) = 0.7%: at the floor, quantization has left attention unchanged for a reader.
KL_FLOOR = 1e-4


def _share(count: int, total: int) -> str:
    """``count`` of ``total`` as a percentage, two significant digits ("<0.01%" below that; never
    "100%" for a count short of the total)."""
    pct = 100.0 * count / total
    if pct < 0.01:
        return "<0.01%"
    text = f"{pct:.2g}" if pct < 99.5 else f"{pct:.3g}"
    return "99.9%" if count < total and float(text) >= 100 else f"{text}%"

@styled
def kl_ecdf(
    per_query: pd.DataFrame,
    *,
    summary: pd.DataFrame,
    sharpness: float | None = None,
    dim: int | None = None,
    distributions: Sequence[str] | None = None,
    budgets: Sequence[int] | None = None,
    colors: Mapping[str, str] | None = None,
    floor: float | None = None,
) -> Figure:
    """Empirical CDF of per-query KL (log x) per scheme, rows = distributions, columns =
    budgets, with each scheme's mean (dashed) and 99th percentile (dotted) as vertical lines
    (``summary``: the gathered summary's ``kl_mean`` and ``kl_p99`` of the cell and scheme).
    A KL below ``floor`` nats (default :data:`KL_FLOOR`; KL = 0, exact attention, included) is
    drawn at the floor, so the axis spans the decades where KL matters (heavy tails reach
    1e-27), and the title says how many queries of which rows lie below it. An infinite KL
    counts in the CDF but cannot be drawn (the curve stays below 1)."""
    title = "ECDF of per-query KL"
    dim, dim_note = choose_value(per_query, "dim", dim)
    frame = select_rows(per_query, dim=dim)
    sharpness, s_note = choose_value(frame, "sharpness", sharpness)
    frame = select_rows(frame, sharpness=None if sharpness is None else float(sharpness))
    rows = present_values(frame, "distribution", distributions)
    cols = present_values(frame, "budget", budgets)
    if frame.empty or not rows or not cols:
        return nothing_to_show(title, f"no per-query rows for d = {dim}, sharpness = {sharpness}")
    colors, markers = palette(frame["scheme"].unique(), colors)
    schemes = scheme_order(frame["scheme"].unique())
    fig, axes = new_figure(len(rows), len(cols), row_height=1.2 if len(cols) > 1 else 1.5, extra=0.85,
                           sharex="row", sharey=True)
    floor = KL_FLOOR if floor is None else float(floor)
    below: list[str] = []  # "<share> of <row>'s queries", rows with any KL under the floor
    for i, dist in enumerate(rows):
        row_kl = select_rows(frame, distribution=dist)["kl"].to_numpy(dtype=float)
        row_kl = row_kl[~np.isnan(row_kl)]
        under = int(np.count_nonzero(row_kl < floor))
        if under:
            below.append(f"{_share(under, row_kl.size)} of {dist}'s")
        for j, budget in enumerate(cols):
            ax = axes[i, j]
            cell = select_rows(frame, distribution=dist, budget=budget)
            for scheme in schemes:
                kl = cell.loc[cell["scheme"] == scheme, "kl"].to_numpy(dtype=float)
                kl = kl[~np.isnan(kl)]
                if kl.size == 0:
                    continue
                shown = np.sort(np.maximum(kl[np.isfinite(kl)], floor))
                ecdf = np.arange(1, shown.size + 1) / kl.size
                tag_scheme(ax.step(shown, ecdf, where="post", color=colors[scheme],
                                   lw=nested_size(schemes, scheme, 2.0, 0.45, 0.6),
                                   zorder=3 + 0.1 * schemes.index(scheme)), scheme)
                line = select_rows(summary, distribution=dist, dim=dim, budget=budget, scheme=scheme,
                                   sharpness=float(sharpness))
                for column, style in (("kl_mean", "--"), ("kl_p99", ":")):
                    value = float(line[column].iloc[0]) if len(line) else np.nan
                    if np.isfinite(value):
                        tag_scheme(ax.axvline(max(value, floor), color=colors[scheme], ls=style, lw=0.9, alpha=0.9,
                                              zorder=2), scheme)
            log_axis(ax, "x", np.maximum(row_kl[np.isfinite(row_kl)], floor))
            ax.set_ylim(0, 1.02)
            if i == 0:
                ax.set_title(f"n = {budget} bits")
            if j == len(cols) - 1:
                margin_title(ax, str(dist))
            ax.tick_params(labelbottom=True)
    bottom_xlabel(axes, "KL (nats)")
    fig.supylabel("fraction of queries")
    floor_note = (f"; KL below {tick_label(floor)} nats drawn at it: {', '.join(below)} queries" if below
                  else f"; no KL below {tick_label(floor)} nats")
    suptitle(fig, (f"{title}: d = {dim}{dim_note}, sharpness {short_number(float(sharpness))}{s_note}{floor_note}"))
    handles = scheme_handles(schemes, colors, markers) + [
        Line2D([], [], color="black", ls="-", lw=1.0), Line2D([], [], color="black", ls="--", lw=0.9),
        Line2D([], [], color="black", ls=":", lw=0.9),
    ]
    for h in handles[: len(schemes)]:
        h.set_marker("")
    labels = [*schemes, "ECDF", "mean", "p99"]
    figure_legend(fig, handles, labels, ncol=4 if len(labels) <= 8 else 5)
    return fig
