"""The model card's figures: K against V sensitivity per layer, and the measured allocation.

Family ``card``. Reads the tables of stage ``card`` (:mod:`kvasym.real.card`): ``card_layers``
(the calibration texts' mean next-token KL with one layer's K or V alone quantized, per width)
and ``card_allocation`` (the width of every unit at every budget), and draws in the figures'
style (:mod:`kvasym.render.figures._style`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ._style import TEXT_WIDTH, log_axis, new_figure, nothing_to_show, safe_text, styled, suptitle

#: Colour of each side's line or bar (K keys, V values).
SIDE_COLORS = {"K": "#1f77b4", "V": "#d62728", "KV": "#7f7f7f"}


@styled
def card_sensitivity(layers: pd.DataFrame | None, *, model: str = "real model") -> Figure:
    """Mean next-token KL with one layer's K (solid) or V (dashed) alone quantized, against the
    layer, one line per side and width (log y); lines carry ``gid = "side=<side>@<width>"``."""
    title = f"K and V sensitivity per layer ({model})"
    needed = {"layer", "side", "width", "kl"}
    if layers is None or layers.empty or not needed <= set(layers.columns):
        return nothing_to_show(title, "no model card (real.card off)")
    widths = sorted(int(w) for w in layers["width"].unique() if int(w) <= 4)
    fig, axes = new_figure(1, 1, width=TEXT_WIDTH, height=2.6)
    ax = axes[0, 0]
    shown: list[float] = []
    for i, width in enumerate(widths):
        for side in sorted(layers["side"].unique()):
            g = layers[(layers["side"] == side) & (layers["width"] == width)].sort_values("layer")
            y = g["kl"].to_numpy(float)
            ok = np.isfinite(y) & (y > 0)
            if not ok.any():
                continue
            (line,) = ax.plot(g["layer"].to_numpy()[ok], y[ok], color=SIDE_COLORS.get(side, "k"),
                              ls="-" if side == "K" else "--", lw=1.0, marker="o", ms=2.5,
                              alpha=0.35 + 0.65 * (i + 1) / len(widths),
                              label=f"{side}, {width} bit{'' if width == 1 else 's'}")
            line.set_gid(f"side={side}@{width}")
            shown.extend(y[ok])
    if shown:
        log_axis(ax, "y", shown)
    ax.set_xlabel("layer (alone quantized)")
    ax.set_ylabel("next-token KL (nats)")
    ax.legend(fontsize="x-small", ncol=max(1, len(widths)), frameon=False)
    suptitle(fig, safe_text(f"{title}: one layer and one side quantized at a time, calibration texts"))
    return fig


@styled
def card_allocation(allocation: pd.DataFrame | None, *, model: str = "real model") -> Figure:
    """The measured allocation's width per layer (one bar per unit: K and V, and per KV head at
    that granularity), one panel per budget, with the uniform budget as a line; bars carry
    ``gid = "side=<side>@<budget>"``."""
    title = f"Measured bit allocation ({model})"
    needed = {"budget", "layer", "side", "width"}
    if allocation is None or allocation.empty or not needed <= set(allocation.columns):
        return nothing_to_show(title, "no model card (real.card off)")
    budgets = sorted(int(b) for b in allocation["budget"].unique())
    fig, axes = new_figure(len(budgets), 1, width=TEXT_WIDTH, height=1.1 * len(budgets) + 0.6, sharex=True)
    for ax, budget in zip(axes[:, 0], budgets):
        rows = allocation[allocation["budget"] == budget]
        sides = [s for s in ("K", "V", "KV") if s in set(rows["side"])]
        heads = sorted(int(h) for h in rows["kv_head"].unique())
        slot = 0.8 / (len(sides) * len(heads))  # one bar per unit: side, then KV head, within a layer
        for j, side in enumerate(sides):
            for k, head in enumerate(heads):
                unit = rows[(rows["side"] == side) & (rows["kv_head"] == head)].sort_values("layer")
                offset = -0.4 + slot * (j * len(heads) + k + 0.5)
                bars = ax.bar(unit["layer"].to_numpy() + offset, unit["width"].to_numpy(float), width=slot,
                              color=SIDE_COLORS[side], label=side if k == 0 else None)
                for patch in bars:
                    patch.set_gid(f"side={side}@{budget}")
        ax.axhline(budget, color="k", lw=0.8)
        ax.set_ylabel(safe_text(f"bits (n = {budget})"), fontsize="small")
    axes[0, 0].legend(fontsize="x-small", ncol=3, frameon=False)
    axes[-1, 0].set_xlabel("layer")
    suptitle(fig, safe_text(f"{title}: widths of least predicted KL at each uniform budget's rate"))
    return fig
