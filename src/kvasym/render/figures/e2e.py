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
    coordinate (payload and side information, mean of K and V), one line per scheme (its
    budgets), one panel per RoPE mode; bars: the 95% t interval over (text, draw) units; log y (points
    whose increase is not positive are left out, and the title says how many)."""
    title = f"End-to-end perplexity increase ({model})"
    needed = {"rope", "scheme", "budget", "bits_per_coordinate", "ppl_ratio", "ppl_ratio_low", "ppl_ratio_high"}
    if summary is None or summary.empty or not needed <= set(summary.columns):
        return nothing_to_show(title, "no end-to-end summary (real rows or real.e2e off)")
    ropes = [r for r in ROPE_TITLES if r in set(summary["rope"])]
    colors, markers = palette(summary["scheme"].unique(), colors)
    schemes = scheme_order(summary["scheme"].unique())
    fig, axes = new_figure(1, len(ropes), width=TEXT_WIDTH, height=2.4,
                           sharey=True)
    hidden = 0
    shown: list[float] = []
    for ax, rope in zip(axes[0], ropes):
        frame = summary[summary["rope"] == rope]
        for scheme in schemes:
            g = frame[frame["scheme"] == scheme].sort_values("bits_per_coordinate")
            x = g["bits_per_coordinate"].to_numpy(dtype=float)
            y = g["ppl_ratio"].to_numpy(dtype=float) - 1.0
            ok = np.isfinite(x) & np.isfinite(y) & (y > 0)
            hidden += int((~ok).sum())
            if not ok.any():
                continue
            low = np.maximum(g["ppl_ratio_low"].to_numpy(dtype=float) - 1.0, y * 1e-3)
            high = g["ppl_ratio_high"].to_numpy(dtype=float) - 1.0
            tag_scheme(ax.errorbar(x[ok], y[ok], yerr=[y[ok] - low[ok], high[ok] - y[ok]], color=colors[scheme],
                                   marker=markers[scheme], markersize=nested_size(schemes, scheme, 5.0, 0.7, 2.5),
                                   lw=nested_size(schemes, scheme, 1.8, 0.4, 0.6), capsize=2,
                                   zorder=3 + 0.1 * schemes.index(scheme)), scheme)
            shown.extend(y[ok])
            # the axis holds the intervals too (log_axis sets its limits from these values);
            # a non-positive lower bound is left to the clipping of the log axis
            raw_low = g["ppl_ratio_low"].to_numpy(dtype=float)[ok] - 1.0
            shown.extend(raw_low[np.isfinite(raw_low) & (raw_low > 0)])
            shown.extend(high[ok][np.isfinite(high[ok])])
        ax.set_title(safe_text(ROPE_TITLES[rope]))
        ax.set_xlabel("measured bits per coordinate (K and V mean)")
    if shown:
        for ax in axes[0]:
            log_axis(ax, "y", shown)
    axes[0, 0].set_ylabel("perplexity increase\n(ppl / ppl_ref - 1)")  # one line ran into the title
    note = f"; {hidden} point(s) with no increase not shown" if hidden else ""
    suptitle(fig, f"{title}: every layer's KV cache quantized, 95% t intervals over (text, draw) units{note}")
    figure_legend(fig, scheme_handles(schemes, colors, markers), schemes)
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
    present = scheme_order(post["scheme"].unique())
    groups = [(g, [s for s in present if pareto_group(s) == g]) for g in PARETO_GROUPS]
    groups = [(g, members) for g, members in groups if members]
    fig, axes = new_figure(len(groups), len(models), width=TEXT_WIDTH, height=0.5 + 1.75 * len(groups),
                           sharex="col", sharey=True)
    shown_y: list[float] = []
    shown_x: dict[str, list[float]] = {m: [] for m in models}

    def draw(ax: object, frame: pd.DataFrame, scheme: str, color: str, marker: str, size: float, width: float,
             zorder: float, reference: bool = False) -> None:
        g = frame[frame["scheme"] == scheme].sort_values("cache_bytes_per_token")
        x = g["cache_bytes_per_token"].to_numpy(dtype=float)
        y = g["kl_mean"].to_numpy(dtype=float)
        ok = np.isfinite(x) & np.isfinite(y) & (y > 0) & (x > 0)
        if not ok.any():
            return
        if reference:
            line = ax.plot(x[ok], y[ok], color="0.55", lw=0.8, ls="--", marker=marker, markersize=2.5,
                           zorder=2)[0]
            line.set_gid(f"reference={scheme}")
            return
        low = np.maximum(g["kl_mean_low"].to_numpy(dtype=float), y * 1e-3)
        high = g["kl_mean_high"].to_numpy(dtype=float)
        tag_scheme(ax.errorbar(x[ok], y[ok], yerr=[y[ok] - low[ok], high[ok] - y[ok]], color=color,
                               marker=marker, markersize=size, lw=width, capsize=2, zorder=zorder), scheme)
        shown_y.extend(y[ok])
        shown_y.extend(high[ok][np.isfinite(high[ok])])

    for row, (group, members) in enumerate(groups):
        row_colors, row_markers = palette(members, None)
        for col, model in enumerate(models):
            ax = axes[row, col]
            frame = post[post["model"] == model]
            fp16 = float(frame["fp16_bytes_per_token"].iloc[0])
            shown_x[model].append(fp16)
            if PARETO_REFERENCE not in members and PARETO_REFERENCE in present:
                draw(ax, frame, PARETO_REFERENCE, "0.55", "D", 2.5, 0.8, 2, reference=True)
            for scheme in members:
                draw(ax, frame, scheme, row_colors[scheme], row_markers[scheme],
                     nested_size(members, scheme, 5.0, 0.5, 2.5), nested_size(members, scheme, 1.8, 0.2, 0.6),
                     3 + 0.1 * members.index(scheme))
                shown_x[model].extend(frame.loc[frame["scheme"] == scheme, "cache_bytes_per_token"].dropna())
            ax.axvline(fp16, color="0.4", lw=0.8, ls=":")
            if row == 0:
                ax.set_title(safe_text(str((names or {}).get(model, model))))
        axes[row, 0].set_ylabel(f"{group}\nmean next-token KL")
        handles = scheme_handles(members, row_colors, row_markers)
        labels = list(members)
        if PARETO_REFERENCE not in members and PARETO_REFERENCE in present:
            handles.append(Line2D([], [], color="0.55", lw=0.8, ls="--", marker="D", markersize=2.5))
            labels.append(f"{PARETO_REFERENCE} (reference)")
        legend = axes[row, -1].legend(handles, [safe_text(s) for s in labels], loc="center left",
                                      bbox_to_anchor=(1.02, 0.5), ncol=1 if len(labels) <= 6 else 2,
                                      handlelength=1.4, columnspacing=0.6)
        legend.set_gid(f"legend={group}")
    # one label under both columns (the legends are at the right; per-panel labels would collide)
    fig.supxlabel(f"cache bytes per token at {int(post['memory_tokens'].iloc[0])} tokens"
                  if "memory_tokens" in post.columns else "cache bytes per token")
    for col, model in enumerate(models):
        log_axis(axes[0, col], "x", shown_x[model])
    if shown_y:
        log_axis(axes[0, 0], "y", shown_y)
    suptitle(fig, f"{title}: every layer's KV cache quantized, keys after RoPE, one row per kind of side information; "
             "95% t intervals over (text, draw) units; dotted: the float16 cache")
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
