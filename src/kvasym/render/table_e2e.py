"""The end-to-end table of the paper (``table_e2e``): what a quantized KV cache does to the model.

:func:`e2e_context` turns the tables of stage ``e2e_stats`` (:mod:`kvasym.real.endtoend_stats`)
into the context of ``templates/table_e2e.tex.j2``, laid out as llama.cpp's ``--kl-divergence``
report: per budget and scheme, the measured bits per value (payload and side arrays), the
perplexity ratio PPL(Q)/PPL(base) as a relative increase with its interval, the next-token KL
(mean, 99.9th percentile), RMS Δp and the top-1 agreement ("same top p", in percent) with keys
quantized after RoPE, and the perplexity increase and mean KL with keys quantized before RoPE; then the layer-by-scheme
sensitivity (relative perplexity increase with one layer quantized at the lowest budget). Bold
flags mark the best scheme of each budget. Without the tables: ``has_e2e`` False and the command
that adds them.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from ..errors import KvasymError
from ..real import INSTALL_COMMANDS, REAL_MODEL_NAME

#: Columns of the post-RoPE block: column -> which direction is better.
POST_COLUMNS = {"ppl_increase_rel": "lower", "kl_mean": "lower", "kl_p999": "lower", "rms_dp": "lower",
                "top1": "higher"}
#: Columns printed in percent (llama.cpp prints RMS Δp and "same top p" in percent).
PERCENT_COLUMNS = ("rms_dp", "top1")
SUMMARY_COLUMNS = ("rope", "scheme", "budget", "ppl", "ppl_ref", "ppl_ratio_low", "ppl_ratio_high",
                   "bits_per_coordinate", "n_positions", "n_texts", "n_units", "n_draws", *POST_COLUMNS)


def scheme_order(names: Any) -> list[str]:
    """Built-in schemes in their registry order (KV, KQV, QKQV, RKV), then the others sorted."""
    from ..schemes import scheme_registry

    present = {str(n) for n in names}
    builtin = [s for s in scheme_registry() if s in present]
    return builtin + sorted(present - set(builtin))


def _best(values: list[float], better: str) -> list[bool]:
    from .format import best_flags

    return best_flags(values, better)


def e2e_context(summary: pd.DataFrame | None, sensitivity: pd.DataFrame | None) -> dict[str, Any]:
    """The template context of ``table_e2e`` (see the module docstring)."""
    base: dict[str, Any] = {"has_e2e": False, "model": REAL_MODEL_NAME, "install": INSTALL_COMMANDS}
    if summary is None or summary.empty:
        return base
    missing = [c for c in SUMMARY_COLUMNS if c not in summary.columns]
    if missing:
        raise KvasymError(f"end-to-end summary: columns {missing} missing")
    post = summary[summary["rope"] == "post"]
    pre = summary[summary["rope"] == "pre"]
    if post.empty:
        raise KvasymError("end-to-end summary: no pass with keys quantized after RoPE (rope post)")
    schemes = scheme_order(post["scheme"].unique())
    budgets = []
    for budget in sorted(post["budget"].unique()):
        rows = post[post["budget"] == budget].set_index("scheme").reindex([s for s in schemes
                                                                           if s in set(post["scheme"])])
        flags = {c: _best(rows[c].tolist(), better) for c, better in POST_COLUMNS.items()}
        before = pre[pre["budget"] == budget].set_index("scheme")
        out = []
        for i, (scheme, r) in enumerate(rows.iterrows()):
            b = before.loc[scheme] if scheme in before.index else None
            out.append({
                "scheme": scheme, "bits": float(r["bits_per_coordinate"]), "ppl": float(r["ppl"]),
                "increase": 100.0 * float(r["ppl_increase_rel"]),
                "increase_low": 100.0 * (float(r["ppl_ratio_low"]) - 1.0),
                "increase_high": 100.0 * (float(r["ppl_ratio_high"]) - 1.0),
                **{c: float(r[c]) * (100.0 if c in PERCENT_COLUMNS else 1.0)
                   for c in POST_COLUMNS if c != "ppl_increase_rel"},
                "best": {c: flags[c][i] for c in POST_COLUMNS},
                "pre_increase": None if b is None else 100.0 * float(b["ppl_increase_rel"]),
                "pre_kl_mean": None if b is None else float(b["kl_mean"]),
            })
        budgets.append({"budget": int(budget), "rows": out})
    layers: list[dict[str, Any]] = []
    layer_schemes: list[str] = []
    sens_budget = None
    if sensitivity is not None and not sensitivity.empty:
        sens = sensitivity[sensitivity["rope"] == "post"]
        sens_budget = int(sens["budget"].min())
        sens = sens[sens["budget"] == sens_budget]
        grid = sens.pivot(index="layer", columns="scheme", values="ppl_increase_rel")
        # the schemes of the single-layer passes only (real.e2e.sensitivity_schemes)
        layer_schemes = [s for s in schemes if s in grid.columns]
        for layer, row in grid.iterrows():
            values = [100.0 * float(row[s]) for s in layer_schemes]
            worst = max((v for v in values if v is not None), default=None)
            layers.append({"layer": int(layer), "cells": [{"value": v, "worst": v is not None and v == worst}
                                                          for v in values]})
    return {**base, "has_e2e": True, "schemes": schemes, "layer_schemes": layer_schemes, "budgets": budgets,
            "layers": layers,
            "sensitivity_budget": sens_budget, "ppl_ref": float(post["ppl_ref"].iloc[0]),
            "n_positions": int(post["n_positions"].iloc[0]), "n_texts": int(post["n_texts"].iloc[0]),
            "n_units": int(post["n_units"].iloc[0]), "n_draws": int(post["n_draws"].iloc[0]),
            "has_pre": not pre.empty}
