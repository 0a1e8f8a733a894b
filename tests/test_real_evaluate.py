"""kvasym.real.evaluate on a synthetic capture (no model needed): GQA mapping, causal mask,
pre/post-RoPE quantization, checked against a brute-force softmax."""

from __future__ import annotations

import numpy as np
import pytest

from kvasym.errors import KvasymError
from kvasym.evaluate import quantize_pair
from kvasym.real.capture import CAPTURE_FORMAT, CAPTURE_FORMAT_VERSION, Capture
from kvasym.real.evaluate import evaluate_capture, summarize
from kvasym.real.gguf_model import apply_rope, rope_tables
from kvasym.schemes import get_scheme

T, D, HKV, HQ = 12, 8, 2, 4  # group of 2 query heads per KV head
LAYERS = [0, 3]
BASE = 1e4


def make_capture(seed: int = 0) -> Capture:
    rng = np.random.default_rng(seed)
    positions = np.arange(T, dtype=np.int32)
    cos, sin = rope_tables(positions, D, BASE, np.float64)
    k_pre = rng.standard_normal((len(LAYERS), HKV, T, D))
    q_pre = rng.standard_normal((len(LAYERS), HQ, T, D))
    return Capture(
        token_ids=np.arange(T, dtype=np.int32), positions=positions, layers=np.asarray(LAYERS, dtype=np.int32),
        kv_head_of_query_head=np.arange(HQ, dtype=np.int32) // (HQ // HKV),
        k_pre_rope=k_pre.astype(np.float32), k_post_rope=apply_rope(k_pre, cos, sin).astype(np.float32),
        v=rng.standard_normal((len(LAYERS), HKV, T, D)).astype(np.float32),
        q_pre_rope=q_pre.astype(np.float32), q_post_rope=apply_rope(q_pre, cos, sin).astype(np.float32),
        token_nll_nats=np.ones(T - 1),
        metadata={"rope_base": BASE, "format": CAPTURE_FORMAT, "format_version": CAPTURE_FORMAT_VERSION,
                  "n_tokens": T, "n_heads": HQ, "n_kv_heads": HKV, "head_dim": D, "layers": LAYERS,
                  "n_layers_model": max(LAYERS) + 1},
    )


def write_two_captures(tmp_path) -> list[str]:
    """Two captures (texts "a" and "b", seeds 0 and 1) written under ``tmp_path``; their paths."""
    from kvasym.real.capture import write_capture

    paths = []
    for i, text in enumerate(("a", "b")):
        capture = make_capture(seed=i)
        capture.metadata["name"] = text
        paths.append(str(write_capture(capture, tmp_path / f"{text}.npz")))
    return paths


def brute_kl(q: np.ndarray, k: np.ndarray, k_hat: np.ndarray, position: int) -> float:
    """KL(p || p_hat) of one query over keys 0..position, softmax of q.k / sqrt(D)."""
    def weights(keys):
        logits = keys[: position + 1] @ q / np.sqrt(D)
        w = np.exp(logits - logits.max())
        return w / w.sum()
    p, p_hat = weights(k), weights(k_hat)
    return float(np.sum(p * (np.log(p) - np.log(p_hat))))


def test_rows_ids_and_a_brute_force_kl():
    capture = make_capture()
    schemes = [get_scheme("KQV"), get_scheme("QKQV")]
    cols = evaluate_capture(capture, schemes, [2, 4], name="synthetic", base_seed=5)
    n = len(LAYERS) * HKV * len(schemes) * 2 * (HQ // HKV) * T
    assert all(len(v) == n for v in cols.values())
    # GQA: KV head h is read by query heads g with g // 2 == h, and only by them
    for h in range(HKV):
        assert set(cols["query_head"][cols["kv_head"] == h]) == {2 * h, 2 * h + 1}
    # one row against a softmax computed by hand (layer 3, KV head 1, query head 3, position 7)
    layer, kv_head, q_head, pos, budget = 3, 1, 3, 7, 2
    li = LAYERS.index(layer)
    k = capture.k_post_rope[li, kv_head].astype(np.float64)
    packed = quantize_pair(k, capture.v[li, kv_head].astype(np.float64), get_scheme("QKQV"), budget,
                           base_seed=5, identity=("synthetic", layer, kv_head))
    query = capture.q_post_rope[li, q_head, pos].astype(np.float64)
    expected = brute_kl(query, k, packed["K"].dequantize("float64"), pos)
    row = ((cols["layer"] == layer) & (cols["kv_head"] == kv_head) & (cols["query_head"] == q_head)
           & (cols["position"] == pos) & (cols["scheme"] == "QKQV") & (cols["budget"] == budget))
    assert row.sum() == 1
    assert cols["kl"][row][0] == pytest.approx(expected, rel=1e-9, abs=1e-15)
    assert expected > 1e-6  # a real difference, not two zeros
    # causal: the first position sees one key, so nothing can change its attention
    assert np.all(cols["kl"][cols["position"] == 0] == 0)
    assert np.all(cols["recall_top5"] >= 0) and np.all(cols["recall_top5"] <= 1)
    table = summarize(cols)
    assert len(table) == len(LAYERS) * HKV * len(schemes) * 2
    assert (table["n_queries"] == (HQ // HKV) * T).all()


def test_pre_rope_quantization_rotates_the_reconstruction(monkeypatch):
    capture = make_capture(1)
    scheme = [get_scheme("KV")]
    post = evaluate_capture(capture, scheme, [8], name="c", base_seed=0, rope="post")
    pre = evaluate_capture(capture, scheme, [8], name="c", base_seed=0, rope="pre")
    # at 8 bits either way reconstructs the post-RoPE keys closely
    assert post["kl"].mean() < 1e-4 and pre["kl"].mean() < 1e-4
    assert not np.array_equal(pre["kl"], post["kl"])  # different stored keys, different errors
    # without the rotation the reconstruction would be the pre-RoPE keys: far off
    import kvasym.real.gguf_model as gm

    monkeypatch.setattr(gm, "apply_rope", lambda x, cos, sin: x)
    unrotated = evaluate_capture(capture, scheme, [8], name="c", base_seed=0, rope="pre")
    assert unrotated["kl"].mean() > 100 * pre["kl"].mean()


def test_bad_requests_name_the_problem():
    capture = make_capture()
    with pytest.raises(KvasymError, match=r"layers \[1\] are not in the capture"):
        evaluate_capture(capture, [get_scheme("KV")], [4], name="c", base_seed=0, layers=[1])
    with pytest.raises(KvasymError, match="rope must be one of"):
        evaluate_capture(capture, [get_scheme("KV")], [4], name="c", base_seed=0, rope="middle")
    capture.metadata["rope_base"] = None
    with pytest.raises(KvasymError, match="rope_base"):
        evaluate_capture(capture, [get_scheme("KV")], [4], name="c", base_seed=0, rope="pre")


def test_real_metrics_table_feeds_the_stats_stage(tmp_path):
    """run_real_metrics writes the synthetic study's per-query schema (one trial per text, layer
    and KV head), and the unchanged stats stage turns it into comparisons for the real rows."""
    import json as _json

    import pandas as pd

    from kvasym.stages.stats import run_stats
    from kvasym.dataset import read_metadata
    from kvasym.stages.real_metrics import run_real_metrics

    paths = write_two_captures(tmp_path)
    files = []
    for scheme in ("KQV", "QKQV"):
        slice_ = {"distribution": "smollm2", "scheme": {"name": scheme, **get_scheme(scheme).to_dict()}, "budgets": [4],
                  "sharpness": [1.0], "base_seed": 3, "norm_dtype": "float32", "layers": None}
        out = tmp_path / f"{scheme}.parquet"
        run_real_metrics(slice_, paths, {4: str(out)})
        files.append(str(out))
    frame = pd.read_parquet(files[0])
    assert set(frame["distribution"]) == {"smollm2"} and set(frame["kind"]) == {"smollm2"}
    assert sorted(frame["trial"].unique()) == list(range(2 * len(LAYERS) * HKV))
    assert (frame.groupby("trial").size() == (HQ // HKV) * T).all()
    trial_map = _json.loads(read_metadata(files[0])["trial_map"])
    assert trial_map[0] == {"trial": 0, "text": "a", "layer": 0, "kv_head": 0}
    assert trial_map[-1] == {"trial": 2 * len(LAYERS) * HKV - 1, "text": "b", "layer": 3, "kv_head": 1}
    assert frame["k_bits_payload"].eq(4).all()  # d = 8 is a power of two: the payload is the budget
    stats_slice = {"distribution": "smollm2", "dim": D, "schemes": ["KQV", "QKQV"], "base_seed": 3,
                   "scheme_specs": {name: get_scheme(name).to_dict() for name in ("KQV", "QKQV")},
                   "stats": {"n_boot": 50, "n_permutations": 10, "energy_max_n": 64}}
    outs = {k: tmp_path / f"{k}.parquet" for k in ("comparisons", "summary", "trials")}
    run_stats(stats_slice, files, outs["comparisons"], outs["summary"], outs["trials"])
    summary = pd.read_parquet(outs["summary"])
    assert set(summary["scheme"]) == {"KQV", "QKQV"} and set(summary["distribution"]) == {"smollm2"}
    assert len(pd.read_parquet(outs["comparisons"])) > 0


def test_one_real_metrics_job_per_scheme_writes_what_a_job_per_budget_wrote(tmp_path):
    """Issue 29: the real rows' job evaluates every budget of a (distribution, scheme) on one
    read of each capture; each budget's file holds exactly the rows and metadata (trial map,
    provenance of its cell) that a job of that budget alone writes."""
    import json as _json

    import pandas as pd

    from kvasym.dataset import read_metadata
    from kvasym.stages.real_metrics import run_real_metrics

    paths = write_two_captures(tmp_path)
    base = {"distribution": "smollm2-prerope", "scheme": {"name": "KQV", **get_scheme("KQV").to_dict()},
            "sharpness": [1.0], "base_seed": 3, "norm_dtype": "float32", "layers": None}
    together = {b: tmp_path / f"all_n{b}.parquet" for b in (2, 4)}
    run_real_metrics({**base, "budgets": [2, 4]}, paths, together)
    for budget, path in together.items():
        alone = tmp_path / f"alone_n{budget}.parquet"
        run_real_metrics({**base, "budgets": [budget]}, paths, {budget: alone})
        pd.testing.assert_frame_equal(pd.read_parquet(path), pd.read_parquet(alone))
        meta, want = read_metadata(path), read_metadata(alone)
        assert meta["trial_map"] == want["trial_map"]
        assert _json.loads(meta["config_slice"]) == {**base, "budget": budget} == _json.loads(want["config_slice"])
        assert set(pd.read_parquet(path)["budget"]) == {budget}
    with pytest.raises(KvasymError, match=r"--out names budgets \[2\], the slice \[2, 4\]"):
        run_real_metrics({**base, "budgets": [2, 4]}, paths, {2: tmp_path / "x.parquet"})


def test_a_real_cell_at_an_extra_budget_is_the_cell_a_job_with_that_budget_writes(tmp_path):
    """Issue 31 (C22f): stage real_metrics_extra writes a real cell at one of its scheme's
    frontier extra budgets (RKV at n = 5) on its own; the file equals, rows and metadata, the n = 5
    file of a real_metrics job whose budgets include 5, and the grid budgets' files do not depend
    on it. A slice of other than one budget is refused."""
    import json

    import pandas as pd

    from kvasym.cli import main
    from kvasym.dataset import read_metadata
    from kvasym.stages.real_metrics import run_real_metrics

    paths = write_two_captures(tmp_path)
    base = {"distribution": "smollm2", "scheme": {"name": "RKV", **get_scheme("RKV").to_dict()},
            "sharpness": [1.0], "base_seed": 3, "norm_dtype": "float32", "layers": None}
    together = {b: tmp_path / f"all_n{b}.parquet" for b in (4, 5)}
    run_real_metrics({**base, "budgets": [4, 5]}, paths, together)
    alone = tmp_path / "extra_n5.parquet"
    assert main(["stage", "real_metrics_extra", "--slice", json.dumps({**base, "budgets": [5]}),
                 "--captures", *paths, "--out", str(alone)]) == 0
    frame = pd.read_parquet(alone)
    pd.testing.assert_frame_equal(frame, pd.read_parquet(together[5]))
    assert read_metadata(alone)["config_slice"] == read_metadata(together[5])["config_slice"]
    assert set(frame["budget"]) == {5} and frame["k_bits_payload"].eq(5).all()
    grid = tmp_path / "grid_n4.parquet"
    run_real_metrics({**base, "budgets": [4]}, paths, {4: grid})
    pd.testing.assert_frame_equal(pd.read_parquet(grid), pd.read_parquet(together[4]))
    # n = 5 spends more bits and damages attention less than n = 4, on every trial's mean
    n4, n5 = (pd.read_parquet(f).groupby("trial")["kl"].mean() for f in (together[4], alone))
    assert (n5 < n4).all()
    bad = tmp_path / "bad.parquet"
    assert main(["stage", "real_metrics_extra", "--slice", json.dumps({**base, "budgets": [4, 5]}),
                 "--captures", *paths, "--out", str(bad)]) != 0
    assert not bad.exists()


@pytest.mark.parametrize(
    "value, message",
    [
        ([1], "must be a mapping"),
        ("on", "must be a mapping"),
        (True, "must be a mapping"),
        ({"textz": "all"}, r"unknown config key\(s\): real.textz"),
        ({"texts": ["no_such_text"]}, "not among the shipped texts"),
        ({"texts": []}, "non-empty list"),
        ({"max_tokens": 1}, r"config key real.max_tokens: must be in 2\.\.8192, got 1"),
        ({"max_tokens": True}, "config key real.max_tokens: must be an integer, got True"),
        ({"layers": [30]},
         r"config key real.layers: must be all or a non-empty list of distinct layer numbers in 0\.\.29, got \[30\]"),
        ({"layers": [1, 1]}, "distinct"),
        ({"e2e": {"rope": ["sideways"]}}, "real.e2e.rope"),
        ({"e2e": {"own": "maybe"}}, "real.e2e.own"),
        ({"e2e": {"block_tokens": 600}},
         r"config key real.e2e.block_tokens was retired: .*\(text, draw\) units.*real.e2e.draws"),
        ({"e2e": {"draws": 0}}, r"config key real.e2e.draws: must be in 1\.\.64, got 0"),
        ({"e2e": {"rope": {"sideways": "all"}}}, "real.e2e.rope"),
        ({"e2e": {"extra_budgets": {"RKV": [9]}}}, "real.e2e.extra_budgets"),
        ({"e2e": {"sensitivity_layers": [30]}}, "real.e2e.sensitivity_layers"),
        ({"e2e": {"blocks": 3}}, r"unknown config key\(s\): real.e2e.blocks"),
        ({"e2e": [1]}, r"config key real.e2e: must be a mapping, or off \(or false\), got \[1\]"),
        ({"texts": ["bicycle_repair"], "e2e": {"texts": ["bakery_morning"]}}, r"real.e2e.texts: \['bakery_morning'\]"),
        ({"e2e": {"texts": []}},
         r"config key real.e2e.texts: must be all or a non-empty subset of real.texts, got \[\]"),
        ({"e2e": {"texts": "bicycle_repair"}},
         "config key real.e2e.texts: must be all or a non-empty subset of real.texts, got 'bicycle_repair'"),
        ({"e2e": {"schemes": ["KV", "KV"]}},
         r"config key real.e2e.schemes: must be all or a non-empty subset of schemes and frontier.real_schemes, "
         r"got \['KV', 'KV'\]"),
    ],
)
def test_real_settings_reject_bad_config(value, message):
    from kvasym.real import real_settings

    with pytest.raises(KvasymError, match=message):
        real_settings(value)


def test_real_settings_defaults():
    from kvasym.real import N_LAYERS, real_settings, shipped_texts

    assert real_settings(None) is None
    assert real_settings("off") is None and real_settings(False) is None  # --config real=off; YAML `off`
    settings = real_settings({})
    e2e = {"texts": shipped_texts(), "schemes": "all", "draws": 1, "parts": 1, "rope": {"post": "all", "pre": "all"},
           "extra_budgets": {}, "own": "exact", "sensitivity_layers": list(range(N_LAYERS)),
           "sensitivity_schemes": "study", "query_aware": [], "calibration_texts": [], "recent_windows": {},
           "causal_chunks": {}, "global_only": [], "long_context": None, "passkey": None,
           "greedy": None}
    assert settings == {"texts": shipped_texts(), "max_tokens": 512, "layers": list(range(N_LAYERS)), "e2e": e2e,
                        "card": None, "models": {}}
    assert real_settings({"e2e": "off"})["e2e"] is None
    assert real_settings({"e2e": {"sensitivity_layers": []}})["e2e"]["sensitivity_layers"] == []
    assert len(settings["texts"]) >= 4


def test_real_e2e_subsets_follow_their_lists():
    """real.e2e.texts and .schemes subset real.texts and the study's schemes, in those lists' order."""
    from kvasym.real import real_settings

    texts = ["bicycle_repair", "bakery_morning"]
    settings = real_settings({"texts": texts, "e2e": {"texts": ["bakery_morning", "bicycle_repair"],
                                                       "schemes": ["RKV", "KV"]}},
                             schemes=["KV", "KQV", "RKV"])
    assert settings["e2e"]["texts"] == texts and settings["e2e"]["schemes"] == ["KV", "RKV"]
    assert real_settings({}, schemes=["KV", "KQV"])["e2e"]["schemes"] == ["KV", "KQV"]
    with pytest.raises(KvasymError, match=r"real.e2e.schemes: \['QKQV'\] not among the study and frontier real"):
        real_settings({"e2e": {"schemes": ["QKQV"]}}, schemes=["KV", "KQV"])


def test_real_e2e_extra_schemes_are_built_ins_appended_to_the_e2e_schemes():
    """real.e2e.extra_schemes: built-in schemes outside schemes and frontier.real_schemes, run end
    to end after them (rope post: all includes them); a user name or a scheme already there is
    refused, naming the key."""
    from kvasym.real import real_settings

    settings = real_settings({"e2e": {"extra_schemes": ["KVarN"], "rope": {"post": "all", "pre": ["KV"]}}},
                             schemes=["KV", "RKV"], frontier_schemes=["KIVI128"])
    assert settings["e2e"]["schemes"] == ["KV", "RKV", "KIVI128", "KVarN"]
    assert settings["e2e"]["rope"] == {"post": ["KV", "RKV", "KIVI128", "KVarN"], "pre": ["KV"]}
    assert settings["e2e"]["sensitivity_schemes"] == ["KV", "RKV"]
    with pytest.raises(KvasymError, match=r"real.e2e.extra_schemes: \['Mine'\] not among the built-in schemes"):
        real_settings({"e2e": {"extra_schemes": ["Mine"]}}, schemes=["KV"])
    with pytest.raises(KvasymError, match=r"real.e2e.extra_schemes: \['KIVI128'\] already among the e2e schemes"):
        real_settings({"e2e": {"extra_schemes": ["KIVI128"]}}, schemes=["KV"], frontier_schemes=["KIVI128"])


def test_real_e2e_schemes_all_adds_the_frontier_real_schemes_and_rope_and_budgets_name_them():
    from kvasym.real import real_settings

    e2e = real_settings({"e2e": {"rope": {"post": "all", "pre": ["KV"]}, "extra_budgets": {"RKV": [6, 5]},
                                 "draws": 3}}, schemes=["KV", "RKV"], frontier_schemes=["SKLT", "KV"])["e2e"]
    assert e2e["schemes"] == ["KV", "RKV", "SKLT"] and e2e["draws"] == 3
    assert e2e["rope"] == {"post": ["KV", "RKV", "SKLT"], "pre": ["KV"]}
    assert e2e["extra_budgets"] == {"RKV": [5, 6]} and e2e["sensitivity_schemes"] == ["KV", "RKV"]
    assert real_settings({"e2e": {"sensitivity_schemes": "all"}}, schemes=["KV"],
                         frontier_schemes=["SKLT"])["e2e"]["sensitivity_schemes"] == ["KV", "SKLT"]
    # a query-aware variant may have extra budgets (QWF at n = 5 covers SKLT's n = 2 rate)
    assert real_settings({"e2e": {"texts": ["bakery_morning"], "query_aware": ["QWF"],
                                  "extra_budgets": {"QWF": [5], "RKV": [5]}}},
                         schemes=["KV", "RKV"])["e2e"]["extra_budgets"] == {"QWF": [5], "RKV": [5]}
    with pytest.raises(KvasymError, match=r"real.e2e.extra_budgets.QWF: not among the e2e schemes and query-aware "
                                          r"variants \['KV', 'RKV', 'QRKV'\]"):
        real_settings({"e2e": {"texts": ["bakery_morning"], "query_aware": ["QRKV"], "extra_budgets": {"QWF": [5]}}},
                      schemes=["KV", "RKV"])
    for bad, message in (({"rope": {"pre": ["SKLT"]}}, r"real.e2e.rope.pre: \['SKLT'\] not among the e2e schemes"),
                         ({"extra_budgets": {"SKLT": [5]}}, r"real.e2e.extra_budgets.SKLT: not among the e2e"),
                         ({"sensitivity_schemes": ["KQV"]}, r"real.e2e.sensitivity_schemes: \['KQV'\] not among")):
        with pytest.raises(KvasymError, match=message):
            real_settings({"e2e": bad}, schemes=["KV", "RKV"])


def test_real_e2e_calibration_texts_are_disjoint_from_the_evaluated_and_model_sections_name_known_schemes():
    from kvasym.real import real_settings, shipped_texts

    evaluated = ["bakery_morning", "bicycle_repair"]
    e2e = real_settings({"e2e": {"texts": evaluated, "query_aware": ["QWF", "QRKV"]}}, schemes=["KV", "RKV"])["e2e"]
    assert e2e["calibration_texts"] == [t for t in shipped_texts() if t not in evaluated]
    assert real_settings({"e2e": {"texts": evaluated}}, schemes=["KV"])["e2e"]["calibration_texts"] == []
    with pytest.raises(KvasymError, match=r"real.e2e.calibration_texts: \['bicycle_repair'\] are also end-to-end"):
        real_settings({"e2e": {"texts": evaluated, "query_aware": ["QWF"],
                               "calibration_texts": ["bicycle_repair", "river_walk"]}}, schemes=["KV"])
    with pytest.raises(KvasymError, match=r"calibration_texts: \['no_such'\] not among the shipped texts"):
        real_settings({"e2e": {"texts": evaluated, "query_aware": ["QWF"], "calibration_texts": ["no_such"]}},
                      schemes=["KV"])
    with pytest.raises(KvasymError, match="no shipped text is left"):
        real_settings({"e2e": {"query_aware": ["QWF"]}}, schemes=["KV"])
    long = real_settings({"e2e": {"texts": evaluated, "query_aware": ["QWF"],
                                  "long_context": {"lengths": [4096, 1024], "schemes": ["QWF", "RKV"]},
                                  "passkey": {"depths": [1.0, 0.0]}}}, schemes=["KV", "RKV"])["e2e"]
    assert long["long_context"]["lengths"] == [1024, 4096] and long["passkey"]["depths"] == [0.0, 1.0]
    assert long["long_context"]["calibration_windows"] == 0  # the window bases are off by default
    with pytest.raises(KvasymError, match=r"real.e2e.long_context.calibration_windows: 2 calibrates query-aware "
                                          r"bases, but none of the long-context schemes \['RKV'\] is a query-aware "
                                          r"variant \['QWF'\]"):
        real_settings({"e2e": {"texts": evaluated, "query_aware": ["QWF"],
                               "long_context": {"schemes": ["RKV"], "calibration_windows": 2}}}, schemes=["KV", "RKV"])
    with pytest.raises(KvasymError, match=r"real.e2e.passkey.schemes: \['QWF'\] not among the e2e schemes"):
        real_settings({"e2e": {"passkey": {"schemes": ["QWF"]}}}, schemes=["KV", "RKV"])
    with pytest.raises(KvasymError, match="real.e2e.long_context"):
        real_settings({"e2e": {"long_context": {"lengths": [9000]}}}, schemes=["KV"])


def test_greedy_section_names_known_schemes_and_chunks():
    from kvasym.real import real_settings

    from kvasym.real import shipped_texts

    greedy = real_settings({"e2e": {"texts": ["river_walk"], "greedy": {"schemes": ["RKV", "KV"], "budgets": [4, 2]}}},
                           schemes=["KV", "RKV"])["e2e"]["greedy"]
    assert greedy == {"texts": ["river_walk"], "prompt_tokens": 128, "prompts_per_text": 2, "new_tokens": 32,
                      "schemes": ["RKV", "KV"], "budgets": [2, 4], "causal_chunks": {}}
    every = real_settings({"e2e": {"texts": ["river_walk"], "greedy": {"texts": "all"}}}, schemes=["RKV"])
    assert every["e2e"]["greedy"]["texts"] == shipped_texts()
    listed = real_settings({"e2e": {"greedy": {"texts": ["river_walk", "chess_club"]}}}, schemes=["RKV"])
    assert listed["e2e"]["greedy"]["texts"] == ["chess_club", "river_walk"]
    with pytest.raises(KvasymError, match=r"real.e2e.greedy.texts: \['nope'\] not among the shipped texts"):
        real_settings({"e2e": {"greedy": {"texts": ["nope"]}}}, schemes=["RKV"])
    assert real_settings({"e2e": {}}, schemes=["KV"])["e2e"]["greedy"] is None  # off by default
    with pytest.raises(KvasymError, match=r"real.e2e.greedy.schemes: \['QKQV'\] not among the e2e schemes"):
        real_settings({"e2e": {"greedy": {"schemes": ["QKQV"]}}}, schemes=["KV", "RKV"])
    with pytest.raises(KvasymError, match=r"real.e2e.greedy.schemes: \['QWF'\] are query-aware variants"):
        real_settings({"e2e": {"texts": ["bakery_morning"], "query_aware": ["QWF"], "greedy": {"schemes": ["QWF"]}}},
                      schemes=["KV", "RKV"])
    with pytest.raises(KvasymError, match=r"real.e2e.greedy.causal_chunks.KV: not among the greedy schemes"):
        real_settings({"e2e": {"greedy": {"schemes": ["RKV"], "causal_chunks": {"KV": 8}}}}, schemes=["KV", "RKV"])
    with pytest.raises(KvasymError, match="real.e2e.greedy"):
        real_settings({"e2e": {"greedy": {"new_tokens": 0}}}, schemes=["KV"])


# --------------------------------------------------------------------------- query-aware rows, cross-fitted


def _brute_group_moment_sum(capture: Capture, li: int, kv_head: int) -> np.ndarray:
    """sum over the group's query heads and positions of q q^T, by a double loop."""
    total = np.zeros((D, D))
    for g in np.flatnonzero(capture.kv_head_of_query_head == kv_head):
        for t in range(T):
            q = capture.q_post_rope[li, g, t].astype(np.float64)
            total += np.outer(q, q)
    return total


def _named_captures(n: int = 3) -> list[Capture]:
    out = []
    for i in range(n):
        capture = make_capture(seed=10 + i)
        capture.metadata["name"] = "abc"[i]
        out.append(capture)
    return out


def test_capture_moment_sums_and_leave_one_text_out_bases_against_brute_force():
    from kvasym.real.querybases import capture_moment_sums, leave_one_text_out_bases

    captures = _named_captures()
    sums = {c.metadata["name"]: capture_moment_sums(c) for c in captures}
    for capture in captures:
        s, n = sums[capture.metadata["name"]]
        assert n == T and s.shape == (len(LAYERS), HKV, D, D)
        for li in range(len(LAYERS)):
            for h in range(HKV):
                brute = _brute_group_moment_sum(capture, li, h)
                np.testing.assert_allclose(s[li, h], brute, rtol=1e-12, atol=1e-12)
    bases = leave_one_text_out_bases(sums, HQ // HKV, "0" * 64)
    for i, capture in enumerate(captures):
        name = capture.metadata["name"]
        others = [c for c in captures if c is not capture]
        assert bases[name].calibration_texts == tuple(c.metadata["name"] for c in others)
        assert bases[name].n_positions == 2 * T
        for li in range(len(LAYERS)):
            for h in range(HKV):
                m = sum(_brute_group_moment_sum(c, li, h) for c in others) / (2 * T * (HQ // HKV))
                u, lam = bases[name].bases[li, h], bases[name].eigenvalues[li, h]
                np.testing.assert_allclose(u.T @ u, np.eye(D), atol=1e-12)
                np.testing.assert_allclose(m @ u, u * lam, atol=1e-10 * lam[0])  # the eigen-equations
                assert np.all(np.diff(lam) <= 0)


def test_a_texts_cross_fitted_basis_never_sees_its_own_queries():
    """Changing text a's queries leaves a's bases as they were and moves the others'."""
    from kvasym.real.querybases import capture_moment_sums, leave_one_text_out_bases

    captures = _named_captures()
    before = leave_one_text_out_bases({c.metadata["name"]: capture_moment_sums(c) for c in captures}, 2, "0" * 64)
    captures[0].q_post_rope[...] = 3.0 * make_capture(seed=99).q_post_rope
    after = leave_one_text_out_bases({c.metadata["name"]: capture_moment_sums(c) for c in captures}, 2, "0" * 64)
    np.testing.assert_array_equal(after["a"].bases, before["a"].bases)
    np.testing.assert_array_equal(after["a"].eigenvalues, before["a"].eigenvalues)
    for name in ("b", "c"):
        assert not np.allclose(after[name].eigenvalues, before[name].eigenvalues)
    with pytest.raises(KvasymError, match="at least 2 texts"):
        leave_one_text_out_bases({"a": capture_moment_sums(captures[0])}, 2, "0" * 64)


def _identity_bases(n_layers: int = len(LAYERS)):
    from kvasym.real.querybases import QueryBases

    return QueryBases(bases=np.broadcast_to(np.eye(D), (n_layers, HKV, D, D)).copy(),
                      eigenvalues=np.ones((n_layers, HKV, D)), calibration_texts=("x",), n_positions=1,
                      model_sha256="0" * 64)


def test_query_aware_rows_in_the_identity_basis_are_rkv_rows_and_qwf_matches_a_brute_force_kl():
    from kvasym.real.queryaware import quantize_pair_query_aware
    from kvasym.real.querybases import capture_moment_sums, leave_one_text_out_bases

    capture = make_capture(3)
    rkv = evaluate_capture(capture, [get_scheme("RKV")], [2, 4], name="t", base_seed=5, kernel="numpy")
    qrkv = evaluate_capture(capture, [], [2, 4], name="t", base_seed=5, kernel="numpy", query_variants=["QRKV"],
                            query_bases=_identity_bases())
    assert set(qrkv["scheme"]) == {"QRKV"} and set(rkv["scheme"]) == {"RKV"}
    for key in rkv:
        if key != "scheme":
            np.testing.assert_array_equal(qrkv[key], rkv[key], err_msg=key)
    # QWF in data-fitted bases: one row against a softmax by hand over the variant's reconstruction
    others = _named_captures(2)
    bases = leave_one_text_out_bases({"t": capture_moment_sums(capture),
                                      **{c.metadata["name"]: capture_moment_sums(c) for c in others}}, 2, "0" * 64)["t"]
    qwf = evaluate_capture(capture, [], [2], name="t", base_seed=5, kernel="numpy", query_variants=["QWF"],
                           query_bases=bases)
    layer, kv_head, q_head, pos = 3, 0, 1, 9
    li = LAYERS.index(layer)
    k = capture.k_post_rope[li, kv_head].astype(np.float64)
    k_hat, _, bits = quantize_pair_query_aware(k, capture.v[li, kv_head].astype(np.float64), "QWF", 2, bases, li,
                                               kv_head, base_seed=5, identity=("t", layer, kv_head), kernel="numpy",
                                               side16=True)
    expected = brute_kl(capture.q_post_rope[li, q_head, pos].astype(np.float64), k, k_hat, pos)
    row = ((qwf["layer"] == layer) & (qwf["kv_head"] == kv_head) & (qwf["query_head"] == q_head)
           & (qwf["position"] == pos))
    assert row.sum() == 1 and expected > 1e-6
    assert qwf["kl"][row][0] == pytest.approx(expected, rel=1e-9, abs=1e-15)
    for key, value in bits.items():
        assert qwf[key][row][0] == value
    assert bits["k_bits_side16"] < bits["k_bits_side"]  # float16 norms and scales cost fewer bits
    with pytest.raises(KvasymError, match="rope 'post' only"):
        evaluate_capture(capture, [], [2], name="t", base_seed=5, rope="pre", query_variants=["QWF"],
                         query_bases=bases)
    with pytest.raises(KvasymError, match=r"query_bases of shape \(captured layers, kv_heads, head_dim\)"):
        evaluate_capture(capture, [], [2], name="t", base_seed=5, query_variants=["QWF"],
                         query_bases=_identity_bases(1))
    with pytest.raises(KvasymError, match=r"query_variants \['QX'\]"):
        evaluate_capture(capture, [], [2], name="t", base_seed=5, query_variants=["QX"], query_bases=bases)


def test_real_metrics_job_of_a_query_aware_variant_cross_fits_every_text(tmp_path):
    """The job of QWF writes the trial map of every other real scheme's job, and each text's rows
    are those of evaluate_capture in the bases of the other captures."""
    import pandas as pd

    from kvasym.dataset import read_metadata
    from kvasym.real.capture import write_capture
    from kvasym.real.queryaware import variant_scheme
    from kvasym.real.querybases import capture_moment_sums, leave_one_text_out_bases
    from kvasym.stages.real_metrics import run_real_metrics

    captures = _named_captures()
    paths = [str(write_capture(c, tmp_path / f"{c.metadata['name']}.npz")) for c in captures]
    common = {"distribution": "smollm2", "budgets": [2], "sharpness": [1.0], "base_seed": 3, "norm_dtype": "float32",
              "layers": None}
    spec = variant_scheme("QWF").to_dict()
    spec.pop("description", None)
    qwf_slice = {**common, "scheme": {"name": "QWF", **spec},
                 "query_aware": {"variant": "QWF", "calibration": "leave-one-text-out"}}
    run_real_metrics(qwf_slice, paths, {2: str(tmp_path / "qwf.parquet")})
    run_real_metrics({**common, "scheme": {"name": "RKV", **get_scheme("RKV").to_dict()}}, paths,
                     {2: str(tmp_path / "rkv.parquet")})
    assert read_metadata(tmp_path / "qwf.parquet")["trial_map"] == read_metadata(tmp_path / "rkv.parquet")["trial_map"]
    frame = pd.read_parquet(tmp_path / "qwf.parquet")
    assert set(frame["scheme"]) == {"QWF"} and len(frame) == len(pd.read_parquet(tmp_path / "rkv.parquet"))
    # text b's rows, recomputed: bases from a and c only
    b = captures[1]
    bases = leave_one_text_out_bases({c.metadata["name"]: capture_moment_sums(c) for c in captures}, 2, "0" * 64)
    assert bases["b"].calibration_texts == ("a", "c")
    cols = evaluate_capture(b, [], [2], name="b", base_seed=3, kernel="auto", query_variants=["QWF"],
                            query_bases=bases["b"])
    trials_of_b = frame["trial"].between(len(LAYERS) * HKV, 2 * len(LAYERS) * HKV - 1)
    # stored as float32 (kvasym.dataset.METRIC_TYPE): each value the computed one rounded to nearest
    np.testing.assert_array_equal(frame.loc[trials_of_b, "kl"].to_numpy(), cols["kl"].astype(np.float32))
    with pytest.raises(KvasymError, match="post-RoPE rows only"):
        run_real_metrics({**qwf_slice, "distribution": "smollm2-prerope"}, paths, {2: str(tmp_path / "x.parquet")})
    with pytest.raises(KvasymError, match="query_aware.variant 'QRKV'"):
        run_real_metrics({**qwf_slice, "query_aware": {"variant": "QRKV", "calibration": "leave-one-text-out"}},
                         paths, {2: str(tmp_path / "x.parquet")})
    with pytest.raises(KvasymError, match="calibration must be 'leave-one-text-out'"):
        run_real_metrics({**qwf_slice, "query_aware": {"variant": "QWF", "calibration": "fixed"}}, paths,
                         {2: str(tmp_path / "x.parquet")})
    with pytest.raises(KvasymError, match="at least 2 texts"):
        run_real_metrics(qwf_slice, paths[:1], {2: str(tmp_path / "x.parquet")})
    assert not (tmp_path / "x.parquet").exists()
