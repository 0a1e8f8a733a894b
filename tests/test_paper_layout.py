"""The paper as a reader meets it: every float referenced by number, one meaning per symbol.

(a) every figure and table label the sources define (a ``\\label`` in a template or a hand-written
    section, ``fig:<name>`` of ``\\kvfigure``, ``tab:<name>`` of ``\\kvtable``) is referenced by
    ``\\ref`` from somewhere other than its own float (a table's "continued" head does not count),
    and every ``\\ref`` names a label that exists;
(b) the checker itself fails on an unreferenced float (a test that would pass on broken sources is
    not a test).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "paper"
TEMPLATES = ROOT / "src" / "kvasym" / "templates"

_COMMENT = re.compile(r"(?<!\\)%.*")
_LABEL = re.compile(r"\\label\{([^{}#]+)\}")
_REF = re.compile(r"\\(?:ref|autoref|cref|Cref)\{([^{}#]+)\}")
_KVFIGURE = re.compile(r"\\kvfigure(?:\[[^\]]*\])?\{([^{}#]+)\}")
_KVFIGURES = re.compile(r"\\kvfigurepair(?:\[[^\]]*\])?\{([^{}#]+)\}\{([^{}#]+)\}")
_KVTABLE = re.compile(r"\\kvtable\{([^{}#]+)\}")
_FLOAT_KINDS = ("fig:", "tab:")


def _strip(text: str) -> str:
    return "\n".join(_COMMENT.sub("", line) for line in text.splitlines())


def sources() -> dict[str, str]:
    """Hand-written sections, main.tex and the table templates, comments removed."""
    files = [PAPER / "main.tex", *sorted((PAPER / "sections").glob("*.tex")), *sorted(TEMPLATES.glob("*.j2"))]
    return {str(p.relative_to(ROOT)): _strip(p.read_text(encoding="utf-8")) for p in files}


def float_labels_and_refs(texts: dict[str, str]) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """label -> files defining it, label -> files referring to it (a file's reference to a label
    it defines itself, such as a longtable's "continued" head, is not counted)."""
    labels: dict[str, set[str]] = {}
    refs: dict[str, set[str]] = {}
    for name, text in texts.items():
        defined = set(_LABEL.findall(text))
        defined |= {f"fig:{n}" for n in _KVFIGURE.findall(text)}
        defined |= {f"fig:{n}" for pair in _KVFIGURES.findall(text) for n in pair}
        defined |= {f"tab:{n}" for n in _KVTABLE.findall(text)}
        for label in defined:
            if label.startswith(_FLOAT_KINDS):
                labels.setdefault(label, set()).add(name)
        for line in text.splitlines():
            for label in _REF.findall(line):
                # a longtable's "continued" head refers to its own table: not a reference
                if not (name.endswith(".j2") and label in defined and "continued" in line):
                    refs.setdefault(label, set()).add(name)
    return labels, refs


def unreferenced(texts: dict[str, str]) -> list[str]:
    labels, refs = float_labels_and_refs(texts)
    return sorted(label for label in labels if label not in refs)


def test_every_float_is_referenced_by_number():
    missing = unreferenced(sources())
    assert not missing, f"floats never referenced with \\ref: {missing}"


def test_every_reference_names_a_label():
    texts = sources()
    labels, refs = float_labels_and_refs(texts)
    every_label = set(labels) | {lab for t in texts.values() for lab in _LABEL.findall(t)}
    unknown = sorted(r for r in refs if r not in every_label and "#" not in r)
    assert not unknown, f"\\ref to labels nobody defines: {unknown}"


def test_the_checker_sees_an_unreferenced_float():
    texts = {"sections/a.tex": "\\kvfigure{alpha}{cap} See Figure~\\ref{fig:alpha}. \\kvtable{beta}",
             "templates/t.tex.j2": "\\label{tab:gamma}\n Table~\\ref{tab:gamma}, continued"}
    assert unreferenced(texts) == ["tab:beta", "tab:gamma"]


# --------------------------------------------------------------------------------------------
# the ledger's columns (kvasym.render.ledger)
# --------------------------------------------------------------------------------------------


def test_ledger_order_is_by_claim_number_then_suffix():
    from kvasym.render.ledger import claim_order

    ids = ["C2r", "C10", "C1b", "C2", "C10e", "C9", "C1a", "C2b", "Cx", "C10r"]
    assert [c["id"] for c in claim_order([{"id": i} for i in ids])] == [
        "C1a", "C1b", "C2", "C2b", "C2r", "C9", "C10", "C10e", "C10r", "Cx"]


def test_ledger_rules_and_statements_are_typeset():
    from kvasym.render.ledger import rule_math, statement_math

    assert rule_math({"holds_if": {"op": ">=", "value": 1.5708}}) == r"$\geq 1.5708$"
    assert rule_math({"holds_if": {"op": ">", "value": 1.0, "max_log10_p": -23}}) == (
        r"$> 1$, $\log_{10} p \leq -23$")
    assert rule_math({"holds_if": {"op": "within", "value": 0.1, "target": 2.25}}) == r"$\in 2.25\,(1 \pm 10\%)$"
    assert rule_math({"holds_if": {"op": "within", "value": 0.05}}) == r"$\in \theta\,(1 \pm 5\%)$"
    assert rule_math({"holds_if": {"op": "all"}}) == "all cells better"
    assert statement_math("At n = 4 KQV beats QKQV, p < 1e-23, by >= pi/2 (2x) near 2 pi") == (
        r"At $n = 4$ KQV beats QKQV, p $<$ $10^{-23}$, by $\geq$ $\pi/2$ (2$\times$) near $2\pi$")
    assert statement_math("R&D_50% #1") == r"R\&D\_50\% \#1"  # escaped before any maths


def test_ledger_test_and_unit_name_the_unit():
    from kvasym.render.ledger import test_and_unit

    synthetic = {"statistic": "cells_better", "where": {"distribution": "gaussian", "a": "KQV", "b": "RKV"}}
    real = {"statistic": "cells_better", "where": {"distribution": "gaussian", "distributions": ["smollm2"]}}
    ratio = {"statistic": "distribution_ratio", "where": {"num": "smollm2-prerope", "den": "smollm2",
                                                          "paired": True}}
    assert "over trials" in test_and_unit(synthetic) and "Holm" in test_and_unit(synthetic)
    assert "over texts" in test_and_unit(real)
    assert "paired Fieller" in test_and_unit(ratio) and "texts" in test_and_unit(ratio)


def test_ledger_note_keeps_only_what_other_columns_do_not_say():
    from kvasym.render.tables import _note

    assert _note("significantly worse in 1 of 2 cells: t1.05 d64 n4 s1") == "t1.05 d64 n4 s1"
    assert _note("significantly better in all 10 cells") == ""
    assert _note("CI [1.5, 1.692] vs >= 1.5708") == ""
    assert _note("CI [4.8, 6.6] vs > 1; p <= 1e-23 is unreachable here") == "p <= 1e-23 is unreachable here"
    assert _note("estimate 0.54 has no interval") == "estimate 0.54 has no interval"


def test_the_main_text_summary_is_one_panel_at_the_headline_cell():
    import pandas as pd

    from kvasym.render import tables
    from test_paper_sources import HEADLINE, make_summary

    def kl(dist, scheme, budget, column):
        if column == "kl_mean":
            return {"KV": 0.5, "KQV": 0.2, "QKQV": 0.9, "RKV": 0.2}[scheme] + (budget == 2)
        return None

    synthetic = make_summary(["gaussian", "t1.05"], ["KV", "KQV", "QKQV", "RKV"], value=kl)
    real = make_summary(["smollm2"], ["KV", "KQV", "QKQV", "RKV"], sharpness=(1.0,), value=kl)
    context = tables.summary_context(pd.concat([synthetic, real], ignore_index=True), HEADLINE)
    assert [(g["distribution"], g["real"]) for g in context["groups"]] == [("gaussian", False), ("smollm2", True)]
    rows = {r["scheme"]: r["cells"] for r in context["rows"]}
    assert rows["KQV"][0]["kl_mean"] == 0.2 and rows["KQV"][0]["best"]["kl_mean"]  # n = 4, tie with RKV
    assert rows["RKV"][0]["best"]["kl_mean"] and not rows["KV"][0]["best"]["kl_mean"]
    text = tables.table_texts({"summary": synthetic}, HEADLINE, ["table_summary"])["table_summary"]
    assert "\\label{tab:summary}" in text and "real keys" not in text and "t1.05" not in text


def test_paper_grid_tables_fit_the_margins_at_extreme_values(tmp_path):
    """The paper config's tables, rendered from synthetic frames whose numbers all print in
    scientific notation (KL 1e-13, p = 1e-312), compile through the paper stage's gate: no
    overfull box (the paper grid's own values are narrower; the tiny grid cannot show this)."""
    import shutil

    import numpy as np
    import pytest

    import test_paper_sources as t
    from kvasym.claims import load_claims
    from kvasym.render import numbers, tables
    from kvasym.render.claims import render_latex
    from kvasym.stages.paper import build_pdf
    from kvasym.study import load_study_file

    if not all(shutil.which(tool) for tool in ("latexmk", "pdflatex")):
        pytest.skip(f"LaTeX TOOLS MISSING: the margins were NOT checked. Install them with: {t.APT_INSTALL}")
    paper = t._paper_copy(tmp_path)
    study = load_study_file(ROOT / "config" / "config.yaml")
    claims = load_claims(ROOT / study.claims_file, study.headline)
    results = t._claims_results(claims)
    for r in results:
        r.update(estimate=-1.23456e-13, low=-9.87654e-14, high=3.3333e-12)
    (paper / "generated" / "claims.tex").write_text(render_latex(results), encoding="utf-8")
    numbers.render_numbers(numbers.numbers_slice(study, study.headline, claims, commit=t.COMMIT), paper / "generated")
    dists = ["gaussian", "t1.05", "t3", "t10", "lowrank4", "lowrank16", "lowrank64", "outliers4_x100"]
    schemes = ["KV", "KQV", "QKQV", "RKV"]
    summary = t.make_summary(dists, schemes, budgets=(2, 3, 4), dim=128, sharpness=(2.0,))
    for col in summary.columns:
        if summary[col].dtype == float and col != "sharpness" and "bits" not in col:
            summary[col] = -1.23456e-13
    comparisons = t.make_comparisons(dists, schemes, budgets=(2, 3, 4), dim=128, sharpness=(2.0,))
    for col, value in {"ratio_mean": 1.23456e-13, "ratio_mean_low": 1.2e-13, "ratio_mean_high": 1.3e-13,
                       "energy": 1.23456e-13, "q_rank_biserial": -0.523, "q_ks_d": 0.0625, "q_log10_p": -312.4,
                       "q_log10_p_holm": -312.4, "t_wilcoxon_log10_p_holm": -312.4,
                       "energy_log10_p_holm": -312.4}.items():
        comparisons[col] = np.where(comparisons[col].notna(), value, comparisons[col])
    theory = t.make_theory(dists, budgets=(2, 3, 4), dim=128)
    frames = {"summary": summary, "comparisons": comparisons, "theory": theory, "claims": results}
    for name, text in tables.table_texts(frames, study.headline).items():
        (paper / "generated" / f"{name}.tex").write_text(text, encoding="utf-8")
    assert build_pdf(paper / "main.tex").is_file()  # raises, naming the box, on any overfull line
