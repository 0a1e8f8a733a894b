"""Statistics of the end-to-end passes (kvasym.real.endtoend_stats) and their claims, on
synthetic per-position tables whose answers are computed here independently (numpy, pandas and
scipy on the raw columns)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import norm, spearmanr, wilcoxon
from scipy.stats import t as student_t

from kvasym.claims import (
    MissingCell,
    Tables,
    stat_e2e_equal_bits,
    stat_e2e_rank_agreement,
    stat_e2e_ratio,
)
from kvasym.errors import KvasymError
from kvasym.real.endtoend import ALL_LAYERS
from kvasym.real.endtoend_stats import (
    compare_equal_bits,
    compare_schemes,
    rank_agreement,
    sensitivity,
    summarize,
    t_interval,
    unit_means,
)

SCHEMES = ["KV", "KQV", "QKQV"]
SEVERITY = {"KV": 0.30, "KQV": 0.05, "QKQV": 0.12}
#: Side bits per value of each scheme in the synthetic tables (so their rates differ at one n).
SIDE = {"KV": 0.25, "KQV": 0.5, "QKQV": 0.75}


def _frame(n_texts: int = 3, n_draws: int = 2, n_pos: int = 40, budgets=(2, 4), layers=(ALL_LAYERS,),
           seed: int = 0) -> pd.DataFrame:
    gen = np.random.default_rng(seed)
    parts = []
    for text in range(n_texts):
        nll_ref = gen.gamma(2.0, 1.5, n_pos)
        for draw in range(n_draws):
            for layer in layers:
                for scheme in SCHEMES:
                    for budget in budgets:
                        scale = SEVERITY[scheme] * (4.0 / budget) ** 2 * (1 + 0.3 * gen.random())
                        parts.append(pd.DataFrame({
                            "text": f"t{text}", "draw": draw, "position": np.arange(n_pos), "scheme": scheme,
                            "budget": budget, "rope": "post", "own": "exact", "layer": layer,
                            "nll": nll_ref + gen.normal(scale, 0.05, n_pos), "nll_ref": nll_ref,
                            "kl": gen.gamma(1.0, scale, n_pos), "top1": (gen.random(n_pos) > scale).astype(np.int8),
                            "k_bits_payload": float(budget), "k_bits_side": SIDE[scheme],
                            "v_bits_payload": float(budget), "v_bits_side": SIDE[scheme],
                        }))
    return pd.concat(parts, ignore_index=True)


def _unit_values(g: pd.DataFrame, column: str) -> np.ndarray:
    """Per (text, draw) mean of ``column`` (or of nll - nll_ref for "d"), in sorted unit order:
    computed here with plain pandas, independently of unit_means."""
    values = g["nll"] - g["nll_ref"] if column == "d" else g[column]
    return values.groupby([g["text"], g["draw"]]).mean().sort_index().to_numpy()


def _t_bounds(x: np.ndarray) -> tuple[float, float]:
    low, high = student_t.interval(0.95, x.size - 1, loc=x.mean(), scale=x.std(ddof=1) / math.sqrt(x.size))
    return float(low), float(high)


def test_t_interval_matches_scipy_and_refuses_bad_input() -> None:
    x = np.array([0.3, 0.1, 0.4, 0.15, 0.9])
    got = t_interval(x)
    assert (got["low"], got["high"]) == pytest.approx(_t_bounds(x), rel=1e-12)
    assert got["se"] == pytest.approx(float(np.std(x, ddof=1) / math.sqrt(5)))
    one = t_interval([2.0])
    assert one["estimate"] == 2.0 and math.isnan(one["low"]) and math.isnan(one["se"])
    with pytest.raises(KvasymError, match="finite"):
        t_interval([1.0, math.nan])


def test_unit_means_are_per_text_and_draw() -> None:
    frame = _frame(n_texts=2, n_draws=3)
    g = frame[(frame.scheme == "KV") & (frame.budget == 2)]
    units = unit_means(g)
    assert list(zip(units.text, units.draw)) == [(f"t{t}", d) for t in range(2) for d in range(3)]
    np.testing.assert_allclose(units["d"], _unit_values(g, "d"), rtol=1e-12)
    dp = np.exp(-g.nll) - np.exp(-g.nll_ref)
    np.testing.assert_allclose(units["dp2"], (dp * dp).groupby([g.text, g.draw]).mean().to_numpy(), rtol=1e-12)
    assert (units["n_positions"] == 40).all()


def test_summarize_against_direct_formulas() -> None:
    frame = _frame()
    out = summarize(frame)
    assert len(out) == len(SCHEMES) * 2
    for _, row in out.iterrows():
        g = frame[(frame.scheme == row.scheme) & (frame.budget == row.budget)]
        d = _unit_values(g, "d")
        assert row.ppl_ratio == pytest.approx(math.exp(d.mean()), rel=1e-12)
        # equal positions per unit: the mean of unit means is the pooled mean
        assert row.ppl == pytest.approx(math.exp(g.nll.mean()), rel=1e-9)
        assert row.ppl_ref == pytest.approx(math.exp(g.nll_ref.mean()), rel=1e-12)
        low, high = _t_bounds(d)
        assert (row.ppl_ratio_low, row.ppl_ratio_high) == pytest.approx((math.exp(low), math.exp(high)), rel=1e-12)
        assert row.ppl_ratio_se == pytest.approx(math.exp(d.mean()) * d.std(ddof=1) / math.sqrt(d.size), rel=1e-12)
        by_text = (g.nll - g.nll_ref).groupby([g.text, g.draw]).mean().groupby(level=0).mean().to_numpy()
        low_t, high_t = _t_bounds(by_text)
        assert (row.ppl_ratio_low_text, row.ppl_ratio_high_text) == pytest.approx((math.exp(low_t), math.exp(high_t)))
        kl = _unit_values(g, "kl")
        assert row.kl_mean == pytest.approx(kl.mean()) and (row.kl_mean_low, row.kl_mean_high) == pytest.approx(
            _t_bounds(kl))
        assert row.kl_p999 == pytest.approx(np.quantile(g.kl, 0.999)) and row.kl_max == g.kl.max()
        assert row.kl_p99 == pytest.approx(np.quantile(g.kl, 0.99)) and row.kl_median == pytest.approx(g.kl.median())
        # the 90th percentile by hand: linear interpolation between order statistics (Hyndman and
        # Fan's type 7, numpy's default), h = 0.9 (N - 1)
        ordered, h = np.sort(g.kl.to_numpy()), 0.9 * (len(g) - 1)
        lo = int(math.floor(h))
        assert row.kl_p90 == pytest.approx(ordered[lo] + (h - lo) * (ordered[lo + 1] - ordered[lo]))
        assert row.top1 == pytest.approx(g.top1.mean())
        dp = np.exp(-g.nll.to_numpy()) - np.exp(-g.nll_ref.to_numpy())
        assert row.rms_dp == pytest.approx(math.sqrt(np.mean(dp * dp)), rel=1e-9)
        assert row.rms_dp_low <= row.rms_dp <= row.rms_dp_high
        assert row.bits_per_coordinate == pytest.approx(row.budget + SIDE[row.scheme])
        assert row.n_units == 3 * 2 and row.n_texts == 3 and row.n_draws == 2 and row.n_positions == 3 * 2 * 40


def test_compare_schemes_ratio_and_unit_test() -> None:
    frame = _frame()
    out = compare_schemes(frame, SCHEMES)
    assert len(out) == 3 * 2  # pairs x budgets
    row = out[(out.scheme_a == "KQV") & (out.scheme_b == "QKQV") & (out.budget == 4)].iloc[0]
    a = frame[(frame.scheme == "KQV") & (frame.budget == 4)]
    b = frame[(frame.scheme == "QKQV") & (frame.budget == 4)]
    diff = _unit_values(a, "nll") - _unit_values(b, "nll")
    assert row.ppl_ratio == pytest.approx(math.exp(diff.mean()), rel=1e-12)
    low, high = _t_bounds(diff)
    assert (row.ppl_ratio_low, row.ppl_ratio_high) == pytest.approx((math.exp(low), math.exp(high)), rel=1e-12)
    assert row.ppl_ratio_high < 1.0  # KQV's shift is smaller by construction
    expected = wilcoxon(_unit_values(a, "nll"), _unit_values(b, "nll"))
    assert row.log10_p == pytest.approx(math.log10(expected.pvalue)) and row.n_units == 6
    assert row.kl_ratio == pytest.approx(math.exp(np.mean(np.log(_unit_values(a, "kl") / _unit_values(b, "kl")))))
    assert (row.bits_a, row.bits_b) == pytest.approx((4 + SIDE["KQV"], 4 + SIDE["QKQV"]))
    # the text-clustered intervals: scipy's t interval over the 3 texts' means of the 2 draws'
    # values (units are sorted by text, then draw)
    per_text = diff.reshape(3, 2).mean(axis=1)
    low_t, high_t = _t_bounds(per_text)
    assert row.n_texts == 3
    assert (row.ppl_ratio_low_text, row.ppl_ratio_high_text) == pytest.approx((math.exp(low_t), math.exp(high_t)))
    log_kl = np.log(_unit_values(a, "kl") / _unit_values(b, "kl")).reshape(3, 2).mean(axis=1)
    low_k, high_k = _t_bounds(log_kl)
    assert (row.kl_ratio_low_text, row.kl_ratio_high_text) == pytest.approx((math.exp(low_k), math.exp(high_k)))
    assert row.ppl_ratio_low_text < row.ppl_ratio_low  # 2 degrees of freedom instead of 5: wider here


def test_compare_equal_bits_interpolates_in_rate_and_never_extrapolates() -> None:
    frame = _frame(budgets=(2, 3, 4))
    out = compare_equal_bits(frame, SCHEMES)
    # KQV at n = 3 (rate 3.5) against KV interpolated between its n = 3 (3.25) and n = 4 (4.25)
    row = out[(out.scheme_a == "KQV") & (out.budget_a == 3) & (out.scheme_b == "KV")].iloc[0]
    assert row.evaluated and row.rate == pytest.approx(3.5) and (row.b_budget_low, row.b_budget_high) == (3, 4)
    w = (3.5 - 3.25) / 1.0
    kv3, kv4 = (frame[(frame.scheme == "KV") & (frame.budget == n)] for n in (3, 4))
    d_b = (1 - w) * _unit_values(kv3, "d") + w * _unit_values(kv4, "d")
    kl_b = np.exp((1 - w) * np.log(_unit_values(kv3, "kl")) + w * np.log(_unit_values(kv4, "kl")))
    kqv = frame[(frame.scheme == "KQV") & (frame.budget == 3)]
    diff = _unit_values(kqv, "d") - d_b
    assert row.ppl_ratio == pytest.approx(math.exp(diff.mean()), rel=1e-12)
    low, high = _t_bounds(diff)
    assert (row.ppl_ratio_low, row.ppl_ratio_high) == pytest.approx((math.exp(low), math.exp(high)), rel=1e-12)
    assert row.kl_ratio == pytest.approx(math.exp(np.mean(np.log(_unit_values(kqv, "kl") / kl_b))), rel=1e-12)
    assert row.log10_p == pytest.approx(math.log10(wilcoxon(_unit_values(kqv, "d"), d_b).pvalue))
    # QKQV at n = 4 spends 4.75 bits: above KV's largest measured rate (4.25): not evaluated
    above = out[(out.scheme_a == "QKQV") & (out.budget_a == 4) & (out.scheme_b == "KV")].iloc[0]
    assert not above.evaluated and math.isnan(above.ppl_ratio)
    # KV at n = 2 spends 2.25: below QKQV's smallest rate (2.75): not evaluated either
    below = out[(out.scheme_a == "KV") & (out.budget_a == 2) & (out.scheme_b == "QKQV")].iloc[0]
    assert not below.evaluated
    tables = Tables(*(pd.DataFrame(),) * 4, e2e_equal_bits=out)
    m = stat_e2e_equal_bits(tables, {"a": "KQV", "b": "KV", "budget": 3})
    assert m.estimate == pytest.approx(row.ppl_ratio) and m.details["b_budgets"] == [3, 4]
    assert stat_e2e_equal_bits(tables, {"a": "KQV", "b": "KV", "budget": 3, "measure": "kl"}).estimate == (
        pytest.approx(row.kl_ratio))
    with pytest.raises(MissingCell, match="never extrapolated"):
        stat_e2e_equal_bits(tables, {"a": "QKQV", "b": "KV", "budget": 4})
    with pytest.raises(KvasymError, match="measure"):
        stat_e2e_equal_bits(tables, {"a": "KQV", "b": "KV", "budget": 3, "measure": "nll"})


def test_sensitivity_per_layer() -> None:
    frame = _frame(layers=(0, 1), budgets=(2,))
    out = sensitivity(frame)
    assert len(out) == 2 * len(SCHEMES)
    g = frame[(frame.scheme == "KV") & (frame.layer == 1)]
    got = out[(out.scheme == "KV") & (out.layer == 1)].iloc[0]
    assert got.ppl_increase_rel == pytest.approx(math.exp((g.nll - g.nll_ref).mean()) - 1.0)


def test_rank_agreement_against_scipy() -> None:
    frame = _frame(budgets=(2, 3, 4))
    full = frame.groupby(["scheme", "budget"]).apply(lambda g: _unit_values(g, "d").mean(), include_groups=False)
    gen = np.random.default_rng(5)
    attention = pd.DataFrame({"scheme": [s for s, _ in full.index], "budget": [b for _, b in full.index],
                              "kl_mean": full.to_numpy() + gen.normal(0, 0.05, full.size)})
    out = rank_agreement(frame, attention, "post", n_boot=200, base_seed=1)
    assert out["spearman"] == pytest.approx(spearmanr(attention.kl_mean, full.to_numpy()).statistic)
    assert out["low"] <= out["spearman"] <= out["high"] and out["n_cells"] == 9 and out["n_units"] == 6
    kl = frame.groupby(["scheme", "budget"]).apply(lambda g: _unit_values(g, "kl").mean(), include_groups=False)
    by_kl = rank_agreement(frame, attention, "post", n_boot=50, base_seed=1, measure="kl")
    assert by_kl["spearman"] == pytest.approx(spearmanr(attention.kl_mean, kl.to_numpy()).statistic)
    two = rank_agreement(frame, attention, "post", n_boot=50, base_seed=1, schemes=["KV", "KQV"], scope="study")
    mask = attention.scheme.isin(["KV", "KQV"]).to_numpy()
    assert two["n_cells"] == 6 and two["scope"] == "study"
    assert two["spearman"] == pytest.approx(spearmanr(attention.kl_mean[mask], full.to_numpy()[mask]).statistic)
    # the same ranking on both sides: rho 1
    same = attention.assign(kl_mean=full.to_numpy() * 3.0)
    perfect = rank_agreement(frame, same, "post", n_boot=50, base_seed=1)
    assert perfect["spearman"] == pytest.approx(1.0)
    with pytest.raises(KvasymError, match="at least 3"):
        rank_agreement(frame, attention.iloc[:2], "post", n_boot=10, base_seed=1)
    with pytest.raises(KvasymError, match="measure"):
        rank_agreement(frame, attention, "post", n_boot=10, base_seed=1, measure="nll")


def test_rank_agreement_interval_is_a_percentile_bootstrap_of_whole_units() -> None:
    """Issue 50, point 6c: the agreement table's interval, recomputed here from the unit means
    (plain pandas) and scipy's Spearman rho of each replicate, with the function's generator:
    the units are resampled whole (never the cells, so no cell is duplicated and no tie made)
    and the estimate is the statistic of the identity resample (every unit once), so an
    estimate at the interval's end is no mismatch between the two."""
    from kvasym.seeds import rng

    frame = _frame(budgets=(2, 3, 4), seed=3)
    full = frame.groupby(["scheme", "budget"]).apply(lambda g: _unit_values(g, "d"), include_groups=False)
    gen = np.random.default_rng(9)
    attention = pd.DataFrame({"scheme": [s for s, _ in full.index], "budget": [b for _, b in full.index],
                              "kl_mean": [v.mean() for v in full] + gen.normal(0, 0.05, len(full))})
    out = rank_agreement(frame, attention, "post", n_boot=300, base_seed=4)
    values = np.stack(list(full))  # (cells, units), cells in (scheme, budget) order as the function's
    n_units = values.shape[1]
    assert out["spearman"] == pytest.approx(spearmanr(attention.kl_mean, values.mean(axis=1)).statistic, rel=1e-12)
    draws = rng(4, "e2e", "rank-agreement", "post", "ppl", "all")
    rhos = []
    for _ in range(300):
        picked = draws.integers(0, n_units, n_units)
        rhos.append(spearmanr(attention.kl_mean, values[:, picked].mean(axis=1)).statistic)
    assert (out["low"], out["high"]) == pytest.approx(tuple(np.nanquantile(rhos, [0.025, 0.975])), rel=1e-12)


def test_claim_statistics_orient_and_report_missing() -> None:
    frame = _frame()
    comparisons = compare_schemes(frame, SCHEMES)
    empty = pd.DataFrame()
    tables = Tables(empty, empty, empty, empty, e2e_comparisons=comparisons)
    forward = stat_e2e_ratio(tables, {"a": "KQV", "b": "QKQV", "budget": 4})
    backward = stat_e2e_ratio(tables, {"a": "QKQV", "b": "KQV", "budget": 4})
    assert forward.estimate == pytest.approx(1.0 / backward.estimate)
    assert forward.low == pytest.approx(1.0 / backward.high) and forward.high == pytest.approx(1.0 / backward.low)
    assert forward.log10_p == backward.log10_p and forward.interval
    assert (forward.details["bits_a"], forward.details["bits_b"]) == pytest.approx((4.5, 4.75))
    assert (backward.details["bits_a"], backward.details["bits_b"]) == pytest.approx((4.75, 4.5))
    assert forward.details["n_units"] == 6
    # the smallest p six units allow (every sign alike: 2 / 2^6), and the text-clustered interval, oriented
    assert forward.details["min_attainable_log10_p"] == pytest.approx(math.log10(2 / 2**6))
    assert forward.details["interval_text"] == pytest.approx([1.0 / x for x in backward.details["interval_text"][::-1]])
    with pytest.raises(MissingCell):
        stat_e2e_ratio(Tables(empty, empty, empty, empty), {"a": "KQV", "b": "QKQV", "budget": 4})
    with pytest.raises(MissingCell):
        stat_e2e_rank_agreement(Tables(empty, empty, empty, empty), {})
    agreement = pd.DataFrame([{"rope": "post", "measure": "kl", "scope": "all", "spearman": 0.7, "low": 0.5,
                               "high": 0.9, "n_cells": 9, "n_units": 6, "n_boot": 10}])
    with pytest.raises(MissingCell, match="scope study"):
        stat_e2e_rank_agreement(Tables(empty, empty, empty, empty, e2e_agreement=agreement), {})
    got = stat_e2e_rank_agreement(Tables(empty, empty, empty, empty, e2e_agreement=agreement),
                                  {"measure": "kl", "scope": "all"})
    # the claim's interval is Fisher's z over the 9 cells (issue 50, point 6c), by hand:
    # tanh(atanh(0.7) -+ 1.96 sqrt((1 + 0.7^2 / 2) / (9 - 3))); the table's bootstrap in the details
    half = norm.ppf(0.975) * math.sqrt((1 + 0.49 / 2) / 6)
    assert got.estimate == 0.7 and got.interval
    assert (got.low, got.high) == pytest.approx((math.tanh(math.atanh(0.7) - half), math.tanh(math.atanh(0.7) + half)),
                                                rel=1e-12)
    assert (got.details["bootstrap_low"], got.details["bootstrap_high"]) == (0.5, 0.9)


def test_e2e_figures_draw_the_tables_values() -> None:
    from kvasym.render.figures import e2e as fe

    frame = _frame(layers=(ALL_LAYERS, 0, 1), budgets=(2, 4))
    summary = summarize(frame)
    fig = fe.e2e_ppl_bits(summary, model="m")
    lines = [line for ax in fig.axes for line in ax.get_lines() if line.get_gid() == "scheme=KQV" and
             len(line.get_xdata()) == 2]
    row = summary[(summary.scheme == "KQV")].sort_values("bits_per_coordinate")
    np.testing.assert_allclose(lines[0].get_ydata(), row.ppl_ratio.to_numpy() - 1.0)
    np.testing.assert_allclose(lines[0].get_xdata(), row.bits_per_coordinate.to_numpy())
    heat = fe.e2e_layer_sensitivity(sensitivity(frame), schemes=SCHEMES, model="m")
    image = next(im for ax in heat.axes for im in ax.get_images() if im.get_gid() == "e2e_sensitivity")
    sens = sensitivity(frame)
    expected = sens[sens.budget == 2].pivot(index="layer", columns="scheme", values="kl_mean")[SCHEMES].to_numpy()
    np.testing.assert_allclose(np.asarray(image.get_array()), expected)
    assert "nothing to show" in " ".join(fe.e2e_ppl_bits(None)._suptitle.get_text().split())


def test_e2e_table_prints_the_summary_and_marks_the_best() -> None:
    from kvasym.render import tables
    from kvasym.render.table_e2e import e2e_context

    frame = _frame(layers=(ALL_LAYERS, 0, 1), budgets=(2, 4))
    summary = summarize(frame)
    context = e2e_context(summary, sensitivity(frame))
    at4 = {r["scheme"]: r for r in context["budgets"][1]["rows"]}
    row = summary[(summary.scheme == "KQV") & (summary.budget == 4)].iloc[0]
    assert at4["KQV"]["increase"] == pytest.approx(100 * (row.ppl_ratio - 1))
    assert at4["KQV"]["best"]["ppl_increase_rel"] and not at4["KV"]["best"]["ppl_increase_rel"]  # by construction
    assert [c["worst"] for c in context["layers"][0]["cells"]] == [True, False, False]  # KV hurts most
    text = tables.table_texts({"summary": pd.DataFrame(), "e2e_summary": summary,
                               "e2e_sensitivity": sensitivity(frame)}, {}, ["table_e2e"])["table_e2e"]
    assert "\\begin{longtable}" in text and "tab:e2e_layers" in text and "\\mathbf" in text
    empty = tables.table_texts({"summary": pd.DataFrame()}, {}, ["table_e2e"])["table_e2e"]
    assert "were not run in this build" in empty and "\\label{tab:e2e}" in empty


def test_schemes_that_draw_nothing_run_once_and_pair_with_every_draw() -> None:
    from kvasym.real.endtoend import draws_random_maps
    from kvasym.real.endtoend_stats import align_units
    from kvasym.schemes import get_scheme

    drawn = {name: draws_random_maps(get_scheme(name)) for name in
             ("KV", "SKLT", "KIVI32", "KIVI128", "RKV", "KQV", "QKQV", "CRKV", "HRKV", "RKV-EDEN", "KQV-H")}
    assert drawn == {"KV": False, "SKLT": False, "KIVI32": False, "KIVI128": False, "RKV": True, "KQV": True,
                     "QKQV": True, "CRKV": True, "HRKV": True, "RKV-EDEN": True, "KQV-H": True}
    frame = _frame()
    once = frame[~((frame.scheme == "KV") & (frame.draw == 1))]
    summary = summarize(once).set_index(["scheme", "budget"])
    assert summary.loc[("KV", 4), "n_units"] == 3 and summary.loc[("KV", 4), "n_draws"] == 1
    assert summary.loc[("KQV", 4), "n_units"] == 6
    row = compare_schemes(once, SCHEMES).query("scheme_a == 'KV' and scheme_b == 'KQV' and budget == 4").iloc[0]
    kv = once[(once.scheme == "KV") & (once.budget == 4)]
    kqv = once[(once.scheme == "KQV") & (once.budget == 4)]
    kv_by_text = (kv.nll - kv.nll_ref).groupby(kv.text).mean()
    kqv_units = (kqv.nll - kqv.nll_ref).groupby([kqv.text, kqv.draw]).mean()
    diff = np.array([kv_by_text[t] - kqv_units[(t, d)] for t, d in kqv_units.index])
    assert row.n_units == 6 and row.ppl_ratio == pytest.approx(math.exp(diff.mean()), rel=1e-12)
    a, b = unit_means(kqv), unit_means(kqv[kqv.text != "t0"])
    with pytest.raises(KvasymError, match="different \\(text, draw\\) units"):
        align_units([a, b], "pair")


def _long_frame(n_windows: int = 3, length: int = 1024, seed: int = 4) -> pd.DataFrame:
    """Windows whose KL grows linearly with the position (by a window-specific slope)."""
    gen = np.random.default_rng(seed)
    parts = []
    n_pos = length - 1
    for w in range(n_windows):
        slope = 1.0 + 0.2 * w
        base = gen.gamma(2.0, 1.0, n_pos)
        kl = 0.01 * (1 + slope * np.arange(n_pos) / n_pos) * gen.uniform(0.5, 1.5, n_pos)
        parts.append(pd.DataFrame({
            "text": f"pydoc/{length}/{w}", "draw": 0, "position": np.arange(n_pos), "scheme": "RKV", "budget": 4,
            "rope": "post", "own": "exact", "layer": ALL_LAYERS, "nll": base + kl, "nll_ref": base, "kl": kl,
            "top1": np.int8(1), "k_bits_payload": 4.0, "k_bits_side": 0.5, "v_bits_payload": 4.0, "v_bits_side": 0.5,
            "context": length, "window": w}))
    return pd.concat(parts, ignore_index=True)


def test_context_growth_is_the_late_over_early_ratio_per_window() -> None:
    from kvasym.claims import stat_e2e_context_growth
    from kvasym.real.endtoend_stats import context_growth, damage_by_position, summarize_long

    frame = _long_frame()
    got = context_growth(frame, "post", "RKV", 4)
    ratios = []
    for _, g in frame.groupby("text"):
        ratios.append(g.kl[g.position >= 512].mean() / g.kl[g.position < 512].mean())
    logs = np.log(ratios)
    assert got["kl_growth"] == pytest.approx(math.exp(logs.mean()), rel=1e-12)
    low, high = _t_bounds(logs)
    assert (got["kl_growth_low"], got["kl_growth_high"]) == pytest.approx((math.exp(low), math.exp(high)), rel=1e-12)
    d = [(g.nll - g.nll_ref)[g.position >= 512].mean() - (g.nll - g.nll_ref)[g.position < 512].mean()
         for _, g in frame.groupby("text")]
    assert got["ppl_growth"] == pytest.approx(math.exp(np.mean(d)), rel=1e-12)
    # a window too short for a late half beyond the first 512 positions: NaN, not a guess
    assert math.isnan(context_growth(_long_frame(length=512), "post", "RKV", 4)["kl_growth"])
    summary = summarize_long(pd.concat([frame, _long_frame(length=512)], ignore_index=True))
    assert list(summary.context) == [512, 1024] and summary.n_units.tolist() == [3, 3]
    row = summary[summary.context == 1024].iloc[0]
    assert row.kl_growth == pytest.approx(got["kl_growth"]) and row.kl_mean == pytest.approx(
        np.mean([g.kl.mean() for _, g in frame.groupby("text")]))
    m = stat_e2e_context_growth(Tables(*(pd.DataFrame(),) * 4, e2e_long_summary=summary),
                                {"scheme": "RKV", "budget": 4, "context": 1024})
    assert (m.estimate, m.low, m.high) == pytest.approx((got["kl_growth"], got["kl_growth_low"], got["kl_growth_high"]))
    with pytest.raises(MissingCell):
        stat_e2e_context_growth(Tables(*(pd.DataFrame(),) * 4, e2e_long_summary=summary),
                                {"scheme": "RKV", "budget": 4, "context": 4096})
    spans = damage_by_position(frame)
    first = spans[(spans.lo == 0)].iloc[0]
    assert first.hi == 128 and first.n_windows == 3 and first.n_positions == 3 * 128
    assert first.kl_mean == pytest.approx(np.mean([g.kl[g.position < 128].mean() for _, g in frame.groupby("text")]))
    last = spans.iloc[-1]
    assert (last.lo, last.hi) == (512, 1023)
    with pytest.raises(KvasymError, match="edges must increase"):
        damage_by_position(frame, edges=(0, 0))


def test_compare_long_pairs_every_scheme_with_rkv_window_by_window() -> None:
    """compare_long: per window length, the geometric mean over the windows of each scheme's mean
    KL over RKV's (t interval of the logs), computed here window by window from the frame."""
    from kvasym.real.endtoend_stats import compare_long

    rkv = _long_frame()
    other = _long_frame(seed=9)
    other["scheme"], other["kl"] = "QWF+W", other["kl"] * 0.5
    short = _long_frame(length=512).assign(scheme="KIVI128")  # no RKV at 512: no row there
    frame = pd.concat([rkv, other, short], ignore_index=True)
    got = compare_long(frame)
    assert list(got["context"]) == [1024] and list(got["scheme_a"]) == ["QWF+W"] and list(got["scheme_b"]) == ["RKV"]
    logs = np.array([np.log(other[other.text == w].kl.mean() / rkv[rkv.text == w].kl.mean())
                     for w in sorted(rkv.text.unique())])
    row = got.iloc[0]
    assert row.kl_ratio == pytest.approx(math.exp(logs.mean()), rel=1e-12)
    low, high = _t_bounds(logs)
    assert (row.kl_ratio_low, row.kl_ratio_high) == pytest.approx((math.exp(low), math.exp(high)), rel=1e-12)
    assert row.n_units == 3 and row.budget == 4
    assert compare_long(short).empty  # the reference absent everywhere


def test_pareto_front_by_brute_force():
    """pareto_front against a direct double loop on random costs and damages with ties: a post
    row is on the front iff no other post row is no worse in both and better in one; pre rows
    never are; and a practitioner's table lists the front in increasing cost."""
    from kvasym.real.endtoend_stats import pareto_front
    from kvasym.render.table_practice import practice_context

    rng = np.random.default_rng(5)
    for _ in range(20):
        n = 12
        frame = pd.DataFrame({"rope": rng.choice(["post", "pre"], n), "scheme": [f"S{i}" for i in range(n)],
                              "budget": 2, "cache_bytes_per_token": rng.integers(1, 6, n).astype(float),
                              "kl_mean": rng.integers(1, 6, n) / 10.0})
        got = pareto_front(frame)["pareto"].tolist()
        expected = []
        for i, a in frame.iterrows():
            dominated = any(b.rope == "post" and b.cache_bytes_per_token <= a.cache_bytes_per_token
                            and b.kl_mean <= a.kl_mean and (b.cache_bytes_per_token < a.cache_bytes_per_token
                                                            or b.kl_mean < a.kl_mean)
                            for j, b in frame.iterrows() if j != i)
            expected.append(a.rope == "post" and not dominated)
        assert got == expected
    marked = pareto_front(pd.DataFrame({"rope": "post", "scheme": ["A", "B", "C"], "budget": [2, 3, 4],
                                        "cache_bytes_per_token": [3.0, 1.0, 2.0], "kl_mean": [0.1, 0.5, 0.6]}))
    assert marked["pareto"].tolist() == [True, True, False]  # C: B is smaller, A less damaging, neither both
    with pytest.raises(KvasymError, match=r"lacks column\(s\) \['kl_mean'\]"):
        pareto_front(marked.drop(columns="kl_mean"))
    columns = {"memory_tokens": 4096, "cache_bits_per_value": 3.0, "cache_mb": 1.0, "fp16_bytes_per_token": 9.0,
               "kl_mean_low": 0.0, "kl_mean_high": 1.0, "kl_p999": 1.0, "top1_flip": 0.1, "ppl_ratio": 1.1,
               "ppl_ratio_low": 1.0, "ppl_ratio_high": 1.2}
    rows = practice_context(marked.assign(**columns))["rows"]
    assert [(r["scheme"], r["bytes"]) for r in rows] == [("B", 1.0), ("A", 3.0)]
    from kvasym.render.format import render_template

    text = render_template("table_practice.tex.j2", **practice_context(marked.assign(**columns)))
    lines = [line for line in text.splitlines() if line.startswith("SmolLM2-135M & ")]
    assert [line.split(" & ")[1] for line in lines] == ["B", "A"] and "\\label{tab:practice}" in text
