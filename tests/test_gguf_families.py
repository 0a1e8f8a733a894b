"""The numpy forward pass on LLaMA-family GGUF files other than SmolLM2 (issue 32, point 1).

Tiny random-weight files (``tests/fixtures/tiny_gguf``, written by
``benchmarks/make_tiny_models.py`` the way llama.cpp's converter writes them) against the logits
Hugging Face transformers computes for the same files (``tests/expected/tiny_models_reference.json``,
its own GGUF reader, Q/K un-permutation and model classes; rebuilt from an HF config where its
GGUF loader ignores a feature, see the fixture's ``_about``). Then the refusals: each names the
offending key, tensor or value in one line, before anything is dequantized.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from kvasym.errors import KvasymError  # noqa: E402
from kvasym.real import gguf_model  # noqa: E402
from kvasym.real.gguf_model import (  # noqa: E402
    SUPPORTED_ARCHITECTURES,
    GGUFLlama,
    LlamaConfig,
    ModelConfig,
    estimate_memory_bytes,
)

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "tiny_gguf"
REFERENCE = json.loads((ROOT / "tests" / "expected" / "tiny_models_reference.json").read_text(encoding="utf-8"))
_spec = importlib.util.spec_from_file_location("make_tiny_models", ROOT / "benchmarks" / "make_tiny_models.py")
make_tiny_models = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = make_tiny_models  # dataclasses resolve the module's annotations through it
_spec.loader.exec_module(make_tiny_models)

CASES = sorted(REFERENCE["cases"])
# Largest |ours - transformers| allowed, relative to the largest |logit| of the case. Measured
# (float32, transformers 5.25 / torch 2.13 CPU): llama_tied_f32 6.8e-5 (logits up to 29.9),
# llama3_untied_f16_q8_0 1.8e-4 (14.3), llama_linear_q4_1 9.7e-5 (31.7), qwen2_biases_q8_0
# 9.8e-5 (35.2), mistral_untied_bf16 4.1e-5 (14.9), gemma3_swa_q5_0 1.5e-5 (70.4): at most 1.3e-5
# of the logit scale. A wrong
# layout or RoPE is off by more than 1 (measured below).
RELATIVE_TOLERANCE = 5e-5
WRONG_BY_AT_LEAST = 1.0


def _logits(model: GGUFLlama) -> np.ndarray:
    ids = np.asarray(REFERENCE["token_ids"], dtype=np.int64)
    return model.logits(model.forward(ids).hidden).astype(np.float64)


def _delta(model: GGUFLlama, name: str) -> float:
    return float(np.abs(_logits(model) - np.asarray(REFERENCE["cases"][name]["logits"])).max())


def _tolerance(name: str) -> float:
    return RELATIVE_TOLERANCE * REFERENCE["cases"][name]["logit_scale"]


@pytest.fixture(scope="module")
def models() -> dict[str, GGUFLlama]:
    return {name: GGUFLlama.load(FIXTURES / name) for name in CASES}


def test_fixture_files_are_small_and_cover_the_families(models) -> None:
    sizes = {p.name: p.stat().st_size for p in FIXTURES.glob("*.gguf")}
    assert set(sizes) == set(CASES) and sum(sizes.values()) < 1.5e6
    assert {m.config.architecture for m in models.values()} == set(SUPPORTED_ARCHITECTURES)
    types = set().union(*(m.metadata["tensor_types"] for m in models.values()))
    assert {"F32", "F16", "BF16", "Q8_0", "Q4_1", "Q5_0"} <= types
    assert {m.tied_output for m in models.values()} == {True, False}
    assert models["qwen2_biases_q8_0.gguf"].layers[0].bq is not None
    assert models["llama3_untied_f16_q8_0.gguf"].config.rope_scaling == "llama3"
    assert models["llama_linear_q4_1.gguf"].config.rope_freq_factors == (4.0,) * 8
    assert models["gemma3_swa_q5_0.gguf"].config.sliding_layers == (0, 1, 2, 3, 4)
    assert LlamaConfig is ModelConfig


@pytest.mark.parametrize("name", CASES)
def test_logits_match_transformers(models, name: str) -> None:
    """Every logit of 12 positions x 300 tokens within 5e-5 of the logit scale of transformers'."""
    model = models[name]
    delta = _delta(model, name)
    assert delta <= _tolerance(name), f"{name}: max |delta logit| {delta:.3g} > {_tolerance(name):.3g}"
    ours, ref = _logits(model), np.asarray(REFERENCE["cases"][name]["logits"])
    np.testing.assert_array_equal(ours.argmax(axis=1), ref.argmax(axis=1))


@pytest.mark.parametrize("name", ["llama3_untied_f16_q8_0.gguf", "llama_linear_q4_1.gguf"])
def test_rope_scaling_is_what_makes_the_match(models, name: str) -> None:
    """Without its frequency divisors the model is far from the (scaled) reference: the check has teeth."""
    model = models[name]
    unscaled = _with_config(model, rope_scaling="none", rope_freq_factors=None)
    assert _delta(unscaled, name) > WRONG_BY_AT_LEAST
    assert REFERENCE["cases"][name]["unscaled_max_abs_delta_logit"] > WRONG_BY_AT_LEAST


def _with_config(model: GGUFLlama, **changes) -> GGUFLlama:
    return model.with_config(**changes)


def test_llama3_factors_follow_hf_formula(models) -> None:
    """The divisors read from rope_freqs.weight equal HF's ``_compute_llama3_parameters`` ratio."""
    config = models["llama3_untied_f16_q8_0.gguf"].config
    index = json.loads((FIXTURES / "models.json").read_text(encoding="utf-8"))
    rope = index["models"]["llama3_untied_f16_q8_0.gguf"]["rope_scaling"]
    dim = config.head_dim
    inv_freq = config.rope_base ** (-np.arange(0, dim, 2) / dim)
    wavelen = 2 * np.pi / inv_freq
    old = rope["original_max_position_embeddings"]
    low, high, factor = rope["low_freq_factor"], rope["high_freq_factor"], rope["factor"]
    smooth = (old / wavelen - low) / (high - low)
    scaled = np.where(wavelen > old / low, inv_freq / factor, inv_freq)
    scaled = np.where((wavelen >= old / high) & (wavelen <= old / low),
                      (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    np.testing.assert_allclose(inv_freq / np.asarray(config.rope_freq_factors), scaled, rtol=1e-6)
    assert len(set(config.rope_freq_factors)) >= 3  # unscaled, smoothed and fully scaled frequencies


def test_qk_permutation_only_for_llama(monkeypatch) -> None:
    """Swapping which architecture is un-permuted breaks the agreement of both (by more than 1)."""
    for name in ("llama_tied_f32.gguf", "qwen2_biases_q8_0.gguf"):
        assert _delta(GGUFLlama.load(FIXTURES / name), name) <= _tolerance(name)
    monkeypatch.setattr(gguf_model, "QK_PERMUTED", {"llama": False, "qwen2": True})
    for name in ("llama_tied_f32.gguf", "qwen2_biases_q8_0.gguf"):
        assert _delta(GGUFLlama.load(FIXTURES / name), name) > WRONG_BY_AT_LEAST


# --------------------------------------------------------------------------- refusals


def _write(tmp_path: Path, **spec) -> Path:
    tiny = make_tiny_models.TinySpec(name="case.gguf", **spec)
    return make_tiny_models.write_tiny_gguf(tiny, tmp_path / tiny.name)


@pytest.fixture
def no_dequantize(monkeypatch):
    """Fail the test if any tensor is dequantized (refusals must come first)."""
    import gguf.quants

    def boom(*args, **kwargs):
        raise AssertionError("dequantize was called before the refusal")

    monkeypatch.setattr(gguf.quants, "dequantize", boom)


def _refused(path: Path, *fragments: str) -> str:
    with pytest.raises(KvasymError) as info:
        GGUFLlama.load(path)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_unsupported_architecture_is_refused(tmp_path, no_dequantize) -> None:
    _refused(_write(tmp_path, arch="mistral3"), "general.architecture is 'mistral3'", "'llama', 'qwen2'")


def test_unsupported_tensor_type_is_refused_before_dequantizing(tmp_path, no_dequantize) -> None:
    _refused(_write(tmp_path, ffn_type="F64"), "'blk.0.ffn_gate.weight'", "type F64", "Q8_0")


@pytest.mark.parametrize("extra, fragments", [
    ({"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0}, ("llama.rope.scaling.type = 'yarn'",)),
    ({"llama.rope.scaling.type": "linear", "llama.rope.scaling.attn_factor": 0.5},
     ("llama.rope.scaling.attn_factor = 0.5",)),
    ({"llama.rope.scaling.type": "none", "llama.rope.scaling.factor": 2.0}, ("llama.rope.scaling.factor = 2.0",)),
    ({"llama.attention.sliding_window": 8}, ("llama.attention.sliding_window = 8", "sliding-window")),
    ({"llama.rope.dimension_count": 8}, ("llama.rope.dimension_count = 8", "partial RoPE")),
])
def test_unsupported_settings_are_refused(tmp_path, no_dequantize, extra, fragments) -> None:
    _refused(_write(tmp_path, extra_kv=extra), *fragments)


def test_sliding_window_beyond_the_context_is_full_attention(tmp_path) -> None:
    """Mistral's 4096-token window never binds in a 256-token context: loaded, same logits."""
    plain = GGUFLlama.load(_write(tmp_path, seed=1))
    windowed_path = tmp_path / "windowed"
    windowed_path.mkdir()
    windowed = GGUFLlama.load(_write(windowed_path, seed=1, extra_kv={"llama.attention.sliding_window": 4096}))
    np.testing.assert_array_equal(_logits(plain), _logits(windowed))


def test_missing_tensor_is_refused(tmp_path) -> None:
    _refused(_write(tmp_path, drop=("blk.1.ffn_down.weight",)), "tensor 'blk.1.ffn_down.weight' is missing")


def test_qwen2_biases_are_optional(tmp_path) -> None:
    model = GGUFLlama.load(_write(tmp_path, arch="qwen2"))
    assert model.config.architecture == "qwen2" and model.layers[0].bq is None
    assert np.isfinite(_logits(model)).all()


def test_memory_check_refuses_before_dequantizing(tmp_path, monkeypatch, no_dequantize) -> None:
    path = FIXTURES / "llama_tied_f32.gguf"
    needed = estimate_memory_bytes(path)
    n_weights = 300 * 64 + 64 + 2 * (2 * 64 + 64 * 64 * 2 + 2 * 32 * 64 + 3 * 96 * 64)
    assert needed >= n_weights * 4 + path.stat().st_size
    assert estimate_memory_bytes(path, np.float64) > needed
    monkeypatch.setattr(gguf_model, "available_memory_bytes", lambda: needed - 1)
    _refused(path, "needs ~", "GiB", "available")


def test_available_memory_is_known() -> None:
    available = gguf_model.available_memory_bytes()
    assert available is None or available > 0


@pytest.mark.parametrize("name", ["llama3_untied_f16_q8_0.gguf", "llama_tied_f32.gguf"])
def test_capture_records_scaled_rope(models, tmp_path, name: str) -> None:
    """A scaled model's capture stores its frequency divisors, so pre-RoPE keys re-rotate exactly
    (``evaluate``'s ``rope='pre'``); an unscaled model's metadata has no such key (digests kept)."""
    from kvasym.real.capture import capture_text, load_capture, write_capture
    from kvasym.real.gguf_model import apply_rope, rope_tables

    model = models[name]
    cap = load_capture(write_capture(capture_text(model, "the cat sat on the mat and the dog ate", name="t"),
                                     tmp_path / "c.npz"))
    assert ("rope_freq_factors" in cap.metadata) == (model.config.rope_freq_factors is not None)
    cos, sin = rope_tables(np.asarray(cap.positions), model.config.head_dim, cap.metadata["rope_base"],
                           np.float64, cap.metadata.get("rope_freq_factors"))
    np.testing.assert_allclose(apply_rope(cap.k_pre_rope.astype(np.float64), cos, sin), cap.k_post_rope,
                               rtol=1e-5, atol=1e-5)
