"""The passkey grid: every (length, depth, trial) under several cache passes, and its summary.

The grid
    For each length ``L``, depth ``d`` and trial ``t`` one passkey prompt is built
    (:func:`kvasym.real.passkey.make_trial`, identity ``(L, d, t)``) and read by every pass: the
    full-precision model (the pass named :data:`FP_PASS`, quantization None) and each quantized
    cache (:class:`~kvasym.real.endtoend.CacheQuantization`). A pass scores the trial from one
    teacher-forced pass (:func:`kvasym.real.passkey.run_trial`): correct iff greedy decoding
    returns all five digits.

Seeds of a quantized pass
    Each trial's quantization is the pass's with ``text = "passkey/{L}/{d!r}/{t}"``, so its
    rotations and sketches (seeded by ``(base seed, text, layer, KV head, side)``) are drawn
    afresh for every trial. The trials are the units of McNemar's test; with one draw shared by
    all trials, every trial would see the same random maps, the trials would be one sample of
    the draw, and the test would speak about that draw rather than about the scheme.

The summary
    Per (pass, length, depth) and per (pass, length) over every depth: accuracy, its
    Clopper-Pearson interval [1]_ (:func:`kvasym.stats.clopper_pearson`), and for every pass but
    :data:`FP_PASS` McNemar's exact test [2]_ (:func:`kvasym.stats.mcnemar_exact`) against the
    full-precision pass on the same trials. ``baseline_can_do`` says whether the full-precision
    model itself reaches the declared accuracy there: where it does not (SmolLM2-135M at 8K
    tokens with the key at depth 0), a quantized pass cannot lose much and its accuracy says
    little about the cache.

References
----------
.. [1] Clopper, C. J., Pearson, E. S. (1934) "The use of confidence or fiducial limits
   illustrated in the case of the binomial", Biometrika 26(4):404-413.
.. [2] McNemar, Q. (1947) "Note on the sampling error of the difference between correlated
   proportions or percentages", Psychometrika 12(2):153-157.
.. [3] Mohtashami, A., Jaggi, M. (2023) "Landmark Attention: Random-Access Infinite Context
   Length for Transformers", arXiv:2305.16300 (the passkey task).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..errors import KvasymError
from ..stats import clopper_pearson, mcnemar_exact
from .endtoend import CacheQuantization
from .passkey import PasskeyTrial, make_trial, run_trial

__all__ = ["FP_PASS", "GRID_COLUMNS", "NO_BUDGET", "paired_difference_interval", "run_grid", "summarize_grid",
           "trial_text"]

#: The name of the full-precision pass (quantization None), the baseline of every comparison.
FP_PASS = "fp"
#: ``budget`` of the full-precision pass's rows.
NO_BUDGET = -1
#: The columns of :func:`run_grid`'s frame, in order.
GRID_COLUMNS = ("pass", "scheme", "budget", "length", "depth", "trial", "key", "correct", "n_correct_prefix",
                "key_position", "cpu_s")
_TRIAL_KEYS = ["length", "depth", "trial"]


def trial_text(length: int, depth: float, trial: int) -> str:
    """The text identity of a trial's quantization seeds: ``f"passkey/{length}/{depth!r}/{trial}"``.

    Parameters
    ----------
    length, depth, trial : int, float, int
        The trial's identity (depth as a float, so 0 and 0.0 name the same trial).

    Returns
    -------
    str
        E.g. ``"passkey/1024/0.5/3"``.
    """
    return f"passkey/{int(length)}/{float(depth)!r}/{int(trial)}"


def _check_passes(passes: Mapping[str, CacheQuantization | None]) -> None:
    if not isinstance(passes, Mapping) or not passes:
        raise KvasymError(f"passkey grid: passes must be a non-empty mapping name -> CacheQuantization | None, "
                          f"got {passes!r}")
    for name, quant in passes.items():
        if not isinstance(name, str) or not name:
            raise KvasymError(f"passkey grid: a pass name must be a non-empty string, got {name!r}")
        if quant is None and name != FP_PASS:
            raise KvasymError(f"passkey grid: pass {name!r} has no quantization; the full-precision pass must be "
                              f"named {FP_PASS!r}")
        if name == FP_PASS and quant is not None:
            raise KvasymError(f"passkey grid: pass {FP_PASS!r} is the full-precision pass, its quantization must be "
                              f"None, got {quant!r}")
        if quant is not None and not isinstance(quant, CacheQuantization):
            raise KvasymError(f"passkey grid: pass {name!r} must map to a CacheQuantization or None, got {quant!r}")


def _check_axis(values: Sequence[Any], name: str) -> list[Any]:
    values = list(values)
    if not values:
        raise KvasymError(f"passkey grid: {name} is empty (the grid would have no trials)")
    if len(set(values)) != len(values):
        raise KvasymError(f"passkey grid: {name} has repeated values {values!r} (each trial must be run once)")
    return values


def _build_trials(model: Any, lengths: Sequence[int], depths: Sequence[float], trials: int,
                  base_seed: int) -> list[PasskeyTrial]:
    """Every trial's prompt, built before any pass runs, so bad input is refused before any cost."""
    lengths = _check_axis(lengths, "lengths")
    depths = _check_axis([float(d) if isinstance(d, (int, float, np.number)) and not isinstance(d, bool) else d
                          for d in depths], "depths")
    if isinstance(trials, bool) or not isinstance(trials, (int, np.integer)) or trials < 1:
        raise KvasymError(f"passkey grid: trials must be an integer >= 1 (trials per length and depth), "
                          f"got {trials!r}")
    for depth in depths:
        if not isinstance(depth, float) or not 0.0 <= depth <= 1.0:
            raise KvasymError(f"passkey grid: depth {depth!r} is not a number in [0, 1] (the key's relative depth in "
                              f"the filler)")
    limit = int(model.config.context_length)
    for length in lengths:
        if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or not 0 < length <= limit:
            raise KvasymError(f"passkey grid: length {length!r} is not an integer in 1..{limit} (the model's "
                              f"context, GGUF key llama.context_length)")
    return [make_trial(model, int(length), depth, t, base_seed=base_seed)
            for length in lengths for depth in depths for t in range(int(trials))]


def run_grid(model: Any, lengths: Sequence[int], depths: Sequence[float], trials: int,
             passes: Mapping[str, CacheQuantization | None], *, base_seed: int,
             part: Sequence[int] = (0, 1), workers: int = 1) -> pd.DataFrame:
    """Run every passkey trial of a grid under every pass.

    Parameters
    ----------
    model : GGUFLlama
        The model.
    lengths : sequence of int
        Trial lengths in tokens (prompt and answer), each at most ``model.config.context_length``.
    depths : sequence of float
        Relative depths of the key in the filler, each in [0, 1].
    trials : int
        Trials per (length, depth), numbered ``0..trials - 1``.
    passes : mapping of str to CacheQuantization or None
        Pass name to the cache it reads; the full-precision pass must be named :data:`FP_PASS`
        (None). Each trial reads ``dataclasses.replace(quant, text=trial_text(L, d, t))``: its
        own draw of rotations and sketches (the trials are the units of McNemar's test; one
        shared draw would make them one sample of that draw). The other fields, the base seed
        included, are the pass's.
    base_seed : int
        The study's base seed (the pass keys, :func:`kvasym.real.passkey.passkey_number`).
    part : pair of int
        ``(p, P)``: run trials ``p, p + P, ...`` of the grid's (length, depth, trial) order only
        (:func:`kvasym.real.jobparts.select_round_robin`); a trial's rows depend on its identity
        only, so the parts' rows joined (:func:`kvasym.real.jobparts.join_by_units` on
        ``length, depth, trial``) are the whole grid's row for row. Default ``(0, 1)``: every
        trial.
    workers : int
        Processes the trials run on (:func:`kvasym.workers.map_ordered`); the rows do not depend
        on it (``cpu_s`` apart, a measurement).

    Returns
    -------
    pandas.DataFrame
        One row per (pass, length, depth, trial), columns :data:`GRID_COLUMNS`: ``scheme``
        (``"fp"`` for :data:`FP_PASS`), ``budget`` (:data:`NO_BUDGET` for it), ``key``, ``correct``
        (int8), ``n_correct_prefix``, ``key_position`` (index of the key sentence's first token)
        and ``cpu_s`` (``time.process_time`` of that trial's pass, seconds: every thread of the
        process, BLAS included). Rows are in (length, depth, trial, pass) order; each trial's
        prompt is built once and read by every pass.

    Raises
    ------
    KvasymError
        If the passes, lengths, depths or trial count are empty or invalid (the message names
        the value), before any pass runs.
    """
    from ..workers import map_ordered
    from .jobparts import select_round_robin

    _check_passes(passes)
    grid = _build_trials(model, lengths, depths, trials, base_seed)

    def trial_rows(trial: Any) -> list[dict[str, Any]]:
        rows = []
        for name, quant in passes.items():
            if quant is not None:
                quant = dataclasses.replace(quant, text=trial_text(trial.length, trial.depth, trial.trial))
            start = time.process_time()
            score = run_trial(model, trial, quant)
            cpu_s = time.process_time() - start
            rows.append({"pass": name, "scheme": FP_PASS if quant is None else quant.name,
                         "budget": NO_BUDGET if quant is None else int(quant.budget), "length": trial.length,
                         "depth": trial.depth, "trial": trial.trial, "key": trial.key,
                         "correct": int(score.correct), "n_correct_prefix": score.n_correct_prefix,
                         "key_position": trial.key_position, "cpu_s": cpu_s})
        return rows

    chosen = select_round_robin(grid, part, "passkey trials")
    rows = [row for rows_of_trial in map_ordered(trial_rows, chosen, workers) for row in rows_of_trial]
    frame = pd.DataFrame(rows, columns=list(GRID_COLUMNS))
    return frame.astype({"budget": np.int32, "length": np.int32, "depth": np.float64, "trial": np.int32,
                         "key": np.int64, "correct": np.int8, "n_correct_prefix": np.int8,
                         "key_position": np.int32, "cpu_s": np.float64})


def _check_grid(frame: pd.DataFrame) -> None:
    missing = [c for c in ("pass", "length", "depth", "trial", "correct") if c not in frame.columns]
    if missing:
        raise KvasymError(f"summarize_grid: the frame lacks columns {missing} (run_grid's columns: "
                          f"{list(GRID_COLUMNS)})")
    if frame.empty:
        raise KvasymError("summarize_grid: the grid is empty")
    duplicated = frame.duplicated(["pass", *_TRIAL_KEYS])
    if duplicated.any():
        row = frame.loc[duplicated, ["pass", *_TRIAL_KEYS]].iloc[0].to_dict()
        raise KvasymError(f"summarize_grid: trial {row} appears more than once")
    if FP_PASS not in set(frame["pass"]):
        raise KvasymError(f"summarize_grid: no full-precision pass {FP_PASS!r} to compare with (passes: "
                          f"{sorted(set(frame['pass']))})")
    baseline = set(map(tuple, frame.loc[frame["pass"] == FP_PASS, _TRIAL_KEYS].itertuples(index=False)))
    for name, group in frame.groupby("pass", sort=False):
        trials = set(map(tuple, group[_TRIAL_KEYS].itertuples(index=False)))
        if trials != baseline:
            raise KvasymError(f"summarize_grid: pass {name!r} ran other trials than {FP_PASS!r} "
                              f"({len(trials - baseline)} not in {FP_PASS!r}, {len(baseline - trials)} missing): "
                              f"McNemar's test pairs the same trials")


def _summary_row(group: pd.DataFrame, fp: pd.DataFrame, level: float, threshold: float) -> dict[str, Any]:
    """Accuracy, interval and McNemar's test of one pass's group against the same fp trials."""
    n = len(group)
    k = int(group["correct"].sum())
    low, high = clopper_pearson(k, n, level)
    paired = group.merge(fp, on=_TRIAL_KEYS, suffixes=("", "_fp"), validate="one_to_one")
    fp_accuracy = float(paired["correct_fp"].mean())
    row: dict[str, Any] = {"n": n, "n_correct": k, "accuracy": k / n, "ci_low": low, "ci_high": high,
                           "fp_accuracy": fp_accuracy, "baseline_can_do": bool(fp_accuracy >= threshold)}
    if group["pass"].iloc[0] == FP_PASS:
        row.update({"mcnemar_b": -1, "mcnemar_c": -1, "mcnemar_p": np.nan, "mcnemar_log10_p": np.nan,
                    "accuracy_diff": 0.0, "diff_low": np.nan, "diff_high": np.nan})
    else:
        test = mcnemar_exact(paired["correct_fp"].to_numpy(), paired["correct"].to_numpy())
        diff_low, diff_high = paired_difference_interval(test["b"], test["c"], n, level)
        row.update({"mcnemar_b": test["b"], "mcnemar_c": test["c"], "mcnemar_p": test["p"],
                    "mcnemar_log10_p": test["log10_p"], "accuracy_diff": test["accuracy_diff"],
                    "diff_low": diff_low, "diff_high": diff_high})
    return row


def paired_difference_interval(b: int, c: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Agresti and Min's adjusted Wald interval for a difference of matched proportions.

    For ``n`` paired trials with ``b`` right in the baseline and wrong in the other pass and
    ``c`` the reverse, the difference of accuracies (other minus baseline) is ``(c - b) / n``.
    Adding one half to each of the four cells of the 2 x 2 table (``n* = n + 2``,
    ``b* = b + 1/2``, ``c* = c + 1/2``) gives ``d* = (c* - b*) / n*`` and
    ``se* = sqrt(b* + c* - (c* - b*)^2 / n*) / n*``; the interval is ``d* +- z se*`` clipped to
    [-1, 1] (``z`` the normal quantile of ``(1 + level) / 2``). Unlike the plain Wald interval
    it does not collapse to a point when ``b = c = 0``, and its coverage stays near nominal for
    small ``n`` [1]_.

    References
    ----------
    .. [1] Agresti, A., Min, Y. (2005) "Simple improved confidence intervals for comparing
       matched proportions", Statistics in Medicine 24(5):729-740.
    """
    from scipy.stats import norm

    if n < 1 or b < 0 or c < 0 or b + c > n:
        raise KvasymError(f"paired_difference_interval: need 0 <= b, c and b + c <= n >= 1, got b={b}, c={c}, n={n}")
    n_star, b_star, c_star = n + 2.0, b + 0.5, c + 0.5
    diff = (c_star - b_star) / n_star
    se = np.sqrt(b_star + c_star - (c_star - b_star) ** 2 / n_star) / n_star
    z = float(norm.ppf((1.0 + float(level)) / 2.0))
    return float(max(-1.0, diff - z * se)), float(min(1.0, diff + z * se))


def summarize_grid(frame: pd.DataFrame, level: float = 0.95, baseline_threshold: float = 0.8) -> pd.DataFrame:
    """Accuracy with Clopper-Pearson intervals and McNemar's exact test against full precision.

    Parameters
    ----------
    frame : pandas.DataFrame
        :func:`run_grid`'s rows (at least ``pass, length, depth, trial, correct``), with the
        :data:`FP_PASS` pass on exactly the trials of every other pass.
    level : float
        Confidence level of the Clopper-Pearson intervals.
    baseline_threshold : float
        The full-precision accuracy at or above which the model is said to be able to do the
        task at that (length, depth) or length (``baseline_can_do``).

    Returns
    -------
    pandas.DataFrame
        One row per (pass, length, depth) and per (pass, length) pooled over depths (``depth``
        NaN, ``scope = "length"``; the others have ``scope = "depth"``), columns ``pass,
        scheme, budget, scope, length, depth, n, n_correct, accuracy, ci_low, ci_high,
        fp_accuracy, baseline_can_do, mcnemar_b, mcnemar_c, mcnemar_p, mcnemar_log10_p,
        accuracy_diff, diff_low, diff_high``. ``mcnemar_b`` counts trials fp got right and the pass wrong,
        ``mcnemar_c`` the reverse, ``accuracy_diff = accuracy - fp_accuracy = (c - b) / n``
        with its interval ``diff_low``, ``diff_high`` (:func:`paired_difference_interval`); on
        the fp rows the test columns are -1 / NaN.

    Raises
    ------
    KvasymError
        If the frame is empty or lacks columns, a trial repeats within a pass, there is no fp
        pass, or a pass ran other trials than fp (the message names the pass).
    """
    _check_grid(frame)
    if not 0.0 <= float(baseline_threshold) <= 1.0:
        raise KvasymError(f"summarize_grid: baseline_threshold must be in [0, 1], got {baseline_threshold!r}")
    fp = frame.loc[frame["pass"] == FP_PASS, [*_TRIAL_KEYS, "correct"]]
    rows = []
    for scope, keys in (("depth", ["pass", "length", "depth"]), ("length", ["pass", "length"])):
        for values, group in frame.groupby(keys, sort=True):
            row = dict(zip(keys, values))
            first = group.iloc[0]
            row.update({"scheme": first.get("scheme"), "budget": first.get("budget"), "scope": scope})
            row.setdefault("depth", np.nan)
            row.update(_summary_row(group, fp, level, float(baseline_threshold)))
            rows.append(row)
    columns = ["pass", "scheme", "budget", "scope", "length", "depth", "n", "n_correct", "accuracy", "ci_low",
               "ci_high", "fp_accuracy", "baseline_can_do", "mcnemar_b", "mcnemar_c", "mcnemar_p",
               "mcnemar_log10_p", "accuracy_diff", "diff_low", "diff_high"]
    return pd.DataFrame(rows, columns=columns)
