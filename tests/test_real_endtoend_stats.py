"""Statistics of the end-to-end passes (kvasym.real.endtoend_stats) and their claims, on
synthetic per-position tables whose answers are computed here independently (numpy, pandas and
scipy on the raw columns)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import spearmanr

from kvasym.claims import MissingCell, Tables, stat_e2e_rank_agreement, stat_e2e_ratio
from kvasym.errors import KvasymError
from kvasym.real.endtoend import ALL_LAYERS
from kvasym.real.endtoend_stats import (
    block_labels,
    compare_schemes,
    rank_agreement,
    sensitivity,
    summarize,
)
from kvasym.stats import wilcoxon_paired

SCHEMES = ["KV", "KQV", "QKQV"]
SEVERITY = {"KV": 0.30, "KQV": 0.05, "QKQV": 0.12}


def _frame(n_texts: int = 3, n_pos: int = 40, budgets=(2, 4), layers=(ALL_LAYERS,), seed: int = 0) -> pd.DataFrame:
    gen = np.random.default_rng(seed)
    parts = []
    for text in range(n_texts):
        nll_ref = gen.gamma(2.0, 1.5, n_pos)
        for layer in layers:
            for scheme in SCHEMES:
                for budget in budgets:
                    scale = SEVERITY[scheme] * (4.0 / budget) ** 2
                    parts.append(pd.DataFrame({
                        "text": f"t{text}", "position": np.arange(n_pos), "scheme": scheme, "budget": budget,
                        "rope": "post", "own": "exact", "layer": layer,
                        "nll": nll_ref + gen.normal(scale, 0.05, n_pos), "nll_ref": nll_ref,
                        "kl": gen.gamma(1.0, scale, n_pos), "top1": (gen.random(n_pos) > scale).astype(np.int8),
                        "k_bits_payload": float(budget), "k_bits_side": 0.5, "v_bits_payload": float(budget),
                        "v_bits_side": 1.0,
                    }))
    return pd.concat(parts, ignore_index=True)


def test_block_labels_split_by_text_and_position() -> None:
    frame = pd.DataFrame({"text": ["a", "a", "a", "b"], "position": [0, 7, 8, 0]})
    assert block_labels(frame, 8).tolist() == ["a/0", "a/0", "a/1", "b/0"]
    with pytest.raises(KvasymError, match="block_tokens"):
        block_labels(frame, 0)


def test_summarize_against_direct_formulas() -> None:
    frame = _frame()
    out = summarize(frame, block_tokens=10, n_boot=300, base_seed=3)
    assert len(out) == len(SCHEMES) * 2
    for _, row in out.iterrows():
        g = frame[(frame.scheme == row.scheme) & (frame.budget == row.budget)]
        assert row.ppl == pytest.approx(math.exp(g.nll.mean()), rel=1e-12)
        assert row.ppl_ref == pytest.approx(math.exp(g.nll_ref.mean()), rel=1e-12)
        assert row.ppl_ratio == pytest.approx(row.ppl / row.ppl_ref, rel=1e-9)
        assert row.ppl_increase == pytest.approx(row.ppl - row.ppl_ref, rel=1e-12)
        assert row.ppl_ratio_low < row.ppl_ratio < row.ppl_ratio_high
        assert row.kl_mean == pytest.approx(g.kl.mean()) and row.kl_mean_low < row.kl_mean < row.kl_mean_high
        assert row.kl_p99 == pytest.approx(np.quantile(g.kl, 0.99)) and row.kl_max == g.kl.max()
        assert row.top1 == pytest.approx(g.top1.mean())
        assert row.bits_per_coordinate == pytest.approx(row.budget + 0.75)
        assert row.n_blocks == 3 * 4 and row.n_positions == 3 * 40


def test_compare_schemes_ratio_and_block_test() -> None:
    frame = _frame()
    out = compare_schemes(frame, SCHEMES, block_tokens=10, n_boot=300, base_seed=3)
    assert len(out) == 3 * 2  # pairs x budgets
    row = out[(out.scheme_a == "KQV") & (out.scheme_b == "QKQV") & (out.budget == 4)].iloc[0]
    a = frame[(frame.scheme == "KQV") & (frame.budget == 4)].sort_values(["text", "position"])
    b = frame[(frame.scheme == "QKQV") & (frame.budget == 4)].sort_values(["text", "position"])
    assert row.ppl_ratio == pytest.approx(math.exp((a.nll.to_numpy() - b.nll.to_numpy()).mean()), rel=1e-12)
    assert row.ppl_ratio_high < 1.0  # KQV's shift is smaller by construction
    key = a.text + "/" + (a.position // 10).astype(str)
    means_a = a.nll.groupby(key.to_numpy()).mean().sort_index()
    means_b = b.nll.groupby(key.to_numpy()).mean().sort_index()
    assert row.log10_p == pytest.approx(wilcoxon_paired(means_a.to_numpy(), means_b.to_numpy())["log10_p"])
    assert row.kl_ratio == pytest.approx(a.kl.mean() / b.kl.mean())


def test_sensitivity_per_layer() -> None:
    frame = _frame(layers=(0, 1), budgets=(2,))
    out = sensitivity(frame)
    assert len(out) == 2 * len(SCHEMES)
    g = frame[(frame.scheme == "KV") & (frame.layer == 1)]
    got = out[(out.scheme == "KV") & (out.layer == 1)].iloc[0]
    assert got.ppl_increase_rel == pytest.approx(math.exp((g.nll - g.nll_ref).mean()) - 1.0)


def test_rank_agreement_against_scipy() -> None:
    frame = _frame(budgets=(2, 3, 4))
    full = frame.groupby(["scheme", "budget"]).apply(lambda g: (g.nll - g.nll_ref).mean(), include_groups=False)
    gen = np.random.default_rng(5)
    attention = pd.DataFrame({"scheme": [s for s, _ in full.index], "budget": [b for _, b in full.index],
                              "kl_mean": full.to_numpy() + gen.normal(0, 0.05, full.size)})
    out = rank_agreement(frame, attention, "post", block_tokens=10, n_boot=200, base_seed=1)
    assert out["spearman"] == pytest.approx(spearmanr(attention.kl_mean, full.to_numpy()).statistic)
    assert out["low"] <= out["spearman"] <= out["high"] and out["n_cells"] == 9
    # the same ranking on both sides: rho 1 in every replicate
    same = attention.assign(kl_mean=full.to_numpy() * 3.0)
    perfect = rank_agreement(frame, same, "post", block_tokens=10, n_boot=50, base_seed=1)
    assert perfect["spearman"] == pytest.approx(1.0)
    with pytest.raises(KvasymError, match="at least 3"):
        rank_agreement(frame, attention.iloc[:2], "post", block_tokens=10, n_boot=10, base_seed=1)


def test_claim_statistics_orient_and_report_missing() -> None:
    frame = _frame()
    comparisons = compare_schemes(frame, SCHEMES, block_tokens=10, n_boot=300, base_seed=3)
    empty = pd.DataFrame()
    tables = Tables(empty, empty, empty, empty, e2e_comparisons=comparisons)
    forward = stat_e2e_ratio(tables, {"a": "KQV", "b": "QKQV", "budget": 4})
    backward = stat_e2e_ratio(tables, {"a": "QKQV", "b": "KQV", "budget": 4})
    assert forward.estimate == pytest.approx(1.0 / backward.estimate)
    assert forward.low == pytest.approx(1.0 / backward.high) and forward.high == pytest.approx(1.0 / backward.low)
    assert forward.log10_p == backward.log10_p and forward.interval
    with pytest.raises(MissingCell):
        stat_e2e_ratio(Tables(empty, empty, empty, empty), {"a": "KQV", "b": "QKQV", "budget": 4})
    with pytest.raises(MissingCell):
        stat_e2e_rank_agreement(Tables(empty, empty, empty, empty), {})


def test_e2e_figures_draw_the_tables_values() -> None:
    from kvasym.render.figures import e2e as fe

    frame = _frame(layers=(ALL_LAYERS, 0, 1), budgets=(2, 4))
    summary = summarize(frame, block_tokens=10, n_boot=100, base_seed=3)
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
    summary = summarize(frame, block_tokens=10, n_boot=100, base_seed=3)
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
