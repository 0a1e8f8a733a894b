"""The model card's table of the paper (``table_card``): the measured allocation against the
uniform map of its scheme at equal total bits, per budget.

:func:`card_context` turns the tables of stage ``card`` (:mod:`kvasym.real.card`) into the
context of ``templates/table_card.tex.j2``: per budget ``n``, the uniform map's measured rate,
its mean next-token KL and the allocation's (with their t intervals over the (text, draw)
units), the allocation's KL and perplexity ratios over the uniform map with their intervals
and the Wilcoxon p (``card_comparisons``), the ratio the additive model predicted from the
calibration texts (``card_allocation``'s ``predicted_kl / uniform_predicted_kl``), and the
allocation's mean K and V widths. Nothing is computed here beyond selecting and dividing numbers
the DAG computed.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd


def card_context(summary: pd.DataFrame | None, comparisons: pd.DataFrame | None,
                 allocation: pd.DataFrame | None) -> dict[str, Any]:
    """The template context of ``table_card`` (see the module docstring); ``rows`` empty when
    the DAG has no model card."""
    from ..real import REAL_MODEL_NAME

    rows: list[dict[str, Any]] = []
    reference = ""
    if summary is not None and comparisons is not None and allocation is not None and not comparisons.empty:
        for row in comparisons.sort_values("budget").itertuples():
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
            })
    return {"model": REAL_MODEL_NAME, "reference": reference, "rows": rows}
