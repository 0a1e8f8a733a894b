"""Greedy-decode agreement (kvasym.real.greedy) on the tiny Gemma 3 and Llama fixtures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from kvasym.errors import KvasymError  # noqa: E402
from kvasym.real.endtoend import CacheQuantization, quantize_rows, quantized_forward  # noqa: E402
from kvasym.real.gguf_model import GGUFLlama  # noqa: E402
from kvasym.real.greedy import common_prefix_length, greedy_agreement, greedy_continuation  # noqa: E402
from kvasym.schemes import get_scheme  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "tiny_gguf"
PROMPT = np.asarray([17, 290, 71, 100, 5, 256, 33], dtype=np.int64)


@pytest.fixture(scope="module", params=["gemma3_swa_q5_0.gguf", "llama_tied_f32.gguf"])
def model(request) -> GGUFLlama:
    return GGUFLlama.load(FIXTURES / request.param)


def _quant(name: str, budget: int, **kw) -> CacheQuantization:
    return CacheQuantization(scheme=get_scheme(name), budget=budget, base_seed=7, text="prompt", **kw)


def test_common_prefix_length() -> None:
    assert common_prefix_length([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix_length([5], [6]) == 0 and common_prefix_length([1, 2], [1, 2]) == 2


def test_full_precision_continuation_is_the_models_greedy_generate(model) -> None:
    """greedy_generate (the model's own loop over forward()) is the independent reference."""
    text = model.decode(PROMPT)
    assert greedy_continuation(model, model.encode(text), 6).tolist() == model.greedy_generate(text, 6)


def test_no_quantized_layer_agrees_everywhere(model) -> None:
    result = greedy_agreement(model, PROMPT, 5, _quant("RKV", 2, layers=frozenset()))
    assert result.agree == result.n_new == 5
    np.testing.assert_array_equal(result.full_precision, result.quantized)


def test_each_quantized_step_is_the_argmax_of_the_quantized_pass(model) -> None:
    """Step t's token is the argmax of the quantized prefill pass over the prompt and the t tokens
    before it (quantized_forward, the teacher-forced harness's own pass)."""
    quant = _quant("KV", 1)
    tokens = greedy_continuation(model, PROMPT, 4, quant)
    for t in range(4):
        ids = np.concatenate([PROMPT, tokens[:t]])
        hidden = quantized_forward(model, ids, quant)
        assert int(np.argmax(model.logits(hidden[-1:])[0])) == tokens[t]


@pytest.mark.parametrize("name", ["KV", "RKV", "KQV", "QKQV"])
def test_row_wise_schemes_give_an_appended_row_the_value_it_had(name) -> None:
    """Requantizing a longer block leaves the earlier rows' values unchanged (the docstring's
    claim that each step's requantized cache is the streaming cache)."""
    rng = np.random.default_rng(3)
    keys, values = rng.standard_normal((9, 64)), rng.standard_normal((9, 64))
    quant = _quant(name, 3)
    k_long, v_long, _ = quantize_rows(keys, values, quant, 2, 0)
    k_short, v_short, _ = quantize_rows(keys[:6], values[:6], quant, 2, 0)
    np.testing.assert_array_equal(k_long[:6], k_short)
    np.testing.assert_array_equal(v_long[:6], v_short)


def test_block_statistics_without_chunks_are_refused(model) -> None:
    with pytest.raises(KvasymError, match="KIVI128.*causal_chunk"):
        greedy_continuation(model, PROMPT, 2, _quant("KIVI128", 2))
    assert greedy_continuation(model, PROMPT, 2, _quant("KIVI128", 2, causal_chunk=4)).size == 2


@pytest.mark.parametrize("n_new", [0, -1, 2.5, True])
def test_bad_lengths_are_refused(model, n_new) -> None:
    with pytest.raises(KvasymError, match="n_new"):
        greedy_continuation(model, PROMPT, n_new)


def test_prompt_beyond_the_context_is_refused(model) -> None:
    with pytest.raises(KvasymError, match="exceed the model's context length"):
        greedy_continuation(model, np.zeros(model.config.context_length, dtype=np.int64), 1)


def test_a_coarse_cache_parts_from_full_precision() -> None:
    """KV at n = 1 on the tiny Llama: the continuations part at the first token (measured: 0 of 8
    agree; n = 2: 1), so the measure does see a damaged cache."""
    llama = GGUFLlama.load(FIXTURES / "llama_tied_f32.gguf")
    result = greedy_agreement(llama, PROMPT, 8, _quant("KV", 1))
    assert result.agree < 8 and result.quantized[result.agree] != result.full_precision[result.agree]
    again = greedy_agreement(llama, PROMPT, 8, _quant("KV", 1), full_precision=result.full_precision)
    assert again.agree == result.agree  # deterministic seeds; a shared reference changes nothing
    with pytest.raises(KvasymError, match="holds 3 tokens"):
        greedy_agreement(llama, PROMPT, 8, _quant("KV", 1), full_precision=result.full_precision[:3])
