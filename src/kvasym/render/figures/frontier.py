"""The rate-distortion frontier figures: one distortion against measured total bits per coordinate.

Each figure reads the frontier's points (stage ``frontier``, :func:`kvasym.frontier.frontier_points`)
and draws one panel per (distribution, dim) at one sharpness (the headline's for synthetic data,
the model's own, 1, for the real caches): each scheme is a line through its budgets at its
measured total bits (payload + side); points on the Pareto set (:func:`kvasym.frontier.pareto_mask`)
are ringed in black (family ``frontier``; style: :mod:`kvasym.render.figures._style`). Up to 18
schemes share a panel, so each kind of side information has its line style
(:data:`GROUP_LINESTYLES`, the groups of :func:`kvasym.render.figures.e2e.pareto_group`: solid for a
rotation and codebook, dashed for per-group scales, dotted for fitted bases and uneven
allocations), which tells the kinds apart in greyscale too; the legend lists the schemes group by
group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ...frontier import grid_points
from .e2e import PARETO_GROUPS, pareto_group
from ._style import (
    TEXT_WIDTH,
    figure_legend,
    log_axis,
    new_figure,
    nothing_to_show,
    palette,
    safe_text,
    scheme_handles,
    scheme_order,
    styled,
    suptitle,
    tag_scheme,
)

#: Figure name -> (points column, axis label, log axis).
FRONTIER_FIGURES: dict[str, tuple[str, str, bool]] = {
    "frontier_kl": ("kl_mean", "mean KL", True),
    "frontier_kl_p99": ("kl_p99", "p99 KL", True),
    "frontier_recall": ("recall_mean", "top-5 recall", False),
    "frontier_t_eps_dir": ("t_eps_dir_mean", "output direction error", True),
}
MAX_COLS = 3
_STYLE_NAMES = {"-": "solid", "--": "dashed", ":": "dotted"}
#: Bits per coordinate shown right of the grid's largest budget (a scheme's extra budgets,
#: ``frontier.extra_budgets``, are drawn but do not move it): a point beyond it (a scheme whose
#: side information alone exceeds the budgets, e.g. SKLT's d x d basis at d = 1024) is named in
#: the panel instead of squeezing every other scheme into a sliver of the axis.
X_MARGIN = 2.0
#: Line style of each scheme group (:data:`kvasym.render.figures.e2e.PARETO_GROUPS`, in order).
GROUP_LINESTYLES: dict[str, str] = dict(zip(PARETO_GROUPS, ("-", "--", ":"), strict=True))


@styled
def frontier_figure(points: pd.DataFrame | None, name: str, *, sharpness: float, real_sharpness: float = 1.0,
                    real_distributions: Sequence[str] = (), colors: Mapping[str, str] | None = None) -> Figure:
    """The frontier of one distortion (``name`` in :data:`FRONTIER_FIGURES`) against measured
    total bits per coordinate, one panel per (distribution, dim)."""
    column, label, log = FRONTIER_FIGURES[name]
    title = f"Rate-distortion frontier: {label} against total bits"
    if points is None or points.empty:
        return nothing_to_show(title, "no frontier points (config key frontier.schemes is empty)")
    real = set(real_distributions)
    keep = np.where(points["distribution"].isin(real),
                    np.isclose(points["sharpness"].to_numpy(dtype=float), real_sharpness),
                    np.isclose(points["sharpness"].to_numpy(dtype=float), sharpness))
    frame = points[keep]
    if frame.empty:
        return nothing_to_show(title, f"no frontier points at sharpness {sharpness:g}")
    panels = list(frame[["distribution", "dim"]].drop_duplicates().itertuples(index=False, name=None))
    order = {d: i for i, d in enumerate(dict.fromkeys(frame["distribution"]))}
    panels.sort(key=lambda p: (p[0] in real, order[p[0]], p[1]))
    ncol = min(MAX_COLS, len(panels))
    nrow = int(np.ceil(len(panels) / ncol))
    colors, markers = palette(frame["scheme"].unique(), colors)
    schemes = scheme_order(frame["scheme"].unique())
    group_of = {scheme: pareto_group(scheme) for scheme in schemes}
    schemes = sorted(schemes, key=lambda scheme: PARETO_GROUPS.index(group_of[scheme]))  # stable: order kept
    styles = {scheme: GROUP_LINESTYLES[group_of[scheme]] for scheme in schemes}
    fig, axes = new_figure(nrow, ncol, width=TEXT_WIDTH, row_height=1.75, extra=0.9)
    flag = f"pareto_{column}"
    x_max = float(grid_points(frame)["budget"].max()) + X_MARGIN
    for k, (dist, dim) in enumerate(panels):
        ax = axes[k // ncol, k % ncol]
        g = frame[(frame["distribution"] == dist) & (frame["dim"] == dim)]
        shown: list[float] = []
        beyond: list[str] = []
        for scheme in schemes:
            s = g[g["scheme"] == scheme].sort_values("bits_total")
            x = s["bits_total"].to_numpy(dtype=float)
            y = s[column].to_numpy(dtype=float)
            far = x > x_max
            if far.any():
                beyond.append(f"{scheme} at {x[far].min():.3g}-{x[far].max():.3g} bits")
            ok = (np.isfinite(x) & np.isfinite(y) & ((y > 0) if log else np.ones(len(y), bool))) & ~far
            if not ok.any():
                continue
            tag_scheme(ax.plot(x[ok], y[ok], color=colors[scheme], marker=markers[scheme], ms=3.2, lw=0.9,
                               ls=styles[scheme], zorder=3)[0], scheme)
            on = ok & s[flag].to_numpy(dtype=bool) if flag in s.columns else np.zeros(len(s), bool)
            if on.any():
                ax.plot(x[on], y[on], ls="none", marker="o", ms=7, mfc="none", mec="black", mew=0.8, zorder=4)
            shown.extend(y[ok])
        if log and shown:
            log_axis(ax, "y", shown)
        if beyond:
            ax.text(0.98, 0.98, safe_text("beyond the axis: " + "; ".join(beyond)), ha="right", va="top",
                    fontsize="x-small", transform=ax.transAxes, wrap=True)
        note = " (real)" if dist in real else ""
        ax.set_title(safe_text(f"{dist}{note}, d = {dim}"), fontsize="small")
        ax.set_xlabel("total bits per coordinate")
        if k % ncol == 0:
            ax.set_ylabel(label)
    for k in range(len(panels), nrow * ncol):
        axes[k // ncol, k % ncol].set_visible(False)
    present = [g for g in PARETO_GROUPS if g in group_of.values()]
    kinds = "; ".join(f"{_STYLE_NAMES[GROUP_LINESTYLES[g]]}: {g}" for g in present) if len(present) > 1 else ""
    suptitle(fig, f"{title} (sharpness {sharpness:g}; real caches at {real_sharpness:g}); ringed: Pareto set"
             + (f"; lines {kinds}" if kinds else ""))
    handles = scheme_handles(schemes, colors, markers)
    for handle, scheme in zip(handles, schemes, strict=True):
        handle.set_linestyle(styles[scheme])
    figure_legend(fig, handles, schemes, ncol=min(6, len(schemes)))
    return fig
