"""A KV cache's bytes at a length (kvasym.real.cache_memory), counted by hand and by brute force."""

from __future__ import annotations

import pytest

from kvasym.errors import KvasymError
from kvasym.real.cache_memory import cache_memory, global_layers
from kvasym.real.endtoend import full_precision_rows
from kvasym.real.gguf_model import ModelConfig, gemma3_sliding_layers

SMOLLM2 = ModelConfig(n_layers=30, d_model=576, n_heads=9, n_kv_heads=3, head_dim=64, ffn_dim=1536, vocab_size=49152,
                      context_length=8192, rope_base=1e5, rms_eps=1e-5)
GEMMA3 = ModelConfig(n_layers=18, d_model=640, n_heads=4, n_kv_heads=1, head_dim=256, ffn_dim=2048, vocab_size=262144,
                     context_length=32768, rope_base=1e6, rms_eps=1e-6, architecture="gemma3", sliding_window=512,
                     sliding_layers=gemma3_sliding_layers(18), rope_base_sliding=1e4)


def test_float16_caches_by_hand() -> None:
    # SmolLM2 at 4K: 30 layers x 3 heads x 64 x (K and V) x 4096 rows x 2 bytes.
    smol = cache_memory(SMOLLM2, 4096)
    assert smol.bytes == 30 * 3 * 64 * 2 * 4096 * 2 == 94_371_840 and smol.bytes_per_token == 23_040
    # Gemma 3 at 4K: 15 sliding layers hold 512 rows, 3 global ones 4096; 1 head x 256 x 2 x 2 bytes a row.
    gemma = cache_memory(GEMMA3, 4096)
    assert gemma.rows.count(512) == 15 and gemma.rows.count(4096) == 3
    assert gemma.bytes == (15 * 512 + 3 * 4096) * 256 * 2 * 2 == 20_447_232 and gemma.bytes_per_token == 4_992
    assert smol.bits_per_value == gemma.bits_per_value == 16.0
    # Below the window every layer holds every row.
    assert cache_memory(GEMMA3, 300).bytes_per_token == 18 * 256 * 2 * 2


def test_quantized_cache_by_hand() -> None:
    """RKV at n = 2 (2 + 0.1255 bits a coordinate) on Gemma at 4K with a 128-token float16 window."""
    b = 2.0 + 0.12548828125
    mem = cache_memory(GEMMA3, 4096, {"K": b, "V": b}, recent_tokens=128)
    sliding = (512 - 128) * 2 * b + 128 * 2 * 16
    full = (4096 - 128) * 2 * b + 128 * 2 * 16
    assert mem.bits == pytest.approx(256 * (15 * sliding + 3 * full), rel=1e-15)
    # Global layers only: the sliding ones stay float16.
    only = cache_memory(GEMMA3, 4096, {"K": b, "V": b}, quantized_layers=global_layers(GEMMA3))
    assert global_layers(GEMMA3) == (5, 11, 17) and global_layers(SMOLLM2) == tuple(range(30))
    assert only.bits == pytest.approx(256 * (15 * 512 * 2 * 16 + 3 * 4096 * 2 * b), rel=1e-15)
    assert mem.bytes < only.bytes < cache_memory(GEMMA3, 4096).bytes


@pytest.mark.parametrize("length, recent, chunk",
                         [(1, 0, 0), (700, 128, 0), (4096, 0, 32), (5000, 128, 32), (20, 0, 32)])
def test_against_a_layer_by_layer_count(length, recent, chunk) -> None:
    """Layer by layer, rows from the pattern of six, float16 rows from full_precision_rows (K and V bits differ)."""
    bits = {"K": 2.25, "V": 3.5}
    quantized = {0, 4, 5, 9, 17}
    mem = cache_memory(GEMMA3, length, bits, quantized_layers=quantized, recent_tokens=recent, causal_chunk=chunk)
    total = 0.0
    for layer in range(18):
        rows = min(length, 512) if layer % 6 < 5 else length
        f = full_precision_rows(rows, recent, chunk) if layer in quantized else rows
        total += 256 * ((rows - f) * (bits["K"] + bits["V"]) + f * 32)
        assert rows == mem.rows[layer]
    assert mem.bits == pytest.approx(total, rel=1e-14)
    assert mem.values == 2 * 256 * sum(mem.rows)


@pytest.mark.parametrize("call, message", [
    (lambda: cache_memory(GEMMA3, 0), "length must be >= 1"),
    (lambda: cache_memory(GEMMA3, 10, {"K": 2.0}), "missing \\['V'\\]"),
    (lambda: cache_memory(GEMMA3, 10, {"K": 2.0, "V": 2.0}, quantized_layers=[18]), "out of range 0..17"),
])
def test_bad_input_is_named(call, message) -> None:
    with pytest.raises(KvasymError, match=message):
        call()
