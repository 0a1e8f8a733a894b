"""The claims ledger rendered for people: Markdown, HTML (the Snakemake report) and LaTeX macros.

Every number goes through the one formatter (:mod:`kvasym.render.format`): the ledger, the
report and the paper print the same digits. Claim ids reach LaTeX unmangled: each number of a
claim is a macro named by the claim's id as typed in ``config/claims.yaml``, defined with
``\\csname`` (:func:`claim_macro`) and read in the prose as ``\\claim{C2r}{Estimate}``, so
``git grep C2r`` finds the claim, its macros and every sentence that quotes it.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..artifacts import model_pattern, pattern
from ..real.model_registry import PRIMARY
from .format import escape_latex
from .format import ci_text, sig, sig_text

__all__ = ["CLAIM_FIELDS", "claim_macro", "claim_macro_definition", "render_html", "render_latex",
           "render_markdown"]

#: The fields of every evaluated claim that ``claims.tex`` defines (``\claim{<id>}{<field>}``).
#: ``CI`` is the interval as the paper prints it (``\claimci``): ``[low, high]``, or
#: "(interval unbounded)" where both ends are infinite; ``DecidedBy`` the test the verdict rests
#: on (:func:`kvasym.claims.decided_by_words`).
CLAIM_FIELDS = ("Estimate", "Low", "High", "CI", "LogP", "Verdict", "DecidedBy", "Paper", "Theory", "MinLogP",
                "Trials", "NCells", "NBetter", "NWorse")
_VERDICT_COLORS = {"holds": "#1b7837", "does not hold": "#b2182b", "inconclusive": "#8c6d1f",
                   "determined by construction": "#4d4d4d"}


def claim_macro(claim_id: str, field: str) -> str:
    """The control-sequence name of one field of one claim: ``claim:C2r:Estimate``.

    The id is kept as typed (``[A-Za-z0-9][A-Za-z0-9_.+-]*``, checked by
    :func:`kvasym.claims.load_claims`); ``\\csname`` accepts those characters, so no spelling
    of digits as words is needed and a claim id greps to its macros.
    """
    return f"claim:{claim_id}:{field}"


def claim_macro_definition(claim_id: str, field: str, body: str) -> str:
    """``\\expandafter\\newcommand\\csname claim:<id>:<field>\\endcsname{<body>}``: a second
    definition of the same field is a LaTeX error, as with any ``\\newcommand``."""
    return f"\\expandafter\\newcommand\\csname {claim_macro(claim_id, field)}\\endcsname{{{body}}}"


def _log10_p_text(value: Any) -> str:
    return "n/a" if value is None or not math.isfinite(float(value)) else f"{float(value):.1f}"


def _paper_text(r: Mapping[str, Any]) -> str:
    return r.get("paper_text") or ("" if r.get("paper_value") is None else sig_text(r["paper_value"]))


def _ci_text(r: Mapping[str, Any]) -> str:
    """The interval of a ledger row as text: ``[a, b]``, ``unbounded`` (never ``[-inf, inf]``)."""
    return ci_text(r.get("low"), r.get("high"))


def _decided_by(r: Mapping[str, Any], latex: bool = False) -> str:
    """The test a row's verdict rests on (:func:`kvasym.claims.decided_by_words`)."""
    from ..claims import decided_by_words

    return decided_by_words(r, latex=latex)


def render_markdown(results: Sequence[Mapping[str, Any]]) -> str:
    """The ledger as a Markdown table (``results/claims/claims.md``): beside each verdict the test
    it rests on (:func:`kvasym.claims.decided_by_words`), an unbounded interval as "unbounded"."""
    lines = [
        "# Claims ledger",
        "",
        "Every number below is computed by the pipeline from its own data (`results/stats`, `results/theory`).",
        "",
        "The column *decided by* names the test each verdict rests on; a row's p decides only where it says so.",
        "",
        "| id | claim | paper | measured | 95% CI | log10 p | verdict | decided by | why |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        logp = "" if r.get("log10_p") is None else _log10_p_text(r["log10_p"])
        lines.append(f"| {r['id']} | {r['statement']} | {_paper_text(r)} | {sig_text(r.get('estimate'))} | "
                     f"{_ci_text(r)} | {logp} | **{r['verdict']}** | {_decided_by(r)} | {r['reason']} |")
    return "\n".join(lines) + "\n"


def render_html(results: Sequence[Mapping[str, Any]]) -> str:
    """The ledger as a self-contained HTML page (the Snakemake report shows it as a result).
    Every string from the claims file or the data is HTML-escaped."""

    def cell(value: Any) -> str:
        return f"<td>{html.escape(str(value))}</td>"

    rows = []
    for r in results:
        logp = "" if r.get("log10_p") is None else _log10_p_text(r["log10_p"])
        color = _VERDICT_COLORS.get(r["verdict"], "black")
        rows.append(
            "<tr>" + cell(r["id"]) + cell(r["statement"]) + cell(_paper_text(r)) + cell(sig_text(r.get("estimate")))
            + cell(_ci_text(r)) + cell(logp)
            + f'<td style="color:{color};font-weight:bold">{html.escape(str(r["verdict"]))}</td>'
            + cell(_decided_by(r)) + cell(r["reason"]) + "</tr>"
        )
    verdicts = list(dict.fromkeys([*_VERDICT_COLORS, *(r["verdict"] for r in results)]))
    counts = {v: sum(r["verdict"] == v for r in results) for v in verdicts}
    summary = ", ".join(f"{n} {html.escape(v)}" for v, n in counts.items() if n)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Claims ledger</title>\n"
        "<style>body{font-family:sans-serif;font-size:14px;margin:1em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 6px;vertical-align:top}th{background:#eee;text-align:left}</style>"
        "</head><body>\n<h1>Claims ledger</h1>\n"
        f"<p>{len(results)} claims: {summary}. Every number is computed by the pipeline from its own data "
        "(results/stats, results/theory).</p>\n<table>\n<thead><tr><th>id</th><th>claim</th><th>paper</th>"
        "<th>measured</th><th>95% CI</th><th>log10 p</th><th>verdict</th><th>decided by</th><th>why</th></tr></thead>\n"
        "<tbody>\n"
        + "\n".join(rows) + "\n</tbody></table>\n</body></html>\n"
    )


def _number_macro(x: Any) -> str:
    """A number for text or math mode: ``\\ensuremath{4.57\\times10^{-4}}``; ``n/a`` when missing."""
    text = sig(x)
    return "n/a" if text == "n/a" else f"\\ensuremath{{{text}}}"


def _count_text(x: Any) -> str:
    return str(int(x)) if isinstance(x, (int, float)) and math.isfinite(x) else "n/a"


def _interval_macro(low: Any, high: Any) -> str:
    """``\\claimci``'s interval: ``[\\ensuremath{a}, \\ensuremath{b}]``, ``(interval unbounded)``
    when both ends are infinite (an unbounded set is no measurement), an open end at one
    infinite end, ``[n/a, n/a]`` when an end is missing."""
    try:
        ends = (float(low), float(high))
    except (TypeError, ValueError):
        ends = (math.nan, math.nan)
    if any(math.isnan(x) for x in ends):
        return f"[{_number_macro(low)}, {_number_macro(high)}]"
    if all(math.isinf(x) for x in ends):
        return "(interval unbounded)"
    left, right = ("(" if math.isinf(ends[0]) else "["), (")" if math.isinf(ends[1]) else "]")
    return f"{left}{_number_macro(low)}, {_number_macro(high)}{right}"


def render_latex(results: Sequence[Mapping[str, Any]]) -> str:
    """``claims.tex``: one macro per field of :data:`CLAIM_FIELDS` of every claim."""
    lines = ["% Generated by the kvasym claims stage (kvasym.render.claims): do not edit.", ""]
    for r in results:
        paper = r.get("paper_text")
        values = {
            "Estimate": _number_macro(r.get("estimate")),
            "Low": _number_macro(r.get("low")),
            "High": _number_macro(r.get("high")),
            "CI": _interval_macro(r.get("low"), r.get("high")),
            "LogP": escape_latex(_log10_p_text(r.get("log10_p"))),
            "Verdict": escape_latex(str(r["verdict"])),
            # the test the verdict rests on (LaTeX-safe words, p in math mode)
            "DecidedBy": _decided_by(r, latex=True) or "n/a",
            "Paper": escape_latex(str(paper)) if paper else _number_macro(r.get("paper_value")),
            # the closed form beside a measured theory ratio (n/a for other statistics)
            "Theory": _number_macro((r.get("details") or {}).get("theory")),
            # the smallest log10 p the per-trial test can reach, and the trials it has (kl_ratio)
            "MinLogP": escape_latex(_log10_p_text((r.get("details") or {}).get("min_attainable_log10_p"))),
            "Trials": _count_text((r.get("details") or {}).get("n_units", (r.get("details") or {}).get("n_trials"))),
            # claims over cells: all cells, those where the first scheme is significantly better,
            # and those where it is significantly worse
            "NCells": _count_text((r.get("details") or {}).get("n_cells")),
            "NBetter": _count_text((r.get("details") or {}).get("n_a_significantly_better")),
            "NWorse": _count_text((r.get("details") or {}).get("n_b_significantly_better")),
        }
        lines += [claim_macro_definition(str(r["id"]), name, value) for name, value in values.items()]
    return "\n".join(lines) + "\n"


#: The rule (= stage) that computes each table a claim reads (the gathered tables' parts are
#: computed by stats and theory, then concatenated by gather).
_COMPUTED_BY: dict[str, str] = {"comparisons": "stats", "summary": "stats", "trials": "stats", "theory": "theory",
                                "e2e_comparisons": "e2e_stats", "e2e_equal_bits": "e2e_stats",
                                "e2e_agreement": "e2e_stats", "e2e_long_summary": "e2e_stats",
                                "passkey_summary": "e2e_stats", "card_comparisons": "card",
                                "frontier_units": "frontier", "seq_len_slopes": "seq_len_sweep"}
#: Where each table a claim reads comes from: rule and stage (the same word), and its file
#: (:mod:`kvasym.artifacts`; a per-model file, the card's, is the primary model's: the one the
#: claims read).
TABLE_SOURCES: dict[str, tuple[str, str]] = {name: (stage, model_pattern(name, PRIMARY))
                                             for name, stage in _COMPUTED_BY.items()}
#: Metrics rules feeding the stats of a distribution, by its kind of rows.
_METRICS_RULES = {"real": "real_metrics", "synthetic": "cells"}


def _reads_real_rows(where: Mapping[str, Any]) -> bool:
    from ..real.evaluate import REAL_DISTRIBUTIONS

    named = [where.get(key) for key in ("distribution", "num", "den")] + list(where.get("distributions") or [])
    return any(name in REAL_DISTRIBUTIONS for name in named)


def claims_map_markdown(claims: Sequence[Mapping[str, Any]]) -> str:
    """README's table from each claim to the rules, stages, files and macros that carry it.

    ``claims``: the claims file's list (:func:`kvasym.claims.load_claims`). Every claim is
    decided by rule and stage ``claims`` (``results/claims/claims.json``, macros
    ``claim:<id>:<field>`` of ``paper/generated/claims.tex``); the table names the statistic,
    the test its verdict rests on (:func:`kvasym.claims.decided_by_words`: the claim's
    ``decided_by`` or its statistic's default), the gathered tables it reads and the stages that
    compute them (its record in :data:`kvasym.claims.STATISTICS`).

    Parameters
    ----------
    claims : Sequence of Mapping
        The claims, each with ``id``, ``statistic`` and ``where``.

    Returns
    -------
    str
        The Markdown table, one row per claim.
    """
    from ..claims import STATISTICS

    lines = ["| claim | statistic | decided by | reads (rule = stage -> file) | measured by | ledger | paper macro |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for claim in claims:
        cid, statistic = str(claim["id"]), STATISTICS[str(claim["statistic"])]
        reads = "; ".join(f"`{TABLE_SOURCES[t][0]}` -> `{TABLE_SOURCES[t][1]}`" for t in statistic.tables)
        upstream = statistic.measured_by
        if upstream is None:  # the metrics rules of the rows it reads
            real = _reads_real_rows(claim.get("where") or {})
            upstream = f"`{_METRICS_RULES['real' if real else 'synthetic']}`"
            if real and "frontier_units" in statistic.tables:  # the real cells at extra budgets too
                upstream += ", `real_metrics_extra`"
            upstream += " (SmolLM2 captures)" if real else " (per distribution and d)"
        lines.append(f"| {cid} | `{statistic.name}` | {_decided_by(claim)} | {reads} | {upstream} | "
                     f"`claims` -> `{pattern('claims_json')}` "
                     f"| `\\claim{{{cid}}}{{Estimate}}` (`claim:{cid}:Estimate`) |")
    return "\n".join(lines) + "\n"


README_BEGIN = "<!-- claims-map:begin (python3 -m kvasym.render.claims --write-readme README.md) -->"
README_END = "<!-- claims-map:end -->"


def readme_block(claims_path: str = "config/claims.yaml") -> str:
    """The README block between :data:`README_BEGIN` and :data:`README_END`."""
    from ..claims import load_claims

    return f"{README_BEGIN}\n{claims_map_markdown(load_claims(claims_path))}{README_END}"


def main(argv: Sequence[str] | None = None) -> int:
    """``python3 -m kvasym.render.claims --write-readme README.md``: regenerate the claims map."""
    import argparse
    import re
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="python3 -m kvasym.render.claims", description=main.__doc__)
    parser.add_argument("--write-readme", required=True, help="the README whose claims-map block to rewrite")
    parser.add_argument("--claims", default="config/claims.yaml")
    args = parser.parse_args(argv)
    path = Path(args.write_readme)
    text = path.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(README_BEGIN) + r".*?" + re.escape(README_END), re.S)
    if not pattern.search(text):
        print(f"{path}: no claims-map block ({README_BEGIN} ... {README_END})", file=__import__("sys").stderr)
        return 2
    path.write_text(pattern.sub(lambda _: readme_block(args.claims), text), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
