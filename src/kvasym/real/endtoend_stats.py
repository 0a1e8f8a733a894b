"""Statistics of the end-to-end passes: perplexity, next-token KL and top-1 agreement per scheme
and budget, paired scheme comparisons, layer sensitivity and rank agreement with attention KL.

Units of resampling
    Positions of one text are not independent (they share a context), and there are few texts
    (four in the paper grid): the cluster is a *block* of ``block_tokens`` consecutive
    positions of one text (text ``t``, block ``floor(i / block_tokens)``). Intervals are the
    study's ratio intervals over blocks (:func:`kvasym.stats.bootstrap_ratio_ci`: Fieller's for
    means, paired: the same blocks for every scheme), and paired tests compare the
    per-block means of two schemes (:func:`kvasym.stats.compare`, whose per-trial Wilcoxon is
    the block-level test).

Quantities (over the positions ``i`` of a scheme, budget and RoPE mode; ``d_i = nll_i -
nll_ref_i``)
    - ``ppl = exp(mean nll)``, ``ppl_ref = exp(mean nll_ref)``, ``ppl_ratio = ppl / ppl_ref =
      exp(mean d)``; its interval is ``exp`` of the interval of ``mean d`` (exp is
      increasing); ``ppl_increase = ppl - ppl_ref`` and ``ppl_increase_rel = ppl_ratio - 1``;
    - next-token KL: mean (with interval), 99th percentile and maximum; top-1 agreement (mean,
      with interval);
    - a pair of schemes ``(a, b)``: ``exp(mean(nll_a - nll_b)) = ppl_a / ppl_b`` with interval,
      the block-level paired Wilcoxon test of the NLL, and the KL ratio of means;
    - rank agreement: Spearman's rho over the (scheme, budget) cells between ``mean d`` and the
      per-head mean attention KL of the same cells (the gathered summary of the real rows);
      interval by resampling blocks of the end-to-end side (the attention KL is held fixed).

References
----------
.. [1] Kuensch, H. R. (1989) "The jackknife and the bootstrap for general stationary
   observations", Ann. Statist. 17(3):1217-1241 (resampling blocks of a dependent sequence).
.. [2] Spearman, C. (1904) "The proof and measurement of association between two things", Amer.
   J. Psychol. 15(1):72-101.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import rankdata

from .. import stats
from ..errors import KvasymError
from ..seeds import rng
from .endtoend import ALL_LAYERS

#: The per-head real distribution whose attention KL a RoPE mode is compared with.
ATTENTION_DISTRIBUTION = {"post": "smollm2", "pre": "smollm2-prerope"}
REQUIRED_COLUMNS = ("text", "position", "scheme", "budget", "rope", "layer", "nll", "nll_ref", "kl", "top1",
                    "k_bits_payload", "k_bits_side", "v_bits_payload", "v_bits_side")


def check_frame(frame: pd.DataFrame, what: str) -> None:
    """A KvasymError naming ``what`` when a column of the per-position table is missing."""
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise KvasymError(f"{what}: columns {missing} missing from the end-to-end table")


def block_labels(frame: pd.DataFrame, block_tokens: int) -> np.ndarray:
    """The cluster of each row: ``"<text>/<position // block_tokens>"``."""
    if block_tokens < 1:
        raise KvasymError(f"block_tokens must be >= 1, got {block_tokens}")
    blocks = (frame["position"].to_numpy() // block_tokens).astype(str)
    return (frame["text"].astype(str).to_numpy().astype(object) + "/" + blocks.astype(object)).astype(str)


def _by_block(values: np.ndarray, labels: np.ndarray) -> list[np.ndarray]:
    """``values`` split by block, blocks in sorted label order (the same for every scheme)."""
    order = np.argsort(labels, kind="stable")
    _, starts = np.unique(labels[order], return_index=True)
    return np.split(np.asarray(values, dtype=np.float64)[order], starts[1:])


def _cell(frame: pd.DataFrame, rope: str, scheme: str, budget: int, layer: int = ALL_LAYERS) -> pd.DataFrame:
    rows = frame[(frame["rope"] == rope) & (frame["scheme"] == scheme) & (frame["budget"] == budget)
                 & (frame["layer"] == layer)]
    return rows.sort_values(["text", "position"], kind="stable")


def mean_ci(values: np.ndarray, labels: np.ndarray, *, n_boot: int, base_seed: int,
            identity: Sequence[str | int]) -> dict[str, float]:
    """Mean of ``values`` and its 95% interval over the blocks ``labels``
    (:func:`kvasym.stats.bootstrap_ratio_ci` of the values over ones: a ratio of means whose
    denominator is 1)."""
    blocks = _by_block(values, labels)
    ci = stats.bootstrap_ratio_ci(blocks, [np.ones_like(b) for b in blocks], n_boot=n_boot, base_seed=base_seed,
                                  identity=tuple(identity), paired=True)
    return {"estimate": ci["estimate"], "low": ci["low"], "high": ci["high"], "n_blocks": ci["n_clusters_a"]}


def summarize(frame: pd.DataFrame, *, block_tokens: int, n_boot: int, base_seed: int) -> pd.DataFrame:
    """One row per (rope, scheme, budget) of the all-layer passes (quantities in the module
    docstring), with the mean measured bits per coordinate of K and V (payload + side)."""
    check_frame(frame, "summarize")
    rows = []
    full = frame[frame["layer"] == ALL_LAYERS]
    for (rope, scheme, budget), g in full.groupby(["rope", "scheme", "budget"], sort=True):
        g = g.sort_values(["text", "position"], kind="stable")
        labels = block_labels(g, block_tokens)
        identity = ("e2e", str(rope), str(scheme), int(budget))
        nll, nll_ref = g["nll"].to_numpy(), g["nll_ref"].to_numpy()
        d = mean_ci(nll - nll_ref, labels, n_boot=n_boot, base_seed=base_seed, identity=(*identity, "nll"))
        kl = mean_ci(g["kl"].to_numpy(), labels, n_boot=n_boot, base_seed=base_seed, identity=(*identity, "kl"))
        top1 = mean_ci(g["top1"].to_numpy(), labels, n_boot=n_boot, base_seed=base_seed, identity=(*identity, "top1"))
        ppl, ppl_ref = math.exp(float(np.mean(nll))), math.exp(float(np.mean(nll_ref)))
        bits = [(g[f"{s}_bits_payload"] + g[f"{s}_bits_side"]).mean() for s in ("k", "v")]
        rows.append({
            "rope": str(rope), "scheme": str(scheme), "budget": int(budget), "n_positions": len(g),
            "n_texts": int(g["text"].nunique()), "n_blocks": d["n_blocks"],
            "ppl_ref": ppl_ref, "ppl": ppl, "ppl_increase": ppl - ppl_ref,
            "ppl_ratio": math.exp(d["estimate"]), "ppl_ratio_low": math.exp(d["low"]),
            "ppl_ratio_high": math.exp(d["high"]), "ppl_increase_rel": math.exp(d["estimate"]) - 1.0,
            "nll_diff_mean": d["estimate"],
            "kl_mean": kl["estimate"], "kl_mean_low": kl["low"], "kl_mean_high": kl["high"],
            "kl_p99": float(np.quantile(g["kl"], 0.99)), "kl_max": float(g["kl"].max()),
            "top1": top1["estimate"], "top1_low": top1["low"], "top1_high": top1["high"],
            "bits_per_coordinate": float(np.mean(bits)),
        })
    if not rows:
        raise KvasymError("summarize: the end-to-end table holds no all-layer pass")
    return pd.DataFrame(rows)


def compare_schemes(frame: pd.DataFrame, schemes: Sequence[str], *, block_tokens: int, n_boot: int,
                    base_seed: int) -> pd.DataFrame:
    """One row per (rope, budget, scheme pair a < b in ``schemes`` order) of the all-layer passes:
    ``ppl_ratio = exp(mean(nll_a - nll_b))`` with its block-bootstrap interval, the block-level
    paired Wilcoxon test of the NLL (``log10_p``, rank-biserial, positive when a's NLL is
    larger) and the KL ratio of means (a over b) with its paired interval."""
    check_frame(frame, "compare_schemes")
    full = frame[frame["layer"] == ALL_LAYERS]
    rows = []
    for (rope, budget), g in full.groupby(["rope", "budget"], sort=True):
        for a, b in combinations(schemes, 2):
            ga, gb = _cell(g, rope, a, budget), _cell(g, rope, b, budget)
            if ga.empty or gb.empty:
                continue
            if not np.array_equal(ga[["text", "position"]].to_numpy(), gb[["text", "position"]].to_numpy()):
                raise KvasymError(f"compare_schemes: {a} and {b} at n = {budget} ({rope}) cover different positions")
            labels = block_labels(ga, block_tokens)
            identity = ("e2e", str(rope), int(budget), a, b)
            diff = mean_ci(ga["nll"].to_numpy() - gb["nll"].to_numpy(), labels, n_boot=n_boot, base_seed=base_seed,
                           identity=(*identity, "nll"))
            test = stats.compare(_by_block(ga["nll"].to_numpy(), labels), _by_block(gb["nll"].to_numpy(), labels))
            kl = stats.bootstrap_ratio_ci(_by_block(ga["kl"].to_numpy(), labels),
                                          _by_block(gb["kl"].to_numpy(), labels), n_boot=n_boot,
                                          base_seed=base_seed, identity=(*identity, "kl"),
                                          paired=True, undefined="nan")
            rows.append({
                "rope": str(rope), "budget": int(budget), "scheme_a": a, "scheme_b": b,
                "ppl_ratio": math.exp(diff["estimate"]), "ppl_ratio_low": math.exp(diff["low"]),
                "ppl_ratio_high": math.exp(diff["high"]), "n_blocks": diff["n_blocks"],
                "log10_p": test["t_wilcoxon_log10_p"], "rank_biserial": test["t_wilcoxon_rank_biserial"],
                "frac_blocks_a_worse": test["t_frac_a_greater"],
                "kl_ratio": kl["estimate"], "kl_ratio_low": kl["low"], "kl_ratio_high": kl["high"],
            })
    return pd.DataFrame(rows)


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


def rank_agreement(frame: pd.DataFrame, attention: pd.DataFrame, rope: str, *, block_tokens: int, n_boot: int,
                   base_seed: int, level: float = 0.95) -> dict[str, Any]:
    """Spearman's rho over (scheme, budget) between the end-to-end ``mean(nll - nll_ref)`` (RoPE
    mode ``rope``) and the per-head mean attention KL (``attention``: columns scheme, budget,
    kl_mean), with a percentile interval from resampling blocks of positions (the same draw for
    every cell; generator ``rng(base_seed, "e2e", "rank-agreement", rope)``)."""
    check_frame(frame, "rank_agreement")
    full = frame[(frame["layer"] == ALL_LAYERS) & (frame["rope"] == rope)].sort_values(
        ["scheme", "budget", "text", "position"], kind="stable")
    cells = sorted(set(zip(full["scheme"], full["budget"])) & set(zip(attention["scheme"], attention["budget"])))
    if len(cells) < 3:
        raise KvasymError(f"rank agreement ({rope}) needs at least 3 (scheme, budget) cells in both tables, "
                          f"got {len(cells)}")
    attn = attention.set_index(["scheme", "budget"])["kl_mean"]
    x = np.array([float(attn.loc[c]) for c in cells])
    first = _cell(full, rope, *cells[0])
    labels = block_labels(first, block_tokens)
    names, ids = np.unique(labels, return_inverse=True)
    sums = np.empty((len(cells), names.size))
    for i, (scheme, budget) in enumerate(cells):
        g = _cell(full, rope, scheme, budget)
        if not np.array_equal(g[["text", "position"]].to_numpy(), first[["text", "position"]].to_numpy()):
            raise KvasymError(f"rank agreement: {scheme} at n = {budget} covers other positions than {cells[0]}")
        sums[i] = np.bincount(ids, weights=(g["nll"] - g["nll_ref"]).to_numpy(), minlength=names.size)
    sizes = np.bincount(ids, minlength=names.size).astype(np.float64)
    y = sums.sum(axis=1) / sizes.sum()
    rho = _spearman(x[None, :], y[None, :])[0]
    gen = rng(base_seed, "e2e", "rank-agreement", rope)
    counts = np.stack([np.bincount(gen.integers(0, names.size, names.size), minlength=names.size)
                       for _ in range(n_boot)]).astype(np.float64)
    replicates = (counts @ sums.T) / (counts @ sizes)[:, None]
    rhos = _spearman(np.broadcast_to(x, replicates.shape), replicates)
    low, high = np.nanquantile(rhos, [(1 - level) / 2, (1 + level) / 2])
    return {"rope": rope, "spearman": float(rho), "low": float(low), "high": float(high), "n_cells": len(cells),
            "n_blocks": int(names.size), "n_boot": int(n_boot)}


def _spearman(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Row-wise Spearman rho of (rows, cells) arrays: Pearson correlation of average ranks
    (NaN for a row of constant ranks)."""
    rx, ry = rankdata(x, axis=1), rankdata(y, axis=1)
    rx -= rx.mean(axis=1, keepdims=True)
    ry -= ry.mean(axis=1, keepdims=True)
    den = np.sqrt((rx * rx).sum(axis=1) * (ry * ry).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return (rx * ry).sum(axis=1) / den
