"""The passkey grid (kvasym.real.passkey_grid) and the long-context windows (kvasym.real.longcontext).

The grid's bookkeeping (one prompt per trial read by every pass, each trial's own seed identity,
refusals before any cost) is checked with a character-level tokenizer and a recording stand-in
for the scorer; its summary against scipy's binomial test and interval on hand-built frames; and,
on the real model (small lengths), that every row is what scoring that trial directly gives.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
import scipy.stats

import kvasym.real.passkey_grid as grid
from kvasym.errors import KvasymError
from kvasym.real.endtoend import CacheQuantization, evaluate_text
from kvasym.real.longcontext import evaluate_windows, window_text
from kvasym.real.longtext import long_text
from kvasym.real.passkey import PasskeyScore, make_trial, run_trial
from kvasym.real.passkey_grid import FP_PASS, GRID_COLUMNS, NO_BUDGET, run_grid, summarize_grid, trial_text
from kvasym.schemes import get_scheme
from test_longtext import real_model_or_skip
from test_passkey import CharModel

BASE_SEED = 11


def _passes(budgets=(2, 3)) -> dict:
    out = {FP_PASS: None}
    out.update({f"RKV{n}": CacheQuantization(get_scheme("RKV"), n, BASE_SEED, "ignored", rope="pre") for n in budgets})
    return out


def _fake_verdict(key: int, text: str | None) -> tuple[bool, int]:
    """A deterministic stand-in verdict, different across trials and passes."""
    value = (key * 7 + (0 if text is None else sum(map(ord, text)))) % 6
    return value == 5, value


@pytest.fixture()
def recorded(monkeypatch):
    """run_grid with a recording scorer and a counting trial builder (no forward pass)."""
    calls: list[tuple] = []
    built: list[tuple] = []
    real_make_trial = grid.make_trial

    def fake_run_trial(model, trial, quant=None):
        calls.append((trial, quant))
        correct, prefix = _fake_verdict(trial.key, None if quant is None else quant.text)
        return PasskeyScore(correct=correct, n_correct_prefix=prefix, greedy_ids=np.zeros(5, dtype=np.int64))

    def counting_make_trial(model, length, depth, trial, **kwargs):
        built.append((length, depth, trial))
        return real_make_trial(model, length, depth, trial, **kwargs)

    monkeypatch.setattr(grid, "run_trial", fake_run_trial)
    monkeypatch.setattr(grid, "make_trial", counting_make_trial)
    return calls, built


def test_grid_rows_prompts_and_per_trial_seed_identities(recorded):
    calls, built = recorded
    passes = _passes()
    frame = run_grid(CharModel(), [300, 400], [0, 0.5, 1], 3, passes, base_seed=BASE_SEED)
    assert list(frame.columns) == list(GRID_COLUMNS)
    assert len(frame) == 2 * 3 * 3 * len(passes)
    # every (length, depth, trial) prompt built exactly once, depths as floats ...
    assert sorted(built) == sorted((L, d, t) for L in (300, 400) for d in (0.0, 0.5, 1.0) for t in range(3))
    assert all(isinstance(d, float) for _, d, _ in built)
    # ... and read by every pass: the same PasskeyTrial object for all passes of a trial
    by_trial: dict[tuple, set] = {}
    for trial, quant in calls:
        by_trial.setdefault((trial.length, trial.depth, trial.trial), set()).add(id(trial))
    assert all(len(ids) == 1 for ids in by_trial.values()) and len(by_trial) == 18
    # each quantized pass of each trial has its own text identity and otherwise the pass's fields
    texts = [quant.text for _, quant in calls if quant is not None]
    assert len(set(texts)) == 18  # one per trial: the passes of one trial share it, trials never do
    for trial, quant in calls:
        if quant is None:
            continue
        assert quant.text == f"passkey/{trial.length}/{trial.depth!r}/{trial.trial}"
        original = passes[f"RKV{quant.budget}"]
        assert quant == dataclasses.replace(original, text=quant.text)
    # rows carry the trial's identity, key and the scorer's verdicts
    for row in frame.itertuples(index=False):
        trial = make_trial(CharModel(), int(row.length), row.depth, int(row.trial), base_seed=BASE_SEED)
        quant = passes[getattr(row, "_0")]
        text = None if quant is None else trial_text(row.length, row.depth, row.trial)
        correct, prefix = _fake_verdict(trial.key, text)
        assert (row.key, row.key_position, row.correct, row.n_correct_prefix) == (
            trial.key, trial.key_position, int(correct), prefix)
        assert row.scheme == (FP_PASS if quant is None else "RKV")
        assert row.budget == (NO_BUDGET if quant is None else quant.budget)
        assert row.cpu_s >= 0.0
    assert frame["correct"].dtype == np.int8 and set(frame["correct"]) == {0, 1}


@pytest.mark.parametrize("kwargs, message", [
    ({"depths": [0.5, 1.5]}, "depth 1.5"),
    ({"depths": [-0.1]}, "depth -0.1"),
    ({"lengths": [300, 9000]}, "length 9000"),
    ({"lengths": []}, "lengths is empty"),
    ({"depths": []}, "depths is empty"),
    ({"lengths": [300, 300]}, "lengths has repeated"),
    ({"trials": 0}, "trials must be"),
    ({"passes": {}}, "passes must be a non-empty"),
    ({"passes": {"fp": CacheQuantization(get_scheme("RKV"), 2, BASE_SEED, "t")}}, "'fp' is the full-precision"),
    ({"passes": {"full": None}}, "pass 'full' has no quantization"),
    ({"passes": {"fp": None, "x": "RKV"}}, "pass 'x' must map"),
])
def test_grid_refusals_come_before_any_pass(recorded, kwargs, message):
    calls, _ = recorded
    args = {"lengths": [300], "depths": [0.5], "trials": 1, "passes": _passes(), **kwargs}
    with pytest.raises(KvasymError, match=message):
        run_grid(CharModel(), args["lengths"], args["depths"], args["trials"], args["passes"], base_seed=BASE_SEED)
    assert calls == []


def _frame(outcomes: dict[str, dict[tuple, list[int]]]) -> pd.DataFrame:
    rows = []
    for name, cells in outcomes.items():
        for (length, depth), correct in cells.items():
            for t, c in enumerate(correct):
                rows.append({"pass": name, "scheme": FP_PASS if name == FP_PASS else "RKV",
                             "budget": NO_BUDGET if name == FP_PASS else 2, "length": length, "depth": depth,
                             "trial": t, "correct": c})
    return pd.DataFrame(rows)


def _hand_mcnemar(fp: list[int], other: list[int]) -> tuple[int, int, float]:
    b = sum(f == 1 and o == 0 for f, o in zip(fp, other))
    c = sum(f == 0 and o == 1 for f, o in zip(fp, other))
    p = 1.0 if b + c == 0 else scipy.stats.binomtest(b, b + c, 0.5).pvalue
    return b, c, p


def test_summary_against_scipy_on_a_hand_built_grid():
    fp = {(1024, 0.0): [1, 0, 1, 1, 0, 1], (1024, 1.0): [1, 1, 1, 1, 1, 1]}
    q = {(1024, 0.0): [0, 0, 0, 1, 1, 0], (1024, 1.0): [0, 0, 0, 0, 1, 0]}
    summary = summarize_grid(_frame({FP_PASS: fp, "RKV2": q}), level=0.9, baseline_threshold=0.8)
    assert len(summary) == 2 * 2 + 2  # (pass, length, depth) rows, then (pass, length) rows
    for name, cells in ((FP_PASS, fp), ("RKV2", q)):
        groups = [((1024, d), cells[(1024, d)], fp[(1024, d)], "depth") for d in (0.0, 1.0)]
        groups.append(((1024, np.nan), sum(cells.values(), []), sum(fp.values(), []), "length"))
        for (length, depth), correct, base, scope in groups:
            row = summary[(summary["pass"] == name) & (summary["scope"] == scope)
                          & ((summary["depth"] == depth) | (np.isnan(depth) & summary["depth"].isna()))]
            assert len(row) == 1
            row = row.iloc[0]
            k, n = sum(correct), len(correct)
            ci = scipy.stats.binomtest(k, n).proportion_ci(confidence_level=0.9, method="exact")
            assert (row["n"], row["n_correct"]) == (n, k)
            assert row["accuracy"] == pytest.approx(k / n)
            assert (row["ci_low"], row["ci_high"]) == pytest.approx((ci.low, ci.high), abs=1e-12)
            assert row["fp_accuracy"] == pytest.approx(np.mean(base))
            assert row["baseline_can_do"] == (np.mean(base) >= 0.8)
            if name == FP_PASS:
                assert np.isnan(row["mcnemar_p"]) and row["mcnemar_b"] == -1
            else:
                b, c, p = _hand_mcnemar(base, correct)
                assert (row["mcnemar_b"], row["mcnemar_c"]) == (b, c)
                assert row["mcnemar_p"] == pytest.approx(p, rel=1e-12)
                assert row["accuracy_diff"] == pytest.approx(np.mean(correct) - np.mean(base))
                assert (row["diff_low"], row["diff_high"]) == pytest.approx(
                    grid.paired_difference_interval(b, c, n, 0.9))
    # the depth-0 cell: fp 4/6 < 0.8, so the model cannot do the task there
    cell = summary[(summary["pass"] == FP_PASS) & (summary["depth"] == 0.0)].iloc[0]
    assert not cell["baseline_can_do"]


def test_summary_pairs_by_trial_not_by_row_order():
    fp = {(512, 0.5): [1, 1, 0, 0, 1]}
    q = {(512, 0.5): [1, 0, 1, 0, 0]}
    frame = _frame({FP_PASS: fp, "RKV2": q})
    shuffled = frame.sample(frac=1.0, random_state=3).reset_index(drop=True)
    a = summarize_grid(frame)
    b = summarize_grid(shuffled)
    pd.testing.assert_frame_equal(a, b)
    row = a[(a["pass"] == "RKV2") & (a["scope"] == "depth")].iloc[0]
    assert (row["mcnemar_b"], row["mcnemar_c"]) == (2, 1)


def test_summary_refusals():
    fp = {(512, 0.5): [1, 1, 0]}
    frame = _frame({FP_PASS: fp, "RKV2": {(512, 0.5): [1, 0, 1]}})
    with pytest.raises(KvasymError, match="pass 'RKV2' ran other trials"):
        summarize_grid(frame[~((frame["pass"] == "RKV2") & (frame["trial"] == 2))])
    with pytest.raises(KvasymError, match="no full-precision pass 'fp'"):
        summarize_grid(frame[frame["pass"] == "RKV2"])
    with pytest.raises(KvasymError, match="grid is empty"):
        summarize_grid(frame.iloc[:0])
    with pytest.raises(KvasymError, match="appears more than once"):
        summarize_grid(pd.concat([frame, frame.iloc[:1]]))
    with pytest.raises(KvasymError, match="lacks columns"):
        summarize_grid(frame.drop(columns="correct"))


# --------------------------------------------------------------------------- the real model


@pytest.fixture(scope="module")
def model():
    return real_model_or_skip("the passkey grid and the long-context windows were")


def test_real_grid_rows_equal_direct_scoring(model):
    passes = {FP_PASS: None, "RKV3": CacheQuantization(get_scheme("RKV"), 3, BASE_SEED, "ignored")}
    frame = run_grid(model, [96], [0.0, 1.0], 1, passes, base_seed=BASE_SEED)
    assert len(frame) == 4
    for row in frame.itertuples(index=False):
        trial = make_trial(model, int(row.length), row.depth, int(row.trial), base_seed=BASE_SEED)
        quant = passes[getattr(row, "_0")]
        if quant is not None:
            quant = dataclasses.replace(quant, text=f"passkey/96/{row.depth!r}/0")
        score = run_trial(model, trial, quant)
        assert (row.correct, row.n_correct_prefix, row.key) == (int(score.correct), score.n_correct_prefix, trial.key)
    summary = summarize_grid(frame)
    assert set(summary["pass"]) == {FP_PASS, "RKV3"}
    with pytest.raises(KvasymError, match="length 9000"):
        run_grid(model, [9000], [0.5], 1, passes, base_seed=BASE_SEED)


def test_real_windows_equal_evaluate_text_on_each_window(model):
    ids = np.asarray(model.encode(long_text()[:3000]), dtype=np.int64)
    schemes, budgets = [get_scheme("RKV")], [3]
    out = evaluate_windows(model, ids, [64], 2, schemes, budgets, base_seed=BASE_SEED, rope="pre")
    assert np.array_equal(np.unique(out["window"]), [0, 1]) and set(out["context"]) == {64}
    for index in (0, 1):
        direct = evaluate_text(model, ids[64 * index:64 * (index + 1)], schemes, budgets, text=f"pydoc/64/{index}",
                               base_seed=BASE_SEED, ropes=("pre",))
        mine = out["window"] == index
        assert window_text(64, index) == f"pydoc/64/{index}"
        for key, column in direct.items():
            np.testing.assert_array_equal(out[key][mine], column, err_msg=key)
    assert set(out) == set(direct) | {"context", "window"}
    with pytest.raises(KvasymError, match="exceeds the model's trained context"):
        evaluate_windows(model, ids, [64, 9000], 1, schemes, budgets, base_seed=BASE_SEED)
    with pytest.raises(KvasymError, match="count_per_length"):
        evaluate_windows(model, ids, [64], 0, schemes, budgets, base_seed=BASE_SEED)


def _agresti_min_by_table(base, other, level):
    """Agresti and Min's interval from the 2 x 2 table of the pairs, each cell plus one half."""
    base, other = np.asarray(base), np.asarray(other)
    table = np.array([[np.sum((base == 1) & (other == 1)), np.sum((base == 1) & (other == 0))],
                      [np.sum((base == 0) & (other == 1)), np.sum((base == 0) & (other == 0))]], float) + 0.5
    n = table.sum()
    p_other, p_base = (table[0, 0] + table[1, 0]) / n, (table[0, 0] + table[0, 1]) / n
    p12, p21 = table[0, 1] / n, table[1, 0] / n
    var = (p12 + p21 - (p21 - p12) ** 2) / n
    z = scipy.stats.norm.ppf((1 + level) / 2)
    return p_other - p_base - z * np.sqrt(var), p_other - p_base + z * np.sqrt(var)


def test_paired_difference_interval_is_agresti_min_and_never_a_point():
    gen = np.random.default_rng(3)
    for _ in range(20):
        base = gen.integers(0, 2, 30)
        other = np.where(gen.random(30) < 0.3, 1 - base, base)
        b = int(np.sum((base == 1) & (other == 0)))
        c = int(np.sum((base == 0) & (other == 1)))
        assert grid.paired_difference_interval(b, c, 30, 0.95) == pytest.approx(
            _agresti_min_by_table(base, other, 0.95), abs=1e-12)
    low, high = grid.paired_difference_interval(0, 0, 60)
    half = scipy.stats.norm.ppf(0.975) / 62.0
    assert (low, high) == pytest.approx((-half, half), rel=1e-12)
    assert grid.paired_difference_interval(60, 0, 60)[0] == -1.0  # clipped
    with pytest.raises(KvasymError, match="b \\+ c <= n"):
        grid.paired_difference_interval(40, 30, 60)


def test_passkey_difference_claim_reads_the_length_row():
    from kvasym.claims import MissingCell, Tables, stat_passkey_difference

    fp = {(1024, 0.0): [1] * 10, (1024, 0.5): [1] * 10}
    q = {(1024, 0.0): [0] * 6 + [1] * 4, (1024, 0.5): [1] * 10}
    summary = summarize_grid(_frame({FP_PASS: fp, "RKV@2": q}))
    m = stat_passkey_difference(Tables(*(pd.DataFrame(),) * 4, passkey_summary=summary),
                                {"scheme": "RKV", "budget": 2, "length": 1024})
    assert m.estimate == pytest.approx(-6 / 20) and m.details["mcnemar_b"] == 6 and m.details["n_trials"] == 20
    assert (m.low, m.high) == pytest.approx(grid.paired_difference_interval(6, 0, 20))
    assert m.log10_p == pytest.approx(np.log10(2 * 0.5 ** 6))
    with pytest.raises(MissingCell):
        stat_passkey_difference(Tables(*(pd.DataFrame(),) * 4, passkey_summary=summary),
                                {"scheme": "RKV", "budget": 3, "length": 1024})


def test_real_grid_and_windows_on_workers_equal_the_loop(model):
    """Issue 49: the trials (run_grid) and each window's passes (evaluate_windows) on two worker
    processes give the loop's rows bit for bit (the trials' cpu_s, a measurement, apart)."""
    passes = {FP_PASS: None, "RKV2": CacheQuantization(get_scheme("RKV"), 2, BASE_SEED, "ignored")}
    one = run_grid(model, [96], [0.0, 0.5, 1.0], 2, passes, base_seed=BASE_SEED, workers=1)
    two = run_grid(model, [96], [0.0, 0.5, 1.0], 2, passes, base_seed=BASE_SEED, workers=2)
    pd.testing.assert_frame_equal(one.drop(columns="cpu_s"), two.drop(columns="cpu_s"), check_exact=True)
    ids = np.asarray(model.encode(long_text()[:3000]), dtype=np.int64)
    run = dict(base_seed=BASE_SEED, rope="post", part=(0, 1))
    schemes = [get_scheme("RKV"), get_scheme("KIVI128")]
    loop = evaluate_windows(model, ids, [64], 2, schemes, [2, 3], workers=1, **run)
    pool = evaluate_windows(model, ids, [64], 2, schemes, [2, 3], workers=2, **run)
    assert list(loop) == list(pool)
    for key in loop:
        np.testing.assert_array_equal(loop[key], pool[key], err_msg=key)
