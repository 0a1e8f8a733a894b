"""The passkey task (kvasym.real.passkey): generator, seeds and scorer.

The generator is checked with a character-level tokenizer (one token per character, so every
count can be recomputed from the strings) and, marked slow, with the real model's tokenizer.
The scorer is checked against brute-force greedy decoding (one full forward pass per generated
token, no teacher forcing) on a tiny random-weight LLaMA run by the project's own forward pass,
and against hand-made logits whose argmax is known.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from kvasym.errors import KvasymError
from kvasym.real.gguf_model import GGUFLlama, LayerWeights, LlamaConfig
from kvasym.real.passkey import (
    ANSWER_DIGITS,
    DEPTHS,
    FILLER_SENTENCES,
    INTRO,
    KEY_SENTENCE,
    QUESTION,
    PasskeyTrial,
    answer_logits,
    make_trial,
    passkey_number,
    run_trial,
    score_answer,
)
from kvasym.seeds import rng
from test_longtext import real_model_or_skip

BASE_SEED = 11


class CharModel:
    """One token per character (token id = code point): every length is a string length."""

    config = SimpleNamespace(context_length=8192)

    @staticmethod
    def encode(text: str) -> np.ndarray:
        return np.asarray([ord(c) for c in text], dtype=np.int64)

    @staticmethod
    def decode(ids) -> str:
        return "".join(chr(int(i)) for i in ids)


# --------------------------------------------------------------------------- generator


@pytest.mark.parametrize("length", [300, 1024, 2048, 4096, 8192])
@pytest.mark.parametrize("depth", DEPTHS + (0.1, 0.9))
def test_prompt_has_the_asked_length_and_the_key_at_the_asked_depth(length, depth):
    model = CharModel()
    trial = make_trial(model, length, depth, 0, base_seed=BASE_SEED)
    key_text = KEY_SENTENCE.format(key=trial.key)
    text = model.decode(trial.prompt_ids)
    # exact length: prompt + five answer digits fill the asked length
    assert trial.prompt_ids.size + trial.answer_ids.size == length
    assert model.decode(trial.answer_ids) == str(trial.key) and len(str(trial.key)) == ANSWER_DIGITS
    # layout: instruction, filler, key sentence, filler, question
    assert text.startswith(INTRO) and text.endswith(QUESTION)
    assert text[trial.key_position:trial.key_position + len(key_text)] == key_text
    assert text.count(str(trial.key)) == 2
    filler = text[len(INTRO):trial.key_position] + text[trial.key_position + len(key_text):-len(QUESTION)]
    assert len(filler) == trial.filler_tokens == length - ANSWER_DIGITS - len(INTRO) - len(key_text) - len(QUESTION)
    cycle = "".join(FILLER_SENTENCES)
    assert filler == (cycle * (len(filler) // len(cycle) + 1))[:len(filler)]  # the sentences repeated, cut at the end
    # depth: the key starts within half a filler sentence of depth * F tokens into the filler ...
    longest = max(len(s) for s in FILLER_SENTENCES)
    assert abs(trial.key_position - (len(INTRO) + depth * trial.filler_tokens)) <= longest / 2
    # ... at a sentence boundary of the filler (or at its end) ...
    before = text[len(INTRO):trial.key_position]
    assert before == "" or before.endswith(".") or trial.key_position - len(INTRO) == trial.filler_tokens
    # ... and so within one filler sentence plus the instruction and question of depth * length
    assert abs(trial.key_position - depth * length) <= longest + len(INTRO) + len(QUESTION)


def test_depth_order_and_ends():
    model = CharModel()
    positions = [make_trial(model, 2048, d, 0, base_seed=BASE_SEED).key_position for d in DEPTHS]
    assert positions == sorted(positions)
    first = make_trial(model, 2048, 0.0, 0, base_seed=BASE_SEED)
    last = make_trial(model, 2048, 1.0, 0, base_seed=BASE_SEED)
    assert first.key_position == len(INTRO)  # straight after the instruction
    assert last.key_position + last.key_tokens == last.prompt_ids.size - len(QUESTION)  # straight before the question


def test_the_number_comes_from_the_trials_identity():
    model = CharModel()
    identities = [(length, depth, trial) for length in (1024, 2048) for depth in DEPTHS for trial in range(6)]
    keys = {ident: make_trial(model, *ident, base_seed=BASE_SEED).key for ident in identities}
    # the same identity gives the same number, whatever order the trials are made in
    again = {ident: make_trial(model, *ident, base_seed=BASE_SEED).key for ident in reversed(identities)}
    assert again == keys
    # ... namely the identity's own stream (kvasym.seeds), uniform on the five-digit numbers
    for (length, depth, trial), key in keys.items():
        assert key == int(rng(BASE_SEED, "passkey", length, repr(float(depth)), trial).integers(10000, 100000))
        assert 10000 <= key <= 99999
    # different identities differ (60 draws from 90,000 numbers: a collision is a bug here)
    assert len(set(keys.values())) == len(keys)
    assert passkey_number(BASE_SEED + 1, 1024, 0.5, 0) != passkey_number(BASE_SEED, 1024, 0.5, 0)
    # an int depth and its float are one identity
    assert passkey_number(BASE_SEED, 1024, 1, 0) == passkey_number(BASE_SEED, 1024, 1.0, 0)


def test_bad_trials_are_refused_naming_the_value():
    model = CharModel()
    with pytest.raises(KvasymError, match=r"8193 .*llama.context_length|llama.context_length.*8193"):
        make_trial(model, 8193, 0.5, 0, base_seed=BASE_SEED)
    with pytest.raises(KvasymError, match="depth must be in"):
        make_trial(model, 1024, 1.5, 0, base_seed=BASE_SEED)
    with pytest.raises(KvasymError, match="trial must be a non-negative integer"):
        make_trial(model, 1024, 0.5, -1, base_seed=BASE_SEED)
    with pytest.raises(KvasymError, match="too short"):
        make_trial(model, 100, 0.5, 0, base_seed=BASE_SEED)


# --------------------------------------------------------------------------- scorer


def test_scorer_on_known_logits():
    answer = np.array([3, 1, 4, 1, 5])
    logits = np.zeros((5, 8))
    logits[np.arange(5), answer] = 1.0
    right = score_answer(logits, answer)
    assert right.correct and right.n_correct_prefix == 5
    np.testing.assert_array_equal(right.greedy_ids, answer)
    # first token right, second wrong: not correct, greedy decoding stops after one
    wrong = logits.copy()
    wrong[1, 7] = 2.0
    second = score_answer(wrong, answer)
    assert not second.correct and second.n_correct_prefix == 1 and second.greedy_ids[1] == 7
    # only the last wrong
    last = logits.copy()
    last[4, 0] = 5.0
    assert score_answer(last, answer).n_correct_prefix == 4
    # a tie goes to the lowest token id (numpy.argmax)
    tie = logits.copy()
    tie[0, 0] = 1.0  # ties token 3 at position 0, and 0 < 3
    assert score_answer(tie, answer).n_correct_prefix == 0
    with pytest.raises(KvasymError, match="n_answer"):
        score_answer(logits[:4], answer)


def _tiny_model(seed: int = 0) -> GGUFLlama:
    """A 2-layer LLaMA with random weights (vocab 23, head_dim 4, GQA 4 query heads over 2 KV heads)."""
    config = LlamaConfig(n_layers=2, d_model=16, n_heads=4, n_kv_heads=2, head_dim=4, ffn_dim=24, vocab_size=23,
                         context_length=64, rope_base=10000.0, rms_eps=1e-5)
    gen = np.random.default_rng(seed)

    def w(*shape):
        return gen.normal(0.0, 0.7, size=shape).astype(np.float32)

    layers = [LayerWeights(attn_norm=1 + w(16) / 4, wq=w(16, 16), wk=w(8, 16), wv=w(8, 16), wo=w(16, 16),
                           ffn_norm=1 + w(16) / 4, w_gate=w(24, 16), w_up=w(24, 16), w_down=w(16, 24))
              for _ in range(config.n_layers)]
    embedding = w(23, 16) * 2
    return GGUFLlama(config=config, token_embedding=embedding, output_weight=embedding, output_norm=1 + w(16) / 4,
                     layers=layers, tokenizer=None, model_path=Path("tiny"), model_sha256="", tied_output=True,
                     metadata={})


def _greedy_decode(model: GGUFLlama, prompt: np.ndarray, n_new: int) -> list[int]:
    """Brute force: one full forward pass per generated token, argmax of the last position."""
    ids = [int(t) for t in prompt]
    new = []
    for _ in range(n_new):
        logits = model.logits(model.forward(np.asarray(ids, dtype=np.int64)).hidden)[-1]
        new.append(int(np.argmax(logits)))
        ids.append(new[-1])
    return new


def _trial(prompt: np.ndarray, answer: list[int]) -> PasskeyTrial:
    return PasskeyTrial(length=prompt.size + len(answer), depth=0.5, trial=0, key=0, prompt_ids=prompt,
                        answer_ids=np.asarray(answer, dtype=np.int64), key_position=0, key_tokens=0,
                        filler_tokens=0, filler_start=0)


def test_scorer_equals_brute_force_greedy_decoding_on_a_tiny_model():
    model = _tiny_model()
    gen = np.random.default_rng(5)
    outcomes = set()
    for case in range(12):
        prompt = gen.integers(0, 23, size=int(gen.integers(3, 30))).astype(np.int64)
        greedy = _greedy_decode(model, prompt, ANSWER_DIGITS)
        # answers that agree with greedy decoding for the first `keep` tokens, then differ
        keep = case % (ANSWER_DIGITS + 1)
        answer = list(greedy[:keep]) + [int(t) for t in gen.integers(0, 23, size=ANSWER_DIGITS - keep)]
        if keep < ANSWER_DIGITS and answer[keep] == greedy[keep]:
            answer[keep] = (answer[keep] + 1) % 23
        score = run_trial(model, _trial(prompt, answer))
        # the brute-force verdict: greedy decoding produces the answer exactly; the prefix where it stops
        brute_prefix = next((j for j in range(ANSWER_DIGITS) if greedy[j] != answer[j]), ANSWER_DIGITS)
        assert score.correct == (greedy == answer)
        assert score.n_correct_prefix == brute_prefix == keep
        # up to and including the first wrong position, teacher forcing saw greedy decoding's own prefix
        upto = min(keep + 1, ANSWER_DIGITS)
        np.testing.assert_array_equal(score.greedy_ids[:upto], greedy[:upto])
        outcomes.add(keep)
    assert outcomes == set(range(ANSWER_DIGITS + 1))  # includes first right, second wrong (keep = 1)


def test_answer_logits_are_the_teacher_forced_rows_of_one_pass():
    model = _tiny_model(1)
    prompt = np.arange(10, dtype=np.int64) % 23
    answer = [4, 5, 6, 7, 8]
    trial = _trial(prompt, answer)
    full = model.logits(model.forward(np.concatenate([prompt, answer])).hidden)
    np.testing.assert_allclose(answer_logits(model, trial), full[9:14], rtol=1e-5, atol=1e-5)
    assert trial.scored_ids.size == trial.length - 1


# --------------------------------------------------------------------------- the real tokenizer


@pytest.fixture(scope="module")
def model():
    return real_model_or_skip("the passkey prompts were")


@pytest.mark.slow
@pytest.mark.parametrize("depth", DEPTHS)
def test_real_prompts(model, depth):
    length = 1024
    trial = make_trial(model, length, depth, 2, base_seed=BASE_SEED)
    assert trial.prompt_ids.size + trial.answer_ids.size == length
    # the prompt's tokens are the tokenization of its own text followed by the key: the model
    # reads what a tokenizer would give it for that string
    text = model.decode(trial.prompt_ids) + str(trial.key)
    np.testing.assert_array_equal(model.encode(text), np.concatenate([trial.prompt_ids, trial.answer_ids]))
    assert model.decode(trial.answer_ids) == str(trial.key)
    assert model.decode(trial.prompt_ids[-1:]) == " "  # the space before the digits ends the prompt
    key_ids = trial.prompt_ids[trial.key_position:trial.key_position + trial.key_tokens]
    assert model.decode(key_ids) == KEY_SENTENCE.format(key=trial.key)
    longest = max(len(model.encode(s)) for s in FILLER_SENTENCES)
    assert abs(trial.key_position - (trial.filler_start + depth * trial.filler_tokens)) <= longest / 2
    with pytest.raises(KvasymError, match="llama.context_length"):
        make_trial(model, model.config.context_length + 1, depth, 0, base_seed=BASE_SEED)
