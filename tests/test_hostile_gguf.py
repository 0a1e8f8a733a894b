"""Hostile GGUF files against the model loader (issue 51: the surface Gemma 3 added).

``GGUFLlama.load`` reads a GGUF file through ``kvasym.real.gguf_file.open_gguf``. Its contract:
bad input gives one :class:`~kvasym.errors.KvasymError` in one line naming the offending key,
tensor, value or file; never another exception's traceback, a hang or a huge allocation.

Each hostile file is a tiny fixture (``tests/fixtures/tiny_gguf``: the Gemma 3 one, an F32 llama
one, a few cases on the others) with one thing changed: cut short (class 1), rewritten with
gguf's ``GGUFWriter`` with one metadata value replaced or dropped (classes 2, 3, 5, 6), or
byte-edited in its tensor table or data (classes 4, 5). The layout walker below is written from
ggml's ``docs/gguf.md`` (independent of the reader under test) and gives every section boundary
and the byte offset of every count, type and tensor-table entry. A few files go through the
``kvasym card`` command line too: exit 2, one ``kvasym: error:`` line, no traceback.

What the loader accepts, on purpose, is pinned at the end (a sliding window wider than the
context, an unused ``{arch}.vocab_size``, unknown token-type values).
"""

from __future__ import annotations

import math
import struct
import subprocess
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from kvasym.errors import KvasymError  # noqa: E402
from kvasym.real.gguf_model import GGUFLlama, estimate_memory_bytes  # noqa: E402
from test_gguf_families import _refused  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "tiny_gguf"
GEMMA = "gemma3_swa_q5_0.gguf"
LLAMA = "llama_tied_f32.gguf"
QWEN = "qwen2_biases_q8_0.gguf"
LINEAR = "llama_linear_q4_1.gguf"
V = gguf.GGUFValueType
READABLE = "is not a readable GGUF file"  # the loader's words for a file no reader takes
PAST_END = "past the end of the file"
TOKEN_IDS = np.asarray([17, 290, 71, 100, 5, 256, 33, 299, 142, 66, 201, 88], dtype=np.int64)

# --------------------------------------------------------------------------- the layout, from docs/gguf.md

_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


@dataclass
class Entry:
    """A metadata key or a tensor-table entry: where its parts start in the file."""

    name: str
    start: int
    type_at: int = 0  # the value type (a key) or the GGML type (a tensor)
    value_at: int = 0  # the value (a key)
    count_at: int | None = None  # an array's item count (a key)
    end: int = 0
    n_dims_at: int = 0  # a tensor
    dims: list[int] = field(default_factory=list)
    offset_at: int = 0  # a tensor: its data offset, relative to the data section
    offset: int = 0
    ggml_type: int = 0
    n_bytes: int = 0


@dataclass
class Layout:
    boundaries: list[tuple[str, int]]
    keys: dict[str, Entry]
    tensors: list[Entry]
    data_start: int


def layout(raw: bytes) -> Layout:
    """Every section boundary of a little-endian GGUF v3 file and where each part lies."""
    at = 0

    def take(fmt: str) -> Any:
        nonlocal at
        (value,) = struct.unpack_from("<" + fmt, raw, at)
        at += struct.calcsize(fmt)
        return value

    def string() -> str:
        nonlocal at
        length = take("Q")
        at += length
        return raw[at - length:at].decode("utf-8")

    def value(kind: int) -> None:
        nonlocal at
        if kind == 8:
            string()
        elif kind == 9:
            item, count = take("I"), take("Q")
            for _ in range(count):
                value(item)
        else:
            at += _SCALAR_SIZES[kind]

    marks: list[tuple[str, int]] = []
    for part, fmt in (("magic", "I"), ("version", "I"), ("tensor count", "Q"), ("key count", "Q")):
        value_read = take(fmt)
        marks.append((f"after the {part}", at))
        if part == "tensor count":
            n_tensors = value_read
        elif part == "key count":
            n_keys = value_read
    keys = {}
    for _ in range(n_keys):
        start = at
        name = string()
        marks.append((f"after key name {name}", at))
        entry = Entry(name, start, type_at=at)
        kind = take("I")
        marks.append((f"after the type of {name}", at))
        entry.value_at = at
        if kind == 9:
            entry.count_at = at + 4
            marks.append((f"after the item type of {name}", at + 4))
            marks.append((f"after the item count of {name}", at + 12))
        value(kind)
        entry.end = at
        if entry.end - entry.value_at > 1:
            marks.append((f"inside the value of {name}", (entry.value_at + entry.end) // 2))
        marks.append((f"after the value of {name}", at))
        keys[name] = entry
    tensors = []
    for _ in range(n_tensors):
        start = at
        name = string()
        entry = Entry(name, start, n_dims_at=at)
        marks.append((f"after tensor name {name}", at))
        entry.dims = [take("Q") for _ in range(take("I"))]
        entry.type_at = at
        entry.ggml_type = take("I")
        entry.offset_at = at
        entry.offset = take("Q")
        entry.end = at
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(entry.ggml_type)]
        entry.n_bytes = math.prod(entry.dims) * size // block
        marks.append((f"after the tensor-table entry of {name}", at))
        tensors.append(entry)
    data_start = -(-at // 32) * 32
    if data_start - at > 1:
        marks.append(("inside the alignment padding", at + 1))
    marks.append(("at the start of the data", data_start))
    for entry in tensors:
        first = data_start + entry.offset
        marks.append((f"one byte into the data of {entry.name}", first + 1))
        marks.append((f"inside the data of {entry.name}", first + entry.n_bytes // 2))
        marks.append((f"at the end of the data of {entry.name}", first + entry.n_bytes))
    return Layout(marks, keys, tensors, data_start)


@lru_cache(maxsize=None)
def _raw(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


@lru_cache(maxsize=None)
def _layout(name: str) -> Layout:
    return layout(_raw(name))


def _tensor(name: str, tensor: str) -> Entry:
    return next(t for t in _layout(name).tensors if t.name == tensor)


def _edited(tmp_path: Path, name: str, edits: list[tuple[int, str, Any]]) -> Path:
    """A copy of fixture ``name`` with ``(offset, struct format, value)`` written over it."""
    raw = bytearray(_raw(name))
    for offset, fmt, value in edits:
        if fmt == "bytes":
            raw[offset:offset + len(value)] = value
        else:
            struct.pack_into("<" + fmt, raw, offset, value)
    path = tmp_path / f"edited_{name}"
    path.write_bytes(bytes(raw))
    return path


@lru_cache(maxsize=None)
def _reader(name: str) -> Any:
    return gguf.GGUFReader(FIXTURES / name)


def rewrite(tmp_path: Path, name: str, values: dict[str, tuple] | None = None, drop: tuple[str, ...] = (),
            data: dict[str, np.ndarray] | None = None) -> Path:
    """Fixture ``name`` written again with gguf's ``GGUFWriter``: the keys in its order, ``values``
    ``{key: (type, value[, item type])}`` replacing or adding values, ``drop`` keys left out, and
    ``data`` replacing tensors' raw data (same type)."""
    reader = _reader(name)
    path = tmp_path / f"rewritten_{name}"
    writer = gguf.GGUFWriter(path, "placeholder")
    writer.kv_data[0].clear()  # the fixture's own keys, in its own order
    for key, found in reader.fields.items():
        if key.startswith("GGUF.") or key in drop:
            continue
        sub = found.types[1] if found.types[0] == V.ARRAY else None
        writer.add_key_value(key, found.contents(), found.types[0], sub_type=sub)
    for key, (kind, value, *item) in (values or {}).items():
        writer.kv_data[0][key] = gguf.GGUFValue(value=value, type=kind, sub_type=item[0] if item else None)
    for tensor in reader.tensors:
        array = (data or {}).get(tensor.name, tensor.data)
        writer.add_tensor(tensor.name, np.array(array), raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _list(name: str, key: str) -> list:
    return list(_reader(name).fields[key].contents())


# --------------------------------------------------------------------------- 1. truncation


def _truncations() -> list[Any]:
    cases = []
    for name in (GEMMA, LLAMA):
        size = len(_raw(name))
        marks = [(label, cut) for label, cut in _layout(name).boundaries if 0 < cut < size]
        rng = np.random.default_rng(51)
        marks += [(f"at random offset {cut}", int(cut)) for cut in rng.integers(1, size, 12)]
        seen = set()
        for label, cut in marks:
            if cut not in seen:
                seen.add(cut)
                cases.append(pytest.param(name, cut, id=f"{name[:6]}-{cut}-{label}"))
    rng = np.random.default_rng(52)
    for name in (QWEN, LINEAR):
        cuts = rng.integers(1, len(_raw(name)), 6)
        cases += [pytest.param(name, int(cut), id=f"{name[:6]}-{cut}-random") for cut in cuts]
    return cases


@pytest.mark.parametrize("name, cut", _truncations())
def test_truncated_file(tmp_path, name, cut) -> None:
    path = tmp_path / "cut.gguf"
    path.write_bytes(_raw(name)[:cut])
    _refused(path, str(path), READABLE, PAST_END)


# --------------------------------------------------------------------------- 2. architecture

_ARCH = "general.architecture"


@pytest.mark.parametrize("name, value, fragments", [
    *[pytest.param(GEMMA, (V.STRING, arch), (f"{_ARCH} is {arch!r}", "supported: 'llama'"), id=repr(arch))
      for arch in ("mistral3", "gemma2", "gemma", "gemma3n", "Gemma3", "GEMMA3", "gemma3 ", " gemma3", "gemma3\x00",
                   "", "qwen3", "phi3", "bert", "llama4", "ггемма3", "x" * 5000)],
    *[pytest.param(LLAMA, (V.STRING, arch), (f"{_ARCH} is {arch!r}",), id=f"llama-{arch!r}")
      for arch in ("mistral", "Llama", "llama2", "qwen")],
    # a supported name on another family's file: its keys are under another prefix
    pytest.param(GEMMA, (V.STRING, "llama"), ("'llama.attention.head_count' is missing",), id="gemma3-as-llama"),
    pytest.param(GEMMA, (V.STRING, "qwen2"), ("'qwen2.attention.head_count' is missing",), id="gemma3-as-qwen2"),
    pytest.param(LLAMA, (V.STRING, "gemma3"), ("'gemma3.attention.head_count' is missing",), id="llama-as-gemma3"),
    pytest.param(QWEN, (V.STRING, "llama"), ("'llama.attention.head_count' is missing",), id="qwen2-as-llama"),
    # not a string
    pytest.param(GEMMA, (V.UINT32, 3), (_ARCH, "3"), id="uint32"),
    pytest.param(GEMMA, (V.INT64, -1), (_ARCH, "-1"), id="int64"),
    pytest.param(GEMMA, (V.FLOAT32, 3.0), (_ARCH, "3.0"), id="float32"),
    pytest.param(GEMMA, (V.BOOL, True), (_ARCH, "True"), id="bool"),
    pytest.param(GEMMA, (V.ARRAY, ["gemma3"], V.STRING), (_ARCH, "['gemma3']"), id="array-of-strings"),
    pytest.param(GEMMA, (V.ARRAY, [1, 2], V.UINT8), (_ARCH, "[1, 2]"), id="array-of-uint8"),
    pytest.param(LLAMA, (V.ARRAY, ["llama", "llama"], V.STRING), (_ARCH, "['llama', 'llama']"), id="llama-array"),
    pytest.param(GEMMA, None, (f"'{_ARCH}' is missing",), id="missing"),
])
def test_architecture(tmp_path, name, value, fragments) -> None:
    if value is None:
        path = rewrite(tmp_path, name, drop=(_ARCH,))
    else:
        path = rewrite(tmp_path, name, {_ARCH: value})
    _refused(path, str(path), *fragments)


# --------------------------------------------------------------------------- 3. absurd dimensions


def _dims_cases() -> list[Any]:
    g, lm = "gemma3.", "llama."
    u32, i32, u64, i64, f32, s = V.UINT32, V.INT32, V.UINT64, V.INT64, V.FLOAT32, V.STRING
    heads, kv = g + "attention.head_count", g + "attention.head_count_kv"
    rows = [
        # heads: none, not dividing, absurd, of a wrong type
        (GEMMA, heads, u32, 0, "0 heads"),
        (GEMMA, kv, u32, 0, "0 KV heads"),
        (GEMMA, kv, u32, 3, "4 heads and 3 KV heads"),
        (GEMMA, kv, u32, 8, "4 heads and 8 KV heads"),
        (GEMMA, kv, u32, 2**32 - 1, "4294967295 KV heads"),
        (GEMMA, heads, u32, 3, "blk.0.attn_q.weight"),
        (GEMMA, heads, u32, 10**9, heads),
        (GEMMA, heads, u64, 2**62, heads),
        (GEMMA, heads, i32, -4, "-4 heads"),
        (GEMMA, heads, f32, 4.5, heads),
        (GEMMA, heads, f32, 4.0, heads),
        (GEMMA, heads, s, "4", heads),
        (GEMMA, heads, V.BOOL, True, heads),
        (GEMMA, heads, V.ARRAY, [4] * 6, heads),
        (LLAMA, lm + "attention.head_count", u32, 5, "5 heads and 2 KV heads"),
        (LLAMA, lm + "attention.head_count", u32, 2, "llama.rope.dimension_count = 16 != head_dim 32"),
        (LLAMA, lm + "attention.head_count", u32, 64, "head_dim"),
        (LLAMA, lm + "attention.head_count_kv", u32, 4, "blk.0.attn_k.weight"),
        # layers: none, one too many or too few, absurd
        (GEMMA, g + "block_count", u32, 0, "gemma3.block_count = 0"),
        (GEMMA, g + "block_count", u32, 7, "blk.6.attn_norm.weight"),
        (GEMMA, g + "block_count", u32, 5, "gemma3.block_count = 5"),
        (GEMMA, g + "block_count", u32, 10**9, "gemma3.block_count = 1000000000"),
        (GEMMA, g + "block_count", u64, 2**63, "gemma3.block_count"),
        (GEMMA, g + "block_count", i32, -1, "gemma3.block_count = -1"),
        (GEMMA, g + "block_count", f32, 6.0, "gemma3.block_count"),
        (GEMMA, g + "block_count", s, "six", "gemma3.block_count"),
        (LLAMA, lm + "block_count", u32, 0, "llama.block_count = 0"),
        (LLAMA, lm + "block_count", u32, 1, "llama.block_count = 1"),
        (LLAMA, lm + "block_count", u64, 10**12, "llama.block_count"),
        # d_model
        (GEMMA, g + "embedding_length", u32, 0, "gemma3.embedding_length = 0"),
        (GEMMA, g + "embedding_length", u32, 65, "tensor 'blk.0.attn_norm.weight' has shape (64,), expected (65,)"),
        (GEMMA, g + "embedding_length", u32, 128, "tensor 'blk.0.attn_norm.weight'"),
        (GEMMA, g + "embedding_length", u32, 10**9, "gemma3.embedding_length"),
        (GEMMA, g + "embedding_length", u64, 2**62, "gemma3.embedding_length"),
        (GEMMA, g + "embedding_length", i32, -64, "gemma3.embedding_length = -64"),
        (GEMMA, g + "embedding_length", f32, 64.5, "gemma3.embedding_length"),
        (LLAMA, lm + "embedding_length", u32, 0, "llama.embedding_length = 0"),
        (LLAMA, lm + "embedding_length", u32, 2**31, "llama.embedding_length"),
        (LLAMA, lm + "embedding_length", u32, 63, "d_model 63"),
        # head_dim: gemma3's key_length, llama's rope dimension
        (GEMMA, g + "attention.key_length", u32, 0, "gemma3.attention.value_length = 32 differs from the key length 0"),
        (GEMMA, g + "attention.key_length", u32, 10**9, "the key length 1000000000"),
        (GEMMA, g + "attention.value_length", u32, 16, "gemma3.attention.value_length = 16"),
        (LLAMA, lm + "rope.dimension_count", u32, 0, "llama.rope.dimension_count = 0"),
        (LLAMA, lm + "rope.dimension_count", u32, 10**9, "llama.rope.dimension_count = 1000000000"),
        # sliding window
        (GEMMA, g + "attention.sliding_window", i32, -1, "gemma3.attention.sliding_window = -1"),
        (GEMMA, g + "attention.sliding_window", i64, -2**62, "gemma3.attention.sliding_window"),
        (GEMMA, g + "attention.sliding_window", f32, 4.5, "gemma3.attention.sliding_window"),
        (LLAMA, lm + "attention.sliding_window", i32, -1, "llama.attention.sliding_window = -1"),
        (LLAMA, lm + "attention.sliding_window", i32, 16, "llama.attention.sliding_window = 16"),
        # context length, FFN width
        (GEMMA, g + "context_length", u32, 0, "gemma3.context_length = 0"),
        (GEMMA, g + "context_length", i32, -256, "gemma3.context_length = -256"),
        (LLAMA, lm + "context_length", u32, 0, "llama.context_length = 0"),
        (GEMMA, g + "feed_forward_length", u32, 0, "'blk.0.ffn_gate.weight' has shape (96, 64), expected (0, 64)"),
        (GEMMA, g + "feed_forward_length", u32, 95, "tensor 'blk.0.ffn_gate.weight'"),
        (GEMMA, g + "feed_forward_length", u64, 2**60, "tensor 'blk.0.ffn_gate.weight'"),
    ]
    cases = [pytest.param(name, {key: (kind, value, V.UINT32) if kind == V.ARRAY else (kind, value)}, fragment,
                          id=f"{name[:6]}-{key.split('.', 1)[1]}-{kind.name}-{value!r}"[:90])
             for name, key, kind, value, fragment in rows]
    # head_dim itself (key and value length together): too small, odd, past any tensor
    for kind, value, fragment in ((u32, 0, "head_dim = 0 (gemma3.attention.key_length) must be at least 2"),
                                  (i32, -32, "head_dim = -32 (gemma3.attention.key_length)"),
                                  (u32, 31, "head_dim"),
                                  (u32, 16, "tensor 'blk.0.attn_q.weight'"),
                                  (u32, 10**9, "of head_dim 1000000000 (gemma3.attention.key_length) exceed"),
                                  (u64, 2**40, "gemma3.attention.key_length")):
        values = {g + "attention.key_length": (kind, value), g + "attention.value_length": (kind, value)}
        cases.append(pytest.param(GEMMA, values, fragment, id=f"gemma3-head_dim-{kind.name}-{value}"))
    # the vocabulary: one token more than token_embd's rows (and its type), or a smaller token_embd
    tokens, types = _list(GEMMA, "tokenizer.ggml.tokens"), _list(GEMMA, "tokenizer.ggml.token_type")
    cases.append(pytest.param(GEMMA, {"tokenizer.ggml.tokens": (V.ARRAY, [*tokens, "zzz"], V.STRING),
                                      "tokenizer.ggml.token_type": (V.ARRAY, [*types, 1], V.INT32)},
                              "token_embd.weight", id="gemma3-one-token-more-than-token_embd"))
    return cases


@pytest.mark.parametrize("name, values, fragment", _dims_cases())
def test_absurd_dimensions(tmp_path, name, values, fragment) -> None:
    path = rewrite(tmp_path, name, values)
    _refused(path, str(path), fragment)


def test_a_token_embd_of_fewer_rows_than_tokens(tmp_path) -> None:
    embd = _reader(GEMMA).tensors[0]
    assert embd.name == "token_embd.weight"
    path = rewrite(tmp_path, GEMMA, data={"token_embd.weight": np.asarray(embd.data)[:-1]})
    _refused(path, "tensor 'token_embd.weight' has shape (299, 64), expected (300, 64)")


# --------------------------------------------------------------------------- 4. the tensor table, the structure


def _structure_cases() -> list[Any]:
    cases = []

    def case(name: str, label: str, edits: Any, *fragments: str) -> None:
        cases.append(pytest.param(name, edits, fragments, id=f"{name[:6]}-{label}"))

    for name, first, quantized, norm in ((GEMMA, "token_embd.weight", "blk.2.attn_q.weight",
                                          "blk.5.attn_q_norm.weight"),
                                         (LLAMA, "token_embd.weight", "blk.1.ffn_up.weight", "blk.1.ffn_norm.weight")):
        lay = _layout(name)
        size = len(_raw(name))
        last = lay.tensors[-1]
        for tensor in dict.fromkeys((first, quantized, norm, last.name)):
            t = _tensor(name, tensor)
            # offsets past the end, and a tensor whose last block lies past it
            for offset in (size, 2**40, 2**63, 2**64 - 32):
                case(name, f"{tensor}-offset-{offset}", [(t.offset_at, "Q", offset)], repr(tensor), PAST_END)
            beyond = -(-(size - lay.data_start - t.n_bytes + 1) // 32) * 32
            case(name, f"{tensor}-ends-past-eof", [(t.offset_at, "Q", beyond)], repr(tensor), PAST_END)
            # misaligned: not a multiple of the alignment (32)
            for shift in (1, 2, 16):
                case(name, f"{tensor}-misaligned-{shift}", [(t.offset_at, "Q", t.offset + shift)], repr(tensor),
                     "alignment")
            # unknown GGML type ids (4 and 5 were Q4_2 and Q4_3, removed from ggml)
            for kind in (4, 5, 31, 99, 2**31, 2**32 - 1):
                case(name, f"{tensor}-type-{kind}", [(t.type_at, "I", kind)], repr(tensor), f"type {kind}")
            # dimensions whose product overflows 64 bits (one wraps around to the true element count)
            ne0 = t.dims[0]
            wrap = [(t.dims[1] + 2**64 // ne0) if len(t.dims) > 1 else 2**64 // 2 + 1]
            for dims in ([2**32, 2**32], [2**63, 2], [2**64 - 1, 2**64 - 1], [ne0, *wrap]):
                if len(dims) == len(t.dims) and max(dims) < 2**64:
                    edits = [(t.n_dims_at + 4 + 8 * i, "Q", d) for i, d in enumerate(dims)]
                    case(name, f"{tensor}-dims-{dims}", edits, repr(tensor))
        # overlapping: a later tensor placed on an earlier one's data
        t0, t1, t5 = lay.tensors[0], lay.tensors[1], lay.tensors[5]
        case(name, "second-on-first", [(t1.offset_at, "Q", t0.offset)], "overlap", repr(t1.name))
        case(name, "last-on-first", [(last.offset_at, "Q", 0)], "overlap", repr(last.name))
        case(name, "sixth-on-fifth", [(t5.offset_at, "Q", lay.tensors[4].offset)], "overlap", repr(t5.name))
        case(name, "first-grows-into-second", [(t0.n_dims_at + 12, "Q", t0.dims[1] + 1)], "overlap", repr(t0.name))
        case(name, "first-grows-past-eof", [(t0.n_dims_at + 12, "Q", 10**12)], repr(t0.name), PAST_END)
        # dimension counts: none, more than ggml's four, absurd
        for n_dims in (5, 64, 2**32 - 1):
            case(name, f"n_dims-{n_dims}", [(t0.n_dims_at, "I", n_dims)], repr(t0.name), "dimensions")
        case(name, "n_dims-0", [(t0.n_dims_at, "I", 0)])
        # names: not UTF-8, twice the same, huge
        case(name, "tensor-name-not-utf8", [(t1.start + 8, "bytes", b"\xff\xfe")], "UTF-8")
        case(name, "tensor-name-length-huge", [(t1.start, "Q", 2**62)], PAST_END)
        # the counts of the header
        n_tensors, n_keys = len(lay.tensors), len(lay.keys)
        for label, edit in (("tensor-count+1", (8, "Q", n_tensors + 1)), ("tensor-count-max", (8, "Q", 2**64 - 1)),
                            ("key-count+1", (16, "Q", n_keys + 1)), ("key-count-1", (16, "Q", n_keys - 1)),
                            ("key-count-max", (16, "Q", 2**64 - 1)), ("version-1", (4, "I", 1)),
                            ("version-4", (4, "I", 4)), ("version-big-endian", (4, "I", 3 << 24)),
                            ("magic", (0, "bytes", b"GGUG"))):
            case(name, label, [edit], READABLE)
        # metadata values: unknown value types, array counts far past the end (once a hang), huge strings
        keys = lay.keys
        tokens, types, merges = (keys[f"tokenizer.ggml.{k}"] for k in ("tokens", "token_type", "merges"))
        for kind in (13, 2**32 - 1):
            case(name, f"value-type-{kind}", [(keys["general.name"].type_at, "I", kind)], "'general.name'", "type")
            case(name, f"array-item-type-{kind}", [(types.value_at, "I", kind)], "'tokenizer.ggml.token_type'",
                 "type")
        for count in (10**7, 2**62, 2**64 - 1):
            case(name, f"token_type-count-{count}", [(types.count_at, "Q", count)], "'tokenizer.ggml.token_type'",
                 PAST_END)
            case(name, f"tokens-count-{count}", [(tokens.count_at, "Q", count)], "'tokenizer.ggml.tokens'")
        case(name, "merges-count+1", [(merges.count_at, "Q", len(_list(name, "tokenizer.ggml.merges")) + 1)],
             PAST_END)
        case(name, "array-of-arrays", [(types.value_at, "I", 9)], "'tokenizer.ggml.token_type'")
        case(name, "key-length-huge", [(keys["general.name"].start, "Q", 2**63)], PAST_END)
        case(name, "value-string-huge", [(keys["general.name"].value_at, "Q", 2**63)], "'general.name'", PAST_END)
        case(name, "key-not-utf8", [(keys["general.name"].start + 8, "bytes", b"\xc3\x28")], "UTF-8")
        eos = keys["tokenizer.ggml.eos_token_id"]
        case(name, "duplicate-key", [(eos.start + 8, "bytes", b"tokenizer.ggml.bos_token_id")],
             "tokenizer.ggml.bos_token_id")
        k = _tensor(name, "blk.0.attn_k.weight")
        case(name, "duplicate-tensor", [(k.start + 8, "bytes", b"blk.0.attn_q.weight")], "'blk.0.attn_q.weight'")
    # rows of a quantized tensor that are not whole blocks (Q5_0 blocks of 32 values)
    attn_q = _tensor(GEMMA, "blk.2.attn_q.weight")
    case(GEMMA, "rows-not-whole-blocks", [(attn_q.n_dims_at + 4, "Q", 48)], "'blk.2.attn_q.weight'", "whole blocks")
    # a known type gguf cannot dequantize, of the same size as the stored one (F32 read as I32)
    norm = _tensor(GEMMA, "output_norm.weight")
    case(GEMMA, "F32-as-I32", [(norm.type_at, "I", 26)], "'output_norm.weight'", "I32", "cannot dequantize")
    return cases


@pytest.mark.parametrize("name, edits, fragments", _structure_cases())
def test_tensor_table_and_structure(tmp_path, name, edits, fragments) -> None:
    path = _edited(tmp_path, name, edits)
    _refused(path, str(path), *fragments)


@pytest.mark.parametrize("value, fragment", [
    ((V.UINT32, 0), "general.alignment"),
    ((V.UINT32, 3), "general.alignment"),
    ((V.UINT32, 48), "general.alignment"),
    ((V.UINT32, 2**31), PAST_END),
    ((V.UINT64, 32), "general.alignment"),
    ((V.STRING, "32"), "general.alignment"),
    ((V.INT32, -32), "general.alignment"),
], ids=lambda v: repr(v))
def test_alignment(tmp_path, value, fragment) -> None:
    path = rewrite(tmp_path, GEMMA, {"general.alignment": value})
    _refused(path, str(path), READABLE, fragment)


def test_arrays_nested_too_deep(tmp_path) -> None:
    """An array of an array of ... 5,000 deep: refused in one line, not a RecursionError."""
    key = b"general.nested"
    raw = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key + struct.pack("<I", 9)
    path = tmp_path / "nested.gguf"
    path.write_bytes(raw + struct.pack("<IQ", 9, 1) * 5000 + struct.pack("<IQ", 4, 0))
    _refused(path, str(path), READABLE, "nested too deep")


def test_a_big_endian_file_with_an_array_count_past_its_end(tmp_path) -> None:
    """Big-endian files go to gguf's GGUFReader, whose loops trust the counts: checked first."""
    path = tmp_path / "big.gguf"
    writer = gguf.GGUFWriter(path, "llama", endianess=gguf.GGUFEndian.BIG)
    writer.add_array("tokenizer.ggml.token_type", [1, 1, 1])
    writer.add_tensor("w", np.zeros((2, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    raw = bytearray(path.read_bytes())
    at = raw.index(b"tokenizer.ggml.token_type") + len("tokenizer.ggml.token_type") + 8  # value type, item type
    assert struct.unpack_from(">Q", raw, at)[0] == 3
    struct.pack_into(">Q", raw, at, 2**62)
    path.write_bytes(bytes(raw))
    _refused(path, str(path), "'tokenizer.ggml.token_type'", PAST_END)


# --------------------------------------------------------------------------- 5. NaN and Inf


def _nan_cases() -> list[Any]:
    f16 = {"nan": b"\x00\x7e", "inf": b"\x00\x7c", "-inf": b"\x00\xfc"}
    f32 = {"nan": struct.pack("<f", math.nan), "inf": struct.pack("<f", math.inf),
           "-inf": struct.pack("<f", -math.inf)}
    cases = []
    gemma, llama = _layout(GEMMA), _layout(LLAMA)
    for what in ("nan", "inf", "-inf"):
        # F16 embedding row 17 (a token of the check), F32 norms, the F16 scale of a Q8_0 / Q5_0 block
        embd = _tensor(GEMMA, "token_embd.weight")
        for name, tensor, at, value in (
            (GEMMA, "token_embd.weight", embd.offset + 17 * 64 * 2, f16[what]),
            (GEMMA, "output_norm.weight", _tensor(GEMMA, "output_norm.weight").offset + 4, f32[what]),
            (GEMMA, "blk.3.attn_k_norm.weight", _tensor(GEMMA, "blk.3.attn_k_norm.weight").offset, f32[what]),
            (GEMMA, "blk.0.ffn_gate.weight", _tensor(GEMMA, "blk.0.ffn_gate.weight").offset, f16[what]),
            (GEMMA, "blk.5.attn_q.weight", _tensor(GEMMA, "blk.5.attn_q.weight").offset + 22, f16[what]),
            (LLAMA, "blk.1.attn_q.weight", _tensor(LLAMA, "blk.1.attn_q.weight").offset + 400, f32[what]),
            (LLAMA, "token_embd.weight", _tensor(LLAMA, "token_embd.weight").offset + 17 * 64 * 4, f32[what]),
        ):
            start = (gemma if name == GEMMA else llama).data_start
            cases.append(pytest.param(name, [(start + at, "bytes", value)], tensor, id=f"{name[:6]}-{tensor}-{what}"))
    return cases


@pytest.mark.parametrize("name, edits, tensor", _nan_cases())
def test_non_finite_weights(tmp_path, name, edits, tensor) -> None:
    """A NaN or an infinity in a weight is refused at load, naming the tensor: else the logits
    of the tokens it reaches would be NaN, silently."""
    path = _edited(tmp_path, name, edits)
    _refused(path, str(path), repr(tensor), "non-finite")


@pytest.mark.parametrize("name, key, value", [
    (GEMMA, "gemma3.rope.freq_base", math.nan),
    (GEMMA, "gemma3.rope.freq_base", math.inf),
    (GEMMA, "gemma3.rope.freq_base", 0.0),
    (GEMMA, "gemma3.rope.freq_base", -1e4),
    (LLAMA, "llama.rope.freq_base", math.nan),
    (GEMMA, "gemma3.attention.layer_norm_rms_epsilon", math.nan),
    (GEMMA, "gemma3.attention.layer_norm_rms_epsilon", math.inf),
    (GEMMA, "gemma3.attention.layer_norm_rms_epsilon", -1.0),
    (LLAMA, "llama.attention.layer_norm_rms_epsilon", -1e-5),
    (LINEAR, "llama.rope.scaling.factor", math.nan),
    (LINEAR, "llama.rope.scaling.factor", math.inf),
    (LINEAR, "llama.rope.scaling.factor", -4.0),
], ids=lambda v: repr(v)[:40])
def test_non_finite_or_negative_settings(tmp_path, name, key, value) -> None:
    path = rewrite(tmp_path, name, {key: (V.FLOAT32, value)})
    _refused(path, str(path), key)


def test_rope_scaling_factor_of_a_wrong_type(tmp_path) -> None:
    for value in ((V.STRING, "4"), (V.ARRAY, [4.0, 4.0], V.FLOAT32), (V.BOOL, True)):
        path = rewrite(tmp_path, LINEAR, {"llama.rope.scaling.factor": value})
        _refused(path, str(path), "llama.rope.scaling.factor")


# --------------------------------------------------------------------------- 6. the tokenizer


def _tokenizer_cases() -> list[Any]:
    t = "tokenizer.ggml."
    tokens, types = _list(GEMMA, t + "tokens"), _list(GEMMA, t + "token_type")
    merges = _list(GEMMA, t + "merges")
    S, I32, U32 = V.STRING, V.INT32, V.UINT32
    rows: list[tuple[str, dict, tuple, tuple]] = [
        # the vocabulary and token_embd disagree
        ("one-token-fewer", {t + "tokens": (V.ARRAY, tokens[:-1], S), t + "token_type": (V.ARRAY, types[:-1], I32)},
         (), ("token_embd.weight", "(300, 64), expected (299, 64)")),
        ("half-the-tokens", {t + "tokens": (V.ARRAY, tokens[:150], S), t + "token_type": (V.ARRAY, types[:150], I32),
                             t + "bos_token_id": (U32, 1), t + "eos_token_id": (U32, 1)},
         (), ("tokenizer.ggml.merges entry 0, 't h'",)),
        ("one-token", {t + "tokens": (V.ARRAY, ["a"], S), t + "token_type": (V.ARRAY, [1], I32)}, (),
         ("tokenizer.ggml.merges entry 0",)),
        ("token-types-short", {t + "token_type": (V.ARRAY, types[:-1], I32)}, (), ("token_type has 299 entries",)),
        ("token-types-long", {t + "token_type": (V.ARRAY, [*types, 1], I32)}, (), ("token_type has 301 entries",)),
        ("token-types-missing", {}, (t + "token_type",), ("'tokenizer.ggml.token_type' is missing",)),
        ("token-types-strings", {t + "token_type": (V.ARRAY, [str(k) for k in types], S)}, (),
         ("tokenizer.ggml.token_type",)),
        ("token-types-floats", {t + "token_type": (V.ARRAY, [float(k) for k in types], V.FLOAT32)}, (),
         ("tokenizer.ggml.token_type",)),
        ("tokens-missing", {}, (t + "tokens",), ("'tokenizer.ggml.tokens' is missing",)),
        ("tokens-not-strings", {t + "tokens": (V.ARRAY, list(range(300)), U32)}, (), ("tokenizer.ggml.tokens",)),
        ("tokens-one-string", {t + "tokens": (S, "abc")}, (), ("tokenizer.ggml.tokens",)),
        ("duplicate-tokens", {t + "tokens": (V.ARRAY, [*tokens[:-1], tokens[0]], S)}, (), ("duplicate tokens",)),
        # merges: missing, of unknown tokens, not pairs, not strings
        ("merges-missing", {}, (t + "merges",), ("'tokenizer.ggml.merges' is missing",)),
        ("merges-of-unknown-tokens", {t + "merges": (V.ARRAY, ["zz qq", *merges], S)}, (),
         ("tokenizer.ggml.merges", "'zz qq'")),
        ("merge-without-a-space", {t + "merges": (V.ARRAY, [*merges[:3], "th", *merges[3:]], S)}, (),
         ("tokenizer.ggml.merges", "'th'")),
        ("merges-not-strings", {t + "merges": (V.ARRAY, [1, 2, 3], U32)}, (), ("tokenizer.ggml.merges",)),
        ("merges-one-string", {t + "merges": (S, "t h")}, (), ("tokenizer.ggml.merges",)),
        # the tokenizer's model and pre-tokenizer
        ("model-missing", {}, (t + "model",), ("'tokenizer.ggml.model' is missing",)),
        ("model-bert", {t + "model": (S, "bert")}, (), ("tokenizer.ggml.model='bert'",)),
        ("model-uint32", {t + "model": (U32, 2)}, (), ("tokenizer.ggml.model=2",)),
        ("model-array", {t + "model": (V.ARRAY, ["gpt2"], S)}, (), ("tokenizer.ggml.model=['gpt2']",)),
        ("pre-missing", {}, (t + "pre",), ("'tokenizer.ggml.pre' is missing",)),
        ("pre-unknown", {t + "pre": (S, "deepseek-llm")}, (), ("tokenizer.ggml.pre='deepseek-llm'",)),
        ("pre-array", {t + "pre": (V.ARRAY, ["smollm"], S)}, (), ("tokenizer.ggml.pre=['smollm']",)),
        ("pre-uint32", {t + "pre": (U32, 1)}, (), ("tokenizer.ggml.pre=1",)),
        # SentencePiece: scores missing, short; the byte-fallback tokens missing
        ("spm-scores-missing", {t + "model": (S, "llama")}, (t + "pre",), ("'tokenizer.ggml.scores' is missing",)),
        ("spm-scores-short", {t + "model": (S, "llama"), t + "scores": (V.ARRAY, [0.0] * 299, V.FLOAT32)}, (t + "pre",),
         ("tokenizer.ggml.scores has 299 entries",)),
        ("spm-no-byte-tokens", {t + "model": (S, "llama"), t + "scores": (V.ARRAY, [0.0] * 300, V.FLOAT32)},
         (t + "pre",), ("byte-fallback tokens",)),
        # special token ids and flags
        ("bos-id-past-vocab", {t + "bos_token_id": (U32, 300)}, (), ("tokenizer.ggml.bos_token_id=300",)),
        ("bos-id-max", {t + "bos_token_id": (U32, 2**32 - 1)}, (), ("tokenizer.ggml.bos_token_id=4294967295",)),
        ("bos-id-negative", {t + "bos_token_id": (I32, -1)}, (), ("tokenizer.ggml.bos_token_id=-1",)),
        ("bos-id-string", {t + "bos_token_id": (S, "two")}, (), ("tokenizer.ggml.bos_token_id",)),
        ("bos-id-float", {t + "bos_token_id": (V.FLOAT32, 2.5)}, (), ("tokenizer.ggml.bos_token_id",)),
        ("bos-id-nan", {t + "bos_token_id": (V.FLOAT32, math.nan)}, (), ("tokenizer.ggml.bos_token_id",)),
        ("bos-id-array", {t + "bos_token_id": (V.ARRAY, [1], U32)}, (), ("tokenizer.ggml.bos_token_id",)),
        ("eos-id-past-vocab", {t + "eos_token_id": (V.UINT64, 2**63)}, (), ("tokenizer.ggml.eos_token_id",)),
        ("add-bos-without-bos", {t + "add_bos_token": (V.BOOL, True)}, (t + "bos_token_id",),
         ("tokenizer.ggml.bos_token_id is missing",)),
        ("add-bos-string", {t + "add_bos_token": (S, "false")}, (), ("tokenizer.ggml.add_bos_token",)),
        ("add-eos-array", {t + "add_eos_token": (V.ARRAY, [True], V.BOOL)}, (), ("tokenizer.ggml.add_eos_token",)),
    ]
    return [pytest.param(values, drop, fragments, id=label) for label, values, drop, fragments in rows]


@pytest.mark.parametrize("values, drop, fragments", _tokenizer_cases())
def test_tokenizer(tmp_path, values, drop, fragments) -> None:
    path = rewrite(tmp_path, GEMMA, values, drop)
    _refused(path, str(path), *fragments)


# --------------------------------------------------------------------------- the command line


def _truncated(tmp_path: Path) -> Path:
    path = tmp_path / "truncated.gguf"
    path.write_bytes(_raw(GEMMA)[:_layout(GEMMA).data_start + 1000])
    return path


def _hanging(tmp_path: Path) -> Path:
    return _edited(tmp_path, GEMMA, [(_layout(GEMMA).keys["tokenizer.ggml.token_type"].count_at, "Q", 2**62)])


@pytest.mark.parametrize("make, fragment", [
    (_truncated, PAST_END),
    (_hanging, "'tokenizer.ggml.token_type'"),
    (lambda tmp: rewrite(tmp, GEMMA, {_ARCH: (V.ARRAY, ["gemma3"], V.STRING)}), _ARCH),
    (lambda tmp: rewrite(tmp, GEMMA, {"gemma3.block_count": (V.UINT32, 10**9)}), "gemma3.block_count"),
    (lambda tmp: _edited(tmp, GEMMA, _nan_cases()[0].values[1]), "'token_embd.weight'"),
], ids=["truncated", "array-count", "architecture-array", "block-count", "nan-embedding"])
def test_card_command_line_on_a_hostile_file(tmp_path, make, fragment) -> None:
    path = make(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "kvasym.cli", "card", str(path), "--out", str(tmp_path / "card"),
                           "--tokens", "8", "--budgets", "2", "--widths", "2"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("kvasym: error:")]
    assert len(errors) == 1 and fragment in errors[0] and str(path) in errors[0], proc.stderr
    assert not (tmp_path / "card").exists()


def test_memory_estimate_on_hostile_files(tmp_path) -> None:
    """The memory estimate (which the card runs before loading) reads the same table: one line too."""
    for path in (_truncated(tmp_path), _hanging(tmp_path)):
        with pytest.raises(KvasymError, match=READABLE) as info:
            estimate_memory_bytes(path)
        assert "\n" not in str(info.value)


# --------------------------------------------------------------------------- what is accepted, on purpose


def _logits(model: GGUFLlama) -> np.ndarray:
    return model.logits(model.forward(TOKEN_IDS).hidden)


def test_a_window_wider_than_the_context_is_full_attention(tmp_path) -> None:
    """Gemma 3 with a window of 2**31 keys: every key is inside it; the sliding layers attend to
    everything (what the window would do on a text no longer than the context)."""
    path = rewrite(tmp_path, GEMMA, {"gemma3.attention.sliding_window": (V.UINT32, 2**31)})
    model = GGUFLlama.load(path)
    assert model.config.sliding_window == 2**31 and model.config.sliding_layers == (0, 1, 2, 3, 4)
    opened = GGUFLlama.load(FIXTURES / GEMMA).with_config(sliding_window=2**31)
    np.testing.assert_array_equal(_logits(model), _logits(opened))


def test_an_inconsistent_vocab_size_key_is_not_read(tmp_path) -> None:
    """``{arch}.vocab_size`` is not what the loader sizes the vocabulary by (the token list and
    token_embd, which must agree): a wrong one changes nothing."""
    path = rewrite(tmp_path, GEMMA, {"gemma3.vocab_size": (V.UINT32, 1000)})
    assert GGUFLlama.load(path).config.vocab_size == 300


def test_unknown_token_type_values_are_normal_tokens(tmp_path) -> None:
    """llama.cpp reads token types as int32 without checking their range; so does this reader:
    a type it does not know (99, -1) makes a normal token."""
    types = _list(GEMMA, "tokenizer.ggml.token_type")
    path = rewrite(tmp_path, GEMMA, {"tokenizer.ggml.token_type": (V.ARRAY, [99, -1, *types[2:]], V.INT32)})
    model = GGUFLlama.load(path)
    assert np.isfinite(_logits(model)).all()
