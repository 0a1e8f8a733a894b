"""The KL distribution table of the paper (``table_kl``, an appendix): the next-token KL of every
end-to-end configuration on every model, laid out as llama.cpp's ``--kl-divergence`` report.

:func:`kl_rows` selects, from the end-to-end summary of stage ``e2e_stats`` (every model's rows,
column ``model``; :func:`kvasym.real.endtoend_stats.summarize`), per model, budget and scheme
(keys after RoPE, every all-layer pass): the mean next-token KL with its interval over the
(text, draw) units, and the median, 90th, 99th and 99.9th percentiles and maximum over the pooled
positions, beside the top-1 agreement ("same top p"; the perplexity ratios are in
``table_models``). Teacher-forced throughout: each position reads the full-precision prefix's
quantized cache.

Nothing is computed here beyond selecting and ordering the numbers the DAG computed.

References
----------
.. [1] llama.cpp, ``tools/perplexity``: the ``--kl-divergence`` statistics (mean, maximum,
   99.9%, 99%, 90%, median KLD and "same top p").
"""

from __future__ import annotations

from typing import Any

import pandas as pd

#: The summary's KL columns the table prints, in llama.cpp's order after the mean.
QUANTILE_COLUMNS = ("kl_median", "kl_p90", "kl_p99", "kl_p999", "kl_max")


def kl_rows(summary: pd.DataFrame) -> list[dict[str, Any]]:
    """Per model (the summary's order), budget and scheme (alphabetical within a budget), keys
    after RoPE: the columns of the module docstring. A summary made before the 90th percentile
    was stored (no ``kl_p90``) gives no rows, so that no column is left half empty."""
    if summary is None or summary.empty or not set(QUANTILE_COLUMNS) <= set(summary.columns):
        return []
    if "model" not in summary.columns:
        from ..real.models import PRIMARY

        summary = summary.assign(model=PRIMARY)
    post = summary[summary["rope"] == "post"]
    rows = []
    for model in dict.fromkeys(post["model"]):
        chosen = post[post["model"] == model].sort_values(["budget", "scheme"], kind="stable")
        for r in chosen.itertuples():
            rows.append({"model": str(model), "scheme": str(r.scheme), "budget": int(r.budget),
                         "kl": float(r.kl_mean), "kl_low": float(r.kl_mean_low), "kl_high": float(r.kl_mean_high),
                         **{c: float(getattr(r, c)) for c in QUANTILE_COLUMNS},
                         "top1": 100.0 * float(r.top1)})
    return rows


def kl_context(summary: pd.DataFrame | None) -> dict[str, Any]:
    """The template context of ``table_kl``: ``rows`` (:func:`kl_rows`) and ``names`` (model key
    -> name); empty without end-to-end passes."""
    from ..real.models import MODELS

    rows = kl_rows(summary) if summary is not None else []
    names = {key: MODELS[key].name if key in MODELS else key for key in dict.fromkeys(r["model"] for r in rows)}
    return {"rows": rows, "names": names}
