"""The paper's LaTeX tables, rendered with jinja2 from the DAG's gathered tables.

Each table is a pure function of DataFrames (``*_context``) and a template of
``kvasym/templates`` (:mod:`kvasym.render.format` explains the delimiters and the escaping).
Which value is bold (the best of a column in a group) is computed here (:func:`best_flags`),
never typed in a template. Rows are selected with :func:`kvasym.cells.select_cells`, the one
cell accessor (a missing cell is an error naming it); the headline cell is the study's
(:attr:`kvasym.study.Study.headline`).

``table_real`` sets the real-model rows (:mod:`kvasym.real`) beside the synthetic headline
distribution and compares the statistics of real and synthetic caches (:func:`real_context`);
it reads the gathered summary and, optionally, the real caches' statistics
(:mod:`kvasym.real.cachestats`) and the synthetic data manifests. Without real rows it is a
short paragraph with the command that adds them, so the paper never shows a placeholder.

The DAG's entry point is :func:`render_tables` (stage ``tables``, :mod:`kvasym.stages.tables`).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..cachestats import STATISTICS, TOP_CHANNELS
from ..errors import DamagedFile, KvasymError
from ..real import REAL_MODEL_NAME
from ..real import REAL_POST_ROPE as REAL_POST
from ..real import REAL_PRE_ROPE as REAL_PRE
from ..real import REAL_SHARPNESS
from ..real.models import primary_rows
from ..cells import MissingCell, cell_of, pair_ratio, select_cells
from ..display import median_iqr
from ..manifest import read_manifest
from .format import Latex, best_flags, render_template
from .numbers import TAIL_PERCENTILE

#: Table name -> (template, the ``inputs`` key it reads). ``render_tables`` writes
#: ``<out_dir>/<name>.tex`` for each.
TABLES: dict[str, tuple[str, str]] = {
    "table_summary": ("table_summary.tex.j2", "summary"),
    "table_results": ("table_results.tex.j2", "summary"),
    "table_tests": ("table_tests.tex.j2", "comparisons"),
    "table_theory": ("table_theory.tex.j2", "theory"),
    "table_claims": ("table_claims.tex.j2", "claims"),
    "table_disagreements": ("table_disagreements.tex.j2", "claims"),
    "table_real": ("table_real.tex.j2", "summary"),
    "table_e2e": ("table_e2e.tex.j2", "summary"),
    "table_model": ("table_model.tex.j2", "summary"),
    "table_bands": ("table_bands.tex.j2", "summary"),
    "table_frontier": ("table_frontier.tex.j2", "summary"),
    "table_seq_len": ("table_seq_len.tex.j2", "summary"),
    "table_card": ("table_card.tex.j2", "summary"),
    "table_models": ("table_models.tex.j2", "summary"),
    "table_greedy": ("table_greedy.tex.j2", "summary"),
    "table_practice": ("table_practice.tex.j2", "summary"),
    "table_kl": ("table_kl.tex.j2", "summary"),
    "table_schemes": ("table_schemes.tex.j2", "summary"),
}
INPUT_KEYS = ("summary", "comparisons", "theory", "claims")
#: Inputs that are tables of stage e2e_stats, with every model's rows (column ``model``).
E2E_TABLE_KEYS = ("e2e_summary", "e2e_sensitivity", "e2e_equal_bits", "e2e_long_summary", "e2e_long_comparisons",
                  "passkey_summary")
#: Optional inputs of ``table_real`` (given only when the DAG has real-model rows): the real
#: caches' statistics (``results/real/cachestats.parquet``, :mod:`kvasym.real.cachestats`) and
#: the data manifests of the synthetic distributions at the headline dim (their statistics).
REAL_INPUT_KEYS = ("real_cachestats", "data_manifests")
#: Optional inputs of ``table_e2e`` (given only when the DAG has end-to-end passes): the
#: summary and layer sensitivity of stage e2e_stats (:mod:`kvasym.render.table_e2e`).
E2E_INPUT_KEYS = ("e2e_summary", "e2e_sensitivity")
#: Optional inputs of ``table_model`` and ``table_bands`` (:mod:`kvasym.render.table_model`): the equal-bits,
#: long-context and passkey tables of stage e2e_stats, the end-to-end summary, and the
#: published bands (``config/published_bands.yaml``).
MODEL_INPUT_KEYS = ("e2e_equal_bits", "e2e_long_summary", "passkey_summary", "e2e_summary", "published_bands",
                    "e2e_long_comparisons")
#: Optional inputs of ``table_card`` (given only when the DAG has the model card): the summary,
#: comparisons and allocation of stage card (:mod:`kvasym.render.table_card`).
CARD_INPUT_KEYS = ("card_summary", "card_comparisons", "card_allocation")
#: Optional input of ``table_frontier`` (given only when the DAG has a frontier): the points of
#: stage frontier (:mod:`kvasym.render.table_frontier`).
FRONTIER_INPUT_KEYS = ("frontier_points",)
#: Optional inputs of ``table_seq_len`` (given only when the DAG has a sequence-length sweep): the
#: summary and slopes of stage seq_len_sweep (:mod:`kvasym.render.table_seqlen`).
SEQ_LEN_INPUT_KEYS = ("seq_len_summary", "seq_len_slopes")

#: Columns of the main results table: summary column -> which direction is better.
RESULT_COLUMNS: dict[str, str] = {
    "kl_mean": "lower",
    "kl_p99": "lower",
    "tv_mean": "lower",
    "tv_p99": "lower",
    "top1_mean": "higher",
    "recall_top5_mean": "higher",
    "k_eps_dir_mean": "lower",
    "v_eps_dir_mean": "lower",
    "t_eps_dir_mean": "lower",
}


# --------------------------------------------------------------------------------------------
# table contexts (pure functions of DataFrames, testable without files)
# --------------------------------------------------------------------------------------------


def _unique(series: pd.Series) -> list[Any]:
    return list(pd.unique(series))


def _at(frame: pd.DataFrame, what: str, headline: Mapping[str, Any], keys: Sequence[str]) -> pd.DataFrame:
    """Rows of ``frame`` at the headline's ``keys`` (:func:`kvasym.cells.select_cells`)."""
    missing = [key for key in keys if key not in headline]
    if missing:
        raise KvasymError(f"headline lacks '{missing[0]}' (needed by the {what} table)")
    cell = cell_of(headline, tuple(keys))
    try:
        return select_cells(frame, what, **cell)
    except MissingCell:
        shown = ", ".join(f"{k}={v}" for k, v in cell.items())
        raise MissingCell(f"the {what} table has no rows at the headline cell ({shown})") from None


def _require(frame: pd.DataFrame, what: str, columns: Sequence[str]) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise KvasymError(f"the {what} table lacks column(s) {missing}")


def total_bits(row: Mapping[str, Any], side: str = "side") -> float:
    """Bits per coordinate of the whole cache of a summary row (:func:`kvasym.frontier.total_bits`,
    the frontier's rate), with ``side``: ``side`` as stored, ``side16`` with float16 norms."""
    from ..frontier import total_bits as rate

    return float(rate(*(row[f"{s}_bits_{part}_mean"] for s in ("k", "v") for part in ("payload", side))))


def results_context(summary: pd.DataFrame, headline: Mapping[str, Any]) -> dict[str, Any]:
    """Main results: every distribution, budget and scheme at the headline dim and sharpness."""
    _require(summary, "summary", ["distribution", "kind", "dim", "budget", "sharpness", "scheme", "n_queries",
                                  *RESULT_COLUMNS, "k_bits_payload_mean", "k_bits_side_mean",
                                  "v_bits_payload_mean", "v_bits_side_mean"])
    has_side16 = {"k_bits_side16_mean", "v_bits_side16_mean"} <= set(summary.columns)
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
                    # the whole cache's bits per coordinate (K and V have the same dim): as
                    # stored, and with float16 norms (issue 14, point 8: equal budget is payload only)
                    bits_total=total_bits(r, "side"),
                    bits_total16=total_bits(r, "side16") if has_side16 else math.nan,
                    best={c: flags[c][i] for c in RESULT_COLUMNS},
                )
                rows.append(row)
            budgets.append({"budget": int(budget), "rows": rows})
        groups.append({"distribution": str(dist), "kind": str(d["kind"].iloc[0]), "budgets": budgets})
    n_queries = sorted({int(x) for x in frame["n_queries"]})
    from ..metrics import ROUTING_TOPK

    return {
        "topk": ROUTING_TOPK,
        "dim": int(headline["dim"]),
        "sharpness": float(headline["sharpness"]),
        "n_queries": n_queries[0] if len(n_queries) == 1 else None,
        "groups": groups,
    }


#: Columns of the one-panel summary (main text): summary column -> which direction is better.
SUMMARY_COLUMNS: dict[str, str] = {
    "kl_mean": "lower",
    "recall_top5_mean": "higher",
    "v_eps_dir_mean": "lower",
    "t_eps_dir_mean": "lower",
}


def summary_context(summary: pd.DataFrame, headline: Mapping[str, Any]) -> dict[str, Any]:
    """The main text's one-panel summary: every scheme at the headline cell (distribution, dim,
    sharpness, budget) and, when the summary has real rows, at the real keys after RoPE (their
    dim, sharpness :data:`REAL_SHARPNESS`, the headline budget); bold marks the best scheme of
    each column and group. The full grid is :func:`results_context`'s appendix table."""
    _require(summary, "summary", ["distribution", "dim", "budget", "sharpness", "scheme", *SUMMARY_COLUMNS])
    at_cell = _at(summary, "summary", headline, ["dim", "sharpness", "budget"])
    synthetic = at_cell[~at_cell["distribution"].isin(list(REAL_ROPE_LABELS))]
    # the headline distribution; a summary without it (a table rendered alone) shows its first one
    present = _unique(synthetic["distribution"])
    if not present:
        raise MissingCell("the summary table has no synthetic rows at the headline dim, sharpness and budget")
    name = headline.get("distribution") if headline.get("distribution") in present else present[0]
    head = synthetic[synthetic["distribution"] == name]
    groups = [{"distribution": str(name), "real": False, "dim": int(headline["dim"]),
               "sharpness": float(headline["sharpness"]), "frame": head}]
    real = summary[(summary["distribution"] == REAL_POST) & (summary["budget"] == int(headline["budget"]))
                   & np.isclose(summary["sharpness"].astype(float), REAL_SHARPNESS)]
    if not real.empty:
        groups.append({"distribution": REAL_POST, "real": True, "dim": int(real["dim"].iloc[0]),
                       "sharpness": REAL_SHARPNESS, "frame": real})
    schemes = _unique(head["scheme"])
    cells: dict[str, list[dict[str, Any]]] = {str(x): [] for x in schemes}
    for g in groups:
        frame = g.pop("frame")
        values = {}
        for scheme in schemes:
            hit = frame[frame["scheme"] == scheme]
            values[scheme] = {c: (float(hit[c].iloc[0]) if len(hit) else math.nan) for c in SUMMARY_COLUMNS}
        flags = {c: best_flags([values[x][c] for x in schemes], better) for c, better in SUMMARY_COLUMNS.items()}
        for i, scheme in enumerate(schemes):
            cells[str(scheme)].append({**values[scheme], "best": {c: flags[c][i] for c in SUMMARY_COLUMNS}})
    from ..metrics import ROUTING_TOPK

    return {"groups": groups, "rows": [{"scheme": str(x), "cells": cells[str(x)]} for x in schemes],
            "budget": int(headline["budget"]), "topk": ROUTING_TOPK, "model": REAL_MODEL_NAME}


def tests_context(comparisons: pd.DataFrame, headline: Mapping[str, Any]) -> dict[str, Any]:
    """Scheme-pair tests at the headline dim, sharpness and budget, per distribution."""
    _require(comparisons, "comparisons", [
        "distribution", "dim", "budget", "sharpness", "scheme_a", "scheme_b", "metric", "ratio_mean",
        "ratio_mean_low", "ratio_mean_high", "q_rank_biserial", "q_ks_d", "q_log10_p", "q_log10_p_holm",
        "t_wilcoxon_log10_p_holm", "energy", "energy_log10_p_holm", "n_a", "n_trials",
    ])
    budget = int(headline["budget"])
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
            # the pair as stored (a before b in config order), read through the one orientation
            ratio = pair_ratio(kl, str(r["scheme_a"]), str(r["scheme_b"]), distribution=dist)
            rows.append({
                "a": str(r["scheme_a"]), "b": str(r["scheme_b"]),
                "ratio": ratio["estimate"], "ratio_low": ratio["low"], "ratio_high": ratio["high"],
                # its second-order prediction (kvasym.theory.predicted_kl_ratio), stored as a / b
                "ratio_theory": float(r["ratio_theory"]) if "ratio_theory" in r.index else math.nan,
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


def kl_prediction_pair(comparisons: pd.DataFrame) -> tuple[str, str] | None:
    """The scheme pair whose KL ratio the theory table sets beside its second-order prediction:
    the first KL comparison (in table order) with a finite prediction other than 1, oriented so
    that the prediction exceeds 1 (e.g. QKQV/KQV); None without one."""
    if "ratio_theory" not in comparisons.columns:
        return None
    kl = comparisons[comparisons["metric"] == "kl"]
    for _, r in kl.iterrows():
        theory = float(r["ratio_theory"])
        if math.isfinite(theory) and theory > 0 and theory != 1.0:
            a, b = str(r["scheme_a"]), str(r["scheme_b"])
            return (a, b) if theory > 1 else (b, a)
    return None


def _kl_prediction(comparisons: pd.DataFrame | None, pair: tuple[str, str] | None, headline: Mapping[str, Any] | None,
                   distribution: str, dim: int, budget: int) -> dict[str, float]:
    """``kl_estimate``, ``kl_low``, ``kl_high`` (mean-KL ratio of ``pair`` at the headline
    sharpness, :func:`kvasym.cells.pair_ratio`) and ``kl_theory`` (its prediction, oriented
    alike); NaN where the cell is missing."""
    out = {"kl_estimate": math.nan, "kl_low": math.nan, "kl_high": math.nan, "kl_theory": math.nan}
    if comparisons is None or pair is None or headline is None or "sharpness" not in headline:
        return out
    try:
        ratio = pair_ratio(comparisons, pair[0], pair[1], distribution=distribution, dim=dim, budget=budget,
                           sharpness=float(headline["sharpness"]))
    except MissingCell:
        return out
    theory = float(ratio["row"]["ratio_theory"])
    if ratio["swapped"]:
        theory = math.nan if not math.isfinite(theory) or theory == 0 else 1.0 / theory
    return {"kl_estimate": ratio["estimate"], "kl_low": ratio["low"], "kl_high": ratio["high"], "kl_theory": theory}


def theory_context(theory: pd.DataFrame, comparisons: pd.DataFrame | None = None,
                   headline: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Variance ratios of a sketched key (measured with CI, closed form) per (distribution, dim,
    budget): QJL's Gaussian sketch against the scalar residual and the n-bit scalar, and the
    hadamard sketch against the n-bit scalar; with ``comparisons`` and ``headline``, the mean-KL
    ratio of :func:`kl_prediction_pair` at the headline sharpness beside its second-order
    prediction (the key sides' error-energy ratio, ``ratio_theory``: KL ~ (s^2/2) Var_p(delta l)
    makes the KL ratio the logit-error variance ratio); the KS test of rotated key coordinates
    against the Beta law per (distribution, dim)."""
    _require(theory, "theory", ["distribution", "dim", "check", "budget", "estimate", "low", "high", "theory",
                                "statistic", "p"])
    pair = None if comparisons is None else kl_prediction_pair(comparisons)
    groups = []
    for dist, dim in dict.fromkeys(zip(theory["distribution"], theory["dim"])):
        t = theory[(theory["distribution"] == dist) & (theory["dim"] == dim)]
        ks = t[t["check"] == "ks_beta"]
        rows = []
        for budget in sorted(t.loc[t["check"].isin(["qjl_vs_residual", "qjl_vs_nbit"]), "budget"].unique()):
            row: dict[str, Any] = {"budget": int(budget)}
            for check, label in (("qjl_vs_residual", "residual"), ("qjl_vs_nbit", "nbit"),
                                 ("hadamard_vs_nbit", "hadamard")):
                hit = t[(t["check"] == check) & (t["budget"] == budget)]
                r = hit.iloc[0] if not hit.empty else None
                for field in ("estimate", "low", "high", "theory"):
                    row[f"{label}_{field}"] = math.nan if r is None else float(r[field])
            row.update(_kl_prediction(comparisons, pair, headline, str(dist), int(dim), int(budget)))
            rows.append(row)
        groups.append({
            "distribution": str(dist), "dim": int(dim), "rows": rows,
            "ks_d": float(ks["statistic"].iloc[0]) if not ks.empty else math.nan,
            "ks_p": float(ks["p"].iloc[0]) if not ks.empty else math.nan,
            "ks_low": float(ks["low"].iloc[0]) if not ks.empty else math.nan,
            "ks_high": float(ks["high"].iloc[0]) if not ks.empty else math.nan,
        })
    if not groups:
        raise KvasymError("the theory table is empty")
    from ..theory import THEORY_CHECK_WORDS

    return {"groups": groups, "kl_pair": list(pair) if pair else None,
            "sharpness": float(headline["sharpness"]) if headline and "sharpness" in headline else math.nan,
            # the intervals' methods in the caption: the checks' own words (kvasym.theory)
            "ratio_interval": THEORY_CHECK_WORDS["qjl_vs_residual"][1],
            "ks_interval": THEORY_CHECK_WORDS["ks_beta"][1]}


def _finite_or_nan(value: Any) -> float:
    try:
        return float(value) if value is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


_RESTATED = re.compile(r"^(?:CI \[[^\]]*\]|estimate \S+) vs [^;]*(?:;\s*|$)")


_COUNTED = re.compile(r"^significantly (?:better|worse) in (?:\d+ of|all) \d+ cells"
                      r"(?:, never significantly worse)?:?\s*")


def _note(reason: str) -> str:
    """The part of a verdict's reason the other ledger columns do not already say: the reversing
    cells of a claim over cells (``significantly worse in 1 of 2 cells: t1.05 d64 n4 s1`` ->
    ``t1.05 d64 n4 s1``), why an interval is missing, an unreachable p; a reason that only
    restates the interval against the rule (``CI [a, b] vs > 1``) or the counts of the ours
    column leaves no note."""
    return _COUNTED.sub("", _RESTATED.sub("", reason, count=1).strip(), count=1).strip()


def _claim_row(r: Mapping[str, Any]) -> dict[str, Any]:
    from ..claims import decided_by_words
    from .ledger import rule_math, statement_math, test_and_unit

    details = r.get("details") or {}
    cells = None
    if "n_cells" in details and "n_a_significantly_better" in details:
        cells = {"better": int(details["n_a_significantly_better"]),
                 "worse": int(details.get("n_b_significantly_better", 0)), "n": int(details["n_cells"])}
    paper_value = r.get("paper_value")
    return {
        "id": str(r["id"]),
        "statement": str(r.get("statement", "")),
        "statement_tex": statement_math(r.get("statement", "")),
        "test": test_and_unit(r),
        "rule": rule_math(r),
        "paper_text": r.get("paper_text"),
        "paper_tex": statement_math(r["paper_text"]) if r.get("paper_text") else None,
        "paper_value": math.nan if paper_value is None else float(paper_value),
        "estimate": math.nan if r.get("estimate") is None else float(r["estimate"]),
        "low": math.nan if r.get("low") is None else float(r["low"]),
        "high": math.nan if r.get("high") is None else float(r["high"]),
        "log10_p": math.nan if r.get("log10_p") is None else float(r["log10_p"]),
        # the p a rule bounds (kl_ratio's max_log10_p): shown under the estimate
        "show_p": "max_log10_p" in (r.get("holds_if") or {}) and r.get("log10_p") is not None,
        # the closed form a claim's statistic is predicted by (theory rows, the KL ratio's
        # second-order prediction), beside the estimate; NaN where there is none
        "theory": _finite_or_nan(details.get("theory")),
        "verdict": str(r["verdict"]),
        # the test the verdict rests on, beside it (kvasym.claims.decided_by_words: LaTeX-safe words)
        "decided_by": Latex(decided_by_words(r, latex=True)),
        "reason": str(r.get("reason", "")),
        "note": _note(str(r.get("reason", ""))),
        "cells": cells,
    }


def claims_context(claims: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The claims ledger, one row per claim ordered by claim number then suffix
    (:func:`kvasym.render.ledger.claim_order`); ``disagreements``: the evaluated claims whose
    verdict is not *holds*."""
    from .ledger import claim_order

    rows = [_claim_row(r) for r in claim_order(claims)]
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
    "queries": "Q",
    "k_post_rope": "K after RoPE",
    "k_pre_rope": "K before RoPE",
    "v": "V",
    "q_post_rope": "Q after RoPE",
    "q_pre_rope": "Q before RoPE",
}
REAL_CACHESTATS_COLUMNS = ("text", "layer", "kv_head", "head", "tensor", "head_dim", *STATISTICS)
MANIFEST_STATS_COLUMNS = ("distribution", "kind", "dim", "trial", "tensor", *STATISTICS, "alignment")


def manifest_statistics(manifest: Mapping[str, Any], where: str = "data manifest") -> pd.DataFrame:
    """The per-trial cache statistics of one data manifest (:func:`kvasym.manifest.build_manifest`)
    as rows (:data:`MANIFEST_STATS_COLUMNS`, ``tensor`` = ``keys``, ``values`` or ``queries``: the
    queries' mean alignment with the keys' covariance in ``alignment``, NaN in the other rows and
    the other columns; a query-model variant, whose keys and values are its parent's, has its
    ``queries`` rows only)."""
    try:
        spec = manifest["slice"]["distribution"]
        name, kind, dim = str(spec["name"]), str(spec["kind"]), int(manifest["slice"]["dim"])
        trials = manifest["trials"]
    except (KeyError, TypeError, ValueError) as exc:
        raise KvasymError(f"{where}: not a data manifest (lacks slice.distribution.name/kind, slice.dim or trials: "
                          f"{exc!r})") from None
    if not isinstance(trials, list) or not trials:
        raise KvasymError(f"{where}: the data manifest lists no trials")
    rows = []
    # a query-model variant (kvasym.study) has its parent's keys and values: only its queries differ
    variant = spec.get("keys_of") is not None
    for i, trial in enumerate(trials):
        queries = trial.get("queries") if isinstance(trial, Mapping) else None
        if isinstance(queries, Mapping):
            value = queries.get("alignment")
            rows.append({"distribution": name, "kind": kind, "dim": dim, "trial": int(trial.get("trial", i)),
                         "tensor": "queries", **{s: math.nan for s in STATISTICS},
                         "alignment": math.nan if value is None else float(value)})
        for tensor in () if variant else ("keys", "values"):
            stats = trial.get(tensor) if isinstance(trial, Mapping) else None
            if not isinstance(stats, Mapping):
                raise KvasymError(f"{where}: trial {i} has no '{tensor}' statistics (rerun its unit job)")
            missing = [s for s in STATISTICS if s not in stats]
            if missing:
                raise KvasymError(f"{where}: trial {i} '{tensor}' statistics lack {missing} (rerun its unit job)")
            try:
                values = {s: float(stats[s]) for s in STATISTICS}
            except (TypeError, ValueError) as exc:
                raise KvasymError(f"{where}: trial {i} '{tensor}' statistics are not numbers ({exc})") from None
            rows.append({"distribution": name, "kind": kind, "dim": dim, "trial": int(trial.get("trial", i)),
                         "tensor": tensor, **values, "alignment": math.nan})
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
    row["alignment"] = (median_iqr(frame["alignment"].to_numpy(dtype=float)) if "alignment" in frame.columns
                        else (math.nan, math.nan))
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
            flags = {c: best_flags([values[s][c] for s in schemes], better)
                     for c, better in REAL_RESULT_COLUMNS.items()}
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
        "heatmap_budget": int(headline["budget"]),
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
            for tensor in ("keys", "values", "queries"):
                part = d[d["tensor"] == tensor]
                if not part.empty and (tensor != "queries" or part["alignment"].notna().any()):
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
    from ..metrics import ROUTING_TOPK
    from ..real import INSTALL_COMMANDS

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
        # parsed and checked against its own content digest: a hand-edited statistic is refused
        manifest = read_manifest(p)
        frames.append(manifest_statistics(manifest, str(p)))
    if not frames:
        raise KvasymError("table input 'data_manifests': no manifest given")
    return pd.concat(frames, ignore_index=True)


#: Inputs given as one file per model, stacked with a ``model`` column
#: (:func:`kvasym.real.models.read_per_model`).
PER_MODEL_INPUT_KEYS = ("e2e_greedy_summary",)


def _read_input(key: str, path: Any) -> Any:
    if key == "data_manifests":
        return read_data_manifests([path] if isinstance(path, (str, os.PathLike)) else list(path))
    if key in PER_MODEL_INPUT_KEYS:
        from ..real.models import read_per_model

        return read_per_model([path] if isinstance(path, (str, os.PathLike)) else list(path))
    p = Path(path)
    if not p.exists():
        raise KvasymError(f"table input {key!r}: {p}: no such file")
    if key == "published_bands":
        from .table_model import load_published_bands

        return load_published_bands(p)
    if key == "claims":
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DamagedFile(p, f"not valid JSON ({exc})") from None
        if not isinstance(data, list):
            raise DamagedFile(p, "the claims ledger must be a JSON list")
        return data
    from ..dataset import read_parquet_checked

    frame = read_parquet_checked(p)
    if key == "real_cachestats":
        _require(frame, f"real cache statistics ({p})", REAL_CACHESTATS_COLUMNS)
    return frame


def table_texts(frames: Mapping[str, Any], headline: Mapping[str, Any],
                tables: Sequence[str] | None = None) -> dict[str, str]:
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
        if name == "table_e2e":
            from .table_e2e import e2e_context

            out[name] = render_template(template, **e2e_context(frames.get("e2e_summary"),
                                                                frames.get("e2e_sensitivity")))
            continue
        if name in ("table_model", "table_bands"):
            # one context, two floats: the bands table goes to the appendix, the rest stays in
            # the main text
            from .table_model import model_context

            if "model" not in contexts:
                contexts["model"] = model_context(
                    frames.get("e2e_equal_bits"), frames.get("e2e_long_summary"), frames.get("passkey_summary"),
                    frames.get("e2e_summary"), frames.get("published_bands"),
                    long_comparisons=frames.get("e2e_long_comparisons"))
            out[name] = render_template(template, **contexts["model"])
            continue
        if name in ("table_models", "table_greedy"):
            # one context, two floats: the greedy table goes to the appendix
            from .table_models import models_context

            if "models" not in contexts:
                contexts["models"] = models_context(frames.get("e2e_summary_models"), frames.get("claims"),
                                                    frames.get("e2e_greedy_summary"))
            out[name] = render_template(template, **contexts["models"])
            continue
        if name == "table_schemes":
            out[name] = render_template(template, schemes=list(frames.get("schemes") or []))
            continue
        if name == "table_kl":
            from .table_kl import kl_context

            out[name] = render_template(template, **kl_context(frames.get("e2e_summary_models")))
            continue
        if name == "table_practice":
            from .table_practice import practice_context

            out[name] = render_template(template, **practice_context(frames.get("e2e_summary_models")))
            continue
        if name == "table_card":
            from .table_card import card_context

            out[name] = render_template(template, **card_context(frames.get("card_summary"),
                                                                 frames.get("card_comparisons"),
                                                                 frames.get("card_allocation")))
            continue
        if name == "table_summary":
            out[name] = render_template(template, **summary_context(frames[key], headline))
            continue
        if name == "table_frontier":
            from ..real import REAL_SHARPNESS
            from ..real.evaluate import REAL_DISTRIBUTIONS
            from .table_frontier import frontier_context

            out[name] = render_template(template, **frontier_context(
                frames.get("frontier_points"), headline, real_distributions=list(REAL_DISTRIBUTIONS),
                real_sharpness=REAL_SHARPNESS))
            continue
        if name == "table_seq_len":
            from .table_seqlen import seq_len_context

            out[name] = render_template(template, **seq_len_context(frames.get("seq_len_summary"),
                                                                    frames.get("seq_len_slopes")))
            continue
        if key not in contexts:
            if key == "summary":
                contexts[key] = results_context(frames[key], headline)
            elif key == "comparisons":
                contexts[key] = tests_context(frames[key], headline)
            elif key == "theory":
                # the KL ratios beside their second-order predictions come from the comparisons
                contexts[key] = theory_context(frames[key], frames.get("comparisons"), headline)
            else:
                contexts[key] = claims_context(frames[key])
        out[name] = render_template(template, **contexts[key])
    return out


def render_tables(
    inputs: Mapping[str, Any],
    headline: Mapping[str, Any],
    out_dir: str | os.PathLike,
    tables: Sequence[str] | None = None,
    schemes: Sequence[Mapping[str, str]] | None = None,
) -> list[Path]:
    """Write ``<out_dir>/<table>.tex`` (atomically) for each table of :data:`TABLES`.

    ``inputs``: ``summary``, ``comparisons``, ``theory`` (Parquet, ``results/stats/*.parquet``
    and ``results/theory/theory.parquet``) and ``claims`` (``results/claims/claims.json``);
    only the inputs of the requested ``tables`` (default: all) are needed. Optional, read by
    ``table_real`` only: ``real_cachestats`` (``results/real/cachestats.parquet``) and
    ``data_manifests`` (a list of ``results/data/<dist>/d<dim>.json``).
    ``headline``: ``dim`` and ``sharpness`` (the main-results and tests tables), optional
    ``budget`` (the tests table; default the largest budget). ``schemes``: every scheme the
    DAG runs, ``{name, description}`` (:meth:`kvasym.study.Study.scheme_definitions`; the
    schemes table). Returns the written paths.
    """
    from ..atomic import write_text_atomic

    names = list(TABLES) if tables is None else list(tables)
    needed = {TABLES[n][1] for n in names if n in TABLES}
    missing = sorted(needed - set(inputs))
    if missing:
        raise KvasymError(f"render_tables: missing input(s) {missing} (have {sorted(inputs)})")
    if "table_real" in names:
        needed |= {key for key in REAL_INPUT_KEYS if inputs.get(key)}
    if "table_e2e" in names:
        needed |= {key for key in E2E_INPUT_KEYS if inputs.get(key)}
    if {"table_model", "table_bands"} & set(names):
        needed |= {key for key in MODEL_INPUT_KEYS if inputs.get(key)}
    if "table_frontier" in names:
        needed |= {key for key in FRONTIER_INPUT_KEYS if inputs.get(key)}
    if "table_card" in names:
        needed |= {key for key in CARD_INPUT_KEYS if inputs.get(key)}
    if "table_seq_len" in names:
        needed |= {key for key in SEQ_LEN_INPUT_KEYS if inputs.get(key)}
    if {"table_models", "table_greedy"} & set(names):
        needed |= {key for key in ("e2e_summary", "claims", "e2e_greedy_summary") if inputs.get(key)}
    if {"table_practice", "table_kl"} & set(names):
        needed |= {key for key in ("e2e_summary",) if inputs.get(key)}
    frames = {key: _read_input(key, inputs[key]) for key in sorted(needed)}
    # The end-to-end tables hold every model's rows (column model); each table but the cross-model
    # one shows the primary model's, as before further models existed.
    if frames.get("e2e_summary") is not None:
        frames["e2e_summary_models"] = frames["e2e_summary"]
    for key in E2E_TABLE_KEYS:
        if frames.get(key) is not None:
            frames[key] = primary_rows(frames[key])
    if schemes is not None:
        frames["schemes"] = list(schemes)
    texts = table_texts(frames, headline, names)
    out = Path(out_dir)
    written = []
    for name, text in texts.items():
        path = out / f"{name}.tex"
        write_text_atomic(text, path)
        written.append(path)
    return written
