"""Family ``query_model``: C5's ratio under each query model, against the queries' alignment.

The points, their 95% intervals and their second-order predictions are the gathered
``query_model`` table (:func:`kvasym.claims.query_model_points`, written by stage ``gather``
with the claims' own interval): the figure reads them and recomputes nothing.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ._style import (
    figure_legend,
    new_figure,
    nothing_to_show,
    safe_text,
    short_number,
    styled,
    suptitle,
)


RANK_STYLES = ("-", "--", ":", "-.")


@styled
def query_model_sweep(points: pd.DataFrame | None) -> Figure:
    """C5's statistic (mean KL of low-rank data over the heaviest-tailed reference) against the
    queries' alignment a with the keys' covariance (log-log), one panel per dim, one line per
    rank through its query models: the subspace rule at a = d / r, calibrated models at their
    a, the isotropic model (hollow marker) at E[a] = 1. ``points`` is the gathered query-model
    table (:func:`kvasym.claims.query_model_points`: one scheme, budget and sharpness, which the
    title and the axis name; its intervals are the claims'). The grey
    dotted line through each subspace point is the second-order prediction ``KL proportional to
    1 / a`` (after the logit rule a query's norm is d^2 / (a tr C), and the rotated key error
    spreads over all d coordinates, so the logit error variance scales as 1 / a), and a grey cross
    the same prediction for isotropic queries, whose E[1/a] is r (d - 2) / (d (r - 2)) (above the
    line by about r / (r - 2); none for r <= 2, where it is infinite); vertical bars are
    the 95% intervals where finite and positive; the dashed horizontal line is ratio 1."""
    title = "Query model"
    if points is None or points.empty:
        return nothing_to_show(title, "no low-rank distribution with a reference distribution at its dim "
                                      "(or no query-model variants: config key query_models)")
    scheme, budget, sharpness = (points[c].iloc[0] for c in ("scheme", "budget", "sharpness"))
    dims = sorted(points["dim"].unique())
    fig, axes = new_figure(1, len(dims), height=2.3, sharey=True)
    ranks = sorted(points["rank"].unique())
    styles = {r: RANK_STYLES[i % len(RANK_STYLES)] for i, r in enumerate(ranks)}
    markers = {r: m for r, m in zip(ranks, "osD^v<>")}
    for ax, d in zip(axes[0], dims):
        panel = points[points["dim"] == d]
        for rank in ranks:
            line = panel[panel["rank"] == rank].sort_values("alignment")
            if line.empty:
                continue
            ax.plot(line["alignment"], line["ratio"], color="black", ls=styles[rank], lw=0.9)
            for _, p in line.iterrows():
                hollow = p["query"] == "isotropic"
                low, high = p["low"], p["high"]
                if np.isfinite(low) and np.isfinite(high) and low > 0:
                    ax.plot([p["alignment"]] * 2, [low, high], color="black", lw=0.7)
                ax.plot([p["alignment"]], [p["ratio"]], marker=markers[rank], ms=4, ls="none", color="black",
                        mfc="white" if hollow else "black")
            base = line[line["query"] == "subspace"]
            if not base.empty:
                a0, y0 = float(base["alignment"].iloc[0]), float(base["ratio"].iloc[0])
                grid = np.geomspace(min(line["alignment"].min(), 1.0), a0, 20)
                ax.plot(grid, y0 * a0 / grid, color="0.55", ls=":", lw=0.8)
        iso = panel[(panel["query"] == "isotropic") & np.isfinite(panel["predicted"])]
        ax.plot(iso["alignment"], iso["predicted"], ls="none", marker="x", ms=4, color="0.45")
        ax.axhline(1.0, color="0.4", ls="--", lw=0.6)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("alignment a of the queries")
        refs = ", ".join(sorted(set(panel["reference"])))
        ax.set_title(f"d = {d}: low rank / {refs}")
    axes[0, 0].set_ylabel(f"mean KL ratio, {safe_text(scheme)}")
    suptitle(fig, f"{title}: n = {int(budget)}, sharpness {short_number(float(sharpness))}")
    handles = [Line2D([], [], color="black", ls=styles[r], marker=markers[r], ms=4, lw=0.9) for r in ranks]
    labels = [f"rank {r}" for r in ranks]
    handles += [Line2D([], [], color="black", marker="o", mfc="white", ls="none", ms=4),
                Line2D([], [], color="0.55", ls=":", lw=0.8),
                Line2D([], [], color="0.45", marker="x", ls="none", ms=4)]
    labels += ["isotropic queries", "∝ 1/a (2nd order)", "∝ E[1/a], isotropic"]
    figure_legend(fig, handles, labels, ncol=min(len(handles), 3))
    return fig
