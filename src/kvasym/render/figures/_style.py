"""The figures' shared style and drawing helpers (private to :mod:`kvasym.render.figures`).

Every family module draws with what is here, so the look of the paper's figures is set in one
place: the rc parameters (:data:`STYLE`), the widths, the colours and markers, and the helpers
that every figure uses the same way (legends, titles, log axes, scheme tags, row selection).
The names are public within the package (the family modules import them); the module is
private: code outside :mod:`kvasym.render.figures` uses the family modules.

Shared style (:data:`STYLE`): the paper's text width (:data:`TEXT_WIDTH` = 6.5 in; figures are
included at their natural size, so 8 pt in the file is 8 pt on the page), 8 pt text everywhere,
units on every axis, legends outside the axes (figure level, or below a panel) so they never
hide data. Every scheme has one colour and one marker in every figure:
:data:`SCHEME_COLORS` / :data:`SCHEME_MARKERS` fix them for KV, KQV, QKQV and RKV (Okabe-Ito,
colour-blind safe); other (user) schemes take :data:`EXTRA_COLORS` / :data:`EXTRA_MARKERS` in
the order of their sorted names (:func:`scheme_colors`). Artists drawn for a scheme carry
``gid = "scheme=<name>"`` (:func:`tag_scheme`; tests check their colours through it).

Robustness: a figure whose selection is empty (a small grid, a missing scheme) is still
drawn, with a title that says what is missing (:func:`nothing_to_show`), never an exception.
Names from the config or the data are shown literally: ``$`` is escaped for mathtext
(:func:`safe_text`) and legends are built from explicit handles, so a name starting with
``_`` is not dropped.
"""

from __future__ import annotations

import functools
import math
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import matplotlib

matplotlib.use("Agg")  # before pyplot: the figures are files, never windows

import matplotlib.ticker as mticker  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

#: One LaTeX column (inches); figures are drawn at this width unless stated otherwise.
COLUMN_WIDTH = 3.3
#: The paper's full text width (inches: A4 with 22 mm margins); dense grids of panels are drawn
#: at this width so they are included at their natural size, never shrunk below 8 pt text.
TEXT_WIDTH = 6.5
#: Resolution of the PNG files.
PNG_DPI = 200

STYLE: dict[str, Any] = {
    "font.family": "DejaVu Sans",
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "legend.fontsize": 8,
    "legend.title_fontsize": 8,
    "figure.titlesize": 8,
    "figure.labelsize": 8,
    "axes.linewidth": 0.6,
    "axes.grid": True,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "grid.linewidth": 0.4,
    "grid.alpha": 0.5,
    "lines.linewidth": 1.1,
    "lines.markersize": 3.5,
    "xtick.major.width": 0.6,
    "ytick.major.width": 0.6,
    "xtick.major.size": 2.5,
    "ytick.major.size": 2.5,
    "xtick.minor.size": 1.5,
    "ytick.minor.size": 1.5,
    "legend.frameon": False,
    "legend.handlelength": 1.6,
    "legend.columnspacing": 1.0,
    "legend.borderaxespad": 0.2,
    "mathtext.default": "regular",
    "text.usetex": False,
    "pdf.fonttype": 42,  # TrueType in the PDF: editable, and accepted by publishers
    "savefig.dpi": PNG_DPI,
    "figure.constrained_layout.h_pad": 0.03,
    "figure.constrained_layout.w_pad": 0.03,
}

#: Fixed colours of the built-in schemes (Okabe-Ito): the same in every figure.
SCHEME_COLORS: dict[str, str] = {
    "KV": "#D55E00",  # vermillion
    "KQV": "#0072B2",  # blue
    "QKQV": "#E69F00",  # orange
    "RKV": "#009E73",  # bluish green
}
SCHEME_MARKERS: dict[str, str] = {"KV": "o", "KQV": "s", "QKQV": "^", "RKV": "D"}
#: Colours of other schemes, in the order of their sorted names (then cycling).
EXTRA_COLORS: tuple[str, ...] = (
    "#CC79A7",  # reddish purple
    "#56B4E9",  # sky blue
    "#7F7F7F",  # grey
    "#8C564B",  # brown
    "#000000",  # black
    "#BCBD22",  # olive
    "#9467BD",  # purple
    "#17BECF",  # cyan
)
#: One more marker than colours: the pair (colour, marker) of the i-th extra scheme repeats only
#: after 8 x 9 = 72 schemes, where equal lengths would give the 1st and the 9th the same look.
EXTRA_MARKERS: tuple[str, ...] = ("v", "P", "X", "*", "h", "<", ">", "p", "d")
#: Distributions (theory and marginal figures, where colour is not a scheme).
DISTRIBUTION_COLORS: tuple[str, ...] = (
    "#333333", "#1B9E77", "#7570B3", "#E7298A", "#66A61E", "#A6761D", "#E6AB02", "#666666", "#D95F02", "#1F78B4",
)
DISTRIBUTION_MARKERS: tuple[str, ...] = ("o", "s", "^", "v", "D", "P", "X", "*", "h", "<")

METRIC_LABELS: dict[str, str] = {
    "kl_mean": "mean KL(p ‖ p̂) (nats)",
    "kl_p99": "p99 KL(p ‖ p̂) (nats)",
    "kl_median": "median KL(p ‖ p̂) (nats)",
    "k_eps_dir_mean": "key direction error\n" r"$1-\cos\varphi_K$ (mean)",
    "v_eps_dir_mean": "value direction error\n" r"$1-\cos\varphi_V$ (mean)",
    "t_eps_dir_mean": "output direction error\n" r"$1-\cos\varphi_T$ (mean)",
    "recall_mean": "top-5 recall (fraction)",
}

F = TypeVar("F", bound=Callable[..., Figure])


# ----------------------------------------------------------------------------- style helpers


def styled(func: F) -> F:
    """Draw inside :data:`STYLE` (an rc context: the caller's settings are left untouched)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Figure:
        with matplotlib.rc_context(STYLE):
            return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def safe_text(value: Any) -> str:
    """A config/data name as literal text: ``$`` escaped so mathtext never parses it."""
    return str(value).replace("$", r"\$")


def scheme_order(names: Iterable[str]) -> list[str]:
    """Built-in schemes in their fixed order (KV, KQV, QKQV, RKV), then the others sorted."""
    names = {str(n) for n in names}
    return [s for s in SCHEME_COLORS if s in names] + sorted(names - set(SCHEME_COLORS))


def scheme_colors(names: Iterable[str]) -> dict[str, str]:
    """Colour of each scheme: fixed for the built-ins, palette by sorted name for the others.

    Pass the study's whole scheme list (as :mod:`kvasym.render.figures.registry` does) so that a user
    scheme keeps its colour in a figure where another user scheme is absent.
    """
    names = {str(n) for n in names}
    out = {s: c for s, c in SCHEME_COLORS.items() if s in names}
    for i, name in enumerate(sorted(names - set(SCHEME_COLORS))):
        out[name] = EXTRA_COLORS[i % len(EXTRA_COLORS)]
    return out


def scheme_markers(names: Iterable[str]) -> dict[str, str]:
    """Marker of each scheme: fixed for the built-ins, by sorted name for the others (as
    :func:`scheme_colors`)."""
    names = {str(n) for n in names}
    out = {s: m for s, m in SCHEME_MARKERS.items() if s in names}
    for i, name in enumerate(sorted(names - set(SCHEME_MARKERS))):
        out[name] = EXTRA_MARKERS[i % len(EXTRA_MARKERS)]
    return out


def palette(frame_schemes: Iterable[str], colors: Mapping[str, str] | None) -> tuple[dict[str, str], dict[str, str]]:
    """Colours (given ones win; missing schemes are filled deterministically) and markers."""
    names = set(map(str, frame_schemes)) | set(colors or {})
    filled = scheme_colors(names)
    filled.update(colors or {})
    return filled, scheme_markers(names)


def new_figure(nrows: int = 1, ncols: int = 1, *, width: float = TEXT_WIDTH, height: float | None = None,
               row_height: float = 1.3, extra: float = 0.55, sharex: Any = False,
               sharey: Any = False) -> tuple[Figure, np.ndarray]:
    """A constrained-layout figure with an (nrows, ncols) array of axes (never squeezed)."""
    fig = Figure(figsize=(width, height if height is not None else row_height * nrows + extra), layout="constrained")
    axes = fig.subplots(nrows, ncols, sharex=sharex, sharey=sharey, squeeze=False)
    return fig, axes


def nothing_to_show(title: str, reason: str, *, width: float = TEXT_WIDTH) -> Figure:
    """A placeholder figure: the title says there is nothing to show, the body says why."""
    with matplotlib.rc_context(STYLE):
        fig = Figure(figsize=(width, 1.3), layout="constrained")
        ax = fig.add_subplot()
        ax.set_axis_off()
        ax.text(0.5, 0.5, textwrap.fill(safe_text(reason), 60), ha="center", va="center", transform=ax.transAxes)
        suptitle(fig, (f"{title}: nothing to show"))
    return fig


def scheme_handles(schemes: Sequence[str], colors: Mapping[str, str], markers: Mapping[str, str], *,
                   line: bool = True) -> list[Line2D]:
    """Legend handles of ``schemes``: a line with its marker each, or (``line=False``) the marker
    alone, edged in black as the scatter medians are."""
    return [
        Line2D([], [], color=colors[s], marker=markers[s], linestyle="-" if line else "none",
               markersize=4, markeredgecolor="black" if not line else colors[s],
               markeredgewidth=0.4 if not line else 0.0)
        for s in schemes
    ]


def figure_legend(fig: Figure, handles: Sequence[Any], labels: Sequence[str], *, ncol: int | None = None,
                   loc: str = "outside lower center") -> None:
    """A figure-level legend outside every axes (constrained layout makes room for it)."""
    if not handles:
        return
    ncol = ncol or min(len(handles), 4)
    legend = fig.legend(row_major(list(handles), ncol), row_major([safe_text(label) for label in labels], ncol),
                        loc=loc, ncol=ncol, frameon=False)
    legend.set_gid(ROW_MAJOR_GID)  # the caption reads its entries back in the order given (row by row)


def suptitle(fig: Figure, text: str) -> None:
    """A figure title wrapped to the figure's width (names escaped)."""
    chars = max(30, int(fig.get_figwidth() * 17))
    fig.suptitle(textwrap.fill(safe_text(text), chars))


def nested_size(schemes: Sequence[str], scheme: str, largest: float, step: float, smallest: float) -> float:
    """Marker size / line width shrinking along the scheme order, so schemes whose points
    coincide (KQV and RKV share their K side: identical key errors) show as nested markers or
    a thin line inside a thick one instead of hiding each other."""
    return max(largest - step * schemes.index(scheme), smallest)


def tag_scheme(artist: Any, scheme: str) -> Any:
    """Mark an artist as drawn for ``scheme`` (tests check its colour through the gid)."""
    if isinstance(artist, (list, tuple)):
        for a in artist:
            tag_scheme(a, scheme)
    elif hasattr(artist, "lines") and hasattr(artist, "has_xerr"):  # ErrorbarContainer
        data_line, caplines, barlines = artist.lines
        for a in [data_line, *caplines, *barlines]:
            if a is not None:
                tag_scheme(a, scheme)
    elif artist is not None:
        artist.set_gid(f"scheme={scheme}")
    return artist


def select_rows(frame: pd.DataFrame | None, **conditions: Any) -> pd.DataFrame:
    """Rows where every condition holds (:func:`kvasym.cells.select_cells`; floats compared with
    isclose, None = any), empty when nothing matches: a figure draws an empty panel and says so."""
    from ...cells import select_cells

    if frame is None or frame.empty:
        return frame.iloc[0:0] if frame is not None else pd.DataFrame()
    return select_cells(frame, "figure input", required=False, **conditions)


def choose_value(frame: pd.DataFrame, column: str, value: Any) -> tuple[Any, str]:
    """``value`` or, if None, the first (smallest) value present; the note says which."""
    if value is not None:
        return value, ""
    if frame is None or frame.empty or column not in frame.columns:
        return None, ""
    values = sorted(pd.unique(frame[column].dropna()))
    if not values:
        return None, ""
    note = f" (first of {len(values)})" if len(values) > 1 else ""
    chosen = values[0]
    return (chosen.item() if isinstance(chosen, np.generic) else chosen), note


def present_values(frame: pd.DataFrame, column: str, wanted: Sequence[Any] | None) -> list[Any]:
    """``wanted`` restricted to the values present (order kept), or all present values sorted."""
    if frame is None or frame.empty or column not in frame.columns:
        return []
    present = list(pd.unique(frame[column]))
    if wanted is None:
        return sorted(present)
    present_set = set(present)
    return [w for w in wanted if w in present_set]


def short_number(x: float) -> str:
    """``x`` in its shortest form (``%g``): ticks and titles of sharpness, nu and rank values."""
    return f"{x:g}"


#: ``gid`` of a row title drawn in a panel's right margin.
MARGIN_TITLE_GID = "margin-title"


def margin_title(ax: Any, text: str) -> None:
    """A row title on the right of a panel (as seaborn's margin titles)."""
    note = ax.annotate(safe_text(text), xy=(1.03, 0.5), xycoords="axes fraction", rotation=-90, ha="left",
                       va="center", fontsize=STYLE["axes.titlesize"])
    note.set_gid(MARGIN_TITLE_GID)  # the caption lists it as a panel title (kvasym.render.figures.captions)


BUDGET_LABEL = "budget n (bits)"


def tick_label(value: float, _pos: Any = None) -> str:
    """Tick text of a log axis: plain decimals in 1e-3..1e4, else 1e-5 style."""
    if value <= 0 or not np.isfinite(value):
        return ""
    if 1e-3 <= value < 1e4:
        return f"{value:.6g}"
    exponent = int(math.floor(math.log10(value) + 1e-9))
    mantissa = value / 10**exponent
    return f"1e{exponent}" if abs(mantissa - 1) < 1e-6 else f"{mantissa:.2g}e{exponent}"


def log_axis(ax: Any, which: str = "y", values: Iterable[float] = ()) -> None:
    """Log scale with readable ticks whose labelled range holds every value: 1-2-5 ticks within
    about a decade, 1-3 within two, else decades (at most :data:`MAX_LOG_LABELS` labels, every
    k-th decade beyond that), and the axis limits at the labelled ticks just outside the values
    (:func:`log_ticks`), so no plotted value lies beyond the last label (issue 15: a key
    quantity below the lowest tick). No minor tick labels (narrow panels would print
    2x10^-2, 3x10^-2, ... over each other). Without positive values: the ticks alone."""
    (ax.set_yscale if which == "y" else ax.set_xscale)("log")
    axis = ax.yaxis if which == "y" else ax.xaxis
    ticks = log_ticks(values)
    if not ticks:
        colorbar_log_ticks(axis, values)
        return
    axis.set_major_locator(mticker.FixedLocator(ticks))
    axis.set_major_formatter(mticker.FuncFormatter(tick_label))
    axis.set_minor_formatter(mticker.NullFormatter())
    stride = math.log10(ticks[1] / ticks[0]) if len(ticks) > 1 else 1.0
    if stride > 1.5:  # decades left unlabelled get a minor tick each
        lo, hi = (round(math.log10(t)) for t in (ticks[0], ticks[-1]))
        axis.set_minor_locator(mticker.FixedLocator([10.0**e for e in range(lo, hi + 1)]))
    # a hair beyond the end ticks, so markers on them are not cut in half
    pad = 10 ** (0.02 * math.log10(ticks[-1] / ticks[0]))
    (ax.set_ylim if which == "y" else ax.set_xlim)(ticks[0] / pad, ticks[-1] * pad)


#: At most this many labelled ticks on a log axis (narrow panels overprint more).
MAX_LOG_LABELS = 5


def log_ticks(values: Iterable[float]) -> list[float]:
    """The labelled ticks of a log axis showing ``values`` (their finite positive part): from
    the largest tick at or below the smallest value to the smallest tick at or above the
    largest, on 1-2-5 steps within about a decade, 1-3 steps within two, else on every k-th
    decade with k the smallest stride giving at most :data:`MAX_LOG_LABELS` ticks. Empty
    without a finite positive value."""
    v = np.asarray(list(values), dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    if not v.size:
        return []
    lo, hi = float(v.min()), float(v.max())
    if hi <= lo * (1 + 1e-9):  # one value: a decade around it
        lo, hi = lo / 3, hi * 3
    span = math.log10(hi / lo)
    if span < 2:
        subs = (1.0, 2.0, 5.0) if span < 1.2 else (1.0, 3.0)
        e_lo, e_hi = math.floor(math.log10(lo) + 1e-9), math.ceil(math.log10(hi) - 1e-9)
        grid = [float(f"{m:g}e{e}") for e in range(e_lo, e_hi + 1) for m in subs]  # exact decimals
        below = [t for t in grid if t <= lo * (1 + 1e-9)]
        above = [t for t in grid if t >= hi * (1 - 1e-9)]
        start, stop = (below[-1] if below else grid[0]), (above[0] if above else grid[-1])
        return [t for t in grid if start <= t <= stop]
    e_lo, e_hi = math.floor(math.log10(lo) + 1e-9), math.ceil(math.log10(hi) - 1e-9)
    stride = max(1, math.ceil((e_hi - e_lo) / (MAX_LOG_LABELS - 1)))
    count = math.ceil((e_hi - e_lo) / stride)
    return [float(f"1e{e_lo + k * stride}") for k in range(count + 1)]


def colorbar_log_ticks(axis: Any, values: Iterable[float] = ()) -> None:
    """Readable log ticks on an axis that is already logarithmic and whose limits are set
    elsewhere (a colour bar's): 1-2-5 ticks within about a decade, decades otherwise."""
    v = np.asarray(list(values), dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    decades = math.log10(v.max() / v.min()) if v.size else 10.0
    subs = (1.0, 2.0, 5.0) if decades < 1.2 else (1.0, 3.0) if decades < 2 else (1.0,)
    numticks = 3 if decades >= 2.5 else 8  # several decades in a narrow bar: 3 labels
    axis.set_major_locator(mticker.LogLocator(base=10, subs=subs, numticks=numticks))
    axis.set_major_formatter(mticker.FuncFormatter(tick_label))
    axis.set_minor_formatter(mticker.NullFormatter())


#: ``gid`` of a figure legend whose entries :func:`row_major` reordered.
ROW_MAJOR_GID = "legend-row-major"


def row_major(items: Sequence[Any], ncol: int) -> list[Any]:
    """Reorder legend entries so that matplotlib's column-major filling reads row by row."""
    return [items[k] for k in row_major_order(len(items), ncol)]


def row_major_order(n: int, ncol: int) -> list[int]:
    """The positions :func:`row_major` takes the entries from: entry ``i`` of the reordered
    legend is entry ``row_major_order(n, ncol)[i]`` of the list given."""
    return [k for c in range(ncol) for k in range(c, n, ncol)]


def bottom_xlabel(axes: np.ndarray, text: str) -> None:
    """The x label on the bottom panel of each column (a figure-level supxlabel would collide
    with the legend below the axes)."""
    for ax in axes[-1, :]:
        if ax.axison:
            ax.set_xlabel(text)


def line_panel(ax: Any, frame: pd.DataFrame, x: str, y: str, schemes: Sequence[str], colors: Mapping[str, str],
                markers: Mapping[str, str], *, log_y: bool = True) -> int:
    """Lines of ``y`` against ``x``, one per scheme; returns the number of lines drawn."""
    drawn, shown = 0, []
    for scheme in schemes:
        g = frame[frame["scheme"] == scheme].sort_values(x)
        xs, ys = g[x].to_numpy(dtype=float), g[y].to_numpy(dtype=float)
        ok = np.isfinite(xs) & np.isfinite(ys) & ((ys > 0) if log_y else True)
        if not ok.any():
            continue
        tag_scheme(ax.plot(xs[ok], ys[ok], marker=markers[scheme], color=colors[scheme],
                           markersize=nested_size(schemes, scheme, 5.0, 0.7, 2.5),
                           lw=nested_size(schemes, scheme, 2.0, 0.45, 0.6), zorder=3 + 0.1 * schemes.index(scheme)),
                   scheme)
        shown.extend(ys[ok])
        drawn += 1
    if log_y and drawn:
        log_axis(ax, "y", shown)
    return drawn


#: Colour map of the heat maps: sequential and colour-blind safe; cells without a finite
#: positive value (absent, KL = 0 or infinite) are drawn in :data:`HEATMAP_MISSING`.
HEATMAP_CMAP = "viridis"
HEATMAP_MISSING = "0.85"
