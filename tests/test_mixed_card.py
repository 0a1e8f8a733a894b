"""kvasym.real.mixed (width maps, sensitivity, measured allocation) and kvasym.real.card.

The mixed pass is checked against the end-to-end pass (a uniform map is RKV's all-layer pass
bit for bit) and against a brute-force per-position forward pass in float64 with each (layer,
side, KV head) quantized at its own width; the card's statistics against closed forms.
"""

from __future__ import annotations


import numpy as np
import pandas as pd
import pytest
from scipy.special import softmax

from kvasym.cli import main
from kvasym.errors import KvasymError
from kvasym.evaluate import quantize_pair
from kvasym.real.card import attention_to_first, channel_kurtosis, mean_share, outlier_channels
from kvasym.real.mixed import (
    FLOAT16_WIDTH,
    allocation_map,
    check_widths,
    measured_allocation,
    mixed_layers,
    mixed_pass_rows,
    sensitivity,
    unit_cells,
)
from kvasym.schemes import get_scheme
from test_longtext import real_model_or_skip
from test_real_endtoend import _rms, _rope, first_layers

BASE_SEED = 11


@pytest.fixture(scope="module")
def model():
    return real_model_or_skip("the mixed-precision pass was")


@pytest.fixture(scope="module")
def two_layers(model):
    return first_layers(model, 2)


def brute_force_mixed_logits(model, ids, widths, scheme, text):
    """(T, vocab) float64 logits, one query position at a time; cell (layer, side, head) read
    at its width (0 exact, 16 float16), the own position exact."""
    c = model.config
    f64 = np.float64
    x = model.token_embedding[ids].astype(f64)
    n = ids.size
    for index, layer in enumerate(model.layers):
        h = _rms(x, layer.attn_norm.astype(f64), c.rms_eps)
        q_all, k_all, v_all = (h @ w.astype(f64).T for w in (layer.wq, layer.wk, layer.wv))
        out = np.zeros((n, c.n_heads * c.head_dim))
        for kv in range(c.n_kv_heads):
            cols = slice(kv * c.head_dim, (kv + 1) * c.head_dim)
            k, v = _rope(k_all[:, cols], c.rope_base), v_all[:, cols]
            read = [k.copy(), v.copy()]
            for side in range(2):
                width = int(widths[index, side, kv])
                if width == FLOAT16_WIDTH:
                    read[side] = (k, v)[side].astype(np.float16).astype(f64)
                elif width:
                    packed = quantize_pair(k, v, scheme, width, base_seed=BASE_SEED, identity=(text, index, kv))
                    read[side] = packed["KV"[side]].dequantize("float64")
            for g in range(kv * c.group, (kv + 1) * c.group):
                q = _rope(q_all[:, g * c.head_dim:(g + 1) * c.head_dim], c.rope_base)
                for i in range(n):
                    keys, values = read[0][: i + 1].copy(), read[1][: i + 1].copy()
                    keys[i], values[i] = k[i], v[i]
                    p = softmax(keys @ q[i] / np.sqrt(c.head_dim))
                    out[i, g * c.head_dim:(g + 1) * c.head_dim] = p @ values
        x = x + out @ layer.wo.astype(f64).T
        h = _rms(x, layer.ffn_norm.astype(f64), c.rms_eps)
        gate = h @ layer.w_gate.astype(f64).T
        x = x + ((gate / (1 + np.exp(-gate))) * (h @ layer.w_up.astype(f64).T)) @ layer.w_down.astype(f64).T
    return _rms(x, model.output_norm.astype(f64), c.rms_eps) @ model.output_weight.astype(f64).T


def test_mixed_map_matches_brute_force(two_layers):
    from kvasym.real.endtoend import reference_pass

    model = two_layers
    ids = model.encode("The kettle boiled while the rain kept falling on the roof.")[:14]
    widths = np.array([[[2, 16, 1], [4, 0, 3]], [[0, 3, 2], [1, 2, 16]]], dtype=np.int64)  # (2, 2, 3)
    scheme = get_scheme("RKV")
    ref = reference_pass(model, ids)
    hidden = mixed_layers(model, ref.frame, ref.residuals[0], 0, widths, scheme, base_seed=BASE_SEED, seed_text="t")
    ours = model.logits(hidden).astype(np.float64)
    expected = brute_force_mixed_logits(model, ids, widths, scheme, "t")
    reference = model.logits(model.forward(ids).hidden).astype(np.float64)
    scale = np.max(np.abs(expected))
    assert np.max(np.abs(ours - expected)) < 2e-4 * scale
    # the quantization changed the logits by far more than that tolerance
    assert np.max(np.abs(reference - expected)) > 100 * 2e-4 * scale


def test_uniform_map_is_the_end_to_end_pass_bit_for_bit(two_layers):
    from kvasym.real.endtoend import CacheQuantization, next_token_metrics, reference_pass, run_layers

    model = two_layers
    ids = model.encode("A short test sentence about bicycles and their repair.")[:12]
    ref = reference_pass(model, ids)
    scheme = get_scheme("RKV")
    rows = mixed_pass_rows(model, ref, np.full((2, 2, 3), 3), scheme, text="bike", draw=1, label="RKV", budget=3,
                           base_seed=BASE_SEED)
    quant = CacheQuantization(scheme, 3, BASE_SEED, "bike", draw=1)
    bits: list = []
    expected = next_token_metrics(model, ref, run_layers(model, ref.frame, ref.residuals[0], 0, quant, bits))
    np.testing.assert_array_equal(rows["kl"], expected["kl"])
    np.testing.assert_array_equal(rows["nll"], expected["nll"])
    assert rows["k_bits_payload"][0] == np.mean([b["k_bits_payload"] for b in bits])
    assert rows["v_bits_side"][0] == np.mean([b["v_bits_side"] for b in bits])


def test_sensitivity_restarts_equal_the_whole_pass(two_layers):
    """A unit of layer 1 measured from layer 1's residual equals the whole pass with that map."""
    from kvasym.real.endtoend import next_token_metrics, reference_pass

    model = two_layers
    ids = model.encode("Bread rose slowly in the warm kitchen of the bakery.")[:10]
    ref = reference_pass(model, ids)
    scheme = get_scheme("RKV")
    table = pd.DataFrame(sensitivity(model, ref, scheme, [2, 16], "layer_side_head", text="t", base_seed=BASE_SEED))
    assert len(table) == 2 * 2 * 3 * 2
    row = table[(table.layer == 1) & (table.side == "V") & (table.kv_head == 2) & (table.width == 2)].iloc[0]
    widths = np.zeros((2, 2, 3), dtype=np.int64)
    widths[1, 1, 2] = 2
    hidden = mixed_layers(model, ref.frame, ref.residuals[0], 0, widths, scheme, base_seed=BASE_SEED, seed_text="t")
    whole = next_token_metrics(model, ref, hidden)
    assert row["kl"] == pytest.approx(float(np.mean(whole["kl"])), rel=1e-5, abs=1e-9)
    # payload + a float32 norm per row + one 64-bit block header over the 10 rows of 64 values
    assert row["bits"] == pytest.approx(2.0 + 32 / 64 + 64 / (10 * 64))
    # float16 rows change the model far less than 2-bit ones
    f16 = table[table.width == FLOAT16_WIDTH]["kl"].to_numpy()
    two = table[table.width == 2]["kl"].to_numpy()
    assert np.all(f16 < two) and np.all(table[table.width == FLOAT16_WIDTH]["bits"] == 16.0)


def test_sensitivity_parts_joined_are_the_whole_table_row_for_row(two_layers):
    """Issue 49, point 2: a text's (unit, width) rows split into P round-robin parts (each its own
    job with its own reference pass) and joined by (layer, side, kv_head, width) are the one job's
    table bit for bit, for every P up to the row count (granularity layer_side: 4 units x 3 widths)."""
    from kvasym.real.endtoend import reference_pass
    from kvasym.real.jobparts import join_by_units

    model = two_layers
    ids = model.encode("Bread rose slowly in the warm kitchen of the bakery.")[:10]
    run = dict(scheme=get_scheme("RKV"), widths=[1, 3, 16], granularity="layer_side", text="t", base_seed=BASE_SEED)
    whole = pd.DataFrame(sensitivity(model, reference_pass(model, ids), **run))
    assert len(whole) == 12
    for total in (1, 2, 5, 12):
        parts = [pd.DataFrame(sensitivity(model, reference_pass(model, ids), **run, part=(p, total)))
                 for p in range(total)]
        joined = join_by_units(parts, ["layer", "side", "kv_head", "width"])
        pd.testing.assert_frame_equal(joined, whole, check_exact=True)
    with pytest.raises(KvasymError, match=r"the job has 12 sensitivity rows \(units x widths\), fewer than its 13"):
        sensitivity(model, reference_pass(model, ids), **run, part=(0, 13))


def test_unit_cells_cover_the_map_once():
    for granularity, count in (("layer", 4), ("layer_side", 8), ("layer_side_head", 24)):
        units = unit_cells(4, 3, granularity)
        assert len(units) == count
        np.testing.assert_array_equal(sum(u["cells"].astype(int) for u in units), np.ones((4, 2, 3)))
    with pytest.raises(KvasymError, match="granularity"):
        unit_cells(4, 3, "head")


def _synthetic_table(sensitive=(0, "K")):
    """Two layers x two sides, widths 1-4, KL = s 4^-w with s = 50 for one unit and 1 otherwise."""
    rows = []
    for text in ("a", "b"):
        for layer in range(2):
            for side in ("K", "V"):
                for width in (1, 2, 3, 4):
                    scale = 50.0 if (layer, side) == sensitive else 1.0
                    rows.append({"text": text, "layer": layer, "side": side, "kv_head": -1, "width": width,
                                 "bits": width + 0.5, "kl": scale * 4.0 ** -width, "dnll": 0.0, "top1": 1.0,
                                 "n_positions": 10})
    return pd.DataFrame(rows)


def test_measured_allocation_known_optimum():
    """At the uniform 2-bit rate (2.5 bits), the sensitive unit gets 4 bits and the other three
    share the rest: total 4 x 2 = 8 whole bits -> (4, 2, 1, 1) in some order of the others:
    predicted 50/256 + 1/16 + 2/4 = 0.7578 against the uniform 53/16 = 3.3125; brute force over
    all 4^4 maps confirms the minimum."""
    import itertools

    allocation = measured_allocation(_synthetic_table(), 2, 1, "layer_side", [2])
    widths = allocation_map(allocation, 2, 2, 1)
    assert widths[0, 0, 0] == 4
    assert widths.sum() == 8
    predicted = allocation["predicted_kl"].iloc[0]
    scales = np.array([50.0, 1, 1, 1])
    best = min(sum(s * 4.0 ** -w for s, w in zip(scales, combo))
               for combo in itertools.product(range(1, 5), repeat=4) if sum(combo) <= 8)
    assert predicted == pytest.approx(best)
    assert allocation["uniform_predicted_kl"].iloc[0] == pytest.approx(53 / 16)
    assert allocation["mean_bits"].iloc[0] <= allocation["target_bits"].iloc[0] + 1e-12


def test_tied_allocation_is_the_best_map_with_one_width_per_layer():
    """tie_sides: K and V of a layer share one width. Brute force over the 4^2 tied maps at the
    same target (2.5 bits a value): layer 0 (K sensitive, s = 50) gets 3, layer 1 gets 1
    (total 4 x 2 = 8 whole bits as before), predicted (50 + 1)/64 + 2/4 = 1.297; the free map
    (4, 2, 1, 1), 0.758, is better, since a free map may give the sensitive K alone the bits."""
    import itertools

    table = _synthetic_table()
    tied = measured_allocation(table, 2, 1, "layer_side", [2], tie_sides=True)
    free = measured_allocation(table, 2, 1, "layer_side", [2])
    widths = allocation_map(tied, 2, 2, 1)
    assert (widths[:, 0] == widths[:, 1]).all() and widths[:, 0, 0].tolist() == [3, 1]
    scales = {0: 51.0, 1: 2.0}  # per layer, the sum of its sides' scales
    best = min(sum(scales[layer] * 4.0 ** -w for layer, w in enumerate(combo))
               for combo in itertools.product(range(1, 5), repeat=2) if 2 * sum(combo) <= 8)
    assert tied["predicted_kl"].iloc[0] == pytest.approx(best) == pytest.approx(51 / 64 + 2 / 4)
    assert free["predicted_kl"].iloc[0] < tied["predicted_kl"].iloc[0]
    assert tied["target_bits"].iloc[0] == free["target_bits"].iloc[0] == pytest.approx(2.5)
    assert tied["uniform_predicted_kl"].iloc[0] == free["uniform_predicted_kl"].iloc[0]
    assert tied["mean_bits"].iloc[0] <= tied["target_bits"].iloc[0] + 1e-12
    assert tied["k_mean_width"].iloc[0] == tied["v_mean_width"].iloc[0] == 2.0
    with pytest.raises(KvasymError, match="tie_sides needs granularity layer_side"):
        measured_allocation(table.assign(side="KV").drop_duplicates(["text", "layer", "width"]), 2, 1, "layer", [2],
                            tie_sides=True)


def test_measured_allocation_refusals():
    table = _synthetic_table()
    with pytest.raises(KvasymError, match="not a measured width"):
        measured_allocation(table, 2, 1, "layer_side", [5])
    with pytest.raises(KvasymError, match="not measured in every text"):
        measured_allocation(table.iloc[1:], 2, 1, "layer_side", [2])
    with pytest.raises(KvasymError, match="widths"):
        check_widths(np.full((2, 2, 1), 7.0), (2, 2, 1))
    with pytest.raises(KvasymError, match="holds widths \\[9\\]"):
        check_widths(np.full((2, 2, 1), 9), (2, 2, 1))


def test_card_statistics_closed_forms():
    rng = np.random.default_rng(0)
    constant = np.ones((1, 50, 8))
    assert mean_share(constant)[0] == pytest.approx(1.0)
    half = rng.standard_normal((1, 50, 8))
    symmetric = np.concatenate([half, -half], axis=1)  # mean exactly zero
    assert mean_share(symmetric)[0] == pytest.approx(0.0, abs=1e-15)
    rows = rng.standard_normal((2, 4000, 16))
    rows[0, :, 3] *= 10.0  # one channel 10x the others' RMS
    assert outlier_channels(rows).tolist() == [1, 0]
    signs = rng.choice([-1.0, 1.0], size=(1, 4000, 4))
    assert channel_kurtosis(signs)[0] == pytest.approx(1.0, abs=1e-3)  # +-1: m4 / m2^2 = 1
    assert channel_kurtosis(rng.standard_normal((1, 200_000, 2)))[0] == pytest.approx(3.0, abs=0.05)


def test_attention_to_first_brute_force():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((4, 20, 8))
    k = rng.standard_normal((2, 20, 8))
    ours = attention_to_first(q, k, group=2, first=5)
    for kv in range(2):
        weights = [softmax(k[kv, : i + 1] @ q[h, i] / np.sqrt(8))[0]
                   for h in range(kv * 2, kv * 2 + 2) for i in range(5, 20)]
        assert ours[kv] == pytest.approx(np.mean(weights))


def test_card_cli_refuses_before_loading(tmp_path, capsys):
    out = tmp_path / "card"
    out.mkdir()
    (out / "card.json").write_text("{}")
    assert main(["card", "--out", str(out)]) == 2
    assert "already holds card.json" in capsys.readouterr().err
    assert (out / "card.json").read_text() == "{}"  # the user's file is untouched
    assert main(["card", "--out", str(tmp_path / "x"), "--evaluation-texts", "nope"]) == 2
    assert "--evaluation-texts: ['nope'] are not shipped texts" in capsys.readouterr().err
    assert main(["card", "--out", str(tmp_path / "x"), "--budgets", "5", "--widths", "1", "2"]) == 2
    assert "--budgets [5] are not among --widths" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


TINY_QWEN2 = "tests/fixtures/tiny_gguf/qwen2_biases_q8_0.gguf"


def test_card_cli_on_a_tiny_qwen2_gguf(tmp_path, capsys):
    """The whole card on a tiny random-weight qwen2 file (biases, GQA): every output written,
    the allocation within its budget, the recommendation among the measured options."""
    import json
    from pathlib import Path

    pytest.importorskip("gguf")
    model = Path(__file__).parent.parent / TINY_QWEN2
    out = tmp_path / "card"
    assert main(["card", str(model), "--out", str(out), "--tokens", "20", "--budgets", "2", "--widths", "1", "2", "3",
                 "--granularity", "layer_side_head", "--frontier-schemes", "KV", "--draws", "2"]) == 0
    card = json.loads((out / "card.json").read_text())
    assert card["model"]["architecture"] == "qwen2" and card["model"]["n_kv_heads"] == 2
    allocation = pd.read_parquet(out / "allocation.parquet")
    assert len(allocation) == 2 * 2 * 2  # layers x sides x KV heads, one budget
    assert allocation["mean_bits"].iloc[0] <= allocation["target_bits"].iloc[0] + 1e-12
    assert allocation["predicted_kl"].iloc[0] <= allocation["uniform_predicted_kl"].iloc[0]
    summary = pd.read_parquet(out / "summary.parquet")
    # 2 texts x 2 draws; KV draws no random maps, so it runs once per text
    assert dict(zip(summary["scheme"], summary["n_units"])) == {"RKV": 4, "RKV-MA": 4, "KV": 2}
    rec = card["recommendations"][0]
    options = summary[summary["bits_per_coordinate"] <= rec["rate"] + 1e-6]
    assert rec["kl_mean"] == pytest.approx(options["kl_mean"].min())
    page = (out / "card.html").read_text()
    assert page.count("data:image/png;base64,") == 4 and "qwen2" in page
    assert "n=2 (rate" in capsys.readouterr().out
    # the DAG's path: stage card_page completes the card's measurements with the model's rows of
    # the end-to-end summary (the other schemes) and writes the CLI's card and page, byte for byte
    dag = tmp_path / "dag"
    dag.mkdir()
    measured = {key: value for key, value in card.items() if key not in ("frontier", "recommendations")}
    (dag / "measurements.json").write_text(json.dumps(measured))
    own = summary[summary["scheme"].isin(["RKV", "RKV-MA"])]
    # the card's own table names its model in its provenance, as the card stage writes it
    from kvasym.dataset import provenance, write_frame_atomic

    write_frame_atomic(own, dag / "summary.parquet", provenance({"model": "qwen-tiny"}))
    others = summary[~summary["scheme"].isin(["RKV", "RKV-MA"])]
    pd.concat([others.assign(model="qwen-tiny"), summary.assign(model="other")]).to_parquet(dag / "e2e.parquet")
    args = ["stage", "card_page", "--measurements", str(dag / "measurements.json"),
            "--summary", str(dag / "summary.parquet"), "--comparisons", str(out / "comparisons.parquet"),
            "--e2e-summary", str(dag / "e2e.parquet"),
            "--out-json", str(dag / "card.json"), "--out-html", str(dag / "card.html")]
    assert main(args) == 0
    assert (dag / "card.json").read_text() == (out / "card.json").read_text()
    assert (dag / "card.html").read_text() == page
    # without the other schemes' rows, the frontier and the recommendations are the card's own
    pd.concat([others.assign(model="other")]).to_parquet(dag / "e2e.parquet")
    assert main(args) == 0
    alone = json.loads((dag / "card.json").read_text())
    assert {row["scheme"] for row in alone["frontier"]} == {"RKV", "RKV-MA"}
    assert alone["settings"] == card["settings"]  # frontier_schemes as the measurements give them


def test_card_page_stage_refuses_a_file_that_is_not_a_card(tmp_path, capsys):
    bad = tmp_path / "measurements.json"
    bad.write_text("{not json")
    args = ["--summary", "s.parquet", "--comparisons", "c.parquet", "--e2e-summary", "e.parquet"]
    assert main(["stage", "card_page", "--measurements", str(bad), *args, "--out-json", str(tmp_path / "card.json"),
                 "--out-html", str(tmp_path / "card.html")]) != 0
    assert f"{bad}: not a readable card measurement" in capsys.readouterr().err
    assert not (tmp_path / "card.html").exists() and bad.read_text() == "{not json"
    # the DAG's own measurements, damaged, go aside so that the next run rebuilds them
    ours = tmp_path / "results/real/card/smollm2-135m/measurements.json"
    ours.parent.mkdir(parents=True)
    ours.write_text("{not json")
    assert main(["stage", "card_page", "--measurements", str(ours), *args, "--out-json", str(ours.parent / "card.json"),
                 "--out-html", str(ours.parent / "card.html")]) != 0
    assert not ours.exists() and (ours.parent / ".measurements.json.damaged").read_text() == "{not json"
    assert not (ours.parent / "card.json").exists()


def test_card_config_refusals():
    from kvasym.real import real_settings

    base = {"texts": ["bicycle_repair"], "e2e": {"texts": ["bicycle_repair"]}}
    with pytest.raises(KvasymError, match=r"real.card.calibration_texts: \['bicycle_repair'\] are also end-to-end"):
        real_settings({**base, "card": {"calibration_texts": ["bicycle_repair"]}})
    with pytest.raises(KvasymError, match=r"real.card.budgets: \[4\] are not among real.card.widths"):
        real_settings({**base, "card": {"budgets": [4], "widths": [1, 2]}})
    with pytest.raises(KvasymError, match="real.card needs real.e2e"):
        real_settings({"texts": ["bicycle_repair"], "e2e": "off", "card": {}})
    with pytest.raises(KvasymError, match=r"real.card.calibration_texts: \['nope'\] not among the shipped"):
        real_settings({**base, "card": {"calibration_texts": ["nope"]}})
    card = real_settings({**base, "card": {}})["card"]
    assert card == {"calibration_texts": ["allotment_spring", "chess_club"], "scheme": "RKV", "budgets": [2, 3, 4],
                    "widths": [1, 2, 3, 4, 5, 6], "granularity": "layer_side", "parts": 1}


def test_sensitivity_stage_refuses_an_evaluation_text(tmp_path):
    from kvasym.stages.sensitivity import run_sensitivity

    with pytest.raises(KvasymError, match="calibration text 'bicycle_repair' is also an evaluation text"):
        run_sensitivity({"text": "bicycle_repair", "evaluation_texts": ["bicycle_repair"]}, str(tmp_path / "s.parquet"))
    assert not list(tmp_path.iterdir())


def test_card_stage_runs_the_tied_allocation_beside_the_free_one(two_layers, tmp_path, monkeypatch):
    """Issue 47, point 6: the card stage (granularity layer_side) also runs the allocation with one
    width per layer (K and V tied): its rows are mixed_pass_rows of the tied map, paired with the
    free allocation's (same texts, draws and seeds), compared after the uniform map, and its
    allocation table ties K and V; the uniform and free maps' rows are the same as without it."""
    from kvasym.dataset import provenance, write_frame_atomic
    from kvasym.real import models as models_module
    from kvasym.real.card import allocated_label, evaluation_rows, tied_label
    from kvasym.real.endtoend import reference_pass
    from kvasym.real.querybases import text_token_ids
    from kvasym.stages.card import OUTPUTS, run_card

    model = two_layers
    monkeypatch.setattr(models_module, "slice_model", lambda slice_, path=None: model)
    tokens, widths, budgets = 24, [1, 2, 3, 4], [2, 3]
    calibration = text_token_ids(model, ["allotment_spring"], tokens)["allotment_spring"]
    table = pd.DataFrame(sensitivity(model, reference_pass(model, calibration), get_scheme("RKV"), widths,
                                     "layer_side", text="allotment_spring", base_seed=BASE_SEED))
    sens_path = tmp_path / "sens.parquet"
    write_frame_atomic(table, sens_path, provenance({"text": "allotment_spring"}))
    evaluation = text_token_ids(model, ["bicycle_repair"], tokens)
    slice_ = {"texts": ["bicycle_repair"], "calibration_texts": ["allotment_spring"], "max_tokens": tokens,
              "scheme": {"name": "RKV", **get_scheme("RKV").to_dict()}, "budgets": budgets, "widths": widths,
              "granularity": "layer_side", "draws": 2, "base_seed": BASE_SEED, "norm_dtype": "float32"}
    out = {name: str(tmp_path / f"{name}.out") for name in OUTPUTS}
    run_card(slice_, [str(sens_path)], out)

    free = measured_allocation(table, 2, 3, "layer_side", budgets)
    tied = measured_allocation(table, 2, 3, "layer_side", budgets, tie_sides=True)
    pd.testing.assert_frame_equal(pd.read_parquet(out["allocation_tied"]), tied, check_exact=True)
    for budget in budgets:
        tied_map = allocation_map(tied, budget, 2, 3)
        assert (tied_map[:, 0] == tied_map[:, 1]).all()
    passes = pd.read_parquet(out["passes"])
    assert set(passes["scheme"]) == {"RKV", allocated_label("RKV"), tied_label("RKV")}
    direct = evaluation_rows(model, evaluation, free, get_scheme("RKV"), reference="RKV", budgets=budgets, draws=2,
                             base_seed=BASE_SEED, tied=tied)
    pd.testing.assert_frame_equal(passes.reset_index(drop=True), direct, check_exact=True)
    without = evaluation_rows(model, evaluation, free, get_scheme("RKV"), reference="RKV", budgets=budgets, draws=2,
                              base_seed=BASE_SEED)
    pd.testing.assert_frame_equal(direct[direct["scheme"] != tied_label("RKV")].reset_index(drop=True), without,
                                  check_exact=True)
    comparisons = pd.read_parquet(out["comparisons"])
    assert [tuple(r) for r in comparisons[["scheme_a", "scheme_b"]].drop_duplicates().to_numpy()] == \
        [("RKV-MA", "RKV"), ("RKV-MA", "RKV-MAT")]
    from kvasym.claims import Tables, stat_e2e_allocation

    tables = Tables(*(pd.DataFrame(),) * 4, card_comparisons=comparisons)
    for budget in budgets:
        against_tied = comparisons[(comparisons["scheme_b"] == "RKV-MAT") & (comparisons["budget"] == budget)]
        assert stat_e2e_allocation(tables, {"budget": budget, "against": "tied"}).estimate == \
            pytest.approx(float(against_tied["kl_ratio"].iloc[0]))
        uniform = comparisons[(comparisons["scheme_b"] == "RKV") & (comparisons["budget"] == budget)]
        assert stat_e2e_allocation(tables, {"budget": budget}).estimate == \
            pytest.approx(float(uniform["kl_ratio"].iloc[0]))
