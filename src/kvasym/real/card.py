"""The model card of a KV cache: what in a model's cache predicts quantization damage, measured.

A card (:func:`build_card`) gathers, for one GGUF model:

1. Per layer and KV head, from the full-precision pass over calibration texts
   (:func:`head_statistics`):

   - ``key_mean_share`` = ``||mean_t k_t||^2 / mean_t ||k_t||^2`` of the stored (post-RoPE)
     keys, and ``key_mean_share_pre`` before RoPE: the share of the keys' energy in their mean,
     what a key bias (Qwen2.5's q/k biases) puts there and what a per-token quantizer spends
     bits on; the difference between the two is the effect of RoPE, which rotates a constant
     pre-RoPE direction differently at every position (so the post-RoPE mean keeps only the
     low-frequency part); ``value_mean_share`` likewise for values;
   - ``key_outlier_channels`` / ``value_outlier_channels``: channels whose RMS over tokens
     exceeds :data:`OUTLIER_FACTOR` times the median channel's (the channels KIVI quantizes per
     channel for);
   - ``key_kurtosis`` / ``value_kurtosis``: the mean over channels of the per-channel Pearson
     kurtosis ``E[(x - mu)^4] / Var(x)^2`` (3 for a Gaussian channel);
   - ``sink_mass``: the mean, over the group's query heads and the positions ``i >=``
     :data:`SINK_FROM`, of the attention weight on position 0 (an attention sink holds most of
     it);
   - ``query_alignment``: the mean over the group's query heads and positions of
     :func:`kvasym.querymodel.query_alignment` (1: queries unrelated to the keys' spread).

2. Per layer, the sensitivity of K and of V separately (:func:`kvasym.real.mixed.sensitivity`
   at granularity ``layer_side``: one layer and one side quantized at a time; mean next-token KL
   and NLL change, per width).
3. The measured frontier of schemes on the model (:func:`kvasym.real.endtoend_stats.summarize`
   rows of all-layer passes on evaluation texts).
4. The measured allocation (:func:`kvasym.real.mixed.measured_allocation`) and its end-to-end
   comparison with the uniform map at the same budget on the evaluation texts
   (:func:`kvasym.real.endtoend_stats.compare_schemes`).
5. A recommendation per budget: among the frontier's schemes whose measured rate does not exceed
   the uniform reference's and the allocation, the lowest measured mean KL, with its interval.

:func:`kvasym.render.card_page.render_card_html` writes it as one self-contained HTML page
(figures inlined as PNG).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..errors import KvasymError
from ..querymodel import query_alignment
from .gguf_model import GGUFLlama

#: A channel is an outlier when its RMS over tokens exceeds this multiple of the median channel's.
OUTLIER_FACTOR = 4.0
#: The sink mass is averaged over query positions from here on (early positions attend to
#: position 0 because there is little else to read).
SINK_FROM = 16
HEAD_COLUMNS = ("text", "layer", "kv_head", "key_mean_share", "key_mean_share_pre", "value_mean_share",
                "key_outlier_channels", "value_outlier_channels", "key_kurtosis", "value_kurtosis", "sink_mass",
                "query_alignment", "n_tokens")
CARD_FORMAT = "kvasym.card/1"
#: What the calibration texts are for, in a refusal of texts that are also evaluated.
ALLOCATION_PURPOSE = "the allocation must be measured"
#: A scheme's measured rate may exceed the reference's by this much and still count as equal bits
#: (rates are sums of measured side arrays; identical layouts give identical rates).
RATE_TOLERANCE = 1e-6


def mean_share(rows: np.ndarray) -> np.ndarray:
    """``||mean_t x_t||^2 / mean_t ||x_t||^2`` per head of (heads, T, d) rows, float64 (heads,)."""
    x = np.asarray(rows, dtype=np.float64)
    energy = np.mean(np.sum(x * x, axis=-1), axis=-1)
    centre = x.mean(axis=1)
    return np.sum(centre * centre, axis=-1) / np.where(energy > 0, energy, np.nan)


def outlier_channels(rows: np.ndarray, factor: float = OUTLIER_FACTOR) -> np.ndarray:
    """Channels per head of (heads, T, d) rows whose RMS over tokens exceeds ``factor`` times the
    median channel RMS, int (heads,)."""
    x = np.asarray(rows, dtype=np.float64)
    rms = np.sqrt(np.mean(x * x, axis=1))  # (heads, d)
    return np.sum(rms > factor * np.median(rms, axis=1, keepdims=True), axis=1)


def channel_kurtosis(rows: np.ndarray) -> np.ndarray:
    """Mean over channels of the Pearson kurtosis ``m4 / m2^2`` per head of (heads, T, d) rows
    (channels without spread skipped), float64 (heads,)."""
    x = np.asarray(rows, dtype=np.float64)
    centred = x - x.mean(axis=1, keepdims=True)
    m2 = np.mean(centred ** 2, axis=1)
    m4 = np.mean(centred ** 4, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        kurt = np.where(m2 > 0, m4 / np.where(m2 > 0, m2, 1.0) ** 2, np.nan)
    return np.nanmean(kurt, axis=1)


def attention_to_first(q: np.ndarray, k: np.ndarray, group: int, first: int = SINK_FROM) -> np.ndarray:
    """Mean causal attention weight on position 0 per KV head: over its ``group`` query heads and
    the positions ``i >= first`` (all positions when the text is shorter), float64 (kv_heads,).
    ``q`` (n_heads, T, d) and ``k`` (n_kv_heads, T, d) post-RoPE, scale ``1/sqrt(d)``."""
    n_heads, n_tokens, head_dim = q.shape
    start = first if n_tokens > first else 0
    qs = np.asarray(q[:, start:], dtype=np.float64)
    out = np.empty(k.shape[0])
    for kv in range(k.shape[0]):
        keys = np.asarray(k[kv], dtype=np.float64)
        scores = qs[kv * group:(kv + 1) * group] @ keys.T / math.sqrt(head_dim)  # (group, rows, T)
        positions = np.arange(start, n_tokens)
        scores[:, np.arange(n_tokens)[None, :] > positions[:, None]] = -np.inf
        scores -= scores.max(axis=-1, keepdims=True)
        weights = np.exp(scores)
        weights /= weights.sum(axis=-1, keepdims=True)
        out[kv] = float(weights[..., 0].mean())
    return out


def head_statistics(model: GGUFLlama, token_ids: np.ndarray, text: str) -> pd.DataFrame:
    """:data:`HEAD_COLUMNS` per (layer, KV head) of one full-precision pass over ``token_ids``."""
    c = model.config
    result = model.forward(token_ids, capture_layers=range(len(model.layers)))
    rows = []
    for layer in range(len(model.layers)):
        acts = result.layers[layer]
        alignment = np.empty(c.n_kv_heads)
        for kv in range(c.n_kv_heads):
            values = [query_alignment(acts.q[h], acts.k[kv]) for h in range(kv * c.group, (kv + 1) * c.group)]
            joined = np.concatenate(values)
            alignment[kv] = float(np.mean(joined[np.isfinite(joined)])) if np.isfinite(joined).any() else math.nan
        stats = {"key_mean_share": mean_share(acts.k), "key_mean_share_pre": mean_share(acts.k_pre_rope),
                 "value_mean_share": mean_share(acts.v), "key_outlier_channels": outlier_channels(acts.k),
                 "value_outlier_channels": outlier_channels(acts.v), "key_kurtosis": channel_kurtosis(acts.k),
                 "value_kurtosis": channel_kurtosis(acts.v),
                 "sink_mass": attention_to_first(acts.q, acts.k, c.group), "query_alignment": alignment}
        for kv in range(c.n_kv_heads):
            rows.append({"text": text, "layer": layer, "kv_head": kv, **{k: v[kv] for k, v in stats.items()},
                         "n_tokens": int(np.asarray(token_ids).size)})
    return pd.DataFrame(rows, columns=list(HEAD_COLUMNS))


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    out = []
    for record in frame.to_dict(orient="records"):
        out.append({k: (None if isinstance(v, float) and not math.isfinite(v) else
                        v.item() if isinstance(v, np.generic) else v) for k, v in record.items()})
    return out


def recommendations(summary: pd.DataFrame, comparisons: pd.DataFrame, reference: str, allocated: str,
                    budgets: Sequence[int]) -> list[dict[str, Any]]:
    """Per budget ``n``: the option of least measured mean KL among the all-layer passes of
    ``summary`` (rope ``post``) whose rate (``bits_per_coordinate``) does not exceed the uniform
    ``reference`` scheme's at ``n``, the allocation ``allocated`` included; with the runner-up
    and the allocation's paired comparison with the reference (``comparisons`` rows a =
    allocated, b = reference)."""
    post = summary[summary["rope"] == "post"]
    out = []
    for budget in budgets:
        ref_rows = post[(post["scheme"] == reference) & (post["budget"] == int(budget))]
        if ref_rows.empty:
            raise KvasymError(f"card: no {reference} pass at n = {budget} to set the budget's rate")
        rate = float(ref_rows["bits_per_coordinate"].iloc[0])
        options = post[post["bits_per_coordinate"] <= rate + RATE_TOLERANCE]
        options = options[(options["scheme"] != allocated) | (options["budget"] == int(budget))]
        ranked = options.sort_values("kl_mean", kind="stable")
        best = ranked.iloc[0]
        pair = comparisons[(comparisons["scheme_a"] == allocated) & (comparisons["scheme_b"] == reference)
                           & (comparisons["budget"] == int(budget))]
        out.append({
            "budget": int(budget), "rate": rate, "scheme": str(best["scheme"]), "scheme_budget": int(best["budget"]),
            "bits_per_coordinate": float(best["bits_per_coordinate"]), "kl_mean": float(best["kl_mean"]),
            "kl_mean_low": float(best["kl_mean_low"]), "kl_mean_high": float(best["kl_mean_high"]),
            "ppl_ratio": float(best["ppl_ratio"]),
            "runner_up": None if len(ranked) < 2 else {"scheme": str(ranked.iloc[1]["scheme"]),
                                                      "budget": int(ranked.iloc[1]["budget"]),
                                                      "kl_mean": float(ranked.iloc[1]["kl_mean"])},
            "allocation_vs_uniform": None if pair.empty else _records(pair)[0],
        })
    return out


def build_card(*, model: Mapping[str, Any], settings: Mapping[str, Any], heads: pd.DataFrame,
               sensitivity: pd.DataFrame, allocation: pd.DataFrame, summary: pd.DataFrame,
               comparisons: pd.DataFrame, reference: str, budgets: Sequence[int]) -> dict[str, Any]:
    """The card as a JSON-ready mapping (module docstring): ``model``, ``settings`` (texts,
    tokens, widths, granularity, seeds), ``heads`` (per layer and KV head, means over the
    calibration texts), ``layer_sensitivity`` (per layer, side and width), ``frontier``,
    ``allocation``, ``allocation_vs_uniform``, ``recommendations``: :func:`card_measurements`
    completed by :func:`complete_card`."""
    core = card_measurements(model=model, settings=settings, heads=heads, sensitivity=sensitivity,
                             allocation=allocation, comparisons=comparisons, reference=reference)
    return complete_card(core, summary, comparisons, budgets)


def card_measurements(*, model: Mapping[str, Any], settings: Mapping[str, Any], heads: pd.DataFrame,
                      sensitivity: pd.DataFrame, allocation: pd.DataFrame, comparisons: pd.DataFrame,
                      reference: str) -> dict[str, Any]:
    """The part of the card its own passes measure (the DAG's ``card`` stage): ``format``,
    ``model``, ``settings`` (with ``reference``), ``heads``,
    ``layer_sensitivity``, ``allocation`` and ``allocation_vs_uniform`` (the rows of
    :func:`allocated_label` of ``reference`` against ``reference``); the frontier and the
    recommendations, which read the other schemes' end-to-end rows too, are added by
    :func:`complete_card`."""
    numeric = [c for c in HEAD_COLUMNS if c not in ("text", "layer", "kv_head")]
    head_means = heads.groupby(["layer", "kv_head"], as_index=False)[numeric].mean()
    layer_side = sensitivity.groupby(["layer", "side", "width"], as_index=False)[["bits", "kl", "dnll", "top1"]].mean()
    return {
        "format": CARD_FORMAT,
        "model": dict(model),
        "settings": {**settings, "reference": reference},
        "heads": _records(head_means),
        "layer_sensitivity": _records(layer_side),
        "allocation": _records(allocation),
        "allocation_vs_uniform": _records(comparisons[(comparisons["scheme_a"] == allocated_label(reference))
                                                      & (comparisons["scheme_b"] == reference)]),
    }


#: The frontier's columns in the card (the end-to-end summary's, rope ``post``).
FRONTIER_COLUMNS = ("scheme", "budget", "bits_per_coordinate", "kl_mean", "kl_mean_low", "kl_mean_high",
                    "ppl_ratio", "ppl_ratio_low", "ppl_ratio_high", "top1", "n_units")


def complete_card(measurements: Mapping[str, Any], summary: pd.DataFrame, comparisons: pd.DataFrame,
                  budgets: Sequence[int]) -> dict[str, Any]:
    """The card: :func:`card_measurements` with its ``frontier`` (the rows of ``summary``, every
    all-layer pass and the card's own, rope ``post``) and ``recommendations``
    (:func:`recommendations` at each of ``budgets``; the allocation's rows are those of
    :func:`allocated_label` of ``settings.reference``). Without ``settings.frontier_schemes``, it
    is set to the frontier's schemes other than the reference and the allocation."""
    card = dict(measurements)
    settings = dict(card["settings"])
    reference = str(settings["reference"])
    allocated = allocated_label(reference)
    frontier = summary[summary["rope"] == "post"][list(FRONTIER_COLUMNS)].sort_values(["scheme", "budget"])
    settings.setdefault("frontier_schemes", sorted(set(summary["scheme"]) - {reference, allocated}))
    card["settings"] = settings
    card["frontier"] = _records(frontier)
    card["recommendations"] = recommendations(summary, comparisons, reference, allocated, budgets)
    return card


# --------------------------------------------------------------------------- measuring


def allocated_label(reference: str) -> str:
    """The scheme column of the measured allocation of ``reference``'s widths: ``<reference>-MA``."""
    return f"{reference}-MA"


#: The suffix of the tied allocation's scheme column (:func:`tied_label`).
TIED_SUFFIX = "-MAT"


def tied_label(reference: str) -> str:
    """The scheme column of the measured allocation with one width per layer (K and V tied,
    :func:`kvasym.real.mixed.measured_allocation` with ``tie_sides``): ``<reference>-MAT``."""
    return f"{reference}{TIED_SUFFIX}"


def model_description(model: GGUFLlama) -> dict[str, Any]:
    """The card's ``model`` entry: name, architecture, file, SHA-256 and shape."""
    c = model.config
    entry = {"name": model.metadata.get("general.name") or model.model_path.stem,
             "architecture": c.architecture, "file": model.model_path.name,
             "sha256": model.model_sha256, "n_layers": len(model.layers), "n_heads": c.n_heads,
             "n_kv_heads": c.n_kv_heads, "head_dim": c.head_dim, "d_model": c.d_model,
             "tensor_types": list(model.metadata.get("tensor_types", []))}
    if c.sliding_layers:  # only when present: a full-attention model's card is unchanged
        entry["sliding_window"] = c.sliding_window
        entry["sliding_layers"] = list(c.sliding_layers)
    return entry


def evaluation_rows(model: GGUFLlama, token_ids: Mapping[str, np.ndarray], allocation: pd.DataFrame,
                    scheme: Any, *, reference: str, budgets: Sequence[int], draws: int, base_seed: int,
                    frontier_schemes: Sequence[Any] = (), norm_dtype: str = "float32",
                    log: Any = None, tied: pd.DataFrame | None = None, workers: int = 1) -> pd.DataFrame:
    """Per-position rows (the end-to-end passes' columns) of the evaluation texts: per text and
    draw, the uniform map of ``scheme`` at every budget (scheme column ``reference``: the same
    pass as the end-to-end stage's) and the allocation's map (column :func:`allocated_label`),
    with ``tied`` (an allocation with one width per layer) its map too (column
    :func:`tied_label`), plus, with ``frontier_schemes``, their all-layer passes
    (:func:`kvasym.real.endtoend.evaluate_text`). A text's passes run on ``workers`` processes
    forked after its reference pass (:func:`kvasym.workers.map_ordered`); the rows do not depend
    on their number."""
    from ..workers import map_ordered
    from .endtoend import evaluate_text, reference_pass
    from .mixed import allocation_map, mixed_pass_rows

    c = model.config
    shape = (len(model.layers), 2, c.n_kv_heads)
    frames = []
    for text, ids in token_ids.items():
        ref = reference_pass(model, ids)
        passes = []
        for draw in range(int(draws)):
            for budget in budgets:
                maps = [(reference, np.full(shape, int(budget), dtype=np.int64)),
                        (allocated_label(reference), allocation_map(allocation, budget, *shape[::2]))]
                if tied is not None:
                    maps.append((tied_label(reference), allocation_map(tied, budget, *shape[::2])))
                passes.extend((draw, int(budget), label, widths) for label, widths in maps)

        def pass_frame(unit: tuple[int, int, str, np.ndarray], ref: Any = ref, text: str = text) -> pd.DataFrame:
            draw, budget, label, widths = unit
            return pd.DataFrame(mixed_pass_rows(model, ref, widths, scheme, text=text, draw=draw, label=label,
                                                budget=budget, base_seed=base_seed, norm_dtype=norm_dtype))

        frames.extend(map_ordered(pass_frame, passes, workers))
        if frontier_schemes:
            frames.append(pd.DataFrame(evaluate_text(model, ids, list(frontier_schemes), list(budgets), text=text,
                                                     base_seed=base_seed, ropes=["post"], draws=int(draws),
                                                     norm_dtype=norm_dtype, workers=workers)))
        if log is not None:
            log(f"evaluated {text}")
    return pd.concat(frames, ignore_index=True)


def measure_card(model: GGUFLlama, *, calibration: Mapping[str, np.ndarray], evaluation: Mapping[str, np.ndarray],
                 scheme: Any, reference: str, budgets: Sequence[int], widths: Sequence[int], granularity: str,
                 draws: int, base_seed: int, frontier_schemes: Sequence[Any] = (), tokens: int,
                 norm_dtype: str = "float32", log: Any = None,
                 workers: int = 1) -> tuple[dict[str, Any], dict[str, pd.DataFrame]]:
    """Everything a card holds for ``model``, measured in one job (the CLI's path; the DAG
    splits the sensitivity passes into one job per calibration text); ``workers`` processes run
    the sensitivity rows and the evaluation passes (:func:`kvasym.workers.map_ordered`), with the
    same card whatever their number.

    Returns the card (:func:`build_card`) and its tables: ``heads``, ``sensitivity``,
    ``allocation``, ``passes`` (per position), ``summary``, ``comparisons``.
    """
    from .endtoend import reference_pass
    from .endtoend_stats import compare_schemes, summarize
    from .mixed import measured_allocation, sensitivity
    from .querybases import check_disjoint

    check_disjoint(calibration, evaluation, ALLOCATION_PURPOSE)
    c = model.config
    heads, sens = [], []
    for text, ids in calibration.items():
        heads.append(head_statistics(model, ids, text))
        sens.append(pd.DataFrame(sensitivity(model, reference_pass(model, ids), scheme, widths, granularity,
                                             text=text, base_seed=base_seed, norm_dtype=norm_dtype,
                                             workers=workers)))
        if log is not None:
            log(f"calibrated on {text}")
    sens_frame = pd.concat(sens, ignore_index=True)
    allocation = measured_allocation(sens_frame, len(model.layers), c.n_kv_heads, granularity, budgets)
    passes = evaluation_rows(model, evaluation, allocation, scheme, reference=reference, budgets=budgets,
                             draws=draws, base_seed=base_seed, frontier_schemes=frontier_schemes,
                             norm_dtype=norm_dtype, log=log, workers=workers)
    summary = summarize(passes)
    comparisons = compare_schemes(passes, [allocated_label(reference), reference])
    settings = {"calibration_texts": list(calibration), "evaluation_texts": list(evaluation), "tokens": int(tokens),
                "budgets": [int(b) for b in budgets], "widths": [int(w) for w in widths], "granularity": granularity,
                "reference": reference, "draws": int(draws), "base_seed": int(base_seed), "norm_dtype": norm_dtype,
                "frontier_schemes": [s.name for s in frontier_schemes]}
    card = build_card(model=model_description(model), settings=settings, heads=pd.concat(heads, ignore_index=True),
                      sensitivity=sens_frame, allocation=allocation, summary=summary, comparisons=comparisons,
                      reference=reference, budgets=budgets)
    tables = {"heads": pd.concat(heads, ignore_index=True), "sensitivity": sens_frame, "allocation": allocation,
              "passes": passes, "summary": summary, "comparisons": comparisons}
    return card, tables
