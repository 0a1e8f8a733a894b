"""The cross-model table of the paper (``table_models``): which end-to-end findings hold on
SmolLM2-135M and on Gemma 3 270M, and what each scheme costs and does on both.

:func:`models_context` turns the end-to-end summary of stage ``e2e_stats`` (every model's rows,
column ``model``) and the claims ledger into the context of ``templates/table_models.tex.j2``:

- ``pairs``: each claim that reads a further model's passes (``where.model``) beside the claim of
  the primary model with the same statistic and ``where`` otherwise (its twin, declared before
  the further model's data), with both estimates, intervals and verdicts, and whether the
  finding holds on both models, on one, or on neither;
- ``rows``: per model, scheme of :data:`SCHEMES` and budget (keys after RoPE, every layer
  quantized): bits per value, the whole cache's bytes per token at the summary's context
  (payload, side information, float16 rows; sliding layers hold only their window), the mean
  next-token KL with its interval, its 99.9th percentile, the share of positions whose top-1
  token flips, and the perplexity ratio with its interval.

Nothing is computed here beyond selecting the numbers the DAG computed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

#: The schemes the cost rows show, in order: the deployed rotation baseline, the paper's two
#: QJL schemes, KIVI with its authors' group and float16 window, KVarN-style dual scaling, the
#: query-aware QWF, and the global-layers-only scope of RKV and KIVI128 (a model with
#: sliding-window layers only).
SCHEMES = ("RKV", "KQV", "QKQV", "KIVI128", "KIVI32+R128", "KVarN", "QWF", "RKV+G", "KIVI128+G")


def _float(value: Any) -> float:
    return math.nan if value is None else float(value)


def _claim(r: Mapping[str, Any]) -> dict[str, Any]:
    return {"id": str(r["id"]), "verdict": str(r["verdict"]), "estimate": _float(r.get("estimate")),
            "low": _float(r.get("low")), "high": _float(r.get("high"))}


def twin_pairs(claims: Sequence[Mapping[str, Any]], names: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Each further-model claim with its primary-model twin (same statistic and ``where`` but
    ``model``), in ledger order; a further-model claim without a twin is paired with None.

    ``names``: model key -> display name. A pair's ``statement`` is its twin's with the primary
    model's name read as "the model" (the row stands for both models), and an ``outcome`` that
    holds on one model names it ("<name> only")."""
    from ..real.model_registry import PRIMARY

    names = dict(names or {})
    first = names.get(PRIMARY, "the first model")
    def key(r: Mapping[str, Any]) -> tuple[str, str]:
        where = {k: v for k, v in (r.get("where") or {}).items() if k != "model"}
        return str(r.get("statistic")), repr(sorted(where.items()))

    primary = {key(r): r for r in claims if "model" not in (r.get("where") or {})}
    pairs = []
    for r in claims:
        model = (r.get("where") or {}).get("model")
        if model is None:
            continue
        twin = primary.get(key(r))
        mine = _claim(r)
        theirs = _claim(twin) if twin is not None else None
        holds = [c["verdict"] == "holds" for c in (theirs, mine) if c is not None]
        evaluated = all(c["verdict"] != "not evaluated" for c in (theirs, mine) if c is not None)
        outcome = ("not evaluated" if not evaluated or theirs is None
                   else "both" if all(holds) else "neither" if not any(holds)
                   else f"{first} only" if holds[0] else f"{names.get(str(model), str(model))} only")
        statement = str((twin or r).get("statement", ""))
        if PRIMARY in names:
            statement = statement.replace(names[PRIMARY], "the model")
        pairs.append({"statement": statement, "model": str(model),
                      "primary": theirs, "second": mine, "outcome": outcome})
    return pairs


def cost_rows(summary: pd.DataFrame, schemes: Sequence[str] = SCHEMES) -> list[dict[str, Any]]:
    """Per model, scheme of ``schemes`` and budget (keys after RoPE): the columns of the module
    docstring, from the e2e summary (all models)."""
    rows = []
    post = summary[summary["rope"] == "post"]
    for model in dict.fromkeys(post["model"]):
        for scheme in schemes:
            chosen = post[(post["model"] == model) & (post["scheme"] == scheme)].sort_values("budget")
            for r in chosen.itertuples():
                rows.append({"model": str(model), "scheme": scheme, "budget": int(r.budget),
                             "bits": float(r.bits_per_coordinate), "bytes": float(r.cache_bytes_per_token),
                             "fp16_bytes": float(r.fp16_bytes_per_token), "tokens": int(r.memory_tokens),
                             "kl": float(r.kl_mean), "kl_low": float(r.kl_mean_low), "kl_high": float(r.kl_mean_high),
                             "kl_p999": float(r.kl_p999), "flip": float(r.top1_flip),
                             "ppl_ratio": float(r.ppl_ratio), "ppl_low": float(r.ppl_ratio_low),
                             "ppl_high": float(r.ppl_ratio_high)})
    return rows


def greedy_rows(greedy: pd.DataFrame | None) -> list[dict[str, Any]]:
    """Per model, scheme and budget of the greedy-agreement summaries (stage ``greedy``, every
    model's rows, column ``model``): the agreement in tokens with its interval (texts as units),
    its median, the share of prompts agreeing on every generated token, and the teacher-forced KL
    and top-1 flip share on the same positions."""
    if greedy is None or greedy.empty:
        return []
    rows = []
    for r in greedy.itertuples():
        rows.append({"model": str(r.model), "scheme": str(r.scheme), "budget": int(r.budget),
                     "n_texts": int(r.n_texts), "n_prompts": int(r.n_prompts), "n_new": int(r.n_new),
                     "agree": float(r.agree), "agree_low": float(r.agree_low), "agree_high": float(r.agree_high),
                     "agree_median": float(r.agree_median), "full_share": float(r.full_share),
                     "kl": float(r.kl_mean), "flip": float(r.top1_flip)})
    return rows


def models_context(summary: pd.DataFrame | None, claims: Sequence[Mapping[str, Any]] | None,
                   greedy: pd.DataFrame | None = None) -> dict[str, Any]:
    """The template context of ``table_models``; ``rows`` and ``pairs`` empty when the DAG has no
    further model (a summary without a ``model`` column or with one model only); ``greedy`` the
    greedy-agreement rows of every model that has them (:func:`greedy_rows`), whatever the number
    of models."""
    from ..real.models import MODELS

    def name_of(key: str) -> str:
        return MODELS[key].name if key in MODELS else key

    greedy_part = greedy_rows(greedy)
    greedy_names = {key: name_of(key) for key in dict.fromkeys(r["model"] for r in greedy_part)}
    if summary is None or "model" not in summary.columns or summary["model"].nunique() < 2:
        return {"rows": [], "pairs": [], "names": {}, "greedy": greedy_part, "greedy_names": greedy_names}
    names = {key: name_of(key) for key in dict.fromkeys(summary["model"])}
    return {"rows": cost_rows(summary), "pairs": twin_pairs(list(claims or []), names), "names": names,
            "greedy": greedy_part, "greedy_names": greedy_names}
