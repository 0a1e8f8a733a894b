"""LaTeX tables and the paper's number macros, rendered with jinja2 from the DAG's own tables.

Templates live in ``kvasym/templates/*.tex.j2`` and use LaTeX-safe delimiters:

- ``\\VAR{expr}`` prints an expression, ``\\BLOCK{for ...}`` ... ``\\BLOCK{endfor}`` are statements,
  ``\\#{ a comment }`` is a template comment (no line statements, so ``%%`` stays a LaTeX comment);
- undefined variables raise (:class:`jinja2.StrictUndefined`);
- nothing is HTML-escaped (``autoescape=False``), but every value printed by ``\\VAR{}`` goes
  through :func:`_finalize`: a plain ``str`` (a name from the config, a claim statement, a
  verdict) is escaped with :func:`kvasym.latex.escape_latex`; only :class:`Latex` strings, which
  the number filters and the explicit ``escape`` filter return, are printed as they are; a
  float that no number filter formatted is an error. So no string from config or data can
  reach the output unescaped, even if a template forgets ``|escape``.

Number filters (also usable from Python): :func:`sig` (significant figures), :func:`num` (a
table cell, math mode, optional bold), :func:`pvalue` (a p-value given as log10 p, rendered
from the logarithm so a p that underflowed to 0 still prints, e.g. -30.4 -> ``$4\\times10^{-31}$``),
:func:`ci` (estimate [low, high]), :func:`bits` (payload + side), :func:`plain`.
Which value is bold (the best of a column in a group) is computed in Python
(:func:`best_flags`), never typed in a template.

``table_real`` sets the real-model rows (:mod:`kvasym.real`) beside the synthetic headline
distribution and compares the statistics of real and synthetic caches (:func:`real_context`);
it reads the gathered summary and, optionally, the real caches' statistics
(:mod:`kvasym.real.cachestats`) and the synthetic data manifests. Without real rows it is a
short paragraph with the command that adds them, so the paper never shows a placeholder.

Entry points for the DAG: :func:`render_tables` (the tables) and :func:`render_numbers` (the
``\\newcommand`` macros of every number the prose quotes that is not a claim macro), with
:func:`headline_cell` and :func:`numbers_slice` to build their arguments from the study; also
``python -m kvasym.tables tables|numbers ...`` (see :func:`main`).
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
import pandas as pd

from .cachestats import STATISTICS, TOP_CHANNELS
from .errors import KvasymError
from .latex import escape_latex
from .real import HEAD_DIM as REAL_HEAD_DIM
from .real import REAL_MODEL_NAME
from .real import REAL_POST_ROPE as REAL_POST
from .real import REAL_PRE_ROPE as REAL_PRE
from .real import REAL_SHARPNESS

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"

#: Table name -> (template, the ``inputs`` key it reads). ``render_tables`` writes
#: ``<out_dir>/<name>.tex`` for each.
TABLES: dict[str, tuple[str, str]] = {
    "table_results": ("table_results.tex.j2", "summary"),
    "table_tests": ("table_tests.tex.j2", "comparisons"),
    "table_theory": ("table_theory.tex.j2", "theory"),
    "table_claims": ("table_claims.tex.j2", "claims"),
    "table_disagreements": ("table_disagreements.tex.j2", "claims"),
    "table_real": ("table_real.tex.j2", "summary"),
}
INPUT_KEYS = ("summary", "comparisons", "theory", "claims")
#: Optional inputs of ``table_real`` (given only when the DAG has real-model rows): the real
#: caches' statistics (``results/real/cachestats.parquet``, :mod:`kvasym.real.cachestats`) and
#: the data manifests of the synthetic distributions at the headline dim (their statistics).
REAL_INPUT_KEYS = ("real_cachestats", "data_manifests")

#: Columns of the main results table: summary column -> which direction is better.
RESULT_COLUMNS: dict[str, str] = {
    "kl_mean": "lower",
    "kl_p99": "lower",
    "recall_top5_mean": "higher",
    "k_eps_dir_mean": "lower",
    "v_eps_dir_mean": "lower",
    "t_eps_dir_mean": "lower",
}
#: Bits a QJL side spends per coordinate (m = d sign bits): the "1" of "(n-1) scalar + 1 QJL".
QJL_BITS = 1
#: The percentile of the ``kl_p99`` column (``numpy.quantile(kl, 0.99)`` in
#: :func:`kvasym.stats.cell_summary`), quoted by the prose as "the 99th percentile".
TAIL_PERCENTILE = 99
#: Significant figures of table numbers.
DIGITS = 3
#: p >= this is printed as a decimal, smaller p in scientific notation.
P_DECIMAL_MIN = 0.01


class Latex(str):
    """A string that is already valid LaTeX (formatted numbers, escaped text): printed as is."""


# --------------------------------------------------------------------------------------------
# number formatting
# --------------------------------------------------------------------------------------------


def _missing(x: Any) -> bool:
    if x is None:
        return True
    try:
        return bool(pd.isna(x))
    except (TypeError, ValueError):
        return False


def _fixed(x: float, digits: int) -> str:
    """``x`` rounded to ``digits`` significant figures, trailing zeros kept (0.05 -> 0.0500)."""
    exponent = math.floor(math.log10(abs(x)))
    rounded = round(x, digits - 1 - exponent)
    if rounded != 0 and math.floor(math.log10(abs(rounded))) != exponent:  # 9.996 -> 10.0
        exponent += 1
        rounded = round(x, digits - 1 - exponent)
    decimals = max(digits - 1 - exponent, 0)
    return f"{rounded:.{decimals}f}"


def _scientific(mantissa_log10: float, digits: int) -> tuple[str, int]:
    """(mantissa text, exponent) of 10**mantissa_log10 with ``digits`` significant figures."""
    exponent = math.floor(mantissa_log10)
    mantissa = round(10 ** (mantissa_log10 - exponent), digits - 1)
    if mantissa >= 10:
        mantissa /= 10
        exponent += 1
        mantissa = round(mantissa, digits - 1)
    return f"{mantissa:.{digits - 1}f}", exponent


def sig(x: Any, digits: int = DIGITS) -> Latex:
    """``x`` to ``digits`` significant figures, as math-mode content (no ``$``).

    Trailing zeros are kept: ``0.054894 -> 0.0549``, ``1.6 -> 1.60``, ``4.0 -> 4.00``,
    ``-0.10677 -> -0.107``. Scientific notation for ``|x| >= 1e4`` or ``|x| < 1e-3``:
    ``123456 -> 1.23\\times10^{5}``, ``0.000123 -> 1.23\\times10^{-4}``. ``0 -> 0``, NaN or
    None -> ``n/a``.
    """
    if _missing(x):
        return Latex("n/a")
    x = float(x)
    if math.isinf(x):
        return Latex("\\infty" if x > 0 else "-\\infty")
    if x == 0:
        return Latex("0")
    if digits < 1:
        raise KvasymError(f"sig: digits must be >= 1, got {digits}")
    if 1e-3 <= abs(x) < 1e4:
        text = _fixed(x, digits)
        if abs(float(text)) < 1e4:
            return Latex(text)
    mantissa, exponent = _scientific(math.log10(abs(x)), digits)
    return Latex(f"{'-' if x < 0 else ''}{mantissa}\\times10^{{{exponent}}}")


def plain(x: Any) -> Latex:
    """A config value as typed: integers without a decimal point (2.0 -> 2), others as %g."""
    if _missing(x):
        return Latex("n/a")
    if isinstance(x, (bool, np.bool_)):
        raise KvasymError(f"plain: a boolean is not a number: {x!r}")
    x = float(x)
    return Latex(str(int(x)) if x.is_integer() and abs(x) < 1e15 else f"{x:g}")


def num(x: Any, digits: int = DIGITS, bold: bool = False) -> Latex:
    """A table cell: ``$0.0549$``, ``$\\mathbf{0.0549}$`` when ``bold``, ``--`` when missing."""
    if _missing(x):
        return Latex("--")
    text = sig(x, digits)
    return Latex(f"$\\mathbf{{{text}}}$" if bold else f"${text}$")


def count(x: Any) -> Latex:
    """An integer count."""
    if _missing(x):
        return Latex("--")
    if float(x) != int(x):
        raise KvasymError(f"count: {x!r} is not an integer")
    return Latex(str(int(x)))


def pvalue(log10_p: Any, digits: int = 1) -> Latex:
    """A p-value from its log10, as a math-mode cell.

    ``-30.4 -> $4\\times10^{-31}$`` (10**-30.4 = 3.98e-31), ``-0.4325 -> $0.37$``, ``0 -> $1$``;
    computed from the logarithm, so a p that underflowed to 0 in floating point still renders
    (``-400.2 -> $6\\times10^{-401}$``). ``-inf`` -> ``$0$`` (an exact zero), missing -> ``--``.
    """
    if _missing(log10_p):
        return Latex("--")
    lp = min(float(log10_p), 0.0)
    if math.isinf(lp):
        return Latex("$0$")
    if lp >= math.log10(P_DECIMAL_MIN):
        p = 10**lp
        return Latex(f"${'1' if p >= 0.995 else f'{p:.2g}'}$")
    mantissa, exponent = _scientific(lp, digits)
    return Latex(f"${mantissa}\\times10^{{{exponent}}}$")


def pvalue_raw(p: Any, digits: int = 1) -> Latex:
    """:func:`pvalue` of a p given on the linear scale."""
    if _missing(p):
        return Latex("--")
    return pvalue(math.log10(p) if p > 0 else -math.inf, digits)


def ci(estimate: Any, low: Any = None, high: Any = None, digits: int = DIGITS, bold: bool = False) -> Latex:
    """``$5.60\\ [5.32, 6.03]$``; the interval is left out when missing."""
    if _missing(estimate):
        return Latex("--")
    est = sig(estimate, digits)
    est = Latex(f"\\mathbf{{{est}}}") if bold else est
    if _missing(low) or _missing(high):
        return Latex(f"${est}$")
    return Latex(f"${est}\\ [{sig(low, digits)}, {sig(high, digits)}]$")


def bits(payload: Any, side: Any) -> Latex:
    """Measured bits per coordinate, payload + side information: ``$4 + 0.25$``."""
    if _missing(payload) or _missing(side):
        return Latex("--")
    return Latex(f"${float(payload):.3g} + {float(side):.3g}$")


def mediqr(median: Any, iqr: Any, digits: int = DIGITS) -> Latex:
    """A median with its interquartile range in small type: ``$114$ {\\scriptsize($0.118$)}``;
    the range is left out when missing, ``--`` when the median is."""
    if _missing(median):
        return Latex("--")
    if _missing(iqr):
        return Latex(f"${sig(median, digits)}$")
    return Latex(f"${sig(median, digits)}$ {{\\scriptsize(${sig(iqr, digits)}$)}}")


def escape(value: Any) -> Latex:
    """The ``escape`` filter: any value as literal text."""
    return value if isinstance(value, Latex) else Latex(escape_latex(str(value)))


def _finalize(value: Any) -> Any:
    """Applied to every ``\\VAR{}``: escape plain strings, refuse unformatted floats."""
    if isinstance(value, Latex):
        return value
    if isinstance(value, str):
        return escape_latex(value)
    if isinstance(value, (bool, np.bool_)):
        raise KvasymError(f"template printed a boolean ({value!r}); format it explicitly")
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        raise KvasymError(f"template printed an unformatted number {value!r}; use a number filter (sig, num, plain, ...)")
    if value is None:
        raise KvasymError("template printed None; format it with a filter that handles missing values")
    return escape_latex(str(value))


FILTERS = {
    "escape": escape,
    "e": escape,
    "sig": sig,
    "num": num,
    "plain": plain,
    "count": count,
    "pvalue": pvalue,
    "pvalue_raw": pvalue_raw,
    "ci": ci,
    "bits": bits,
    "mediqr": mediqr,
}


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The jinja2 environment of the LaTeX templates (see the module docstring)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        block_start_string="\\BLOCK{",
        block_end_string="}",
        variable_start_string="\\VAR{",
        variable_end_string="}",
        comment_start_string="\\#{",
        comment_end_string="}",
        line_statement_prefix=None,
        line_comment_prefix=None,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
        undefined=jinja2.StrictUndefined,
        finalize=_finalize,
    )
    env.filters.update(FILTERS)
    return env


def render_template(name: str, **context: Any) -> str:
    """Render one template of ``kvasym/templates`` (missing variables raise)."""
    return environment().get_template(name).render(**context)


# --------------------------------------------------------------------------------------------
# table contexts (pure functions of DataFrames, testable without files)
# --------------------------------------------------------------------------------------------


def best_flags(values: Sequence[Any], better: str) -> list[bool]:
    """Which entries are the best (``lower`` or ``higher``) of ``values``; ties are all best,
    missing values never are, and a column with one usable value has no best."""
    if better not in ("lower", "higher"):
        raise KvasymError(f"better must be 'lower' or 'higher', got {better!r}")
    arr = np.array([np.nan if _missing(v) else float(v) for v in values], dtype=float)
    ok = np.isfinite(arr)
    if ok.sum() < 2:
        return [False] * len(arr)
    target = np.min(arr[ok]) if better == "lower" else np.max(arr[ok])
    return [bool(o and v == target) for o, v in zip(ok, arr)]


def _unique(series: pd.Series) -> list[Any]:
    return list(pd.unique(series))


def _at(frame: pd.DataFrame, what: str, headline: Mapping[str, Any], keys: Sequence[str]) -> pd.DataFrame:
    """Rows of ``frame`` at the headline's ``keys`` (sharpness compared with a tolerance)."""
    mask = np.ones(len(frame), dtype=bool)
    for key in keys:
        if key not in headline:
            raise KvasymError(f"headline lacks '{key}' (needed by the {what} table)")
        if key == "sharpness":
            mask &= np.isclose(frame["sharpness"].to_numpy(dtype=float), float(headline[key]))
        else:
            mask &= (frame[key] == headline[key]).to_numpy()
    out = frame[mask]
    if out.empty:
        shown = ", ".join(f"{k}={headline[k]}" for k in keys)
        raise KvasymError(f"the {what} table has no rows at the headline cell ({shown})")
    return out


def _require(frame: pd.DataFrame, what: str, columns: Sequence[str]) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise KvasymError(f"the {what} table lacks column(s) {missing}")


def headline_budget(frame: pd.DataFrame, headline: Mapping[str, Any]) -> int:
    """The headline's budget, or the largest budget of ``frame`` when it names none."""
    if headline.get("budget") is not None:
        return int(headline["budget"])
    return int(frame["budget"].max())


def results_context(summary: pd.DataFrame, headline: Mapping[str, Any]) -> dict[str, Any]:
    """Main results: every distribution, budget and scheme at the headline dim and sharpness."""
    _require(summary, "summary", ["distribution", "kind", "dim", "budget", "sharpness", "scheme", "n_queries",
                                  *RESULT_COLUMNS, "k_bits_payload_mean", "k_bits_side_mean",
                                  "v_bits_payload_mean", "v_bits_side_mean"])
    frame = _at(summary, "summary", headline, ["dim", "sharpness"])
    schemes = _unique(frame["scheme"])
    groups = []
    for dist in _unique(frame["distribution"]):
        d = frame[frame["distribution"] == dist]
        budgets = []
        for budget in sorted(d["budget"].unique()):
            g = d[d["budget"] == budget].copy()
            g["_order"] = g["scheme"].map({s: i for i, s in enumerate(schemes)})
            g = g.sort_values("_order")
            flags = {c: best_flags(g[c].tolist(), better) for c, better in RESULT_COLUMNS.items()}
            rows = []
            for i, (_, r) in enumerate(g.iterrows()):
                row = {c: float(r[c]) for c in RESULT_COLUMNS}
                row.update(
                    scheme=str(r["scheme"]),
                    n_queries=int(r["n_queries"]),
                    k_bits_payload=float(r["k_bits_payload_mean"]), k_bits_side=float(r["k_bits_side_mean"]),
                    v_bits_payload=float(r["v_bits_payload_mean"]), v_bits_side=float(r["v_bits_side_mean"]),
                    best={c: flags[c][i] for c in RESULT_COLUMNS},
                )
                rows.append(row)
            budgets.append({"budget": int(budget), "rows": rows})
        groups.append({"distribution": str(dist), "kind": str(d["kind"].iloc[0]), "budgets": budgets})
    n_queries = sorted({int(x) for x in frame["n_queries"]})
    from .metrics import ROUTING_TOPK

    return {
        "topk": ROUTING_TOPK,
        "dim": int(headline["dim"]),
        "sharpness": float(headline["sharpness"]),
        "n_queries": n_queries[0] if len(n_queries) == 1 else None,
        "groups": groups,
    }


def tests_context(comparisons: pd.DataFrame, headline: Mapping[str, Any]) -> dict[str, Any]:
    """Scheme-pair tests at the headline dim, sharpness and budget, per distribution."""
    _require(comparisons, "comparisons", [
        "distribution", "dim", "budget", "sharpness", "scheme_a", "scheme_b", "metric", "ratio_mean",
        "ratio_mean_low", "ratio_mean_high", "q_rank_biserial", "q_ks_d", "q_log10_p", "q_log10_p_holm",
        "t_wilcoxon_log10_p_holm", "energy", "energy_log10_p_holm", "n_a", "n_trials",
    ])
    budget = headline_budget(comparisons, headline)
    frame = _at(comparisons, "comparisons", {**headline, "budget": budget}, ["dim", "sharpness", "budget"])
    kl = frame[frame["metric"] == "kl"]
    energy = frame[frame["metric"] == "error6d"].set_index(["distribution", "scheme_a", "scheme_b"])
    if kl.empty:
        raise KvasymError("the comparisons table has no KL rows at the headline cell")
    groups = []
    for dist in _unique(kl["distribution"]):
        rows = []
        for _, r in kl[kl["distribution"] == dist].iterrows():
            key = (dist, r["scheme_a"], r["scheme_b"])
            e = energy.loc[key] if key in energy.index else None
            if isinstance(e, pd.DataFrame):
                e = e.iloc[0]
            rows.append({
                "a": str(r["scheme_a"]), "b": str(r["scheme_b"]),
                "ratio": float(r["ratio_mean"]), "ratio_low": float(r["ratio_mean_low"]), "ratio_high": float(r["ratio_mean_high"]),
                "rank_biserial": float(r["q_rank_biserial"]), "ks_d": float(r["q_ks_d"]),
                "q_log10_p": float(r["q_log10_p"]), "q_log10_p_holm": float(r["q_log10_p_holm"]),
                "t_log10_p_holm": float(r["t_wilcoxon_log10_p_holm"]),
                "energy": math.nan if e is None else float(e["energy"]),
                "energy_log10_p_holm": math.nan if e is None else float(e["energy_log10_p_holm"]),
            })
        groups.append({"distribution": str(dist), "rows": rows})
    n_q = sorted({int(x) for x in kl["n_a"]})
    n_t = sorted({int(x) for x in kl["n_trials"]})
    return {
        "dim": int(headline["dim"]), "sharpness": float(headline["sharpness"]), "budget": budget,
        "n_queries": n_q[0] if len(n_q) == 1 else None, "n_trials": n_t[0] if len(n_t) == 1 else None,
        "groups": groups,
    }


def theory_context(theory: pd.DataFrame) -> dict[str, Any]:
    """QJL variance ratios (measured with CI, closed form) per (distribution, dim, budget) and
    the KS test of rotated key coordinates against the Beta law per (distribution, dim)."""
    _require(theory, "theory", ["distribution", "dim", "check", "budget", "estimate", "low", "high", "theory", "statistic", "p"])
    groups = []
    for dist, dim in dict.fromkeys(zip(theory["distribution"], theory["dim"])):
        t = theory[(theory["distribution"] == dist) & (theory["dim"] == dim)]
        ks = t[t["check"] == "ks_beta"]
        rows = []
        for budget in sorted(t.loc[t["check"].isin(["qjl_vs_residual", "qjl_vs_nbit"]), "budget"].unique()):
            row: dict[str, Any] = {"budget": int(budget)}
            for check, label in (("qjl_vs_residual", "residual"), ("qjl_vs_nbit", "nbit")):
                hit = t[(t["check"] == check) & (t["budget"] == budget)]
                r = hit.iloc[0] if not hit.empty else None
                for field in ("estimate", "low", "high", "theory"):
                    row[f"{label}_{field}"] = math.nan if r is None else float(r[field])
            rows.append(row)
        groups.append({
            "distribution": str(dist), "dim": int(dim), "rows": rows,
            "ks_d": float(ks["statistic"].iloc[0]) if not ks.empty else math.nan,
            "ks_p": float(ks["p"].iloc[0]) if not ks.empty else math.nan,
        })
    if not groups:
        raise KvasymError("the theory table is empty")
    return {"groups": groups}


def _claim_row(r: Mapping[str, Any]) -> dict[str, Any]:
    details = r.get("details") or {}
    cells = None
    if "n_cells" in details and "n_a_significantly_better" in details:
        cells = {"better": int(details["n_a_significantly_better"]), "worse": int(details.get("n_b_significantly_better", 0)),
                 "n": int(details["n_cells"])}
    paper_value = r.get("paper_value")
    return {
        "id": str(r["id"]),
        "statement": str(r.get("statement", "")),
        "paper_text": r.get("paper_text"),
        "paper_value": math.nan if paper_value is None else float(paper_value),
        "estimate": math.nan if r.get("estimate") is None else float(r["estimate"]),
        "low": math.nan if r.get("low") is None else float(r["low"]),
        "high": math.nan if r.get("high") is None else float(r["high"]),
        "log10_p": math.nan if r.get("log10_p") is None else float(r["log10_p"]),
        "verdict": str(r["verdict"]),
        "reason": str(r.get("reason", "")),
        "cells": cells,
    }


def claims_context(claims: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The claims ledger, in the claims file's order; ``disagreements``: the evaluated claims
    whose verdict is not *holds*."""
    rows = [_claim_row(r) for r in claims]
    return {
        "claims": rows,
        "disagreements": [r for r in rows if r["verdict"] not in ("holds", "not evaluated")],
        "n_not_evaluated": sum(r["verdict"] == "not evaluated" for r in rows),
    }


# --------------------------------------------------------------------------------------------
# real keys beside synthetic ones (table_real)
# --------------------------------------------------------------------------------------------

#: Columns of the real-vs-synthetic results table: summary column -> which direction is better.
REAL_RESULT_COLUMNS: dict[str, str] = {
    "kl_mean": "lower",
    "kl_p99": "lower",
    "recall_top5_mean": "higher",
    "t_eps_dir_mean": "lower",
}
#: The real distributions in table order, and what each quantizes.
REAL_ROPE_LABELS: dict[str, str] = {REAL_POST: "K after RoPE", REAL_PRE: "K before RoPE"}
#: Statistics of :func:`kvasym.cachestats.cache_statistics` (the cache-statistics table's columns).
#: Row labels of the tensors: the data manifests' ``keys``/``values`` and the capture arrays.
TENSOR_LABELS: dict[str, str] = {
    "keys": "K",
    "values": "V",
    "k_post_rope": "K after RoPE",
    "k_pre_rope": "K before RoPE",
    "v": "V",
    "q_post_rope": "Q after RoPE",
    "q_pre_rope": "Q before RoPE",
}
REAL_CACHESTATS_COLUMNS = ("text", "layer", "kv_head", "head", "tensor", "head_dim", *STATISTICS)
MANIFEST_STATS_COLUMNS = ("distribution", "kind", "dim", "trial", "tensor", *STATISTICS)


def median_iqr(values: Sequence[Any]) -> tuple[float, float]:
    """(median, interquartile range = 75th - 25th percentile, linear interpolation) of the
    finite values; (nan, nan) when there are none."""
    arr = np.asarray(values, dtype=float)
    arr = arr[np.isfinite(arr)]
    if arr.size == 0:
        return math.nan, math.nan
    q25, q50, q75 = np.quantile(arr, [0.25, 0.5, 0.75])
    return float(q50), float(q75 - q25)


def manifest_statistics(manifest: Mapping[str, Any], where: str = "data manifest") -> pd.DataFrame:
    """The per-trial cache statistics of one data manifest (:func:`kvasym.pipeline.run_data`)
    as rows (:data:`MANIFEST_STATS_COLUMNS`, ``tensor`` = ``keys`` or ``values``)."""
    try:
        spec = manifest["slice"]["distribution"]
        name, kind, dim = str(spec["name"]), str(spec["kind"]), int(manifest["slice"]["dim"])
        trials = manifest["trials"]
    except (KeyError, TypeError, ValueError) as exc:
        raise KvasymError(f"{where}: not a data manifest (lacks slice.distribution.name/kind, slice.dim or trials: {exc!r})") from None
    if not isinstance(trials, list) or not trials:
        raise KvasymError(f"{where}: the data manifest lists no trials")
    rows = []
    for i, trial in enumerate(trials):
        for tensor in ("keys", "values"):
            stats = trial.get(tensor) if isinstance(trial, Mapping) else None
            if not isinstance(stats, Mapping):
                raise KvasymError(f"{where}: trial {i} has no '{tensor}' statistics (rerun the data rule)")
            missing = [s for s in STATISTICS if s not in stats]
            if missing:
                raise KvasymError(f"{where}: trial {i} '{tensor}' statistics lack {missing} (rerun the data rule)")
            try:
                values = {s: float(stats[s]) for s in STATISTICS}
            except (TypeError, ValueError) as exc:
                raise KvasymError(f"{where}: trial {i} '{tensor}' statistics are not numbers ({exc})") from None
            rows.append({"distribution": name, "kind": kind, "dim": dim, "trial": int(trial.get("trial", i)),
                         "tensor": tensor, **values})
    return pd.DataFrame(rows, columns=list(MANIFEST_STATS_COLUMNS))


def _stat_row(frame: pd.DataFrame, source: str, tensor: str, dim: int) -> dict[str, Any]:
    row: dict[str, Any] = {"source": source, "tensor": TENSOR_LABELS.get(tensor, tensor), "dim": int(dim),
                           "n": int(len(frame))}
    for stat in STATISTICS:
        row[stat] = median_iqr(frame[stat].to_numpy(dtype=float))
    if "head_dim" in frame.columns:
        fraction = frame["participation_ratio"].to_numpy(dtype=float) / frame["head_dim"].to_numpy(dtype=float)
    else:
        fraction = frame["participation_ratio"].to_numpy(dtype=float) / float(dim)
    row["pr_fraction"] = median_iqr(fraction)
    return row


def _real_results(summary: pd.DataFrame, headline: Mapping[str, Any]) -> dict[str, Any]:
    """The side-by-side results: the synthetic headline distribution, then each real distribution."""
    synthetic = _at(summary, "summary", headline, ["distribution", "dim", "sharpness"])
    real_all = summary[summary["distribution"].isin(list(REAL_ROPE_LABELS))]
    real = real_all[np.isclose(real_all["sharpness"].to_numpy(dtype=float), REAL_SHARPNESS)]
    if real.empty:
        raise KvasymError(f"the summary's real rows have no sharpness {REAL_SHARPNESS:g} (the model's own attention)")
    groups = [{"distribution": str(headline["distribution"]), "real": False, "what": "synthetic",
               "dim": int(headline["dim"]), "sharpness": float(headline["sharpness"]), "frame": synthetic}]
    for name, what in REAL_ROPE_LABELS.items():
        part = real[real["distribution"] == name]
        if part.empty:
            continue
        dims = sorted({int(x) for x in part["dim"]})
        if len(dims) != 1:
            raise KvasymError(f"the summary's real distribution {name} has several dims {dims}")
        groups.append({"distribution": name, "real": True, "what": what, "dim": dims[0],
                       "sharpness": REAL_SHARPNESS, "frame": part})
    schemes = list(dict.fromkeys([*_unique(synthetic["scheme"]), *_unique(real["scheme"])]))
    budgets = sorted({int(b) for g in groups for b in g["frame"]["budget"]})
    rows_by_budget = []
    for budget in budgets:
        cells: dict[str, list[dict[str, Any]]] = {s: [] for s in schemes}
        for g in groups:
            f = g["frame"]
            at = f[f["budget"] == budget]
            values = {}
            for scheme in schemes:
                hit = at[at["scheme"] == scheme]
                if len(hit) > 1:
                    raise KvasymError(f"the summary has {len(hit)} rows for {g['distribution']}, d={g['dim']}, "
                                      f"n={budget}, {scheme}")
                values[scheme] = {c: (float(hit[c].iloc[0]) if len(hit) else math.nan) for c in REAL_RESULT_COLUMNS}
            flags = {c: best_flags([values[s][c] for s in schemes], better) for c, better in REAL_RESULT_COLUMNS.items()}
            for i, scheme in enumerate(schemes):
                cells[scheme].append({**values[scheme], "best": {c: flags[c][i] for c in REAL_RESULT_COLUMNS}})
        rows_by_budget.append({"budget": budget, "rows": [{"scheme": str(s), "cells": cells[s]} for s in schemes]})
    real_trials = sorted({int(x) for x in real["n_trials"]}) if "n_trials" in real.columns else []
    real_queries = sorted({int(x) for x in real["n_queries"]})
    return {
        "groups": [{k: v for k, v in g.items() if k != "frame"} for g in groups],
        "dims": list(dict.fromkeys(g["dim"] for g in groups)),
        "sharpness_values": list(dict.fromkeys(g["sharpness"] for g in groups)),
        "budgets": rows_by_budget,
        "n_trials": real_trials[0] if len(real_trials) == 1 else None,
        "n_queries": real_queries[0] if len(real_queries) == 1 else None,
        "real_dim": groups[1]["dim"] if len(groups) > 1 else None,
        "heatmap_budget": headline_budget(real, headline),
    }


def _statistics_rows(cachestats: pd.DataFrame | None, manifests: pd.DataFrame | None,
                     headline: Mapping[str, Any]) -> dict[str, Any] | None:
    """The cache-statistics table: synthetic distributions at the headline dim (per trial, K
    and V), then the real tensors (per text, layer and head)."""
    if cachestats is None and manifests is None:
        return None
    synthetic_rows: list[dict[str, Any]] = []
    n_trials: list[int] = []
    if manifests is not None:
        _require(manifests, "data-manifest statistics", MANIFEST_STATS_COLUMNS)
        at_dim = manifests[manifests["dim"] == int(headline["dim"])]
        if at_dim.empty:
            raise KvasymError(f"no data manifest at the headline dim {int(headline['dim'])} "
                              f"(have dims {sorted({int(d) for d in manifests['dim']})})")
        for dist in _unique(at_dim["distribution"]):
            d = at_dim[at_dim["distribution"] == dist]
            n_trials.append(int(d["trial"].nunique()))
            for tensor in ("keys", "values"):
                part = d[d["tensor"] == tensor]
                if not part.empty:
                    synthetic_rows.append(_stat_row(part, str(dist), tensor, int(headline["dim"])))
    real_rows: list[dict[str, Any]] = []
    texts = layers = None
    if cachestats is not None:
        _require(cachestats, "real cache statistics", REAL_CACHESTATS_COLUMNS)
        if cachestats.empty:
            raise KvasymError("the real cache statistics table is empty")
        present = _unique(cachestats["tensor"])
        order = [t for t in TENSOR_LABELS if t in present] + [t for t in present if t not in TENSOR_LABELS]
        for tensor in order:
            part = cachestats[cachestats["tensor"] == tensor]
            dims = sorted({int(x) for x in part["head_dim"]})
            if len(dims) != 1:
                raise KvasymError(f"the real cache statistics of {tensor} mix head dims {dims}")
            real_rows.append(_stat_row(part, REAL_MODEL_NAME, str(tensor), dims[0]))
        texts = int(cachestats["text"].nunique())
        layers = int(cachestats["layer"].nunique())
    for rows in (synthetic_rows, real_rows):
        for i, row in enumerate(rows):
            row["show_source"] = i == 0 or rows[i - 1]["source"] != row["source"]
    trials = sorted(set(n_trials))
    return {
        "synthetic": synthetic_rows,
        "real": real_rows,
        "synthetic_dim": int(headline["dim"]),
        "synthetic_trials": trials[0] if len(trials) == 1 else None,
        "real_dim": real_rows[0]["dim"] if real_rows else None,
        "n_texts": texts,
        "n_layers": layers,
    }


def real_context(
    summary: pd.DataFrame,
    headline: Mapping[str, Any],
    cachestats: pd.DataFrame | None = None,
    manifests: pd.DataFrame | None = None,
) -> dict[str, Any]:
    """Real keys beside synthetic ones (``table_real``).

    Without real rows in ``summary`` (distributions :data:`kvasym.real.REAL_POST_ROPE` and
    :data:`~kvasym.real.REAL_PRE_ROPE`): ``has_real`` False and the command that adds them.
    With them: the results of every budget and scheme for the synthetic headline distribution
    (its dim and sharpness) and each real distribution (sharpness :data:`REAL_SHARPNESS`), bold
    flags per distribution, budget and column; the cache-statistics rows (median and IQR) when
    ``cachestats`` (:mod:`kvasym.real.cachestats`'s table) and/or ``manifests``
    (:func:`manifest_statistics` rows) are given; and the heat-map figure's budget.
    """
    from .metrics import ROUTING_TOPK
    from .real import INSTALL_COMMANDS

    _require(summary, "summary", ["distribution", "dim", "budget", "sharpness", "scheme", "n_queries",
                                  *REAL_RESULT_COLUMNS])
    base = {"has_real": False, "model": REAL_MODEL_NAME, "install": INSTALL_COMMANDS, "topk": ROUTING_TOPK,
            "top_channels": TOP_CHANNELS, "tail_percentile": TAIL_PERCENTILE, "post_name": REAL_POST}
    if not summary["distribution"].isin(list(REAL_ROPE_LABELS)).any():
        return base
    return {**base, "has_real": True, **_real_results(summary, headline),
            "stats": _statistics_rows(cachestats, manifests, headline)}



# --------------------------------------------------------------------------------------------
# rendering to files
# --------------------------------------------------------------------------------------------


def read_data_manifests(paths: Sequence[str | os.PathLike]) -> pd.DataFrame:
    """The per-trial cache statistics of data manifests (:func:`manifest_statistics`), one
    frame; a missing, unreadable or malformed manifest raises a KvasymError naming it."""
    frames = []
    for path in paths:
        p = Path(path)
        if not p.is_file():
            raise KvasymError(f"table input 'data_manifests': {p}: no such file")
        try:
            manifest = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise KvasymError(f"{p}: not a readable data manifest ({type(exc).__name__}: {exc})") from None
        if not isinstance(manifest, Mapping):
            raise KvasymError(f"{p}: a data manifest must be a JSON object")
        frames.append(manifest_statistics(manifest, str(p)))
    if not frames:
        raise KvasymError("table input 'data_manifests': no manifest given")
    return pd.concat(frames, ignore_index=True)


def _read_input(key: str, path: Any) -> Any:
    if key == "data_manifests":
        return read_data_manifests([path] if isinstance(path, (str, os.PathLike)) else list(path))
    p = Path(path)
    if not p.exists():
        raise KvasymError(f"table input {key!r}: {p}: no such file")
    if key == "claims":
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise KvasymError(f"{p}: not valid JSON ({exc})") from None
        if not isinstance(data, list):
            raise KvasymError(f"{p}: the claims ledger must be a JSON list")
        return data
    from .dataset import read_parquet_checked

    frame = read_parquet_checked(p)
    if key == "real_cachestats":
        _require(frame, f"real cache statistics ({p})", REAL_CACHESTATS_COLUMNS)
    return frame


def table_texts(frames: Mapping[str, Any], headline: Mapping[str, Any], tables: Sequence[str] | None = None) -> dict[str, str]:
    """Render tables from in-memory inputs (``summary``/``comparisons``/``theory`` DataFrames,
    ``claims`` the parsed claims.json list; for ``table_real``, optionally ``real_cachestats``
    (:mod:`kvasym.real.cachestats`'s table) and ``data_manifests`` (:func:`manifest_statistics`
    rows)): table name -> LaTeX text."""
    names = list(TABLES) if tables is None else list(tables)
    unknown = set(names) - set(TABLES)
    if unknown:
        raise KvasymError(f"unknown table(s) {sorted(unknown)}; known: {', '.join(TABLES)}")
    contexts: dict[str, dict[str, Any]] = {}
    out = {}
    for name in names:
        template, key = TABLES[name]
        if key not in frames:
            raise KvasymError(f"table {name} needs the input {key!r}")
        if name == "table_real":
            context = real_context(frames[key], headline, frames.get("real_cachestats"), frames.get("data_manifests"))
            out[name] = render_template(template, **context)
            continue
        if key not in contexts:
            if key == "summary":
                contexts[key] = results_context(frames[key], headline)
            elif key == "comparisons":
                contexts[key] = tests_context(frames[key], headline)
            elif key == "theory":
                contexts[key] = theory_context(frames[key])
            else:
                contexts[key] = claims_context(frames[key])
        out[name] = render_template(template, **contexts[key])
    return out


def render_tables(
    inputs: Mapping[str, Any],
    headline: Mapping[str, Any],
    out_dir: str | os.PathLike,
    tables: Sequence[str] | None = None,
) -> list[Path]:
    """Write ``<out_dir>/<table>.tex`` (atomically) for each table of :data:`TABLES`.

    ``inputs``: ``summary``, ``comparisons``, ``theory`` (Parquet, ``results/stats/*.parquet``
    and ``results/theory/theory.parquet``) and ``claims`` (``results/claims/claims.json``);
    only the inputs of the requested ``tables`` (default: all) are needed. Optional, read by
    ``table_real`` only: ``real_cachestats`` (``results/real/cachestats.parquet``) and
    ``data_manifests`` (a list of ``results/data/<dist>/d<dim>.json``).
    ``headline``: ``dim`` and ``sharpness`` (the main-results and tests tables), optional
    ``budget`` (the tests table; default the largest budget). Returns the written paths.
    """
    from .pipeline import write_text_atomic

    names = list(TABLES) if tables is None else list(tables)
    needed = {TABLES[n][1] for n in names if n in TABLES}
    missing = sorted(needed - set(inputs))
    if missing:
        raise KvasymError(f"render_tables: missing input(s) {missing} (have {sorted(inputs)})")
    if "table_real" in names:
        needed |= {key for key in REAL_INPUT_KEYS if inputs.get(key)}
    frames = {key: _read_input(key, inputs[key]) for key in sorted(needed)}
    texts = table_texts(frames, headline, names)
    out = Path(out_dir)
    written = []
    for name, text in texts.items():
        path = out / f"{name}.tex"
        write_text_atomic(text, path)
        written.append(path)
    return written


# --------------------------------------------------------------------------------------------
# numbers.tex: the macros of every number the prose quotes that is not a claim macro
# --------------------------------------------------------------------------------------------

#: Formulas the prose typesets (math-mode content). They hold digits, so they live here and
#: not in the hand-written sources, which quote only macros.
FORMULAS: dict[str, str] = {
    "PiHalf": r"\pi/2",
    "TwoPi": r"2\pi",
    "NMinusOne": rf"n-{QJL_BITS}",
    "LogTen": r"\log_{10}",
    "BetaLaw": r"\mathrm{Beta}\bigl((d-1)/2,\,(d-1)/2\bigr)",
    "BetaDensity": r"f(x) \propto (1-x^2)^{(d-3)/2}",
    "BetaMap": r"(x+1)/2",
    "SymInterval": r"[-1, 1]",
    "GaussianLimit": r"\mathcal{N}(0, 1/d)",
    "SphereDim": r"d-1",
    "JensenIneq": r"\mathbb{E}[e^{s+e}] = e^{s}\,\mathbb{E}[e^{e}] > e^{s}",
    "QJLReconstruction": r"\hat r = \frac{\sqrt{\pi/2}}{m}\,\lVert r\rVert\, S^{\top}\operatorname{sign}(S r)",
    "QJLVariance": r"\operatorname{Var}\langle q, \hat r\rangle \approx \frac{\pi}{2}\,\frac{\lVert r\rVert^{2}\lVert q\rVert^{2}}{m}",
    "QJLRatioResidual": r"\pi/2 - 1/d",
    "QJLRatioNbit": r"(\pi/2 - 1/d)\,D(n-1)/D(n)",
    "CodebookRatioLimit": r"D(n-1)/D(n) \to 4",
    "LogitDef": r"\ell = s\, q K^{\top}/\sqrt{d}",
    "SNRDef": r"\mathrm{SNR} = \lVert x\rVert^{2}/\lVert x-\hat x\rVert^{2}",
    "ShannonBits": r"\tfrac{1}{2}\log_{2}\mathrm{SNR}",
    "EpsDirDef": r"\varepsilon_{\mathrm{dir}} = 1-\cos\varphi",
    "RecallDef": r"\lvert \mathrm{top}_k(p)\cap \mathrm{top}_k(\hat p)\rvert / k",
}


def _default_level() -> float:
    from . import stats

    return float(inspect.signature(stats.bootstrap_ratio_ci).parameters["level"].default)


def headline_cell(study: Any, claims_path: str | os.PathLike | None = None) -> dict[str, Any]:
    """The headline cell: ``distribution``, ``dim``, ``sharpness`` from the claims file's
    ``defaults`` (the cell every claim is evaluated at unless it says otherwise), ``budget``
    from its defaults or else the study's largest budget. Checked against the study's grid."""
    from .config_io import read_yaml_mapping

    defaults = dict(read_yaml_mapping(claims_path or study.claims_file).get("defaults") or {})
    first = next(iter(study.distributions))
    dist = defaults.get("distribution", first)
    if dist not in study.distributions:
        raise KvasymError(f"headline distribution {dist!r} is not in the grid ({', '.join(study.distributions)})")
    dims = study.distribution_dims[dist]
    dim = int(defaults.get("dim", dims[0]))
    if dim not in dims:
        raise KvasymError(f"headline dim {dim} is not a dim of {dist} ({list(dims)})")
    sharpness = float(defaults.get("sharpness", study.sharpness[0]))
    if not any(math.isclose(sharpness, s) for s in study.sharpness):
        raise KvasymError(f"headline sharpness {sharpness:g} is not in the grid ({list(study.sharpness)})")
    budget = int(defaults.get("budget", max(study.budgets)))
    if budget not in study.budgets:
        raise KvasymError(f"headline budget {budget} is not in the grid ({list(study.budgets)})")
    return {"distribution": dist, "dim": dim, "sharpness": sharpness, "budget": budget,
            "alpha": float(defaults.get("alpha", 0.05))}


def numbers_slice(
    study: Any,
    headline: Mapping[str, Any],
    claims: Sequence[Mapping[str, Any]] = (),
    *,
    commit: str | None = None,
    version: str | None = None,
) -> dict[str, Any]:
    """Everything ``numbers.tex`` depends on, as a JSON-able dict (a Snakemake params value:
    it changes, the macros are rewritten). ``claims``: :func:`kvasym.claims.load_claims`'s list.
    ``commit``/``version`` default to the checkout's git commit and the package version."""
    from . import __version__
    from .dataset import git_commit

    return {
        "distributions": [
            {**study.distributions[n].to_dict(), "dims": list(study.distribution_dims[n])} for n in study.distributions
        ],
        "schemes": list(study.schemes),
        "budgets": list(study.budgets),
        "sharpness": list(study.sharpness),
        "trials": study.trials,
        "n_queries": study.n_queries,
        "seq_len": study.seq_len,
        "per_key_trials": study.per_key_trials,
        "base_seed": study.base_seed,
        "norm_dtype": study.norm_dtype,
        "stats": dict(study.stats),
        "theory": dict(study.theory),
        "headline": dict(headline),
        "claims": [
            {"id": str(c["id"]), "statement": str(c.get("statement", "")), "holds_if": dict(c.get("holds_if") or {}),
             "where": dict(c.get("where") or {})}
            for c in claims
        ],
        "commit": commit if commit is not None else git_commit(),
        "version": version if version is not None else __version__,
    }


def _join(values: Sequence[Any]) -> str:
    return ", ".join(plain(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else escape_latex(str(v)) for v in values)


def _camel(key: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in key.replace("-", "_").split("_") if part).translate(
        {ord(c): None for c in "0123456789."}
    )


_OPS = {">=": r"$\geq$", ">": "$>$", "<=": r"$\leq$", "<": "$<$", "all": "all cells"}


def numbers_macros(slice_: Mapping[str, Any]) -> dict[str, str]:
    """Macro name -> LaTeX body (already escaped) of every number/name the prose quotes."""
    from .claims import macro_name
    from .metrics import ROUTING_TOPK

    dists = slice_["distributions"]
    by_kind: dict[str, list[Mapping[str, Any]]] = {}
    for d in dists:
        by_kind.setdefault(d["kind"], []).append(d)
    dims = list(dict.fromkeys(dim for d in dists for dim in d["dims"]))
    nus = sorted(float(d["params"]["nu"]) for d in by_kind.get("student_t", []))
    ranks = sorted(int(d["params"]["rank"]) for d in by_kind.get("low_rank", []))
    outliers = by_kind.get("concentrated", [])
    n_data_cells = sum(len(d["dims"]) for d in dists)
    headline = slice_["headline"]
    commit = str(slice_["commit"])
    m: dict[str, str] = {
        "NumDistributions": str(len(dists)),
        "DistributionList": _join([d["name"] for d in dists]),
        "NumDataCells": str(n_data_cells),
        "NumSchemes": str(len(slice_["schemes"])),
        "SchemeList": _join(slice_["schemes"]),
        "NumBudgets": str(len(slice_["budgets"])),
        "GridBudgets": _join(slice_["budgets"]),
        "BudgetMin": str(min(slice_["budgets"])),
        "BudgetMax": str(max(slice_["budgets"])),
        "NumDims": str(len(dims)),
        "GridDims": _join(dims),
        "NumSharpness": str(len(slice_["sharpness"])),
        "GridSharpness": _join(slice_["sharpness"]),
        "NumTrials": str(slice_["trials"]),
        "NumQueries": str(slice_["n_queries"]),
        "SeqLen": str(slice_["seq_len"]),
        "QueriesPerCell": str(slice_["trials"] * slice_["n_queries"]),
        "NumCells": str(n_data_cells * len(slice_["schemes"]) * len(slice_["budgets"])),
        "NumPairs": str(len(slice_["schemes"]) * (len(slice_["schemes"]) - 1) // 2),
        "PerKeyTrials": str(slice_["per_key_trials"]),
        "NBoot": str(slice_["stats"]["n_boot"]),
        "NPermutations": str(slice_["stats"]["n_permutations"]),
        "EnergyMaxN": str(slice_["stats"]["energy_max_n"]),
        "TheoryTrials": str(min(slice_["theory"]["trials"], slice_["trials"])),
        "TheoryProbes": str(slice_["theory"]["n_probes"]),
        "TheoryBoot": str(slice_["theory"]["n_boot"]),
        "BaseSeed": str(slice_["base_seed"]),
        "NormDtype": escape_latex(slice_["norm_dtype"]),
        "NumTailDistributions": str(len(nus)),
        "TailNuList": _join(nus) if nus else "n/a",
        "TailNuMin": plain(nus[0]) if nus else "n/a",
        "TailNuMax": plain(nus[-1]) if nus else "n/a",
        "NumLowRankDistributions": str(len(ranks)),
        "RankList": _join(ranks) if ranks else "n/a",
        "NumConcentratedDistributions": str(len(outliers)),
        "OutlierChannels": _join([d["params"]["n_outliers"] for d in outliers]) if outliers else "n/a",
        "OutlierScale": _join([d["params"]["outlier_scale"] for d in outliers]) if outliers else "n/a",
        "HeadlineDistribution": escape_latex(str(headline["distribution"])),
        "HeadlineDim": str(int(headline["dim"])),
        "HeadlineSharpness": plain(headline["sharpness"]),
        "HeadlineBudget": str(int(headline["budget"])),
        "AlphaLevel": plain(headline.get("alpha", 0.05)),
        "CILevel": plain(round(100 * _default_level(), 6)) + r"\%",
        "QJLBits": str(QJL_BITS),
        "TopK": str(ROUTING_TOPK),
        "TailPercentile": str(TAIL_PERCENTILE),
        "PiHalfValue": f"{math.pi / 2:.4f}",
        "TwoPiValue": f"{2 * math.pi:.4f}",
        "GitCommit": escape_latex(commit),
        "GitCommitShort": escape_latex(commit[:12]),
        "KvasymVersion": escape_latex(str(slice_["version"])),
        # the real-model rows (kvasym.real): names with digits live here, not in the prose
        "RealModel": escape_latex(REAL_MODEL_NAME),
        "RealHeadDim": str(REAL_HEAD_DIM),
        "RealDistribution": escape_latex(REAL_POST),
        "RealPreRopeDistribution": escape_latex(REAL_PRE),
    }
    m.update(FORMULAS)
    for claim in slice_.get("claims", []):
        cid = claim["id"]
        rule = claim.get("holds_if", {})
        fields = {
            "Id": escape_latex(cid),
            "Statement": escape_latex(claim.get("statement", "")),
            "Op": _OPS.get(str(rule.get("op")), escape_latex(str(rule.get("op")))),
            "Threshold": plain(rule["value"]) if "value" in rule else "n/a",
            "MaxLogP": plain(rule["max_log10_p"]) if "max_log10_p" in rule else "n/a",
            "MaxP": f"10^{{{plain(rule['max_log10_p'])}}}" if "max_log10_p" in rule else r"\textnormal{n/a}",
        }
        for key, value in claim.get("where", {}).items():
            name = "Where" + _camel(str(key))
            if isinstance(value, bool) or isinstance(value, Mapping):
                continue
            if isinstance(value, (list, tuple)):
                if all(not isinstance(v, (Mapping, list, tuple)) for v in value):
                    fields[name] = _join(value)
            elif isinstance(value, (int, float)):
                fields[name] = plain(value)
            else:
                fields[name] = escape_latex(str(value))
        for field, body in fields.items():
            m[macro_name(cid, field)] = body
    bad = [k for k in m if not k.isalpha()]
    if bad:
        raise KvasymError(f"macro names must be letters only: {bad}")
    return m


def render_numbers(slice_: Mapping[str, Any], out_dir: str | os.PathLike) -> Path:
    """Write ``<out_dir>/numbers.tex`` (atomically) from :func:`numbers_slice`'s dict; returns
    its path. Each macro is ``\\newcommand``: a clash with a claims macro fails the LaTeX build."""
    from .pipeline import write_text_atomic

    macros = numbers_macros(slice_)
    lines = ["% Generated by kvasym.tables.render_numbers: do not edit.", ""]
    lines += [f"\\newcommand{{\\{name}}}{{{body}}}" for name, body in macros.items()]
    path = Path(out_dir) / "numbers.tex"
    write_text_atomic("\n".join(lines) + "\n", path)
    return path


# --------------------------------------------------------------------------------------------
# command line (for shell rules): python -m kvasym.tables tables|numbers ...
# --------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvasym.tables", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("tables", help="render the LaTeX tables")
    for key in INPUT_KEYS:
        t.add_argument(f"--{key}", help=f"the {key} input")
    t.add_argument("--real-cachestats", help="table_real: the real caches' statistics (kvasym.real.cachestats)")
    t.add_argument("--data-manifests", nargs="+", help="table_real: data manifests of the synthetic distributions")
    t.add_argument("--headline", required=True, help='JSON, e.g. {"dim": 128, "sharpness": 2.0, "budget": 4}')
    t.add_argument("--out-dir", required=True)
    t.add_argument("--table", action="append", choices=list(TABLES), help="only this table (repeatable)")
    n = sub.add_parser("numbers", help="write numbers.tex")
    src = n.add_mutually_exclusive_group(required=True)
    src.add_argument("--slice", help="numbers_slice JSON (what the DAG passes as params)")
    src.add_argument("--config", help="a config YAML: the slice is computed from it and its claims file")
    n.add_argument("--commit", help="with --config: the commit to print (default: the checkout's, via git)")
    n.add_argument("--out-dir", required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "tables":
            inputs = {k: getattr(args, k) for k in (*INPUT_KEYS, *REAL_INPUT_KEYS) if getattr(args, k)}
            for path in render_tables(inputs, json.loads(args.headline), args.out_dir, args.table):
                print(path)
        else:
            if args.slice:
                slice_ = json.loads(args.slice)
            else:
                from .claims import load_claims
                from .study import load_study_file

                study = load_study_file(args.config)
                slice_ = numbers_slice(study, headline_cell(study), load_claims(study.claims_file), commit=args.commit)
            print(render_numbers(slice_, args.out_dir))
    except (KvasymError, json.JSONDecodeError) as exc:
        print(f"kvasym.tables: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
