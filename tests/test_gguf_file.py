"""kvasym.real.gguf_file against gguf's own GGUFReader (the reference implementation of the
format): every metadata value, its Python type, and every tensor's name, type, shape, offset
and bytes, on the shipped model, every tiny GGUF fixture, a big-endian file and an array of
arrays; and one-line errors for files neither reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from kvasym.errors import KvasymError  # noqa: E402
from kvasym.real.gguf_file import GGUFFile, open_gguf  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
FILES = sorted((FIXTURES / "tiny_gguf").glob("*.gguf")) + sorted((FIXTURES / "tiny_tokenizers").glob("*.gguf"))


def _shipped() -> list[Path]:
    try:
        from kvasym.real.gguf_model import find_model_file

        return [find_model_file()]
    except Exception:  # noqa: BLE001 - the model package is optional; the fixtures still run
        return []


def assert_same_as_gguf_reader(ours: Any, path: Path, skip: tuple[str, ...] = ()) -> None:
    reference = gguf.GGUFReader(path)
    keys = [k for k in reference.fields if not k.startswith("GGUF.") and k not in skip]  # the header, not metadata
    assert list(ours.fields) == keys
    for key in keys:
        got, want = ours.fields[key].contents(), reference.fields[key].contents()
        assert got == want and type(got) is type(want), key
        if isinstance(want, list):
            assert [type(v) for v in got] == [type(v) for v in want], key
    assert len(ours.tensors) == len(reference.tensors)
    for a, b in zip(ours.tensors, reference.tensors):
        assert (a.name, a.tensor_type, a.n_elements, a.n_bytes, a.data_offset) == \
            (b.name, b.tensor_type, b.n_elements, b.n_bytes, b.data_offset)
        assert np.array_equal(a.shape, b.shape)
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape
        assert a.data.tobytes() == b.data.tobytes(), a.name
    assert (ours.alignment, ours.data_offset) == (reference.alignment, reference.data_offset)


def test_the_fixtures_cover_quantized_half_and_tokenizer_files() -> None:
    types = {t.tensor_type.name for p in FILES for t in gguf.GGUFReader(p).tensors}
    assert {"F32", "F16", "BF16", "Q8_0", "Q4_1"} <= types and len(FILES) >= 10


@pytest.mark.parametrize("path", FILES + _shipped(), ids=lambda p: p.name)
def test_every_field_and_tensor_is_gguf_reader_s(path: Path) -> None:
    ours = open_gguf(path)
    assert isinstance(ours, GGUFFile)  # the fast path, not the fallback
    assert_same_as_gguf_reader(ours, path)


def _write(path: Path, endianess: Any = None, extra: dict[str, Any] | None = None) -> Path:
    writer = gguf.GGUFWriter(path, "llama", **({} if endianess is None else {"endianess": endianess}))
    writer.add_uint32("llama.block_count", 2)
    writer.add_float32("llama.rope.freq_base", 10000.5)
    writer.add_bool("tokenizer.ggml.add_bos_token", True)
    writer.add_array("tokenizer.ggml.tokens", ["a", "b", "é", ""])
    writer.add_array("tokenizer.ggml.scores", [0.5, -1.25, 3.0, 0.0])
    for key, value in (extra or {}).items():
        writer.add_array(key, value)
    writer.add_tensor("w", np.arange(96, dtype=np.float32).reshape(3, 32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_written_file_reads_back(tmp_path: Path) -> None:
    path = _write(tmp_path / "little.gguf")
    ours = open_gguf(path)
    assert isinstance(ours, GGUFFile)
    assert ours.fields["tokenizer.ggml.tokens"].contents() == ["a", "b", "é", ""]
    assert ours.fields["llama.rope.freq_base"].contents() == float(np.float32(10000.5))
    assert ours.fields["tokenizer.ggml.add_bos_token"].contents() is True
    assert np.array_equal(ours.tensors[0].data, np.arange(96, dtype=np.float32).reshape(3, 32))
    assert_same_as_gguf_reader(ours, path)


def test_big_endian_and_nested_arrays_are_read_by_the_one_parser(tmp_path: Path) -> None:
    """Issue 48, point 5: one GGUF parser. A big-endian file and an array of arrays, which the
    parser once handed to gguf's GGUFReader, are read here and equal GGUFReader's reading:
    every value and its type, every tensor's bytes and byte order."""
    big_path = _write(tmp_path / "big.gguf", endianess=gguf.GGUFEndian.BIG)
    big = open_gguf(big_path)
    assert isinstance(big, GGUFFile)
    assert big.fields["tokenizer.ggml.tokens"].contents() == ["a", "b", "é", ""]
    assert big.fields["llama.block_count"].contents() == 2
    assert big.tensors[0].data.dtype.byteorder == ">"
    assert np.array_equal(big.tensors[0].data, np.arange(96, dtype=np.float32).reshape(3, 32))
    assert_same_as_gguf_reader(big, big_path)
    nested_path = _write(tmp_path / "nested.gguf", extra={"general.nested": [[1, 2], [3]]})
    nested = open_gguf(nested_path)
    assert isinstance(nested, GGUFFile)
    # the array of arrays as written (GGUFReader's contents() flattens it to [1, 2, 3])
    assert nested.fields["general.nested"].contents() == [[1, 2], [3]]
    assert gguf.GGUFReader(nested_path).fields["general.nested"].contents() == [1, 2, 3]
    del nested.fields["general.nested"]
    assert_same_as_gguf_reader(nested, nested_path, skip=("general.nested",))  # the rest as GGUFReader reads it


@pytest.mark.parametrize("damage", ["junk", "truncated_in_metadata", "truncated_in_tensors", "empty"])
def test_a_damaged_file_is_one_line_naming_it(tmp_path: Path, damage: str) -> None:
    """Neither reader takes it: the model loader and the memory estimate say so in one line."""
    from kvasym.real.gguf_model import GGUFLlama, estimate_memory_bytes

    raw = (FIXTURES / "tiny_gguf" / "llama_tied_f32.gguf").read_bytes()
    reference = gguf.GGUFReader(FIXTURES / "tiny_gguf" / "llama_tied_f32.gguf")
    cut = {"junk": None, "truncated_in_metadata": 200, "truncated_in_tensors": reference.data_offset + 64,
           "empty": 0}[damage]
    path = tmp_path / f"{damage}.gguf"
    path.write_bytes(b"definitely not a GGUF file" if cut is None else raw[:cut])
    for call in (lambda: GGUFLlama.load(path), lambda: estimate_memory_bytes(path)):
        with pytest.raises(KvasymError, match=rf"^{path}.* is not a readable GGUF file \(") as info:
            call()
        assert "\n" not in str(info.value)
