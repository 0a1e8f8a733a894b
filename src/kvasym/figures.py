"""The paper's figures, drawn from the gathered tables (one small function per figure).

Every function takes DataFrames with the columns of the pipeline's tables
(``results/metrics/{per_query,per_key}``, ``results/stats/summary.parquet``,
``results/theory/theory.parquet``, ``results/stats/comparisons.parquet``) and returns a
:class:`matplotlib.figure.Figure`; :func:`save_figure` writes ``stem.pdf`` and ``stem.png``
atomically and closes it. :mod:`kvasym.stages.figure` draws them all for the DAG.

Shared style (:data:`STYLE`): the paper's text width (:data:`TEXT_WIDTH` = 6.5 in; figures are
included at their natural size, so 8 pt in the file is 8 pt on the page), 8 pt text everywhere,
units on every axis, legends outside the axes (figure level, or below a panel) so they never
hide data. Every scheme has one colour and one marker in every figure:
:data:`SCHEME_COLORS` / :data:`SCHEME_MARKERS` fix them for KV, KQV, QKQV and RKV (Okabe-Ito,
colour-blind safe); other (user) schemes take :data:`EXTRA_COLORS` / :data:`EXTRA_MARKERS` in
the order of their sorted names (:func:`scheme_colors`). Artists drawn for a scheme carry
``gid = "scheme=<name>"`` (tests check their colours through it).

Robustness: a figure whose selection is empty (a small grid, a missing scheme) is still
drawn, with a title that says what is missing (:func:`nothing_to_show`), never an exception.
Names from the config or the data are shown literally: ``$`` is escaped for mathtext
(:func:`safe_text`) and legends are built from explicit handles, so a name starting with
``_`` is not dropped.

Angles are shown in degrees; KL in nats; Shannon effective bits are ``0.5 log2 SNR`` in bits.
"""

from __future__ import annotations

import functools
import json
import math
import os
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import matplotlib

matplotlib.use("Agg")  # before pyplot: the figures are files, never windows

import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker as mticker  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from .atomic import atomic_target  # noqa: E402
from .render.format import sig, sig_text  # noqa: E402
from .seeds import rng  # noqa: E402

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
EXTRA_MARKERS: tuple[str, ...] = ("v", "P", "X", "*", "h", "<", ">", "p")
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
SITE_NAMES = {"k": "K (key cache)", "v": "V (value cache)", "t": "T (attention output)"}

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

    Pass the study's whole scheme list (as :mod:`kvasym.stages.figure` does) so that a user
    scheme keeps its colour in a figure where another user scheme is absent.
    """
    names = {str(n) for n in names}
    out = {s: c for s, c in SCHEME_COLORS.items() if s in names}
    for i, name in enumerate(sorted(names - set(SCHEME_COLORS))):
        out[name] = EXTRA_COLORS[i % len(EXTRA_COLORS)]
    return out


def scheme_markers(names: Iterable[str]) -> dict[str, str]:
    names = {str(n) for n in names}
    out = {s: m for s, m in SCHEME_MARKERS.items() if s in names}
    for i, name in enumerate(sorted(names - set(SCHEME_MARKERS))):
        out[name] = EXTRA_MARKERS[i % len(EXTRA_MARKERS)]
    return out


def _palette(frame_schemes: Iterable[str], colors: Mapping[str, str] | None) -> tuple[dict[str, str], dict[str, str]]:
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
        _suptitle(fig, (f"{title}: nothing to show"))
    return fig


def _scheme_handles(schemes: Sequence[str], colors: Mapping[str, str], markers: Mapping[str, str], *,
                    line: bool = True) -> list[Line2D]:
    return [
        Line2D([], [], color=colors[s], marker=markers[s], linestyle="-" if line else "none",
               markersize=4, markeredgecolor="black" if not line else colors[s],
               markeredgewidth=0.4 if not line else 0.0)
        for s in schemes
    ]


def _figure_legend(fig: Figure, handles: Sequence[Any], labels: Sequence[str], *, ncol: int | None = None,
                   loc: str = "outside lower center") -> None:
    """A figure-level legend outside every axes (constrained layout makes room for it)."""
    if not handles:
        return
    ncol = ncol or min(len(handles), 4)
    legend = fig.legend(_row_major(list(handles), ncol), _row_major([safe_text(label) for label in labels], ncol),
                        loc=loc, ncol=ncol, frameon=False)
    legend.set_gid(ROW_MAJOR_GID)  # the caption reads its entries back in the order given (row by row)


def _suptitle(fig: Figure, text: str) -> None:
    """A figure title wrapped to the figure's width (names escaped)."""
    chars = max(30, int(fig.get_figwidth() * 17))
    fig.suptitle(textwrap.fill(safe_text(text), chars))


def _nested(schemes: Sequence[str], scheme: str, largest: float, step: float, smallest: float) -> float:
    """Marker size / line width shrinking along the scheme order, so schemes whose points
    coincide (KQV and RKV share their K side: identical key errors) show as nested markers or
    a thin line inside a thick one instead of hiding each other."""
    return max(largest - step * schemes.index(scheme), smallest)


def _tag(artist: Any, scheme: str) -> Any:
    """Mark an artist as drawn for ``scheme`` (tests check its colour through the gid)."""
    if isinstance(artist, (list, tuple)):
        for a in artist:
            _tag(a, scheme)
    elif hasattr(artist, "lines") and hasattr(artist, "has_xerr"):  # ErrorbarContainer
        data_line, caplines, barlines = artist.lines
        for a in [data_line, *caplines, *barlines]:
            if a is not None:
                _tag(a, scheme)
    elif artist is not None:
        artist.set_gid(f"scheme={scheme}")
    return artist


def _select(frame: pd.DataFrame | None, **conditions: Any) -> pd.DataFrame:
    """Rows where every condition holds (:func:`kvasym.cells.select_cells`; floats compared with
    isclose, None = any), empty when nothing matches: a figure draws an empty panel and says so."""
    from .cells import select_cells

    if frame is None or frame.empty:
        return frame.iloc[0:0] if frame is not None else pd.DataFrame()
    return select_cells(frame, "figure input", required=False, **conditions)


def _choose(frame: pd.DataFrame, column: str, value: Any) -> tuple[Any, str]:
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


def _present(frame: pd.DataFrame, column: str, wanted: Sequence[Any] | None) -> list[Any]:
    """``wanted`` restricted to the values present (order kept), or all present values sorted."""
    if frame is None or frame.empty or column not in frame.columns:
        return []
    present = list(pd.unique(frame[column]))
    if wanted is None:
        return sorted(present)
    present_set = set(present)
    return [w for w in wanted if w in present_set]


def _fmt(x: float) -> str:
    return f"{x:g}"


#: ``gid`` of a row title drawn in a panel's right margin.
MARGIN_TITLE_GID = "margin-title"


def _margin_title(ax: Any, text: str) -> None:
    """A row title on the right of a panel (as seaborn's margin titles)."""
    note = ax.annotate(safe_text(text), xy=(1.03, 0.5), xycoords="axes fraction", rotation=-90, ha="left",
                       va="center", fontsize=STYLE["axes.titlesize"])
    note.set_gid(MARGIN_TITLE_GID)  # the caption lists it as a panel title (kvasym.figure_captions)


BUDGET_LABEL = "budget n (bits)"


def _number(value: float, _pos: Any = None) -> str:
    """Tick text of a log axis: plain decimals in 1e-3..1e4, else 1e-5 style."""
    if value <= 0 or not np.isfinite(value):
        return ""
    if 1e-3 <= value < 1e4:
        return f"{value:.6g}"
    exponent = int(math.floor(math.log10(value) + 1e-9))
    mantissa = value / 10**exponent
    return f"1e{exponent}" if abs(mantissa - 1) < 1e-6 else f"{mantissa:.2g}e{exponent}"


def _log_axis(ax: Any, which: str = "y", values: Iterable[float] = ()) -> None:
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
        _log_ticks(axis, values)
        return
    axis.set_major_locator(mticker.FixedLocator(ticks))
    axis.set_major_formatter(mticker.FuncFormatter(_number))
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


def _log_ticks(axis: Any, values: Iterable[float] = ()) -> None:
    """Readable log ticks on an axis that is already logarithmic and whose limits are set
    elsewhere (a colour bar's): 1-2-5 ticks within about a decade, decades otherwise."""
    v = np.asarray(list(values), dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    decades = math.log10(v.max() / v.min()) if v.size else 10.0
    subs = (1.0, 2.0, 5.0) if decades < 1.2 else (1.0, 3.0) if decades < 2 else (1.0,)
    numticks = 3 if decades >= 2.5 else 8  # several decades in a narrow bar: 3 labels
    axis.set_major_locator(mticker.LogLocator(base=10, subs=subs, numticks=numticks))
    axis.set_major_formatter(mticker.FuncFormatter(_number))
    axis.set_minor_formatter(mticker.NullFormatter())


#: ``gid`` of a figure legend whose entries :func:`_row_major` reordered.
ROW_MAJOR_GID = "legend-row-major"


def _row_major(items: Sequence[Any], ncol: int) -> list[Any]:
    """Reorder legend entries so that matplotlib's column-major filling reads row by row."""
    return [items[k] for k in row_major_order(len(items), ncol)]


def row_major_order(n: int, ncol: int) -> list[int]:
    """The positions :func:`_row_major` takes the entries from: entry ``i`` of the reordered
    legend is entry ``row_major_order(n, ncol)[i]`` of the list given."""
    return [k for c in range(ncol) for k in range(c, n, ncol)]


def _bottom_xlabel(axes: np.ndarray, text: str) -> None:
    """The x label on the bottom panel of each column (a figure-level supxlabel would collide
    with the legend below the axes)."""
    for ax in axes[-1, :]:
        if ax.axison:
            ax.set_xlabel(text)


#: The ECDF figure's floor (nats): a per-query KL below it is drawn at it. By Pinsker's
#: inequality such a query's attention moves by a total variation of at most
#: sqrt(1e-4 / 2) = 0.7%: at the floor, quantization has left attention unchanged for a reader.
KL_FLOOR = 1e-4


def _share(count: int, total: int) -> str:
    """``count`` of ``total`` as a percentage, two significant digits ("<0.01%" below that; never
    "100%" for a count short of the total)."""
    pct = 100.0 * count / total
    if pct < 0.01:
        return "<0.01%"
    text = f"{pct:.2g}" if pct < 99.5 else f"{pct:.3g}"
    return "99.9%" if count < total and float(text) >= 100 else f"{text}%"


# ----------------------------------------------------------------------------- saving


def save_figure(fig: Figure, stem: str | os.PathLike, provenance: Mapping[str, str] | None = None) -> list[Path]:
    """Write ``stem.pdf`` and ``stem.png`` (PNG at :data:`PNG_DPI`), each via a temporary file
    and a rename (no half-written figure under its final name), then close the figure.

    ``provenance`` (e.g. :func:`kvasym.dataset.provenance`: package version, git commit, the
    config slice with its seed) goes into the files' metadata: the PDF's ``Subject`` (as JSON)
    and ``Creator``, one PNG text chunk per key. The PDF carries no creation date, so the same
    figure gives the same bytes on a rerun.
    """
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    info = {str(k): str(v) for k, v in (provenance or {}).items()}
    pdf_meta: dict[str, Any] = {"CreationDate": None}
    if info:
        pdf_meta["Creator"] = f"kvasym {info.get('kvasym_version', '')}".strip()
        pdf_meta["Subject"] = json.dumps(info, sort_keys=True)
    written: list[Path] = []
    try:
        with matplotlib.rc_context(STYLE):
            for fmt, extra in (("pdf", {"metadata": pdf_meta}),
                               ("png", {"dpi": PNG_DPI, "metadata": {"Software": None, **info}})):
                target = stem.with_name(f"{stem.name}.{fmt}")
                with atomic_target(target) as tmp:
                    fig.savefig(tmp, format=fmt, **extra)
                written.append(target)
    finally:
        plt.close(fig)  # no-op for a figure pyplot does not manage
        fig.clear()
    return written


# ----------------------------------------------------------------------------- figures


@styled
def shannon_phi_plane(
    per_query: pd.DataFrame,
    site: str,
    *,
    sharpness: float | None = None,
    dim: int | None = None,
    distributions: Sequence[str] | None = None,
    budgets: Sequence[int] | None = None,
    colors: Mapping[str, str] | None = None,
    max_points: int = 300,
    seed: int = 0,
    density_points: int | None = None,
) -> Figure:
    """Scale error (Shannon effective bits) against direction error phi (degrees) at ``site``.

    Rows: distributions; columns: budgets; one sharpness and one dim. Per scheme and panel: the
    median with its interquartile range as a cross, over either its points (a light random
    subsample of at most ``max_points``, seeded by the panel's identity) or, with more than
    ``density_points`` points (default :data:`DENSITY_POINTS`), the contours of their density
    around the regions holding :data:`DENSITY_MASSES` of them (:func:`_density_contours`): a
    scatter of thousands of queries hides every scheme but the last drawn. The K and V errors
    are per-trial aggregates (repeated on each query row), so for those sites each point is one
    trial, and the rows are low.
    """
    density_points = DENSITY_POINTS if density_points is None else int(density_points)
    if site not in SITE_NAMES:
        raise ValueError(f"site must be one of {', '.join(SITE_NAMES)}, got {site!r}")
    title = f"Shannon–φ plane at {SITE_NAMES[site]}"
    x_col, y_col = f"{site}_phi", f"{site}_eff_bits"
    dim, dim_note = _choose(per_query, "dim", dim)
    frame = _select(per_query, dim=dim)
    sharpness, s_note = _choose(frame, "sharpness", sharpness)
    frame = _select(frame, sharpness=None if sharpness is None else float(sharpness))
    rows = _present(frame, "distribution", distributions)
    cols = _present(frame, "budget", budgets)
    if frame.empty or not rows or not cols or x_col not in frame.columns:
        return nothing_to_show(title, f"no per-query rows for d = {dim}, sharpness = {sharpness}, "
                                      f"distributions {list(distributions) if distributions else 'any'}")
    colors, markers = _palette(frame["scheme"].unique(), colors)
    schemes = scheme_order(frame["scheme"].unique())
    # a page-wide grid: at column width the panels of a 3-budget grid were 1 inch wide
    wide = len(cols) > 1
    per_trial = site in ("k", "v")
    # the K and V planes show a few tight clusters of trials: low rows, so each figure takes
    # part of a page instead of a whole one (issue 15)
    row_height = (1.0 if per_trial else 1.4) if wide else 1.6
    fig, axes = new_figure(len(rows), len(cols), width=TEXT_WIDTH, row_height=row_height, extra=0.75,
                           sharex="row", sharey="row")
    densities = 0
    for i, dist in enumerate(rows):
        for j, budget in enumerate(cols):
            ax = axes[i, j]
            cell = _select(frame, distribution=dist, budget=budget)
            for scheme in schemes:
                g = cell[cell["scheme"] == scheme]
                if per_trial:
                    g = g.drop_duplicates(["trial"])
                x = np.degrees(g[x_col].to_numpy(dtype=float))
                y = g[y_col].to_numpy(dtype=float)
                ok = np.isfinite(x) & np.isfinite(y)
                x, y = x[ok], y[ok]
                if x.size == 0:
                    continue
                if x.size > density_points:
                    # thousands of queries overplot each other: the density's contours instead
                    if _tag(_density_contours(ax, x, y, colors[scheme]), scheme) is not None:
                        densities += 1
                else:
                    if x.size > max_points:
                        pick = rng(seed, "figure", "shannon_phi", site, str(dist), int(budget), scheme).choice(
                            x.size, max_points, replace=False)
                        xs, ys = x[pick], y[pick]
                    else:
                        xs, ys = x, y
                    _tag(ax.scatter(xs, ys, s=4 if wide else 2.5, color=colors[scheme], alpha=0.3, linewidths=0,
                                    rasterized=True, zorder=2), scheme)
                qx, qy = np.percentile(x, [25, 50, 75]), np.percentile(y, [25, 50, 75])
                # later schemes get smaller markers, so coinciding medians (e.g. KQV and RKV share
                # their K side) stay visible as nested markers
                size = _nested(schemes, scheme, 7.0 if wide else 5.5, 1.0 if wide else 0.8, 3.0 if wide else 2.5)
                _tag(ax.errorbar(qx[1], qy[1], xerr=[[qx[1] - qx[0]], [qx[2] - qx[1]]],
                                 yerr=[[qy[1] - qy[0]], [qy[2] - qy[1]]], fmt=markers[scheme], color=colors[scheme],
                                 markeredgecolor="black", markeredgewidth=0.4, markersize=size, elinewidth=1.0,
                                 capsize=0, zorder=4 + 0.1 * schemes.index(scheme)), scheme)
            if i == 0:
                ax.set_title(f"n = {budget} bits")
            if j == len(cols) - 1:
                _margin_title(ax, str(dist))
            ax.tick_params(labelbottom=True)
            ax.margins(0.08, 0.14)  # room for the large median markers at the edges of the low rows
    S = site.upper()
    _bottom_xlabel(axes, rf"direction error $\varphi_{S}$ (degrees)")
    fig.supylabel(rf"Shannon effective bits $0.5\,\log_2\,\mathrm{{SNR}}_{S}$ (bits)")
    note = "points: trials" if per_trial else "points: queries"
    if densities:
        masses = " and ".join(f"{m:.0%}" for m in DENSITY_MASSES)
        note = (f"contours: the densest regions holding {masses} of a scheme's queries "
                f"(above {density_points} per panel; fewer: points)")
    _suptitle(fig, (f"{title}: d = {dim}{dim_note}, sharpness {_fmt(float(sharpness))}{s_note}; "
                           f"{note}; cross: median and IQR"))
    _figure_legend(fig, _scheme_handles(schemes, colors, markers, line=False), schemes)
    return fig


#: Above this many points of one scheme in one panel, the Shannon-phi plane draws their
#: density's contours instead of the points.
DENSITY_POINTS = 200
#: The contours enclose the densest regions holding these fractions of the points.
DENSITY_MASSES = (0.5, 0.9)


def density_levels(x: np.ndarray, y: np.ndarray, masses: Sequence[float] = DENSITY_MASSES, *, bins: int = 40,
                   smooth: float = 1.5) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[float]]:
    """A smoothed 2-D histogram of the points (``bins`` per axis over their central 99% range
    padded by 15%, a Gaussian kernel of ``smooth`` bins; the few extreme points left out would
    otherwise set the panel's range) and, per mass in ``masses``, the density level whose
    super-level set holds that fraction of all the points (the highest-density region):
    ``(x_centres, y_centres, density[y, x], levels)`` with the levels in the order of ``masses``."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ranges = []
    for v in (x, y):
        lo, hi = (float(q) for q in np.percentile(v, [0.5, 99.5]))
        pad = 0.15 * (hi - lo) if hi > lo else max(abs(lo), 1.0) * 0.05
        ranges.append((lo - pad, hi + pad))
    hist, xe, ye = np.histogram2d(x, y, bins=bins, range=ranges)
    radius = max(1, int(math.ceil(3 * smooth)))
    kernel = np.exp(-0.5 * (np.arange(-radius, radius + 1) / smooth) ** 2)
    kernel /= kernel.sum()
    for axis in (0, 1):
        hist = np.apply_along_axis(lambda r: np.convolve(r, kernel, mode="same"), axis, hist)
    density = hist / x.size  # a fraction of every point, those outside the range included
    ordered = np.sort(density.ravel())[::-1]
    cumulative = np.cumsum(ordered)
    levels = [float(ordered[min(int(np.searchsorted(cumulative, m)), ordered.size - 1)]) for m in masses]
    return (xe[:-1] + xe[1:]) / 2, (ye[:-1] + ye[1:]) / 2, density.T, levels


def _density_contours(ax: Any, x: np.ndarray, y: np.ndarray, color: str) -> Any:
    """The contours of :func:`density_levels` (the larger mass thinner), or None when the points
    have no spread to draw a density of."""
    if np.ptp(x) == 0 and np.ptp(y) == 0:
        return None
    xc, yc, density, levels = density_levels(x, y)
    order = np.argsort(levels)  # contour needs increasing levels: the largest mass has the lowest
    unique = np.unique(np.asarray(levels)[order])
    if unique.size < len(levels) or unique[0] <= 0:
        return None
    widths = [0.6 + 0.6 * (1 - DENSITY_MASSES[k]) / (1 - min(DENSITY_MASSES)) for k in order]
    return ax.contour(xc, yc, density, levels=list(unique), colors=[color], linewidths=widths, zorder=2)


@styled
def kl_ecdf(
    per_query: pd.DataFrame,
    *,
    sharpness: float | None = None,
    dim: int | None = None,
    distributions: Sequence[str] | None = None,
    budgets: Sequence[int] | None = None,
    colors: Mapping[str, str] | None = None,
    floor: float | None = None,
) -> Figure:
    """Empirical CDF of per-query KL (log x) per scheme, rows = distributions, columns =
    budgets, with each scheme's mean (dashed) and 99th percentile (dotted) as vertical lines.
    A KL below ``floor`` nats (default :data:`KL_FLOOR`; KL = 0, exact attention, included) is
    drawn at the floor, so the axis spans the decades where KL matters (heavy tails reach
    1e-27), and the title says how many queries of which rows lie below it. An infinite KL
    counts in the CDF but cannot be drawn (the curve stays below 1)."""
    title = "ECDF of per-query KL"
    dim, dim_note = _choose(per_query, "dim", dim)
    frame = _select(per_query, dim=dim)
    sharpness, s_note = _choose(frame, "sharpness", sharpness)
    frame = _select(frame, sharpness=None if sharpness is None else float(sharpness))
    rows = _present(frame, "distribution", distributions)
    cols = _present(frame, "budget", budgets)
    if frame.empty or not rows or not cols:
        return nothing_to_show(title, f"no per-query rows for d = {dim}, sharpness = {sharpness}")
    colors, markers = _palette(frame["scheme"].unique(), colors)
    schemes = scheme_order(frame["scheme"].unique())
    fig, axes = new_figure(len(rows), len(cols), row_height=1.2 if len(cols) > 1 else 1.5, extra=0.85,
                           sharex="row", sharey=True)
    floor = KL_FLOOR if floor is None else float(floor)
    below: list[str] = []  # "<share> of <row>'s queries", rows with any KL under the floor
    for i, dist in enumerate(rows):
        row_kl = _select(frame, distribution=dist)["kl"].to_numpy(dtype=float)
        row_kl = row_kl[~np.isnan(row_kl)]
        under = int(np.count_nonzero(row_kl < floor))
        if under:
            below.append(f"{_share(under, row_kl.size)} of {dist}'s")
        for j, budget in enumerate(cols):
            ax = axes[i, j]
            cell = _select(frame, distribution=dist, budget=budget)
            for scheme in schemes:
                kl = cell.loc[cell["scheme"] == scheme, "kl"].to_numpy(dtype=float)
                kl = kl[~np.isnan(kl)]
                if kl.size == 0:
                    continue
                shown = np.sort(np.maximum(kl[np.isfinite(kl)], floor))
                ecdf = np.arange(1, shown.size + 1) / kl.size
                _tag(ax.step(shown, ecdf, where="post", color=colors[scheme],
                             lw=_nested(schemes, scheme, 2.0, 0.45, 0.6), zorder=3 + 0.1 * schemes.index(scheme)),
                     scheme)
                mean, p99 = float(np.mean(kl)), float(np.quantile(kl, 0.99))
                for value, style in ((mean, "--"), (p99, ":")):
                    if np.isfinite(value):
                        _tag(ax.axvline(max(value, floor), color=colors[scheme], ls=style, lw=0.9, alpha=0.9,
                                        zorder=2), scheme)
            _log_axis(ax, "x", np.maximum(row_kl[np.isfinite(row_kl)], floor))
            ax.set_ylim(0, 1.02)
            if i == 0:
                ax.set_title(f"n = {budget} bits")
            if j == len(cols) - 1:
                _margin_title(ax, str(dist))
            ax.tick_params(labelbottom=True)
    _bottom_xlabel(axes, "KL (nats)")
    fig.supylabel("fraction of queries")
    floor_note = (f"; KL below {_number(floor)} nats drawn at it: {', '.join(below)} queries" if below
                  else f"; no KL below {_number(floor)} nats")
    _suptitle(fig, (f"{title}: d = {dim}{dim_note}, sharpness {_fmt(float(sharpness))}{s_note}{floor_note}"))
    handles = _scheme_handles(schemes, colors, markers) + [
        Line2D([], [], color="black", ls="-", lw=1.0), Line2D([], [], color="black", ls="--", lw=0.9),
        Line2D([], [], color="black", ls=":", lw=0.9),
    ]
    for h in handles[: len(schemes)]:
        h.set_marker("")
    labels = [*schemes, "ECDF", "mean", "p99"]
    _figure_legend(fig, handles, labels, ncol=4 if len(labels) <= 8 else 5)
    return fig


def _line_panel(ax: Any, frame: pd.DataFrame, x: str, y: str, schemes: Sequence[str], colors: Mapping[str, str],
                markers: Mapping[str, str], *, log_y: bool = True) -> int:
    """Lines of ``y`` against ``x``, one per scheme; returns the number of lines drawn."""
    drawn, shown = 0, []
    for scheme in schemes:
        g = frame[frame["scheme"] == scheme].sort_values(x)
        xs, ys = g[x].to_numpy(dtype=float), g[y].to_numpy(dtype=float)
        ok = np.isfinite(xs) & np.isfinite(ys) & ((ys > 0) if log_y else True)
        if not ok.any():
            continue
        _tag(ax.plot(xs[ok], ys[ok], marker=markers[scheme], color=colors[scheme],
                     markersize=_nested(schemes, scheme, 5.0, 0.7, 2.5), lw=_nested(schemes, scheme, 2.0, 0.45, 0.6),
                     zorder=3 + 0.1 * schemes.index(scheme)), scheme)
        shown.extend(ys[ok])
        drawn += 1
    if log_y and drawn:
        _log_axis(ax, "y", shown)
    return drawn


@styled
def budget_crossover(
    summary: pd.DataFrame,
    *,
    distribution: str | None = None,
    dim: int | None = None,
    sharpness: float | None = None,
    metrics: Sequence[str] = ("k_eps_dir_mean", "kl_mean"),
    colors: Mapping[str, str] | None = None,
) -> Figure:
    """``metrics`` (default: key direction error and mean KL) against the budget n, one line
    per scheme, one panel per metric, for one distribution, dim and sharpness (log y)."""
    title = "Budget crossover"
    distribution, d_note = _choose(summary, "distribution", distribution)
    frame = _select(summary, distribution=distribution)
    dim, dim_note = _choose(frame, "dim", dim)
    frame = _select(frame, dim=dim)
    sharpness, s_note = _choose(frame, "sharpness", sharpness)
    frame = _select(frame, sharpness=None if sharpness is None else float(sharpness))
    if frame.empty or frame["budget"].nunique() == 0:
        return nothing_to_show(title, f"no summary rows for {distribution}, d = {dim}, sharpness = {sharpness}")
    colors, markers = _palette(frame["scheme"].unique(), colors)
    schemes = scheme_order(frame["scheme"].unique())
    fig, axes = new_figure(1, len(metrics), height=2.1)
    budgets = sorted(frame["budget"].unique())
    for ax, metric in zip(axes[0], metrics):
        if metric not in frame.columns or not _line_panel(ax, frame, "budget", metric, schemes, colors, markers):
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks(budgets)
        ax.set_xlabel(BUDGET_LABEL)
        ax.set_ylabel(METRIC_LABELS.get(metric, safe_text(metric)))
    one = " (one budget: no crossover to see)" if len(budgets) < 2 else ""
    _suptitle(fig, (f"{title}: {distribution}{d_note}, d = {dim}{dim_note}, "
                    f"sharpness {_fmt(float(sharpness))}{s_note}{one}"))
    _figure_legend(fig, _scheme_handles(schemes, colors, markers), schemes)
    return fig


def _sweep_frame(summary: pd.DataFrame, values: Mapping[str, float], dim: Any, budget: Any, sharpness: Any,
                 column: str) -> tuple[pd.DataFrame, Any, Any, Any, str]:
    frame = _select(summary, distribution=list(values)) if values else summary.iloc[0:0]
    dim, dim_note = _choose(frame, "dim", dim)
    frame = _select(frame, dim=dim)
    budget, b_note = _choose(frame, "budget", budget)
    budget = None if budget is None else int(budget)
    frame = _select(frame, budget=budget)
    sharpness, s_note = _choose(frame, "sharpness", sharpness)
    frame = _select(frame, sharpness=None if sharpness is None else float(sharpness)).copy()
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
    colors, markers = _palette(frame["scheme"].unique(), colors)
    schemes = scheme_order(frame["scheme"].unique())
    fig, axes = new_figure(1, len(metrics), height=2.1)
    nus = sorted(frame["nu"].unique())
    for ax, metric in zip(axes[0], metrics):
        if metric not in frame.columns or not _line_panel(ax, frame, "nu", metric, schemes, colors, markers):
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_xscale("log")
        ax.set_xticks(nus, [_fmt(v) for v in nus])
        ax.xaxis.set_minor_locator(mticker.NullLocator())
        ax.set_xlabel("tail index ν")
        ax.set_ylabel(METRIC_LABELS.get(metric, safe_text(metric)))
    one = f"; only one tail index (ν = {_fmt(nus[0])}): no sweep to show" if len(nus) < 2 else ""
    _suptitle(fig, (f"{title}: d = {dim}, n = {budget}, sharpness {_fmt(float(sharpness))}{note}{one}"))
    _figure_legend(fig, _scheme_handles(schemes, colors, markers), schemes)
    return fig


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
    frame = _select(summary, distribution=names) if names else summary.iloc[0:0]
    budget, b_note = _choose(frame, "budget", budget)
    budget = None if budget is None else int(budget)
    sharpness, s_note = _choose(frame, "sharpness", sharpness)
    dims_present = _present(frame, "dim", dims)
    if frame.empty or not dims_present:
        return nothing_to_show(title, f"no summary rows of a low-rank distribution "
                                      f"({', '.join(names) or 'none in the config'})")
    refs = [r for r in reference_distributions if r in set(summary["distribution"])]
    frame = _select(frame, budget=budget, sharpness=None if sharpness is None else float(sharpness)).copy()
    frame["rank"] = frame["distribution"].map({k: float(v) for k, v in rank_by_distribution.items()})
    reference = (_select(summary, distribution=refs, budget=budget,
                         sharpness=None if sharpness is None else float(sharpness))
                 if refs else summary.iloc[0:0])
    colors, markers = _palette(set(frame["scheme"]) | set(reference["scheme"]), colors)
    schemes = scheme_order(set(frame["scheme"]) | set(reference["scheme"]))
    fig, axes = new_figure(1, len(dims_present), height=2.3, sharey=True)
    ranks_seen: set[float] = set()
    ref_styles = {r: REFERENCE_STYLES[i % len(REFERENCE_STYLES)] for i, r in enumerate(refs)}
    refs_drawn: list[str] = []
    for ax, d in zip(axes[0], dims_present):
        panel = _select(frame, dim=d)
        ranks = sorted(panel["rank"].unique())
        ranks_seen.update(ranks)
        if not _line_panel(ax, panel, "rank", metric, schemes, colors, markers):
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        for ref in refs:
            rows = _select(reference, distribution=ref, dim=d)
            for scheme in schemes:
                value = rows.loc[rows["scheme"] == scheme, metric].to_numpy(dtype=float)
                if value.size and np.isfinite(value[0]) and value[0] > 0:
                    _tag(ax.axhline(value[0], color=colors[scheme], ls=ref_styles[ref], lw=0.9, alpha=0.85), scheme)
                    if ref not in refs_drawn:
                        refs_drawn.append(ref)
        ax.set_xscale("log", base=2)
        if ranks:
            ax.set_xticks(ranks, [_fmt(r) for r in ranks])
        ax.xaxis.set_minor_locator(mticker.NullLocator())
        ax.set_xlabel("rank R")
        ax.set_title(f"d = {d}")
    if not frame.empty and metric in frame.columns:
        _log_axis(axes[0, 0], "y", np.r_[frame[metric].to_numpy(dtype=float), reference[metric].to_numpy(dtype=float)])
    axes[0, 0].set_ylabel(METRIC_LABELS.get(metric, safe_text(metric)))
    one = "; only one rank: no sweep to show" if len(ranks_seen) < 2 else ""
    _suptitle(fig, (f"{title}: n = {budget}{b_note}, sharpness {_fmt(float(sharpness))}{s_note}{one}"))
    handles = _scheme_handles(schemes, colors, markers)
    labels = list(schemes)
    for ref in refs_drawn:
        handles.append(Line2D([], [], color="black", ls=ref_styles[ref], lw=0.9))
        labels.append(f"{ref} (reference)")
    _figure_legend(fig, handles, labels, ncol=min(len(handles), 4))
    return fig


def query_model_points(trials: pd.DataFrame, parents: Mapping[str, Mapping[str, Any]],
                       variants: Mapping[str, Mapping[str, Any]], references: Sequence[str], *, scheme: str,
                       budget: int, sharpness: float, metric: str = "kl") -> pd.DataFrame:
    """The points of :func:`query_model_sweep`: per low-rank distribution (parent, or variant of a
    parent) and dim, the ratio of its mean per-trial ``metric`` over the reference distribution's
    (the heaviest-tailed one at that dim, ``references``) for one scheme, budget and sharpness:
    C5's statistic (the ratio of the trial means) under each query model.

    ``parents``: ``{name: {"rank", "noise"}}``; ``variants``: ``{name: {"of", "query"}}``.
    Columns: ``distribution``, ``rank``, ``dim``, ``query``, ``alignment`` (E[a] of the model,
    :func:`kvasym.querymodel.expected_alignment`), ``ratio`` with its 95% interval ``low``,
    ``high`` (Fieller's over trials, unpaired: the interval the claims print), ``reference``, and
    ``predicted``: the second-order prediction from the subspace point, its ratio times
    ``E[1/a] / E[1/a]_subspace`` (:func:`kvasym.querymodel.expected_inverse_alignment`; inf for
    isotropic queries on rank <= 2 keys, NaN without a subspace point)."""
    from .querymodel import DEFAULT_QUERY_MODEL, expected_alignment, parse_query_model
    from .stats import bootstrap_ratio_ci

    rows = _select(trials, scheme=scheme, budget=int(budget), sharpness=float(sharpness))
    means = rows.groupby(["distribution", "dim"])[metric].mean() if not rows.empty else pd.Series(dtype=float)

    def values(dist: str, dim: Any) -> np.ndarray:
        cell = rows[(rows["distribution"] == dist) & (rows["dim"] == dim)]
        return cell.sort_values("trial")[metric].to_numpy(dtype=float) if "trial" in cell else cell[metric].to_numpy()

    models = {name: (name, DEFAULT_QUERY_MODEL) for name in parents}
    models.update({name: (v["of"], v["query"]) for name, v in variants.items() if v["of"] in parents})
    out = []
    for name, (parent, query) in models.items():
        spec = parents[parent]
        for (dist, dim), value in means.items():
            if dist != name:
                continue
            ref = next((r for r in references if (r, dim) in means.index), None)
            if ref is None or not np.isfinite(means[(ref, dim)]) or means[(ref, dim)] <= 0:
                continue
            alignment = expected_alignment(parse_query_model(query), "low_rank", int(dim), int(spec["rank"]),
                                           float(spec.get("noise", 0.0)))
            # the claims' interval (kvasym.claims.stat_distribution_ratio: Fieller's, unpaired, over trials)
            ci = bootstrap_ratio_ci(values(name, dim), values(ref, dim), statistic="mean", n_boot=1, base_seed=0,
                                    identity=("claims", name, ref, metric, int(dim)), paired=False, undefined="nan")
            out.append({"distribution": name, "rank": int(spec["rank"]), "dim": int(dim), "query": query,
                        "alignment": alignment, "ratio": float(value) / float(means[(ref, dim)]),
                        "low": float(ci["low"]), "high": float(ci["high"]), "reference": ref})
    columns = ["distribution", "rank", "dim", "query", "alignment", "ratio", "low", "high", "reference"]
    frame = pd.DataFrame(out, columns=columns).sort_values(["dim", "rank", "alignment"]).reset_index(drop=True)
    # the second-order prediction from the subspace point: ratio x E[1/a] / E[1/a]_subspace
    from .querymodel import expected_inverse_alignment

    predicted = np.full(len(frame), np.nan)
    for i, p in frame.iterrows():
        base = frame[(frame["rank"] == p["rank"]) & (frame["dim"] == p["dim"]) & (frame["query"] == "subspace")]
        if not base.empty:
            inv = expected_inverse_alignment(parse_query_model(p["query"]), int(p["dim"]), int(p["rank"]))
            inv0 = expected_inverse_alignment(parse_query_model("subspace"), int(p["dim"]), int(p["rank"]))
            predicted[i] = float(base["ratio"].iloc[0]) * inv / inv0 if math.isfinite(inv) else np.inf
    frame["predicted"] = predicted
    return frame


RANK_STYLES = ("-", "--", ":", "-.")


@styled
def query_model_sweep(points: pd.DataFrame, *, scheme: str, budget: int, sharpness: float) -> Figure:
    """C5's statistic (mean KL of low-rank data over the heaviest-tailed reference) against the
    queries' alignment a with the keys' covariance (log-log), one panel per dim, one line per
    rank through its query models (:func:`query_model_points`): the subspace rule at a = d / r,
    calibrated models at their a, the isotropic model (hollow marker) at E[a] = 1. The grey
    dotted line through each subspace point is the second-order prediction ``KL proportional to
    1 / a`` (after the logit rule a query's norm is d^2 / (a tr C), and the rotated key error
    spreads over all d coordinates, so the logit error variance scales as 1 / a), and a grey cross
    the same prediction for isotropic queries, whose E[1/a] is r (d - 2) / (d (r - 2)) (above the
    line by about r / (r - 2); none for r <= 2, where it is infinite); vertical bars are
    the 95% intervals where finite and positive; the dashed horizontal line is ratio 1."""
    title = "Query model"
    if points.empty:
        return nothing_to_show(title, "no low-rank distribution with a reference distribution at its dim "
                                      "(or no query-model variants: config key query_models)")
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
    _suptitle(fig, f"{title}: n = {budget}, sharpness {_fmt(float(sharpness))}")
    handles = [Line2D([], [], color="black", ls=styles[r], marker=markers[r], ms=4, lw=0.9) for r in ranks]
    labels = [f"rank {r}" for r in ranks]
    handles += [Line2D([], [], color="black", marker="o", mfc="white", ls="none", ms=4),
                Line2D([], [], color="0.55", ls=":", lw=0.8),
                Line2D([], [], color="0.45", marker="x", ls="none", ms=4)]
    labels += ["isotropic queries", "∝ 1/a (2nd order)", "∝ E[1/a], isotropic"]
    _figure_legend(fig, handles, labels, ncol=min(len(handles), 3))
    return fig


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
    frame = (_select(theory, check=list(THEORY_CHECKS)) if theory is not None and "check" in theory.columns
             else pd.DataFrame())
    dim, dim_note = _choose(frame, "dim", dim)
    frame = _select(frame, dim=dim)
    dists = _present(frame, "distribution", distributions)
    frame = _select(frame, distribution=dists) if dists else frame.iloc[0:0]
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
    _log_axis(axes[0, 0], "y", np.r_[shown[np.isfinite(shown) & (shown > 0)], 1.0])
    axes[0, 0].set_ylabel("measured / closed form (×)")
    hollow = "; hollow: CI unbounded" if any(
        line.get_gid() == "unbounded-interval" for ax in axes[0] for line in ax.lines) else ""
    _suptitle(fig, f"{title} over their closed forms: d = {dim}{dim_note}; bars: 95% CI{hollow}")
    handles = [Line2D([], [], color=DISTRIBUTION_COLORS[k % len(DISTRIBUTION_COLORS)],
                      marker=DISTRIBUTION_MARKERS[k % len(DISTRIBUTION_MARKERS)], ls="none", markersize=4)
               for k in range(len(dists))]
    handles.append(Line2D([], [], color="black", lw=1.0))
    labels = [*map(str, dists), "closed form (ratio 1)"]
    _figure_legend(fig, handles, labels, ncol=min(len(labels), 6), loc="outside lower center")
    return fig


@styled
def marginals(samples: Mapping[str, tuple[np.ndarray, int]], *, ks_rows: pd.DataFrame | None = None,
              dim: int | None = None, bins: int = 40, ncols: int = 2) -> Figure:
    """Histograms (density) of rotated unit-vector coordinates per distribution against the
    Beta coordinate density of the working dimension, labelled with the Kolmogorov distance
    from that law and its interval as the theory table gives it (``ks_rows``: its ``ks_beta``
    rows at ``dim``; one procedure for the figure, the table and claims C5m/C5h). Without a
    row for a distribution the panel says so rather than computing a second number."""
    from .codebook import coordinate_pdf

    title = "Rotated key coordinates vs the Beta law"
    items = [(str(name), np.asarray(v, dtype=float), int(d)) for name, (v, d) in samples.items()]
    items = [(n, v[np.isfinite(v)], d) for n, v, d in items]
    items = [(n, v, d) for n, v, d in items if v.size]
    if not items:
        return nothing_to_show(title, "no samples of rotated coordinates")
    ncols = max(1, min(ncols, len(items)))
    nrows = math.ceil(len(items) / ncols)
    fig, axes = new_figure(nrows, ncols, row_height=1.35, extra=0.45, sharex=True, sharey=True)
    for ax in axes.ravel()[len(items):]:
        ax.set_axis_off()
    top = 0.0
    half = min(1.0, 4.5 / math.sqrt(min(d for _, _, d in items)))
    for ax, (name, values, work_dim) in zip(axes.ravel(), items):
        heights, _, _ = ax.hist(np.clip(values, -half, half), bins=bins, range=(-half, half), density=True, color="0.6",
                                alpha=0.75, histtype="stepfilled", linewidth=0)
        grid = np.linspace(-half, half, 401)
        pdf = coordinate_pdf(grid, work_dim)
        ax.plot(grid, pdf, color="black", lw=1.0)
        top = max(top, float(np.max(heights)), float(np.max(pdf)))
        row = (None if ks_rows is None or "check" not in ks_rows.columns
               else _select(ks_rows, check="ks_beta", distribution=name, **({} if dim is None else {"dim": dim})))
        if row is None or row.empty:
            text = "no KS row in the theory table"
        else:
            r = row.iloc[0]
            ci = (f" [{sig_text(float(r['low']))}, {sig_text(float(r['high']))}]"
                  if np.isfinite(r["low"]) and np.isfinite(r["high"]) else "")
            text = f"KS distance {sig_text(float(r['estimate']))}{ci}\nN = {int(r['n'])} keys"
        ax.text(0.02, 0.97, text, transform=ax.transAxes, va="top", ha="left", fontsize=STYLE["font.size"])
        ax.set_title(safe_text(f"{name} (d = {work_dim})"))
        ax.set_xlim(-half, half)
    axes[0, 0].set_ylim(0, 1.3 * top)  # shared: headroom for the KS text
    fig.supxlabel("rotated unit-vector coordinate (dimensionless)")  # no legend below: no clash
    fig.supylabel("density")
    _suptitle(fig, "Rotated key coordinates (grey) vs the unit-vector coordinate law in dimension d (line)")
    return fig


def _slope_text(slopes: pd.DataFrame | None, scheme: str, **cell: Any) -> str | None:
    """``<scheme> $<fitted slope>$`` of the theory table's ``jensen_slope`` row (the paper's
    number formatter, :func:`kvasym.render.format.sig`, as mathtext; the ledger prints its
    interval), or None."""
    if slopes is None or slopes.empty or "check" not in slopes.columns:
        return None
    row = _select(slopes, check="jensen_slope", scheme=scheme, **cell)
    if row.empty or not np.isfinite(float(row["estimate"].iloc[0])):
        return None
    return f"{safe_text(scheme)} ${sig(float(row['estimate'].iloc[0]))}$"


@styled
def jensen_bias(
    per_key: pd.DataFrame,
    *,
    budget: int | None = None,
    sharpness: float | None = None,
    dim: int | None = None,
    distributions: Sequence[str] | None = None,
    slopes: pd.DataFrame | None = None,
    n_bins: int = 20,
    colors: Mapping[str, str] | None = None,
) -> Figure:
    """Per key: log(mean attention weight quantized / reference) against the variance of its
    logit error, as means over ``n_bins`` quantile bins of the variance (with standard errors),
    one line per scheme, one panel per distribution, one budget and sharpness. With ``slopes``
    (the theory table), each panel's title gives the fitted Jensen slope of each scheme; one
    figure legend below the panels names the schemes."""
    from .theory import jensen_points

    title = "Jensen bias"
    dim, dim_note = _choose(per_key, "dim", dim)
    frame = _select(per_key, dim=dim)
    budget, b_note = _choose(frame, "budget", budget)
    budget = None if budget is None else int(budget)
    frame = _select(frame, budget=budget)
    sharpness, s_note = _choose(frame, "sharpness", sharpness)
    frame = _select(frame, sharpness=None if sharpness is None else float(sharpness))
    dists = _present(frame, "distribution", distributions)
    if frame.empty or not dists:
        return nothing_to_show(title, f"no per-key rows for d = {dim}, n = {budget}, sharpness = {sharpness}")
    colors, markers = _palette(frame["scheme"].unique(), colors)
    schemes = scheme_order(frame["scheme"].unique())
    with_slopes = slopes is not None and not slopes.empty and "check" in slopes.columns
    # two panels per row at text width (a single column of four panels was taller than a page);
    # one figure legend for the schemes, and each panel's fitted slopes (they differ by
    # distribution) in its title: per-panel legends filled a third of each panel (issue 15)
    ncols = 2 if len(dists) > 1 else 1
    nrows = -(-len(dists) // ncols)
    fig, axes = new_figure(nrows, ncols, width=TEXT_WIDTH, row_height=1.75, extra=0.75)
    for ax in axes.flat[len(dists):]:
        ax.set_axis_off()
    for ax, dist in zip(axes.flat, dists):
        fitted, shown = [], []
        cell = _select(frame, distribution=dist)
        for scheme in schemes:
            g = cell[cell["scheme"] == scheme]
            if g.empty:
                continue
            var, excess, _ = jensen_points(g)
            keep = var > 0
            var, excess = var[keep], excess[keep]
            if var.size < 2:
                continue
            edges = np.unique(np.quantile(var, np.linspace(0, 1, n_bins + 1)))
            which = np.clip(np.searchsorted(edges, var, side="right") - 1, 0, max(len(edges) - 2, 0))
            xs, ys, es = [], [], []
            for b in np.unique(which):
                sel = which == b
                xs.append(float(np.exp(np.mean(np.log(var[sel])))))
                ys.append(float(np.mean(excess[sel])))
                es.append(float(np.std(excess[sel], ddof=1) / math.sqrt(sel.sum())) if sel.sum() > 1 else 0.0)
            _tag(ax.errorbar(xs, ys, yerr=es, color=colors[scheme], marker=markers[scheme],
                             markersize=_nested(schemes, scheme, 4.2, 0.6, 2.2),
                             lw=_nested(schemes, scheme, 1.5, 0.25, 0.7), elinewidth=0.7, capsize=0,
                             zorder=3 + 0.1 * schemes.index(scheme)), scheme)
            shown.extend(xs)
            text = _slope_text(slopes, scheme, distribution=dist, dim=dim, budget=budget,
                               sharpness=None if sharpness is None else float(sharpness)) if with_slopes else None
            if text:
                fitted.append(text)
        ax.axhline(0.0, color="0.4", lw=0.7, ls="-", zorder=1)
        if shown:
            _log_axis(ax, "x", shown)
        else:
            ax.text(0.5, 0.5, "no keys with positive logit-error variance", ha="center", va="center",
                    transform=ax.transAxes)
        # two slopes per line: a half-width panel holds about 45 characters at 8 pt
        slope_lines = [", ".join(fitted[k:k + 2]) for k in range(0, len(fitted), 2)]
        ax.set_title(safe_text(str(dist)) + ("\nslope: " + ",\n".join(slope_lines) if fitted else ""))
    _bottom_xlabel(axes, "logit-error variance over queries (logit², log scale)")
    fig.supylabel("ln(mean ŵ / mean w) (nats)")
    _figure_legend(fig, _scheme_handles(schemes, colors, markers), schemes)
    slope_note = "; slope: linear fit of the per-key points" if with_slopes else ""
    _suptitle(fig, f"{title}: d = {dim}{dim_note}, n = {budget}{b_note}, sharpness {_fmt(float(sharpness))}{s_note}; "
                   f"means of {n_bins} quantile bins ± s.e.{slope_note}")
    return fig


@styled
def sharpness_sweep(
    summary: pd.DataFrame,
    *,
    dim: int | None = None,
    budget: int | None = None,
    distributions: Sequence[str] | None = None,
    comparisons: pd.DataFrame | None = None,
    pair: tuple[str, str] = ("QKQV", "KQV"),
    colors: Mapping[str, str] | None = None,
    paper_ratio: float | None = None,
) -> Figure:
    """Per distribution (rows): mean KL of each scheme against the sharpness (log-log), and
    the ratio ``pair[0] / pair[1]`` of mean KL (QKQV over KQV: above 1 means KQV is better),
    with its paired bootstrap CI and its second-order prediction (the key sides' error-energy
    ratio, :func:`kvasym.theory.predicted_kl_ratio`) when ``comparisons`` is given, and the
    paper's value of the ratio (``paper_ratio``, from the claims file) as a reference line."""
    title = "Sharpness sweep"
    num, den = pair
    dim, dim_note = _choose(summary, "dim", dim)
    frame = _select(summary, dim=dim)
    budget, b_note = _choose(frame, "budget", budget)
    budget = None if budget is None else int(budget)
    frame = _select(frame, budget=budget)
    dists = _present(frame, "distribution", distributions)
    if frame.empty or not dists:
        return nothing_to_show(title, f"no summary rows for d = {dim}, n = {budget}")
    colors, markers = _palette(frame["scheme"].unique(), colors)
    schemes = scheme_order(frame["scheme"].unique())
    fig, axes = new_figure(len(dists), 2, row_height=1.3, extra=0.75, sharex=True)
    sharp = sorted(frame["sharpness"].unique())
    ratio_entries: dict[str, Any] = {}  # label -> line of the ratio panels, for the figure legend
    for i, dist in enumerate(dists):
        cell = _select(frame, distribution=dist)
        ax_kl, ax_ratio = axes[i]
        if not _line_panel(ax_kl, cell, "sharpness", "kl_mean", schemes, colors, markers):
            ax_kl.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax_kl.transAxes)
        a = cell[cell["scheme"] == num].set_index("sharpness")["kl_mean"]
        b = cell[cell["scheme"] == den].set_index("sharpness")["kl_mean"]
        common = sorted(set(a.index) & set(b.index))
        if common:
            ratio = a.loc[common].to_numpy(dtype=float) / b.loc[common].to_numpy(dtype=float)
            low = high = theory = None
            if comparisons is not None and not comparisons.empty and "ratio_mean" in comparisons.columns:
                low, high, theory = _ratio_ci(comparisons, dist, dim, budget, common, num, den)
            ax_ratio.plot(common, ratio, color="black", marker="o", markersize=3.5, lw=1.1, zorder=3,
                          label="measured")
            if low is not None and np.isfinite(low).any():
                ax_ratio.fill_between(common, low, high, color="0.5", alpha=0.3, linewidth=0, zorder=2)
            if theory is not None and np.isfinite(theory).any():
                ax_ratio.plot(common, theory, color="tab:blue", ls=":", lw=1.3, zorder=4,
                              label="closed form (second-order prediction)")
            if paper_ratio is not None:
                ax_ratio.axhline(paper_ratio, color="tab:red", ls="-.", lw=0.9, zorder=1,
                                 label=safe_text(f"paper's value ({_fmt(paper_ratio)})"))
            ax_ratio.axhline(1.0, color="0.4", ls="--", lw=0.8)
            for line in ax_ratio.get_lines():  # the figure legend names each reference line once
                if not line.get_label().startswith("_") and line.get_label() not in ratio_entries:
                    ratio_entries[line.get_label()] = line
            spread = np.r_[ratio, [] if low is None else low, [] if high is None else high, 1.0,
                           [] if theory is None else theory, [] if paper_ratio is None else [paper_ratio]]
            finite = spread[np.isfinite(spread) & (spread > 0)]
            if finite.size and finite.max() / finite.min() > 10:
                _log_axis(ax_ratio, "y", finite)
        else:
            ax_ratio.text(0.5, 0.5, safe_text(f"{num} or {den} absent"), ha="center", va="center",
                          transform=ax_ratio.transAxes)
        for ax in (ax_kl, ax_ratio):
            ax.set_xscale("log", base=2)
            ax.set_xticks(sharp, [_fmt(s) for s in sharp])
            ax.xaxis.set_minor_locator(mticker.NullLocator())
            ax.tick_params(labelbottom=True)
        ax_kl.set_ylabel("mean KL (nats)")
        ax_ratio.set_ylabel("mean-KL ratio (×)")
        _margin_title(ax_ratio, str(dist))
        if i == 0:
            ax_kl.set_title("mean KL per scheme")
            ax_ratio.set_title(safe_text(f"{num} / {den}"))
    _bottom_xlabel(axes, "sharpness (logit s.d.)")
    ci_note = ", shaded: 95% CI" if comparisons is not None and not comparisons.empty else ""
    _suptitle(fig, f"{title}: d = {dim}{dim_note}, n = {budget}{b_note}; ratio > 1: {den} better{ci_note}")
    # one legend outside the panels: a legend inside the first ratio panel hid its data (issue 15)
    handles = _scheme_handles(schemes, colors, markers)
    for line in ratio_entries.values():
        handles.append(Line2D([], [], color=line.get_color(), ls=line.get_linestyle(), lw=line.get_linewidth(),
                              marker=line.get_marker(), markersize=line.get_markersize()))
    labels = [*schemes, *(f"ratio: {label}" if label == "measured" else label for label in ratio_entries)]
    _figure_legend(fig, handles, labels, ncol=4)
    return fig


def _ratio_ci(comparisons: pd.DataFrame, dist: str, dim: Any, budget: Any, sharpness: Sequence[float], num: str,
              den: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CI of mean KL num/den per sharpness, oriented by :func:`kvasym.cells.pair_ratio`, and the
    second-order prediction of the ratio (the comparisons' ``ratio_theory``, NaN if absent)."""
    from .cells import MissingCell, pair_ratio

    low, high = np.full(len(sharpness), np.nan), np.full(len(sharpness), np.nan)
    theory = np.full(len(sharpness), np.nan)
    for k, s in enumerate(sharpness):
        try:
            ratio = pair_ratio(comparisons, num, den, distribution=dist, dim=dim, budget=budget, sharpness=float(s))
        except MissingCell:
            continue  # no comparison at this sharpness: the panel shows the point without a band
        low[k], high[k] = ratio["low"], ratio["high"]
        value = float(ratio["row"].get("ratio_theory", np.nan))
        if np.isfinite(value) and value > 0:
            theory[k] = 1.0 / value if ratio["swapped"] else value
    return low, high, theory


#: Colour map of the heat maps: sequential and colour-blind safe; cells without a finite
#: positive value (absent, KL = 0 or infinite) are drawn in :data:`HEATMAP_MISSING`.
HEATMAP_CMAP = "viridis"
HEATMAP_MISSING = "0.85"
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
    ``budget``), as :func:`kvasym.stages.figure.real_kl_means` returns them. Panel rows are
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
    budget, b_note = _choose(frame, "budget", budget)
    frame = _select(frame, budget=None if budget is None else int(budget))
    rows = _present(frame, "distribution", distributions)
    cols = _present(frame, "scheme", schemes)
    frame = _select(frame, distribution=rows, scheme=cols) if rows and cols else frame.iloc[0:0]
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
                _margin_title(ax, labels.get(dist, str(dist)))
    bar = fig.colorbar(image, ax=axes.ravel().tolist(), location="bottom", shrink=0.6, aspect=35)
    bar.set_label("mean KL(p ‖ p̂) (nats, log scale)")
    _log_ticks(bar.ax.xaxis, [vmin, vmax])
    bar.outline.set_linewidth(0.4)
    missing = "; grey: no finite positive mean" if (~np.isfinite(grid) | (grid <= 0)).any() else ""
    _suptitle(fig, f"{title}: n = {budget} bits{b_note}; mean over texts, query heads and positions{missing}")
    return fig
