"""The model card's table of the paper (``table_card``): the measured allocation against the
uniform map of its scheme at equal total bits, per budget.

:func:`card_context` turns the tables of stage ``card`` (:mod:`kvasym.real.card`) into the
context of ``templates/table_card.tex.j2``: per budget ``n``, the uniform map's measured rate,
its mean next-token KL and the allocation's (with their t intervals over the (text, draw)
units), the allocation's KL and perplexity ratios over the uniform map with their intervals
and the Wilcoxon p (``card_comparisons``), the ratio the additive model predicted from the
calibration texts (``card_allocation``'s ``predicted_kl / uniform_predicted_kl``), the
allocation's mean K and V widths, and, when the card ran it, the allocation's KL ratio over the
allocation with one width per layer (K and V tied, ``card_comparisons``' rows against
``<scheme>-MAT``: what K != V widths add). Nothing is computed here beyond selecting and dividing
numbers the DAG computed.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd


def card_context(summary: pd.DataFrame | None, comparisons: pd.DataFrame | None,
                 allocation: pd.DataFrame | None) -> dict[str, Any]:
    """The template context of ``table_card`` (see the module docstring); ``rows`` empty when
    the DAG has no model card."""
    from ..artifacts import path
    from ..real import REAL_MODEL_NAME
    from ..real.card import TIED_SUFFIX
    from ..real.model_registry import PRIMARY

    rows: list[dict[str, Any]] = []
    reference = ""
    if summary is not None and comparisons is not None and allocation is not None and not comparisons.empty:
        against_tied = comparisons["scheme_b"].str.endswith(TIED_SUFFIX)
        tied = {int(row.budget): row for row in comparisons[against_tied].itertuples()}
        for row in comparisons[~against_tied].sort_values("budget", kind="stable").itertuples():
            budget = int(row.budget)
            reference = str(row.scheme_b)
            uniform = summary[(summary["scheme"] == row.scheme_b) & (summary["budget"] == budget)].iloc[0]
            allocated = summary[(summary["scheme"] == row.scheme_a) & (summary["budget"] == budget)].iloc[0]
            chosen = allocation[allocation["budget"] == budget]
            predicted = float(chosen["predicted_kl"].iloc[0])
            predicted_uniform = float(chosen["uniform_predicted_kl"].iloc[0])
            widths = {"K": float(chosen["k_mean_width"].iloc[0]), "V": float(chosen["v_mean_width"].iloc[0])}
            rows.append({
                "budget": budget, "rate": float(uniform["bits_per_coordinate"]),
                "rate_allocated": float(allocated["bits_per_coordinate"]),
                "kl_uniform": float(uniform["kl_mean"]), "kl_uniform_low": float(uniform["kl_mean_low"]),
                "kl_uniform_high": float(uniform["kl_mean_high"]),
                "kl_allocated": float(allocated["kl_mean"]), "kl_allocated_low": float(allocated["kl_mean_low"]),
                "kl_allocated_high": float(allocated["kl_mean_high"]),
                "kl_ratio": float(row.kl_ratio), "kl_ratio_low": float(row.kl_ratio_low),
                "kl_ratio_high": float(row.kl_ratio_high), "better": float(row.kl_ratio_high) < 1.0,
                "ppl_ratio": float(row.ppl_ratio), "ppl_ratio_low": float(row.ppl_ratio_low),
                "ppl_ratio_high": float(row.ppl_ratio_high), "log10_p": float(row.log10_p),
                "predicted_ratio": predicted / predicted_uniform if predicted_uniform > 0 else math.nan,
                "k_width": float(widths["K"]) if not math.isnan(widths["K"]) else None,
                "v_width": float(widths["V"]) if not math.isnan(widths["V"]) else None,
                "n_units": int(row.n_units),
                **_tied_columns(tied.get(budget)),
            })
    return {"model": REAL_MODEL_NAME, "reference": reference, "rows": rows,
            "has_tied": any(r["tied_kl_ratio"] is not None for r in rows),
            "summary_path": path("card_summary", model=PRIMARY)}


def _tied_columns(row: Any) -> dict[str, Any]:
    """The allocation's KL ratio over the tied allocation (None without one)."""
    if row is None:
        return {"tied_kl_ratio": None, "tied_kl_ratio_low": None, "tied_kl_ratio_high": None, "tied_better": False}
    return {"tied_kl_ratio": float(row.kl_ratio), "tied_kl_ratio_low": float(row.kl_ratio_low),
            "tied_kl_ratio_high": float(row.kl_ratio_high), "tied_better": float(row.kl_ratio_high) < 1.0}
