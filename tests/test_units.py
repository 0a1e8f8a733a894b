"""The independent unit of real-model statistics is the text (issue 14, point 4).

A real trial is one (text, layer, KV head) cache; the caches of one text share its tokens, so
the stats stage resamples a text's caches together and runs its paired tests on one mean per
text. Checked here on genuine real per-query files (run_real_metrics on fake captures of three
texts) against per-text means computed straight from the per-query rows.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import scipy.stats as ss

from kvasym.dataset import from_stored
from kvasym import stats
from kvasym.errors import KvasymError
from kvasym.schemes import get_scheme
from kvasym.cell_statistics import trial_texts
from kvasym.stages.stats import run_stats

SCHEMES = ["KV", "QKQV"]


@pytest.fixture(scope="module")
def real_files(tmp_path_factory):
    from test_real_evaluate import make_capture

    from kvasym.real.capture import write_capture
    from kvasym.stages.real_metrics import run_real_metrics

    tmp = tmp_path_factory.mktemp("units")
    captures = []
    for seed, text in enumerate(["gamma", "alpha", "beta"]):
        capture = make_capture(seed=seed)
        capture.metadata["name"] = text
        captures.append(str(write_capture(capture, tmp / f"{text}.npz")))
    files = []
    for scheme in SCHEMES:
        slice_ = {"distribution": "smollm2", "scheme": {"name": scheme, **get_scheme(scheme).to_dict()},
                  "budgets": [2], "sharpness": [1.0], "base_seed": 11, "norm_dtype": "float32", "layers": None}
        out = tmp / f"{scheme}.parquet"
        run_real_metrics(slice_, captures, {2: str(out)})
        files.append(out)
    return tmp, files


def _stats_slice(dim: int) -> dict:
    return {"distribution": "smollm2", "dim": dim, "schemes": SCHEMES,
            "scheme_specs": {s: get_scheme(s).to_dict() for s in SCHEMES}, "base_seed": 3,
            "stats": {"n_boot": 200, "n_permutations": 10, "energy_max_n": 64}}


def test_real_comparisons_use_the_text_as_unit(real_files):
    tmp, files = real_files
    # as stored (float32 metrics, kvasym.dataset.METRIC_TYPE), widened as the stats stage widens them
    per_query = from_stored(pd.concat([pd.read_parquet(f) for f in files], ignore_index=True))
    texts = trial_texts(files)
    assert sorted(set(texts.values())) == ["alpha", "beta", "gamma"] and len(texts) == per_query["trial"].nunique()
    out = [tmp / f"{k}.out.parquet" for k in ("c", "s", "t")]
    run_stats(_stats_slice(int(per_query["dim"].iloc[0])), files, *out)
    comparisons = pd.read_parquet(out[0])
    kl = comparisons[comparisons["metric"] == "kl"].iloc[0]
    assert kl["unit"] == "text" and kl["n_units"] == 3 and kl["n_trials"] == len(texts)
    # the per-trial table names each trial's text: C11r's interval resamples and pairs texts
    trials = pd.read_parquet(out[2])
    assert (trials["text"] == trials["trial"].map(texts)).all() and set(trials["text"]) == {"alpha", "beta", "gamma"}
    energy = comparisons[comparisons["metric"] == "error6d"]
    # the energy test's points are the texts too: one per text and scheme, 2^(3-1) swap patterns
    assert set(energy["unit"]) == {"text"} and set(energy["n_units"]) == {3} and set(energy["energy_exact"]) == {1}
    assert energy["energy_p"].min() >= 0.25 and set(energy["energy_n_permutations"]) == {4}
    # its Holm family is this (distribution, dim)'s: 1 budget x 1 sharpness x 1 scheme pair, adjusted here
    assert set(energy["energy_family_size"]) == {1}
    np.testing.assert_allclose(energy["energy_log10_p_holm"], stats.holm_log10(energy["energy_log10_p"].to_numpy()))
    # reference: per-text means of the per-query rows, then scipy's paired Wilcoxon
    per_query["text"] = per_query["trial"].map(texts)
    means = per_query.groupby(["scheme", "text"])["kl"].mean().unstack("scheme")
    assert kl["t_wilcoxon_p"] == pytest.approx(ss.wilcoxon(means["KV"], means["QKQV"]).pvalue, rel=1e-12)
    assert kl["t_median_diff"] == pytest.approx(np.median(means["KV"] - means["QKQV"]), rel=1e-12)
    # the interval: Fieller over the three texts' sums (every text the same number of queries)
    sums = per_query.groupby(["scheme", "text"])["kl"].sum().unstack("scheme")
    ref = stats.fieller_ratio_ci(sums["KV"].to_numpy(), sums["QKQV"].to_numpy())
    assert (kl["ratio_mean"], kl["ratio_mean_low"], kl["ratio_mean_high"]) == pytest.approx(
        (ref["estimate"], ref["low"], ref["high"]), rel=1e-10)
    # and not the interval over the (nested) caches
    by_cache = per_query.groupby(["scheme", "trial"])["kl"].sum().unstack("scheme")
    nested = stats.fieller_ratio_ci(by_cache["KV"].to_numpy(), by_cache["QKQV"].to_numpy())
    assert nested["high"] - nested["low"] < 0.9 * (kl["ratio_mean_high"] - kl["ratio_mean_low"])


def _rewrite(src, dst, trial_map):
    table = pq.read_table(src)
    meta = dict(table.schema.metadata)
    if trial_map is None:
        meta.pop(b"trial_map")
    else:
        meta[b"trial_map"] = json.dumps(trial_map).encode()
    pq.write_table(table.replace_schema_metadata(meta), dst)
    return dst


def test_bad_trial_maps_are_refused_naming_the_file(real_files):
    tmp, files = real_files
    good = json.loads(pq.read_schema(files[0]).metadata[b"trial_map"])
    moved = [{**e, "text": "delta"} if e["trial"] == 0 else e for e in good]
    cases = [
        (None, "no trial_map, where the other"),
        (moved, "puts trial 0 in text 'delta'"),
        ([{"trial": "0", "text": "alpha"}], "trial: int, text: str"),
        ({"trial": 0}, "trial: int, text: str"),
    ]
    for i, (trial_map, message) in enumerate(cases):
        bad = _rewrite(files[1], tmp / f"bad{i}.parquet", trial_map)
        with pytest.raises(KvasymError, match=message) as info:
            trial_texts([files[0], bad])
        assert str(bad) in str(info.value) or trial_map is None
    assert trial_texts([_rewrite(files[0], tmp / "none.parquet", None)]) is None


@pytest.mark.parametrize("with_texts", [False, True])
def test_split_scheme_gives_the_groupby_arrays(with_texts: bool) -> None:
    """The stats stage's slices (what it runs) equal the pandas groupby (the reference),
    array for array, for trials and for texts nested in trials out of label order."""
    from kvasym.cell_statistics import _by_trial, _by_unit, _SplitScheme

    g = np.random.default_rng(4)
    rows = [(t, q) for t in range(9) for q in range(int(g.integers(1, 6)))]
    frame = pd.DataFrame(rows, columns=["trial", "query"]).assign(kl=g.exponential(size=len(rows)),
                                                                  recall_top5=g.integers(0, 6, len(rows)) / 5)
    texts = {t: ["zeta", "alpha", "mid"][t % 3] for t in range(9)} if with_texts else None
    split = _SplitScheme(frame, texts)
    for metric in ("kl", "recall_top5"):
        for got, ref in ((split.by_trial(metric), _by_trial(frame, metric)),
                         (split.by_unit(metric), _by_unit(frame, metric, texts))):
            assert len(got) == len(ref)
            for x, y in zip(got, ref):
                assert x.dtype == y.dtype and np.array_equal(x, y)
