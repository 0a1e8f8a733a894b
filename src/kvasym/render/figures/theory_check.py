"""Family ``theory_check``: the QJL inner-product variance ratios over their closed forms.

Read from the gathered theory table (estimate, interval and closed form per check): the figure
divides by the closed form to draw every check against the line at 1, and computes nothing else.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ._style import (
    BUDGET_LABEL,
    DISTRIBUTION_COLORS,
    DISTRIBUTION_MARKERS,
    TEXT_WIDTH,
    choose_value,
    figure_legend,
    log_axis,
    new_figure,
    nothing_to_show,
    present_values,
    select_rows,
    styled,
    suptitle,
)


THEORY_CHECKS = {
    "qjl_vs_residual": ("(n−1) bits + QJL\nvs (n−1)-bit residual", math.pi / 2, "π/2"),
    "qjl_vs_nbit": ("(n−1) bits + QJL\nvs n-bit scalar", 2 * math.pi, "2π"),
    # the orthogonal sketch's analogue of 2 pi: (pi/2 - 1) D(n-1)/D(n) -> 4 (pi/2 - 1)
    "hadamard_vs_nbit": ("(n−1) bits + hadamard\nvs n-bit scalar", 4 * (math.pi / 2 - 1), "4(π/2−1)"),
}


@styled
def theory_check(theory: pd.DataFrame, *, dim: int | None = None, distributions: Sequence[str] | None = None) -> Figure:
    """Measured QJL variance ratios divided by their closed forms (estimate and 95% CI per
    distribution) against the budget, one panel per check, on one shared log axis: the closed
    form is the line at 1 (drawn above the markers, so it is never hidden under them), and a
    heavy-tailed point far from it cannot squeeze the others onto one line. The axis range is
    set by the estimates and 1 (:func:`log_ticks`), not by the intervals, which are clipped to
    it (heavy tails give unbounded ones). The third panel is the second ratio with the
    orthogonal hadamard sketch. The limits pi/2, 2 pi and 4 (pi/2 - 1) of the closed forms are
    named in the panel titles."""
    title = "QJL inner-product variance ratios"
    frame = (select_rows(theory, check=list(THEORY_CHECKS)) if theory is not None and "check" in theory.columns
             else pd.DataFrame())
    dim, dim_note = choose_value(frame, "dim", dim)
    frame = select_rows(frame, dim=dim)
    dists = present_values(frame, "distribution", distributions)
    frame = select_rows(frame, distribution=dists) if dists else frame.iloc[0:0]
    if frame.empty:
        return nothing_to_show(title, f"no qjl_vs_residual / qjl_vs_nbit rows in the theory table for d = {dim}")
    frame = frame.copy()
    closed = frame["theory"].to_numpy(dtype=float)
    closed = np.where(np.isfinite(closed) & (closed > 0), closed, np.nan)  # no closed form: no point
    for column in ("estimate", "low", "high"):
        frame[f"{column}_rel"] = frame[column].to_numpy(dtype=float) / closed
    # three panels with two-line titles: the text width, not a column
    fig, axes = new_figure(1, len(THEORY_CHECKS), width=TEXT_WIDTH, height=2.3, sharey=True)
    budgets = sorted(frame["budget"].unique())
    width = 0.5
    offsets = {d: (k - (len(dists) - 1) / 2) * (width / max(len(dists), 1)) for k, d in enumerate(dists)}
    for ax, (check, (label, _limit, limit_text)) in zip(axes[0], THEORY_CHECKS.items()):
        rows = frame[frame["check"] == check]
        for k, dist in enumerate(dists):
            g = rows[rows["distribution"] == dist].sort_values("budget")
            g = g[np.isfinite(g["estimate_rel"]) & (g["estimate_rel"] > 0)]
            if g.empty:
                continue
            x = g["budget"].to_numpy(dtype=float) + offsets[dist]
            est, low, high = (g[f"{c}_rel"].to_numpy(dtype=float) for c in ("estimate", "low", "high"))
            bounded = np.isfinite(low) & np.isfinite(high) & (low > 0)
            color = DISTRIBUTION_COLORS[k % len(DISTRIBUTION_COLORS)]
            marker = DISTRIBUTION_MARKERS[k % len(DISTRIBUTION_MARKERS)]
            if bounded.any():
                ax.errorbar(x[bounded], est[bounded],
                            yerr=np.clip(np.vstack([est - low, high - est])[:, bounded], 0, None), fmt=marker,
                            color=color, markersize=3.5, elinewidth=0.9, capsize=1.5, lw=0, zorder=3)
            if not bounded.all():  # an interval without a finite positive bound: a hollow marker alone
                ax.plot(x[~bounded], est[~bounded], marker=marker, ls="none", color=color, mfc="white",
                        markersize=3.5, markeredgewidth=0.9, zorder=3, gid="unbounded-interval")
        # the closed form, above the markers: every point is read against it
        ax.axhline(1.0, color="black", lw=1.0, zorder=5, gid="closed-form")
        ax.set_xticks(budgets)
        ax.set_xlim(min(budgets) - 0.6, max(budgets) + 0.6)
        ax.set_xlabel(BUDGET_LABEL)
        ax.set_title(f"{label}\n(closed form → {limit_text})")
    shown = frame["estimate_rel"].to_numpy(dtype=float)
    log_axis(axes[0, 0], "y", np.r_[shown[np.isfinite(shown) & (shown > 0)], 1.0])
    axes[0, 0].set_ylabel("measured / closed form (×)")
    hollow = "; hollow: CI unbounded" if any(
        line.get_gid() == "unbounded-interval" for ax in axes[0] for line in ax.lines) else ""
    suptitle(fig, f"{title} over their closed forms: d = {dim}{dim_note}; bars: 95% CI{hollow}")
    handles = [Line2D([], [], color=DISTRIBUTION_COLORS[k % len(DISTRIBUTION_COLORS)],
                      marker=DISTRIBUTION_MARKERS[k % len(DISTRIBUTION_MARKERS)], ls="none", markersize=4)
               for k in range(len(dists))]
    handles.append(Line2D([], [], color="black", lw=1.0))
    labels = [*map(str, dists), "closed form (ratio 1)"]
    figure_legend(fig, handles, labels, ncol=min(len(labels), 6), loc="outside lower center")
    return fig
