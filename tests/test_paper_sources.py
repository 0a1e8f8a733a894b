"""The paper's sources and its generated tables.

(a) the hand-written sources (paper/main.tex, paper/sections/*.tex) type no number: every
    digit in prose or math is a failure, except in LaTeX syntax (options, lengths, labels,
    file names, macro parameters); every claim they quote exists in config/claims.yaml and
    every number macro they use is one render_numbers writes;
(b) tables render from small synthetic DataFrames with the producers' column names, and names
    from config or data (``a_b``, ``50%``, ``R&D``, ``#1``, ``$x$``, ``~``, ``é``...) come out
    escaped, never raw;
(c) the templates' StrictUndefined: a missing variable raises;
(d) number formatting (significant figures, p-values from log10 p) against hand-computed strings;
(e) bold marks the computed best value of a column;
(f) when latexmk is installed, the paper compiles against generated files in a temporary
    folder and its text carries the generated numbers (skipped loudly otherwise).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import jinja2
import numpy as np
import pandas as pd
import pytest
import yaml

from kvasym import stats
from kvasym.render import format as fmt
from kvasym.render import numbers, tables
from kvasym import cell_statistics
from kvasym.claims import load_claims
from kvasym.cli import main
from kvasym.render.claims import CLAIM_FIELDS, render_latex
from kvasym.errors import KvasymError
from kvasym.render.format import escape_latex
from kvasym.study import load_study_file

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "paper"
HAND_WRITTEN = [PAPER / "main.tex", *sorted((PAPER / "sections").glob("*.tex"))]
FIGURES = ("shannon_phi_k", "shannon_phi_v", "shannon_phi_t", "kl_ecdf", "budget_crossover", "tail_sweep",
           "rank_sweep", "query_model", "theory_check", "marginals", "jensen_bias", "sharpness_sweep")
COMMIT = "feedc0de0123456789abcdef0123456789abcdef"
APT_INSTALL = ("apt-get update && apt-get install -y --no-install-recommends latexmk texlive-latex-recommended "
               "texlive-latex-extra texlive-fonts-recommended poppler-utils")

# --------------------------------------------------------------------------------------------
# (a) no typed number in the hand-written sources
# --------------------------------------------------------------------------------------------

_BLANK = re.compile(r"[^\n]")
_UNIT = (r"(?:pt|mm|cm|in|ex|em|bp|sp|pc|dd|cc|mu|"
         r"\\(?:textwidth|linewidth|columnwidth|textheight|hsize|vsize|baselineskip|paperwidth|paperheight))")
#: Commands whose (first) braced argument is a name, a path or a key, never prose.
_NAME_ARG = (r"label|ref|eqref|pageref|autoref|cref|Cref|nameref|cite[a-zA-Z]*|input|include|includegraphics|"
             r"usepackage|RequirePackage|documentclass|graphicspath|url|href|hypersetup|IfFileExists|"
             r"kvtable|kvfigure|kvgraphic|begin|end|"
             # a claim's id, as in config/claims.yaml (a name, not a number: C2r), and a scheme's
             # name, as in the config (KIVI128)
             r"claim|claimid|claimci|claimverdict|claimlogp|scheme")
_ALLOWED = [
    # \newcommand{\x}[2][default] (arity and default)
    re.compile(r"\\(?:new|renew|provide)command\*?\{\\[A-Za-z@]+\}(?:\[[^\]]*\])*"),
    # \begin{env}[options]
    re.compile(r"\\begin\{[^{}]*\}(?:\[[^\]]*\])*"),
    # a name/path/key argument, with the command's options
    re.compile(r"\\(?:" + _NAME_ARG + r")\*?(?:\[[^\]]*\])*\{[^{}]*\}"),
    # options written right after a command: \usepackage[T1], \includegraphics[width=...]
    re.compile(r"(?<=[A-Za-z@*])\[[^\]\n]*\]"),
    # line break with a length: \\[1ex]
    re.compile(r"\\\\\*?\[[^\]]*\]"),
    # a whole argument that is a length: {2mm}, [.8\linewidth], =0.48\textwidth
    re.compile(r"(?<=[\[{=,])\s*-?(?:\d+(?:\.\d*)?|\.\d+)" + _UNIT + r"\s*(?=[\]},])"),
    # macro parameters #1
    re.compile(r"#\d"),
]


def strip_comments(text: str) -> str:
    """Drop LaTeX comments (an unescaped % to the end of the line), keeping line numbers."""
    return "\n".join(re.sub(r"(?<!\\)%.*", "", line) for line in text.split("\n"))


def typed_digits(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every digit left in ``text`` once comments and LaTeX syntax
    (options, lengths, labels, file names, parameters) are blanked out."""
    text = strip_comments(text)
    for pattern in _ALLOWED:
        text = pattern.sub(lambda m: _BLANK.sub(" ", m.group()), text)
    return [(i + 1, line.strip()) for i, line in enumerate(text.split("\n")) if re.search(r"\d", line)]


#: What a backslash escape of a Python string leaves of a LaTeX command at a line's start
#: ("\\r" of \ref became a line break: the PDF printed "Table eftab:card").
ESCAPE_RESIDUE = re.compile(r"(?m)^(ef|eqref|rac|extbf|extit|ext|oindent|ewline|abla|heta|imes)\{")


def test_no_source_holds_what_a_python_escape_leaves_of_a_command():
    """Hand-written sections and templates hold no control character (tab, form feed, carriage
    return, backspace, bell, vertical tab: what ``\\t``, ``\\f``, ``\\r``, ``\\b``, ``\\a``,
    ``\\v`` become in a Python string) and no line starting with the rest of a command whose
    backslash and first letter an escape took (``ef{`` of ``\\ref{``)."""
    sources = [*HAND_WRITTEN, *sorted((ROOT / "src/kvasym/templates").glob("*.j2"))]
    assert sources
    for path in sources:
        text = path.read_text(encoding="utf-8")
        assert not set(text) & set("\a\b\f\r\t\v"), (path, "control character")
        hit = ESCAPE_RESIDUE.search(text)
        assert hit is None, (path, text[:hit.start()].count("\n") + 1, hit.group(0))



@pytest.mark.parametrize(
    "snippet",
    [
        r"KQV has 2.25 times lower KL",
        r"with $p < 10^{-23}$",
        r"at $d = 1024$",
        r"a 1-bit sketch",
        r"\emph{4}",
        r"\claim{C2}{Estimate} is 2.25",
        r"top-5 recall",
        r"the 99th percentile",
        r"\textbf{0.027}",
        r"\section{Results at n = 4}",
        r"in 2 in every cell",
        r"$\pi/2$",
    ],
)
def test_digit_checker_catches_typed_numbers(snippet):
    assert typed_digits(snippet), snippet


@pytest.mark.parametrize(
    "snippet",
    [
        r"\vspace{2mm}",
        r"\includegraphics[width=0.48\textwidth]{\kvfigdir kl_ecdf.pdf}",
        r"\begin{figure}[h]",
        r"\begin{subfigure}{.32\linewidth}",
        r"\label{fig:c2} \ref{tab:x1} \cite{paper2024}",
        r"% a comment with 2024 and 3.14",
        r"text\\[1ex] more",
        r"\newcommand{\claim}[2]{\csname Claim#1#2\endcsname}",
        r"\usepackage[T1]{fontenc}\usepackage[scaled=.92]{helvet}",
        r"\documentclass[11pt,a4paper]{article}",
        r"\parbox{.8\linewidth}{x}",
        r"\claim{C2}{Estimate} at $n = \HeadlineBudget$",
        r"\scheme{KIVI128} against \scheme{RKV}",
    ],
)
def test_digit_checker_allows_latex_syntax(snippet):
    assert typed_digits(snippet) == [], snippet


def test_escaped_percent_is_not_a_comment():
    assert typed_digits(r"50\% of it") == [(1, r"50\% of it")]


def test_hand_written_sources_exist():
    assert (PAPER / "main.tex").is_file()
    names = {p.stem for p in HAND_WRITTEN}
    for section in ("study", "definitions", "claims", "disagreements", "baseline", "limitations"):
        assert section in names, f"paper/sections/{section}.tex is missing"


@pytest.mark.parametrize("path", HAND_WRITTEN, ids=lambda p: p.name)
def test_no_typed_numbers_in_prose(path):
    hits = typed_digits(path.read_text(encoding="utf-8"))
    assert not hits, (
        f"{path.relative_to(ROOT)} types numbers; quote a macro of generated/claims.tex (\\claim{{..}}{{..}}) "
        f"or generated/numbers.tex instead:\n" + "\n".join(f"  line {n}: {line}" for n, line in hits)
    )


@pytest.fixture(scope="module")
def paper_study():
    return load_study_file(ROOT / "config" / "config.yaml")


@pytest.fixture(scope="module")
def paper_claims(paper_study):
    return load_claims(ROOT / paper_study.claims_file, paper_study.headline)


@pytest.fixture(scope="module")
def paper_numbers(paper_study, paper_claims):
    headline = paper_study.headline
    return numbers.numbers_macros(numbers.numbers_slice(paper_study, headline, paper_claims, commit=COMMIT))


def _prose() -> str:
    return "\n".join(strip_comments(p.read_text(encoding="utf-8")) for p in HAND_WRITTEN)


def test_quoted_claims_and_fields_exist(paper_claims, paper_numbers):
    ids = {c["id"]: c["id"] for c in paper_claims}
    prose = _prose()
    uses = re.findall(r"\\claim\{([^{}]*)\}\{([^{}]*)\}", prose)
    uses += [(cid, "Id") for cid in re.findall(r"\\claim(?:id|ci|verdict|logp)\{([^{}]*)\}", prose)]
    assert uses, "the paper quotes no claim"
    for cid, field in uses:
        if cid == "#1":
            continue  # the helpers' own definitions
        assert cid in ids, f"\\claim{{{cid}}}: no such claim in config/claims.yaml (known: {sorted(ids)})"
        name = f"claim:{cid}:{field}"
        assert field in CLAIM_FIELDS or name in paper_numbers, f"\\claim{{{cid}}}{{{field}}}: no macro {name}"
    quoted = {cid for cid, _ in uses}
    missing = sorted(ids[c] for c in set(ids) - quoted)
    assert not missing, f"the paper never discusses claim(s) {missing}"


def test_number_macros_used_are_generated(paper_numbers):
    defined_in_main = set(re.findall(r"\\newcommand\{\\([A-Za-z]+)\}", _prose()))
    latex_builtins = {"IfFileExists", "PackageError", "PackageWarningNoLine"}
    used = set(re.findall(r"\\([A-Z][A-Za-z]*)", _prose()))
    unknown = sorted(used - set(paper_numbers) - defined_in_main - latex_builtins)
    assert not unknown, f"macros used in the paper but written by nobody: {unknown}"


def test_figures_and_tables_referenced_by_known_names():
    prose = _prose()
    figures = set(re.findall(r"\\kv(?:figure|graphic)(?:\[[^\]]*\])?\{([^{}#]+)\}", prose))
    assert figures == set(FIGURES), (f"figures: unknown {sorted(figures - set(FIGURES))}, "
                                     f"unused {sorted(set(FIGURES) - figures)}")
    used_tables = {f"table_{t}" for t in re.findall(r"\\kvtable\{([^{}#]+)\}", prose)}
    assert used_tables == set(tables.TABLES)


# --------------------------------------------------------------------------------------------
# synthetic inputs with the producers' column names
# --------------------------------------------------------------------------------------------

CELL = ["distribution", "kind", "dim", "budget", "sharpness"]


def _summary_columns() -> list[str]:
    coords = {m: np.ones(3) for m in cell_statistics.SUMMARY_METRICS}
    tails = {m: np.ones(3) for m in cell_statistics.TAIL_METRICS}
    return [*CELL, "scheme", "n_trials", "n_queries", *stats.cell_summary(np.ones(3), np.ones(3), coords, tails)]


def _comparison_columns() -> list[str]:
    keys = stats.compare([np.arange(3.0), np.arange(3.0) + 1], [np.arange(3.0) + 2, np.arange(3.0)])
    return [*CELL, "scheme_a", "scheme_b", "metric", "per_trial_only", *keys,
            *(f"ratio_{w}{s}" for w in ("mean", "p99") for s in ("", "_low", "_high")),
            "energy", "energy_p", "energy_log10_p",
            *(f"{c}_holm"
              for c in ("q_log10_p", "t_wilcoxon_log10_p", "t_mw_log10_p", "q_ks_log10_p", "energy_log10_p"))]


THEORY_COLUMNS = ["distribution", "kind", "dim", "check", "scheme", "budget", "sharpness", "estimate", "low", "high",
                  "theory", "statistic", "p", "n"]


def make_summary(dists, schemes, budgets=(2, 4), dim=64, sharpness=(1.0, 4.0), value=None) -> pd.DataFrame:
    """One row per cell; ``value(dist, scheme, budget, column)`` overrides a column's value."""
    rows = []
    for di, dist in enumerate(dists):
        for budget in budgets:
            for s in sharpness:
                for si, scheme in enumerate(schemes):
                    row = {c: 0.1 * (si + 1) + 0.01 * di + 0.001 * budget for c in _summary_columns()}
                    row.update(distribution=dist, kind="gaussian", dim=dim, budget=budget, sharpness=s, scheme=scheme,
                               n_trials=3, n_queries=48, n=48, k_bits_payload_mean=float(budget),
                               v_bits_payload_mean=float(budget), k_bits_side_mean=0.5, v_bits_side_mean=1.015625)
                    if value is not None:
                        for c in list(row):
                            v = value(dist, scheme, budget, c)
                            if v is not None:
                                row[c] = v
                    rows.append(row)
    frame = pd.DataFrame(rows)
    assert list(frame.columns) == _summary_columns()
    return frame


def make_comparisons(dists, schemes, budgets=(2, 4), dim=64, sharpness=(1.0, 4.0)) -> pd.DataFrame:
    rows = []
    cols = _comparison_columns()
    for dist in dists:
        for budget in budgets:
            for s in sharpness:
                for i, a in enumerate(schemes):
                    for b in schemes[i + 1:]:
                        for metric in (*cell_statistics.COMPARED_METRICS, "error6d"):
                            row = {c: np.nan for c in cols}
                            row.update(distribution=dist, kind="gaussian", dim=dim, budget=budget, sharpness=s,
                                       scheme_a=a, scheme_b=b, metric=metric, per_trial_only=False, n_trials=3.0,
                                       n_a=48, n_b=48)
                            if metric == "error6d":
                                row.update(energy=2.71828, energy_p=0.02, energy_log10_p=math.log10(0.02),
                                           energy_log10_p_holm=math.log10(0.04))
                            else:
                                row.update(q_log10_p=-30.4, q_log10_p_holm=-29.1, q_rank_biserial=-0.5, q_ks_d=0.625,
                                           t_wilcoxon_log10_p_holm=-0.6, ratio_mean=0.17777, ratio_mean_low=0.15,
                                           ratio_mean_high=0.19)
                            rows.append(row)
    return pd.DataFrame(rows, columns=cols)


def make_theory(dists, budgets=(2, 4), dim=64) -> pd.DataFrame:
    rows = []
    for dist in dists:
        base = {"distribution": dist, "kind": "gaussian", "dim": dim, "scheme": "", "sharpness": np.nan}
        for budget in budgets:
            rows.append({**base, "check": "qjl_vs_residual", "budget": budget, "estimate": 1.5745, "low": 1.5283,
                         "high": 1.6054, "theory": 1.5552, "statistic": np.nan, "p": np.nan, "n": 3.0})
            rows.append({**base, "check": "qjl_vs_nbit", "budget": budget, "estimate": 4.979, "low": 4.8786,
                         "high": 5.1134, "theory": 4.8666, "statistic": np.nan, "p": np.nan, "n": 3.0})
        rows.append({**base, "check": "ks_beta", "budget": -1, "estimate": 0.0368, "low": np.nan, "high": np.nan,
                     "theory": np.nan, "statistic": 0.0368, "p": 0.66, "n": 384.0})
    return pd.DataFrame(rows, columns=THEORY_COLUMNS)


def make_claims(ids, statement="claim {id}") -> list[dict]:
    out = []
    for i, cid in enumerate(ids):
        out.append({"id": cid, "statement": statement.format(id=cid), "paper_value": 2.25 if i == 0 else None,
                    "paper_text": None, "statistic": "kl_ratio", "where": {}, "holds_if": {"op": ">", "value": 1.0},
                    "estimate": 3.14159 + i, "low": 2.5, "high": 3.9, "log10_p": -30.4 if i == 0 else None,
                    "details": {}, "verdict": ["holds", "does not hold", "inconclusive", "not evaluated"][i % 4],
                    "reason": "CI [2.5, 3.9] vs > 1"})
    out.append({"id": "Ccells", "statement": "cells", "paper_value": None, "paper_text": ">= pi/2",
                "statistic": "cells_better", "where": {}, "holds_if": {"op": "all"}, "estimate": 0.5, "low": None,
                "high": None, "log10_p": None, "verdict": "inconclusive", "reason": "r",
                "details": {"n_cells": 6, "n_a_significantly_better": 3, "n_b_significantly_better": 0}})
    return out


HEADLINE = {"distribution": "gaussian", "dim": 64, "sharpness": 1.0, "budget": 4}


def synthetic_frames(dists=("gaussian", "t1.05"), schemes=("KV", "KQV", "QKQV", "RKV"), claim_ids=("C2", "C3")):
    return {
        "summary": make_summary(list(dists), list(schemes)),
        "comparisons": make_comparisons(list(dists), list(schemes)),
        "theory": make_theory(list(dists)),
        "claims": make_claims(list(claim_ids)),
    }


# --------------------------------------------------------------------------------------------
# (b) tables render, and escape every name
# --------------------------------------------------------------------------------------------


def test_tables_render_from_synthetic_frames():
    texts = tables.table_texts(synthetic_frames(), HEADLINE)
    assert set(texts) == set(tables.TABLES)
    for name, text in texts.items():
        assert "\\begin{longtable}" in text or name in ("table_disagreements", "table_real", "table_e2e",
                                                          "table_summary", "table_frontier", "table_seq_len",
                                                          "table_model", "table_bands", "table_card", "table_models",
                                                          "table_greedy", "table_kl", "table_practice",
                                                          "table_schemes"), name
        assert "\\VAR{" not in text and "\\BLOCK{" not in text and "\\#{" not in text
        assert "nan" not in text.lower().replace("nonan", ""), name
    assert "$4\\times10^{-31}$" in texts["table_tests"]  # q_log10_p = -30.4
    # breakable between estimate and interval, and after the interval's comma
    assert "$0.178$ $[0.150,\\allowbreak 0.190]$" in texts["table_tests"]
    assert "$2.72$" in texts["table_tests"]  # energy distance from the error6d row
    assert "$1.57\\ [1.53, 1.61]$" in texts["table_theory"] and "$0.66$" in texts["table_theory"]
    assert "3/6 better, 0 worse" in texts["table_claims"]
    assert "$3.14$ $[2.50,\\allowbreak 3.90]$" in texts["table_claims"]  # breakable in the ledger's narrow column
    assert "\\label{tab:results}" in texts["table_results"]


def test_tables_use_only_the_headline_cell():
    frames = synthetic_frames()
    frames["summary"].loc[frames["summary"]["sharpness"] == 4.0, "kl_mean"] = 777.0
    text = tables.table_texts(frames, HEADLINE, ["table_results"])["table_results"]
    assert "777" not in text
    with pytest.raises(KvasymError, match="no rows at the headline"):
        tables.table_texts(frames, {**HEADLINE, "sharpness": 2.0}, ["table_results"])


HOSTILE_DISTS = ["a_b", "50%", "R&D"]
HOSTILE_SCHEMES = ["#1", "$x$", "~", "é", "x^2", "{b}", "back\\slash", "<>"]
HOSTILE_CLAIMS = ["#1", "R&D_50%"]
HOSTILE_TEXT = {"statement": "a_b costs 50% of R&D, #1 in $x$ ~ é", "paper_text": "x^2 {b}",
                # not a restated interval ("CI [a, b] vs ..."), which the ledger's note column drops
                "reason": "log10 p = -4 is not <= -23; R&D ~ #1"}


def _render_named(dists, schemes, claim_ids, text) -> dict[str, str]:
    frames = synthetic_frames(dists, schemes, claim_ids)
    frames["claims"][0]["statement"] = text["statement"]
    frames["claims"][1]["paper_text"] = text["paper_text"]
    frames["claims"][1]["reason"] = text["reason"]
    return tables.table_texts(frames, HEADLINE)


def test_hostile_names_come_out_escaped_and_nothing_else_changes():
    """Rendering with hostile names equals rendering with inert placeholders in which each
    placeholder is replaced by the escaped name: every occurrence is escaped, none is raw."""
    pairs = {}

    def placeholders(names, tag):
        out = [f"Zq{tag}{chr(ord('A') + i)}Zq" for i in range(len(names))]
        pairs.update(zip(out, names))
        return out

    benign_text = {k: f"Zq{k.replace('_', '')}Zq" for k in HOSTILE_TEXT}
    pairs.update({benign_text[k]: v for k, v in HOSTILE_TEXT.items()})
    benign = _render_named(placeholders(HOSTILE_DISTS, "D"), placeholders(HOSTILE_SCHEMES, "S"),
                           placeholders(HOSTILE_CLAIMS, "C"), benign_text)
    hostile = _render_named(HOSTILE_DISTS, HOSTILE_SCHEMES, HOSTILE_CLAIMS, HOSTILE_TEXT)
    for name, text in benign.items():
        # the ledger's note column adds break points (escape_latex_breakable, tested in
        # test_latexlog): compared without them
        expected = text.replace(r"\allowbreak{}", "")
        for placeholder, raw in pairs.items():
            expected = expected.replace(placeholder, escape_latex(raw))
        assert hostile[name].replace(r"\allowbreak{}", "") == expected, name
    # and the escaped forms are really there
    assert (r"R\&D" in hostile["table_results"] and r"a\_b" in hostile["table_tests"]
            and r"50\%" in hostile["table_theory"])
    assert r"\#1" in hostile["table_results"] and r"\$x\$" in hostile["table_tests"]
    assert r"\textasciitilde{}" in hostile["table_results"] and "é" in hostile["table_results"]
    assert r"x\textasciicircum{}2 \{b\}" in hostile["table_claims"]
    assert r"\textless{}= -23" in hostile["table_disagreements"]


def _assert_escaped(text: str, names) -> None:
    for name in names:
        escaped = escape_latex(name)
        assert escaped in text, f"{name!r} should appear as {escaped!r}"
        if escaped != name:
            assert name not in text.replace(escaped, "\0"), f"{name!r} appears unescaped"


def test_hostile_names_are_escaped_in_numbers(tmp_path):
    study = load_study_file(ROOT / "config" / "test.yaml")
    slice_ = numbers.numbers_slice(study, {**HEADLINE, "distribution": "a_b"},
                                  [{"id": "C2", "statement": "R&D: 50% of #1", "holds_if": {"op": ">", "value": 1},
                                    "where": {"a": "$x$", "b": "t~é", "metrics": ["kl", "t_eps_dir"],
                                              "better": {"x": 1}}}],
                                  commit="abc_def", version="0.1.0")
    schemes = ["#1", "$x$", "t~1", "é", "q^z", "{bb}", "back\\slash", "<>", "R&D"]
    slice_["schemes"] = schemes
    path = numbers.render_numbers(slice_, tmp_path)
    text = path.read_text(encoding="utf-8")
    _assert_escaped(text, ["a_b", "R&D: 50% of #1", "$x$", "t~é", "abc_def", "t_eps_dir"] + schemes)
    names = re.findall(r"\\newcommand\{\\([^}]*)\}", text)
    assert names and all(n.isalpha() for n in names)
    claim_names = re.findall(r"\\csname (claim:[^\\]*)\\endcsname", text)
    assert "claim:C2:WhereMetrics" in claim_names and len(claim_names) == len(set(claim_names))
    assert len(names) == len(set(names))
    assert "\\expandafter\\newcommand\\csname claim:C2:WhereMetrics\\endcsname{kl, t\\_eps\\_dir}" in text
    assert "\\newcommand{\\GitCommit}{abc\\_def}" in text


def test_numbers_cover_the_grid(paper_numbers):
    assert paper_numbers["NumDistributions"] == "10"
    assert paper_numbers["GridBudgets"] == "2, 3, 4"
    assert paper_numbers["QueriesPerCell"] == str(32 * 64)
    assert paper_numbers["HeadlineDim"] == "128" and paper_numbers["HeadlineSharpness"] == "2"
    assert paper_numbers["TailNuMin"] == "1.05"
    assert paper_numbers["GitCommitShort"] == COMMIT[:12]
    assert paper_numbers["claim:C2:MaxLogP"] == "-23"
    assert paper_numbers["claim:C5:WhereDim"] == "1024"
    assert paper_numbers["claim:C10:Id"] == "C10"
    # the frontier section names its sub-grid from the config, not from typed prose
    assert paper_numbers["FrontierDistributionList"] == "gaussian, t3, lowrank8, lowrank32, outliers4"
    # and the sequence-length ablation its range (config seq_len_sweep.seq_lens: 1024 ... 16384)
    assert (paper_numbers["SeqLenSweepMin"], paper_numbers["SeqLenSweepMax"], paper_numbers["SeqLenSweepFold"],
            paper_numbers["SeqLenSweepDistribution"]) == ("1024", "16384", "16", "gaussian")


def test_finalize_escapes_strings_even_without_the_filter_and_refuses_raw_floats():
    env = fmt.environment()
    assert env.from_string(r"\VAR{name}").render(name="a_b & c") == r"a\_b \& c"
    assert env.from_string(r"\VAR{name|escape}").render(name="50%") == r"50\%"
    assert env.from_string(r"\VAR{x|sig}").render(x=0.054894) == "0.0549"
    with pytest.raises(KvasymError, match="unformatted number"):
        env.from_string(r"\VAR{x}").render(x=0.5)


# --------------------------------------------------------------------------------------------
# (c) StrictUndefined
# --------------------------------------------------------------------------------------------


def test_missing_variable_raises():
    with pytest.raises(jinja2.UndefinedError):
        fmt.environment().from_string(r"\VAR{missing}").render()
    with pytest.raises(jinja2.UndefinedError):
        fmt.environment().from_string(r"\BLOCK{for r in rows}\VAR{r.nope}\BLOCK{endfor}").render(rows=[{"a": 1}])


@pytest.mark.parametrize("template", sorted({t for t, _ in tables.TABLES.values()}))
def test_every_template_refuses_an_incomplete_context(template):
    with pytest.raises(jinja2.UndefinedError):
        fmt.render_template(template)


# --------------------------------------------------------------------------------------------
# (d) number formatting, against hand-computed strings
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "x, digits, expected",
    [
        (0.054894, 3, "0.0549"),
        (1.6, 3, "1.60"),
        (4.0, 3, "4.00"),
        (-0.10677, 3, "-0.107"),
        (9.996, 3, "10.0"),
        (271.3, 3, "271"),
        (4790.2, 3, "4790"),
        (123456.0, 3, r"1.23\times10^{5}"),
        (9999.7, 3, r"1.00\times10^{4}"),
        (0.000123456, 3, r"1.23\times10^{-4}"),
        (0.00099996, 2, r"1.0\times10^{-3}"),
        (-5.6025e-7, 2, r"-5.6\times10^{-7}"),
        (0.0, 3, "0"),
        (5.602493, 4, "5.602"),
        (math.nan, 3, "n/a"),
        (None, 3, "n/a"),
    ],
)
def test_sig(x, digits, expected):
    assert fmt.sig(x, digits) == expected


@pytest.mark.parametrize(
    "log10_p, digits, expected",
    [
        (-30.4, 1, r"$4\times10^{-31}$"),  # 10**0.6 = 3.98
        (-16.435785, 1, r"$4\times10^{-17}$"),  # 10**0.564 = 3.66
        (-400.2, 1, r"$6\times10^{-401}$"),  # underflowed as a float: 10**0.8 = 6.31
        (-2.5, 1, r"$3\times10^{-3}$"),  # 10**0.5 = 3.16
        (-30.98, 2, r"$1.0\times10^{-31}$"),  # 10**0.02 = 1.047
        (-30.001, 1, r"$1\times10^{-30}$"),  # 10**0.999 = 9.98 rounds up to 10
        (-0.432526, 1, "$0.37$"),
        (-1.5, 1, "$0.032$"),
        (0.0, 1, "$1$"),
        (-0.001, 1, "$1$"),
        (math.nan, 1, "--"),
        (None, 1, "--"),
        (-math.inf, 1, "$0$"),
    ],
)
def test_pvalue_from_log10(log10_p, digits, expected):
    assert fmt.pvalue(log10_p, digits) == expected


def test_cell_formats():
    assert fmt.num(0.054894) == "$0.0549$"
    assert fmt.num(0.054894, bold=True) == r"$\mathbf{0.0549}$"
    assert fmt.num(math.nan) == "--"
    assert fmt.ci(5.6025, 5.3199, 6.0309) == r"$5.60\ [5.32, 6.03]$"
    assert fmt.ci(0.922, math.nan, math.nan) == "$0.922$"
    assert fmt.bits(4.0, 0.5078125) == "$4 + 0.508$"
    assert fmt.plain(2.0) == "2" and fmt.plain(1.05) == "1.05"
    assert fmt.pvalue_raw(0.0) == "$0$" and fmt.pvalue_raw(1e-40) == r"$1\times10^{-40}$"


# --------------------------------------------------------------------------------------------
# (e) bold marks the computed best
# --------------------------------------------------------------------------------------------


def test_best_flags():
    assert tables.best_flags([0.3, 0.1, 0.2], "lower") == [False, True, False]
    assert tables.best_flags([0.3, 0.1, 0.3], "higher") == [True, False, True]
    assert tables.best_flags([math.nan, 0.1, 0.2], "lower") == [False, True, False]
    assert tables.best_flags([0.1, math.nan], "lower") == [False, False]  # nothing to compare with
    with pytest.raises(KvasymError):
        tables.best_flags([1, 2], "smaller")


def _rows(text: str) -> dict[tuple[str, str], list[str]]:
    """(budget, scheme) -> cells of the results table's data rows (budget carried down)."""
    out, budget = {}, None
    for line in text.splitlines():
        cells = [c.strip() for c in line.rstrip("\\ ").split(" & ")]
        if len(cells) == 15 and not line.startswith("$n$") and "multicolumn" not in line and "mean &" not in line:
            budget = cells[0] or budget
            out[(budget, cells[1])] = cells
    return out


def test_bold_marks_the_lowest_kl_and_highest_recall():
    def value(dist, scheme, budget, column):
        if column == "kl_mean":
            return {"KV": 0.3, "KQV": 0.05, "QKQV": 0.9, "RKV": 0.07}[scheme] * budget
        if column == "recall_top5_mean":
            return {"KV": 0.5, "KQV": 0.6, "QKQV": 0.8, "RKV": 0.8}[scheme]  # a tie: both bold
        return None

    frame = make_summary(["gaussian"], ["KV", "KQV", "QKQV", "RKV"], value=value)
    text = tables.table_texts({"summary": frame}, HEADLINE, ["table_results"])["table_results"]
    rows = _rows(text)
    assert len(rows) == 8
    for budget in ("2", "4"):
        for scheme in ("KV", "KQV", "QKQV", "RKV"):
            kl_cell, recall_cell = rows[(budget, scheme)][2], rows[(budget, scheme)][7]
            assert ("\\mathbf" in kl_cell) == (scheme == "KQV"), (budget, scheme, kl_cell)
            assert ("\\mathbf" in recall_cell) == (scheme in ("QKQV", "RKV")), (budget, scheme, recall_cell)
    assert rows[("2", "KQV")][2] == r"$\mathbf{0.100}$"


# --------------------------------------------------------------------------------------------
# files and the command line
# --------------------------------------------------------------------------------------------


def _write_inputs(folder: Path, frames) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for key in ("summary", "comparisons", "theory"):
        paths[key] = folder / f"{key}.parquet"
        frames[key].to_parquet(paths[key])
    paths["claims"] = folder / "claims.json"
    paths["claims"].write_text(json.dumps(frames["claims"]))
    return paths


def test_render_tables_writes_every_table(tmp_path):
    inputs = _write_inputs(tmp_path / "in", synthetic_frames())
    written = tables.render_tables(inputs, HEADLINE, tmp_path / "out")
    assert [p.name for p in written] == [f"{n}.tex" for n in tables.TABLES]
    assert all(p.is_file() and p.stat().st_size > 0 for p in written)
    assert not list((tmp_path / "out").glob(".*.tmp"))
    with pytest.raises(KvasymError, match="missing input"):
        tables.render_tables({"summary": inputs["summary"]}, HEADLINE, tmp_path / "out")
    only = tables.render_tables({"claims": inputs["claims"]}, HEADLINE, tmp_path / "only", ["table_claims"])
    assert [p.name for p in only] == ["table_claims.tex"]


def test_command_line(tmp_path, capsys):
    inputs = _write_inputs(tmp_path / "in", synthetic_frames())
    args = ["tables", "--headline", json.dumps(HEADLINE), "--out-dir", str(tmp_path / "out")]
    for key, path in inputs.items():
        args += [f"--{key}", str(path)]
    assert main(["stage", *args]) == 0
    assert (tmp_path / "out" / "table_tests.tex").is_file()
    assert main(['stage', "numbers", "--config", str(ROOT / "config" / "test.yaml"), "--commit", COMMIT,
                        "--out-dir", str(tmp_path / "out")]) == 0
    assert f"\\newcommand{{\\GitCommit}}{{{COMMIT}}}" in (tmp_path / "out" / "numbers.tex").read_text()
    assert main(['stage', "tables", "--headline", "{}", "--summary", str(tmp_path / "nope.parquet"),
                        "--table", "table_results", "--out-dir", str(tmp_path)]) == 2
    assert "no such file" in capsys.readouterr().err


def test_the_headline_is_the_studys_and_claims_files_cannot_move_it(tmp_path):
    study = load_study_file(ROOT / "config" / "test.yaml")
    assert study.headline == {"distribution": "gaussian", "dim": 64, "sharpness": 1.0, "budget": 4}
    bad = tmp_path / "claims.yaml"
    bad.write_text("defaults: {distribution: gaussian, dim: 64, sharpness: 2.0}\nclaims: []\n")
    with pytest.raises(KvasymError, match=r"key defaults\.distribution: must be set by the config's `headline` key "
                                          r".*, got 'gaussian'"):
        load_claims(bad, study.headline)


# --------------------------------------------------------------------------------------------
# (f) the paper compiles (when a TeX installation is there)
# --------------------------------------------------------------------------------------------


def _need_latex() -> None:
    missing = [tool for tool in ("latexmk", "pdflatex", "pdftotext") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"LaTeX TOOLS MISSING ({', '.join(missing)}): the paper was NOT compiled. "
                    f"Install them with: {APT_INSTALL}")


def _paper_copy(root: Path) -> Path:
    paper = root / "paper"
    (paper / "generated").mkdir(parents=True)
    shutil.copy2(PAPER / "main.tex", paper / "main.tex")
    shutil.copytree(PAPER / "sections", paper / "sections")
    shutil.copy2(PAPER / "references.bib", paper / "references.bib")
    shutil.copy2(PAPER / "layout.tex", paper / "layout.tex")
    return paper


def _latexmk(paper: Path) -> str:
    run = subprocess.run(
        ["latexmk", "-pdf", "-outdir=build", "-interaction=nonstopmode", "-halt-on-error", "main.tex"],
        cwd=paper, capture_output=True, text=True, timeout=300,
    )
    log = paper / "build" / "main.log"
    assert run.returncode == 0, (f"latexmk failed:\n{run.stdout[-3000:]}\n"
                                 f"{log.read_text(errors='replace')[-3000:] if log.exists() else ''}")
    text = subprocess.run(["pdftotext", "build/main.pdf", "-"], cwd=paper, capture_output=True, text=True,
                          check=True).stdout
    return re.sub(r"\s+", " ", text)


def _claims_results(claims) -> list[dict]:
    out = []
    for i, c in enumerate(claims):
        out.append({"id": c["id"], "statement": c["statement"], "paper_value": c.get("paper_value"),
                    "paper_text": c.get("paper_text"), "estimate": 1.11 + i, "low": 1.0 + i, "high": 1.3 + i,
                    "log10_p": -30.4, "verdict": "holds" if i % 2 else "does not hold", "reason": "r"})
    return out


def test_paper_compiles_with_generated_files(tmp_path, paper_study, paper_claims):
    _need_latex()
    paper = _paper_copy(tmp_path)
    generated = paper / "generated"
    results = _claims_results(paper_claims)
    results[2]["estimate"] = 3.14159  # C2
    (generated / "claims.tex").write_text(render_latex(results), encoding="utf-8")
    headline = paper_study.headline
    numbers.render_numbers(numbers.numbers_slice(paper_study, headline, paper_claims, commit=COMMIT), generated)
    frames = synthetic_frames(["gaussian", "R&D_50%"], ["KV", "KQV", "#1", "é~"], claim_ids=["C2", "a_b"])
    frames = {**frames, "summary": make_summary(["gaussian", "R&D_50%"], ["KV", "KQV", "#1", "é~"], dim=128,
                                                sharpness=(2.0,)),
              "comparisons": make_comparisons(["gaussian", "R&D_50%"], ["KV", "KQV", "#1", "é~"], dim=128,
                                              sharpness=(2.0,))}
    for name, text in tables.table_texts(frames, headline).items():
        (generated / f"{name}.tex").write_text(text, encoding="utf-8")
    figure = None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        (tmp_path / "results" / "figures").mkdir(parents=True)
        fig, ax = plt.subplots(figsize=(3, 2))
        ax.plot([0, 1], [0, 1])
        figure = tmp_path / "results" / "figures" / "kl_ecdf.pdf"
        fig.savefig(figure)
        plt.close(fig)
    except ImportError:
        pass
    text = _latexmk(paper)
    assert "3.14" in text  # the C2 estimate, through \claim{C2}{Estimate}
    # the bibliography ran: an entry's title is printed, and no citation is left undefined
    assert "sequentially rejective" in text.lower()
    log = (paper / "build" / "main.log").read_text(errors="replace")
    assert "undefined" not in " ".join(line for line in log.splitlines() if "Citation" in line), log[-2000:]
    assert COMMIT[:12] in text and COMMIT in text
    assert "$4\\times" not in text and "4 × 10" in text  # a p-value of the tests table, typeset
    assert "R&D_50%" in text and "é~" in text  # hostile names typeset literally
    assert "n/a [n/a" not in text  # every claim of config/claims.yaml is defined
    if figure is not None:
        assert "figure kl_ecdf has not been generated" not in text
    assert "figure tail_sweep has not been generated" in text


def test_paper_compiles_without_tables_claims_or_figures(tmp_path):
    _need_latex()
    paper = _paper_copy(tmp_path)
    study = load_study_file(ROOT / "config" / "test.yaml")
    numbers.render_numbers(numbers.numbers_slice(study, study.headline,
                                                 load_claims(ROOT / study.claims_file), commit=COMMIT),
                           paper / "generated")
    text = _latexmk(paper)
    assert "table table_results has not been generated" in text
    assert "n/a" in text and COMMIT[:12] in text


def test_closed_forms_stand_beside_the_measured_ratios():
    """Issue 14, point 5: the tests table prints each KL ratio's second-order prediction (as
    stored, A/B), the theory table the hadamard ratio beside its closed form, the claims ledger
    the closed form a claim is decided against; '--' where there is none."""
    frames = synthetic_frames()
    frames["comparisons"]["ratio_theory"] = 5.6993
    theory = frames["theory"]
    extra = theory[theory["check"] == "qjl_vs_nbit"].assign(check="hadamard_vs_nbit", estimate=2.0123, low=1.9,
                                                            high=2.1, theory=2.0611)
    frames["theory"] = pd.concat([theory, extra], ignore_index=True)
    frames["claims"][0]["details"] = {"theory": 4.8666}
    texts = tables.table_texts(frames, HEADLINE, ["table_tests", "table_theory", "table_claims"])
    assert "$5.70$" in texts["table_tests"]
    assert "$2.01\\ [1.90, 2.10]$ & $2.06$" in texts["table_theory"]
    rows = [line for line in texts["table_claims"].splitlines() if line.startswith("C2 &") or line.startswith("C3 &")]
    # the ledger's "ours [CI]" cell carries the closed form where there is one, and only there
    assert "; theory $4.87$ &" in rows[0] and "theory" not in rows[1]


def test_results_table_gives_total_bits_as_stored_and_with_float16_norms():
    """Issue 14, point 8: beside K's and V's payload + side, the whole cache's total bits per
    coordinate (mean of K's and V's payload + side) as stored and with float16 norms; '--' for
    the float16 column when the summary predates it."""
    frames = synthetic_frames()
    frames["summary"] = frames["summary"].drop(columns=["k_bits_side16_mean", "v_bits_side16_mean"])
    text = tables.table_texts(frames, HEADLINE, ["table_results"])["table_results"]
    row = next(line for line in text.splitlines() if line.startswith("4 & KV &"))
    # budget 4: (4 + 0.5 + 4 + 1.015625) / 2 = 4.7578125
    assert row.endswith("& $0.500$ & $1.02$ & $4.76$ & -- \\\\"), row
    summary = frames["summary"].assign(k_bits_side16_mean=0.25, v_bits_side16_mean=0.5078125)
    text = tables.table_texts({**frames, "summary": summary}, HEADLINE, ["table_results"])["table_results"]
    row = next(line for line in text.splitlines() if line.startswith("4 & KV &"))
    assert row.endswith("& $4.76$ & $4.38$ \\\\"), row  # (4 + 0.25 + 4 + 0.5078125) / 2 = 4.379


def test_theory_table_sets_the_kl_ratio_beside_its_second_order_prediction():
    """Issue 14, point 5: per (distribution, d, budget) the theory table gives the mean-KL ratio
    of the first pair with a prediction other than 1, oriented so that the prediction exceeds 1
    (stored KQV/QKQV = 0.17777 [0.15, 0.19] with prediction 1/5.6993 prints as QKQV/KQV
    5.63 [5.26, 6.67] beside 5.70), at the headline sharpness only; pairs predicted equal (1)
    or without a prediction (unrotated keys: NaN) are skipped."""
    frames = synthetic_frames(schemes=("KV", "KQV", "QKQV", "RKV"))
    comparisons = frames["comparisons"]
    predictions = {("KV", "KQV"): np.nan, ("KQV", "RKV"): 1.0, ("KQV", "QKQV"): 1 / 5.6993}
    comparisons["ratio_theory"] = [predictions.get((a, b), np.nan) for a, b in
                                   zip(comparisons["scheme_a"], comparisons["scheme_b"])]
    comparisons.loc[comparisons["sharpness"] != HEADLINE["sharpness"], "ratio_mean"] = 99.0
    assert tables.kl_prediction_pair(comparisons) == ("QKQV", "KQV")
    text = tables.table_texts({**frames, "comparisons": comparisons}, HEADLINE, ["table_theory"])["table_theory"]
    assert "\\textsf{QKQV}/\\textsf{KQV}" in text
    rows = [line for line in text.splitlines() if line.startswith("4 &")]
    assert rows and all(line.endswith("& $5.63\\ [5.26, 6.67]$ & $5.70$ \\\\") for line in rows), rows
    without = tables.table_texts(frames | {"comparisons": comparisons.drop(columns="ratio_theory")}, HEADLINE,
                                 ["table_theory"])["table_theory"]
    assert "\\textsf{" not in without and all(line.endswith("& -- & -- \\\\")
                                             for line in without.splitlines() if line.startswith("4 &"))


def test_theory_checks_are_worded_in_one_place():
    """The words of each theory check and its interval's method are kvasym.theory's
    THEORY_CHECK_WORDS, read by the ledger's test-and-unit text and by the theory table's
    caption: a check's ledger text is its record's, every check has one (the KS distance under
    Haar rotation has a bootstrap interval, as the other KS distance), and the caption names the
    ratios' and the KS distances' methods from it."""
    from kvasym.render.ledger import test_and_unit
    from kvasym.theory import THEORY_CHECK_WORDS, THEORY_CHECKS

    assert set(THEORY_CHECK_WORDS) == set(THEORY_CHECKS)
    for check, (words, interval) in THEORY_CHECK_WORDS.items():
        assert interval == ("Fieller" if "_vs_" in check else "bootstrap"), check
        text = str(test_and_unit({"statistic": "theory", "where": {"check": check}}))
        assert text == f"{words}; {interval} CI over trials", (check, text)
    text = tables.table_texts(synthetic_frames(), HEADLINE, ["table_theory"])["table_theory"]
    assert f"measured ratio with its {THEORY_CHECK_WORDS['qjl_vs_nbit'][1]} interval over trials" in text
    assert f"with its cluster-{THEORY_CHECK_WORDS['ks_beta'][1]} interval (clusters: trials;" in text


# The headline claim of each section of findings: the abstract quotes every one, whatever its
# verdict (issue 50, point 1: the main result and the model-level findings on the first page).
ABSTRACT_HEADLINES = {
    "claims (the asymmetry and its size)": ("C2",),
    "baseline (the sketch against no sketch, per head)": ("C10", "C10r"),
    "end to end (equal total bits, both models)": ("C10eb", "G10eb"),
    "baselines end to end (KIVI, query-aware water-filling)": ("C21a", "G21a", "C22a", "G22a"),
    "card (the measured allocation)": ("C25b",),
    "retrieval (passkey)": ("C24b",),
}


def test_the_abstract_states_every_sections_headline_and_is_not_build_conditional():
    abstract = (PAPER / "sections" / "abstract.tex").read_text(encoding="utf-8")
    prose = "\n".join(line for line in abstract.splitlines() if not line.lstrip().startswith("%"))
    quoted = set(re.findall(r"\\claim(?:ci|verdict|id)?\{([A-Z]+\d+[a-z]*)\}", prose))
    for section, ids in ABSTRACT_HEADLINES.items():
        assert set(ids) <= quoted, (section, sorted(set(ids) - quoted))
    # every quoted claim is declared (a typo would print n/a)
    declared = {c["id"] for c in yaml.safe_load((ROOT / "config" / "claims.yaml").read_text())["claims"]}
    assert quoted <= declared, sorted(quoted - declared)
    # one text for every build: no conditional, no "optional" part of the study
    for word in ("\\if", "\\IfFileExists", "\\ifcsname", "optional"):
        assert word not in prose, word


def test_the_ledger_is_in_the_appendix_once_and_the_main_text_answers_the_readers_questions():
    main = (PAPER / "main.tex").read_text(encoding="utf-8")
    body = main[main.index("\\begin{document}"):]
    inputs = re.findall(r"^\\input\{\\kvpaperdir sections/([a-z0-9_]+)\}", body, flags=re.M)
    appendix_at = body.index("\\appendix")
    after = set(re.findall(r"^\\input\{\\kvpaperdir sections/([a-z0-9_]+)\}", body[appendix_at:], flags=re.M))
    assert "\\label{app:start}" in body[appendix_at:]  # the paper stage counts the main text's pages by it
    # the main text, in the reader's order; the ledger, the claims one by one, the disagreements
    # and the frontier after the appendix starts
    main_text = [name for name in inputs if name not in after]
    assert main_text == ["abstract", "introduction", "study", "definitions", "setup", "perhead", "baseline",
                         "endtoend", "card", "limitations"]
    assert {"ledger", "claims", "disagreements", "frontier", "reproduce"} <= after
    # the ledger float once, in the appendix's ledger section
    uses = {path.stem: path.read_text(encoding="utf-8").count("\\kvtable{claims}") for path in HAND_WRITTEN}
    assert {k: v for k, v in uses.items() if v} == {"ledger": 1}
