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


# --- one teacher-forced pass per arm gives the step-by-step agreement ----------------------------

@pytest.mark.parametrize("name,budget", [("KV", 1), ("KV", 2), ("RKV", 1), ("QKQV", 2), ("KIVI32", 1)])
def test_one_teacher_forced_pass_gives_step_by_step_agreement(model, name, budget) -> None:
    """prompt_agreements' agreement (one quantized pass over prompt + full-precision continuation)
    against the brute-force reference: decoding step by step with the quantized cache."""
    from kvasym.real.greedy import prompt_agreements

    quant = _quant(name, budget, causal_chunk=4 if name == "KIVI32" else 0)
    continuation, rows = prompt_agreements(model, PROMPT, 8, {"arm": quant})
    step_by_step = greedy_agreement(model, PROMPT, 8, quant)
    np.testing.assert_array_equal(continuation, step_by_step.full_precision)
    assert rows[0]["agree"] == step_by_step.agree
    assert rows[0]["n_new"] == 8 and 0.0 <= rows[0]["top1_flip"] <= 1.0 and rows[0]["kl_max"] >= rows[0]["kl_mean"]


def test_the_agreement_measure_sees_a_parting() -> None:
    """On the tiny Llama KV at n = 1 parts before 8 tokens (test_a_coarse_cache_parts...), and
    its teacher-forced flips are then not zero: the pair of measures is not trivially full."""
    from kvasym.real.greedy import prompt_agreements

    llama = GGUFLlama.load(FIXTURES / "llama_tied_f32.gguf")
    passes = {"kv1": _quant("KV", 1), "exact": _quant("KV", 1, layers=frozenset())}
    _, rows = prompt_agreements(llama, PROMPT, 8, passes)
    coarse, exact = rows
    assert coarse["agree"] < 8 and coarse["top1_flip"] > 0 and coarse["kl_mean"] > 1e-4
    assert exact == {"pass": "exact", "n_new": 8, "agree": 8, "kl_mean": pytest.approx(0.0, abs=1e-9),
                     "kl_max": pytest.approx(0.0, abs=1e-9), "top1_flip": 0.0}


def test_teacher_forced_kl_is_the_harness_kl_on_the_same_positions(model) -> None:
    """kl_mean over the continuation's positions equals next_token_metrics of the whole
    sequence's reference pass, restricted to those positions (the harness's own KL)."""
    from kvasym.real.endtoend import next_token_metrics, reference_pass
    from kvasym.real.greedy import prompt_agreements

    quant = _quant("RKV", 2)
    continuation, rows = prompt_agreements(model, PROMPT, 5, {"arm": quant})
    ids = np.concatenate([PROMPT, continuation])
    whole = next_token_metrics(model, reference_pass(model, ids), quantized_forward(model, ids, quant)[:-1])
    tail = whole["kl"][PROMPT.size - 1:]
    assert rows[0]["kl_mean"] == pytest.approx(tail.mean(), rel=1e-5, abs=1e-9)
    assert rows[0]["top1_flip"] == pytest.approx(1 - whole["top1"][PROMPT.size - 1:].mean())


def test_block_statistics_without_a_chunk_are_refused_in_one_pass(model) -> None:
    from kvasym.real.greedy import prompt_agreements

    with pytest.raises(KvasymError, match="pass k: scheme KIVI128 .*causal chunk"):
        prompt_agreements(model, PROMPT, 2, {"k": _quant("KIVI128", 2)})


def test_prompt_windows_start_each_prompt_like_a_sequence(model) -> None:
    from kvasym.real.greedy import prompt_windows
    from kvasym.real.longcontext import bos_id

    ids = np.arange(3, 40, dtype=np.int64)
    windows = prompt_windows(model, ids, 6, 3)
    assert windows.shape == (3, 6)
    expected = ids[:18].reshape(3, 6).copy()
    if bos_id(model) is not None:
        expected[:, 0] = bos_id(model)
    np.testing.assert_array_equal(windows, expected)
    with pytest.raises(KvasymError, match="fewer than 7 prompts of 6"):
        prompt_windows(model, ids, 6, 7)


def test_grid_pairs_every_arm_on_each_prompts_draw() -> None:
    """greedy_grid's rows: one per (text, prompt, scheme, budget); each prompt's arms read the
    draw of its own identity (the grid row equals prompt_agreements called directly)."""
    from kvasym.real.greedy import greedy_grid, prompt_agreements, prompt_text

    llama = GGUFLlama.load(FIXTURES / "llama_tied_f32.gguf")
    texts = {"a": np.arange(5, 25, dtype=np.int64), "b": np.arange(60, 90, dtype=np.int64)}
    frame = greedy_grid(llama, texts, prompt_tokens=5, prompts_per_text=2, n_new=3,
                        schemes=[get_scheme("KV"), get_scheme("KIVI32")], budgets=[1, 2], base_seed=7,
                        causal_chunks={"KIVI32": 4})
    assert len(frame) == 2 * 2 * 2 * 2 and set(frame["causal_chunk"]) == {0, 4}
    assert set(frame["scheme"]) == {"KV", "KIVI32+C4"}  # a streaming pass named as the e2e tables name it
    row = frame[(frame.text == "b") & (frame.prompt == 1) & (frame.scheme == "KV") & (frame.budget == 1)].iloc[0]
    quant = CacheQuantization(scheme=get_scheme("KV"), budget=1, base_seed=7, text=prompt_text("b", 1))
    _, direct = prompt_agreements(llama, texts["b"][5:10], 3, {"x": quant})
    assert row["agree"] == direct[0]["agree"] and row["kl_mean"] == direct[0]["kl_mean"]


def test_summary_by_hand() -> None:
    """Two texts, two prompts each: the agreement's unit is the text (prompts averaged first)."""
    import pandas as pd

    from kvasym.real.greedy import greedy_summary

    frame = pd.DataFrame({"text": ["a", "a", "b", "b"], "prompt": [0, 1, 0, 1], "scheme": "RKV", "budget": 2,
                          "n_new": 8, "agree": [8, 2, 4, 4], "kl_mean": [0.1, 0.3, 0.2, 0.2],
                          "top1_flip": [0.0, 0.5, 0.25, 0.25]})
    row = greedy_summary(frame).iloc[0]
    assert row["agree"] == 4.5 and row["n_texts"] == 2 and row["n_prompts"] == 4
    half_width = 12.706204736174707 * 0.5  # t_{1, 0.975} * s / sqrt(n): s = sd(5, 4) = 1 / sqrt(2), n = 2
    assert row["agree_low"] == pytest.approx(4.5 - half_width) and row["agree_high"] == pytest.approx(4.5 + half_width)
    assert row["agree_median"] == 4.0 and row["full_share"] == 0.25
    assert row["kl_mean"] == pytest.approx(0.2) and row["top1_flip"] == pytest.approx(0.25)
    with pytest.raises(KvasymError, match=r"lacks column\(s\) \['agree'\]"):
        greedy_summary(frame.drop(columns="agree"))
