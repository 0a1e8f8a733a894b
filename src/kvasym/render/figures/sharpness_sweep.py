"""Family ``sharpness_sweep``: mean KL against the sharpness, and the QKQV / KQV ratio.

The ratio, its interval and its second-order prediction are read from the gathered comparisons
(:func:`kvasym.cells.pair_ratio`, the numbers claim C2 reports at the headline cell): the figure
draws them and computes no ratio of its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.ticker as mticker
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ...cells import MissingCell, pair_ratio
from ._style import (
    bottom_xlabel,
    choose_value,
    figure_legend,
    line_panel,
    log_axis,
    margin_title,
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
)


@styled
def sharpness_sweep(
    summary: pd.DataFrame,
    *,
    dim: int | None = None,
    budget: int | None = None,
    distributions: Sequence[str] | None = None,
    comparisons: pd.DataFrame | None = None,
    pair: tuple[str, str] = ("QKQV", "KQV"),
    colors: Mapping[str, str] | None = None,
    paper_ratio: float | None = None,
) -> Figure:
    """Per distribution (rows): mean KL of each scheme against the sharpness (log-log), and
    the ratio ``pair[0] / pair[1]`` of mean KL (QKQV over KQV: above 1 means KQV is better)
    with its paired 95% interval and its second-order prediction (the key sides' error-energy
    ratio, :func:`kvasym.theory.predicted_kl_ratio`), all three read from ``comparisons``
    (:func:`kvasym.cells.pair_ratio`: the ratio claim C2 reports at the headline cell, never
    recomputed from the summary's means; without ``comparisons`` the ratio panel says so), and
    the paper's value of the ratio (``paper_ratio``, from the claims file) as a reference line."""
    title = "Sharpness sweep"
    num, den = pair
    dim, dim_note = choose_value(summary, "dim", dim)
    frame = select_rows(summary, dim=dim)
    budget, b_note = choose_value(frame, "budget", budget)
    budget = None if budget is None else int(budget)
    frame = select_rows(frame, budget=budget)
    dists = present_values(frame, "distribution", distributions)
    if frame.empty or not dists:
        return nothing_to_show(title, f"no summary rows for d = {dim}, n = {budget}")
    colors, markers = palette(frame["scheme"].unique(), colors)
    schemes = scheme_order(frame["scheme"].unique())
    fig, axes = new_figure(len(dists), 2, row_height=1.3, extra=0.75, sharex=True)
    sharp = sorted(frame["sharpness"].unique())
    with_ratios = comparisons is not None and not comparisons.empty and "ratio_mean" in comparisons.columns
    ratio_entries: dict[str, Any] = {}  # label -> line of the ratio panels, for the figure legend
    for i, dist in enumerate(dists):
        cell = select_rows(frame, distribution=dist)
        ax_kl, ax_ratio = axes[i]
        if not line_panel(ax_kl, cell, "sharpness", "kl_mean", schemes, colors, markers):
            ax_kl.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax_kl.transAxes)
        # the sharpness values where both schemes have summary rows
        measured = {s: set(cell.loc[cell["scheme"] == s, "sharpness"]) for s in (num, den)}
        common = sorted(measured[num] & measured[den])
        if common and not with_ratios:
            ax_ratio.text(0.5, 0.5, "no comparisons table: no ratio drawn", ha="center", va="center",
                          transform=ax_ratio.transAxes)
        elif common:
            ratio, low, high, theory = _pair_ratios(comparisons, dist, dim, budget, common, num, den)
            ax_ratio.plot(common, ratio, color="black", marker="o", markersize=3.5, lw=1.1, zorder=3,
                          label="measured")
            if np.isfinite(low).any():
                ax_ratio.fill_between(common, low, high, color="0.5", alpha=0.3, linewidth=0, zorder=2)
            if np.isfinite(theory).any():
                ax_ratio.plot(common, theory, color="tab:blue", ls=":", lw=1.3, zorder=4,
                              label="closed form (second-order prediction)")
            if paper_ratio is not None:
                ax_ratio.axhline(paper_ratio, color="tab:red", ls="-.", lw=0.9, zorder=1,
                                 label=safe_text(f"paper's value ({short_number(paper_ratio)})"))
            ax_ratio.axhline(1.0, color="0.4", ls="--", lw=0.8)
            for line in ax_ratio.get_lines():  # the figure legend names each reference line once
                if not line.get_label().startswith("_") and line.get_label() not in ratio_entries:
                    ratio_entries[line.get_label()] = line
            spread = np.r_[ratio, low, high, 1.0, theory, [] if paper_ratio is None else [paper_ratio]]
            finite = spread[np.isfinite(spread) & (spread > 0)]
            if finite.size and finite.max() / finite.min() > 10:
                log_axis(ax_ratio, "y", finite)
        else:
            ax_ratio.text(0.5, 0.5, safe_text(f"{num} or {den} absent"), ha="center", va="center",
                          transform=ax_ratio.transAxes)
        for ax in (ax_kl, ax_ratio):
            ax.set_xscale("log", base=2)
            ax.set_xticks(sharp, [short_number(s) for s in sharp])
            ax.xaxis.set_minor_locator(mticker.NullLocator())
            ax.tick_params(labelbottom=True)
        ax_kl.set_ylabel("mean KL (nats)")
        ax_ratio.set_ylabel("mean-KL ratio (×)")
        margin_title(ax_ratio, str(dist))
        if i == 0:
            ax_kl.set_title("mean KL per scheme")
            ax_ratio.set_title(safe_text(f"{num} / {den}"))
    bottom_xlabel(axes, "sharpness (logit s.d.)")
    ci_note = ", shaded: 95% CI" if with_ratios else ""
    suptitle(fig, f"{title}: d = {dim}{dim_note}, n = {budget}{b_note}; ratio > 1: {den} better{ci_note}")
    # one legend outside the panels: a legend inside the first ratio panel hid its data (issue 15)
    handles = scheme_handles(schemes, colors, markers)
    for line in ratio_entries.values():
        handles.append(Line2D([], [], color=line.get_color(), ls=line.get_linestyle(), lw=line.get_linewidth(),
                              marker=line.get_marker(), markersize=line.get_markersize()))
    labels = [*schemes, *(f"ratio: {label}" if label == "measured" else label for label in ratio_entries)]
    figure_legend(fig, handles, labels, ncol=4)
    return fig


def _pair_ratios(comparisons: pd.DataFrame, dist: str, dim: Any, budget: Any, sharpness: Sequence[float], num: str,
                 den: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The mean-KL ratio num/den per sharpness with its interval, oriented by
    :func:`kvasym.cells.pair_ratio`, and its second-order prediction (the comparisons'
    ``ratio_theory``); NaN where the comparisons have no row (no point is drawn there)."""
    ratio, low, high, theory = (np.full(len(sharpness), np.nan) for _ in range(4))
    for k, s in enumerate(sharpness):
        try:
            found = pair_ratio(comparisons, num, den, distribution=dist, dim=dim, budget=budget, sharpness=float(s))
        except MissingCell:
            continue
        ratio[k], low[k], high[k] = found["estimate"], found["low"], found["high"]
        value = float(found["row"].get("ratio_theory", np.nan))
        if np.isfinite(value) and value > 0:
            theory[k] = 1.0 / value if found["swapped"] else value
    return ratio, low, high, theory
