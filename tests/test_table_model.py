"""The model-level tables (kvasym.render.table_model): equal total bits, long context, passkey
and the published bands, from tables built here by the statistics' own functions on synthetic
per-position data, with the placement against the published bands worked out by hand."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvasym.errors import KvasymError
from kvasym.real.endtoend_stats import compare_equal_bits, compare_long, summarize, summarize_long
from kvasym.render import tables
from kvasym.render.table_model import PUBLISHED_BANDS, band_rows, load_published_bands, model_context

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
from test_real_endtoend_stats import _frame, _long_frame  # noqa: E402


def _bands(*entries):
    base = {"model": "m", "method": "x", "source": "s", "url": "u", "collapse": False, "sides": "KV"}
    return {"bands": [{**base, **e} for e in entries]}


def _summary(scheme: str, budget: int, ratio: float, low: float, high: float) -> pd.DataFrame:
    return pd.DataFrame([{"rope": "post", "scheme": scheme, "budget": budget, "ppl_ratio": ratio,
                          "ppl_ratio_low": low, "ppl_ratio_high": high, "bits_per_coordinate": budget + 0.5}])


def test_band_placement_by_hand():
    bands = _bands({"id": "a", "family": "rotated_scalar", "bits": 4, "ppl_change_pct": 5.8},
                   {"id": "b", "family": "rotated_scalar", "bits": 4, "ppl_change_pct": 7.3},
                   {"id": "k", "family": "rotated_scalar", "bits": 4, "ppl_change_pct": 1.0, "sides": "K"},
                   {"id": "c", "family": "rotated_scalar", "bits": 3, "ppl_change_pct": 61, "collapse": True},
                   {"id": "d", "family": "kivi", "bits": 2, "ppl_change_pct": 55.3})
    summary = pd.concat([_summary("RKV", 4, 1.065, 1.05, 1.08), _summary("RKV", 3, 2.0, 1.5, 2.5),
                         _summary("KIVI32", 2, 1.2, 1.1, 1.3), _summary("KIVI32+R128", 2, 1.4, 1.3, 1.5)])
    rows = {r["id"]: r for r in band_rows(bands, summary)}
    # 6.5% lies inside [5.8, 7.3]; the K-only entry is not the same cache
    assert rows["a"]["place"] == rows["b"]["place"] == "inside" and rows["a"]["ours"] == pytest.approx(6.5)
    assert (rows["a"]["band_low"], rows["a"]["band_high"]) == (5.8, 7.3) and rows["k"]["place"] == "K only"
    # a collapse opens the range above: +100% at 3 bits is inside [61, inf)
    assert rows["c"]["place"] == "inside" and rows["c"]["band_high"] == math.inf
    # KIVI is compared with its windowed variant when the build has it: +40% below 55.3
    assert rows["d"]["ours_scheme"] == "KIVI32+R128" and rows["d"]["place"] == "below"
    assert band_rows(bands, None)[0]["place"] == "none"
    # a row that spends more than a bit per value above the entry's nominal bits is not the same
    # budget (KIVI32+R128 at n = 4 on short texts: 7.75): neither inside, below nor above
    wide = summary.assign(bits_per_coordinate=np.where(summary.scheme == "KIVI32+R128", 3.01, 2.5))
    assert {r["id"]: r["place"] for r in band_rows(bands, wide)}["d"] == "more bits"
    at_edge = summary.assign(bits_per_coordinate=np.where(summary.scheme == "KIVI32+R128", 3.0, 2.5))
    assert {r["id"]: r["place"] for r in band_rows(bands, at_edge)}["d"] == "below"


def test_the_shipped_bands_load_and_every_entry_names_its_source():
    bands = load_published_bands(ROOT / PUBLISHED_BANDS)
    assert len(bands["bands"]) >= 4 and all(b["url"].startswith("https://") for b in bands["bands"])
    assert {f["id"] for f in bands["bits_per_value"]} >= {"q4_0", "q8_0"}


def test_bands_refuse_a_missing_field_or_family(tmp_path):
    path = tmp_path / "b.yaml"
    path.write_text("bands:\n  - {id: a, model: m}\n")
    with pytest.raises(KvasymError, match=r"bands\[0\] lacks"):
        load_published_bands(path)
    path.write_text("bands:\n  - {id: a, model: m, method: x, family: mystery, bits: 4, ppl_change_pct: 1,"
                    " collapse: false, source: s, url: u}\n")
    with pytest.raises(KvasymError, match="mystery"):
        load_published_bands(path)
    path.write_text("bands:\n  - {id: a, model: m, method: x, family: kivi, bits: 4, ppl_change_pct: 1,"
                    " collapse: false, source: 'bad \u274c', url: u}\n", encoding="utf-8")
    with pytest.raises(KvasymError, match=r"bands\[0\].source is printed in the paper and must be printable ASCII"):
        load_published_bands(path)


def test_model_table_renders_every_part():
    frame = _frame(budgets=(2, 3, 4))
    frame["scheme"] = frame["scheme"].replace({"KV": "RKV"})
    summary = summarize(frame)
    equal = compare_equal_bits(frame, ["RKV", "KQV", "QKQV"])
    qwf = _long_frame(seed=9).assign(scheme="QWF+W")
    long_frame = pd.concat([_long_frame(), qwf], ignore_index=True)
    long = summarize_long(long_frame)
    long_comparisons = compare_long(long_frame)
    from kvasym.real.passkey_grid import summarize_grid
    trials = pd.DataFrame([{"pass": p, "scheme": s, "budget": b, "length": 1024, "depth": d, "trial": t,
                            "correct": int(p == "fp" or t % 3 != 0)}
                           for p, s, b in (("fp", "fp", -1), ("RKV@2", "RKV", 2)) for d in (0.0, 0.5)
                           for t in range(6)])
    passkey = summarize_grid(trials)
    bands = load_published_bands(ROOT / PUBLISHED_BANDS)
    context = model_context(equal, long, passkey, summary, bands, long_comparisons=long_comparisons)
    assert [g["budget"] for g in context["equal_bits"]] == [2, 3, 4]
    row = next(r for r in context["equal_bits"][1]["rows"] if r["scheme"] == "KQV")
    expected = equal[(equal.scheme_a == "KQV") & (equal.budget_a == 3) & (equal.scheme_b == "RKV")].iloc[0]
    assert row["kl_ratio"] == expected.kl_ratio and row["evaluated"] == bool(expected.evaluated)
    rows = {r["scheme"]: r for r in context["long"][0]["rows"]}
    assert rows["RKV"]["growth"] == pytest.approx(long[long.scheme == "RKV"].kl_growth.iloc[0])
    assert rows["RKV"]["vs_reference"] is None  # the reference itself
    assert rows["QWF+W"]["vs_reference"]["ratio"] == long_comparisons.kl_ratio.iloc[0]
    assert context["text_tokens"] == 41 and context["n_texts"] == 3
    text = tables.table_texts({"summary": pd.DataFrame(), "e2e_equal_bits": equal, "e2e_long_summary": long,
                               "e2e_long_comparisons": long_comparisons, "passkey_summary": passkey,
                               "e2e_summary": summary, "published_bands": bands},
                              {}, ["table_model", "table_bands"])
    # the bands table is its own file (the paper's appendix), from the same context
    labels = {"table_model": ("tab:model", "tab:e2e_long", "tab:passkey", "fig:e2e_context"),
              "table_bands": ("tab:bands",)}
    for name, expected in labels.items():
        for label in expected:
            assert (f"\\label{{{label}}}" in text[name]
                    or f"\\kvfigure{{{label.split(':')[1]}}}" in text[name]), (name, label)
        assert "nan" not in text[name].lower() and "\\begin{longtable}" in text[name]
    assert "tab:bands" not in text["table_model"] and "tab:passkey" not in text["table_bands"]
    empty = tables.table_texts({"summary": pd.DataFrame()}, {}, ["table_model", "table_bands"])
    assert "\\begin{longtable}" not in empty["table_model"] and "\\label{tab:passkey}" in empty["table_model"]
    assert "\\begin{longtable}" not in empty["table_bands"] and "\\label{tab:bands}" in empty["table_bands"]


@pytest.mark.parametrize("stage", ["e2e", "e2e_long", "passkey"])
def test_a_model_stage_with_query_variants_and_no_bases_file_stops_before_loading_the_model(stage, tmp_path):
    """What the rule runs, given a slice with query-aware variants and no --query-bases: exit 2,
    one line naming the missing file's flag, nothing written (no model is loaded to find out)."""
    import copy
    import subprocess

    import yaml

    from kvasym.real import real_settings
    from kvasym.study import canonical_json, load_study

    config = yaml.safe_load((ROOT / "config/test.yaml").read_text())
    study = load_study(copy.deepcopy(config))
    real = real_settings(config["real"], list(study.schemes), list(study.frontier_real_schemes))
    wildcards = {"e2e": {"text": "bicycle_repair", "part": "0"}, "e2e_long": {"length": "64", "part": "0"},
                 "passkey": {"length": "96", "part": "0"}}
    slice_ = canonical_json(study.job_slice(stage, wildcards[stage], real=real))
    out = tmp_path / "out.parquet"
    proc = subprocess.run([sys.executable, "-m", "kvasym.cli", "stage", stage, "--slice", slice_, "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("kvasym: error: ") and "need the query-bases file (--query-bases" in last, last
    assert not out.exists()
