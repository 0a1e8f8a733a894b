"""kvasym.real.gguf_tokenizer against transformers' GGUF tokenizer builder (an independent
implementation), on tiny tokenizer-only GGUF files of five families.

The files (tests/fixtures/tiny_tokenizers/*.gguf) and the reference ids
(tests/expected/tokenizer_reference.json) are written by benchmarks/make_tokenizer_fixtures.py;
where transformers departs from llama.cpp the fixture also holds ids under llama.cpp's rule
(``llama_cpp``), which kvasym follows. Each vocabulary was trained with another family's split,
so a builder using the wrong pre-tokenizer gets other ids (checked below).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

import gguf  # noqa: E402

from kvasym.errors import KvasymError  # noqa: E402
from kvasym.real.gguf_tokenizer import build_tokenizer, merges_from_scores  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "tiny_tokenizers"
REFERENCE = json.loads((Path(__file__).parent / "expected" / "tokenizer_reference.json").read_text(encoding="utf-8"))
PROBES: list[str] = REFERENCE["probes"]
FAMILIES = list(REFERENCE["families"])
BYTE_LEVEL = {"smollm": "smollm", "gpt2": "gpt-2", "llama-bpe": "llama-bpe", "qwen2": "qwen2"}
CONTROL_PROBE = PROBES.index("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")


class _Field:
    def __init__(self, value: Any) -> None:
        self.value = value
        self.data = value if isinstance(value, list) else [value]

    def contents(self) -> Any:
        return self.value


class _Reader:
    """A GGUF reader's fields with some replaced (value) or removed (None)."""

    def __init__(self, reader: Any, **changes: Any) -> None:
        self.fields = dict(reader.fields)
        for key, value in changes.items():
            key = "tokenizer.ggml." + key
            if value is None:
                self.fields.pop(key, None)
            else:
                self.fields[key] = _Field(value)


def _path(family: str) -> Path:
    return FIXTURES / REFERENCE["families"][family]["file"]


@pytest.fixture(scope="module")
def readers() -> dict[str, Any]:
    return {family: gguf.GGUFReader(_path(family)) for family in FAMILIES}


def _expected(family: str) -> list[list[int]]:
    entry = REFERENCE["families"][family]
    return entry.get("llama_cpp", entry["transformers"])


def test_fixture_files_are_small_and_cover_the_families() -> None:
    assert set(FAMILIES) == {"smollm", "gpt2", "llama-bpe", "qwen2", "llama"}
    assert sum(p.stat().st_size for p in FIXTURES.glob("*.gguf")) < 300_000
    assert len(PROBES) >= 20


@pytest.mark.parametrize("family", ["smollm", "gpt2", "llama-bpe", "qwen2", "llama"])
def test_ids_equal_the_reference(family: str, readers) -> None:
    tok = build_tokenizer(readers[family], _path(family))
    expected = _expected(family)
    got = [tok.encode(text) for text in PROBES]
    assert all(ids.dtype == np.int64 for ids in got)
    wrong = [i for i, ids in enumerate(got) if ids.tolist() != expected[i]]
    first = wrong[0] if wrong else None
    assert not wrong, f"{family}: probes {wrong} differ, first {PROBES[first]!r}: {got[first]} != {expected[first]}"
    assert tok.vocab_size == len(readers[family].fields["tokenizer.ggml.tokens"].data)


@pytest.mark.parametrize("family", ["smollm", "gpt2", "llama-bpe", "qwen2", "llama"])
def test_only_the_documented_probes_depart_from_transformers(family: str) -> None:
    """Where no llama.cpp rule is recorded our ids are transformers'; where one is, the probes on
    which it matters are the ones the rule is about (digits, a leading space or a control token,
    the merge-less token)."""
    entry = REFERENCE["families"][family]
    if "llama_cpp" not in entry:
        return
    differs = entry["differs_at"]
    assert differs, f"{family}: the recorded llama.cpp rule never matters, the fixture does not test it"
    for i in differs:
        text = PROBES[i]
        if family == "smollm":
            assert any(c.isdigit() for c in text)
        elif family == "llama":
            assert text[:1].isspace() or "<|im_" in text
        else:
            assert "zyzzyva" in text


@pytest.mark.parametrize("family", ["smollm", "gpt2", "llama-bpe", "qwen2", "llama"])
def test_decode_inverts_encode(family: str, readers) -> None:
    tok = build_tokenizer(readers[family], _path(family))
    for i, text in enumerate(PROBES):
        if family == "llama" and i == CONTROL_PROBE:
            # llama.cpp puts a space after each control token: it comes back in the text
            assert tok.decode(tok.encode(text)) == text.replace("|>", "|> ")
            continue
        assert tok.decode(tok.encode(text)) == text, (family, text)


@pytest.mark.parametrize("family", ["llama-bpe", "llama"])
def test_bos_is_prepended_when_the_file_says_so(family: str, readers) -> None:
    tok = build_tokenizer(readers[family], _path(family))
    assert tok.add_bos and tok.encode("")[0] == tok.bos_token_id and len(tok.encode("")) == 1
    assert tok.id_to_token(tok.bos_token_id) in ("<s>", "<|begin_of_text|>")
    assert f"BOS {tok.bos_token_id} prepended" in tok.description()
    off = build_tokenizer(_Reader(readers[family], add_bos_token=False), _path(family))
    assert off.encode("Hello world").tolist() == tok.encode("Hello world").tolist()[1:]
    assert "no BOS" in off.description()
    eos = build_tokenizer(_Reader(readers[family], add_eos_token=True), _path(family))
    assert eos.encode("Hello").tolist() == [*tok.encode("Hello").tolist(), eos.eos_token_id]
    assert eos.decode(eos.encode("Hello")) == "Hello"


@pytest.mark.parametrize("family", ["smollm", "gpt2", "qwen2"])
def test_no_bos_when_the_file_says_so(family: str, readers) -> None:
    tok = build_tokenizer(readers[family], _path(family))
    assert not tok.add_bos and tok.encode("").tolist() == []
    assert tok.description().endswith("; no BOS")


def test_llama_cpp_defaults_apply_without_the_add_bos_key(readers) -> None:
    """llama.cpp adds BOS for SentencePiece and llama-bpe files that do not say, not for others."""
    assert build_tokenizer(_Reader(readers["llama"], add_bos_token=None), _path("llama")).add_bos
    assert build_tokenizer(_Reader(readers["llama-bpe"], add_bos_token=None), _path("llama-bpe")).add_bos
    assert not build_tokenizer(_Reader(readers["qwen2"], add_bos_token=None), _path("qwen2")).add_bos


def test_control_and_user_defined_tokens_stay_whole(readers) -> None:
    for family in FAMILIES:
        tok = build_tokenizer(readers[family], _path(family))
        ids = tok.encode("<|im_start|>hi").tolist()
        assert tok.token_to_id("<|im_start|>") in ids, family
    qwen = build_tokenizer(readers["qwen2"], _path("qwen2"))
    assert qwen.token_to_id("<think>") in qwen.encode("a <think>b").tolist()


@pytest.mark.parametrize("family", ["smollm", "gpt2", "llama-bpe", "qwen2"])
def test_another_pre_tokenizer_gives_other_ids(family: str, readers) -> None:
    """The fixtures would catch a builder that used the wrong split for a family."""
    expected = _expected(family)
    for other, pre in BYTE_LEVEL.items():
        if other == family:
            continue
        tok = build_tokenizer(_Reader(readers[family], pre=pre, add_bos_token=family == "llama-bpe"), _path(family))
        assert any(tok.encode(t).tolist() != expected[i] for i, t in enumerate(PROBES)), (family, pre)


def test_the_sentencepiece_space_prefix_matters(readers) -> None:
    """Without the prefix (or with it only at the start) the llama fixture's ids change."""
    expected = _expected("llama")
    tok = build_tokenizer(_Reader(readers["llama"], add_space_prefix=False), _path("llama"))
    assert any(tok.encode(t).tolist() != expected[i] for i, t in enumerate(PROBES))
    assert REFERENCE["families"]["llama"]["transformers"] != expected


def test_merges_from_scores_rank_by_the_merged_tokens_score() -> None:
    tokens = ["a", "b", "c", "ab", "bc", "abc"]
    scores = [0.0, 0.0, 0.0, -2.0, -1.0, -3.0]
    assert merges_from_scores(tokens, scores) == [("b", "c"), ("a", "b"), ("a", "bc"), ("ab", "c")]


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"model": "bert"}, "tokenizer.ggml.model='bert'"),
        ({"model": "t5"}, "tokenizer.ggml.model='t5'"),
        ({"model": "rwkv"}, "tokenizer.ggml.model='rwkv'"),
        ({"pre": "deepseek-llm"}, "tokenizer.ggml.pre='deepseek-llm'"),
        ({"pre": "default"}, "tokenizer.ggml.pre='default'"),
        ({"pre": None}, "'tokenizer.ggml.pre' is missing"),
        ({"model": None}, "'tokenizer.ggml.model' is missing"),
        ({"merges": None}, "'tokenizer.ggml.merges' is missing"),
        ({"tokens": None}, "'tokenizer.ggml.tokens' is missing"),
        ({"bos_token_id": None, "add_bos_token": True}, "tokenizer.ggml.bos_token_id is missing"),
    ],
)
def test_refusals_name_the_key_and_value(changes: dict, needle: str, readers) -> None:
    with pytest.raises(KvasymError) as info:
        build_tokenizer(_Reader(readers["qwen2"], **changes), _path("qwen2"))
    message = str(info.value)
    assert needle in message and "\n" not in message
    if "supported" in message:
        assert "smollm" in message or "gpt2, llama" in message


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"pre": "llama-bpe"}, "tokenizer.ggml.pre='llama-bpe'"),
        ({"scores": None}, "'tokenizer.ggml.scores' is missing"),
    ],
)
def test_sentencepiece_refusals(changes: dict, needle: str, readers) -> None:
    with pytest.raises(KvasymError) as info:
        build_tokenizer(_Reader(readers["llama"], **changes), _path("llama"))
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_gguf_llama_encodes_with_the_files_bos_policy(readers) -> None:
    """GGUFLlama.encode / decode / tokenizer_description go through the GGUF's tokenizer."""
    from kvasym.real.gguf_model import GGUFLlama

    for family in ("llama", "smollm"):
        tok = build_tokenizer(readers[family], _path(family))
        model = GGUFLlama.__new__(GGUFLlama)
        model.tokenizer = tok
        ids = model.encode("Hello world")
        assert ids.dtype == np.int64 and ids.tolist() == tok.encode("Hello world").tolist()
        assert (ids[0] == tok.bos_token_id) == (family == "llama")
        assert model.decode(ids) == "Hello world"
        assert model.tokenizer_description() == tok.description()


def test_smollm2_tokenizer_is_unchanged() -> None:
    """SmolLM2's real file: no BOS, one digit per token, and the description capture metadata
    has always held (same words, same numbers)."""
    from kvasym.real import RealExtraMissing
    from kvasym.real.gguf_model import find_model_file

    try:
        path = find_model_file()
    except RealExtraMissing as exc:
        pytest.skip(str(exc))
    import tokenizers

    tok = build_tokenizer(gguf.GGUFReader(path), path)
    assert tok.description() == (
        "GGUF-embedded byte-level BPE (tokenizer.ggml.model=gpt2, pre=smollm, vocab 49152, 48900 merges) "
        f"built with tokenizers {tokenizers.__version__}; no BOS"
    )
    assert [tok.id_to_token(i) for i in tok.encode(" 2025 I'm")] == ["Ġ", "2", "0", "2", "5", "ĠI", "'m"]
    assert tok.encode("<|im_start|>").tolist() == [1] and tok.bos_token_id == 1 and not tok.add_bos


def _spm_by_scores(tokens: list[str], scores: list[float], control: set[str], text: str) -> list[int]:
    """llama.cpp's SentencePiece merger, written out: spaces become '▁', a '▁' goes before the
    text and after each control token, then the adjacent pair whose join is the best-scored token
    is joined (leftmost on ties) until none is left; a symbol that is no token goes out as bytes."""
    index = {t: i for i, t in enumerate(tokens)}
    out: list[int] = []
    pieces = [text]
    for token in control:
        pieces = [part for piece in pieces for part in _split_keep(piece, token)]
    for piece in pieces:
        if piece in control:
            out.append(index[piece])
            continue
        symbols = list(("\u2581" + piece).replace(" ", "\u2581"))
        while True:
            best = None
            for i in range(len(symbols) - 1):
                joined = symbols[i] + symbols[i + 1]
                if joined in index and (best is None or scores[index[joined]] > scores[index[best[1]]]):
                    best = (i, joined)
            if best is None:
                break
            symbols[best[0]:best[0] + 2] = [best[1]]
        for symbol in symbols:
            if symbol in index:
                out.append(index[symbol])
            else:
                out += [index[f"<0x{b:02X}>"] for b in symbol.encode("utf-8")]
    return out


def _split_keep(text: str, token: str) -> list[str]:
    parts = text.split(token)
    return [p for i, part in enumerate(parts) for p in ([token, part] if i else [part]) if p]


def test_sentencepiece_ids_equal_llama_cpps_merge_by_score(readers) -> None:
    """Merges ranked by score (what tokenizers runs) give the ids of llama.cpp's algorithm
    (joining the best-scored pair first), written independently above."""
    reader = readers["llama"]
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    scores = reader.fields["tokenizer.ggml.scores"].contents()
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    control = {t for t, k in zip(tokens, types) if k == 3}
    tok = build_tokenizer(reader, _path("llama"))
    for text in PROBES:
        if text:
            assert tok.encode(text).tolist()[1:] == _spm_by_scores(tokens, scores, control, text), text
