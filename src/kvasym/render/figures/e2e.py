"""The end-to-end figures: perplexity increase against measured bits, damage against the cache's
memory on every model, layer sensitivity, and the damage against the context read in long windows.

Families ``e2e`` and ``e2e_context``. Both read the tables of stage ``e2e_stats`` (:mod:`kvasym.real.endtoend_stats`)
and draw in the figures' style (:mod:`kvasym.render.figures._style`: its palette, markers, log
axes, legends and placeholders).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ._style import (
    HEATMAP_CMAP,
    HEATMAP_MISSING,
    TEXT_WIDTH,
    colorbar_log_ticks,
    figure_legend,
    log_axis,
    nested_size,
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

ROPE_TITLES = {"post": "keys quantized after RoPE", "pre": "keys quantized before RoPE"}


@styled
def e2e_ppl_bits(summary: pd.DataFrame | None, *, colors: Mapping[str, str] | None = None,
                 model: str = "real model") -> Figure:
    """Relative perplexity increase ``ppl / ppl_ref - 1`` against the measured bits per
    coordinate (payload and side information, mean of K and V): one column of panels per RoPE
    mode, one row per group of schemes (:func:`pareto_group`, as the memory figure), one line
    per scheme (its budgets); bars: the 95% t interval over (text, draw) units; log y (points
    whose increase is not positive are left out, and the title says how many). Colours and
    markers are distinct within a row (``colors`` is accepted for the registry's uniform call and
    not used); each row has its own legend, with :data:`PARETO_REFERENCE` grey in the rows it does
    not belong to."""
    title = f"End-to-end perplexity increase ({model})"
    needed = {"rope", "scheme", "budget", "bits_per_coordinate", "ppl_ratio", "ppl_ratio_low", "ppl_ratio_high"}
    if summary is None or summary.empty or not needed <= set(summary.columns):
        return nothing_to_show(title, "no end-to-end summary (real rows or real.e2e off)")
    ropes = [r for r in ROPE_TITLES if r in set(summary["rope"])]
    frame = summary.assign(increase=summary["ppl_ratio"] - 1.0, increase_low=summary["ppl_ratio_low"] - 1.0,
                           increase_high=summary["ppl_ratio_high"] - 1.0)
    hidden = int((~(np.isfinite(frame["increase"]) & (frame["increase"] > 0))).sum())
    fig = _grouped_lines({ROPE_TITLES[r]: frame[frame["rope"] == r] for r in ropes}, "bits_per_coordinate",
                         "increase", ylabel="perplexity increase\n(ppl / ppl_ref - 1)",
                         xlabel="measured bits per coordinate (K and V mean)", log_x=False)
    note = f"; {hidden} point(s) with no increase not shown" if hidden else ""
    suptitle(fig, f"{title}: every layer's KV cache quantized, one row per kind of side information, 95% t "
             f"intervals over (text, draw) units{note}")
    return fig


#: The rows of the memory figure: what a scheme spends its side information on. A scheme's group
#: is read from its specification (:func:`pareto_group`); run suffixes (``+R128``, ``+C32``,
#: ``+G``, ``+W``) keep their scheme's group.
PARETO_GROUPS = ("rotation and codebook", "per-group scales", "bases and allocations")
#: Drawn thin and grey in every row it does not belong to, so the rows can be read against it.
PARETO_REFERENCE = "RKV"


def pareto_group(name: str) -> str:
    """The row of :func:`e2e_pareto` that scheme ``name`` is drawn in (one of
    :data:`PARETO_GROUPS`): ``per-group scales`` when a side stores scales per group or block
    (a grouped scalar quantizer, KIVI's and llama.cpp's, or dual scaling), ``bases and
    allocations`` when it fits a basis or spends bits unevenly (a KLT, water-filling, or a
    query-aware variant), ``rotation and codebook`` otherwise, the study's schemes and a name
    the registry does not know."""
    from ...real.queryaware import VARIANTS
    from ...schemes import GROUPED_SCALARS, get_scheme

    base = str(name).split("+")[0]
    if base in VARIANTS:
        return PARETO_GROUPS[2]
    try:
        scheme = get_scheme(base)
    except Exception:  # a user's scheme the built-in registry does not hold
        return PARETO_GROUPS[0]
    sides = (scheme.K, scheme.V)
    if any(s.scalar in GROUPED_SCALARS or getattr(s, "normalize", "none") != "none" for s in sides):
        return PARETO_GROUPS[1]
    if any(s.transform == "klt" or s.allocation == "waterfill" for s in sides):
        return PARETO_GROUPS[2]
    return PARETO_GROUPS[0]


@styled
def e2e_pareto(summary: pd.DataFrame | None, *, colors: Mapping[str, str] | None = None,
               names: Mapping[str, str] | None = None) -> Figure:
    """Mean next-token KL against the whole cache's bytes per token at the summary's context
    (``cache_bytes_per_token``: payload, side information and float16 rows, sliding windows
    holding their window; :func:`kvasym.real.endtoend_stats.memory_columns`), keys after RoPE:
    one column of panels per model (``model`` column; ``names`` its display names), one row per
    group of schemes (:func:`pareto_group`), one line per scheme through its budgets; bars: the
    95% t interval over (text, draw) units; log axes shared within a model's column, so the rows
    compare. Colours and markers are distinct within a row (a row's own palette; ``colors`` is
    accepted for the registry's uniform call and not used), each row has its own legend, and
    :data:`PARETO_REFERENCE` is drawn thin and grey in the rows it does not belong to. The
    float16 cache's bytes per token are a dotted vertical line."""
    title = "Damage against memory"
    needed = {"model", "rope", "scheme", "budget", "cache_bytes_per_token", "fp16_bytes_per_token", "kl_mean",
              "kl_mean_low", "kl_mean_high"}
    if summary is None or summary.empty or not needed <= set(summary.columns):
        return nothing_to_show(title, "no end-to-end summary with cache memory (real rows or real.e2e off)")
    post = summary[summary["rope"] == "post"]
    models = list(dict.fromkeys(post["model"]))
    columns = {str((names or {}).get(model, model)): post[post["model"] == model].rename(columns={
        "kl_mean_low": "kl_low", "kl_mean_high": "kl_high"}) for model in models}
    tokens = int(post["memory_tokens"].iloc[0]) if "memory_tokens" in post.columns else None
    fig = _grouped_lines(columns, "cache_bytes_per_token", "kl_mean", low="kl_low", high="kl_high",
                         ylabel="mean next-token KL",
                         xlabel=f"cache bytes per token at {tokens} tokens" if tokens else "cache bytes per token",
                         log_x=True, vline="fp16_bytes_per_token")
    suptitle(fig, f"{title}: every layer's KV cache quantized, keys after RoPE, one row per kind of side information; "
             "95% t intervals over (text, draw) units; dotted: the float16 cache")
    return fig


def _grouped_lines(columns: Mapping[str, pd.DataFrame], x: str, y: str, *, ylabel: str, xlabel: str,
                   low: str | None = None, high: str | None = None, log_x: bool = False,
                   vline: str | None = None) -> Figure:
    """Panels of scheme lines: one column per entry of ``columns`` (title -> frame with columns
    ``scheme``, ``x``, ``y`` and the interval's ``low``/``high``, default ``<y>_low``/``<y>_high``),
    one row per group of schemes present (:func:`pareto_group`); y on a log axis shared by every
    panel, x shared within a column (log when ``log_x``); a row's colours and markers its own
    palette, a legend per row at its right, :data:`PARETO_REFERENCE` thin and grey in the rows it
    does not belong to; ``vline`` a column whose first value is drawn as a dotted vertical line.
    Points whose ``x`` or ``y`` is not finite and positive are left out."""
    low, high = low or f"{y}_low", high or f"{y}_high"
    present = scheme_order(pd.concat([f["scheme"] for f in columns.values()]).unique())
    groups = [(g, [s for s in present if pareto_group(s) == g]) for g in PARETO_GROUPS]
    groups = [(g, members) for g, members in groups if members]
    fig, axes = new_figure(len(groups), len(columns), width=TEXT_WIDTH, height=0.5 + 1.75 * len(groups),
                           sharex="col", sharey=True)
    shown_y: list[float] = []
    shown_x: list[list[float]] = [[] for _ in columns]
    reference = PARETO_REFERENCE in present
    for row, (group, members) in enumerate(groups):
        row_colors, row_markers = palette(members, None)
        for col, (name, frame) in enumerate(columns.items()):
            ax = axes[row, col]
            if vline is not None and vline in frame.columns and len(frame):
                ax.axvline(float(frame[vline].iloc[0]), color="0.4", lw=0.8, ls=":")
                shown_x[col].append(float(frame[vline].iloc[0]))
            drawn = ([PARETO_REFERENCE] if reference and PARETO_REFERENCE not in members else []) + members
            for scheme in drawn:
                g = frame[frame["scheme"] == scheme].sort_values(x)
                xs, ys = g[x].to_numpy(dtype=float), g[y].to_numpy(dtype=float)
                ok = np.isfinite(xs) & np.isfinite(ys) & (ys > 0) & (xs > 0)
                if not ok.any():
                    continue
                shown_x[col].extend(xs[ok])
                if scheme not in members:  # the reference
                    line = ax.plot(xs[ok], ys[ok], color="0.55", lw=0.8, ls="--", marker="D", markersize=2.5,
                                   zorder=2)[0]
                    line.set_gid(f"reference={scheme}")
                    continue
                lo = np.maximum(g[low].to_numpy(dtype=float), ys * 1e-3)
                hi = g[high].to_numpy(dtype=float)
                tag_scheme(ax.errorbar(xs[ok], ys[ok], yerr=[ys[ok] - lo[ok], hi[ok] - ys[ok]],
                                       color=row_colors[scheme], marker=row_markers[scheme],
                                       markersize=nested_size(members, scheme, 5.0, 0.5, 2.5),
                                       lw=nested_size(members, scheme, 1.8, 0.2, 0.6), capsize=2,
                                       zorder=3 + 0.1 * members.index(scheme)), scheme)
                shown_y.extend(ys[ok])
                # the axis holds the points and their upper bounds; a lower bound far below (an
                # interval reaching 0) is clipped by the axis rather than stretching every row
                shown_y.extend(hi[ok][np.isfinite(hi[ok]) & (hi[ok] > 0)])
            if row == 0:
                ax.set_title(safe_text(name))
        axes[row, 0].set_ylabel(f"{group}\n{ylabel}")
        handles, labels = scheme_handles(members, row_colors, row_markers), list(members)
        if reference and PARETO_REFERENCE not in members:
            handles.append(Line2D([], [], color="0.55", lw=0.8, ls="--", marker="D", markersize=2.5))
            labels.append(f"{PARETO_REFERENCE} (reference)")
        legend = axes[row, -1].legend(handles, [safe_text(s) for s in labels], loc="center left",
                                      bbox_to_anchor=(1.02, 0.5), ncol=1 if len(labels) <= 6 else 2,
                                      handlelength=1.4, columnspacing=0.6)
        legend.set_gid(f"legend={group}")
    # one label under every column (the legends are at the right; per-panel labels would collide)
    fig.supxlabel(xlabel)
    if log_x:
        for col in range(len(columns)):
            log_axis(axes[0, col], "x", shown_x[col])
    if shown_y:
        log_axis(axes[0, 0], "y", shown_y)
    return fig


@styled
def e2e_layer_sensitivity(sensitivity: pd.DataFrame | None, *, schemes: Sequence[str] | None = None,
                          model: str = "real model") -> Figure:
    """Mean next-token KL when only one layer's cache is quantized (rows: layers, top to
    bottom; columns: schemes), at the lowest budget and keys after RoPE; one logarithmic colour
    scale, grey where the mean is not finite and positive. Each image carries ``gid =
    "e2e_sensitivity"``."""
    from matplotlib.colors import LogNorm

    title = f"Layer sensitivity ({model})"
    needed = {"scheme", "layer", "kl_mean", "budget"}
    if sensitivity is None or sensitivity.empty or not needed <= set(sensitivity.columns):
        return nothing_to_show(title, "no single-layer passes (real.e2e.sensitivity_layers empty, or real rows off)")
    frame = sensitivity[sensitivity["rope"] == "post"] if "rope" in sensitivity.columns else sensitivity
    budget = int(frame["budget"].min())
    frame = frame[frame["budget"] == budget]
    present = set(frame["scheme"])
    cols = [s for s in (schemes or scheme_order(present)) if s in present]
    layers = sorted(int(x) for x in frame["layer"].unique())
    grid = (frame.pivot(index="layer", columns="scheme", values="kl_mean").reindex(index=layers, columns=cols)
            .to_numpy(dtype=float))
    positive = grid[np.isfinite(grid) & (grid > 0)]
    if positive.size == 0:
        return nothing_to_show(title, "every mean KL is 0 or not finite: nothing to draw on a log scale")
    vmin, vmax = float(positive.min()), float(positive.max())
    if vmax <= vmin:
        vmin, vmax = vmin / 1.5, vmax * 1.5
    norm = LogNorm(vmin=vmin, vmax=vmax)
    cmap = matplotlib.colormaps[HEATMAP_CMAP].with_extremes(bad=HEATMAP_MISSING)
    fig, axes = new_figure(1, 1, width=TEXT_WIDTH, height=min(4.0, 1.4 + 0.09 * len(layers)))
    ax = axes[0, 0]
    shown = np.ma.masked_where(~(np.isfinite(grid) & (grid > 0)), grid)
    image = ax.imshow(shown, norm=norm, cmap=cmap, aspect="auto", interpolation="nearest", origin="upper")
    image.set_gid("e2e_sensitivity")
    ax.grid(False)
    for spine in ax.spines.values():
        spine.set_visible(False)
    step = max(1, int(np.ceil(len(layers) / 15)))
    ax.set_xticks(range(len(cols)), [safe_text(c) for c in cols])
    ax.set_yticks(range(0, len(layers), step), [str(layers[k]) for k in range(0, len(layers), step)])
    ax.tick_params(which="both", length=0)
    ax.set_ylabel("layer quantized alone")
    bar = fig.colorbar(image, ax=ax, location="right", shrink=0.9)
    bar.set_label("next-token KL (nats)")
    colorbar_log_ticks(bar.ax.yaxis, [vmin, vmax])
    bar.outline.set_linewidth(0.4)
    suptitle(fig, f"{title}: one layer's cache quantized at n = {budget}, keys after RoPE")
    return fig


@styled
def e2e_context(positions: pd.DataFrame | None, *, colors: Mapping[str, str] | None = None,
                model: str = "real model") -> Figure:
    """Mean next-token KL against the context a position has read, in long windows: one panel
    per window length, one line per scheme and budget through the position spans of
    :func:`kvasym.real.endtoend_stats.damage_by_position` (x: the span's geometric middle in
    tokens, log; y: the mean KL over the windows, log); bars: the 95% t interval over windows.
    Each line carries ``gid = "scheme=<scheme>@<budget>"``."""
    title = f"Damage against context ({model})"
    needed = {"context", "scheme", "budget", "lo", "hi", "kl_mean", "kl_mean_low", "kl_mean_high"}
    if positions is None or positions.empty or not needed <= set(positions.columns):
        return nothing_to_show(title, "no long-context passes (real.e2e.long_context off)")
    contexts = sorted(int(c) for c in positions["context"].unique())
    colors, markers = palette(positions["scheme"].unique(), colors)
    schemes = scheme_order(positions["scheme"].unique())
    fig, axes = new_figure(1, len(contexts), width=TEXT_WIDTH, height=2.4, sharey=True)
    shown: list[float] = []
    for ax, context in zip(axes[0], contexts):
        frame = positions[positions["context"] == context]
        budgets = sorted(int(b) for b in set(frame["budget"]))
        for scheme in schemes:
            for budget in budgets:
                g = frame[(frame["scheme"] == scheme) & (frame["budget"] == budget)].sort_values("lo")
                if g.empty:
                    continue
                x = np.sqrt(np.maximum(g["lo"].to_numpy(float), 1.0) * g["hi"].to_numpy(float))
                y = g["kl_mean"].to_numpy(float)
                ok = np.isfinite(y) & (y > 0)
                if not ok.any():
                    continue
                low = np.where(np.isfinite(g["kl_mean_low"]), g["kl_mean_low"], y).astype(float)
                high = np.where(np.isfinite(g["kl_mean_high"]), g["kl_mean_high"], y).astype(float)
                low = np.maximum(low, y * 1e-3)
                line = ax.errorbar(x[ok], y[ok], yerr=[y[ok] - low[ok], high[ok] - y[ok]], color=colors[scheme],
                                   marker=markers[scheme], markersize=4, lw=1.2, capsize=2,
                                   ls="-" if budget == budgets[-1] else "--")
                line[0].set_gid(f"scheme={scheme}@{int(budget)}")
                shown.extend(y[ok])
                shown.extend(high[ok][np.isfinite(high[ok])])
        ax.set_xscale("log")
        ax.set_title(safe_text(f"windows of {context} tokens"))
        ax.set_xlabel("tokens of context read")
    if shown:
        for ax in axes[0]:
            log_axis(ax, "y", shown)
    axes[0, 0].set_ylabel("next-token KL (nats)")
    suptitle(fig, f"{title}: every layer's KV cache quantized, keys after RoPE, 95% t intervals over windows")
    figure_legend(fig, scheme_handles(schemes, colors, markers), schemes)
    return fig
