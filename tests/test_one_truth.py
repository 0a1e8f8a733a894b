"""One source of truth: the headline cell, the claim ids and the numbers' formatting are each
declared once and read the same way by claims, tables, figures and the paper."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from kvasym.claims import load_claims
from kvasym.render.figures.registry import figures_slice
from kvasym.render.claims import render_latex, render_markdown
from kvasym.render.format import sig, sig_text
from kvasym.render.numbers import numbers_macros, numbers_slice
from kvasym.study import load_study

ROOT = Path(__file__).resolve().parents[1]
TINY = yaml.safe_load((ROOT / "config/test.yaml").read_text())


def _study(**changes):
    if 1 in changes.get("budgets", []):  # KQV-NS's values spend n - 1 bits: none at n = 1
        frontier = {**TINY["frontier"], "schemes": [s for s in TINY["frontier"]["schemes"] if s != "KQV-NS"]}
        frontier["distributions_of"] = {k: v for k, v in frontier.get("distributions_of", {}).items()
                                        if k in frontier["schemes"]}
        # an extra budget is one the grid does not run (RKV's n = 5 when the budgets reach 5)
        frontier["extra_budgets"] = {k: [b for b in v if b not in changes["budgets"]]
                                     for k, v in frontier.get("extra_budgets", {}).items()}
        frontier["extra_budgets"] = {k: v for k, v in frontier["extra_budgets"].items() if v}
        changes = {"frontier": frontier, **changes}
    return load_study({**TINY, **changes})


def test_budgets_one_to_five_give_one_headline_to_figures_tables_and_claims():
    # before: tables fell back to the largest budget (5) and figures to n = 4
    study = _study(budgets=[1, 2, 3, 4, 5], headline={})
    assert study.headline == {"distribution": "gaussian", "dim": 64, "sharpness": 1.0, "budget": 4}
    claims = load_claims(ROOT / study.claims_file, study.headline)
    assert figures_slice(study)["headline"] == study.headline
    macros = numbers_macros(numbers_slice(study, study.headline, claims, commit="c", version="v"))
    assert (macros["HeadlineDistribution"], macros["HeadlineDim"], macros["HeadlineSharpness"],
            macros["HeadlineBudget"]) == ("gaussian", "64", "1", "4")
    for claim in claims:
        own = next(c.get("where") or {} for c in yaml.safe_load((ROOT / study.claims_file).read_text())["claims"]
                   if c["id"] == claim["id"])
        for key in ("distribution", "dim", "sharpness"):
            assert claim["where"][key] == own.get(key, study.headline[key]), (claim["id"], key)
    # a headline without 4 in the grid takes the largest budget, for every reader alike
    study = _study(budgets=[1, 2, 3], headline={})
    assert study.headline["budget"] == 3 and figures_slice(study)["headline"]["budget"] == 3


def test_a_claim_id_greps_to_its_claims_file_its_macros_and_the_paper():
    found = subprocess.run(["git", "grep", "-l", "C2r", "--", "config/claims.yaml", "paper/"], cwd=ROOT,
                           capture_output=True, text=True).stdout.split()
    assert "config/claims.yaml" in found and any(f.startswith("paper/sections/") for f in found), found
    tex = render_latex([{"id": "C2r", "estimate": 5.54, "low": 5.32, "high": 5.76, "log10_p": -200.0,
                         "verdict": "holds", "paper_value": 2.25}])
    assert "claim:C2r:Estimate" in tex
    prose = "".join(p.read_text() for p in (ROOT / "paper/sections").glob("*.tex"))
    assert re.search(r"\\claim(?:ci|id|verdict)?\{C2r\}", prose)


def test_the_ledger_and_the_paper_print_the_same_digits():
    results = [{"id": "X", "statement": "s", "estimate": 0.000457, "low": 2.0, "high": 4.5, "log10_p": -3.0,
                "verdict": "holds", "reason": "", "paper_value": None, "paper_text": None}]
    md, tex = render_markdown(results), render_latex(results)
    assert "4.57×10^-4" in md and "[2.00, 4.50]" in md
    assert f"\\ensuremath{{{sig(0.000457)}}}" in tex and sig(0.000457) == "4.57\\times10^{-4}"
    assert sig_text(2) == "2.00" == str(sig(2))


def test_readme_maps_every_claim_to_its_rule_stage_file_and_macro():
    from kvasym.render.claims import readme_block

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme_block(str(ROOT / "config/claims.yaml")) in readme, (
        "README's claims map is stale: python3 -m kvasym.render.claims --write-readme README.md")
    for claim in yaml.safe_load((ROOT / "config/claims.yaml").read_text())["claims"]:
        assert f"| {claim['id']} | `{claim['statistic']}` |" in readme
    # a claim read from the frontier on the real rows is measured by their extra-budget cells too
    # (C22f: RKV at n = 5, rule real_metrics_extra); one on the stats' real rows is not
    row = {line.split(" | ")[0].lstrip("| "): line for line in readme.splitlines() if line.startswith("| C")}
    assert "`real_metrics`, `real_metrics_extra` (SmolLM2 captures)" in row["C22f"]
    assert "`real_metrics` (SmolLM2 captures)" in row["C2r"] and "real_metrics_extra" not in row["C2r"]
    assert "real_metrics_extra" not in row["C10ta"]  # synthetic: the cells' units hold their extra budgets
