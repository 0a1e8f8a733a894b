"""Statistics of the end-to-end passes: the field's measures per scheme, budget and RoPE mode,
paired scheme comparisons at equal budget and at equal total bits, layer sensitivity and rank
agreement with the per-head attention KL.

Units
    Every position of one text shares the text and that text's single draw of rotations and
    sketches (:mod:`kvasym.real.endtoend`, "Seeds and draws"); the draw-to-draw spread of the
    perplexity is as large as the effects compared (issue 31's audit: RKV at n = 4 on one text
    ranged over -0.1% to +8.1% across 9 draws). The unit of every interval and paired test is
    therefore a **(text, draw)** pair ``u``: each measure is first averaged over the positions
    of a unit, and the statistics act on the ``U`` unit means. The estimate of a mean is the
    mean of the unit means (every unit weighs the same; with texts of equal length it is the
    pooled mean over positions). A scheme that draws no random maps runs in draw 0 only
    (:func:`kvasym.real.endtoend.draws_random_maps`): its own intervals are over its texts, and
    in a paired comparison its value of a text stands for every draw of that text
    (:func:`align_units`: it is that draw's value exactly).

Intervals
    Student's t over the units: ``m +- t_{U-1, 0.975} s / sqrt(U)`` (``s`` the standard
    deviation of the unit means). It treats the draws of one text as independent samples; the
    columns ``*_low_text``/``*_high_text`` give the text-clustered interval beside it (the same
    t interval over the per-text means of the unit means, ``T - 1`` degrees of freedom), which
    also carries the text-to-text spread. Paired tests are the Wilcoxon signed-rank test over
    the units (:func:`kvasym.stats.wilcoxon_paired`: exact for small U without ties).

Quantities (over the positions ``i`` of a scheme, budget and RoPE mode; ``d_i = nll_i -
nll_ref_i``), laid out as llama.cpp's ``--kl-divergence`` report
    - ``ppl_ratio = exp(mean d)`` = PPL(Q)/PPL(base), its interval ``exp`` of that of ``mean d``
      and its standard error by the delta method, ``exp(mean d) se(mean d)``;
      ``ppl = exp(mean nll)``, ``ppl_ref = exp(mean nll_ref)`` (so ``ppl / ppl_ref = ppl_ratio``);
    - next-token KL: mean (interval, standard error), median, 90th, 99th and 99.9th percentiles
      and maximum over the pooled positions (``numpy.quantile``, linear method);
    - top-1 agreement (llama.cpp's "same top p"): mean with interval;
    - ``Δp_i = exp(-nll_i) - exp(-nll_ref_i)``, the change of the probability of the observed
      token: ``dp_mean`` and ``rms_dp = sqrt(mean Δp^2)``, whose interval is the square root of
      the t interval of the unit means of ``Δp^2`` (clipped at 0);
    - bits per value: the measured bits per coordinate of K and of V (payload + every side
      array: norms, scales, means, bases), and their mean ``bits_per_coordinate`` (bits per
      value).

Equal total bits
    Schemes spend different side bits at one budget (at head_dim 64, KQV and QKQV spend 0.25
    and 0.5 bit per value more than RKV at n = 4). :func:`compare_equal_bits` keeps scheme
    ``a``'s point at one budget and evaluates scheme ``b`` at ``a``'s measured rate, per unit,
    by the frontier's rule (:func:`kvasym.frontier.interpolate_at_rate`): linear in the rate
    between ``b``'s two bracketing budgets, ``mean d`` linearly (log-linear in the perplexity
    ratio) and the mean KL log-linearly; never extrapolated (a rate outside ``b``'s measured
    range is not evaluated: NaN).

References
----------
.. [1] Student (1908) "The probable error of a mean", Biometrika 6(1):1-25.
.. [2] Wilcoxon, F. (1945) "Individual comparisons by ranking methods", Biometrics Bulletin
   1(6):80-83.
.. [3] Spearman, C. (1904) "The proof and measurement of association between two things", Amer.
   J. Psychol. 15(1):72-101.
.. [4] llama.cpp, ``tools/perplexity``: the ``--kl-divergence`` report (mean and percentiles of
   the KL divergence, "RMS Δp", "Same top p", "Mean PPL(Q)/PPL(base)").
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from itertools import combinations, permutations
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import rankdata
from scipy.stats import t as student_t

from .. import stats
from ..errors import KvasymError
from ..frontier import interpolate_at_rate
from ..seeds import rng
from .endtoend import ALL_LAYERS, GLOBAL_TAG

#: The per-head real distribution whose attention KL a RoPE mode is compared with.
ATTENTION_DISTRIBUTION = {"post": "smollm2", "pre": "smollm2-prerope"}
REQUIRED_COLUMNS = ("text", "draw", "position", "scheme", "budget", "rope", "layer", "nll", "nll_ref", "kl", "top1",
                    "k_bits_payload", "k_bits_side", "v_bits_payload", "v_bits_side")
LEVEL = 0.95
#: The per-unit means :func:`unit_means` forms (``d = nll - nll_ref``, ``dp2 = Δp^2``).
UNIT_COLUMNS = ("nll", "nll_ref", "d", "kl", "top1", "dp", "dp2", "bits")


def check_frame(frame: pd.DataFrame, what: str) -> None:
    """A KvasymError naming ``what`` when a column of the per-position table is missing."""
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise KvasymError(f"{what}: columns {missing} missing from the end-to-end table")


def unit_means(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (text, draw) unit, sorted: the means over its positions of :data:`UNIT_COLUMNS`
    (``bits`` = the mean of the K and V bits per coordinate, payload + side) and ``n_positions``."""
    nll, nll_ref = frame["nll"].to_numpy(np.float64), frame["nll_ref"].to_numpy(np.float64)
    dp = np.exp(-nll) - np.exp(-nll_ref)
    bits = (frame["k_bits_payload"] + frame["k_bits_side"] + frame["v_bits_payload"] + frame["v_bits_side"]) / 2
    per = pd.DataFrame({"text": frame["text"].astype(str).to_numpy(), "draw": frame["draw"].astype(int).to_numpy(),
                        "nll": nll, "nll_ref": nll_ref, "d": nll - nll_ref, "kl": frame["kl"].to_numpy(np.float64),
                        "top1": frame["top1"].to_numpy(np.float64), "dp": dp, "dp2": dp * dp,
                        "bits": bits.to_numpy(np.float64)})
    grouped = per.groupby(["text", "draw"], sort=True)
    out = grouped[list(UNIT_COLUMNS)].mean()
    out["n_positions"] = grouped.size()
    return out.reset_index()


def t_interval(values: Sequence[float] | np.ndarray, level: float = LEVEL) -> dict[str, float]:
    """Mean of ``values`` (one per unit) with Student's t interval and standard error.

    ``mean +- t_{n-1,(1+level)/2} s / sqrt(n)``; with one value the interval and the standard
    error are NaN (no spread is measured).
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0 or not np.all(np.isfinite(x)):
        raise KvasymError(f"t_interval needs a non-empty 1-D array of finite values, got shape {x.shape}")
    mean = float(x.mean())
    if x.size < 2:
        return {"estimate": mean, "low": math.nan, "high": math.nan, "se": math.nan, "n": 1}
    se = float(x.std(ddof=1) / math.sqrt(x.size))
    half = float(student_t.ppf((1 + level) / 2, x.size - 1)) * se
    return {"estimate": mean, "low": mean - half, "high": mean + half, "se": se, "n": int(x.size)}


def text_clustered(units: pd.DataFrame, column: str, level: float = LEVEL) -> dict[str, float]:
    """:func:`t_interval` over the per-text means of the unit means of ``column`` (the
    text-clustered interval: ``T - 1`` degrees of freedom)."""
    return t_interval(units.groupby("text", sort=True)[column].mean().to_numpy(), level)


def _cell(frame: pd.DataFrame, rope: str, scheme: str, budget: int, layer: int = ALL_LAYERS) -> pd.DataFrame:
    rows = frame[(frame["rope"] == rope) & (frame["scheme"] == scheme) & (frame["budget"] == budget)
                 & (frame["layer"] == layer)]
    return rows.sort_values(["text", "draw", "position"], kind="stable")


def summarize(frame: pd.DataFrame, *, level: float = LEVEL) -> pd.DataFrame:
    """One row per (rope, scheme, budget) of the all-layer passes: the quantities of the module
    docstring, with t intervals over the (text, draw) units and the text-clustered intervals of
    the perplexity ratio and the mean KL."""
    check_frame(frame, "summarize")
    rows = []
    full = frame[frame["layer"] == ALL_LAYERS]
    for (rope, scheme, budget), g in full.groupby(["rope", "scheme", "budget"], sort=True):
        units = unit_means(g)
        d, kl, top1 = (t_interval(units[c], level) for c in ("d", "kl", "top1"))
        dp2 = t_interval(units["dp2"], level)
        d_text, kl_text = text_clustered(units, "d", level), text_clustered(units, "kl", level)
        ratio = math.exp(d["estimate"])
        kl_all = g["kl"].to_numpy(np.float64)
        k_bits = float((g["k_bits_payload"] + g["k_bits_side"]).mean())
        v_bits = float((g["v_bits_payload"] + g["v_bits_side"]).mean())
        ppl_ref = math.exp(float(units["nll_ref"].mean()))
        rows.append({
            "rope": str(rope), "scheme": str(scheme), "budget": int(budget), "n_positions": len(g),
            "n_units": d["n"], "n_texts": int(units["text"].nunique()),
            "n_draws": int(units.groupby("text")["draw"].nunique().min()),
            "k_bits": k_bits, "v_bits": v_bits, "bits_per_coordinate": (k_bits + v_bits) / 2,
            "ppl_ref": ppl_ref, "ppl": ppl_ref * ratio, "ppl_increase": ppl_ref * (ratio - 1.0),
            "ppl_ratio": ratio, "ppl_ratio_low": math.exp(d["low"]), "ppl_ratio_high": math.exp(d["high"]),
            "ppl_ratio_se": ratio * d["se"], "ppl_ratio_low_text": math.exp(d_text["low"]),
            "ppl_ratio_high_text": math.exp(d_text["high"]), "ppl_increase_rel": ratio - 1.0,
            "nll_diff_mean": d["estimate"],
            "kl_mean": kl["estimate"], "kl_mean_low": kl["low"], "kl_mean_high": kl["high"], "kl_mean_se": kl["se"],
            "kl_mean_low_text": kl_text["low"], "kl_mean_high_text": kl_text["high"],
            "kl_median": float(np.median(kl_all)), "kl_p90": float(np.quantile(kl_all, 0.90)),
            "kl_p99": float(np.quantile(kl_all, 0.99)),
            "kl_p999": float(np.quantile(kl_all, 0.999)), "kl_max": float(kl_all.max()),
            "top1": top1["estimate"], "top1_low": top1["low"], "top1_high": top1["high"],
            "dp_mean": float(units["dp"].mean()), "rms_dp": math.sqrt(max(dp2["estimate"], 0.0)),
            "rms_dp_low": math.sqrt(max(dp2["low"], 0.0)) if math.isfinite(dp2["low"]) else math.nan,
            "rms_dp_high": math.sqrt(max(dp2["high"], 0.0)) if math.isfinite(dp2["high"]) else math.nan,
        })
    if not rows:
        raise KvasymError("summarize: the end-to-end table holds no all-layer pass")
    return pd.DataFrame(rows)


def _one_draw(units: pd.DataFrame) -> bool:
    return bool((units.groupby("text")["draw"].nunique() == 1).all() and (units["draw"] == 0).all())


def align_units(cells: Sequence[pd.DataFrame], what: str) -> list[pd.DataFrame]:
    """The :func:`unit_means` tables of ``cells`` on common (text, draw) units.

    A cell with draw 0 alone for each of its texts (a scheme that draws nothing) is repeated
    for every draw the other cells hold for that text; cells with several draws must cover the
    same units. Raises a KvasymError naming ``what`` when they do not (different texts or
    draws)."""
    many = [u for u in cells if not _one_draw(u)]
    target = many[0][["text", "draw"]] if many else cells[0][["text", "draw"]]
    out = []
    for units in cells:
        if _one_draw(units) and many:
            units = target.merge(units.drop(columns="draw"), on="text", how="left")
        if units[["text", "draw"]].shape != target.shape or not np.array_equal(
                units[["text", "draw"]].to_numpy(), target.to_numpy()) or units.isna().any().any():
            raise KvasymError(f"{what}: the cells cover different (text, draw) units")
        out.append(units.reset_index(drop=True))
    return out


def _difference_row(diff: np.ndarray, log_kl_ratio: np.ndarray, x: np.ndarray, y: np.ndarray,
                    level: float, texts: np.ndarray) -> dict[str, Any]:
    """The perplexity ratio ``exp(mean diff)`` with its interval and the Wilcoxon test of ``x``
    against ``y`` over the units, and the geometric-mean KL ratio ``exp(mean log_kl_ratio)``.
    ``texts`` names each unit's text: beside the interval over the units, the text-clustered one
    (``*_low_text``/``*_high_text``: the t interval over the per-text means of the units'
    values, ``T - 1`` degrees of freedom, :func:`text_clustered`), since the draws of one text
    share its tokens; NaN with one text."""
    ci = t_interval(diff, level)
    test = stats.wilcoxon_paired(x, y)
    kl = t_interval(log_kl_ratio, level)
    units = pd.DataFrame({"text": np.asarray(texts), "d": diff, "kl": log_kl_ratio})
    ci_text, kl_text = text_clustered(units, "d", level), text_clustered(units, "kl", level)
    return {"ppl_ratio": math.exp(ci["estimate"]), "ppl_ratio_low": math.exp(ci["low"]),
            "ppl_ratio_high": math.exp(ci["high"]), "n_units": ci["n"], "log10_p": float(test["log10_p"]),
            "rank_biserial": float(test["rank_biserial"]), "frac_units_a_worse": float(np.mean(diff > 0)),
            "kl_ratio": math.exp(kl["estimate"]), "kl_ratio_low": math.exp(kl["low"]),
            "kl_ratio_high": math.exp(kl["high"]), "n_texts": int(units["text"].nunique()),
            "ppl_ratio_low_text": math.exp(ci_text["low"]), "ppl_ratio_high_text": math.exp(ci_text["high"]),
            "kl_ratio_low_text": math.exp(kl_text["low"]), "kl_ratio_high_text": math.exp(kl_text["high"])}


def compare_schemes(frame: pd.DataFrame, schemes: Sequence[str], *, level: float = LEVEL) -> pd.DataFrame:
    """One row per (rope, budget, scheme pair a < b in ``schemes`` order) of the all-layer passes
    at the same budget: ``ppl_ratio = exp(mean_u(d_a - d_b)) = PPL_a / PPL_b`` with its t
    interval over the units, the Wilcoxon signed-rank test of the unit mean NLLs (``log10_p``,
    rank-biserial positive when a's NLL is larger) and the geometric-mean KL ratio (a over b)
    ``exp(mean_u log(kl_a / kl_b))`` with its t interval."""
    check_frame(frame, "compare_schemes")
    full = frame[frame["layer"] == ALL_LAYERS]
    rows = []
    for (rope, budget), g in full.groupby(["rope", "budget"], sort=True):
        for a, b in combinations(schemes, 2):
            ga, gb = _cell(g, rope, a, budget), _cell(g, rope, b, budget)
            if ga.empty or gb.empty:
                continue
            ua, ub = align_units([unit_means(ga), unit_means(gb)], f"compare_schemes {a}/{b} at n = {budget} ({rope})")
            row = _difference_row((ua["d"] - ub["d"]).to_numpy(), np.log(ua["kl"] / ub["kl"]).to_numpy(),
                                  ua["nll"].to_numpy(), ub["nll"].to_numpy(), level, ua["text"].to_numpy())
            rows.append({"rope": str(rope), "budget": int(budget), "scheme_a": a, "scheme_b": b,
                         "bits_a": float(ua["bits"].mean()), "bits_b": float(ub["bits"].mean()), **row})
    return pd.DataFrame(rows)


EQUAL_BITS_COLUMNS = ("rope", "scheme_a", "budget_a", "scheme_b", "rate", "b_budget_low", "b_budget_high",
                      "evaluated", "ppl_ratio", "ppl_ratio_low", "ppl_ratio_high", "n_units", "log10_p",
                      "rank_biserial", "frac_units_a_worse", "kl_ratio", "kl_ratio_low", "kl_ratio_high",
                      "n_texts", "ppl_ratio_low_text", "ppl_ratio_high_text", "kl_ratio_low_text",
                      "kl_ratio_high_text")


def compare_equal_bits(frame: pd.DataFrame, schemes: Sequence[str], *, level: float = LEVEL) -> pd.DataFrame:
    """One row per (rope, ordered scheme pair (a, b), budget of a): ``a``'s all-layer pass at that
    budget against ``b`` at ``a``'s measured bits per value, per unit (module docstring, "Equal
    total bits"). ``ppl_ratio = exp(mean_u(d_a - d_b(rate)))`` with its t interval, the Wilcoxon
    test over units of ``d_a`` against ``d_b(rate)``, the geometric-mean KL ratio; ``evaluated``
    False (and NaN measures) where the rate is outside ``b``'s measured range in some unit.
    ``b_budget_low``/``b_budget_high`` name ``b``'s bracketing budgets."""
    check_frame(frame, "compare_equal_bits")
    full = frame[frame["layer"] == ALL_LAYERS]
    rows = []
    for rope, g in full.groupby("rope", sort=True):
        cells = {}
        for (scheme, budget), gc in g.groupby(["scheme", "budget"], sort=True):
            if scheme in schemes:
                cells[(str(scheme), int(budget))] = unit_means(gc.sort_values(["text", "draw", "position"]))
        for a, b in permutations(schemes, 2):
            b_budgets = sorted(budget for scheme, budget in cells if scheme == b)
            for budget_a in sorted(budget for scheme, budget in cells if scheme == a):
                if not b_budgets:
                    continue
                ua, *points = align_units([cells[(a, budget_a)], *(cells[(b, nb)] for nb in b_budgets)],
                                          f"compare_equal_bits {a}/{b} ({rope})")
                rates_b = np.stack([ub["bits"].to_numpy() for ub in points], axis=1)  # (units, budgets)
                d_b = np.stack([ub["d"].to_numpy() for ub in points], axis=1)
                kl_b = np.stack([ub["kl"].to_numpy() for ub in points], axis=1)
                rate = ua["bits"].to_numpy()
                # one budget of b: its point alone, at its exact rate (interpolate_at_rate's NaN elsewhere)
                d_at = np.array([interpolate_at_rate(rates_b[u], d_b[u], rate[u], log=False)
                                 for u in range(rate.size)], dtype=np.float64)
                kl_at = np.array([interpolate_at_rate(rates_b[u], kl_b[u], rate[u]) for u in range(rate.size)],
                                 dtype=np.float64)
                mean_rate = float(rate.mean())
                below = [nb for nb, r in zip(b_budgets, rates_b.mean(axis=0)) if r <= mean_rate]
                above = [nb for nb, r in zip(b_budgets, rates_b.mean(axis=0)) if r >= mean_rate]
                base = {"rope": str(rope), "scheme_a": a, "budget_a": int(budget_a), "scheme_b": b, "rate": mean_rate,
                        "b_budget_low": max(below) if below else -1, "b_budget_high": min(above) if above else -1}
                if not (np.all(np.isfinite(d_at)) and np.all(np.isfinite(kl_at))):
                    rows.append({**base, "evaluated": False, "n_units": int(rate.size)})
                    continue
                d_a = ua["d"].to_numpy()
                row = _difference_row(d_a - d_at, np.log(ua["kl"].to_numpy() / kl_at), d_a, d_at, level,
                                      ua["text"].to_numpy())
                rows.append({**base, "evaluated": True, **row})
    return pd.DataFrame(rows, columns=list(EQUAL_BITS_COLUMNS))


def sensitivity(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (rope, scheme, budget, layer) of the single-layer passes: the relative
    perplexity increase ``exp(mean(nll - nll_ref)) - 1``, mean next-token KL and top-1
    agreement (the layer-by-scheme heat map)."""
    check_frame(frame, "sensitivity")
    single = frame[frame["layer"] != ALL_LAYERS]
    rows = []
    for (rope, scheme, budget, layer), g in single.groupby(["rope", "scheme", "budget", "layer"], sort=True):
        rows.append({"rope": str(rope), "scheme": str(scheme), "budget": int(budget), "layer": int(layer),
                     "ppl_increase_rel": math.exp(float(np.mean(g["nll"] - g["nll_ref"]))) - 1.0,
                     "kl_mean": float(g["kl"].mean()), "top1": float(g["top1"].mean()), "n_positions": len(g)})
    return pd.DataFrame(rows, columns=["rope", "scheme", "budget", "layer", "ppl_increase_rel", "kl_mean", "top1",
                                       "n_positions"])


AGREEMENT_MEASURES = {"ppl": "d", "kl": "kl"}
AGREEMENT_COLUMNS = ("rope", "measure", "scope", "spearman", "low", "high", "n_cells", "n_units", "n_boot")


def rank_agreement(frame: pd.DataFrame, attention: pd.DataFrame, rope: str, *, n_boot: int, base_seed: int,
                   measure: str = "ppl", schemes: Sequence[str] | None = None, scope: str = "all",
                   level: float = LEVEL) -> dict[str, Any]:
    """Spearman's rho over the (scheme, budget) cells between an end-to-end measure (``measure``:
    ``"ppl"``, the mean of ``d = nll - nll_ref``, or ``"kl"``, the mean next-token KL; RoPE mode
    ``rope``) and the per-head mean attention KL (``attention``: columns scheme, budget,
    kl_mean), over the cells of ``schemes`` (None: every cell both tables hold; ``scope`` names
    the choice in the result), with a percentile interval from resampling the (text, draw) units
    of the end-to-end side (the same draw for every cell; the attention KL is held fixed;
    generator ``rng(base_seed, "e2e", "rank-agreement", rope, measure, scope)``)."""
    check_frame(frame, "rank_agreement")
    if measure not in AGREEMENT_MEASURES:
        raise KvasymError(f"rank agreement measure must be one of {sorted(AGREEMENT_MEASURES)}, got {measure!r}")
    full = frame[(frame["layer"] == ALL_LAYERS) & (frame["rope"] == rope)]
    cells = set(zip(full["scheme"], full["budget"])) & set(zip(attention["scheme"], attention["budget"]))
    if schemes is not None:
        cells = {c for c in cells if c[0] in schemes}
    cells = sorted(cells)
    if len(cells) < 3:
        raise KvasymError(f"rank agreement ({rope}, {scope}) needs at least 3 (scheme, budget) cells in both tables, "
                          f"got {len(cells)}")
    attn = attention.set_index(["scheme", "budget"])["kl_mean"]
    x = np.array([float(attn.loc[c]) for c in cells])
    per_cell = align_units([unit_means(_cell(full, rope, scheme, budget)) for scheme, budget in cells],
                           f"rank agreement ({rope}, {scope})")
    column = AGREEMENT_MEASURES[measure]
    values = np.stack([units[column].to_numpy() for units in per_cell])  # (cells, units)
    n_units = values.shape[1]
    rho = _spearman(x[None, :], values.mean(axis=1)[None, :])[0]
    gen = rng(base_seed, "e2e", "rank-agreement", rope, measure, scope)
    counts = np.stack([np.bincount(gen.integers(0, n_units, n_units), minlength=n_units)
                       for _ in range(n_boot)]).astype(np.float64)
    replicates = (counts @ values.T) / n_units
    rhos = _spearman(np.broadcast_to(x, replicates.shape), replicates)
    low, high = np.nanquantile(rhos, [(1 - level) / 2, (1 + level) / 2])
    return {"rope": rope, "measure": measure, "scope": scope, "spearman": float(rho), "low": float(low),
            "high": float(high), "n_cells": len(cells), "n_units": int(n_units), "n_boot": int(n_boot)}


def _spearman(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Row-wise Spearman rho of (rows, cells) arrays: Pearson correlation of average ranks
    (NaN for a row of constant ranks)."""
    rx, ry = rankdata(x, axis=1), rankdata(y, axis=1)
    rx -= rx.mean(axis=1, keepdims=True)
    ry -= ry.mean(axis=1, keepdims=True)
    den = np.sqrt((rx * rx).sum(axis=1) * (ry * ry).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return (rx * ry).sum(axis=1) / den


def summarize_long(frame: pd.DataFrame, *, level: float = LEVEL) -> pd.DataFrame:
    """:func:`summarize` of the long-context passes per window length (column ``context``): the
    units are the windows (each its own draw; ``text`` names the window)."""
    check_frame(frame, "summarize_long")
    if "context" not in frame.columns:
        raise KvasymError("summarize_long: column ['context'] missing from the long-context table")
    parts = []
    for context, g in frame.groupby("context", sort=True):
        summary = summarize(g, level=level).assign(context=int(context))
        growth = [context_growth(g, str(r.rope), str(r.scheme), int(r.budget), level=level)
                  for r in summary.itertuples()]
        parts.append(pd.concat([summary, pd.DataFrame(growth, index=summary.index)], axis=1))
    if not parts:
        raise KvasymError("summarize_long: the long-context table is empty")
    out = pd.concat(parts, ignore_index=True)
    return out[["context", *[c for c in out.columns if c != "context"]]]


#: The scheme every other is paired against in :func:`compare_long` (the deployed baseline).
LONG_REFERENCE = "RKV"


def compare_long(frame: pd.DataFrame, reference: str = LONG_REFERENCE, *, level: float = LEVEL) -> pd.DataFrame:
    """Every long-context scheme against ``reference`` at the same budget, per window length:
    :func:`compare_schemes` of the pair (scheme, ``reference``) over the windows of each length
    (the units: each window its own draw, every scheme on the same windows), so ``scheme_a`` is
    the scheme, ``scheme_b`` the reference, and ``kl_ratio`` the geometric mean over the windows
    of the scheme's mean next-token KL over the reference's, with its t interval (``ppl_ratio``
    likewise for the perplexities). Column ``context`` first; no rows without the reference."""
    check_frame(frame, "compare_long")
    if "context" not in frame.columns:
        raise KvasymError("compare_long: column ['context'] missing from the long-context table")
    parts = []
    for context, g in frame.groupby("context", sort=True):
        others = sorted(set(g["scheme"]) - {reference})
        if reference not in set(g["scheme"]) or not others:
            continue
        pairs = [compare_schemes(g, [scheme, reference], level=level) for scheme in others]
        parts += [p.assign(context=int(context)) for p in pairs if not p.empty]
    if not parts:
        return pd.DataFrame(columns=["context", "rope", "budget", "scheme_a", "scheme_b"])
    out = pd.concat(parts, ignore_index=True)
    return out[["context", *[c for c in out.columns if c != "context"]]]


#: Positions of a window whose damage :func:`context_growth` takes as the short-context level:
#: the first 512 (the end-to-end texts' length).
EARLY_POSITIONS = 512


def context_growth(frame: pd.DataFrame, rope: str, scheme: str, budget: int, *,
                   level: float = LEVEL) -> dict[str, float]:
    """How the damage grows with the context read: per window ``w`` of length ``L`` the ratio
    of its mean next-token KL over its second half of positions ``[L/2, L)`` to that over its
    first :data:`EARLY_POSITIONS` positions, ``g_w``; ``kl_growth = exp(mean_w log g_w)`` (the
    geometric mean) with the t interval of ``mean_w log g_w`` over the windows, exponentiated;
    and ``ppl_growth = exp(mean_w (dbar_late - dbar_early))``, the ratio of the late to the
    early perplexity ratios, with its t interval. NaN when the window is not longer than
    ``2 * EARLY_POSITIONS`` would need (``L/2 < EARLY_POSITIONS``)."""
    cell = _cell(frame, rope, scheme, budget)
    length = int(cell["position"].max()) + 2  # positions 0..L-2 predict tokens 1..L-1
    half = length // 2
    nan = {"kl_growth": math.nan, "kl_growth_low": math.nan, "kl_growth_high": math.nan,
           "ppl_growth": math.nan, "ppl_growth_low": math.nan, "ppl_growth_high": math.nan}
    if half < EARLY_POSITIONS:
        return nan
    early = unit_means(cell[cell["position"] < EARLY_POSITIONS])
    late = unit_means(cell[cell["position"] >= half])
    early, late = align_units([early, late], f"context_growth {scheme} at n = {budget}")
    kl = t_interval(np.log(late["kl"].to_numpy() / early["kl"].to_numpy()), level)
    d = t_interval(late["d"].to_numpy() - early["d"].to_numpy(), level)
    return {"kl_growth": math.exp(kl["estimate"]), "kl_growth_low": math.exp(kl["low"]),
            "kl_growth_high": math.exp(kl["high"]), "ppl_growth": math.exp(d["estimate"]),
            "ppl_growth_low": math.exp(d["low"]), "ppl_growth_high": math.exp(d["high"])}


#: Position spans of :func:`damage_by_position` (token indices ``[lo, hi)``): doubling from 128.
POSITION_EDGES = (0, 128, 256, 512, 1024, 2048, 4096, 8192)
POSITION_COLUMNS = ("context", "rope", "scheme", "budget", "lo", "hi", "n_windows", "n_positions", "kl_mean",
                    "kl_mean_low", "kl_mean_high", "ppl_ratio", "ppl_ratio_low", "ppl_ratio_high", "top1")


def damage_by_position(frame: pd.DataFrame, edges: Sequence[int] = POSITION_EDGES, *,
                       level: float = LEVEL) -> pd.DataFrame:
    """The next-token damage against the context a position has read: per window length, scheme,
    budget and span of positions ``[lo, hi)`` (``edges``; a position ``i`` predicts token
    ``i + 1`` having read ``i + 1`` tokens), the mean KL and the perplexity ratio
    ``exp(mean d)`` with t intervals over the windows (each window's mean over the span first)
    and the top-1 agreement."""
    check_frame(frame, "damage_by_position")
    edges = [int(e) for e in edges]
    if len(edges) < 2 or any(b <= a for a, b in zip(edges, edges[1:])):
        raise KvasymError(f"damage_by_position: edges must increase, got {edges}")
    rows = []
    full = frame[frame["layer"] == ALL_LAYERS]
    for (context, rope, scheme, budget), g in full.groupby(["context", "rope", "scheme", "budget"], sort=True):
        for lo, hi in zip(edges, edges[1:]):
            span = g[(g["position"] >= lo) & (g["position"] < hi)]
            if span.empty:
                continue
            units = unit_means(span)
            kl, d = t_interval(units["kl"], level), t_interval(units["d"], level)
            rows.append({"context": int(context), "rope": str(rope), "scheme": str(scheme), "budget": int(budget),
                         "lo": lo, "hi": min(hi, int(span["position"].max()) + 1), "n_windows": kl["n"],
                         "n_positions": len(span), "kl_mean": kl["estimate"], "kl_mean_low": kl["low"],
                         "kl_mean_high": kl["high"], "ppl_ratio": math.exp(d["estimate"]),
                         "ppl_ratio_low": math.exp(d["low"]), "ppl_ratio_high": math.exp(d["high"]),
                         "top1": float(units["top1"].mean())})
    return pd.DataFrame(rows, columns=list(POSITION_COLUMNS))


#: Scheme-name tags of a pass's full-precision rows: ``<scheme>+R<window>``, ``<scheme>+C<chunk>``.
_READ_TAG = re.compile(r"\+([RC])(\d+)$")


def pass_reads(scheme: str) -> tuple[int, int]:
    """``(recent_tokens, causal_chunk)`` of a pass from its scheme column's tag (0, 0 untagged;
    a scope tag such as ``+G`` after it is skipped)."""
    match = _READ_TAG.search(str(scheme).removesuffix(GLOBAL_TAG))
    if not match:
        return 0, 0
    size = int(match.group(2))
    return (size, 0) if match.group(1) == "R" else (0, size)


def memory_columns(summary: pd.DataFrame, frame: pd.DataFrame, geometry: Any, tokens: int) -> pd.DataFrame:
    """``summary`` (:func:`summarize` of ``frame``) with the cache memory of each pass at a context
    of ``tokens`` tokens and the share of positions whose top-1 token flips.

    A pass's bits columns are measured at its text's length ``L`` (positions + 1) with ``F`` of
    the ``L`` rows in float16 (a recent window ``R`` or an incomplete causal chunk ``C``, from the
    scheme's tag: :func:`pass_reads`, :func:`kvasym.real.endtoend.full_precision_rows`), so the
    quantized rows' bits per coordinate are ``b = (bits L - 16 F) / (L - F)`` per side
    (inverting :func:`kvasym.real.endtoend.add_full_precision_rows`); exact when every layer holds
    all ``L`` rows (``L`` within any sliding window). The memory at ``tokens`` is then
    :func:`kvasym.real.cache_memory.cache_memory` of ``geometry`` (a
    :class:`kvasym.real.models.ModelEntry`: layers, KV heads, head_dim, windows) with those ``b``
    and the same ``R``, ``C``: payload, side information and float16 rows, sliding windows
    holding only their window; a ``+G`` pass (:data:`kvasym.real.endtoend.GLOBAL_TAG`) quantizes
    the global layers only, the others' rows counted in float16.

    Added columns: ``memory_tokens``, ``cache_bytes_per_token``, ``cache_mb`` (10^6 bytes),
    ``cache_bits_per_value`` (over every stored value), ``fp16_bytes_per_token`` (the unquantized
    cache) and ``top1_flip`` (``1 - top1``). Raises a KvasymError when a text is longer than a
    sliding window (the inversion would mix layers holding different rows).
    """
    from .cache_memory import cache_memory
    from .endtoend import FULL_PRECISION_BITS, full_precision_rows

    full = frame[frame["layer"] == ALL_LAYERS]
    fp16 = cache_memory(geometry, tokens)
    scope = {True: geometry.global_layers(), False: tuple(range(geometry.n_layers))}
    rows = []
    for r in summary.itertuples():
        g = full[(full["rope"] == r.rope) & (full["scheme"] == r.scheme) & (full["budget"] == r.budget)]
        recent, chunk = pass_reads(str(r.scheme))
        layers = scope[str(r.scheme).endswith(GLOBAL_TAG)]
        memory = []
        for _, p in g.groupby(["text", "draw"], sort=True):
            length = len(p) + 1
            if any(geometry.stored_rows(i, length) != length for i in layers):
                raise KvasymError(f"memory_columns: a text of {length} tokens is longer than the model's sliding "
                                  f"window ({geometry.sliding_window}); its bits mix layers holding different rows")
            held = full_precision_rows(length, recent, chunk)
            b = {}
            for side in ("K", "V"):
                total = float((p[f"{side.lower()}_bits_payload"] + p[f"{side.lower()}_bits_side"]).iloc[0])
                b[side] = (total * length - FULL_PRECISION_BITS * held) / (length - held) if held < length else 0.0
            memory.append(cache_memory(geometry, tokens, b, quantized_layers=layers, recent_tokens=recent,
                                       causal_chunk=chunk))
        rows.append({"memory_tokens": int(tokens),
                     "cache_bytes_per_token": float(np.mean([m.bytes_per_token for m in memory])),
                     "cache_mb": float(np.mean([m.bytes for m in memory])) / 1e6,
                     "cache_bits_per_value": float(np.mean([m.bits_per_value for m in memory])),
                     "fp16_bytes_per_token": fp16.bytes_per_token,
                     "top1_flip": 1.0 - float(r.top1)})
    return pd.concat([summary.reset_index(drop=True), pd.DataFrame(rows)], axis=1)


def pareto_front(summary: pd.DataFrame, cost: str = "cache_bytes_per_token", damage: str = "kl_mean",
                 rope: str = "post") -> pd.DataFrame:
    """``summary`` with a boolean column ``pareto``: whether the row (a scheme at a budget, keys
    quantized ``rope``) is on the front of ``cost`` against ``damage``.

    A row is on the front when no other row of the same RoPE mode has ``cost <= `` and
    ``damage <=`` its own with at least one strict (Pareto dominance; a tie in both keeps both).
    Rows of the other RoPE mode are False. The rows of the front, by increasing cost, are the
    configurations a practitioner chooses among: at every memory, the least damaging measured.

    Raises
    ------
    KvasymError
        When a column is missing or a value is not finite.
    """
    need = {"rope", cost, damage}
    if missing := sorted(need - set(summary.columns)):
        raise KvasymError(f"pareto_front: the summary lacks column(s) {missing}")
    out = summary.copy()
    out["pareto"] = False
    mine = out.index[out["rope"] == rope]
    c = out.loc[mine, cost].to_numpy(np.float64)
    d = out.loc[mine, damage].to_numpy(np.float64)
    if not (np.all(np.isfinite(c)) and np.all(np.isfinite(d))):
        raise KvasymError(f"pareto_front: {cost} and {damage} must be finite")
    # dominated[i]: some j is no worse in both and better in one
    no_worse = (c[None, :] <= c[:, None]) & (d[None, :] <= d[:, None])
    better = (c[None, :] < c[:, None]) | (d[None, :] < d[:, None])
    dominated = (no_worse & better).any(axis=1)
    out.loc[mine, "pareto"] = ~dominated
    return out
