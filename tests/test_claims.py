"""The claims engine: verdicts flip exactly at the declared thresholds, bad ledgers fail loudly."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from kvasym.claims import (
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    NOT_EVALUATED,
    Measurement,
    Tables,
    evaluate_claims,
    load_claims,
    verdict,
)
from kvasym.errors import KvasymError
from kvasym.render.claims import claim_macro, render_html, render_latex


@pytest.mark.parametrize(
    "low, high, op, value, expected",
    [
        (1.2, 1.4, ">=", 1.0, HOLDS),
        (0.8, 1.4, ">=", 1.0, INCONCLUSIVE),
        (0.5, 0.9, ">=", 1.0, FAILS),
        (1.0, 1.4, ">", 1.0, INCONCLUSIVE),  # the boundary itself is not > 1
        (1.0, 1.4, ">=", 1.0, HOLDS),
        (0.5, 0.9, "<=", 1.0, HOLDS),
        (0.5, 1.1, "<", 1.0, INCONCLUSIVE),
    ],
)
def test_interval_verdicts(low, high, op, value, expected):
    m = Measurement(estimate=(low + high) / 2, low=low, high=high)
    assert verdict(m, {"op": op, "value": value})[0] == expected


@pytest.mark.parametrize(
    "low, high, expected",
    [
        (1.97, 2.10, HOLDS),  # inside 2.0 +- 5% = [1.90, 2.10]
        (1.95, 2.11, INCONCLUSIVE),  # straddles the upper bound
        (1.85, 1.95, INCONCLUSIVE),  # straddles the lower bound
        (2.11, 2.30, FAILS),  # wholly above
        (1.50, 1.89, FAILS),  # wholly below
        (1.80, 2.20, INCONCLUSIVE),  # wider than the margin: equivalence cannot be shown
    ],
)
def test_within_is_an_equivalence_test_against_the_closed_form(low, high, expected):
    """{op: within, value: m}: the whole CI inside theta (1 +- m) holds (TOST), wholly outside
    fails, otherwise inconclusive: a wide interval never 'matches' for lack of evidence."""
    m = Measurement(estimate=(low + high) / 2, low=low, high=high, details={"theory": 2.0}, interval=True)
    result, reason = verdict(m, {"op": "within", "value": 0.05})
    assert result == expected
    assert "closed form 2 +- 5% = [1.9, 2.1]" in reason


def test_within_rejects_a_known_non_equivalent_pair_and_needs_a_closed_form():
    """The Gaussian sketch's measured ratio (tiny grid, gaussian d = 64, n = 4: 5.80 [5.43, 6.35])
    is not equivalent to the hadamard sketch's closed form (2.06), and the hadamard
    measurement (2.01 [1.88, 2.12]) is not shown equivalent at a 5% margin by so wide an
    interval; without a closed form nothing is decided; without an interval the estimate is."""
    gaussian = Measurement(5.796, 5.435, 6.349, details={"theory": 2.0614}, interval=True)
    assert verdict(gaussian, {"op": "within", "value": 0.05})[0] == FAILS
    hadamard = Measurement(2.0066, 1.8756, 2.1201, details={"theory": 2.0614}, interval=True)
    assert verdict(hadamard, {"op": "within", "value": 0.05})[0] == INCONCLUSIVE
    assert verdict(hadamard, {"op": "within", "value": 0.10})[0] == HOLDS
    no_theory = Measurement(2.0, 1.99, 2.01, details={"theory": math.nan}, interval=True)
    assert verdict(no_theory, {"op": "within", "value": 0.05})[0] == INCONCLUSIVE
    assert verdict(Measurement(2.04, details={"theory": 2.0}), {"op": "within", "value": 0.05})[0] == HOLDS
    assert verdict(Measurement(2.2, details={"theory": 2.0}), {"op": "within", "value": 0.05})[0] == FAILS


def test_p_value_requirement_can_fail_a_claim():
    m = Measurement(estimate=2.0, low=1.5, high=2.5, log10_p=-20.0)
    assert verdict(m, {"op": ">", "value": 1.0, "max_log10_p": -23})[0] == FAILS
    m.log10_p = -30.0
    assert verdict(m, {"op": ">", "value": 1.0, "max_log10_p": -23})[0] == HOLDS


def test_all_cells_verdict():
    rule = {"op": "all"}
    base = {"n_cells": 10}
    assert verdict(Measurement(1.0, details={**base, "n_a_significantly_better": 10, "n_b_significantly_better": 0}),
                   rule)[0] == HOLDS
    assert verdict(Measurement(0.9, details={**base, "n_a_significantly_better": 9, "n_b_significantly_better": 0}),
                   rule)[0] == INCONCLUSIVE
    assert verdict(Measurement(0.9, details={**base, "n_a_significantly_better": 9, "n_b_significantly_better": 1}),
                   rule)[0] == FAILS


def _comparisons(ratio: float, log10_p: float, holm: float) -> pd.DataFrame:
    """One cell comparing A (KL ratio times B) with B, plus its reverse-metric rows."""
    row = dict(
        distribution="g", kind="gaussian", dim=64, budget=4, sharpness=1.0, scheme_a="A", scheme_b="B", metric="kl",
        mean_a=ratio, mean_b=1.0, ratio_mean=ratio, ratio_mean_low=ratio * 0.9, ratio_mean_high=ratio * 1.1,
        q_log10_p=log10_p, q_rank_biserial=0.5, t_wilcoxon_log10_p=holm, t_wilcoxon_log10_p_holm=holm,
        t_wilcoxon_rank_biserial=0.5, n_a=100, n_trials=10,
    )
    return pd.DataFrame([row])


def _tables(comparisons: pd.DataFrame) -> Tables:
    empty = pd.DataFrame({"distribution": [], "dim": [], "check": []})
    return Tables(comparisons=comparisons, summary=empty, trials=empty, theory=empty)


@pytest.mark.parametrize("ratio, expected", [(2.0, HOLDS), (1.05, INCONCLUSIVE), (0.5, FAILS)])
def test_injected_effect_flips_the_kl_claim(ratio, expected):
    claims = [{"id": "X", "statement": "A worse than B", "statistic": "kl_ratio",
               "where": {"distribution": "g", "dim": 64, "budget": 4, "sharpness": 1.0, "a": "A", "b": "B"},
               "holds_if": {"op": ">", "value": 1.0}}]
    (result,) = evaluate_claims(claims, _tables(_comparisons(ratio, -30.0, -5.0)))
    assert result["verdict"] == expected
    assert result["estimate"] == pytest.approx(ratio)


def test_swapped_pair_inverts_ratio_and_interval():
    claims = [{"id": "X", "statement": "s", "statistic": "kl_ratio",
               "where": {"distribution": "g", "dim": 64, "budget": 4, "sharpness": 1.0, "a": "B", "b": "A"},
               "holds_if": {"op": "<", "value": 1.0}}]
    (result,) = evaluate_claims(claims, _tables(_comparisons(2.0, -30.0, -5.0)))
    assert result["estimate"] == pytest.approx(0.5)
    assert result["low"] == pytest.approx(1 / 2.2) and result["high"] == pytest.approx(1 / 1.8)
    assert result["details"]["rank_biserial"] == pytest.approx(-0.5)
    assert result["verdict"] == HOLDS


@pytest.mark.parametrize("holm, a_better, expected",
                         [(-3.0, True, HOLDS), (-1.0, True, INCONCLUSIVE), (-3.0, False, FAILS)])
def test_cells_better_uses_holm_adjusted_per_trial_p(holm, a_better, expected):
    comp = _comparisons(0.5 if a_better else 2.0, -30.0, holm)
    claims = [{"id": "X", "statement": "s", "statistic": "cells_better",
               "where": {"a": "A", "b": "B", "metrics": ["kl"], "sharpness": 1.0, "alpha": 0.05},
               "holds_if": {"op": "all"}}]
    (result,) = evaluate_claims(claims, _tables(comp))
    assert result["verdict"] == expected


def test_missing_cells_are_not_evaluated_not_errors():
    claims = [{"id": "X", "statement": "s", "statistic": "kl_ratio",
               "where": {"distribution": "absent", "dim": 64, "budget": 4, "sharpness": 1.0, "a": "A", "b": "B"},
               "holds_if": {"op": ">", "value": 1.0}}]
    (result,) = evaluate_claims(claims, _tables(_comparisons(2.0, -30.0, -5.0)))
    assert result["verdict"] == NOT_EVALUATED and "absent" in result["reason"]


def test_unknown_statistic_is_an_error(tmp_path):
    path = tmp_path / "claims.yaml"
    path.write_text("claims:\n  - {id: C1, statement: s, statistic: no_such_statistic, "
                    "holds_if: {op: '>', value: 1}}\n")
    with pytest.raises(KvasymError, match="no_such_statistic"):
        load_claims(path)


@pytest.mark.parametrize(
    "entry, message",
    [
        ("{id: C1, statement: s, statistic: kl_ratio}", "holds_if"),
        ("{id: C1, statement: s, statistic: kl_ratio, holds_if: {op: '~', value: 1}}", "holds_if"),
        ("{id: C1, statement: s, statistic: kl_ratio, holds_if: {op: '>'}}", "holds_if"),
        ("{id: C1, statement: s, statistic: kl_ratio, holds_if: {op: within, value: 0.05}}",
         "only statistic 'theory' has"),
        ("{id: C1, statement: s, statistic: theory, holds_if: {op: within, value: 1.5}}", "margin value in \\(0, 1\\)"),
        ("{id: C1, statement: s, statistic: theory, holds_if: {op: within, value: 0.05, max_log10_p: -3}}",
         "no max_log10_p"),
    ],
)
def test_malformed_rules_are_errors(tmp_path, entry, message):
    path = tmp_path / "claims.yaml"
    path.write_text(f"claims:\n  - {entry}\n")
    with pytest.raises(KvasymError, match=message):
        load_claims(path)


def test_shipped_ledgers_load():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    headline = {"distribution": "gaussian", "dim": 64, "sharpness": 1.0, "budget": 4}
    for name in ("claims.yaml", "claims.test.yaml"):
        claims = load_claims(root / "config" / name, headline)
        assert len({c["id"] for c in claims}) == len(claims)
        # the headline fills each claim's cell unless the claim names its own
        import yaml

        raw = {str(c["id"]): c.get("where") or {}
               for c in yaml.safe_load((root / "config" / name).read_text())["claims"]}
        for claim in claims:
            for key in ("distribution", "dim", "sharpness"):
                assert claim["where"][key] == raw[claim["id"]].get(key, headline[key]), (claim["id"], key)


def test_claim_macros_keep_the_id_and_latex_escapes():
    assert claim_macro("C10", "Estimate") == "claim:C10:Estimate"
    assert claim_macro("C5m", "Low") == "claim:C5m:Low"
    tex = render_latex([{"id": "C1", "estimate": 1.5, "low": math.nan, "high": None, "log10_p": None,
                         "verdict": "holds", "paper_text": "50% & more_"},
                        {"id": "C2r", "estimate": 0.000457, "low": 2, "high": None, "log10_p": -23.44,
                         "verdict": "holds", "paper_value": 2.25}])
    # the one formatter: 3 significant figures, trailing zeros kept, the same digits as the tables
    assert r"\expandafter\newcommand\csname claim:C1:Estimate\endcsname{\ensuremath{1.50}}" in tex
    assert r"\csname claim:C2r:Estimate\endcsname{\ensuremath{4.57\times10^{-4}}}" in tex
    assert r"\csname claim:C2r:Low\endcsname{\ensuremath{2.00}}" in tex
    assert r"\csname claim:C2r:LogP\endcsname{-23.4}" in tex
    assert r"\csname claim:C2r:Paper\endcsname{\ensuremath{2.25}}" in tex
    assert r"\csname claim:C1:Low\endcsname{n/a}" in tex
    assert r"50\% \& more\_" in tex


def test_distribution_ratio_with_known_effect():
    rng = np.random.default_rng(0)
    rows = []
    for dist, scale in (("low", 3.0), ("heavy", 1.0)):
        for trial in range(30):
            rows.append(dict(distribution=dist, dim=64, budget=4, scheme="S", sharpness=1.0, trial=trial,
                             kl=scale * (1 + 0.05 * rng.standard_normal())))
    trials = pd.DataFrame(rows)
    theory = pd.DataFrame({"distribution": [], "dim": [], "check": []})
    t = Tables(comparisons=pd.DataFrame(), summary=pd.DataFrame(), trials=trials, theory=theory)
    claims = [{"id": "X", "statement": "s", "statistic": "distribution_ratio",
               "where": {"num": "low", "den": "heavy", "dim": 64, "budget": 4, "scheme": "S", "sharpness": 1.0},
               "holds_if": {"op": ">=", "value": 2.0}}]
    (result,) = evaluate_claims(claims, t)
    assert result["estimate"] == pytest.approx(3.0, rel=0.05)
    assert result["low"] > 2.0 and result["verdict"] == HOLDS


def test_html_ledger_escapes_and_counts_every_verdict():
    results = [
        {"id": "C1", "statement": "<script>alert(1)</script> & co", "paper_value": 1.5, "paper_text": None,
         "estimate": 1.57, "low": 1.5, "high": 1.6, "log10_p": -3.2, "verdict": "holds", "reason": "CI > 1"},
        {"id": "C2", "statement": "b", "paper_value": None, "paper_text": None, "estimate": None, "low": None,
         "high": None, "log10_p": None, "verdict": "not evaluated", "reason": "no rows"},
    ]
    page = render_html(results)
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt; &amp; co" in page
    assert "2 claims: 1 holds, 1 not evaluated." in page
    assert "[1.50, 1.60]" in page and "-3.2" in page and "1.57" in page
    assert page.count("<tr>") == 3  # header + two claims
