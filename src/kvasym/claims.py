"""The claims ledger: each claim of the paper evaluated from the pipeline's own tables.

A claims file (``config/claims.yaml``) declares, per claim: ``id``, the paper's ``statement``,
the paper's number (``paper_value``, optional), which registered ``statistic`` decides it,
``where`` to evaluate it, and the rule ``holds_if``. Verdicts are computed, never defaulted:

- ``{op: ">=" | ">" | "<=" | "<", value: x}`` on an estimate with a confidence interval:
  *holds* if the whole interval satisfies the inequality, *does not hold* if the whole
  interval violates it, *inconclusive* if the interval straddles ``x``. Without an interval the
  estimate alone decides (holds / does not hold).
- ``{op: "all"}`` on a count of cells: *holds* if scheme ``a`` is significantly better in every
  cell, *does not hold* if ``b`` is significantly better in at least one (the reason names
  those cells), *inconclusive* otherwise. Significance is the per-trial paired Wilcoxon test,
  Holm-adjusted over the claim's own family (its cells times its metrics), so adding a
  distribution or a scheme to the grid outside the claim cannot change its verdict.
- ``max_log10_p: y`` (optional, with an inequality): the claim also needs ``log10 p <= y``, where
  p is the per-trial test (trials are the independent units; per-query p-values are details).
  If the design cannot reach ``y`` at all (the smallest attainable p with that many trials is
  larger), the verdict is *inconclusive*, never *holds*, and the reason says so.
- ``{op: within, value: m}``: an equivalence test, *holds* if the whole interval lies inside
  ``[theta (1 - m), theta (1 + m)]``, *does not hold* if it lies wholly outside, *inconclusive*
  if it straddles a bound. ``theta`` is the rule's ``target`` (e.g. the paper's number) or else
  the statistic's closed form (``theory`` rows, the second-order prediction of a KL ratio). With
  a 95% interval this is two one-sided tests (TOST) at 2.5% each (Schuirmann 1987), so
  "matches" is shown, not assumed from a failure to reject; no difference-test p is printed.
- A "follows the law" or "stays within" claim is an inequality on a distance or ratio decided on
  its whole interval (e.g. the Kolmogorov distance from the Beta law below a margin): again an
  equivalence-type test; its difference-test p is only a detail.
- ``construction: {verdict, from, why}`` (optional): the claim's outcome follows from theory (e.g.
  from another claim's closed form). If the data meet the predicted verdict, the verdict is
  *determined by construction*, distinct from support or refutation by data; otherwise the
  measured verdict stands and its reason says it contradicts the construction argument.

- An interval that is unbounded (Fieller's confidence set for a ratio of means is the whole line,
  or two rays, when the denominator's mean is not significantly different from 0 over the units)
  cannot decide: the verdict is *inconclusive*, its reason says the interval is unbounded and
  why, and the ledger prints "unbounded", never ``[-inf, inf]`` as if it were a measurement.
  (With a one-sided rule such a set never lies wholly on either side of the threshold, so this
  states the verdict the comparison gives; it changes none.)
- ``decided_by`` (optional): the test the verdict rests on, one of :data:`DECIDING_TESTS`
  (``fieller``, ``t``, ``bootstrap``, ``fisher_z``, ``agresti_min``, ``wilcoxon_holm``,
  ``ratio_cis``, ``estimate``). Each statistic has its default (:attr:`Statistic.decided_by`, for ``theory``
  the check's interval method); the key declares what already decides and cannot choose
  another test: a value other than the default is an error naming the claim and the key. The
  ledger prints it beside every verdict (:func:`decided_by_words`), with the statistic's
  difference test (:attr:`Statistic.p_test`: a Wilcoxon or McNemar p shown in the row) named as
  deciding only where the rule bounds it (``max_log10_p``) and as "not in the rule" otherwise.

A claim whose cells are not in the grid is *not evaluated* (with the reason); a claim naming a
statistic that does not exist, or a malformed rule, is an error: the stage fails. The file's
shape is the JSON Schema ``workflow/schemas/claims.schema.yaml`` (:func:`load_claims`).

Each statistic is one record of :data:`STATISTICS` (:class:`Statistic`: its function, the
tables it reads, the ledger's words for it, ...): adding one is its function plus its record.

References
----------
.. [1] Schuirmann, D. J. (1987) "A comparison of the two one-sided tests procedure and the power
   approach for assessing the equivalence of average bioavailability", J. Pharmacokinet.
   Biopharm. 15(6):657-680.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .cells import MissingCell, pair_ratio, select_cells
from .config_schema import first_error, format_error, load_schema
from .errors import KvasymError

HOLDS, FAILS, INCONCLUSIVE, NOT_EVALUATED = "holds", "does not hold", "inconclusive", "not evaluated"
#: The verdict of a claim whose outcome follows from theory (its ``construction`` key) and which
#: the data met as predicted: neither support for the paper nor a refutation by data.
BY_CONSTRUCTION = "determined by construction"
#: Every verdict a ledger can hold.
VERDICTS = (HOLDS, FAILS, INCONCLUSIVE, BY_CONSTRUCTION, NOT_EVALUATED)


@dataclass
class Measurement:
    """A claim's statistic: its estimate, its interval and p where it has them.

    ``interval``: the statistic is decided on a confidence interval (over trials or texts).
    Such a measurement whose interval is undefined (a NaN bound: a replicate with a zero
    denominator, or a single cluster) or has zero width (every replicate equal, e.g. one trial)
    cannot decide its claim: the verdict is *inconclusive*, never the point estimate's.
    """

    estimate: float
    low: float = math.nan
    high: float = math.nan
    log10_p: float = math.nan
    details: dict[str, Any] = field(default_factory=dict)
    interval: bool = False


@dataclass
class Tables:
    comparisons: pd.DataFrame
    summary: pd.DataFrame
    trials: pd.DataFrame
    theory: pd.DataFrame
    base_seed: int = 0
    n_boot: int = 1000
    #: End-to-end tables of the real model (stage e2e_stats), None when not configured.
    e2e_comparisons: pd.DataFrame | None = None
    e2e_equal_bits: pd.DataFrame | None = None
    e2e_agreement: pd.DataFrame | None = None
    #: Long-context measures per window length and passkey accuracy (stage e2e_stats), None
    #: when not configured.
    e2e_long_summary: pd.DataFrame | None = None
    passkey_summary: pd.DataFrame | None = None
    #: The measured allocation against the uniform map (stage card), None when not configured.
    card_comparisons: pd.DataFrame | None = None
    #: The frontier's per-unit values (stage frontier), None when no frontier is configured.
    frontier_units: pd.DataFrame | None = None
    #: The sequence-length sweep's slopes (stage seq_len_sweep), None when no sweep is configured.
    seq_len_slopes: pd.DataFrame | None = None
    #: Query-model variants of the grid (:attr:`kvasym.study.Study.query_variants`):
    #: ``{name: {"of": parent, "query": model}}``; every other low-rank distribution's queries
    #: follow the subspace rule. The ledger's reason names the query model of each low-rank
    #: distribution a verdict reads (:func:`query_model_note`).
    query_variants: Mapping[str, Mapping[str, str]] = field(default_factory=dict)


def _known(value: Any, available: Any, what: str) -> None:
    """A metric, check or column name that this statistic can never find is a typo in the claims
    file, not a cell missing from a smaller grid: fail instead of reporting 'not evaluated'."""
    known = sorted({str(v) for v in available})
    if value not in known:
        raise KvasymError(f"{what} {value!r} does not exist; known: {', '.join(known)}")


def _pair_cell(where: Mapping[str, Any]) -> dict[str, Any]:
    return dict(distribution=where["distribution"], dim=where["dim"], budget=where["budget"],
                sharpness=float(where["sharpness"]))


def min_attainable_log10_p(n_trials: int) -> float:
    """The smallest log10 p the per-trial paired Wilcoxon test can return with ``n_trials``
    pairs: its value when every difference has the same sign (exact null, two-sided:
    ``log10(2 / 2**n)`` for n <= 50 without ties). A rule asking for a smaller p cannot be met by
    any data on this design, whatever the effect."""
    from .stats import wilcoxon_paired

    if n_trials < 1:
        return 0.0
    return float(wilcoxon_paired(np.arange(1.0, n_trials + 1.0), np.zeros(n_trials))["log10_p"])


def stat_kl_ratio(t: Tables, where: Mapping[str, Any]) -> Measurement:
    """Ratio of KL (``which``: mean or p99) of scheme ``a`` over scheme ``b`` in one cell, with
    its paired CI over units (oriented by :func:`kvasym.cells.pair_ratio`).

    The p-value is the per-trial paired Wilcoxon test: the trial (one draw of keys, values and
    queries) is the independent unit; the queries of a trial share its keys, so a per-query
    Mann-Whitney p (the paper's) overstates the evidence and is kept in the details only, never
    in a verdict. The details also give the smallest p the design can reach
    (:func:`min_attainable_log10_p`), the rank-biserial correlations, and the second-order
    prediction (``theory``: the ratio of the key sides' closed-form error energies)."""
    which = where.get("which", "mean")
    _known(which, ("mean", "p99"), "which")
    ratio = pair_ratio(t.comparisons, where["a"], where["b"], which=which, **_pair_cell(where))
    row = ratio["row"]
    sign = -1.0 if ratio["swapped"] else 1.0
    # the second-order prediction (kvasym.theory.predicted_kl_ratio), oriented as the estimate
    theory = float(row["ratio_theory"]) if "ratio_theory" in row.index else math.nan
    if ratio["swapped"]:
        theory = math.nan if not math.isfinite(theory) or theory == 0 else 1.0 / theory
    n_trials = int(row["n_trials"])
    # the independent units of the per-unit test: trials, or texts for the real rows
    n_units = int(row["n_units"]) if "n_units" in row.index and math.isfinite(float(row["n_units"])) else n_trials
    return Measurement(
        ratio["estimate"], ratio["low"], ratio["high"], float(row["t_wilcoxon_log10_p"]),
        {
            "per_trial_rank_biserial": sign * float(row["t_wilcoxon_rank_biserial"]),
            "min_attainable_log10_p": min_attainable_log10_p(n_units),
            "n_units": n_units,
            "per_query_mann_whitney_log10_p": float(row["q_log10_p"]),
            "per_query_rank_biserial": sign * float(row["q_rank_biserial"]),
            "n_queries": int(row["n_a"]),
            "n_trials": n_trials,
            "theory": theory,
        },
        interval=True,
    )


def _cell_outcomes(t: Tables, where: Mapping[str, Any], metric: str) -> pd.DataFrame:
    """Per cell matching ``where``'s filters: ``a_minus_b`` on ``metric`` (oriented as ``a`` minus
    ``b``), whether ``a`` is the better one, and the per-trial paired Wilcoxon ``log10_p``
    (unadjusted: :func:`_decide_family` adjusts it over the claim's own family)."""
    _known(metric, t.comparisons["metric"].unique(), "metric")
    rows = t.comparisons[t.comparisons["metric"] == metric]
    forward = rows[(rows["scheme_a"] == where["a"]) & (rows["scheme_b"] == where["b"])]
    backward = rows[(rows["scheme_a"] == where["b"]) & (rows["scheme_b"] == where["a"])]
    diff = np.concatenate([(forward["mean_a"] - forward["mean_b"]).to_numpy(),
                           (backward["mean_b"] - backward["mean_a"]).to_numpy()])
    cells = pd.concat([forward, backward], ignore_index=True)
    cells["a_minus_b"] = diff
    for key in ("budget", "dim", "distribution"):
        allowed = where.get(f"{key}s")
        if allowed is not None:
            cells = cells[cells[key].isin(allowed)]
    if "sharpness" in where and where.get("all_sharpness") is not True:
        cells = cells[np.isclose(cells["sharpness"], float(where["sharpness"]))]
    if cells.empty:
        raise MissingCell(f"no comparison of {where['a']} and {where['b']} on {metric}")
    lower_better = (where.get("better", {}).get(metric, "lower") == "lower" if isinstance(where.get("better"), Mapping)
                    else where.get("better", "lower") == "lower")
    cells = cells.copy()
    cells["a_better"] = cells["a_minus_b"] < 0 if lower_better else cells["a_minus_b"] > 0
    cells["tied"] = cells["a_minus_b"] == 0
    cells["log10_p"] = cells["t_wilcoxon_log10_p"].to_numpy(dtype=float)
    return cells.set_index(["distribution", "dim", "budget", "sharpness"]).sort_index()


def _decide_family(frames: Mapping[str, pd.DataFrame], alpha: float) -> int:
    """Holm-adjust the per-trial p-values of every (cell, metric) test of one claim together and
    mark ``a_sig_better`` / ``b_sig_better`` in each frame (in place); returns the family size.

    The family is the claim's own: the cells its ``where`` selects times its metrics, so a
    distribution, dimension or scheme added to the grid outside them cannot change its verdict
    (Holm 1979 controls the family-wise error rate of exactly the tests the claim reads).
    """
    from .stats import holm_log10

    pooled = np.concatenate([f["log10_p"].to_numpy(dtype=float) for f in frames.values()])
    finite = np.isfinite(pooled)
    adjusted = np.full(pooled.shape, np.nan)
    if finite.any():
        adjusted[finite] = holm_log10(pooled[finite])
    start = 0
    for frame in frames.values():
        part = adjusted[start:start + len(frame)]
        start += len(frame)
        significant = part <= math.log10(alpha)  # NaN (no test) is never significant
        frame["log10_p_holm"] = part
        frame["a_sig_better"] = frame["a_better"].to_numpy() & significant
        frame["b_sig_better"] = ~frame["a_better"].to_numpy() & significant & ~frame["tied"].to_numpy()
    return int(finite.sum())


def _cell_name(key: Any) -> str:
    """``t1.05 d128 n2 s8``: a cell as the ledger names it."""
    distribution, dim, budget, sharpness = key
    return f"{distribution} d{int(dim)} n{int(budget)} s{float(sharpness):g}"


def stat_cells_better(t: Tables, where: Mapping[str, Any]) -> Measurement:
    """In how many cells is scheme ``a`` significantly better than ``b`` on every metric of
    ``metrics``? Per-trial paired Wilcoxon, Holm-adjusted over the claim's own family (its cells
    times its metrics, :func:`_decide_family`) at ``alpha``. Estimate: that fraction; the cells
    where ``b`` is significantly better on some metric are named in the details."""
    metrics = list(where.get("metrics", ["kl"]))
    frames = {m: _cell_outcomes(t, where, m) for m in metrics}
    index = frames[metrics[0]].index
    for m in metrics[1:]:
        if not frames[m].index.equals(index):
            raise KvasymError(f"metrics {metrics[0]} and {m} cover different cells; a claim over both needs both")
    family = _decide_family(frames, float(where.get("alpha", 0.05)))
    a_sig = np.logical_and.reduce([f["a_sig_better"].to_numpy() for f in frames.values()])
    b_sig = np.logical_or.reduce([f["b_sig_better"].to_numpy() for f in frames.values()])
    reversed_cells = [_cell_name(i) for i in index[b_sig]]
    return Measurement(
        float(np.mean(a_sig)),
        details={"n_cells": int(len(index)), "n_a_significantly_better": int(np.sum(a_sig)),
                 "n_b_significantly_better": int(np.sum(b_sig)), "cells_where_b_better": reversed_cells,
                 "metrics": metrics, "holm_family_size": family},
    )


def stat_crossover(t: Tables, where: Mapping[str, Any]) -> Measurement:
    """Cells (at ``budgets``) where ``b`` has significantly lower K direction error than ``a``
    while ``a`` has significantly lower KL: the budget-dependent crossover. Estimate: count.
    Both metrics' tests form one Holm family (:func:`_decide_family`)."""
    frames = {m: _cell_outcomes(t, where, m) for m in ("k_eps_dir", "kl")}
    family = _decide_family(frames, float(where.get("alpha", 0.05)))
    geo, kl = frames["k_eps_dir"], frames["kl"]
    both = geo["b_sig_better"] & kl.loc[geo.index, "a_sig_better"]
    cells = [_cell_name(i) for i in geo.index[np.asarray(both)]]
    return Measurement(float(np.sum(both)), details={"n_cells": int(len(geo)), "cells": cells[:20],
                                                     "holm_family_size": family})


def _trial_values(trials: pd.DataFrame, distribution: str, where: Mapping[str, Any], metric: str) -> pd.DataFrame:
    keys = {"distribution", "kind", "dim", "scheme", "budget", "sharpness", "trial", "text"}
    _known(metric, set(trials.columns) - keys, "metric")
    rows = select_cells(trials, "per-trial", distribution=distribution, dim=where["dim"], budget=where["budget"],
                        scheme=where["scheme"], sharpness=float(where["sharpness"]))
    columns = ["trial", metric] + (["text"] if "text" in rows.columns else [])
    return rows.sort_values("trial")[columns]


def _unit_values(rows: pd.DataFrame, metric: str) -> tuple[list[str], list[np.ndarray], str]:
    """The per-trial ``metric`` values grouped by independent unit: (unit names, one array of
    trial values per unit, the unit's kind). Real rows carry their trial's ``text`` (stage
    ``stats``): the text is the unit and its (layer, head) caches one cluster; synthetic rows
    (no text, or an empty one) are one unit per trial."""
    texts = rows["text"].astype(str).to_numpy() if "text" in rows.columns else None
    if texts is None or (texts == "").any():
        if texts is not None and (texts != "").any():
            raise KvasymError("per-trial rows of one distribution mix trials with and without a text")
        return ([str(t) for t in rows["trial"]], [np.array([v]) for v in rows[metric].to_numpy(dtype=float)],
                "trial")
    names = sorted(set(texts.tolist()))
    values = rows[metric].to_numpy(dtype=float)
    return names, [values[texts == name] for name in names], "text"


def distribution_ratio(trials: pd.DataFrame, where: Mapping[str, Any], *, n_boot: int,
                       base_seed: int) -> Measurement:
    """Ratio of the mean per-trial ``metric`` of distribution ``num`` over ``den`` (same dim,
    budget, scheme, sharpness), with its interval over trials (:func:`kvasym.stats.bootstrap_ratio_ci`:
    Fieller's for means): the statistic of claim ``distribution_ratio`` (C5 and its query-model
    variants, :func:`stat_distribution_ratio`) and of every point of the query-model table
    (:func:`query_model_points`), so the ledger and the figure read one computation.

    The unit is the trial for synthetic rows and the TEXT for real ones (the trials table's
    ``text``; its (layer, head) caches are nested in it and share it): the interval is Fieller's
    over units, each unit's trials one cluster (:func:`kvasym.stats.fieller_ratio_ci`: a text's
    trials enter through their total, so repeating a text's caches does not narrow it), and the
    difference test runs on the per-unit means.

    ``paired: true`` pairs unit ``g`` of ``num`` with unit ``g`` of ``den`` (the interval
    works on their per-unit differences, Fieller's paired set): for two treatments of the same
    data, e.g. real keys quantized before and after RoPE, whose trial ``i`` is the same (text,
    layer, head) cache; the trial ids (and so the texts) must then be the same. Otherwise the two
    are independent samples (unpaired, Welch-type interval). The claim is decided on the interval
    alone; the Mann-Whitney (unpaired) or Wilcoxon (paired) difference-test p over units is in the
    details, never in the verdict (a "stays within" claim is not shown by a difference test).

    Parameters
    ----------
    trials : pandas.DataFrame
        The gathered per-trial table (stage ``gather``, artifact ``trials``).
    where : mapping
        ``num``, ``den``, ``dim``, ``budget``, ``scheme``, ``sharpness``; optional ``metric``
        (default ``kl``) and ``paired`` (default false).
    n_boot, base_seed : int
        The study's bootstrap replicates and base seed (:func:`kvasym.stats.bootstrap_ratio_ci`).

    Returns
    -------
    Measurement
        The ratio, its interval (``interval=True``) and the difference test in the details.

    Raises
    ------
    MissingCell
        When ``num`` or ``den`` has no rows at the cell.
    KvasymError
        An unknown metric, or ``paired`` with different trials or units.
    """
    from . import stats  # scipy.stats costs ~1 s to import: not at Snakefile parse time

    metric = where.get("metric", "kl")
    paired = where.get("paired", False)
    if not isinstance(paired, bool):
        raise KvasymError(f"paired must be true or false, got {paired!r}")
    num = _trial_values(trials, where["num"], where, metric)
    den = _trial_values(trials, where["den"], where, metric)
    if paired and not np.array_equal(num["trial"].to_numpy(), den["trial"].to_numpy()):
        raise KvasymError(f"paired: true needs the same trials in {where['num']} ({len(num)}) and {where['den']} "
                          f"({len(den)}); they differ")
    names_a, a, kind_a = _unit_values(num, metric)
    names_b, b, kind_b = _unit_values(den, metric)
    if paired and names_a != names_b:
        raise KvasymError(f"paired: true needs the same units in {where['num']} and {where['den']}; their "
                          f"{kind_a}s differ")
    ci = stats.bootstrap_ratio_ci(a, b, statistic="mean", n_boot=n_boot, base_seed=base_seed,
                                  identity=("claims", where["num"], where["den"], metric, int(where["dim"])),
                                  paired=paired)
    unit_a, unit_b = np.array([np.mean(x) for x in a]), np.array([np.mean(x) for x in b])
    test = stats.wilcoxon_paired(unit_a, unit_b) if paired else stats.mann_whitney(unit_a, unit_b)
    pooled_a, pooled_b = np.concatenate(a), np.concatenate(b)
    details: dict[str, Any] = {"mean_num": float(np.mean(pooled_a)), "mean_den": float(np.mean(pooled_b)),
                               "n_trials": int(pooled_a.size), "unit": kind_a, "n_units": len(a),
                               "paired": paired,
                               ("wilcoxon" if paired else "mann_whitney") + "_log10_p": float(test["log10_p"])}
    return Measurement(ci["estimate"], ci["low"], ci["high"], details=details, interval=True)


def stat_distribution_ratio(t: Tables, where: Mapping[str, Any]) -> Measurement:
    """Claim statistic ``distribution_ratio``: :func:`distribution_ratio` of the trials table,
    with the KS statistics of both distributions' rotated coordinates against the Beta law (the
    theory table's ``ks_beta`` rows) in the details."""
    m = distribution_ratio(t.trials, where, n_boot=t.n_boot, base_seed=t.base_seed)
    for role in ("num", "den"):
        ks = t.theory[(t.theory["check"] == "ks_beta") & (t.theory["distribution"] == where[role])
                      & (t.theory["dim"] == where["dim"])]
        if not ks.empty:
            m.details[f"ks_beta_d_{role}"] = float(ks["statistic"].iloc[0])
    return m


#: The columns of the query-model table (artifact ``query_model``, :func:`query_model_points`).
QUERY_MODEL_COLUMNS: tuple[str, ...] = ("distribution", "rank", "dim", "query", "alignment", "scheme", "budget",
                                        "sharpness", "ratio", "low", "high", "reference", "predicted")


def query_model_points(trials: pd.DataFrame, *, parents: Mapping[str, Mapping[str, Any]],
                       variants: Mapping[str, Mapping[str, str]], references: Sequence[str], scheme: str,
                       budget: int, sharpness: float, n_boot: int, base_seed: int,
                       metric: str = "kl") -> pd.DataFrame:
    """C5's statistic under each query model: per low-rank distribution (a parent, or a
    query-model variant of one) and dim, the ratio of its mean per-trial ``metric`` over the
    reference distribution's (the first of ``references`` present at that dim: the heaviest-tailed
    one) for one scheme, budget and sharpness, with its 95% interval: :func:`distribution_ratio`,
    the claims' own computation, so a point of the query-model figure and the claim made at its
    cell are one number.

    Parameters
    ----------
    trials : pandas.DataFrame
        The gathered per-trial table.
    parents : mapping
        The low-rank distributions (not variants): ``{name: {"rank", "noise"}}``.
    variants : mapping
        The query-model variants: ``{name: {"of": parent, "query": model}}``; a variant whose
        parent is not in ``parents`` is left out.
    references : sequence of str
        The reference distributions, in order of preference (:meth:`kvasym.study.Study.rank_references`).
    scheme, budget, sharpness
        The cell (C5's scheme, the headline budget and sharpness).
    n_boot, base_seed : int
        As for the claims (:func:`distribution_ratio`).
    metric : str, optional
        The per-trial column (default ``kl``).

    Returns
    -------
    pandas.DataFrame
        :data:`QUERY_MODEL_COLUMNS`, sorted by dim, rank and alignment: ``alignment`` is E[a] of
        the query model (:func:`kvasym.querymodel.expected_alignment`), ``ratio``, ``low`` and
        ``high`` the estimate and interval, and ``predicted`` the second-order prediction from
        the subspace point, its ratio times ``E[1/a] / E[1/a]_subspace``
        (:func:`kvasym.querymodel.expected_inverse_alignment`; inf for isotropic queries on
        rank <= 2 keys, NaN without a subspace point).
    """
    from .querymodel import (DEFAULT_QUERY_MODEL, expected_alignment, expected_inverse_alignment,
                             parse_query_model)

    rows = select_cells(trials, "per-trial", required=False, scheme=scheme, budget=int(budget),
                        sharpness=float(sharpness))
    means = rows.groupby(["distribution", "dim"])[metric].mean() if not rows.empty else pd.Series(dtype=float)
    models = {name: (name, DEFAULT_QUERY_MODEL) for name in parents}
    models.update({name: (v["of"], v["query"]) for name, v in variants.items() if v["of"] in parents})
    out = []
    for name, (parent, query) in models.items():
        spec = parents[parent]
        for dim in [dim for dist, dim in means.index if dist == name]:
            # the reference must have a positive mean: a ratio over zero KL is undefined
            ref = next((r for r in references if (r, dim) in means.index), None)
            if ref is None or not np.isfinite(means[(ref, dim)]) or means[(ref, dim)] <= 0:
                continue
            alignment = expected_alignment(parse_query_model(query), "low_rank", int(dim), int(spec["rank"]),
                                           float(spec.get("noise", 0.0)))
            where = {"num": name, "den": ref, "dim": dim, "budget": int(budget), "scheme": scheme,
                     "sharpness": float(sharpness), "metric": metric}
            m = distribution_ratio(trials, where, n_boot=n_boot, base_seed=base_seed)
            out.append({"distribution": name, "rank": int(spec["rank"]), "dim": int(dim), "query": query,
                        "alignment": alignment, "scheme": scheme, "budget": int(budget),
                        "sharpness": float(sharpness), "ratio": float(m.estimate), "low": float(m.low),
                        "high": float(m.high), "reference": ref})
    frame = (pd.DataFrame(out, columns=list(QUERY_MODEL_COLUMNS[:-1])).sort_values(["dim", "rank", "alignment"])
             .reset_index(drop=True))
    # the second-order prediction from the subspace point: ratio x E[1/a] / E[1/a]_subspace
    predicted = np.full(len(frame), np.nan)
    for i, p in frame.iterrows():
        base = frame[(frame["rank"] == p["rank"]) & (frame["dim"] == p["dim"]) & (frame["query"] == "subspace")]
        if not base.empty:
            inv = expected_inverse_alignment(parse_query_model(p["query"]), int(p["dim"]), int(p["rank"]))
            inv0 = expected_inverse_alignment(parse_query_model("subspace"), int(p["dim"]), int(p["rank"]))
            predicted[i] = float(base["ratio"].iloc[0]) * inv / inv0 if math.isfinite(inv) else np.inf
    frame["predicted"] = predicted
    return frame


#: The Jensen-slope rows of the theory table: alone, holding the log reference weight fixed,
#: holding the log key norm fixed (kvasym.stages.theory).
JENSEN_CHECKS = ("jensen_slope", "jensen_slope_adjusted", "jensen_slope_norm")


def stat_theory(t: Tables, where: Mapping[str, Any]) -> Measurement:
    """A row of the theory table (``check``): the measured estimate with its CI and the closed
    form (``theory``) in the details."""
    from .theory import THEORY_CHECKS

    # a known check without rows (no per-key rows: per_key_trials 0) is "not evaluated", not a typo
    _known(where["check"], THEORY_CHECKS, "theory check")
    conditions = dict(check=where["check"], distribution=where["distribution"], dim=where["dim"])
    for key in ("budget", "scheme"):
        if key in where:
            conditions[key] = where[key]
    if "sharpness" in where and where["check"] in JENSEN_CHECKS:
        conditions["sharpness"] = float(where["sharpness"])
    row = select_cells(t.theory, "theory", **conditions).iloc[0]
    details = {"theory": float(row["theory"]), "n": float(row["n"])}
    if where["check"] in JENSEN_CHECKS:
        # the same cell's slope fitted alone, holding the reference weight and holding the key
        # norm fixed: a Jensen claim decided on one of them shows the others beside it
        for check in JENSEN_CHECKS:
            sibling = t.theory[(t.theory["check"] == check) & (t.theory["distribution"] == row["distribution"])
                               & (t.theory["dim"] == row["dim"]) & (t.theory["scheme"] == row["scheme"])
                               & (t.theory["budget"] == row["budget"])
                               & np.isclose(t.theory["sharpness"].astype(float), float(row["sharpness"]))]
            if not sibling.empty:
                details[check] = [float(sibling["estimate"].iloc[0]), float(sibling["low"].iloc[0]),
                                  float(sibling["high"].iloc[0])]
    if not math.isnan(row["theory"]):
        details["relative_to_theory"] = float(row["estimate"] / row["theory"])
    if where["check"] == "ks_beta":
        # the Kolmogorov distance from the Beta law with its cluster-bootstrap interval: "follows
        # the law" is an equivalence claim (the whole interval below a declared margin), so the
        # KS difference-test p is a detail, never the decision
        return Measurement(float(row["estimate"]), float(row["low"]), float(row["high"]),
                           details={"ks_p": float(row["p"]), "n": float(row["n"])}, interval=True)
    return Measurement(float(row["estimate"]), float(row["low"]), float(row["high"]), details=details,
                       interval=True)


def stat_ranking_disagreement(t: Tables, where: Mapping[str, Any]) -> Measurement:
    """Fraction of groups (distribution, dim, budget, sharpness) in which the best scheme by
    mean KL is significantly worse than another by the ``by`` column (``kl_p99``: the 99th
    percentile of KL), while significantly better than it by mean KL.

    Per group: ``A`` the best scheme by mean KL, ``B`` the best by ``by``. The group counts as a
    disagreement only if the paired 95% intervals of both ratios exclude 1
    (``mean_A / mean_B < 1`` and ``p99_A / p99_B > 1``, from the comparisons table): a swap
    between two schemes that are statistically tied is noise, not a ranking the mean hides.
    The details count the raw (untested) disagreements as well."""
    by = where.get("by", "kl_p99")
    _known(by, ("kl_p99",), "summary column (by)")
    disagree, raw, groups, examples = 0, 0, 0, []
    for key, g in t.summary.groupby(["distribution", "dim", "budget", "sharpness"]):
        best_mean = str(g.loc[g["kl_mean"].idxmin(), "scheme"])
        best_by = str(g.loc[g[by].idxmin(), "scheme"])
        groups += 1
        if best_mean == best_by:
            continue
        raw += 1
        cell = dict(distribution=key[0], dim=key[1], budget=key[2], sharpness=float(key[3]))
        mean = pair_ratio(t.comparisons, best_mean, best_by, which="mean", **cell)
        tail = pair_ratio(t.comparisons, best_mean, best_by, which="p99", **cell)
        if mean["high"] < 1.0 and tail["low"] > 1.0:
            disagree += 1
            examples.append(f"{_cell_name(key)}: {best_mean} by mean, {best_by} by p99")
    if groups == 0:
        raise MissingCell("no summary rows")
    return Measurement(disagree / groups,
                       details={"n_groups": groups, "n_disagree": disagree, "n_disagree_untested": raw,
                                "examples": examples[:10]})


def stat_catastrophic_share(t: Tables, where: Mapping[str, Any]) -> Measurement:
    """Share of catastrophic queries of ``scheme`` in one cell (``distribution``, ``dim``,
    ``budget``, ``sharpness``), with its interval over trials.

    A query is catastrophic when its top-1 key flips and its total variation exceeds
    :data:`kvasym.metrics.CATASTROPHIC_TV` (column ``catastrophic`` of the per-query table; the
    per-trial table holds each trial's share). The estimate is the pooled share, the mean of the
    per-trial shares (every trial has the same number of queries); the interval is
    :func:`kvasym.stats.bootstrap_ratio_ci` of the per-trial shares over a denominator of one,
    i.e. Fieller's interval over trials, here the t interval ``mean +- t_{G-1} sd / sqrt(G)`` of
    the G per-trial shares, clipped to [0, 1]: the trial is the unit (its queries share its keys),
    so the query count does not narrow it. When every trial has the same share (e.g. none has a
    catastrophic query) the interval has zero width and the verdict is inconclusive: G trials
    without a failure cannot rule out a share above a threshold. The details give the cell's
    mean and p99 KL, the top-1 agreement, the p99 TV and how many trials have a catastrophic
    query."""
    from . import stats

    _known("catastrophic", t.trials.columns, "per-trial column")
    cell = dict(distribution=where["distribution"], dim=where["dim"], budget=where["budget"],
                scheme=where["scheme"], sharpness=float(where["sharpness"]))
    rows = select_cells(t.trials, "per-trial", **cell).sort_values("trial")
    shares = rows["catastrophic"].to_numpy(dtype=float)
    ci = stats.bootstrap_ratio_ci(shares, np.ones_like(shares), statistic="mean", n_boot=t.n_boot,
                                  base_seed=t.base_seed, identity=("claims", "catastrophic", *map(str, cell.values())),
                                  paired=True)
    low, high = (min(max(float(ci[k]), 0.0), 1.0) if math.isfinite(float(ci[k])) else float(ci[k])
                 for k in ("low", "high"))
    details: dict[str, Any] = {"n_trials": int(shares.size), "n_trials_with_catastrophic": int(np.sum(shares > 0)),
                               "interval": "fieller over trials"}
    try:
        summary = select_cells(t.summary, "summary", **cell).iloc[0]
    except MissingCell:
        summary = None
    if summary is not None:
        for key in ("kl_mean", "kl_p99", "tv_p99", "top1_mean", "n_queries"):
            if key in summary.index:
                details[key] = float(summary[key])
    return Measurement(float(ci["estimate"]), low, high, details=details, interval=True)


def _e2e_table(table: pd.DataFrame | None, what: str, where: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """The rows of an end-to-end table of the model ``where["model"]`` (default the primary,
    :data:`kvasym.real.models.PRIMARY`); a table without a ``model`` column holds the primary's
    rows only."""
    from .real.models import PRIMARY

    if table is None:
        raise MissingCell(f"no end-to-end {what} table (the real rows or real.e2e are off)")
    model = str((where or {}).get("model", PRIMARY))
    if "model" not in table.columns:
        if model != PRIMARY:
            raise MissingCell(f"no end-to-end {what} rows of model {model!r} (the table has the primary's only)")
        return table
    rows = table[table["model"] == model]
    if rows.empty:
        raise MissingCell(f"no end-to-end {what} rows of model {model!r} (real.models)")
    return rows


def _oriented(row: pd.Series, forward: bool, log10_p: float, n_units: int) -> Measurement:
    """The perplexity ratio of ``row`` as asked (``forward``) or inverted (a row stored as (b, a))."""
    estimate, low, high = float(row["ppl_ratio"]), float(row["ppl_ratio_low"]), float(row["ppl_ratio_high"])
    sign = 1.0
    if not forward:
        estimate, low, high, sign = 1.0 / estimate, 1.0 / high, 1.0 / low, -1.0
    details = {"rank_biserial": sign * float(row["rank_biserial"]), "n_units": n_units, "n_trials": n_units,
               "min_attainable_log10_p": min_attainable_log10_p(n_units)}
    if "ppl_ratio_low_text" in row.index:
        # the text-clustered interval beside the units' (the draws of one text are not independent)
        text_low, text_high = float(row["ppl_ratio_low_text"]), float(row["ppl_ratio_high_text"])
        details["interval_text"] = [text_low, text_high] if forward else [1.0 / text_high, 1.0 / text_low]
    return Measurement(estimate, low, high, log10_p, details, interval=True)


def stat_e2e_ratio(t: Tables, where: Mapping[str, Any]) -> Measurement:
    """End to end: perplexity of scheme ``a`` over scheme ``b`` (``exp(mean_u(d_a - d_b))``) at the
    same ``budget`` with keys quantized ``rope`` (default post), every layer's cache quantized,
    with its t interval over the (text, draw) units; p from the paired Wilcoxon test over the
    units (:func:`kvasym.real.endtoend_stats.compare_schemes`). Oriented as asked: a row stored
    as (b, a) is inverted. The two schemes' bits per value are in the details (equal budget is
    not equal total bits)."""
    table = _e2e_table(t.e2e_comparisons, "comparisons", where)
    rope = where.get("rope", "post")
    rows = table[(table["rope"] == rope) & (table["budget"] == where["budget"])]
    forward = rows[(rows["scheme_a"] == where["a"]) & (rows["scheme_b"] == where["b"])]
    backward = rows[(rows["scheme_a"] == where["b"]) & (rows["scheme_b"] == where["a"])]
    if forward.empty and backward.empty:
        raise MissingCell(f"no end-to-end comparison of {where['a']} and {where['b']} at n = {where['budget']} "
                          f"({rope})")
    row = (forward if not forward.empty else backward).iloc[0]
    m = _oriented(row, not forward.empty, float(row["log10_p"]), int(row["n_units"]))
    bits = (float(row["bits_a"]), float(row["bits_b"]))
    m.details.update({"bits_a": bits[0] if not forward.empty else bits[1],
                      "bits_b": bits[1] if not forward.empty else bits[0]})
    return m


def stat_e2e_equal_bits(t: Tables, where: Mapping[str, Any]) -> Measurement:
    """End to end at equal total bits: scheme ``a`` at ``budget`` against scheme ``b`` evaluated at
    ``a``'s measured bits per value (interpolated in rate between two of ``b``'s budgets, never
    extrapolated), keys quantized ``rope`` (default post). ``measure`` ``ppl`` (default): the
    perplexity ratio ``exp(mean_u(d_a - d_b(rate)))``; ``kl``: the geometric-mean ratio of the
    mean next-token KL; each with its t interval over the (text, draw) units; p from the paired
    Wilcoxon test of the units' ``d`` (:func:`kvasym.real.endtoend_stats.compare_equal_bits`).
    A rate outside ``b``'s measured range is *not evaluated*."""
    table = _e2e_table(t.e2e_equal_bits, "equal-bits", where)
    rope = where.get("rope", "post")
    measure = where.get("measure", "ppl")
    if measure not in ("ppl", "kl"):
        raise KvasymError(f"e2e_equal_bits: where.measure must be ppl or kl, got {measure!r}")
    rows = table[(table["rope"] == rope) & (table["scheme_a"] == where["a"]) & (table["scheme_b"] == where["b"])
                 & (table["budget_a"] == where["budget"])]
    if rows.empty:
        raise MissingCell(f"no end-to-end equal-bits comparison of {where['a']} at n = {where['budget']} with "
                          f"{where['b']} ({rope})")
    row = rows.iloc[0]
    if not bool(row["evaluated"]):
        raise MissingCell(f"{where['a']}'s rate at n = {where['budget']} ({float(row['rate']):.3f} bits per value) "
                          f"is outside {where['b']}'s measured range: not evaluated (never extrapolated)")
    prefix = "ppl_ratio" if measure == "ppl" else "kl_ratio"
    details = {"rank_biserial": float(row["rank_biserial"]), "n_units": int(row["n_units"]),
               "n_trials": int(row["n_units"]), "rate": float(row["rate"]),
               "b_budgets": [int(row["b_budget_low"]), int(row["b_budget_high"])],
               "min_attainable_log10_p": min_attainable_log10_p(int(row["n_units"]))}
    if f"{prefix}_low_text" in row.index:
        # the text-clustered interval beside the units' (the draws of one text are not independent)
        details["interval_text"] = [float(row[f"{prefix}_low_text"]), float(row[f"{prefix}_high_text"])]
    return Measurement(float(row[prefix]), float(row[f"{prefix}_low"]), float(row[f"{prefix}_high"]),
                       float(row["log10_p"]), details, interval=True)


def stat_e2e_allocation(t: Tables, where: Mapping[str, Any]) -> Measurement:
    """The measured bit allocation against the uniform map of its scheme at the uniform map's
    measured rate (budget ``budget``; the allocation spends no more bits per value), end to end
    on the evaluation texts: ``measure`` ``kl`` (default) the geometric-mean ratio of the mean
    next-token KL (allocation over uniform), ``ppl`` the perplexity ratio; t interval over the
    (text, draw) units, p from the paired Wilcoxon test of the units' NLL
    (:func:`kvasym.real.endtoend_stats.compare_schemes` in stage ``card``). ``against``:
    ``uniform`` (default) the uniform map, ``tied`` the measured allocation with one width per
    layer (K and V tied, :func:`kvasym.real.card.tied_label`) at the same rate."""
    from .real.card import TIED_SUFFIX

    if t.card_comparisons is None:
        raise MissingCell("no model-card table (real.card is off)")
    measure = where.get("measure", "kl")
    if measure not in ("ppl", "kl"):
        raise KvasymError(f"e2e_allocation: where.measure must be ppl or kl, got {measure!r}")
    # the card table read is the primary model's (a further model's card is its own file)
    table = _e2e_table(t.card_comparisons, "model-card", where)
    against = where.get("against", "uniform")
    rows = table[(table["budget"] == where["budget"]) & table["scheme_a"].str.endswith("-MA")]
    tied = rows["scheme_b"].str.endswith(TIED_SUFFIX)
    rows = rows[tied] if against == "tied" else rows[~tied]
    if "scheme" in where:
        rows = rows[rows["scheme_b"] == where["scheme"]]
    if rows.empty:
        raise MissingCell(f"no measured allocation against the {against} map at n = {where['budget']}")
    row = rows.iloc[0]
    prefix = "ppl_ratio" if measure == "ppl" else "kl_ratio"
    details = {"rank_biserial": float(row["rank_biserial"]), "n_units": int(row["n_units"]),
               "n_trials": int(row["n_units"]), "bits_a": float(row["bits_a"]), "bits_b": float(row["bits_b"]),
               "min_attainable_log10_p": min_attainable_log10_p(int(row["n_units"]))}
    if f"{prefix}_low_text" in row.index:
        details["interval_text"] = [float(row[f"{prefix}_low_text"]), float(row[f"{prefix}_high_text"])]
    return Measurement(float(row[prefix]), float(row[f"{prefix}_low"]), float(row[f"{prefix}_high"]),
                       float(row["log10_p"]), details, interval=True)


def stat_e2e_rank_agreement(t: Tables, where: Mapping[str, Any]) -> Measurement:
    """Spearman's rho over (scheme, budget) between an end-to-end measure (``measure``: ``ppl``,
    the perplexity increase, default; or ``kl``, the mean next-token KL) and the per-head mean
    attention KL, over the study's schemes (``scope: study``, default) or every end-to-end
    scheme (``scope: all``), keys quantized ``rope`` (default post)
    (:func:`kvasym.real.endtoend_stats.rank_agreement`), with the Fisher-z interval over its
    cells (:func:`kvasym.stats.spearman_fisher_ci`, Bonett and Wright's variance).

    Amendment of 2026-12-06 (issue 50, point 6c; ``config/claims.yaml`` at C12e): the interval
    was the agreement table's percentile bootstrap over the (text, draw) units, which is kept
    in the details (``bootstrap_low``, ``bootstrap_high``). With the cells fixed and a few units
    that bootstrap is not consistent for a rank statistic, a step function of the cells' means:
    where two cells' means nearly tie its lower end lay above the true rho in 21% of simulated
    samples (nominal 2.5%), and its distribution has an atom at the estimate (most
    resamples keep every cell's order), which put the paper grid's C12e estimate on its
    interval's end (0.932 in [0.932, 0.954]). The Fisher-z interval treats the cells as the
    units of the correlation; its lower end was never above the true rho in that simulation
    (tests/test_stats.py)."""
    from . import stats

    table = _e2e_table(t.e2e_agreement, "agreement", where)
    rope = where.get("rope", "post")
    measure, scope = where.get("measure", "ppl"), where.get("scope", "study")
    rows = table[(table["rope"] == rope) & (table["measure"] == measure) & (table["scope"] == scope)]
    if rows.empty:
        raise MissingCell(f"no end-to-end rank agreement for rope {rope}, measure {measure}, scope {scope}")
    row = rows.iloc[0]
    ci = stats.spearman_fisher_ci(float(row["spearman"]), int(row["n_cells"]))
    return Measurement(float(row["spearman"]), ci["low"], ci["high"],
                       details={"n_cells": int(row["n_cells"]), "n_units": int(row["n_units"]),
                                "n_trials": int(row["n_units"]), "interval": "fisher-z over cells",
                                "bootstrap_low": float(row["low"]), "bootstrap_high": float(row["high"])},
                       interval=True)


def stat_e2e_context_growth(t: Tables, where: Mapping[str, Any]) -> Measurement:
    """Long context: how a scheme's damage at ``budget`` grows with the context a position has
    read, in windows of ``context`` tokens: ``measure`` ``kl`` (default) the geometric mean
    over the windows of the ratio of the mean next-token KL over the window's second half to
    that over its first 512 positions, ``ppl`` the ratio of the two spans' perplexity ratios;
    t interval over the windows (each its own draw)
    (:func:`kvasym.real.endtoend_stats.context_growth`)."""
    table = _e2e_table(t.e2e_long_summary, "long-context", where)
    measure = where.get("measure", "kl")
    if measure not in ("ppl", "kl"):
        raise KvasymError(f"e2e_context_growth: where.measure must be ppl or kl, got {measure!r}")
    rows = table[(table["scheme"] == where["scheme"]) & (table["budget"] == where["budget"])
                 & (table["context"] == where["context"]) & (table["rope"] == where.get("rope", "post"))]
    if rows.empty:
        raise MissingCell(f"no long-context windows of {where['context']} tokens for {where['scheme']} at "
                          f"n = {where['budget']}")
    row = rows.iloc[0]
    prefix = f"{measure}_growth"
    return Measurement(float(row[prefix]), float(row[f"{prefix}_low"]), float(row[f"{prefix}_high"]),
                       details={"n_units": int(row["n_units"]), "n_trials": int(row["n_units"]),
                                "context": int(row["context"]), "kl_mean": float(row["kl_mean"])},
                       interval=True)


def stat_passkey_difference(t: Tables, where: Mapping[str, Any]) -> Measurement:
    """Passkey retrieval: the accuracy of the pass ``scheme@budget`` minus that of full precision
    on the same trials of ``length`` tokens (every depth), with Agresti and Min's interval for
    matched proportions; p from McNemar's exact test
    (:func:`kvasym.real.passkey_grid.summarize_grid`)."""
    table = _e2e_table(t.passkey_summary, "passkey", where)
    name = f"{where['scheme']}@{int(where['budget'])}"
    rows = table[(table["pass"] == name) & (table["scope"] == "length") & (table["length"] == where["length"])]
    if rows.empty:
        raise MissingCell(f"no passkey trials of {name} at {where['length']} tokens")
    row = rows.iloc[0]
    return Measurement(float(row["accuracy_diff"]), float(row["diff_low"]), float(row["diff_high"]),
                       float(row["mcnemar_log10_p"]),
                       {"n_trials": int(row["n"]), "n_units": int(row["n"]), "accuracy": float(row["accuracy"]),
                        "fp_accuracy": float(row["fp_accuracy"]), "mcnemar_b": int(row["mcnemar_b"]),
                        "mcnemar_c": int(row["mcnemar_c"]), "baseline_can_do": bool(row["baseline_can_do"])},
                       interval=True)


def stat_equal_rate_ratio(t: Tables, where: Mapping[str, Any]) -> Measurement:
    """Ratio of the mean ``metric`` (default ``kl``) of scheme ``a`` over scheme ``b`` at one
    measured total rate (payload + side bits per coordinate), from the frontier's per-unit
    values (stage frontier; :func:`kvasym.frontier.equal_rate_pairs`), with its paired interval
    over units (Fieller's: trials, or texts for real caches).

    ``fixed``: ``same`` (both at ``budget``: equal payload), ``b`` (``b``'s point at ``budget`` is
    kept and ``a`` is interpolated, log-linearly between two of its budgets, at the same unit's
    rate of ``b``) or ``a``. A rate outside the interpolated scheme's measured range (in any
    unit) is *not evaluated*: never extrapolated. The rates and the interpolated scheme's own
    budgets are in the details."""
    from . import stats
    from .frontier import equal_rate_pairs

    if t.frontier_units is None:
        raise MissingCell("no frontier table (config key frontier.schemes is empty)")
    metric = where.get("metric", "kl")
    fixed = where.get("fixed", "same")
    units = t.frontier_units
    rows = units[(units["distribution"] == where["distribution"]) & (units["dim"] == int(where["dim"]))
                 & np.isclose(units["sharpness"].to_numpy(dtype=float), float(where["sharpness"]))]
    if rows.empty:
        raise MissingCell(f"no frontier rows for {where['distribution']} d{where['dim']} s{where['sharpness']}")
    present = set(rows["scheme"].unique())
    for scheme in (where["a"], where["b"]):
        if scheme not in present:
            raise MissingCell(f"no frontier rows of scheme {scheme} in {where['distribution']} d{where['dim']}")
    pairs = equal_rate_pairs(rows, a=where["a"], b=where["b"], budget=int(where["budget"]), metric=metric,
                             fixed=fixed)
    if pairs.empty:
        raise MissingCell(f"no unit has both {where['a']} and {where['b']} at n = {where['budget']}")
    outside = pairs[pairs[["a", "b"]].isna().any(axis=1)]
    if len(outside):
        moving = where["a"] if fixed == "b" else where["b"]
        raise MissingCell(f"the fixed point's rate {outside['rate'].iloc[0]:.3f} bits/coordinate is outside "
                          f"{moving}'s measured rates (no extrapolation)")
    ci = stats.bootstrap_ratio_ci(pairs["a"].to_numpy(), pairs["b"].to_numpy(), statistic="mean",
                                  n_boot=t.n_boot, base_seed=t.base_seed, paired=True, undefined="nan",
                                  identity=("claims", "equal_rate", where["a"], where["b"], where["distribution"],
                                            int(where["dim"]), int(where["budget"]), metric, fixed))
    test = stats.wilcoxon_paired(pairs["a"].to_numpy(), pairs["b"].to_numpy())
    return Measurement(float(ci["estimate"]), float(ci["low"]), float(ci["high"]),
                       details={"rate_bits": float(pairs["rate"].mean()), "mean_a": float(pairs["a"].mean()),
                                "mean_b": float(pairs["b"].mean()), "n_units": int(len(pairs)),
                                "n_trials": int(len(pairs)), "fixed": fixed, "metric": metric,
                                "wilcoxon_log10_p": float(test["log10_p"])},
                       interval=True)


def stat_equal_rate_cells(t: Tables, where: Mapping[str, Any]) -> Measurement:
    """In how many frontier cells is scheme ``a`` significantly better than ``b`` on ``metric``
    (default ``t_eps_dir``) at EQUAL TOTAL RATE: the every-cell comparison of ``cells_better``
    (``op: all``) repeated on the frontier's measured rates instead of the nominal budget.

    A cell is a (distribution, dim, budget) of the frontier's per-unit table at ``sharpness``
    (``distributions``, ``budgets``: optional filters; without ``distributions``, every
    synthetic distribution of the frontier, the real caches left to their own claims). Its
    budgets are the fixed scheme's among the grid's (:func:`kvasym.frontier.grid_points`): a
    point at a scheme's ``frontier.extra_budgets`` widens that scheme's measured rates where it
    is the one interpolated, and is no cell of its own unless the claim names it in
    ``budgets``. In each, :func:`kvasym.frontier.equal_rate_pairs` keeps the ``fixed`` scheme's
    point at the budget and interpolates the other to each unit's rate; the per-unit pairs get the
    two-sided paired Wilcoxon test, and the cells' tests are Holm-adjusted together
    (:func:`_decide_family`: the claim's own family). A cell whose rate lies outside the
    interpolated scheme's measured rates in some unit is left out, never extrapolated, and
    named in the details (``cells_not_evaluated``). Estimate: the fraction of the evaluated
    cells where ``a`` is significantly better."""
    from . import stats
    from .frontier import DISTORTIONS, equal_rate_pairs, grid_points

    if t.frontier_units is None:
        raise MissingCell("no frontier table (config key frontier.schemes is empty)")
    metric = where.get("metric", "t_eps_dir")
    higher_better = {source: higher for source, higher in DISTORTIONS.values()}
    fixed = where.get("fixed", "a")
    units = t.frontier_units
    units = units[np.isclose(units["sharpness"].to_numpy(dtype=float), float(where["sharpness"]))]
    if where.get("distributions") is not None:
        units = units[units["distribution"].isin(list(where["distributions"]))]
    else:  # the synthetic cells: real caches have other units (texts) and their own claims
        from .real.evaluate import REAL_DISTRIBUTIONS

        units = units[~units["distribution"].isin(list(REAL_DISTRIBUTIONS))]
    rows, skipped = [], []
    for (distribution, dim), cell in units.groupby(["distribution", "dim"], sort=True):
        if not {where["a"], where["b"]} <= set(cell["scheme"].unique()):
            continue
        anchor = where["a"] if fixed == "a" else where["b"]
        named = where.get("budgets")
        own = cell if named is not None else grid_points(cell)
        budgets = sorted(int(b) for b in own.loc[own["scheme"] == anchor, "budget"].unique())
        for budget in budgets:
            if named is not None and budget not in [int(b) for b in named]:
                continue
            key = (distribution, int(dim), budget, float(where["sharpness"]))
            pairs = equal_rate_pairs(cell, a=where["a"], b=where["b"], budget=budget, metric=metric, fixed=fixed)
            if pairs.empty or pairs[["a", "b"]].isna().any(axis=None):
                skipped.append(_cell_name(key))
                continue
            diff = float(pairs["a"].mean() - pairs["b"].mean())
            test = stats.wilcoxon_paired(pairs["a"].to_numpy(), pairs["b"].to_numpy())
            rows.append({"distribution": distribution, "dim": int(dim), "budget": budget,
                         "sharpness": float(where["sharpness"]), "a_minus_b": diff,
                         "a_better": diff > 0 if higher_better.get(metric) else diff < 0, "tied": diff == 0,
                         "log10_p": float(test["log10_p"]), "rate_bits": float(pairs["rate"].mean())})
    if not rows:
        raise MissingCell(f"no frontier cell has {where['a']} and {where['b']} at one measured rate (sharpness "
                          f"{where['sharpness']}; outside the measured rates: {', '.join(skipped) or 'none'})")
    frame = pd.DataFrame(rows).set_index(["distribution", "dim", "budget", "sharpness"]).sort_index()
    family = _decide_family({metric: frame}, float(where.get("alpha", 0.05)))
    a_sig, b_sig = frame["a_sig_better"].to_numpy(), frame["b_sig_better"].to_numpy()
    return Measurement(
        float(np.mean(a_sig)),
        details={"n_cells": int(len(frame)), "n_a_significantly_better": int(np.sum(a_sig)),
                 "n_b_significantly_better": int(np.sum(b_sig)),
                 "cells_where_b_better": [_cell_name(i) for i in frame.index[b_sig]],
                 "cells_not_evaluated": skipped, "metrics": [metric], "fixed": fixed,
                 "holm_family_size": family},
    )


def stat_seq_len_slope(t: Tables, where: Mapping[str, Any]) -> Measurement:
    """Slope of log (trial mean ``metric``, default ``kl``) on log sequence length for ``scheme``
    at ``budget``, with its trial-cluster bootstrap interval, from the sequence-length sweep
    (stage seq_len_sweep; :func:`kvasym.seqlen.length_slopes`). The second-order expansion of KL
    predicts 0 at fixed sharpness (:mod:`kvasym.seqlen`)."""
    if t.seq_len_slopes is None:
        raise MissingCell("no sequence-length sweep (config key seq_len_sweep.seq_lens is empty)")
    metric = where.get("metric", "kl")
    table = t.seq_len_slopes
    _known(metric, table["metric"].unique(), "sequence-length sweep metric")
    rows = table[(table["distribution"] == where["distribution"]) & (table["dim"] == int(where["dim"]))
                 & np.isclose(table["sharpness"].to_numpy(dtype=float), float(where["sharpness"]))
                 & (table["scheme"] == where["scheme"]) & (table["budget"] == int(where["budget"]))
                 & (table["metric"] == metric)]
    if rows.empty:
        raise MissingCell(f"no sequence-length slope of {where['scheme']} n = {where['budget']} {metric} at "
                          f"{where['distribution']} d{where['dim']} s{where['sharpness']}")
    row = rows.iloc[0]
    return Measurement(float(row["slope"]), float(row["low"]), float(row["high"]),
                       details={"metric": metric, "n_lengths": int(row["n_lengths"]),
                                "n_trials": int(row["n_trials"]), "min_seq_len": int(row["min_seq_len"]),
                                "max_seq_len": int(row["max_seq_len"])},
                       interval=True)


@dataclass(frozen=True)
class DecidingTest:
    """A test a claim's verdict can rest on (a claim's ``decided_by``; :data:`DECIDING_TESTS`).

    Attributes
    ----------
    name : str
        What a claim's ``decided_by`` says.
    words : str
        The ledger's words for it, beside the verdict (LaTeX-safe plain text).
    interval : bool
        It is an interval (the verdict compares the interval with the rule, ``Measurement.interval``);
        False: counts of significant cells or the estimate itself decide.
    meaning : str
        What it is, for the schema's and the docs' readers.
    """

    name: str
    words: str
    interval: bool
    meaning: str


#: Every test a verdict can rest on, by name: the values a claim's ``decided_by`` may take and
#: the defaults of the statistics (:attr:`Statistic.decided_by`).
DECIDING_TESTS: dict[str, DecidingTest] = {d.name: d for d in (
    DecidingTest("fieller", "Fieller CI", True,
                 "Fieller's interval of a ratio of means over the units (kvasym.stats.fieller_ratio_ci), paired or "
                 "Welch-type; unbounded when the denominator's mean is not significantly different from 0"),
    DecidingTest("t", "t CI", True, "Student's t interval of a mean over the units"),
    DecidingTest("bootstrap", "percentile bootstrap CI", True,
                 "percentile bootstrap interval, resampling the units (trials, texts, (text, draw) pairs) whole"),
    DecidingTest("fisher_z", "Fisher-z CI over cells", True,
                 "Fisher's z interval of a rank correlation with Bonett and Wright's variance, the cells as the "
                 "units (kvasym.stats.spearman_fisher_ci)"),
    DecidingTest("agresti_min", "Agresti-Min CI", True,
                 "Agresti and Min's interval of a difference of matched proportions"),
    DecidingTest("wilcoxon_holm", "Wilcoxon per cell, Holm", False,
                 "the paired Wilcoxon signed-rank test over the units in each cell, Holm-adjusted over the claim's "
                 "own cells; the verdict counts the significant cells"),
    DecidingTest("ratio_cis", "paired ratio CIs per group", False,
                 "a group counts when both paired ratio intervals (mean: Fieller; p99: percentile bootstrap) "
                 "exclude 1; the verdict compares the count"),
    DecidingTest("estimate", "estimate alone", False, "the estimate itself, without an interval"),
)}
#: The difference tests whose p a statistic's rows show (:attr:`Statistic.p_test`), by name: the
#: ledger's words. Such a p decides only where the rule bounds it (``max_log10_p``).
P_TESTS: dict[str, str] = {"wilcoxon": "Wilcoxon", "mcnemar": "McNemar"}


@dataclass(frozen=True)
class Statistic:
    """One statistic a claim can name: everything the pipeline knows about it, in one record.

    Adding a statistic is its function plus one record in :data:`STATISTICS`: the claims file's
    schema takes its name from there (:func:`claims_schema`), the README's claims map its
    tables and upstream rules (:func:`kvasym.render.claims.claims_map_markdown`), the ledger its
    words (:func:`kvasym.render.ledger.test_and_unit`) and the verdict's reason its query-model
    note (:func:`query_model_note`).

    Attributes
    ----------
    name : str
        What a claim's ``statistic`` says.
    function : callable
        ``(tables, where) -> Measurement``; raises :class:`kvasym.cells.MissingCell` for a cell
        absent from the grid, :class:`KvasymError` for a ``where`` no grid can satisfy.
    tables : tuple of str
        The gathered tables it reads: fields of :class:`Tables`, keys of
        :data:`kvasym.render.claims.TABLE_SOURCES`.
    describe : str
        The ledger's "test and unit" words, a template filled by
        :func:`kvasym.render.ledger.test_and_unit`: ``{unit}`` (trials or texts), ``{paired}``,
        ``{metric}`` (the metric's words), ``{check}`` and ``{check_interval}`` (a theory check's
        words and interval). LaTeX-safe text apart from the placeholders.
    rows : str
        Which distributions' rows it reads, for the query-model note of a verdict: ``"cell"``
        (the comparisons' cell of ``where.distribution``), ``"cells"`` (the comparisons' cells
        of ``where.distributions``, every one when absent), ``"num_den"`` (the per-trial rows of
        ``where.num`` and ``where.den``, where query-model variants live) or ``""`` (no note).
    closed_form : bool
        Its details carry a closed form (``theory``), which ``holds_if: {op: within}`` without a
        ``target`` compares with.
    measured_by : str or None
        The README claims map's "measured by" cell (Markdown) when its data do not come from
        the metrics rules of the rows it reads (``cells``, ``real_metrics``).
    decided_by : str or callable
        The test its verdicts rest on, a key of :data:`DECIDING_TESTS` (default ``estimate``),
        or ``(where) -> key`` when it depends on the claim (``theory``: the check's interval
        method). The default of a claim's ``decided_by`` (:meth:`deciding`).
    p_test : str or None
        The difference test whose p its rows carry (``Measurement.log10_p``), a key of
        :data:`P_TESTS`, or None; that p decides only under a rule's ``max_log10_p``.
    """

    name: str
    function: Callable[[Tables, Mapping[str, Any]], Measurement]
    tables: tuple[str, ...]
    describe: str
    rows: str = ""
    closed_form: bool = False
    measured_by: str | None = None
    decided_by: str | Callable[[Mapping[str, Any]], str] = "estimate"
    p_test: str | None = None

    @property
    def per_cell(self) -> bool:
        """It reads cells of the comparisons or summary tables, whose low-rank cells all follow
        the subspace rule (query-model variants have per-trial rows only)."""
        return self.rows in ("cell", "cells")

    def deciding(self, where: Mapping[str, Any]) -> str:
        """The key of :data:`DECIDING_TESTS` that decides this statistic's claims at ``where``.

        Raises
        ------
        KvasymError
            If the record names no known test (a registry error).
        """
        name = self.decided_by(where) if callable(self.decided_by) else self.decided_by
        if name not in DECIDING_TESTS:
            raise KvasymError(f"statistic {self.name}: decided_by {name!r} is not a test; known: "
                              f"{', '.join(DECIDING_TESTS)}")
        return name


def _theory_decided_by(where: Mapping[str, Any]) -> str:
    """A theory row's interval method (:data:`kvasym.theory.THEORY_CHECK_WORDS`, the one source
    of the theory table's and the ledger's words): Fieller for the variance ratios, the percentile
    cluster bootstrap for the KS distances and the Jensen slopes."""
    from .theory import THEORY_CHECK_WORDS

    check = str(where.get("check", ""))
    if check not in THEORY_CHECK_WORDS:
        raise KvasymError(f"theory check {check!r} does not exist; known: {', '.join(THEORY_CHECK_WORDS)}")
    return THEORY_CHECK_WORDS[check][1].lower()


_ON_CELLS = "paired Wilcoxon per cell over {unit}; Holm over the claim's cells"
_E2E = "`e2e` (per model and text, the model with its KV cache quantized)"

#: Every statistic a claim can name, by name: the one registry (see :class:`Statistic`).
STATISTICS: dict[str, Statistic] = {s.name: s for s in (
    Statistic("seq_len_slope", stat_seq_len_slope, ("seq_len_slopes",),
              "slope of log mean KL on log sequence length, bootstrap CI over trials",
              measured_by="`seq_len_sweep` (its own data, one job)", decided_by="bootstrap"),
    Statistic("equal_rate_ratio", stat_equal_rate_ratio, ("frontier_units",),
              "{metric} ratio at equal total bits (interpolated), Fieller CI over {unit}", decided_by="fieller"),
    Statistic("equal_rate_cells", stat_equal_rate_cells, ("frontier_units",),
              "paired Wilcoxon per cell at equal total bits (interpolated) over {unit}; Holm over the claim's cells",
              decided_by="wilcoxon_holm"),
    Statistic("kl_ratio", stat_kl_ratio, ("comparisons",),
              "mean-KL ratio, Fieller CI; paired Wilcoxon over {unit}", rows="cell", closed_form=True,
              # the comparisons table's mean ratio has Fieller's interval, its p99 ratio a
              # percentile bootstrap one (kvasym.stats.bootstrap_ratio_ci, method auto)
              decided_by=lambda where: "bootstrap" if where.get("which", "mean") == "p99" else "fieller",
              p_test="wilcoxon"),
    Statistic("cells_better", stat_cells_better, ("comparisons",), _ON_CELLS, rows="cells",
              decided_by="wilcoxon_holm"),
    Statistic("crossover", stat_crossover, ("comparisons",), _ON_CELLS, rows="cells", decided_by="wilcoxon_holm"),
    Statistic("distribution_ratio", stat_distribution_ratio, ("trials", "theory"),
              "ratio of means, {paired} Fieller CI over {unit}", rows="num_den", decided_by="fieller"),
    Statistic("theory", stat_theory, ("theory",), "{check}; {check_interval} CI over trials", closed_form=True,
              measured_by="`theory` (data manifests, per-key metrics)", decided_by=_theory_decided_by),
    Statistic("ranking_disagreement", stat_ranking_disagreement, ("summary", "comparisons"),
              "count of groups; paired ratio CIs (mean, p99) over trials", rows="cells", decided_by="ratio_cis"),
    Statistic("catastrophic_share", stat_catastrophic_share, ("trials", "summary"),
              "share of catastrophic queries, t CI over {unit}", decided_by="t"),
    Statistic("e2e_ratio", stat_e2e_ratio, ("e2e_comparisons",),
              "perplexity ratio at equal n, t CI over (text, draw) units; Wilcoxon over units", measured_by=_E2E,
              decided_by="t", p_test="wilcoxon"),
    Statistic("e2e_equal_bits", stat_e2e_equal_bits, ("e2e_equal_bits",),
              "perplexity (or KL) ratio at equal total bits (interpolated), t CI over (text, draw) units; "
              "Wilcoxon over units",
              measured_by=_E2E, decided_by="t", p_test="wilcoxon"),
    Statistic("e2e_context_growth", stat_e2e_context_growth, ("e2e_long_summary",),
              "late-over-early damage ratio in long windows, t CI over windows",
              measured_by="`e2e_long` (windows of the pydoc topics), `e2e_stats`", decided_by="t"),
    Statistic("passkey_difference", stat_passkey_difference, ("passkey_summary",),
              "accuracy difference against full precision, Agresti-Min CI; McNemar's exact test over trials",
              measured_by="`passkey` (SmolLM2 retrieval trials), `e2e_stats`", decided_by="agresti_min",
              p_test="mcnemar"),
    Statistic("e2e_allocation", stat_e2e_allocation, ("card_comparisons",),
              "KL (or perplexity) ratio of the measured allocation over the uniform map at its rate, t CI over "
              "(text, draw) units; Wilcoxon over units",
              measured_by="`sensitivity` (calibration texts), `card` (the allocation end to end)", decided_by="t",
              p_test="wilcoxon"),
    Statistic("e2e_rank_agreement", stat_e2e_rank_agreement, ("e2e_agreement",),
              "Spearman rank correlation over the (scheme, budget) cells; Fisher-z CI over cells",
              measured_by=f"{_E2E}; `real_metrics` via `gather`", decided_by="fisher_z"),
)}
OPS = {">=": np.greater_equal, ">": np.greater, "<=": np.less_equal, "<": np.less}


def interval_words(low: float, high: float) -> str:
    """An interval as a verdict's reason prints it: ``[0.5, 0.9]`` to 4 significant figures,
    ``unbounded`` when both ends are infinite (never ``[-inf, inf]``), ``[0.5, unbounded)`` or
    ``(unbounded, 0.9]`` when one is."""
    if math.isinf(low) and math.isinf(high):
        return "unbounded"
    left = "(unbounded" if math.isinf(low) else f"[{low:.4g}"
    right = "unbounded)" if math.isinf(high) else f"{high:.4g}]"
    return f"{left}, {right}"


def _unbounded_reason(m: Measurement, decided_by: str | None) -> str:
    """Why an interval that is unbounded on both sides cannot decide, and what it rests on."""
    units = m.details.get("n_units", m.details.get("n_trials", m.details.get("n")))
    over = f" over its {int(units)} units" if isinstance(units, (int, float)) and math.isfinite(units) else ""
    if decided_by in (None, "fieller"):
        return ("Fieller CI unbounded (its 95% confidence set is the whole line or two rays: the denominator's mean "
                f"is not significantly different from 0{over}): it cannot decide")
    words = DECIDING_TESTS[decided_by].words if decided_by in DECIDING_TESTS else str(decided_by)
    return f"{words} unbounded (both ends infinite{over}): it cannot decide"


def verdict(m: Measurement, rule: Mapping[str, Any], decided_by: str | None = None) -> tuple[str, str]:
    """(verdict, reason) of a measurement under a ``holds_if`` rule.

    Parameters
    ----------
    m : Measurement
        The statistic's estimate, interval and p.
    rule : Mapping
        The claim's ``holds_if``.
    decided_by : str, optional
        The test the interval comes from (a key of :data:`DECIDING_TESTS`), for the reason's
        words when the interval cannot decide (e.g. Fieller's unbounded set); it changes no
        verdict.

    Returns
    -------
    tuple of str
        The verdict (one of :data:`VERDICTS` but *not evaluated*) and its reason.
    """
    op = rule["op"]
    if op == "all":
        n, a, b = m.details["n_cells"], m.details["n_a_significantly_better"], m.details["n_b_significantly_better"]
        skipped = list(m.details.get("cells_not_evaluated", []))
        left_out = (f"; {len(skipped)} cells not evaluated (rate outside the measured rates): "
                    + ", ".join(skipped[:4]) + (f" and {len(skipped) - 4} more" if len(skipped) > 4 else "")
                    if skipped else "")
        if a == n:
            return HOLDS, f"significantly better in all {n} cells" + left_out
        if b > 0:
            named = list(m.details.get("cells_where_b_better", []))
            shown = ", ".join(named[:6]) + (f" and {len(named) - 6} more" if len(named) > 6 else "")
            return FAILS, f"significantly worse in {b} of {n} cells" + (f": {shown}" if shown else "") + left_out
        return INCONCLUSIVE, f"significantly better in {a} of {n} cells, never significantly worse" + left_out
    compare = OPS.get(op)
    value = float(rule["value"])
    has_ci = not (math.isnan(m.low) or math.isnan(m.high))
    if m.interval and math.isnan(m.estimate):
        return INCONCLUSIVE, ("the estimate is undefined (a ratio over a statistic that is 0, or a slope over "
                              f"points without spread: n = {m.details.get('n', '?')}): it cannot decide")
    if m.interval and not has_ci:
        return INCONCLUSIVE, (f"estimate {m.estimate:.4g} has no interval (a bootstrap replicate had a zero "
                              "denominator, or there is a single trial): it cannot decide")
    if m.interval and m.low == m.high:
        return INCONCLUSIVE, (f"zero-width interval [{m.low:.4g}, {m.high:.4g}] (every bootstrap replicate equal, "
                              f"e.g. one trial: n = {m.details.get('n_trials', m.details.get('n', '?'))}): it cannot "
                              "decide")
    if m.interval and math.isinf(m.low) and math.isinf(m.high):
        # an unbounded set lies wholly on neither side of any threshold nor inside any margin:
        # the comparisons below would say inconclusive too; this says so, and why, in words
        return INCONCLUSIVE, _unbounded_reason(m, decided_by)
    if op == "within":
        return _within_closed_form(m, value, has_ci, rule.get("target"))
    if has_ci:
        inside = compare(m.low, value) and compare(m.high, value)
        outside = not compare(m.low, value) and not compare(m.high, value)
        result = HOLDS if inside else FAILS if outside else INCONCLUSIVE
        reason = f"CI {interval_words(m.low, m.high)} vs {op} {value:g}"
    else:
        result = HOLDS if compare(m.estimate, value) else FAILS
        reason = f"estimate {m.estimate:.4g} vs {op} {value:g}"
    if "max_log10_p" in rule:
        limit = float(rule["max_log10_p"])
        floor = m.details.get("min_attainable_log10_p")
        if floor is not None and math.isfinite(float(floor)) and float(floor) > limit and result != FAILS:
            # no data could meet the rule on this design: not a refutation, not support
            units = m.details.get("n_units", m.details.get("n_trials", "?"))
            return INCONCLUSIVE, (reason + f"; p <= 1e{limit:g} is unreachable here: the smallest p the per-unit "
                                  f"test can give with {units} units is 1e{float(floor):.1f} "
                                  f"(log10 p = {m.log10_p:.1f})")
        if not m.log10_p <= limit:
            result = FAILS if result != INCONCLUSIVE else INCONCLUSIVE
            reason += f"; log10 p = {m.log10_p:.1f} is not <= {limit:g}"
        else:
            reason += f"; log10 p = {m.log10_p:.1f} <= {limit:g}"
    return result, reason


def _within_closed_form(m: Measurement, margin: float, has_ci: bool, target: Any = None) -> tuple[str, str]:
    """The ``within`` rule: the interval (or, without one, the estimate) against ``theta``
    plus or minus ``margin`` of it; ``theta`` is the rule's declared ``target`` (e.g. the paper's
    number) or else the closed form (``m.details["theory"]``)."""
    if target is not None:
        theta, name = float(target), "target"
    else:
        theta, name = float(m.details.get("theory", math.nan)), "closed form"
    if not math.isfinite(theta) or theta == 0:
        return INCONCLUSIVE, "no closed form to compare with (the theory column is empty or 0)"
    low_bound, high_bound = sorted((theta * (1 - margin), theta * (1 + margin)))
    band = f"{name} {theta:.4g} +- {100 * margin:g}% = [{low_bound:.4g}, {high_bound:.4g}]"
    if not has_ci:
        inside = low_bound <= m.estimate <= high_bound
        return (HOLDS if inside else FAILS), f"estimate {m.estimate:.4g} vs {band}"
    if low_bound <= m.low and m.high <= high_bound:
        result = HOLDS
    elif m.high < low_bound or m.low > high_bound:
        result = FAILS
    else:
        result = INCONCLUSIVE
    return result, f"CI {interval_words(m.low, m.high)} vs {band}"


#: The claims file's schema in the repository (:func:`claims_schema`).
CLAIMS_SCHEMA_RELPATH = Path("workflow/schemas/claims.schema.yaml")
#: The headline cell's keys: set by the config's ``headline`` (:attr:`kvasym.study.Study.headline`),
#: never by a claims file's ``defaults`` (the schema refuses them there), so claims, tables and
#: figures share one headline.
HEADLINE_WHERE_KEYS = ("distribution", "dim", "sharpness")


def claims_schema() -> dict[str, Any]:
    """The claims file's JSON Schema (``workflow/schemas/claims.schema.yaml``) with the names of
    :data:`STATISTICS` filled in: the file names no statistic, so the registry stays the one list.

    Returns
    -------
    dict
        The schema (a copy), its ``$defs.statistic.enum`` every registered statistic, its
        ``$defs.closed_form_statistic.enum`` those with a closed form and its
        ``$defs.deciding_test.enum`` the tests of :data:`DECIDING_TESTS`.
    """
    schema = load_schema(CLAIMS_SCHEMA_RELPATH)
    defs = schema["$defs"]
    defs["statistic"]["enum"] = sorted(STATISTICS)
    defs["closed_form_statistic"]["enum"] = sorted(name for name, s in STATISTICS.items() if s.closed_form)
    defs["deciding_test"]["enum"] = list(DECIDING_TESTS)
    return schema


def deciding_test(claim: Mapping[str, Any]) -> str:
    """The test that decides ``claim``: its ``decided_by`` if it declares one, else its
    statistic's default at its ``where`` (:meth:`Statistic.deciding`).

    Parameters
    ----------
    claim : Mapping
        A claim (``statistic``, ``where``, optional ``decided_by``), as loaded or evaluated.

    Returns
    -------
    str
        A key of :data:`DECIDING_TESTS`.

    Raises
    ------
    KvasymError
        One line naming the claim and the key: an unknown test, a statistic that does not
        exist, or a declared test other than the one the statistic decides on (``decided_by``
        declares what decides; it cannot choose another test).
    """
    cid, name = claim.get("id", "?"), claim.get("statistic")
    statistic = STATISTICS.get(str(name))
    if statistic is None:
        raise KvasymError(f"claim {cid}: key statistic: {name!r} does not exist; known: "
                          f"{', '.join(sorted(STATISTICS))}")
    declared = claim.get("decided_by")
    if declared is not None and declared not in DECIDING_TESTS:
        raise KvasymError(f"claim {cid}: key decided_by: must be one of {', '.join(DECIDING_TESTS)}, got {declared!r}")
    try:
        default = statistic.deciding(claim.get("where") or {})
    except KvasymError as exc:
        raise KvasymError(f"claim {cid}: key decided_by: {exc}") from None
    if declared is not None and declared != default:
        raise KvasymError(f"claim {cid}: key decided_by: {name} decides on {default} "
                          f"({DECIDING_TESTS[default].words}) here, not {declared}: decided_by declares the test "
                          "that decides, it cannot choose another")
    return default


def decided_by_words(claim: Mapping[str, Any], latex: bool = False) -> str:
    """What the ledger prints beside a verdict: the test it rests on, and the row's difference
    test named as deciding or not, the same words for every row of a statistic.

    ``t CI; Wilcoxon p not in the rule`` (an end-to-end ratio: its row shows a Wilcoxon p, the
    t interval alone decides), ``Fieller CI and Wilcoxon p`` (a rule with ``max_log10_p``),
    ``Wilcoxon per cell, Holm`` (a claim over cells), ``percentile bootstrap CI``.

    Parameters
    ----------
    claim : Mapping
        An evaluated claim (its ``decided_by``) or a loaded one (the statistic's default).
    latex : bool, optional
        Typeset ``p`` in math mode (the LaTeX ledger); the rest is LaTeX-safe as it is.

    Returns
    -------
    str
        The words; "" for a claim naming no registered statistic.
    """
    statistic = STATISTICS.get(str(claim.get("statistic")))
    if statistic is None:
        return ""
    name = claim.get("decided_by") or deciding_test(claim)
    words = DECIDING_TESTS[name].words
    p_test = P_TESTS.get(statistic.p_test or "")
    if p_test is None:
        return words
    p = "$p$" if latex else "p"
    if "max_log10_p" in (claim.get("holds_if") or {}):
        return f"{words} and {p_test} {p}"
    return f"{words}; {p_test} {p} not in the rule"


def load_claims(path: str | os.PathLike, headline: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Read and check a claims file; every error is one line naming the file, the claim and the key.

    The file's shape is :func:`claims_schema`'s: ids, required keys, types, the registered
    statistics, the ``holds_if`` rules, the ``where`` keys and ``construction``. What a schema
    cannot say, that no two claims share an id, is checked here.

    Parameters
    ----------
    path : str or os.PathLike
        The claims file (YAML).
    headline : Mapping, optional
        The study's headline cell (:attr:`~kvasym.study.Study.headline`).

    Returns
    -------
    list of dict
        The claims in the file's order. Each claim's ``where`` is the headline cell's
        distribution, dim and sharpness, then the file's ``defaults``, then the claim's own
        ``where``: later ones win.
    """
    base = {key: headline[key] for key in HEADLINE_WHERE_KEYS if headline and key in headline}
    claims: list[dict[str, Any]] = []
    first: dict[str, str] = {}  # claim id -> where it was declared
    for file, data in _claims_chain(path):
        for i, claim in enumerate(data["claims"]):
            if claim["id"] in first:
                raise KvasymError(f"{file}: claims[{i}]: duplicated claim id {claim['id']} ({first[claim['id']]} "
                                  "has it: the two would define the same LaTeX macros)")
            first[claim["id"]] = f"{file}: claims[{i}]" if file != path else f"claims[{i}]"
        defaults = data.get("defaults") or {}
        mine = [{**claim, "where": {**base, **defaults, **(claim.get("where") or {})}} for claim in data["claims"]]
        for claim in mine:
            if claim.get("decided_by") is not None:
                # a declared test must be the one its statistic decides on (deciding_test)
                try:
                    deciding_test(claim)
                except KvasymError as exc:
                    raise KvasymError(f"{file}: {exc}") from None
        claims.extend(mine)
    return claims


def claims_files(path: str | os.PathLike) -> list[str]:
    """The claims files ``path`` reads, the one it extends first (key ``extends``, followed to the
    first file that extends none), ``path`` last; each checked as :func:`load_claims` checks it."""
    return [str(file) for file, _ in _claims_chain(path)]


def _claims_chain(path: str | os.PathLike) -> list[tuple[str | os.PathLike, dict[str, Any]]]:
    """``(file, data)`` of ``path`` and the files it extends, the first-extended first; each file
    checked against :func:`claims_schema` (one line naming the file, the claim and the key), a
    missing or circular ``extends`` refused naming the key."""
    from .config_io import read_yaml_mapping

    chain: list[tuple[str | os.PathLike, dict[str, Any]]] = []
    seen: list[str] = []
    file: str | os.PathLike | None = path
    while file is not None:
        resolved = os.path.realpath(file)
        if resolved in seen:
            raise KvasymError(f"{chain[-1][0]}: key extends: {file} is already in the chain (a claims file cannot "
                              "extend itself through others)")
        seen.append(resolved)
        if chain and not os.path.isfile(file):
            raise KvasymError(f"{chain[-1][0]}: key extends: {file}: no such file")
        try:
            data = read_yaml_mapping(file)
        except KvasymError as exc:
            raise KvasymError(f"{exc} (extended by {chain[-1][0]})" if chain else str(exc)) from None
        error = first_error(data, claims_schema())
        if error is not None:
            parts = list(error.absolute_path)
            claim = data["claims"][parts[1]] if len(parts) > 1 and parts[0] == "claims" else None
            named = f"claim {claim['id']}: " if isinstance(claim, Mapping) and "id" in claim else ""
            by = f" (extended by {chain[-1][0]})" if chain else ""
            raise KvasymError(f"{file}{by}: {named}{format_error(error, noun='key', whole='the claims file')}")
        chain.append((file, data))
        extends = data.get("extends")
        file = os.path.join(os.path.dirname(str(file)), extends) if extends is not None else None
    return chain[::-1]


def query_model_note(claim: Mapping[str, Any], tables: Tables) -> str:
    """The query model behind a verdict that reads low-rank data, for the ledger's reason (issue
    14: C5 is decided by the query rule), or "" when the claim reads no low-rank cell.

    ``distribution_ratio``: its ``num`` and ``den`` (a variant named by its model, another
    low-rank distribution by the subspace rule); claims over cells of the comparisons or summary
    tables: "subspace" when their cells include low-rank ones (variants are not there)."""
    where = claim["where"]
    record = STATISTICS.get(claim["statistic"])
    rows = record.rows if record is not None else ""
    subspace = "subspace (in the keys' subspace, a = d/r)"
    if rows == "num_den":
        parts = []
        kinds = (dict(zip(tables.trials["distribution"], tables.trials["kind"]))
                 if {"distribution", "kind"} <= set(tables.trials.columns) else {})
        for role in ("num", "den"):
            name = where.get(role)
            if name in tables.query_variants:
                parts.append(f"{name}: {tables.query_variants[name]['query']}")
            elif kinds.get(name) == "low_rank":
                parts.append(f"{name}: {subspace}")
        return f"query model {'; '.join(parts)}" if parts else ""
    if record is None or not record.per_cell:
        return ""
    frame = tables.comparisons
    if not {"distribution", "kind"} <= set(frame.columns):
        return ""
    cells = frame
    if rows == "cell":
        cells = frame[frame["distribution"] == where.get("distribution")]
    elif where.get("distributions") is not None:
        cells = frame[frame["distribution"].isin(list(where["distributions"]))]
    return f"low-rank cells: query model {subspace}" if (cells["kind"] == "low_rank").any() else ""


def evaluate_claims(claims: list[dict[str, Any]], tables: Tables) -> list[dict[str, Any]]:
    results = []
    for claim in claims:
        record = {k: claim.get(k) for k in ("id", "statement", "paper_value", "paper_text", "statistic")}
        record["where"] = claim["where"]
        record["holds_if"] = claim["holds_if"]
        statistic = STATISTICS.get(claim["statistic"])
        if statistic is None:  # load_claims refuses it; a claim built in code may still name one
            raise KvasymError(f"claim {claim['id']}: statistic {claim['statistic']!r} does not exist; known: "
                              f"{', '.join(sorted(STATISTICS))}")
        try:
            m = statistic.function(tables, claim["where"])
        except MissingCell as exc:
            record.update(decided_by=deciding_test(claim), verdict=NOT_EVALUATED, reason=f"not in this grid: {exc}")
            results.append(record)
            continue
        except KeyError as exc:
            raise KvasymError(f"claim {claim['id']}: 'where' lacks the key {exc} that "
                              f"{claim['statistic']} needs") from None
        except KvasymError as exc:
            raise KvasymError(f"claim {claim['id']} ({claim['statistic']}): {exc}") from None
        decided_by = deciding_test(claim)
        if DECIDING_TESTS[decided_by].interval != m.interval:
            # the declaration must say what the verdict below reads: an interval, or counts / the estimate
            raise KvasymError(f"claim {claim['id']}: key decided_by: {decided_by} "
                              f"({DECIDING_TESTS[decided_by].words}) but statistic {claim['statistic']} returned "
                              f"{'an interval' if m.interval else 'no interval'} (a registry error)")
        record["decided_by"] = decided_by
        result, reason = verdict(m, claim["holds_if"], decided_by)
        construction = claim.get("construction")
        if construction:
            # the outcome theory predicts, met by the data: not evidence about the paper's claim
            if result == construction["verdict"]:
                result, reason = BY_CONSTRUCTION, (f"{construction['why']} (follows from {construction['from']}); "
                                                   f"measured: {reason}")
            else:
                reason += f"; contrary to the construction argument from {construction['from']}"
        note = query_model_note(claim, tables)
        if note:
            reason += f"; {note}"
        record.update(estimate=m.estimate, low=m.low, high=m.high, log10_p=m.log10_p, details=m.details,
                      verdict=result, reason=reason)
        results.append(record)
    return results


def json_safe(value: Any) -> Any:
    """``value`` with NaN floats as None and numpy scalars as Python numbers, recursively (the
    ledger's JSON: NaN is not JSON; infinities are kept as JSON readers spell them)."""
    if isinstance(value, float):
        return None if math.isnan(value) else value
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    if isinstance(value, (np.floating, np.integer)):
        return json_safe(value.item())
    return value
