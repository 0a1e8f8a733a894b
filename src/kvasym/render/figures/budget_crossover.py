"""Family ``budget_crossover``: key direction error and mean KL against the budget n.

One line per scheme at the headline distribution, dim and sharpness, from the gathered summary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd
from matplotlib.figure import Figure

from ._style import (
    BUDGET_LABEL,
    METRIC_LABELS,
    choose_value,
    figure_legend,
    line_panel,
    new_figure,
    nothing_to_show,
    palette,
    safe_text,
    scheme_handles,
    scheme_order,
    select_rows,
    short_number,
    styled,
    suptitle,
)


@styled
def budget_crossover(
    summary: pd.DataFrame,
    *,
    distribution: str | None = None,
    dim: int | None = None,
    sharpness: float | None = None,
    metrics: Sequence[str] = ("k_eps_dir_mean", "kl_mean"),
    colors: Mapping[str, str] | None = None,
) -> Figure:
    """``metrics`` (default: key direction error and mean KL) against the budget n, one line
    per scheme, one panel per metric, for one distribution, dim and sharpness (log y)."""
    title = "Budget crossover"
    distribution, d_note = choose_value(summary, "distribution", distribution)
    frame = select_rows(summary, distribution=distribution)
    dim, dim_note = choose_value(frame, "dim", dim)
    frame = select_rows(frame, dim=dim)
    sharpness, s_note = choose_value(frame, "sharpness", sharpness)
    frame = select_rows(frame, sharpness=None if sharpness is None else float(sharpness))
    if frame.empty or frame["budget"].nunique() == 0:
        return nothing_to_show(title, f"no summary rows for {distribution}, d = {dim}, sharpness = {sharpness}")
    colors, markers = palette(frame["scheme"].unique(), colors)
    schemes = scheme_order(frame["scheme"].unique())
    fig, axes = new_figure(1, len(metrics), height=2.1)
    budgets = sorted(frame["budget"].unique())
    for ax, metric in zip(axes[0], metrics):
        if metric not in frame.columns or not line_panel(ax, frame, "budget", metric, schemes, colors, markers):
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks(budgets)
        ax.set_xlabel(BUDGET_LABEL)
        ax.set_ylabel(METRIC_LABELS.get(metric, safe_text(metric)))
    one = " (one budget: no crossover to see)" if len(budgets) < 2 else ""
    suptitle(fig, (f"{title}: {distribution}{d_note}, d = {dim}{dim_note}, "
                    f"sharpness {short_number(float(sharpness))}{s_note}{one}"))
    figure_legend(fig, scheme_handles(schemes, colors, markers), schemes)
    return fig
