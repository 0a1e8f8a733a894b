"""End-to-end quantized passes of SmolLM2-135M (kvasym.real.endtoend).

The quantized pass is checked against a brute-force recomputation written here from the model's
definition (float64, one query position at a time, RoPE from its pair formula, softmax and KL
from scipy), on a two-layer truncation of the model and a short sentence; with quantization
switched off it must equal the model's own forward pass bit for bit. Tests that need the model
skip LOUDLY when the optional extra is missing.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy.special import log_softmax, rel_entr, softmax

from kvasym.errors import KvasymError
from kvasym.evaluate import quantize_pair
from kvasym.real.endtoend import (
    ALL_LAYERS,
    BITS_COLUMNS,
    CacheQuantization,
    evaluate_text,
    next_token_metrics,
    quantized_forward,
    reference_pass,
    run_layers,
)
from kvasym.schemes import get_scheme
from test_longtext import real_model_or_skip

SHORT_TEXT = "The old clock in the hall struck nine, and the children ran upstairs."
BASE_SEED = 11


@pytest.fixture(scope="module")
def model():
    """The dequantized model, once for the module; without the real extra every test here skips
    and says so in capitals."""
    return real_model_or_skip("the end-to-end pass was")


@pytest.fixture(scope="module")
def two_layers(model):
    """The model cut after its first two layers (same embedding, output norm and head)."""
    from kvasym.real.gguf_model import GGUFLlama

    config = dataclasses.replace(model.config, n_layers=2)
    return GGUFLlama(config=config, token_embedding=model.token_embedding, output_weight=model.output_weight,
                     output_norm=model.output_norm, layers=model.layers[:2], tokenizer=model.tokenizer,
                     model_path=model.model_path, model_sha256=model.model_sha256, tied_output=model.tied_output,
                     metadata=model.metadata)


# --------------------------------------------------------------------------- brute force


def _rope(x: np.ndarray, base: float) -> np.ndarray:
    """RoPE of rows x (T, d) at positions 0..T-1 from its pair formula: coordinates j and
    j + d/2 rotate by angle t * base^(-2j/d)."""
    n_tokens, dim = x.shape
    half = dim // 2
    out = np.empty_like(x)
    for t in range(n_tokens):
        for j in range(half):
            angle = t * base ** (-2.0 * j / dim)
            c, s = np.cos(angle), np.sin(angle)
            out[t, j] = x[t, j] * c - x[t, j + half] * s
            out[t, j + half] = x[t, j + half] * c + x[t, j] * s
    return out


def _rms(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def brute_force_logits(model, ids: np.ndarray, scheme=None, budget: int = 0, *, rope: str = "post",
                       own: str = "exact", text: str = "t") -> np.ndarray:
    """(T, vocab) float64 logits of the pass in which every layer reads its quantized cache
    (scheme None: the reference), one query position at a time."""
    c = model.config
    f64 = np.float64
    x = model.token_embedding[ids].astype(f64)
    n_tokens = ids.size
    for index, layer in enumerate(model.layers):
        h = _rms(x, layer.attn_norm.astype(f64), c.rms_eps)
        q_all = h @ layer.wq.astype(f64).T
        k_all = h @ layer.wk.astype(f64).T
        v_all = h @ layer.wv.astype(f64).T
        heads_out = np.zeros((n_tokens, c.n_heads * c.head_dim))
        for kv in range(c.n_kv_heads):
            cols = slice(kv * c.head_dim, (kv + 1) * c.head_dim)
            k_pre, v = k_all[:, cols], v_all[:, cols]
            k = _rope(k_pre, c.rope_base)
            k_read, v_read = k, v
            if scheme is not None:
                packed = quantize_pair(k if rope == "post" else k_pre, v, scheme, budget, base_seed=BASE_SEED,
                                       identity=(text, index, kv))
                k_read = packed["K"].dequantize("float64")
                if rope == "pre":
                    k_read = _rope(k_read, c.rope_base)
                v_read = packed["V"].dequantize("float64")
            for g in range(kv * c.group, (kv + 1) * c.group):
                q = _rope(q_all[:, g * c.head_dim:(g + 1) * c.head_dim], c.rope_base)
                for i in range(n_tokens):
                    keys = k_read[: i + 1].copy()
                    values = v_read[: i + 1].copy()
                    if own == "exact":
                        keys[i], values[i] = k[i], v[i]
                    p = softmax(keys @ q[i] / np.sqrt(c.head_dim))
                    heads_out[i, g * c.head_dim:(g + 1) * c.head_dim] = p @ values
        x = x + heads_out @ layer.wo.astype(f64).T
        h = _rms(x, layer.ffn_norm.astype(f64), c.rms_eps)
        gate = h @ layer.w_gate.astype(f64).T
        x = x + ((gate / (1 + np.exp(-gate))) * (h @ layer.w_up.astype(f64).T)) @ layer.w_down.astype(f64).T
    return _rms(x, model.output_norm.astype(f64), c.rms_eps) @ model.output_weight.astype(f64).T


# --------------------------------------------------------------------------- tests


def test_switched_off_equals_the_model_forward_bit_for_bit(model) -> None:
    ids = model.encode(SHORT_TEXT)
    reference = model.forward(ids).hidden
    assert np.array_equal(quantized_forward(model, ids, None), reference)
    # a pass whose quantization names no layer runs the same operations
    nothing = CacheQuantization(get_scheme("KQV"), 2, BASE_SEED, "t", layers=frozenset())
    assert np.array_equal(quantized_forward(model, ids, nothing), reference)
    ref = reference_pass(model, ids)
    measured = next_token_metrics(model, ref, reference)
    assert np.all(measured["kl"] == 0.0) and np.all(measured["top1"] == 1)
    np.testing.assert_allclose(measured["nll"], model.token_nll(ids), rtol=1e-6)
    np.testing.assert_allclose(ref.nll, model.token_nll(ids), rtol=1e-6)


@pytest.mark.parametrize("scheme, budget, rope, own", [
    ("KQV", 2, "post", "exact"), ("QKQV", 3, "pre", "exact"), ("KV", 2, "post", "quantized"),
])
def test_quantized_pass_matches_brute_force(two_layers, scheme: str, budget: int, rope: str, own: str) -> None:
    model = two_layers
    ids = model.encode(SHORT_TEXT)[:12]
    spec = get_scheme(scheme)
    quant = CacheQuantization(spec, budget, BASE_SEED, "t", rope=rope, own=own)
    ref = reference_pass(model, ids)
    measured = next_token_metrics(model, ref, quantized_forward(model, ids, quant))
    z = brute_force_logits(model, ids)[:-1]
    z_hat = brute_force_logits(model, ids, spec, budget, rope=rope, own=own)[:-1]
    kl = rel_entr(softmax(z, axis=-1), softmax(z_hat, axis=-1)).sum(axis=-1)
    nll = -log_softmax(z_hat, axis=-1)[np.arange(ids.size - 1), ids[1:]]
    assert kl.max() > 1e-3  # the quantization does something measurable here
    if own == "exact":
        # position 0 reads only its own (exact) key and value: the reference up to float32 rounding
        assert abs(measured["kl"][0]) < 1e-7
    np.testing.assert_allclose(measured["kl"], kl, rtol=2e-3, atol=2e-6)
    np.testing.assert_allclose(measured["nll"], nll, rtol=1e-4)
    assert np.array_equal(measured["top1"], (z.argmax(-1) == z_hat.argmax(-1)).astype(np.int8))


def test_single_layer_pass_restarts_from_the_reference_exactly(model) -> None:
    ids = model.encode(SHORT_TEXT)
    ref = reference_pass(model, ids)
    layer = 7
    quant = CacheQuantization(get_scheme("QKQV"), 2, BASE_SEED, "t", layers=frozenset({layer}))
    restarted = run_layers(model, ref.frame, ref.residuals[layer], layer, quant)
    assert np.array_equal(restarted, quantized_forward(model, ids, quant))
    assert not np.array_equal(restarted, quantized_forward(model, ids, None))


def test_evaluate_text_columns(two_layers) -> None:
    model = two_layers
    ids = model.encode(SHORT_TEXT)[:10]
    out = evaluate_text(model, ids, [get_scheme("KV"), get_scheme("RKV")], [2, 3], text="t", base_seed=BASE_SEED,
                        ropes=("post", "pre"), sensitivity_budget=2)
    n = ids.size - 1
    passes = 2 * 2 * 2 + 2 * 2  # scheme x budget x rope, then scheme x layer
    assert all(len(v) == passes * n for v in out.values())
    assert set(BITS_COLUMNS) <= set(out)
    assert (out["layer"] == ALL_LAYERS).sum() == 8 * n and set(out["layer"][out["layer"] >= 0]) == {0, 1}
    assert np.all(out["k_bits_payload"][out["budget"] == 3] == 3.0)
    # every pass of the grid, recomputed alone, gives the same rows
    quant = CacheQuantization(get_scheme("RKV"), 3, BASE_SEED, "t", rope="pre")
    alone = next_token_metrics(model, reference_pass(model, ids), quantized_forward(model, ids, quant))
    rows = (out["scheme"] == "RKV") & (out["budget"] == 3) & (out["rope"] == "pre") & (out["layer"] == ALL_LAYERS)
    assert np.array_equal(out["kl"][rows], alone["kl"])


def test_bad_settings_are_refused() -> None:
    with pytest.raises(KvasymError, match="rope"):
        CacheQuantization(get_scheme("KV"), 2, 0, "t", rope="sideways")
    with pytest.raises(KvasymError, match="own"):
        CacheQuantization(get_scheme("KV"), 2, 0, "t", own="maybe")
