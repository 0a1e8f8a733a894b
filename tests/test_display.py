"""The figures' display aggregates (kvasym.display) against brute force, and the rule that
rendering reads numbers and never recomputes them (issue 30): no module under
src/kvasym/render/ calls a numpy or pandas reduction on data, except the layout calls listed
with their reason in RENDER_LAYOUT_CALLS."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvasym import display
from kvasym.errors import KvasymError

RENDER = Path(__file__).resolve().parents[1] / "src" / "kvasym" / "render"

# ----------------------------------------------------------------------------- rendering computes no statistic

#: Reductions over data: numpy functions and array / DataFrame methods that summarise values.
REDUCTIONS = frozenset({
    "mean", "nanmean", "average", "median", "nanmedian", "percentile", "nanpercentile", "quantile", "nanquantile",
    "std", "nanstd", "var", "nanvar", "sem", "sum", "nansum", "cumsum", "prod", "min", "max", "nanmin", "nanmax",
    "amin", "amax", "ptp", "count_nonzero", "histogram", "histogram2d", "histogramdd", "bincount", "cov", "corr",
    "corrcoef", "groupby", "agg", "aggregate", "describe", "pivot_table", "resample", "rolling", "expanding",
    "value_counts", "mode",
})

#: (file under render/, enclosing function, reduction) -> why it is layout, not a statistic.
RENDER_LAYOUT_CALLS: dict[tuple[str, str, str], str] = {
    ("figures/_style.py", "log_ticks", "min"): "a log axis's ticks span the values drawn",
    ("figures/_style.py", "log_ticks", "max"): "a log axis's ticks span the values drawn",
    ("figures/_style.py", "colorbar_log_ticks", "min"): "a colour bar's tick steps follow the decades it spans",
    ("figures/_style.py", "colorbar_log_ticks", "max"): "a colour bar's tick steps follow the decades it spans",
    ("figures/marginals.py", "marginals", "max"): "the panel's top: the tallest bar or density curve drawn",
    ("figures/sharpness_sweep.py", "sharpness_sweep", "min"): "log scale when the values drawn span a decade",
    ("figures/sharpness_sweep.py", "sharpness_sweep", "max"): "log scale when the values drawn span a decade",
    ("figures/frontier.py", "frontier_figure", "max"): "the x axis ends past the largest budget drawn",
    ("figures/frontier.py", "frontier_figure", "min"): "the note names the range of points beyond the axis",
    ("figures/e2e.py", "e2e_ppl_bits", "sum"): "counts the points the log axis cannot draw (a note)",
    ("figures/e2e.py", "e2e_layer_sensitivity", "min"): "the colour scale's limits; the budget shown",
    ("figures/e2e.py", "e2e_layer_sensitivity", "max"): "the colour scale's limits",
    ("figures/real_heatmap.py", "real_kl_heatmap", "min"): "the colour scale's limits",
    ("figures/real_heatmap.py", "real_kl_heatmap", "max"): "the colour scale's limits",
    ("figures/query_model.py", "query_model_sweep", "min"): "the prediction line's extent on the x axis",
    ("figures/kl_ecdf.py", "kl_ecdf", "count_nonzero"): "counts the queries the drawing clips at the floor (a note)",
    ("format.py", "best_flags", "sum"): "whether two values are there to mark the best of",
    ("format.py", "best_flags", "min"): "which value of a column is set in bold",
    ("format.py", "best_flags", "max"): "which value of a column is set in bold",
    ("table_seqlen.py", "seq_len_context", "groupby"): "one table row per (scheme, budget): rows, no reduction",
    ("table_seqlen.py", "seq_len_context", "min"): "the caption's trial count (every length has the same)",
    ("table_e2e.py", "e2e_context", "min"): "the sensitivity block's budget: the smallest present",
    ("card_page.py", "card_figures", "groupby"): "one frontier line per scheme: rows, no reduction",
}


def _calls(source: str) -> list[tuple[str, str, int]]:
    """(enclosing function, reduction, line) of every reduction call in ``source``: a call of an
    attribute named in REDUCTIONS (``np.mean(x)``, ``x.mean()``, ``frame.groupby(...)``) or of a
    bare name imported as one (``from numpy import median``). The builtins min, max and sum on
    Python values are not numpy's: a bare call of those is not counted."""
    tree = ast.parse(source)
    imported = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and (node.module or "").split(".")[0] in ("numpy", "pandas") for alias in node.names}
    found: list[tuple[str, str, int]] = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and where == "" else where
            if isinstance(child, ast.Call):
                func = child.func
                if isinstance(func, ast.Attribute) and func.attr in REDUCTIONS:
                    found.append((where or "<module>", func.attr, child.lineno))
                elif isinstance(func, ast.Name) and func.id in REDUCTIONS and func.id in imported:
                    found.append((where or "<module>", func.id, child.lineno))
            visit(child, inner)

    visit(tree, "")
    return found


def _offences(files: dict[str, str]) -> tuple[list[str], set[tuple[str, str, str]]]:
    offences, used = [], set()
    for name, source in sorted(files.items()):
        for where, call, line in _calls(source):
            key = (name, where, call)
            if key in RENDER_LAYOUT_CALLS:
                used.add(key)
            else:
                offences.append(f"{name}:{line} {where}() calls {call}")
    return offences, used


def _render_sources() -> dict[str, str]:
    return {str(p.relative_to(RENDER)): p.read_text() for p in sorted(RENDER.rglob("*.py"))}


def test_rendering_calls_no_reduction_on_data():
    """Every number a figure or table draws is read from a table (issue 30): a reduction under
    render/ is either layout (allow-listed with its reason) or a statistic that belongs in the
    library and a stage's table. Every allow-list entry is still needed."""
    offences, used = _offences(_render_sources())
    assert not offences, "reductions under src/kvasym/render/ (compute them in kvasym.display, write them from a " \
                         "stage, read them in render/; or allow-list layout):\n" + "\n".join(offences)
    assert set(RENDER_LAYOUT_CALLS) - used == set(), "stale allow-list entries"
    assert all(reason.strip() for reason in RENDER_LAYOUT_CALLS.values())


@pytest.mark.parametrize("planted, calls", [
    ("    q = np.percentile(x, [25, 50, 75])\n", ["percentile"]),
    ("    m = frame.groupby('scheme')['kl'].mean()\n", ["mean", "groupby"]),
    ("    s = float(np.std(excess, ddof=1))\n", ["std"]),
    ("    lo, hi = np.quantile(kl, [0.5, 0.99])\n", ["quantile"]),
])
def test_the_scan_finds_a_planted_reduction(planted, calls):
    """A reduction planted in a figure module is found, with its file, function and line; so is
    one imported by name from numpy, and one in a function whose other call is allow-listed."""
    sources = _render_sources()
    name = "figures/kl_ecdf.py"
    sources[name] += f"\n\ndef _planted(x, frame, excess, kl):\n{planted}"
    offences, _ = _offences(sources)
    line = sources[name].count("\n")
    assert offences == [f"{name}:{line} _planted() calls {call}" for call in calls]
    by_name = {"figures/x.py": "from numpy import median as median\n\ndef f(v):\n    return median(v)\n"}
    assert _offences(by_name)[0] == ["figures/x.py:4 f() calls median"]
    inside = {"figures/_style.py": "def log_ticks(v):\n    return v.min(), v.mean()\n"}
    assert _offences(inside)[0] == ["figures/_style.py:2 log_ticks() calls mean"]


# ----------------------------------------------------------------------------- the aggregates, brute force


def _percentile_linear(values: np.ndarray, p: float) -> float:
    """Hyndman and Fan's type 7 by hand: position p/100 (n - 1) between the order statistics."""
    v = sorted(values)
    h = (len(v) - 1) * p / 100
    lo = math.floor(h)
    return v[lo] + (h - lo) * (v[min(lo + 1, len(v) - 1)] - v[lo])


def test_quartiles_are_the_linear_percentiles():
    gen = np.random.default_rng(3)
    for n in (1, 2, 5, 64):
        x = gen.standard_t(2, n)
        q = display.quartiles(x)
        assert q == pytest.approx([_percentile_linear(x, p) for p in (25, 50, 75)], rel=1e-13, abs=1e-15)
    assert display.quartiles([1.0, 2.0, 3.0, 4.0]) == (1.75, 2.5, 3.25)
    for bad in ([], [1.0, np.nan], [[1.0, 2.0]]):
        with pytest.raises(KvasymError, match="quartiles"):
            display.quartiles(bad)


def test_median_iqr_leaves_out_non_finite_values():
    assert display.median_iqr([4.0, 1.0, np.inf, 3.0, 2.0, np.nan]) == (2.5, 1.5)
    assert all(math.isnan(v) for v in display.median_iqr([np.nan, -np.inf]))


def test_jensen_bins_against_hand_bins():
    """Eight keys (one with zero variance, left out) in 3 quantile bins: the edges are the
    variance's linear quantiles at 0, 1/3, 2/3, 1 (1, 4, 16, 64: bins [1, 4), [4, 16), [16, 64]);
    each bin's geometric mean, mean and s.e. by hand."""
    var = np.array([0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0])
    excess = np.array([9.0, 0.1, 0.3, 0.2, 0.6, 0.5, 1.0, 1.4])
    bins = display.jensen_bins(var, excess, 3)
    v, e = var[1:], excess[1:]
    edges = [_percentile_linear(v, 100 * k / 3) for k in range(4)]
    assert edges == [1.0, 4.0, 16.0, 64.0]
    members = [[i for i in range(7) if edges[b] <= v[i] < edges[b + 1] or (b == 2 and v[i] == edges[3])]
               for b in range(3)]
    assert [len(m) for m in members] == [2, 2, 3]
    assert bins["bin"].tolist() == [0, 1, 2] and bins["n_keys"].tolist() == [2, 2, 3]
    for b, m in enumerate(members):
        geo = math.exp(sum(math.log(v[i]) for i in m) / len(m))
        mean = sum(e[i] for i in m) / len(m)
        se = math.sqrt(sum((e[i] - mean) ** 2 for i in m) / (len(m) - 1)) / math.sqrt(len(m))
        assert bins.loc[b, "var_geomean"] == pytest.approx(geo, rel=1e-13)
        assert bins.loc[b, "excess_mean"] == pytest.approx(mean, rel=1e-13)
        assert bins.loc[b, "excess_se"] == pytest.approx(se, rel=1e-12)
    # ties merge bins; one key in a bin has s.e. 0; fewer than 2 keys: no bins
    tied = display.jensen_bins([1.0, 1.0, 1.0, 5.0], [0.0, 1.0, 2.0, 7.0], 4)
    assert tied["n_keys"].tolist() == [3, 1] and tied["excess_se"].iloc[1] == 0.0
    assert display.jensen_bins([0.0, 2.0], [1.0, 1.0], 5).empty
    with pytest.raises(KvasymError, match="n_bins"):
        display.jensen_bins(var, excess, 0)


def test_density_levels_against_a_hand_histogram():
    """With a kernel narrower than a bin (smooth 0.01: weights 0, 1, 0), the density is the
    points' histogram over the padded central range, counted by hand, over the number of
    points; each level is the smallest density of the densest cells that hold its mass."""
    gen = np.random.default_rng(8)
    x, y = gen.normal(0, 1, 50), gen.exponential(1, 50)
    bins = 5
    xc, yc, density, levels = display.density_levels(x, y, (0.5, 0.9), bins=bins, smooth=0.01)
    counts = np.zeros((bins, bins))  # [y, x]
    ranges = []
    for v in (x, y):
        lo, hi = _percentile_linear(v, 0.5), _percentile_linear(v, 99.5)
        ranges.append((lo - 0.15 * (hi - lo), hi + 0.15 * (hi - lo)))
    for px, py in zip(x, y):
        (xl, xh), (yl, yh) = ranges
        if xl <= px <= xh and yl <= py <= yh:
            i = min(int((px - xl) / (xh - xl) * bins), bins - 1)
            j = min(int((py - yl) / (yh - yl) * bins), bins - 1)
            counts[j, i] += 1
    assert density == pytest.approx(counts / 50, abs=1e-12)
    assert xc == pytest.approx([ranges[0][0] + (k + 0.5) * (ranges[0][1] - ranges[0][0]) / bins for k in range(bins)])
    cells = sorted(counts.ravel() / 50, reverse=True)
    for mass, level in zip((0.5, 0.9), levels):
        held, k = 0.0, 0
        while held + 1e-12 < mass:
            held += cells[k]
            k += 1
        assert level == pytest.approx(cells[k - 1])


def _rows(n_trials=3, n_queries=5, seed=0):
    gen = np.random.default_rng(seed)
    rows = []
    for scheme in ("KV", "KQV"):
        for trial in range(n_trials):
            k_phi, v_phi = gen.uniform(0.1, 0.3, 2)
            for q in range(n_queries):
                rows.append({"distribution": "g", "dim": 64, "budget": 4, "sharpness": 1.0, "scheme": scheme,
                             "trial": trial, "k_phi": k_phi, "k_eff_bits": 3 + k_phi, "v_phi": v_phi,
                             "v_eff_bits": 2 + v_phi, "t_phi": gen.uniform(0.1, 0.5),
                             "t_eff_bits": gen.uniform(1, 4)})
    return pd.DataFrame(rows)


def test_shannon_phi_summary_per_query_and_per_trial():
    """T: quartiles over every query (degrees); K, V: over one point per trial (their per-trial
    errors repeat on each query row); dense above density_points, with a grid and its levels."""
    pq = _rows()
    summary, density = display.shannon_phi_summary(pq, density_points=10)
    assert tuple(summary.columns) == display.PHI_SUMMARY_COLUMNS
    assert tuple(density.columns) == display.PHI_DENSITY_COLUMNS
    for scheme in ("KV", "KQV"):
        g = pq[pq["scheme"] == scheme]
        t = summary[(summary["site"] == "t") & (summary["scheme"] == scheme)].iloc[0]
        assert t["n_points"] == 15 and bool(t["dense"])
        assert [t["phi_q25"], t["phi_q50"], t["phi_q75"]] == pytest.approx(
            [_percentile_linear(np.degrees(g["t_phi"].to_numpy()), p) for p in (25, 50, 75)], rel=1e-13)
        assert [t["bits_q25"], t["bits_q50"], t["bits_q75"]] == pytest.approx(
            [_percentile_linear(g["t_eff_bits"].to_numpy(), p) for p in (25, 50, 75)], rel=1e-13)
        k = summary[(summary["site"] == "k") & (summary["scheme"] == scheme)].iloc[0]
        per_trial = g.groupby("trial")["k_phi"].first().to_numpy()
        assert k["n_points"] == 3 and not bool(k["dense"]) and math.isnan(k["level_50"])
        assert k["phi_q50"] == pytest.approx(np.degrees(np.median(per_trial)), rel=1e-13)
        grid = density[(density["site"] == "t") & (density["scheme"] == scheme)]
        assert len(grid) == display.DENSITY_BINS ** 2 and grid["density"].sum() <= 1.0 + 1e-12
        _, _, dens, levels = display.density_levels(np.degrees(g["t_phi"].to_numpy()), g["t_eff_bits"].to_numpy())
        assert grid["density"].to_numpy() == pytest.approx(dens.ravel(), rel=0, abs=0)  # iy-major, bit for bit
        assert [t["level_50"], t["level_90"]] == levels
    assert set(density["site"]) == {"t"}
    # a missing column is named
    with pytest.raises(KvasymError, match="lack column.*t_eff_bits"):
        display.shannon_phi_summary(pq.drop(columns=["t_eff_bits"]))


def test_display_columns_are_the_artifacts_schemas():
    from kvasym.artifacts import ARTIFACTS

    for name, columns in (("phi_summary", display.PHI_SUMMARY_COLUMNS), ("phi_density", display.PHI_DENSITY_COLUMNS),
                          ("jensen_bins", display.JENSEN_BIN_COLUMNS)):
        assert ARTIFACTS[name].columns() == columns and ARTIFACTS[name].writers == ("gather",)
