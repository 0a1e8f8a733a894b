"""The rate-distortion frontier (kvasym.frontier), its equal-rate claim and its config key.

References: the Pareto set against the brute-force definition (every pair compared); the
log-linear interpolation against a geometric distortion it must reproduce exactly; the measured
rate against a hand count of a packed cache's bits; the frontier table against a brute-force
search of the allowance; the claim's ratio against the means it is a ratio of.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvasym.errors import KvasymError
from kvasym.frontier import (
    best_per_budget,
    equal_rate_pairs,
    frontier_points,
    interpolate_at_rate,
    pareto_mask,
    total_bits,
)


def brute_pareto(rate: np.ndarray, loss: np.ndarray) -> np.ndarray:
    n = rate.size
    out = np.ones(n, dtype=bool)
    for i in range(n):
        for j in range(n):
            if (rate[j] <= rate[i] and loss[j] <= loss[i]) and (rate[j] < rate[i] or loss[j] < loss[i]):
                out[i] = False
                break
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), min_size=1, max_size=25))
def test_pareto_mask_equals_brute_force_with_ties(points: list[tuple[int, int]]) -> None:
    # small integer grids force ties in rate, in loss and exact duplicates
    rate = np.array([p[0] for p in points], dtype=float) / 2
    loss = np.array([p[1] for p in points], dtype=float) / 3
    assert np.array_equal(pareto_mask(rate, loss), brute_pareto(rate, loss))


def test_pareto_mask_continuous_and_errors() -> None:
    rng = np.random.default_rng(3)
    rate, loss = rng.random(200), rng.random(200)
    mask = pareto_mask(rate, loss)
    assert np.array_equal(mask, brute_pareto(rate, loss))
    # the frontier is a staircase: sorted by rate, its losses strictly fall
    order = np.argsort(rate[mask])
    assert np.all(np.diff(loss[mask][order]) < 0)
    with pytest.raises(KvasymError, match="finite"):
        pareto_mask([1.0, np.nan], [1.0, 2.0])
    with pytest.raises(KvasymError, match="1-D"):
        pareto_mask([1.0, 2.0], [1.0])


def test_interpolation_reproduces_a_geometric_distortion_and_never_extrapolates() -> None:
    rates = np.array([2.3, 3.3, 4.3])
    values = 0.7 * 4.0 ** (-rates)  # log-linear in the rate: interpolation is exact
    at = np.array([2.3, 2.8, 3.9, 4.3])
    assert np.allclose(interpolate_at_rate(rates, values, at), 0.7 * 4.0 ** (-at), rtol=1e-12)
    assert np.isnan(interpolate_at_rate(rates, values, [2.29, 4.31])).all()
    # linear mode: the straight line between neighbours
    assert interpolate_at_rate([1.0, 3.0], [0.2, 0.6], 2.5, log=False) == pytest.approx(0.5)
    with pytest.raises(KvasymError, match="distinct"):
        interpolate_at_rate([1.0, 1.0], [0.2, 0.3], 1.0)
    with pytest.raises(KvasymError, match="positive"):
        interpolate_at_rate([1.0, 2.0], [0.0, 0.3], 1.5)


def test_total_bits_is_the_hand_count_of_a_packed_centred_cache() -> None:
    from kvasym.cache import SEED_BITS, quantize
    from kvasym.schemes import get_scheme

    rows, dim, n = 96, 32, 3
    x = np.random.default_rng(0).standard_normal((rows, dim))
    parts = {}
    for side in ("K", "V"):
        cache = quantize(x, get_scheme("CRKV").side(side), n, rotation_seed=1, qjl_seed=2)
        parts[side] = cache.bits_per_coordinate()
    # payload n bits per coordinate; side: one float32 norm per row, the float32 mean once, one seed
    hand = (n * rows * dim + 32 * rows + 32 * dim + SEED_BITS) / (rows * dim)
    got = total_bits(parts["K"]["payload"], parts["K"]["side"], parts["V"]["payload"], parts["V"]["side"])
    assert got == pytest.approx(hand, rel=1e-12)


def _per_query(rng: np.random.Generator) -> pd.DataFrame:
    """A per-query table: 3 schemes x 3 budgets, 4 trials x 50 queries, bits growing with n."""
    rows = []
    side = {"A": 0.1, "B": 0.6, "C": 1.4}
    for scheme, s in side.items():
        for budget in (2, 3, 4):
            for trial in range(4):
                kl = rng.gamma(2.0, 0.01 * 4.0 ** (-budget) * (1 + s), size=50)
                rows.append(pd.DataFrame({
                    "distribution": "g", "dim": 64, "sharpness": 1.0, "scheme": scheme, "budget": budget,
                    "trial": trial, "query": np.arange(50), "kl": kl, "recall_top5": rng.random(50),
                    "t_eps_dir": rng.random(50) * 4.0 ** (-budget),
                    "k_bits_payload": float(budget), "k_bits_side": s, "v_bits_payload": float(budget),
                    "v_bits_side": s + 0.1 * trial}))
    return pd.concat(rows, ignore_index=True)


def test_frontier_points_against_direct_computation() -> None:
    frame = _per_query(np.random.default_rng(5))
    points = frontier_points(frame)
    assert len(points) == 9
    one = points[(points["scheme"] == "B") & (points["budget"] == 3)].iloc[0]
    cell = frame[(frame["scheme"] == "B") & (frame["budget"] == 3)]
    assert one["kl_p99"] == pytest.approx(np.quantile(cell["kl"], 0.99))
    assert one["kl_mean"] == pytest.approx(cell["kl"].mean())
    # rate: (3 + 0.6 + 3 + 0.6 + 0.1 t) / 2 averaged over trials t = 0..3
    assert one["bits_total"] == pytest.approx((6 + 1.2 + 0.15) / 2)
    for name, higher in (("kl_mean", False), ("recall_mean", True), ("t_eps_dir_mean", False)):
        loss = -points[name].to_numpy() if higher else points[name].to_numpy()
        assert np.array_equal(points[f"pareto_{name}"].to_numpy(),
                              brute_pareto(points["bits_total"].to_numpy(), loss))


def test_best_per_budget_is_the_brute_force_best_within_the_allowance() -> None:
    points = frontier_points(_per_query(np.random.default_rng(6)))
    table = best_per_budget(points, [2, 3, 4], distortion="kl_mean", slack=0.5)
    for _, row in table.iterrows():
        fit = points[points["bits_total"] <= row["budget"] + 0.5]
        if fit.empty:
            assert row["scheme"] == ""
            continue
        best = fit.loc[fit["kl_mean"].idxmin()]
        assert (row["scheme"], row["scheme_budget"]) == (best["scheme"], best["budget"])
        assert row["value"] == pytest.approx(best["kl_mean"])
    high = best_per_budget(points, [4], distortion="recall_mean")
    fit = points[points["bits_total"] <= 4.5]
    assert high["value"].iloc[0] == pytest.approx(fit["recall_mean"].max())


def _units(a_rates: list[float], a_kl: list[float], b_rate: float, b_kl: float, n_units: int = 5,
           jitter: float = 0.0) -> pd.DataFrame:
    rows = []
    for u in range(n_units):
        scale = 1.0 + 0.1 * u
        for budget, (r, v) in enumerate(zip(a_rates, a_kl), start=3):
            rows.append({"distribution": "g", "dim": 64, "sharpness": 1.0, "scheme": "A", "budget": budget,
                         "unit": f"u{u}", "bits_total": r, "kl": v * scale, "recall_top5": 0.5, "t_eps_dir": 0.1})
        rows.append({"distribution": "g", "dim": 64, "sharpness": 1.0, "scheme": "B", "budget": 4, "unit": f"u{u}",
                     "bits_total": b_rate, "kl": b_kl * scale * (1 + jitter * (u % 2)), "recall_top5": 0.5,
                     "t_eps_dir": 0.1})
    return pd.DataFrame(rows)


def test_equal_rate_pairs_interpolate_the_moving_scheme_at_the_fixed_rate() -> None:
    units = _units([4.0, 5.0], [0.2, 0.05], 4.5, 0.15)
    pairs = equal_rate_pairs(units, a="A", b="B", budget=4, fixed="b")
    # geometric mean of the bracketing points: sqrt(0.2 * 0.05) = 0.1 (times the unit's scale)
    scale = 1.0 + 0.1 * np.arange(5)
    assert np.allclose(pairs["a"], 0.1 * scale) and np.allclose(pairs["b"], 0.15 * scale)
    outside = equal_rate_pairs(_units([4.6, 5.6], [0.2, 0.05], 4.5, 0.15), a="A", b="B", budget=4, fixed="b")
    assert outside["a"].isna().all()


def test_equal_rate_claim_estimate_and_not_evaluated_outside_the_range() -> None:
    from kvasym.claims import Tables, evaluate_claims

    empty = pd.DataFrame()
    claim = {"id": "X", "statement": "s", "statistic": "equal_rate_ratio", "holds_if": {"op": "<", "value": 1.0},
             "where": {"distribution": "g", "dim": 64, "sharpness": 1.0, "a": "A", "b": "B", "budget": 4,
                       "fixed": "b"}}
    units = _units([4.0, 5.0], [0.2, 0.05], 4.5, 0.15)
    tables = Tables(empty, empty, empty, empty, n_boot=100, frontier_units=units)
    [result] = evaluate_claims([claim], tables)
    assert result["estimate"] == pytest.approx(0.1 / 0.15)
    # every unit's ratio exactly 2/3: a zero-width interval cannot decide (kvasym.claims.Measurement)
    assert result["verdict"] == "inconclusive"
    tables.frontier_units = _units([4.0, 5.0], [0.2, 0.05], 4.5, 0.15, jitter=0.1)
    [result] = evaluate_claims([claim], tables)
    pairs = equal_rate_pairs(tables.frontier_units, a="A", b="B", budget=4, fixed="b")
    assert result["estimate"] == pytest.approx(pairs["a"].mean() / pairs["b"].mean())
    assert result["low"] < result["estimate"] < result["high"] < 1.0
    assert result["verdict"] == "holds"
    tables.frontier_units = _units([4.6, 5.6], [0.2, 0.05], 4.5, 0.15)
    [result] = evaluate_claims([claim], tables)
    assert result["verdict"] == "not evaluated" and "no extrapolation" in result["reason"]
    tables.frontier_units = None
    [result] = evaluate_claims([claim], tables)
    assert result["verdict"] == "not evaluated" and "frontier.schemes" in result["reason"]


def test_frontier_config_key_is_checked() -> None:
    import yaml

    from kvasym.study import load_study

    from pathlib import Path

    tiny = yaml.safe_load((Path(__file__).resolve().parents[1] / "config/test.yaml").read_text())
    study = load_study(tiny)
    assert list(study.frontier_schemes) and set(study.frontier_distributions) <= set(study.distributions)
    cells = list(study.frontier_cells())
    # the frontier schemes at every budget, and RKV's extra n = 5 on every frontier cell
    assert study.frontier_extra_budgets == {"RKV": (5,)}
    assert len(cells) == sum(len(study.budgets) * len(study.frontier_schemes_on(dist)) + 1
                             for dist, _ in study.frontier_data_cells())
    assert {c for c in cells if c[2] == "RKV"} == {(d, n, "RKV", 5) for d, n in study.frontier_data_cells()}
    assert study.cell_slice(*cells[0])["scheme"]["name"] == cells[0][2]
    for bad, message in (({"schemes": ["KQV"]}, "already in schemes"), ({"schemes": ["NOPE"]}, "not a known"),
                         ({"schemes": ["SKLT"], "distributions": ["nope"]}, "frontier.distributions")):
        with pytest.raises(KvasymError, match=message):
            load_study({**tiny, "frontier": bad})
    assert not load_study({k: v for k, v in tiny.items() if k != "frontier"}).frontier_schemes
    assert math.isfinite(total_bits(1, 2, 3, 4)) and total_bits(1, 2, 3, 4) == 5.0


def test_frontier_table_names_the_brute_force_best_scheme() -> None:
    from kvasym.render.table_frontier import frontier_context
    from kvasym.render.tables import render_template

    points = frontier_points(_per_query(np.random.default_rng(7)))
    context = frontier_context(points, {"dim": 64, "sharpness": 1.0})
    text = render_template("table_frontier.tex.j2", **context)
    assert "\\begin{longtable}" in text and "\\label{tab:frontier}" in text and "\\kvfigure{frontier_kl}" in text
    [group] = context["groups"]
    for row in group["rows"]:
        fit = points[points["bits_total"] <= row["budget"] + 0.5]
        entry = row["entries"][0]  # mean KL
        if fit.empty:
            assert entry["scheme"] == ""
        else:
            assert entry["scheme"] == fit.loc[fit["kl_mean"].idxmin(), "scheme"]
    # the side-bit ledger: scheme C's measured side bits, (1.4 + 1.4 + 0.1 t) / 2 over t = 0..3
    side = {e["scheme"]: e["side"] for e in context["ledger"]}
    assert side["C"] == pytest.approx((2.8 + 0.15) / 2)
    empty = render_template("table_frontier.tex.j2", **frontier_context(None, {"dim": 64, "sharpness": 1.0}))
    assert "frontier.schemes" in empty and "\\label{fig:frontier_kl}" in empty


def test_frontier_figure_draws_every_scheme_and_rings_the_pareto_points() -> None:
    from kvasym.render.figures.frontier import FRONTIER_FIGURES, frontier_figure

    points = frontier_points(_per_query(np.random.default_rng(8)))
    for name, (column, _, _) in FRONTIER_FIGURES.items():
        fig = frontier_figure(points, name, sharpness=1.0)
        [ax] = [a for a in fig.axes if a.get_visible()]
        gids = {line.get_gid() for line in ax.get_lines()}
        assert {"scheme=A", "scheme=B", "scheme=C"} <= gids
        rings = [line for line in ax.get_lines() if line.get_gid() is None]
        assert sum(len(line.get_xdata()) for line in rings) == int(points[f"pareto_{column}"].sum())
    assert "nothing to show" in frontier_figure(None, "frontier_kl", sharpness=1.0)._suptitle.get_text()
    # a scheme whose side bits put it far right of the budgets is named, not drawn
    far = points[points["scheme"] == "C"].assign(scheme="FAR", bits_total=lambda f: f["bits_total"] + 20.0)
    fig = frontier_figure(pd.concat([points, far], ignore_index=True), "frontier_kl", sharpness=1.0)
    [ax] = [a for a in fig.axes if a.get_visible()]
    assert "scheme=FAR" not in {line.get_gid() for line in ax.get_lines()}
    assert any("beyond the axis: FAR at" in t.get_text() for t in ax.texts)


def test_frontier_figure_draws_each_kind_of_side_information_in_its_line_style() -> None:
    """Issue 50, point 7: the 18 schemes of a frontier panel are told apart by kind in greyscale
    too: the rotation-and-codebook schemes solid, per-group scales dashed, bases and allocations
    dotted (e2e.pareto_group), in the panel and in the legend, listed group by group."""
    from kvasym.render.figures.frontier import frontier_figure

    points = frontier_points(_per_query(np.random.default_rng(8)))
    named = {"A": "RKV", "B": "KIVI128", "C": "SKLT"}
    points = points.assign(scheme=points["scheme"].map(named))
    fig = frontier_figure(points, "frontier_kl", sharpness=1.0)
    [ax] = [a for a in fig.axes if a.get_visible()]
    style = {line.get_gid(): line.get_linestyle() for line in ax.get_lines() if line.get_gid()}
    assert style == {"scheme=RKV": "-", "scheme=KIVI128": "--", "scheme=SKLT": ":"}
    [legend] = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["RKV", "KIVI128", "SKLT"]
    assert [h.get_linestyle() for h in legend.legend_handles] == ["-", "--", ":"]
    assert "dashed: per-group scales" in fig._suptitle.get_text()
    one_kind = frontier_figure(points[points["scheme"] == "RKV"], "frontier_kl", sharpness=1.0)
    assert "dashed" not in one_kind._suptitle.get_text()


def test_frontier_stage_reads_files_and_pools_real_trials_by_text(tmp_path) -> None:
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from kvasym.stages.frontier import run_frontier

    frame = _per_query(np.random.default_rng(9))
    paths = []
    for (scheme, budget), g in frame.groupby(["scheme", "budget"]):
        table = pa.Table.from_pandas(g, preserve_index=False)
        # a real-cache file: trials 0, 1 are one text, 2, 3 another
        trial_map = [{"trial": t, "text": "alpha" if t < 2 else "beta"} for t in range(4)]
        table = table.replace_schema_metadata({b"trial_map": json.dumps(trial_map).encode()})
        path = tmp_path / "g" / "d64" / scheme / f"n{budget}.parquet"  # the results layout: its cell
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)
        paths.append(path)
    run_frontier({"schemes": ["A", "B", "C"]}, paths, tmp_path / "points.parquet", tmp_path / "units.parquet")
    points, units = pd.read_parquet(tmp_path / "points.parquet"), pd.read_parquet(tmp_path / "units.parquet")
    assert len(points) == 9 and points["pareto_kl_mean"].any()
    assert sorted(units["unit"].unique()) == ["alpha", "beta"]
    one = units[(units["scheme"] == "A") & (units["budget"] == 2) & (units["unit"] == "beta")].iloc[0]
    rows = frame[(frame["scheme"] == "A") & (frame["budget"] == 2) & (frame["trial"] >= 2)]
    assert one["kl"] == pytest.approx(rows["kl"].mean())
    with pytest.raises(KvasymError, match="not in the frontier's schemes"):
        run_frontier({"schemes": ["A"]}, paths, tmp_path / "p.parquet", tmp_path / "u.parquet")


def _cell_units(distribution: str, a_values: float, n_units: int = 12) -> list[dict]:
    """One cell's units: A (the fixed scheme) at budgets 2, 3 (rates 2.4, 3.4), B at budgets 2, 3
    (rates 2.25, 3.25: A's n = 3 rate lies beyond B's measured rates)."""
    rows = []
    for u in range(n_units):
        scale = 1.0 + 0.05 * u
        for scheme, rates, values in (("A", (2.4, 3.4), (a_values, a_values / 2)), ("B", (2.25, 3.25), (0.3, 0.2))):
            for budget, rate, value in zip((2, 3), rates, values):
                rows.append({"distribution": distribution, "dim": 64, "sharpness": 1.0, "scheme": scheme,
                             "budget": budget, "unit": f"u{u}", "bits_total": rate, "kl": 0.1,
                             "recall_top5": 0.5, "t_eps_dir": value * scale * (1 + 0.01 * (u % 3))})
    return rows


def test_equal_rate_cells_counts_cells_against_brute_force_and_never_extrapolates() -> None:
    """Issue 14, point 8: C10's every-cell comparison at equal total bits. Cell g: A clearly
    better than B interpolated to A's rate; cell h: clearly worse; both n = 3 cells lie beyond
    B's rates (not evaluated, named); the real cache's rows are left to their own claims."""
    from kvasym.claims import Tables, evaluate_claims
    from kvasym.stats import holm_log10, wilcoxon_paired

    units = pd.DataFrame(_cell_units("g", 0.1) + _cell_units("h", 0.5) + _cell_units("smollm2", 0.5))
    empty = pd.DataFrame()
    claim = {"id": "X", "statement": "s", "statistic": "equal_rate_cells", "holds_if": {"op": "all"},
             "where": {"sharpness": 1.0, "a": "A", "b": "B", "metric": "t_eps_dir", "fixed": "a", "alpha": 0.05}}
    [result] = evaluate_claims([claim], Tables(empty, empty, empty, empty, n_boot=100, frontier_units=units))
    details = result["details"]
    assert (details["n_cells"], details["n_a_significantly_better"], details["n_b_significantly_better"]) == (2, 1, 1)
    assert details["cells_where_b_better"] == ["h d64 n2 s1"]
    assert details["cells_not_evaluated"] == ["g d64 n3 s1", "h d64 n3 s1"]
    assert result["verdict"] == "does not hold" and "2 cells not evaluated" in result["reason"]
    # the brute force: B at A's rate 2.4, log-linear between B's (2.25, 0.3 s) and (3.25, 0.2 s) per unit
    weight = (2.4 - 2.25) / (3.25 - 2.25)
    log10_p = []
    for name, a_value in (("g", 0.1), ("h", 0.5)):
        cell = units[(units["distribution"] == name) & (units["budget"] == 2)]
        by_unit = cell.sort_values("unit", key=lambda s: s.str[1:].astype(int))
        a = by_unit[by_unit["scheme"] == "A"]["t_eps_dir"].to_numpy()
        b_lo = by_unit[by_unit["scheme"] == "B"]["t_eps_dir"].to_numpy()
        b = np.exp((1 - weight) * np.log(b_lo) + weight * np.log(b_lo * 0.2 / 0.3))
        log10_p.append(wilcoxon_paired(a, b)["log10_p"])
    assert details["holm_family_size"] == 2 and max(holm_log10(np.array(log10_p))) < math.log10(0.05)
    # with only the better cell the claim holds, the not-evaluated cell still named
    [result] = evaluate_claims([{**claim, "where": {**claim["where"], "distributions": ["g"]}}],
                               Tables(empty, empty, empty, empty, n_boot=100, frontier_units=units))
    assert result["verdict"] == "holds" and result["details"]["cells_not_evaluated"] == ["g d64 n3 s1"]
    # no evaluable cell at all: not evaluated, never a count over nothing
    [result] = evaluate_claims([{**claim, "where": {**claim["where"], "budgets": [3]}}],
                               Tables(empty, empty, empty, empty, n_boot=100, frontier_units=units))
    assert result["verdict"] == "not evaluated" and "outside the measured rates" in result["reason"]


def test_equal_rate_cells_orients_recall_as_higher_is_better() -> None:
    from kvasym.claims import Tables, evaluate_claims

    units = pd.DataFrame(_cell_units("g", 0.1))
    scale = 1.0 + 0.01 * units["unit"].str[1:].astype(int)
    units["recall_top5"] = np.where(units["scheme"] == "A", 0.9, 0.5) * scale  # A recalls more
    empty = pd.DataFrame()
    claim = {"id": "X", "statement": "s", "statistic": "equal_rate_cells", "holds_if": {"op": "all"},
             "where": {"sharpness": 1.0, "a": "A", "b": "B", "metric": "recall_top5", "fixed": "a", "alpha": 0.05}}
    [result] = evaluate_claims([claim], Tables(empty, empty, empty, empty, n_boot=100, frontier_units=units))
    assert result["verdict"] == "holds" and result["details"]["n_a_significantly_better"] == 1
    [result] = evaluate_claims([{**claim, "where": {**claim["where"], "a": "B", "b": "A", "fixed": "b"}}],
                               Tables(empty, empty, empty, empty, n_boot=100, frontier_units=units))
    assert result["verdict"] == "does not hold" and result["details"]["n_b_significantly_better"] == 1


def _extra_units(with_n5: bool, n_units: int = 12) -> pd.DataFrame:
    """Issue 31, point 7: one cell where A (KQV's part: the fixed scheme) spends 0.15 bit per
    coordinate more than B (RKV's) at each budget, so A's n = 4 rate 4.4 lies beyond B's grid
    rates (4.25 at most); B's extra point n = 5 at 5.25 (``extra_budget``) brackets it."""
    rows = []
    for u in range(n_units):
        scale = 1.0 + 0.05 * u
        points = [("A", b, b + 0.4, 0.5 * 2.0 ** -b * scale * (1 + 0.01 * (u % 3)), False) for b in (2, 3, 4)]
        points += [("B", b, b + 0.25, 2.0 ** -b * scale, False) for b in (2, 3, 4)]
        if with_n5:
            points.append(("B", 5, 5.25, 2.0 ** -5 * scale, True))
        for scheme, budget, rate, value, extra in points:
            rows.append({"distribution": "g", "dim": 64, "sharpness": 1.0, "scheme": scheme, "budget": budget,
                         "unit": f"u{u}", "bits_total": rate, "kl": value, "recall_top5": 0.5, "t_eps_dir": value,
                         "extra_budget": extra})
    return pd.DataFrame(rows)


def test_equal_rate_cells_evaluate_n4_with_an_extra_point_and_keep_the_grid_budgets_as_cells() -> None:
    """Issue 31, point 7: with B's extra point at n = 5, C10ta's n = 4 cell (A fixed at 4.4
    bits, B interpolated) is evaluated, at the hand-computed log-linear value between B's n = 4
    (4.25) and n = 5 (5.25) points; the n = 2 and n = 3 cells are what they were without it.
    With B as the fixed scheme its cells are the grid's budgets, not its extra n = 5, unless
    the claim names n = 5. Single-cell claims at a named budget do not move (C10t, C16g)."""
    from kvasym.claims import Tables, evaluate_claims
    from kvasym.stats import wilcoxon_paired

    empty = pd.DataFrame()
    claim = {"id": "X", "statement": "s", "statistic": "equal_rate_cells", "holds_if": {"op": "all"},
             "where": {"sharpness": 1.0, "a": "A", "b": "B", "metric": "t_eps_dir", "fixed": "a", "alpha": 0.05}}
    results = {}
    for with_n5 in (False, True):
        tables = Tables(empty, empty, empty, empty, n_boot=100, frontier_units=_extra_units(with_n5))
        [results[with_n5]] = evaluate_claims([claim], tables)
    before, after = results[False]["details"], results[True]["details"]
    assert before["cells_not_evaluated"] == ["g d64 n4 s1"] and before["n_cells"] == 2
    assert after["cells_not_evaluated"] == [] and after["n_cells"] == 3 and after["holm_family_size"] == 3
    # A is half of B at the same budget, so better than B interpolated up to A's larger rate: every cell
    assert after["n_a_significantly_better"] == 3 and results[True]["verdict"] == "holds"
    # the n = 4 pairs by hand: w = (4.4 - 4.25) / (5.25 - 4.25) = 0.15; B(4.4) = B4^(1 - w) B5^w
    units = _extra_units(True)
    pairs = equal_rate_pairs(units, a="A", b="B", budget=4, metric="t_eps_dir", fixed="a")
    scale = 1.0 + 0.05 * np.array([int(u[1:]) for u in pairs["unit"]])
    b_hand = np.exp(0.85 * np.log(2.0 ** -4 * scale) + 0.15 * np.log(2.0 ** -5 * scale))
    assert np.allclose(pairs["b"], b_hand, rtol=1e-12) and np.allclose(pairs["rate"], 4.4)
    assert b_hand == pytest.approx(2.0 ** -4.15 * scale, rel=1e-12)  # log-linear: the exponent is linear
    a_hand = 0.5 * 2.0 ** -4 * scale * (1 + 0.01 * (np.array([int(u[1:]) for u in pairs["unit"]]) % 3))
    assert np.allclose(pairs["a"], a_hand, rtol=1e-12)
    assert wilcoxon_paired(pairs["a"].to_numpy(), pairs["b"].to_numpy())["log10_p"] < math.log10(0.05 / 3)
    # the n = 2 and 3 pairs do not see the n = 5 point (it brackets no rate below 4.25)
    for budget in (2, 3):
        pd.testing.assert_frame_equal(
            equal_rate_pairs(_extra_units(False), a="A", b="B", budget=budget, metric="t_eps_dir", fixed="a"),
            equal_rate_pairs(units, a="A", b="B", budget=budget, metric="t_eps_dir", fixed="a"))
    # B fixed: its cells are the grid's n = 2, 3, 4 (A cannot reach B's n = 2 rate 2.25: named),
    # never its extra n = 5, unless the claim names it
    swapped = {**claim, "where": {**claim["where"], "a": "B", "b": "A", "fixed": "a"}}
    [result] = evaluate_claims([swapped], Tables(empty, empty, empty, empty, n_boot=100, frontier_units=units))
    assert result["details"]["cells_not_evaluated"] == ["g d64 n2 s1"] and result["details"]["n_cells"] == 2
    named = {**swapped, "where": {**swapped["where"], "budgets": [5]}}
    [result] = evaluate_claims([named], Tables(empty, empty, empty, empty, n_boot=100, frontier_units=units))
    assert result["verdict"] == "not evaluated" and "g d64 n5 s1" in result["reason"]
    # single-cell claims at a named budget: the same numbers with and without the extra point
    for where in ({"a": "A", "b": "B", "budget": 3, "fixed": "a"}, {"a": "A", "b": "B", "budget": 4, "fixed": "b"}):
        one = {"id": "Y", "statement": "s", "statistic": "equal_rate_ratio", "holds_if": {"op": "<", "value": 1.0},
               "where": {"distribution": "g", "dim": 64, "sharpness": 1.0, "metric": "t_eps_dir", **where}}
        without, with_n5 = (evaluate_claims([one], Tables(empty, empty, empty, empty, n_boot=100,
                                                          frontier_units=_extra_units(n5)))[0] for n5 in (False, True))
        assert [without[k] for k in ("estimate", "low", "high")] == [with_n5[k] for k in ("estimate", "low", "high")]
        assert math.isfinite(with_n5["estimate"]), where


def test_frontier_stage_marks_extra_points_and_the_table_and_figure_keep_the_grid_budgets(tmp_path) -> None:
    """Issue 31, point 7: the frontier stage marks a scheme's frontier.extra_budgets points
    (``extra_budget``); the table's rows and side-bit ledger stay the grid's budgets while the
    extra point competes in every allowance it fits; the figure draws it, its axis unmoved."""
    from kvasym.render.figures.frontier import frontier_figure
    from kvasym.render.table_frontier import frontier_context
    from kvasym.render.tables import render_template
    from kvasym.stages.frontier import run_frontier

    frame = _per_query(np.random.default_rng(10))
    # B at n = 5: 5 payload bits, B's side bits
    extra = frame[(frame["scheme"] == "B") & (frame["budget"] == 4)].assign(
        budget=5, k_bits_payload=5.0, v_bits_payload=5.0, kl=lambda f: f["kl"] / 4)
    paths = []
    for (scheme, budget), g in pd.concat([frame, extra]).groupby(["scheme", "budget"]):
        path = tmp_path / "g" / "d64" / scheme / f"n{budget}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        g.to_parquet(path)
        paths.append(path)
    run_frontier({"schemes": ["A", "B", "C"], "budgets": [2, 3, 4], "extra_budgets": {"B": [5]}}, paths,
                 tmp_path / "points.parquet", tmp_path / "units.parquet")
    points, units = pd.read_parquet(tmp_path / "points.parquet"), pd.read_parquet(tmp_path / "units.parquet")
    for table in (points, units):
        marked = table[table["extra_budget"]]
        assert set(zip(marked["scheme"], marked["budget"])) == {("B", 5)}
    assert len(points) == 10
    base = frontier_context(points[~points["extra_budget"]], {"dim": 64, "sharpness": 1.0})
    context = frontier_context(points, {"dim": 64, "sharpness": 1.0})
    assert context["budgets"] == base["budgets"] == [2, 3, 4] and context["ledger"] == base["ledger"]
    [group] = context["groups"]
    assert [row["budget"] for row in group["rows"]] == [2, 3, 4]
    b5 = points[(points["scheme"] == "B") & (points["budget"] == 5)].iloc[0]
    for row in group["rows"]:  # the brute force over every point, B n = 5 included
        fit = points[points["bits_total"] <= row["budget"] + 0.5]
        best = fit.loc[fit["kl_mean"].idxmin()] if len(fit) else None
        assert row["entries"][0]["scheme"] == ("" if best is None else best["scheme"])
        assert b5["bits_total"] > row["budget"] + 0.5  # 5.6 bits: it fits no allowance of n <= 4
    assert "\\label{tab:frontier}" in render_template("table_frontier.tex.j2", **context)
    fig = frontier_figure(points, "frontier_kl", sharpness=1.0)
    [ax] = [a for a in fig.axes if a.get_visible()]
    [line] = [ln for ln in ax.get_lines() if ln.get_gid() == "scheme=B"]
    assert len(line.get_xdata()) == 4 and max(line.get_xdata()) == pytest.approx(b5["bits_total"])
    assert not ax.texts  # nothing beyond the axis: it ends 2 bits past the grid's n = 4
