"""Family ``rank_sweep``: mean KL against the rank of low-rank keys, one panel per dim.

The heavy-tailed reference distributions (the figures slice's ``rank_references``) are drawn
as horizontal lines, one per scheme and reference.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib.ticker as mticker
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ._style import (
    METRIC_LABELS,
    choose_value,
    figure_legend,
    line_panel,
    log_axis,
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


REFERENCE_STYLES = ("--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)))


@styled
def rank_sweep(
    summary: pd.DataFrame,
    rank_by_distribution: Mapping[str, int],
    reference_distributions: Sequence[str] = (),
    *,
    dims: Sequence[int] | None = None,
    budget: int | None = None,
    sharpness: float | None = None,
    metric: str = "kl_mean",
    colors: Mapping[str, str] | None = None,
) -> Figure:
    """``metric`` (mean KL) against the rank of low-rank data (log2 x), one line per scheme,
    one panel per dim; each reference distribution (heavy-tailed, say) present at that dim is a
    horizontal line per scheme (same colour, one line style per reference)."""
    title = "Rank sweep"
    names = list(rank_by_distribution)
    frame = select_rows(summary, distribution=names) if names else summary.iloc[0:0]
    budget, b_note = choose_value(frame, "budget", budget)
    budget = None if budget is None else int(budget)
    sharpness, s_note = choose_value(frame, "sharpness", sharpness)
    dims_present = present_values(frame, "dim", dims)
    if frame.empty or not dims_present:
        return nothing_to_show(title, f"no summary rows of a low-rank distribution "
                                      f"({', '.join(names) or 'none in the config'})")
    refs = [r for r in reference_distributions if r in set(summary["distribution"])]
    frame = select_rows(frame, budget=budget, sharpness=None if sharpness is None else float(sharpness)).copy()
    frame["rank"] = frame["distribution"].map({k: float(v) for k, v in rank_by_distribution.items()})
    reference = (select_rows(summary, distribution=refs, budget=budget,
                             sharpness=None if sharpness is None else float(sharpness))
                 if refs else summary.iloc[0:0])
    colors, markers = palette(set(frame["scheme"]) | set(reference["scheme"]), colors)
    schemes = scheme_order(set(frame["scheme"]) | set(reference["scheme"]))
    fig, axes = new_figure(1, len(dims_present), height=2.3, sharey=True)
    ranks_seen: set[float] = set()
    ref_styles = {r: REFERENCE_STYLES[i % len(REFERENCE_STYLES)] for i, r in enumerate(refs)}
    refs_drawn: list[str] = []
    for ax, d in zip(axes[0], dims_present):
        panel = select_rows(frame, dim=d)
        ranks = sorted(panel["rank"].unique())
        ranks_seen.update(ranks)
        if not line_panel(ax, panel, "rank", metric, schemes, colors, markers):
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        for ref in refs:
            rows = select_rows(reference, distribution=ref, dim=d)
            for scheme in schemes:
                value = rows.loc[rows["scheme"] == scheme, metric].to_numpy(dtype=float)
                if value.size and np.isfinite(value[0]) and value[0] > 0:
                    tag_scheme(ax.axhline(value[0], color=colors[scheme], ls=ref_styles[ref], lw=0.9, alpha=0.85),
                               scheme)
                    if ref not in refs_drawn:
                        refs_drawn.append(ref)
        ax.set_xscale("log", base=2)
        if ranks:
            ax.set_xticks(ranks, [short_number(r) for r in ranks])
        ax.xaxis.set_minor_locator(mticker.NullLocator())
        ax.set_xlabel("rank R")
        ax.set_title(f"d = {d}")
    if not frame.empty and metric in frame.columns:
        log_axis(axes[0, 0], "y", np.r_[frame[metric].to_numpy(dtype=float), reference[metric].to_numpy(dtype=float)])
    axes[0, 0].set_ylabel(METRIC_LABELS.get(metric, safe_text(metric)))
    one = "; only one rank: no sweep to show" if len(ranks_seen) < 2 else ""
    suptitle(fig, (f"{title}: n = {budget}{b_note}, sharpness {short_number(float(sharpness))}{s_note}{one}"))
    handles = scheme_handles(schemes, colors, markers)
    labels = list(schemes)
    for ref in refs_drawn:
        handles.append(Line2D([], [], color="black", ls=ref_styles[ref], lw=0.9))
        labels.append(f"{ref} (reference)")
    figure_legend(fig, handles, labels, ncol=min(len(handles), 4))
    return fig
