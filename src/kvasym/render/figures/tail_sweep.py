"""Family ``tail_sweep``: key direction error and mean KL against the Student-t tail index nu.

One line per scheme at the headline dim, budget and sharpness, from the gathered summary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.ticker as mticker
import pandas as pd
from matplotlib.figure import Figure

from ._style import (
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


def _sweep_frame(summary: pd.DataFrame, values: Mapping[str, float], dim: Any, budget: Any, sharpness: Any,
                 column: str) -> tuple[pd.DataFrame, Any, Any, Any, str]:
    frame = select_rows(summary, distribution=list(values)) if values else summary.iloc[0:0]
    dim, dim_note = choose_value(frame, "dim", dim)
    frame = select_rows(frame, dim=dim)
    budget, b_note = choose_value(frame, "budget", budget)
    budget = None if budget is None else int(budget)
    frame = select_rows(frame, budget=budget)
    sharpness, s_note = choose_value(frame, "sharpness", sharpness)
    frame = select_rows(frame, sharpness=None if sharpness is None else float(sharpness)).copy()
    if "distribution" in frame.columns:
        frame[column] = frame["distribution"].map({k: float(v) for k, v in values.items()})
    return frame, dim, budget, sharpness, dim_note + b_note + s_note


@styled
def tail_sweep(
    summary: pd.DataFrame,
    nu_by_distribution: Mapping[str, float],
    *,
    dim: int | None = None,
    budget: int | None = None,
    sharpness: float | None = None,
    metrics: Sequence[str] = ("k_eps_dir_mean", "kl_mean"),
    colors: Mapping[str, str] | None = None,
) -> Figure:
    """``metrics`` against the Student-t tail index nu (log x; heavier tails to the left), one
    line per scheme, at one dim, budget and sharpness; ``nu_by_distribution`` names the
    Student-t instances (distribution -> nu)."""
    title = "Tail sweep"
    frame, dim, budget, sharpness, note = _sweep_frame(summary, nu_by_distribution, dim, budget, sharpness, "nu")
    if frame.empty:
        return nothing_to_show(title, f"no summary rows of a Student-t distribution ("
                                      f"{', '.join(map(str, nu_by_distribution)) or 'none in the config'}) "
                                      f"at d = {dim}, n = {budget}")
    colors, markers = palette(frame["scheme"].unique(), colors)
    schemes = scheme_order(frame["scheme"].unique())
    fig, axes = new_figure(1, len(metrics), height=2.1)
    nus = sorted(frame["nu"].unique())
    for ax, metric in zip(axes[0], metrics):
        if metric not in frame.columns or not line_panel(ax, frame, "nu", metric, schemes, colors, markers):
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_xscale("log")
        ax.set_xticks(nus, [short_number(v) for v in nus])
        ax.xaxis.set_minor_locator(mticker.NullLocator())
        ax.set_xlabel("tail index ν")
        ax.set_ylabel(METRIC_LABELS.get(metric, safe_text(metric)))
    one = f"; only one tail index (ν = {short_number(nus[0])}): no sweep to show" if len(nus) < 2 else ""
    suptitle(fig, (f"{title}: d = {dim}, n = {budget}, sharpness {short_number(float(sharpness))}{note}{one}"))
    figure_legend(fig, scheme_handles(schemes, colors, markers), schemes)
    return fig
