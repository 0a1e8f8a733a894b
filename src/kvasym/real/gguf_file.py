"""A GGUF file's metadata and tensor table, parsed in one pass (the fast path of ``gguf.GGUFReader``).

``gguf.GGUFReader`` builds a numpy view per metadata part: SmolLM2-135M's vocabulary (49,152
tokens, 48,900 merges, their types) is about 250,000 views and 2.7 CPU-s of every model load,
about two thirds of it, paid by every job that loads the model. :func:`open_gguf` reads the
same file with ``struct`` over the memory-mapped bytes instead (about 0.1 s for that file) and
returns an object with the part of ``GGUFReader``'s interface that :mod:`kvasym.real` uses:

- ``fields``: an ordered ``dict`` from key to a field whose ``contents()`` is what
  ``ReaderField.contents()`` gives: a Python ``int``, ``float``, ``bool`` or ``str``, or a
  ``list`` of them for an array;
- ``tensors``: a ``list`` of tensors with ``name``, ``tensor_type`` (``gguf.GGMLQuantizationType``),
  ``shape`` (dimensions fastest first, as GGUF stores them), ``n_elements``, ``n_bytes``,
  ``data_offset`` and ``data``, the memory-mapped array ``ReaderTensor.data`` is (the element
  type for F16, F32, F64 and the integer types, else the block bytes of each row);
- ``alignment`` and ``data_offset``.

The layout (GGUF versions 2 and 3, little-endian): the magic ``GGUF``, the version (uint32), the
tensor and key counts (uint64), each key (a string: uint64 length and UTF-8 bytes), its value
type (uint32) and value (an array: item type uint32, count uint64, items), then each tensor's
name, dimension count (uint32), dimensions (uint64), type (uint32) and offset (uint64) into the
data section, which starts at the next multiple of ``general.alignment`` (default 32).

A file this parser does not take (big-endian, another version, an array of arrays) is opened
with ``gguf.GGUFReader`` instead, which reads it or raises; so is a file it finds malformed, so
that the error is gguf's own. Tests compare every field and tensor with ``GGUFReader``'s on the
shipped model and on the tiny models of every supported family.

References
----------
ggml ``docs/gguf.md`` (the file format); gguf-py ``gguf/gguf_reader.py`` (``GGUFReader``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: Value types of GGUF metadata (``gguf.GGUFValueType``): struct format of the scalar types.
_SCALAR_FORMATS: dict[int, str] = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
                                   12: "d"}
_STRING, _ARRAY = 8, 9
_MAGIC = 0x46554747  # b"GGUF" read as a little-endian uint32
_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32


class _Unsupported(Exception):
    """A file the fast path leaves to ``gguf.GGUFReader`` (which reads it or says why not)."""


@dataclass(frozen=True)
class GGUFField:
    """One metadata value; :meth:`contents` as ``gguf.ReaderField.contents()``."""

    name: str
    value: Any
    value_type: int  # gguf.GGUFValueType of the value (ARRAY for an array)

    def contents(self) -> Any:
        """The value: a Python scalar or string, or a list of them."""
        return self.value


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of the file, its data memory-mapped (``gguf.ReaderTensor``'s attributes)."""

    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: np.ndarray  # uint64 dimensions, fastest first
    n_elements: int
    n_bytes: int
    data_offset: int
    data: np.ndarray


@dataclass
class GGUFFile:
    """What :func:`open_gguf` returns: ``fields``, ``tensors``, ``alignment``, ``data_offset``."""

    path: Path
    fields: dict[str, GGUFField]
    tensors: list[GGUFTensor]
    alignment: int
    data_offset: int


class _Cursor:
    """Little-endian reads at a moving offset of a bytes-like buffer."""

    def __init__(self, buffer: memoryview) -> None:
        self.buffer = buffer
        self.offset = 0

    def unpack(self, fmt: str) -> Any:
        (value,) = struct.unpack_from("<" + fmt, self.buffer, self.offset)
        self.offset += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        return self.strings(1)[0]

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.unpack("I"), self.unpack("Q")
            if item == _STRING:
                return self.strings(count)
            fmt = _SCALAR_FORMATS.get(item)
            if fmt is None:  # an array of arrays, or an unknown type: gguf's reader decides
                raise _Unsupported(f"array of value type {item}")
            size = struct.calcsize(fmt) * count
            if self.offset + size > len(self.buffer):
                raise _Unsupported("an array runs past the end of the file")
            values = np.frombuffer(self.buffer, dtype="<" + fmt, count=count, offset=self.offset).tolist()
            self.offset += size
            return values
        fmt = _SCALAR_FORMATS.get(kind)
        if fmt is None:
            raise _Unsupported(f"value type {kind}")
        return self.unpack(fmt)

    def strings(self, count: int) -> list[str]:
        # the vocabulary's loop: one length and one slice a string, no numpy view
        buffer, offset, out = self.buffer, self.offset, []
        length_at = struct.Struct("<Q").unpack_from
        size = len(buffer)
        for _ in range(count):
            (length,) = length_at(buffer, offset)
            offset += 8
            if offset + length > size:
                raise _Unsupported("a string runs past the end of the file")
            out.append(str(buffer[offset:offset + length], encoding="utf-8"))
            offset += length
        self.offset = offset
        return out


def _parse(path: Path) -> GGUFFile:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    data = np.memmap(path, mode="r")
    cursor = _Cursor(memoryview(data))
    try:
        if cursor.unpack("I") != _MAGIC:
            raise _Unsupported("GGUF magic invalid")
        version = cursor.unpack("I")
        if version not in _VERSIONS:  # big-endian files read as a version with zero low bits
            raise _Unsupported(f"version {version}")
        n_tensors, n_keys = cursor.unpack("Q"), cursor.unpack("Q")
        fields: dict[str, GGUFField] = {}
        for _ in range(n_keys):
            key = cursor.string()
            if key in fields:
                raise _Unsupported(f"duplicate key {key!r}")
            kind = cursor.unpack("I")
            fields[key] = GGUFField(key, cursor.value(kind), kind)
        infos = []
        for _ in range(n_tensors):
            name = cursor.string()
            n_dims = cursor.unpack("I")
            dims = np.frombuffer(cursor.buffer, dtype="<u8", count=n_dims, offset=cursor.offset).copy()
            cursor.offset += 8 * n_dims
            infos.append((name, dims, cursor.unpack("I"), cursor.unpack("Q")))
    except struct.error as exc:  # read past the end
        raise _Unsupported(str(exc)) from None
    alignment = _DEFAULT_ALIGNMENT
    if "general.alignment" in fields:  # a uint32 power of two, as gguf's reader requires
        found = fields["general.alignment"]
        alignment = found.value
        if found.value_type != 4 or alignment <= 0 or alignment & (alignment - 1):
            raise _Unsupported("general.alignment")
    start = -(-cursor.offset // alignment) * alignment
    element_types = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "I8": np.int8, "I16": np.int16,
                     "I32": np.int32, "I64": np.int64}
    tensors, names = [], set()
    for name, dims, raw_type, offset in infos:
        if name in names:
            raise _Unsupported(f"duplicate tensor {name!r}")
        names.add(name)
        try:
            kind = GGMLQuantizationType(raw_type)
            block, type_size = GGML_QUANT_SIZES[kind]
        except (ValueError, KeyError):
            raise _Unsupported(f"tensor type {raw_type}") from None
        n_elements = int(np.prod(dims))
        n_bytes = n_elements * type_size // block
        rows = tuple(int(n) for n in reversed(dims.tolist()))
        item = element_types.get(kind.name)
        if item is None:  # block bytes of each row, as gguf's quant_shape_to_byte_shape
            if rows[-1] % block:
                raise _Unsupported(f"tensor {name!r}: a row is not whole blocks")
            item, count, rows = np.uint8, n_bytes, (*rows[:-1], rows[-1] // block * type_size)
        else:
            count = n_elements
        first = start + int(offset)
        if first + count * np.dtype(item).itemsize > data.size:
            raise _Unsupported(f"tensor {name!r} runs past the end of the file")
        array = data[first:first + count * np.dtype(item).itemsize].view(item).reshape(rows)
        tensors.append(GGUFTensor(name, kind, dims, n_elements, n_bytes, first, array))
    return GGUFFile(path, fields, tensors, alignment, start)


def open_gguf(path: str | Path) -> Any:
    """The metadata and tensor table of the GGUF file ``path``.

    Parameters
    ----------
    path : str or Path
        A GGUF file.

    Returns
    -------
    GGUFFile or gguf.GGUFReader
        A :class:`GGUFFile` for a little-endian version 2 or 3 file of scalar, string and
        flat array values; otherwise the ``gguf.GGUFReader`` of the file (the same interface).

    Raises
    ------
    Exception
        Whatever ``gguf.GGUFReader`` raises for a file that neither reads (callers turn it into
        one line naming the file).
    """
    path = Path(path)
    try:
        return _parse(path)
    except (_Unsupported, UnicodeDecodeError, ValueError):
        import gguf

        return gguf.GGUFReader(path)
