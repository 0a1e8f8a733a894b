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
    assert result["details"]["per_trial_rank_biserial"] == pytest.approx(-0.5)
    assert result["details"]["per_query_rank_biserial"] == pytest.approx(-0.5)
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
        ("{id: C1, statement: s, statistic: cells_better, holds_if: {op: within, value: 0.05}}",
         r"key claims\[0\].statistic: must be a statistic with a closed form \(kl_ratio, theory\).*got 'cells_better'"),
        ("{id: C1, statement: s, statistic: kl_ratio, holds_if: {op: within, value: 0.05, target: 0}}",
         r"key claims\[0\].holds_if.target: must be a non-zero finite number, got 0"),
        ("{id: C1, statement: s, statistic: kl_ratio, holds_if: {op: '>', value: 1, target: 2}}",
         "target belongs to op 'within' only"),
        ("{id: C1, statement: s, statistic: crossover, holds_if: {op: '>=', value: 1}, "
         "construction: {verdict: holds, from: C1b}}", r"key claims\[0\].construction: missing required key\(s\): why"),
        ("{id: C1, statement: s, statistic: crossover, holds_if: {op: '>=', value: 1}, "
         "construction: {verdict: maybe, from: C1b, why: w}}",
         r"key claims\[0\].construction.verdict: must be one of holds, does not hold, got 'maybe'"),
        ("{id: C1, statement: s, statistic: theory, holds_if: {op: within, value: 1.5}}",
         r"key claims\[0\].holds_if.value: must be a relative margin in \(0, 1\) with op within, got 1.5"),
        ("{id: C1, statement: s, statistic: theory, holds_if: {op: within, value: 0.05, max_log10_p: -3}}",
         r"key claims\[0\].holds_if.max_log10_p: must be absent with op within .*got -3"),
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


# --- issue 14: each claim's own Holm family, the trial as the unit, equivalence rules -------------


def _cell_row(distribution: str, log10_p: float, a_better: bool = True, metric: str = "kl") -> dict:
    """One comparisons row of A against B whose raw per-trial p is ``10**log10_p``; the gathered
    study-wide Holm column is set to a value that would make every cell significant, so a claim
    that still read it would be caught."""
    mean_a = 0.5 if a_better else 2.0
    return dict(distribution=distribution, kind="gaussian", dim=64, budget=4, sharpness=1.0, scheme_a="A",
                scheme_b="B", metric=metric, mean_a=mean_a, mean_b=1.0, ratio_mean=mean_a,
                ratio_mean_low=mean_a * 0.9, ratio_mean_high=mean_a * 1.1, q_log10_p=-50.0, q_rank_biserial=0.5,
                t_wilcoxon_log10_p=log10_p, t_wilcoxon_log10_p_holm=-10.0, t_wilcoxon_rank_biserial=0.5,
                n_a=100, n_trials=10)


def _all_cells_claim(distributions: list[str] | None = None) -> list[dict]:
    where = {"a": "A", "b": "B", "metrics": ["kl"], "sharpness": 1.0, "alpha": 0.05}
    if distributions is not None:
        where["distributions"] = distributions
    return [{"id": "X", "statement": "s", "statistic": "cells_better", "where": where, "holds_if": {"op": "all"}}]


def test_holm_family_is_the_claims_own_cells():
    """p = 0.03 alone is significant at 5%; two such tests in one family are not (Holm: 0.06 for
    both); a cell outside the claim's distributions, added to the grid, changes nothing."""
    p03 = math.log10(0.03)
    one = pd.DataFrame([_cell_row("g", p03)])
    (alone,) = evaluate_claims(_all_cells_claim(), _tables(one))
    assert alone["verdict"] == HOLDS and alone["details"]["holm_family_size"] == 1
    two = pd.DataFrame([_cell_row("g", p03), _cell_row("h", p03)])
    (both,) = evaluate_claims(_all_cells_claim(), _tables(two))
    assert both["verdict"] == INCONCLUSIVE and both["details"]["holm_family_size"] == 2
    (restricted,) = evaluate_claims(_all_cells_claim(["g"]), _tables(two))
    assert restricted["verdict"] == HOLDS and restricted["details"]["holm_family_size"] == 1


def test_a_reversing_cell_is_named_in_the_reason():
    frame = pd.DataFrame([_cell_row("g", -5.0), _cell_row("t1.05", -5.0, a_better=False)])
    (result,) = evaluate_claims(_all_cells_claim(), _tables(frame))
    assert result["verdict"] == FAILS
    assert "significantly worse in 1 of 2 cells: t1.05 d64 n4 s1" in result["reason"]


def test_min_attainable_p_is_the_exact_wilcoxon_floor():
    from kvasym.claims import min_attainable_log10_p

    for n in (5, 10, 32):
        assert min_attainable_log10_p(n) == pytest.approx(math.log10(2.0 / 2.0 ** n), abs=1e-9)


def test_a_p_threshold_the_design_cannot_reach_is_inconclusive_not_holds():
    """C2's rule asks p < 1e-23; with 10 trials the per-trial test cannot go below 2/2^10: the
    verdict is inconclusive and says why, whatever the per-query p (here 1e-50)."""
    where = {"distribution": "g", "dim": 64, "budget": 4, "sharpness": 1.0, "a": "A", "b": "B"}
    claims = [{"id": "X", "statement": "s", "statistic": "kl_ratio", "where": where,
               "holds_if": {"op": ">", "value": 1.0, "max_log10_p": -23}}]
    (result,) = evaluate_claims(claims, _tables(pd.DataFrame([_cell_row("g", -2.7, a_better=False)])))
    assert result["verdict"] == INCONCLUSIVE and "unreachable" in result["reason"]
    assert result["log10_p"] == pytest.approx(-2.7)  # the per-trial p, not the per-query -50
    assert result["details"]["per_query_mann_whitney_log10_p"] == -50.0
    reachable = [{**claims[0], "holds_if": {"op": ">", "value": 1.0, "max_log10_p": -2}}]
    assert evaluate_claims(reachable, _tables(pd.DataFrame([_cell_row("g", -2.7, a_better=False)])))[0][
        "verdict"] == HOLDS
    # the direction wrong: refuted whatever p can reach
    (wrong,) = evaluate_claims(claims, _tables(pd.DataFrame([_cell_row("g", -2.7, a_better=True)])))
    assert wrong["verdict"] == FAILS


def test_within_a_declared_target():
    """C2b: the paper's 2.25 within 10%: a ratio of 5.4 [5.3, 5.5] is not equivalent; 2.2
    [2.1, 2.3] is; [1.9, 2.3] straddles 2.025."""
    rule = {"op": "within", "value": 0.10, "target": 2.25}
    assert verdict(Measurement(5.4, 5.3, 5.5, interval=True), rule)[0] == FAILS
    result, reason = verdict(Measurement(2.2, 2.1, 2.3, interval=True), rule)
    assert result == HOLDS and "target 2.25" in reason
    assert verdict(Measurement(2.1, 1.9, 2.3, interval=True), rule)[0] == INCONCLUSIVE


def test_construction_verdict_is_distinct_from_refutation():
    from kvasym.claims import BY_CONSTRUCTION

    comp = pd.DataFrame([_cell_row("g", -5.0, metric="kl"), _cell_row("g", -5.0, metric="k_eps_dir")])
    base = {"id": "X", "statement": "s", "statistic": "crossover",
            "where": {"a": "A", "b": "B", "sharpness": 1.0, "all_sharpness": True},
            "holds_if": {"op": ">=", "value": 1}}
    (plain,) = evaluate_claims([base], _tables(comp))
    assert plain["verdict"] == FAILS and plain["estimate"] == 0
    construction = {"verdict": "does not hold", "from": "C1b", "why": "B's keys carry more error"}
    (built,) = evaluate_claims([{**base, "construction": construction}], _tables(comp))
    assert built["verdict"] == BY_CONSTRUCTION and built["reason"].startswith("B's keys carry more error")
    (contrary,) = evaluate_claims([{**base, "construction": {**construction, "verdict": "holds"}}], _tables(comp))
    assert contrary["verdict"] == FAILS and "contrary to the construction argument" in contrary["reason"]


def _ranking_tables(mean_ci: tuple[float, float], p99_ci: tuple[float, float]) -> Tables:
    """One group where A is best by mean KL and B best by p99 KL, with the given A/B ratio CIs."""
    summary = pd.DataFrame([
        dict(distribution="g", dim=64, budget=4, sharpness=1.0, scheme="A", kl_mean=1.0, kl_p99=3.0),
        dict(distribution="g", dim=64, budget=4, sharpness=1.0, scheme="B", kl_mean=1.1, kl_p99=2.0),
    ])
    comp = pd.DataFrame([dict(distribution="g", dim=64, budget=4, sharpness=1.0, scheme_a="A", scheme_b="B",
                              metric="kl", ratio_mean=1.0 / 1.1, ratio_mean_low=mean_ci[0],
                              ratio_mean_high=mean_ci[1], ratio_p99=1.5, ratio_p99_low=p99_ci[0],
                              ratio_p99_high=p99_ci[1])])
    empty = pd.DataFrame({"distribution": [], "dim": [], "check": []})
    return Tables(comparisons=comp, summary=summary, trials=empty, theory=empty)


@pytest.mark.parametrize("mean_ci, p99_ci, counted", [
    ((0.85, 0.95), (1.2, 1.8), 1),  # both orderings significant: a ranking the mean hides
    ((0.85, 1.02), (1.2, 1.8), 0),  # tied by mean
    ((0.85, 0.95), (0.98, 1.8), 0),  # tied by p99
])
def test_ranking_disagreement_counts_only_significant_swaps(mean_ci, p99_ci, counted):
    claims = [{"id": "X", "statement": "s", "statistic": "ranking_disagreement", "where": {"by": "kl_p99"},
               "holds_if": {"op": ">=", "value": 0.1}}]
    (result,) = evaluate_claims(claims, _ranking_tables(mean_ci, p99_ci))
    assert result["details"]["n_disagree"] == counted and result["details"]["n_disagree_untested"] == 1
    assert result["estimate"] == counted


def test_paired_distribution_ratio_needs_the_same_trials():
    rows = [dict(distribution=d, dim=64, budget=4, scheme="S", sharpness=1.0, trial=t, kl=1.0 + 0.1 * t)
            for d, trials in (("pre", range(6)), ("post", range(5))) for t in trials]
    t = Tables(comparisons=pd.DataFrame(), summary=pd.DataFrame(), trials=pd.DataFrame(rows),
               theory=pd.DataFrame({"distribution": [], "dim": [], "check": []}))
    claims = [{"id": "X", "statement": "s", "statistic": "distribution_ratio",
               "where": {"num": "pre", "den": "post", "dim": 64, "budget": 4, "scheme": "S", "sharpness": 1.0,
                         "paired": True}, "holds_if": {"op": "<=", "value": 1.25}}]
    with pytest.raises(KvasymError, match="paired: true needs the same trials"):
        evaluate_claims(claims, t)


def test_paired_ratio_interval_is_narrower_on_paired_data():
    """Trial effects shared by both treatments cancel in a paired bootstrap: num = 1.1 x den
    exactly, with trial-to-trial spread of a factor 10, gives a zero-width paired interval at 1.1
    and a wide unpaired one."""
    rng = np.random.default_rng(1)
    level = np.exp(rng.normal(0, 1.0, size=20))
    rows = [dict(distribution=d, dim=64, budget=4, scheme="S", sharpness=1.0, trial=i, kl=f * x)
            for d, f in (("pre", 1.1), ("post", 1.0)) for i, x in enumerate(level)]
    t = Tables(comparisons=pd.DataFrame(), summary=pd.DataFrame(), trials=pd.DataFrame(rows),
               theory=pd.DataFrame({"distribution": [], "dim": [], "check": []}))
    where = {"num": "pre", "den": "post", "dim": 64, "budget": 4, "scheme": "S", "sharpness": 1.0}
    claim = {"id": "X", "statement": "s", "statistic": "distribution_ratio", "holds_if": {"op": "<=", "value": 1.25}}
    (paired,) = evaluate_claims([{**claim, "where": {**where, "paired": True}}], t)
    (unpaired,) = evaluate_claims([{**claim, "where": where}], t)
    assert paired["low"] == pytest.approx(1.1) and paired["high"] == pytest.approx(1.1)
    assert unpaired["high"] - unpaired["low"] > 0.5
    assert math.isnan(paired["log10_p"]) and "wilcoxon_log10_p" in paired["details"]


def _share_tables(shares: list[float]) -> Tables:
    trials = pd.DataFrame([dict(distribution="g", dim=64, budget=4, scheme="KQV", sharpness=8.0, trial=i,
                                catastrophic=s, kl=0.1) for i, s in enumerate(shares)])
    summary = pd.DataFrame([dict(distribution="g", dim=64, budget=4, scheme="KQV", sharpness=8.0, kl_mean=0.1,
                                 kl_p99=0.9, tv_p99=0.6, top1_mean=0.9, n_queries=64 * len(shares))])
    empty = pd.DataFrame({"distribution": [], "dim": [], "check": []})
    return Tables(comparisons=pd.DataFrame(), summary=summary, trials=trials, theory=empty)


_SHARE_CLAIM = [{"id": "C8b", "statement": "s", "statistic": "catastrophic_share",
                 "where": {"distribution": "g", "dim": 64, "scheme": "KQV", "budget": 4, "sharpness": 8.0},
                 "holds_if": {"op": ">=", "value": 0.01}}]


@pytest.mark.parametrize("shares, expected", [
    ([0.03, 0.05, 0.04, 0.02, 0.06, 0.04, 0.03, 0.05], HOLDS),      # every trial fails often
    ([0.0, 0.0, 0.001, 0.0, 0.002, 0.0, 0.001, 0.0], FAILS),         # rare failures: CI below 1%
    ([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.16], INCONCLUSIVE),       # one trial carries them all
    ([0.0] * 8, INCONCLUSIVE),                                       # no failure: cannot rule out
])
def test_catastrophic_share_claim_is_decided_over_trials(shares, expected):
    """The interval is the t interval of the per-trial shares (the trial is the unit): the same
    mean share 0.02 holds when spread over trials and is inconclusive when one trial holds it."""
    from scipy import stats as ss

    (result,) = evaluate_claims(_SHARE_CLAIM, _share_tables(shares))
    assert result["verdict"] == expected, result["reason"]
    x = np.array(shares)
    assert result["estimate"] == pytest.approx(x.mean())
    if x.std() > 0:
        half = ss.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size)
        assert result["high"] == pytest.approx(min(1.0, x.mean() + half), rel=1e-9)
        assert result["low"] == pytest.approx(max(0.0, x.mean() - half), rel=1e-9, abs=1e-15)
    assert result["details"]["kl_mean"] == 0.1 and result["details"]["n_trials"] == 8


@pytest.mark.parametrize("ratio, theory, expected", [(5.6, 5.7, HOLDS), (2.25, 5.7, FAILS), (5.1, 5.7, INCONCLUSIVE)])
def test_kl_ratio_within_its_second_order_prediction(ratio, theory, expected):
    """C2t: {op: within} without a target compares the KL ratio's CI (ratio +- 2% here) with the
    comparisons row's ``ratio_theory`` (the second-order prediction), oriented as asked: read as
    B/A the same cell has the inverse ratio and the inverse prediction, and the same verdict."""
    comparisons = _comparisons(ratio, -30.0, -5.0).assign(ratio_theory=theory, ratio_mean_low=0.98 * ratio,
                                                          ratio_mean_high=1.02 * ratio)
    rule = {"op": "within", "value": 0.10}
    where = {"distribution": "g", "dim": 64, "budget": 4, "sharpness": 1.0}
    claims = [{"id": cid, "statement": "s", "statistic": "kl_ratio", "where": {**where, "a": a, "b": b},
               "holds_if": rule} for cid, a, b in (("F", "A", "B"), ("R", "B", "A"))]
    forward, backward = evaluate_claims(claims, _tables(comparisons))
    assert forward["details"]["theory"] == pytest.approx(theory)
    assert backward["details"]["theory"] == pytest.approx(1 / theory)
    assert forward["verdict"] == backward["verdict"] == expected
    assert "closed form" in forward["reason"]


def test_shipped_ledger_tests_closed_forms_two_sidedly():
    """Issue 14, point 5: the "matches its closed form" claims are `within` rules without a target
    (the closed form decides), C1a's "at least pi/2" is marked as fixed by its closed form, and
    every "within X%" statement carries its rule's margin."""
    claims = {c["id"]: c for c in load_claims("config/claims.yaml")}
    for cid in ("C1f", "C1g", "C1h", "C2t"):
        assert claims[cid]["holds_if"]["op"] == "within" and "target" not in claims[cid]["holds_if"], cid
    assert claims["C1a"]["construction"]["verdict"] == FAILS
    for cid, claim in claims.items():
        rule = claim["holds_if"]
        if rule["op"] == "within":
            assert f"within {100 * rule['value']:g}%" in claim["statement"], cid


def _fieller_by_hand(x: np.ndarray, y: np.ndarray, paired: bool) -> tuple[float, float]:
    """Fieller's 95% set for mean(x)/mean(y) over the units' means x_g, y_g (Fieller 1954),
    solved as a quadratic in r: paired on x_g - r y_g, unpaired with Welch's df at the estimate."""
    from scipy import stats as sps

    g_x, g_y = x.size, y.size
    sxx, syy = np.var(x, ddof=1), np.var(y, ddof=1)
    if paired:
        sxy = np.cov(x, y, ddof=1)[0, 1]
        t2 = sps.t.ppf(0.975, g_x - 1) ** 2
        q2, q1, q0 = (g_x * y.mean() ** 2 - t2 * syy, -2 * (g_x * x.mean() * y.mean() - t2 * sxy),
                      g_x * x.mean() ** 2 - t2 * sxx)
    else:
        r = x.mean() / y.mean()
        va, vb = sxx / g_x, r * r * syy / g_y
        df = (va + vb) ** 2 / (va**2 / (g_x - 1) + vb**2 / (g_y - 1))
        t2 = sps.t.ppf(0.975, df) ** 2
        q2, q1, q0 = y.mean() ** 2 - t2 * syy / g_y, -2 * x.mean() * y.mean(), x.mean() ** 2 - t2 * sxx / g_x
    disc = math.sqrt(q1 * q1 - 4 * q2 * q0)
    return (-q1 - disc) / (2 * q2), (-q1 + disc) / (2 * q2)


def _text_design(copies: int = 1, with_text: bool = True) -> Tables:
    """C11r's design: 8 texts x 7 (layer, head) caches quantized before ('pre') and after ('post')
    RoPE. Text levels spread by a factor ~e (shared by pre and post), caches within a text by
    ~e^0.3, pre/post = 1.15 with a text-level wobble of 5%; each cache listed ``copies`` times."""
    gen = np.random.default_rng(4)
    rows, trial = [], 0
    for text in range(8):
        level, ratio = math.exp(gen.normal(0, 1.0)), 1.15 * math.exp(gen.normal(0, 0.05))
        for cache in range(7):
            post = level * math.exp(gen.normal(0, 0.3))
            for _ in range(copies):
                for dist, value in (("pre", ratio * post), ("post", post)):
                    rows.append(dict(distribution=dist, dim=64, budget=4, scheme="S", sharpness=1.0, trial=trial,
                                     kl=value, **({"text": f"text{text}"} if with_text else {})))
                trial += 1
    return Tables(comparisons=pd.DataFrame(), summary=pd.DataFrame(), trials=pd.DataFrame(rows),
                  theory=pd.DataFrame({"distribution": [], "dim": [], "check": []}))


def test_c11r_pairs_per_text_means_with_the_text_as_unit():
    """Issue 14: C11r's interval has the text as its unit and pairs the texts. On a constructed
    design (8 texts x 7 caches, text levels shared by both treatments): the paired interval is
    Fieller's on the 8 per-text means (solved by hand); the unpaired one is Welch-Fieller on the
    same means and several times wider (the text levels do not cancel); listing every cache three
    times leaves both unchanged (the text is the unit), while dropping the texts makes the 56
    caches units and narrows the interval (the nesting ignored)."""
    where = {"num": "pre", "den": "post", "dim": 64, "budget": 4, "scheme": "S", "sharpness": 1.0, "metric": "kl"}
    claim = {"id": "C11r", "statement": "s", "statistic": "distribution_ratio", "holds_if": {"op": "<=", "value": 1.25}}
    t = _text_design()
    (paired,) = evaluate_claims([{**claim, "where": {**where, "paired": True}}], t)
    (unpaired,) = evaluate_claims([{**claim, "where": where}], t)
    frame = t.trials
    means = {d: frame[frame["distribution"] == d].groupby("text")["kl"].mean().to_numpy() for d in ("pre", "post")}
    assert (paired["low"], paired["high"]) == pytest.approx(_fieller_by_hand(means["pre"], means["post"], True),
                                                            rel=1e-9)
    assert (unpaired["low"], unpaired["high"]) == pytest.approx(
        _fieller_by_hand(means["pre"], means["post"], False), rel=1e-9)
    assert paired["details"]["unit"] == "text" and paired["details"]["n_units"] == 8
    assert paired["details"]["n_trials"] == 56
    assert 1.1 < paired["low"] < 1.15 < paired["high"] < 1.25
    assert unpaired["high"] - unpaired["low"] > 5 * (paired["high"] - paired["low"])
    assert paired["verdict"] == HOLDS and unpaired["verdict"] == INCONCLUSIVE
    (tripled,) = evaluate_claims([{**claim, "where": {**where, "paired": True}}], _text_design(copies=3))
    assert (tripled["low"], tripled["high"]) == pytest.approx((paired["low"], paired["high"]), rel=1e-9)
    (caches,) = evaluate_claims([{**claim, "where": {**where, "paired": True}}], _text_design(with_text=False))
    assert caches["details"]["unit"] == "trial" and caches["details"]["n_units"] == 56
    assert caches["high"] - caches["low"] < 0.5 * (paired["high"] - paired["low"])


def test_a_jensen_claim_shows_the_cells_three_slopes():
    """C9kqv is decided on the weight-adjusted slope; its details carry the plain and the
    key-norm-adjusted slope of the same cell (and no other cell's)."""
    rows = []
    for check, value in (("jensen_slope", -1.7), ("jensen_slope_adjusted", -1.5), ("jensen_slope_norm", -2.1)):
        for scheme, shift in (("KQV", 0.0), ("QKQV", 5.0)):
            rows.append(dict(distribution="g", dim=64, check=check, scheme=scheme, budget=4, sharpness=2.0,
                             estimate=value + shift, low=value + shift - 0.2, high=value + shift + 0.2, theory=0.5,
                             statistic=np.nan, p=np.nan, n=512.0))
    empty = pd.DataFrame()
    claim = {"id": "C9kqv", "statement": "s", "statistic": "theory", "holds_if": {"op": "within", "value": 0.5},
             "where": {"check": "jensen_slope_adjusted", "distribution": "g", "dim": 64, "budget": 4,
                       "scheme": "KQV", "sharpness": 2.0}}
    (result,) = evaluate_claims([claim], Tables(comparisons=empty, summary=empty, trials=empty,
                                                theory=pd.DataFrame(rows)))
    assert result["estimate"] == -1.5 and result["verdict"] == FAILS
    assert result["details"]["jensen_slope"] == pytest.approx([-1.7, -1.9, -1.5])
    assert result["details"]["jensen_slope_norm"] == pytest.approx([-2.1, -2.3, -1.9])


# ---------------------------------------------------------------------------------------------
# one record per statistic; the claims file's schema


def test_every_statistic_record_is_complete():
    """Each record of the registry names the tables it reads (fields of Tables, each with its
    rule and file in TABLE_SOURCES), ledger words every claim's words fill, and a rows kind."""
    import dataclasses

    from kvasym.claims import DECIDING_TESTS, P_TESTS, STATISTICS
    from kvasym.render.claims import TABLE_SOURCES
    from kvasym.render.ledger import test_and_unit

    fields = {f.name for f in dataclasses.fields(Tables)}
    for name, record in STATISTICS.items():
        assert record.name == name and callable(record.function)
        assert record.tables and set(record.tables) <= fields & set(TABLE_SOURCES), name
        assert record.rows in ("", "cell", "cells", "num_den"), name
        for where in ({}, {"check": "ks_beta", "paired": True, "metric": "t_eps_dir"}, {"distribution": "smollm2"}):
            text = str(test_and_unit({"statistic": name, "where": where}))
            assert text and "{" not in text, (name, text)
        assert record.per_cell == (record.rows in ("cell", "cells"))
        # the test its verdicts rest on and the difference test its rows show (issue 50, point 6b)
        for where in ({"check": "qjl_vs_nbit"}, {"check": "ks_beta", "which": "p99"}):
            assert record.deciding(where) in DECIDING_TESTS, name
        assert record.p_test is None or record.p_test in P_TESTS, name


def test_the_claims_schema_names_no_statistic_and_gets_them_from_the_registry():
    from pathlib import Path

    import yaml
    from jsonschema import Draft202012Validator

    from kvasym.claims import CLAIMS_SCHEMA_RELPATH, DECIDING_TESTS, STATISTICS, claims_schema

    raw = yaml.safe_load((Path(__file__).resolve().parents[1] / CLAIMS_SCHEMA_RELPATH).read_text())
    assert "enum" not in raw["$defs"]["statistic"] and "enum" not in raw["$defs"]["closed_form_statistic"]
    assert "enum" not in raw["$defs"]["deciding_test"]
    schema = claims_schema()
    Draft202012Validator.check_schema(schema)
    assert schema["$defs"]["statistic"]["enum"] == sorted(STATISTICS)
    assert schema["$defs"]["deciding_test"]["enum"] == list(DECIDING_TESTS)
    assert schema["$defs"]["closed_form_statistic"]["enum"] == ["kl_ratio", "theory"]


def test_the_claims_schema_agrees_with_the_engine():
    """The words the schema spells (rules, construction verdicts, the headline keys a default
    cannot set) are the ones the engine reads; every key the schema declares is described."""
    from kvasym.claims import HEADLINE_WHERE_KEYS, OPS, claims_schema

    schema = claims_schema()
    defs = schema["$defs"]
    assert set(defs["rule"]["properties"]["op"]["enum"]) == {*OPS, "all", "within"}
    assert defs["claim"]["properties"]["construction"]["properties"]["verdict"]["enum"] == [HOLDS, FAILS]
    assert tuple(schema["properties"]["defaults"]["properties"]) == HEADLINE_WHERE_KEYS

    def undescribed(node, path):
        for name, sub in (node.get("properties") or {}).items():
            if "$ref" not in sub and not str(sub.get("description", "")).strip():
                yield f"{path}.{name}"
            yield from undescribed(sub, f"{path}.{name}")

    missing = list(undescribed(schema, ""))
    for name, sub in defs.items():
        missing += [f"$defs.{name}"] * (not sub.get("description")) + list(undescribed(sub, f"$defs.{name}"))
    assert missing == []


def test_a_new_statistic_is_one_record(tmp_path, monkeypatch):
    """Adding a statistic is its function and one record: the claims file may name it, the
    engine decides it, the ledger describes it and the README's map says what it reads."""
    from kvasym import claims as engine
    from kvasym.render.claims import claims_map_markdown
    from kvasym.render.ledger import test_and_unit

    def stat_mean_kl(t, where):
        rows = t.summary[t.summary["scheme"] == where["scheme"]]
        return Measurement(float(rows["kl_mean"].mean()))

    path = tmp_path / "claims.yaml"
    path.write_text("claims:\n  - {id: N1, statement: s, statistic: mean_kl, where: {scheme: KV}, "
                    "holds_if: {op: '<', value: 1}}\n")
    with pytest.raises(KvasymError, match="got 'mean_kl'"):
        load_claims(path)
    record = engine.Statistic("mean_kl", stat_mean_kl, ("summary",), "mean KL over {unit}")
    monkeypatch.setitem(engine.STATISTICS, "mean_kl", record)
    claims = load_claims(path)
    summary = pd.DataFrame({"scheme": ["KV", "KV", "KQV"], "kl_mean": [0.2, 0.4, 3.0]})
    (result,) = evaluate_claims(claims, Tables(comparisons=pd.DataFrame(), summary=summary, trials=pd.DataFrame(),
                                               theory=pd.DataFrame()))
    assert result["estimate"] == pytest.approx(0.3) and result["verdict"] == HOLDS
    assert str(test_and_unit(result)) == "mean KL over trials"
    # its verdict rests on the estimate alone (the record's default decided_by), and the map says so
    assert result["decided_by"] == "estimate"
    assert "| N1 | `mean_kl` | estimate alone | `stats` -> `results/stats/summary.parquet` |" in \
        claims_map_markdown(claims)


def test_a_claim_in_code_naming_no_statistic_is_an_error():
    claim = {"id": "X", "statement": "s", "statistic": "no_such", "where": {}, "holds_if": {"op": ">", "value": 1}}
    with pytest.raises(KvasymError, match="claim X: statistic 'no_such' does not exist; known: catastrophic_share"):
        evaluate_claims([claim], _tables(_comparisons(2.0, -30.0, -5.0)))


# ---------------------------------------------------------------------------------------------
# issue 50, point 6: statistics as printed (unbounded intervals, the deciding test)


def _theory_tables(low: float, high: float, estimate: float = 0.331) -> Tables:
    """A theory table with C16f's row (t1.05, d = 128, n = 2, qjl_vs_nbit, 8 trials)."""
    theory = pd.DataFrame([{"distribution": "t1.05", "kind": "student_t", "dim": 128, "check": "qjl_vs_nbit",
                            "scheme": "", "budget": 2, "sharpness": math.nan, "estimate": estimate, "low": low,
                            "high": high, "theory": 4.8626, "statistic": math.nan, "p": math.nan, "n": 8.0}])
    return Tables(comparisons=pd.DataFrame(), summary=pd.DataFrame(), trials=pd.DataFrame(), theory=theory)


_C16F = {"id": "C16f", "statement": "ratio below 1", "statistic": "theory",
         "where": {"check": "qjl_vs_nbit", "distribution": "t1.05", "dim": 128, "budget": 2},
         "holds_if": {"op": "<", "value": 1.0}}


def test_an_unbounded_interval_is_inconclusive_and_printed_unbounded():
    """Issue 50, point 6a: C16f's Fieller set (the paper grid: 0.331, both ends infinite, see
    tests/test_stats.py) is inconclusive, as the comparison of its ends with the rule gives, and
    every rendering of the ledger says "unbounded" and why, never [-inf, inf]."""
    from kvasym.render.claims import render_markdown
    from kvasym.render.format import render_template
    from kvasym.render.tables import claims_context

    (result,) = evaluate_claims([_C16F], _theory_tables(-math.inf, math.inf))
    assert result["verdict"] == INCONCLUSIVE and result["decided_by"] == "fieller"
    assert result["reason"].startswith("Fieller CI unbounded") and "over its 8 units" in result["reason"]
    assert "inf" not in result["reason"].replace("informative", "")
    # the same verdict the ends give (the explicit branch changes no verdict), for every rule
    for rule in ({"op": "<", "value": 1.0}, {"op": ">=", "value": 0.0}, {"op": "within", "value": 0.1}):
        m = Measurement(0.331, -math.inf, math.inf, details={"theory": 4.86, "n": 8.0}, interval=True)
        assert verdict(m, rule)[0] == INCONCLUSIVE
    md = render_markdown([result])
    row = md.splitlines()[-1]
    assert "| unbounded |" in row and "inf" not in row.replace("informative", "")
    assert "unbounded" in render_html([result]) and "-inf" not in render_html([result])
    tex = render_latex([result])
    assert r"\csname claim:C16f:CI\endcsname{(interval unbounded)}" in tex
    table = render_template("table_claims.tex.j2", **claims_context([result]))
    assert "(CI unbounded)" in table and r"\infty" not in table
    # a bounded interval reads as before; one infinite end is open and named
    (bounded,) = evaluate_claims([_C16F], _theory_tables(0.2, 0.5))
    assert bounded["verdict"] == HOLDS and bounded["reason"] == "CI [0.2, 0.5] vs < 1"
    assert r"\csname claim:C16f:CI\endcsname{[\ensuremath{0.200}, \ensuremath{0.500}]}" in render_latex([bounded])
    half = Measurement(2.0, 1.5, math.inf, interval=True)
    assert verdict(half, {"op": ">", "value": 1.0}) == (HOLDS, "CI [1.5, unbounded) vs > 1")


def _equal_bits_tables(low: float, high: float, log10_p: float) -> Tables:
    """C22b's end-to-end row: QWF against RKV at QWF's n = 4 rate, a KL ratio with its t interval
    over the (text, draw) units and the Wilcoxon p of the same units."""
    row = {"model": "smollm2-135m", "rope": "post", "scheme_a": "QWF", "scheme_b": "RKV", "budget_a": 4,
           "evaluated": True, "kl_ratio": (low + high) / 2, "kl_ratio_low": low, "kl_ratio_high": high,
           "ppl_ratio": 1.0, "ppl_ratio_low": 0.9, "ppl_ratio_high": 1.1, "log10_p": log10_p,
           "rank_biserial": 0.7, "n_units": 8, "rate": 4.56, "b_budget_low": 4, "b_budget_high": 5}
    empty = pd.DataFrame()
    return Tables(empty, empty, empty, empty, e2e_equal_bits=pd.DataFrame([row]))


_C22B = {"id": "C22b", "statement": "QWF below RKV", "statistic": "e2e_equal_bits",
         "where": {"a": "QWF", "b": "RKV", "budget": 4, "measure": "kl", "rope": "post"},
         "holds_if": {"op": "<", "value": 1.0}}


def test_the_ledger_names_the_test_each_verdict_rests_on():
    """Issue 50, point 6b: C22b holds on its t interval while its row's Wilcoxon p is 0.078 (the
    paper grid); the ledger says the t interval decided and the p is not in the rule. The same
    claim with a p bound in its rule would rest on both, and says so."""
    from kvasym.claims import decided_by_words
    from kvasym.render.claims import claims_map_markdown, render_markdown
    from kvasym.render.format import render_template
    from kvasym.render.tables import claims_context

    p = math.log10(0.078)
    (result,) = evaluate_claims([_C22B], _equal_bits_tables(0.85, 0.95, p))
    assert result["verdict"] == HOLDS and result["decided_by"] == "t"
    assert decided_by_words(result) == "t CI; Wilcoxon p not in the rule"
    assert "| **holds** | t CI; Wilcoxon p not in the rule |" in render_markdown([result])
    assert "<td>t CI; Wilcoxon p not in the rule</td>" in render_html([result])
    assert r"\csname claim:C22b:DecidedBy\endcsname{t CI; Wilcoxon $p$ not in the rule}" in render_latex([result])
    table = render_template("table_claims.tex.j2", **claims_context([result]))
    assert r"\kvverdict{holds} {\scriptsize(on t CI; Wilcoxon $p$ not in the rule)}" in table
    assert "| C22b | `e2e_equal_bits` | t CI; Wilcoxon p not in the rule |" in claims_map_markdown([_C22B])
    # a declared decided_by equal to the default decides as before, to the verdict and reason
    (declared,) = evaluate_claims([{**_C22B, "decided_by": "t"}], _equal_bits_tables(0.85, 0.95, p))
    assert (declared["verdict"], declared["reason"]) == (result["verdict"], result["reason"])
    # with max_log10_p in the rule the p decides too: 0.078 is not <= 0.01
    bounded = {**_C22B, "holds_if": {"op": "<", "value": 1.0, "max_log10_p": -2}}
    (both,) = evaluate_claims([bounded], _equal_bits_tables(0.85, 0.95, p))
    assert both["verdict"] == FAILS and decided_by_words(both) == "t CI and Wilcoxon p"
    # every statistic's words, for a row of each kind
    assert decided_by_words({"statistic": "cells_better", "where": {}, "holds_if": {"op": "all"}}) == \
        "Wilcoxon per cell, Holm"
    assert decided_by_words({"statistic": "kl_ratio", "where": {"which": "p99"}, "holds_if": {}}) == \
        "percentile bootstrap CI; Wilcoxon p not in the rule"
    assert decided_by_words({"statistic": "theory", "where": {"check": "ks_beta"}, "holds_if": {}}) == \
        "percentile bootstrap CI"
    assert decided_by_words({"statistic": "e2e_rank_agreement", "where": {}, "holds_if": {}}) == \
        "Fisher-z CI over cells"


@pytest.mark.parametrize(
    "extra, message",
    [
        ("decided_by: welch", r"^\S+: claim C1: key claims\[0\]\.decided_by: must be one of fieller, t, bootstrap, "
                              r"fisher_z, agresti_min, wilcoxon_holm, ratio_cis, estimate, got 'welch'$"),
        ("decided_by: fieller", r"^\S+: claim C1: key decided_by: e2e_ratio decides on t \(t CI\) here, not fieller: "
                                r"decided_by declares the test that decides, it cannot choose another$"),
    ],
)
def test_decided_by_is_validated_in_one_line_naming_the_claim_and_key(tmp_path, extra, message):
    path = tmp_path / "claims.yaml"
    path.write_text("claims:\n  - {id: C1, statement: s, statistic: e2e_ratio, where: {a: A, b: B, budget: 4}, "
                    f"holds_if: {{op: '<', value: 1}}, {extra}}}\n")
    with pytest.raises(KvasymError) as info:
        load_claims(path)
    assert "\n" not in str(info.value)
    import re

    assert re.match(message, str(info.value)), str(info.value)
    path.write_text("claims:\n  - {id: C1, statement: s, statistic: e2e_ratio, where: {a: A, b: B, budget: 4}, "
                    "holds_if: {op: '<', value: 1}, decided_by: t}\n")
    assert load_claims(path)[0]["decided_by"] == "t"


def test_every_shipped_claim_declares_its_statistics_deciding_test():
    """The defaults are the tests that decided before (a declaration, not a rule change): every
    shipped claim resolves to a known test, whose kind (interval or not) is its statistic's;
    C22b writes its default, t."""
    from pathlib import Path

    from kvasym.claims import DECIDING_TESTS, STATISTICS, deciding_test

    root = Path(__file__).resolve().parents[1]
    expected = {"theory": {"fieller", "bootstrap"}, "kl_ratio": {"fieller"}, "e2e_equal_bits": {"t"},
                "e2e_ratio": {"t"}, "cells_better": {"wilcoxon_holm"}, "e2e_rank_agreement": {"fisher_z"},
                "equal_rate_ratio": {"fieller"}, "distribution_ratio": {"fieller"}}
    for name in ("claims.yaml", "claims.test.yaml"):
        for claim in load_claims(root / "config" / name, {"distribution": "gaussian", "dim": 64, "sharpness": 1.0}):
            test = deciding_test(claim)
            assert test in DECIDING_TESTS and STATISTICS[claim["statistic"]].deciding(claim["where"]) == test
            assert test in expected.get(claim["statistic"], {test}), (claim["id"], test)
            if claim["id"] == "C22b" and name == "claims.yaml":
                assert claim["decided_by"] == "t"
