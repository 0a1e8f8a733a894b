"""The practitioner's table of the paper (``table_practice``): what to use at each memory, on each
model.

:func:`practice_context` selects, from the end-to-end summary of stage ``e2e_stats`` (every
model's rows, column ``model``), the configurations the stage marked as on the front of the whole
cache's bytes per token against the mean next-token KL (column ``pareto``,
:func:`kvasym.real.endtoend_stats.pareto_front`: keys after RoPE, no other configuration measured
both smaller and less damaging), by model and increasing bytes per token, with the columns a
practitioner reads: bits per value, bytes per token and MB of the whole cache at the summary's
context, mean KL with its interval, its 99.9th percentile, the top-1 flip share and the
perplexity ratio with its interval.

Nothing is computed here beyond selecting and ordering the numbers the DAG computed.
"""

from __future__ import annotations

from typing import Any

import pandas as pd


def practice_rows(summary: pd.DataFrame) -> list[dict[str, Any]]:
    """The front's rows of every model (module docstring), the models in the summary's order."""
    rows = []
    front = summary[summary["pareto"].astype(bool)]
    for model in dict.fromkeys(summary["model"]):
        chosen = front[front["model"] == model].sort_values(["cache_bytes_per_token", "kl_mean"])
        for r in chosen.itertuples():
            rows.append({"model": str(model), "scheme": str(r.scheme), "budget": int(r.budget),
                         "bits": float(r.cache_bits_per_value), "bytes": float(r.cache_bytes_per_token),
                         "mb": float(r.cache_mb), "tokens": int(r.memory_tokens),
                         "fp16_bytes": float(r.fp16_bytes_per_token),
                         "kl": float(r.kl_mean), "kl_low": float(r.kl_mean_low), "kl_high": float(r.kl_mean_high),
                         "kl_p999": float(r.kl_p999), "flip": float(r.top1_flip),
                         "ppl_ratio": float(r.ppl_ratio), "ppl_low": float(r.ppl_ratio_low),
                         "ppl_high": float(r.ppl_ratio_high)})
    return rows


def practice_context(summary: pd.DataFrame | None) -> dict[str, Any]:
    """The template context of ``table_practice``: ``rows`` (:func:`practice_rows`) and ``names``
    (model key -> name); empty without end-to-end passes or a summary made before the front was
    marked (no ``pareto`` column)."""
    from ..real.models import MODELS, PRIMARY

    if summary is None or "pareto" not in summary.columns:
        return {"rows": [], "names": {}}
    if "model" not in summary.columns:
        summary = summary.assign(model=PRIMARY)
    rows = practice_rows(summary)
    names = {key: MODELS[key].name if key in MODELS else key for key in dict.fromkeys(r["model"] for r in rows)}
    return {"rows": rows, "names": names}
