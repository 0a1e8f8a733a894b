"""Family ``real_heatmap``: mean per-query KL per layer and KV head of the real model's caches.

The means are computed by the library (:func:`kvasym.real.layer_means.real_kl_means`) from the
real rows' per-query files; the figure lays them out, one heat map per distribution (keys
quantized after, then before RoPE) and scheme, on one logarithmic colour scale.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ._style import (
    HEATMAP_CMAP,
    HEATMAP_MISSING,
    STYLE,
    TEXT_WIDTH,
    choose_value,
    colorbar_log_ticks,
    margin_title,
    new_figure,
    nothing_to_show,
    present_values,
    safe_text,
    select_rows,
    styled,
    suptitle,
)


#: Smallest cell (inches) whose value is written in it at 6 pt ("1.2e-05" is ~0.34 in wide).
ANNOTATE_MIN_CELL = (0.38, 0.14)


def _heatmap_grid(frame: pd.DataFrame, rows: Sequence[str], cols: Sequence[str], layers: Sequence[int],
                  heads: Sequence[int], value: str) -> np.ndarray:
    """``value`` of ``frame`` as an array (rows, cols, layers, heads), NaN where absent."""
    if frame.duplicated(["distribution", "scheme", "layer", "kv_head"]).any():
        raise ValueError("the heat map needs one row per (distribution, scheme, layer, kv_head)")
    grid = np.full((len(rows), len(cols), len(layers), len(heads)), np.nan)
    r = pd.Categorical(frame["distribution"], categories=list(rows)).codes
    c = pd.Categorical(frame["scheme"], categories=list(cols)).codes
    li = np.searchsorted(np.asarray(layers), frame["layer"].to_numpy(dtype=np.int64))
    hi = np.searchsorted(np.asarray(heads), frame["kv_head"].to_numpy(dtype=np.int64))
    grid[r, c, li, hi] = frame[value].to_numpy(dtype=float)
    return grid


@styled
def real_kl_heatmap(
    means: pd.DataFrame,
    *,
    distributions: Sequence[str] | None = None,
    schemes: Sequence[str] | None = None,
    budget: int | None = None,
    row_labels: Mapping[str, str] | None = None,
    model: str = "real model",
) -> Figure:
    """Mean KL per (layer, KV head) of a real model's caches, one heat map per distribution
    (rows: post-RoPE, pre-RoPE) and scheme (columns), at one budget.

    ``means``: one row per (distribution, scheme, layer, kv_head) with ``kl_mean`` (and
    ``budget``), as :func:`kvasym.real.layer_means.real_kl_means` returns them. Panel rows are
    layers (model layer numbers, top to bottom), columns KV heads. Every panel shares one
    logarithmic colour scale (KL spans decades between schemes) with one colour bar below;
    cells without a finite positive mean are grey. Values are written in the cells when the
    cells are large enough to read them (:data:`ANNOTATE_MIN_CELL`). Each image carries
    ``gid = "heatmap=<distribution>|<scheme>"``.
    """
    from matplotlib.colors import LogNorm

    title = f"Mean KL per layer and KV head ({model})"
    frame = means if means is not None else pd.DataFrame()
    if frame.empty or not {"distribution", "scheme", "layer", "kv_head", "kl_mean"} <= set(frame.columns):
        return nothing_to_show(title, f"no real-model rows (per (layer, KV head) mean KL) at n = {budget}",
                               width=TEXT_WIDTH)
    budget, b_note = choose_value(frame, "budget", budget)
    frame = select_rows(frame, budget=None if budget is None else int(budget))
    rows = present_values(frame, "distribution", distributions)
    cols = present_values(frame, "scheme", schemes)
    frame = select_rows(frame, distribution=rows, scheme=cols) if rows and cols else frame.iloc[0:0]
    if frame.empty:
        return nothing_to_show(title, f"no real-model rows of "
                                      f"{list(distributions) if distributions else 'any distribution'} "
                                      f"and {list(schemes) if schemes else 'any scheme'} at n = {budget}",
                               width=TEXT_WIDTH)
    layers = sorted(int(x) for x in frame["layer"].unique())
    heads = sorted(int(x) for x in frame["kv_head"].unique())
    grid = _heatmap_grid(frame, rows, cols, layers, heads, "kl_mean")
    positive = grid[np.isfinite(grid) & (grid > 0)]
    if positive.size == 0:
        return nothing_to_show(title, f"every mean KL at n = {budget} is 0 or not finite: "
                                      f"nothing to draw on a log scale", width=TEXT_WIDTH)
    vmin, vmax = float(positive.min()), float(positive.max())
    if vmax <= vmin:  # one value: a log scale still needs a range
        vmin, vmax = vmin / 1.5, vmax * 1.5
    norm = LogNorm(vmin=vmin, vmax=vmax)
    cmap = matplotlib.colormaps[HEATMAP_CMAP].with_extremes(bad=HEATMAP_MISSING)
    width = TEXT_WIDTH
    row_height = min(3.0, max(1.1, 0.16 * len(layers) + 0.35))
    fig, axes = new_figure(len(rows), len(cols), width=width, row_height=row_height, extra=1.05, sharex=True,
                           sharey=True)
    # cell size from the planned geometry (labels and colour bar take about 0.9 in across, 0.3 in per row)
    cell_w = (width - 0.9) / len(cols) / len(heads)
    cell_h = (row_height - 0.3) / len(layers)
    annotate = cell_w >= ANNOTATE_MIN_CELL[0] and cell_h >= ANNOTATE_MIN_CELL[1]
    step = max(1, math.ceil(len(layers) / 10))  # at most ~10 layer labels per panel
    labels = dict(row_labels or {})
    image = None
    for i, dist in enumerate(rows):
        for j, scheme in enumerate(cols):
            ax = axes[i, j]
            panel = grid[i, j]
            shown = np.ma.masked_where(~(np.isfinite(panel) & (panel > 0)), panel)
            image = ax.imshow(shown, norm=norm, cmap=cmap, aspect="auto", interpolation="nearest", origin="upper")
            image.set_gid(f"heatmap={dist}|{scheme}")
            ax.grid(False)
            for spine in ax.spines.values():
                spine.set_visible(False)
            ax.set_xticks(range(len(heads)), [str(h) for h in heads])
            ax.set_yticks(range(0, len(layers), step), [str(layers[k]) for k in range(0, len(layers), step)])
            ax.tick_params(which="both", length=0)
            if not np.isfinite(panel).any():
                ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
            if annotate:
                li, hi = np.nonzero(~shown.mask) if np.ma.is_masked(shown) else np.indices(panel.shape).reshape(2, -1)
                rgba = cmap(norm(panel[li, hi]))
                luminance = rgba[:, :3] @ np.array([0.299, 0.587, 0.114])
                for y, x, v, lum in zip(li, hi, panel[li, hi], luminance):
                    ax.text(x, y, f"{v:.2g}", ha="center", va="center", fontsize=STYLE["font.size"],
                            color="black" if lum > 0.5 else "white")
            if i == 0:
                ax.set_title(safe_text(scheme))
            if i == len(rows) - 1:
                ax.set_xlabel("KV head")
            if j == 0:
                ax.set_ylabel("layer")
            if j == len(cols) - 1:
                margin_title(ax, labels.get(dist, str(dist)))
    bar = fig.colorbar(image, ax=axes.ravel().tolist(), location="bottom", shrink=0.6, aspect=35)
    bar.set_label("mean KL(p ‖ p̂) (nats, log scale)")
    colorbar_log_ticks(bar.ax.xaxis, [vmin, vmax])
    bar.outline.set_linewidth(0.4)
    missing = "; grey: no finite positive mean" if (~np.isfinite(grid) | (grid <= 0)).any() else ""
    suptitle(fig, f"{title}: n = {budget} bits{b_note}; mean over texts, query heads and positions{missing}")
    return fig


def real_rows_heatmap(means: pd.DataFrame | None, schemes: Sequence[str], budget: int) -> Figure:
    """The real model's heat map as the paper shows it: rows the real distributions (keys
    quantized after RoPE, then before), columns the study's ``schemes`` in config order, at
    ``budget``, each row labelled with its RoPE mode.

    Parameters
    ----------
    means : pandas.DataFrame or None
        :func:`kvasym.real.layer_means.real_kl_means` of the real rows' per-query files.
    schemes : sequence of str
        The study's schemes, in config order (the columns).
    budget : int
        The headline budget.

    Returns
    -------
    matplotlib.figure.Figure
        :func:`real_kl_heatmap` of those rows and columns.
    """
    from ...real import REAL_MODEL_NAME
    from ...real.evaluate import REAL_DISTRIBUTIONS

    labels = {name: f"{name}\n({mode}-RoPE keys)" for name, mode in REAL_DISTRIBUTIONS.items()}
    order = sorted(REAL_DISTRIBUTIONS, key=lambda name: REAL_DISTRIBUTIONS[name] != "post")
    return real_kl_heatmap(means, distributions=order, schemes=list(schemes), budget=budget, row_labels=labels,
                           model=REAL_MODEL_NAME)
