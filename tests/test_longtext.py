"""The long text (pydoc_data's topics) and its windows (kvasym.real.longtext).

The windows are checked against brute force over explicit sets of token positions; the text's
concatenation against its definition on a small mapping and on the interpreter's topics. Tests
that tokenize with the real model are marked slow and skip loudly without the real extra.
"""

from __future__ import annotations

import hashlib
import sys

import numpy as np
import pytest

from kvasym.errors import KvasymError
from kvasym.real import missing_extra_reason
from kvasym.real.longtext import (
    CONTEXT_LENGTH_KEY,
    TOPIC_SEPARATOR,
    WINDOW_LENGTHS,
    check_window_length,
    disjoint_from,
    long_text,
    long_text_ids,
    long_text_source,
    n_windows,
    window,
    window_span,
    windows,
)

#: The token count of the long text under CPython 3.11.7 and SmolLM2's tokenizer (a stream of
#: this length is what the window tests tile).
N_TOKENS = 112_955


def test_concatenation_is_sorted_keys_joined_by_the_separator():
    assert TOPIC_SEPARATOR == "\n\n"
    assert long_text({"b": "beta", "a": "alpha", "c": "gamma"}) == "alpha\n\nbeta\n\ngamma"
    with pytest.raises(KvasymError, match="no pydoc_data topics"):
        long_text({})


def test_the_interpreters_topics_in_sorted_order():
    from pydoc_data.topics import topics

    text = long_text()
    keys = sorted(topics)
    assert text.startswith(topics[keys[0]] + TOPIC_SEPARATOR)
    assert text.endswith(TOPIC_SEPARATOR + topics[keys[-1]])
    assert len(text) == sum(len(v) for v in topics.values()) + len(TOPIC_SEPARATOR) * (len(topics) - 1)
    # every topic appears whole, in sorted-key order, one separator between two
    offset = 0
    for key in keys:
        assert text[offset:offset + len(topics[key])] == topics[key]
        offset += len(topics[key])
        assert text[offset:offset + len(TOPIC_SEPARATOR)] == (TOPIC_SEPARATOR if key != keys[-1] else "")
        offset += len(TOPIC_SEPARATOR)
    source = long_text_source()
    assert source.n_topics == len(topics)
    assert source.sha256 == hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert source.n_words == len(text.split()) > 50_000
    assert "PSF" in source.licence


@pytest.mark.parametrize("length", WINDOW_LENGTHS)
def test_windows_are_disjoint_within_the_text_and_all_of_them(length):
    ids = np.arange(N_TOKENS, dtype=np.int64) * 7 % 49152  # token id != position, known per position
    tokens, spans = windows(ids, length, context_length=8192)
    expected_count = max(k for k in range(N_TOKENS + 1) if k * length <= N_TOKENS)  # brute force
    assert len(spans) == tokens.shape[0] == expected_count == n_windows(N_TOKENS, length)
    seen: set[int] = set()
    for (start, stop), row in zip(spans, tokens):
        assert 0 <= start < stop <= N_TOKENS and stop - start == length
        covered = set(range(start, stop))
        assert not covered & seen  # no token in two windows
        seen |= covered
        np.testing.assert_array_equal(row, np.arange(start, stop) * 7 % 49152)
    assert N_TOKENS - len(seen) < length  # what is left over cannot hold another window
    assert {1024: 110, 2048: 55, 4096: 27, 8192: 13}[length] == len(spans)


def test_one_window_and_a_range_of_them_agree():
    ids = np.arange(10_000, dtype=np.int64)
    tokens, spans = windows(ids, 1024, 8192, count=3, first=2)
    assert spans == [window_span(1024, i) for i in (2, 3, 4)] == [(2048, 3072), (3072, 4096), (4096, 5120)]
    for i, row in zip((2, 3, 4), tokens):
        np.testing.assert_array_equal(window(ids, 1024, i, 8192), row)
    with pytest.raises(KvasymError, match=r"holds windows 0\.\.8"):
        window(ids, 1024, 9, 8192)
    with pytest.raises(KvasymError, match=r"holds windows 0\.\.8"):
        windows(ids, 1024, 8192, count=8, first=2)


def test_a_window_beyond_the_trained_context_is_refused_naming_the_key():
    assert check_window_length(8192, 8192) == 8192
    with pytest.raises(KvasymError, match=rf"window length 16384 exceeds .*context 8192 .*{CONTEXT_LENGTH_KEY}"):
        check_window_length(16384, 8192)
    with pytest.raises(KvasymError, match=CONTEXT_LENGTH_KEY):
        windows(np.arange(20_000), 8193, 8192)
    for bad in (0, -5, 2.5, True):
        with pytest.raises(KvasymError, match="positive integer"):
            check_window_length(bad, 8192)


def test_disjoint_from_against_brute_force():
    gen = np.random.default_rng(3)
    for _ in range(200):
        def spans(count):
            starts = gen.integers(0, 60, size=count)
            return [(int(s), int(s + w)) for s, w in zip(starts, gen.integers(0, 12, size=count))]

        candidates, taken = spans(8), spans(int(gen.integers(0, 5)))
        used = set().union(*(range(a, b) for a, b in taken)) if taken else set()
        expected = [not (set(range(a, b)) & used) for a, b in candidates]
        assert disjoint_from(candidates, taken).tolist() == expected


def test_disjoint_from_across_window_lengths():
    # the calibration set: windows 0 and 1 of 2048; evaluation candidates: windows of 1024
    taken = [window_span(2048, 0), window_span(2048, 1)]
    candidates = [window_span(1024, i) for i in range(6)]
    assert disjoint_from(candidates, taken).tolist() == [False, False, False, False, True, True]
    assert disjoint_from(candidates, []).all()
    with pytest.raises(KvasymError, match="stop < start"):
        disjoint_from([(5, 3)], taken)


# --------------------------------------------------------------------------- the real tokenizer


def real_model_or_skip(unchecked: str):
    """The dequantized real model; without the real extra the test skips and says in capitals
    what was NOT checked (shared with tests/test_passkey.py and tests/test_real_endtoend.py)."""
    why = missing_extra_reason()
    if why is not None:
        print(f"\n*** REAL-MODEL EXTRA MISSING: {why} -- {unchecked} NOT checked ***", file=sys.stderr)
        pytest.skip(f"REAL-MODEL EXTRA MISSING: {why}")
    from kvasym.real.gguf_model import GGUFLlama

    return GGUFLlama.load()


@pytest.fixture(scope="module")
def model():
    return real_model_or_skip("the long text's tokens were")


@pytest.mark.slow
def test_real_tokens_are_deterministic_and_windows_slice_them(model):
    first = long_text_ids(model)
    again = long_text_ids(model)
    np.testing.assert_array_equal(first, again)
    assert first.dtype == np.int64
    if sys.version_info[:2] == (3, 11):
        assert first.size == N_TOKENS  # the count the README quotes (CPython 3.11's topics)
    # the model's trained context comes from the GGUF metadata
    assert model.config.context_length == 8192
    for length in WINDOW_LENGTHS:
        tokens, spans = windows(first, length, model.config.context_length)
        assert tokens.shape == (first.size // length, length)
        np.testing.assert_array_equal(tokens[-1], first[spans[-1][0]:spans[-1][1]])
    with pytest.raises(KvasymError, match=CONTEXT_LENGTH_KEY):
        windows(first, 2 * model.config.context_length, model.config.context_length)
    # the text decodes back from its tokens (a slice of one stream, nothing lost)
    assert model.decode(first) == long_text()
