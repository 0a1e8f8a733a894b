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

A big-endian file (its values, and its tensors' elements, in big-endian order; a tensor's data
then a big-endian view, as ``GGUFReader`` gives it) and one holding an array of arrays (a list
of lists, as written; ``GGUFReader``'s ``contents()`` flattens it) are read here too: one parser
for every file, never ``gguf.GGUFReader``, whose loops trust the file's counts (an array count
past the end of the file made it spin for hours) and which reads a tensor at an offset past the
end as one wrapped round to the start of the data (issue 51). A file that is not well formed
raises :class:`MalformedGGUF`, in one line naming the key, tensor or value. Malformed: truncated (any count, string,
array or tensor running past the end of the file), another GGUF version, an unknown value or
tensor type, a key or tensor name that is not UTF-8 or appears twice, a ``general.alignment``
that is not a uint32 power of two, a tensor of more than four dimensions, a row of a quantized
tensor that is not whole blocks, a tensor offset that is not a multiple of the alignment, or two
tensors whose data overlap. Tests compare every field and tensor with ``GGUFReader``'s on the
shipped model and on the tiny models of every supported family.

References
----------
ggml ``docs/gguf.md`` (the file format); gguf-py ``gguf/gguf_reader.py`` (``GGUFReader``).
"""

from __future__ import annotations

import math
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
_MAX_DIMS = 4  # ggml's GGML_MAX_DIMS


class MalformedGGUF(ValueError):
    """A file that is not a well-formed GGUF file; the message names what is wrong and where."""


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
    """Reads at a moving offset of a bytes-like buffer (little-endian unless ``order`` is ``>``);
    a read past the end raises :class:`MalformedGGUF` naming ``where``, what is being read."""

    def __init__(self, buffer: memoryview) -> None:
        self.buffer = buffer
        self.offset = 0
        self.order = "<"
        self.where = "the header"

    def past_end(self, what: str = "") -> MalformedGGUF:
        return MalformedGGUF(f"{self.where}{what} runs past the end of the file ({len(self.buffer)} bytes): "
                             "truncated or damaged?")

    def unpack(self, fmt: str) -> Any:
        try:
            (value,) = struct.unpack_from(self.order + fmt, self.buffer, self.offset)
        except struct.error:
            raise self.past_end() from None
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
            if item == _ARRAY:  # each item at least its own 12-byte header: bounded by the file
                return [self.value(_ARRAY) for _ in range(count)]
            fmt = _SCALAR_FORMATS.get(item)
            if fmt is None:
                raise MalformedGGUF(f"{self.where} is an array of unknown value type {item}")
            size = struct.calcsize(fmt) * count
            if self.offset + size > len(self.buffer):
                raise self.past_end(f" (an array of {count} items of type {item})")
            values = np.frombuffer(self.buffer, dtype=self.order + fmt, count=count, offset=self.offset).tolist()
            self.offset += size
            return values
        fmt = _SCALAR_FORMATS.get(kind)
        if fmt is None:
            raise MalformedGGUF(f"{self.where} has unknown value type {kind}")
        return self.unpack(fmt)

    def strings(self, count: int) -> list[str]:
        # the vocabulary's loop: one length and one slice a string, no numpy view
        buffer, offset, out = self.buffer, self.offset, []
        length_at = struct.Struct(self.order + "Q").unpack_from
        size = len(buffer)
        for _ in range(count):
            if offset + 8 > size:
                raise self.past_end(f" (string {len(out)} of {count})")
            (length,) = length_at(buffer, offset)
            offset += 8
            if offset + length > size:
                raise self.past_end(f" (a string of {length} bytes)")
            try:
                out.append(str(buffer[offset:offset + length], encoding="utf-8"))
            except UnicodeDecodeError:
                raise MalformedGGUF(f"{self.where} holds a string that is not UTF-8") from None
            offset += length
        self.offset = offset
        return out


def _parse(path: Path) -> GGUFFile:
    """The file's :class:`GGUFFile`; raises :class:`MalformedGGUF`."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    if path.stat().st_size == 0:
        raise MalformedGGUF("the file is empty")
    data = np.memmap(path, mode="r")
    cursor = _Cursor(memoryview(data))
    if cursor.unpack("I") != _MAGIC:
        raise MalformedGGUF(f"no GGUF magic: the file starts with {bytes(data[:4])!r}, not b'GGUF'")
    version = cursor.unpack("I")
    if version & 0xFFFF == 0:  # written the other way round: a big-endian file (as gguf's reader tells)
        cursor.order = ">"
        version = int.from_bytes(version.to_bytes(4, "little"), "big")
    if version not in _VERSIONS:
        raise MalformedGGUF(f"GGUF version {version}; supported: {', '.join(map(str, _VERSIONS))}")
    n_tensors, n_keys = cursor.unpack("Q"), cursor.unpack("Q")
    fields: dict[str, GGUFField] = {}
    for index in range(n_keys):
        cursor.where = f"metadata key {index} of {n_keys}"
        key = cursor.string()
        if key in fields:
            raise MalformedGGUF(f"metadata key {key!r} appears twice")
        cursor.where = f"the value of {key!r}"
        kind = cursor.unpack("I")
        fields[key] = GGUFField(key, cursor.value(kind), kind)
    infos = []
    for index in range(n_tensors):
        cursor.where = f"tensor-table entry {index} of {n_tensors}"
        name = cursor.string()
        cursor.where = f"the tensor-table entry of {name!r}"
        n_dims = cursor.unpack("I")
        if n_dims > _MAX_DIMS:
            raise MalformedGGUF(f"tensor {name!r} has {n_dims} dimensions (at most {_MAX_DIMS})")
        dims = [cursor.unpack("Q") for _ in range(n_dims)]
        infos.append((name, dims, cursor.unpack("I"), cursor.unpack("Q")))
    alignment = _DEFAULT_ALIGNMENT
    if "general.alignment" in fields:  # a uint32 power of two, as gguf's reader requires
        found = fields["general.alignment"]
        alignment = found.value
        if found.value_type != 4 or alignment <= 0 or alignment & (alignment - 1):
            raise MalformedGGUF(f"general.alignment = {alignment!r} (value type {found.value_type}) is not a "
                                "uint32 power of two")
    start = -(-cursor.offset // alignment) * alignment
    element_types = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "I8": np.int8, "I16": np.int16,
                     "I32": np.int32, "I64": np.int64}
    tensors, extents, names = [], [], set()
    for name, dims, raw_type, offset in infos:
        if name in names:
            raise MalformedGGUF(f"tensor {name!r} appears twice")
        names.add(name)
        try:
            kind = GGMLQuantizationType(raw_type)
            block, type_size = GGML_QUANT_SIZES[kind]
        except (ValueError, KeyError):
            raise MalformedGGUF(f"tensor {name!r} has unknown GGML type {raw_type}") from None
        n_elements = math.prod(dims)  # Python integers: a product past 64 bits does not wrap round
        if math.prod(n for n in dims if n) >= 2**63:
            raise MalformedGGUF(f"tensor {name!r} has dimensions {dims}, whose product overflows int64")
        rows = tuple(reversed(dims))
        item = element_types.get(kind.name)
        if item is not None:  # the file's byte order, as GGUFReader's view (quantized blocks are bytes)
            item = np.dtype(item).newbyteorder(cursor.order)
        else:  # block bytes of each row, as gguf's quant_shape_to_byte_shape
            if not rows or rows[-1] % block:
                raise MalformedGGUF(f"tensor {name!r} of type {kind.name} has rows of {rows[-1] if rows else 1} "
                                    f"values, not whole blocks of {block}")
            item, rows = np.uint8, (*rows[:-1], rows[-1] // block * type_size)
        n_bytes = n_elements * type_size // block
        if offset % alignment:
            raise MalformedGGUF(f"tensor {name!r} starts at offset {offset} of the data, not a multiple of the "
                                f"alignment {alignment}")
        first = start + offset
        if first + n_bytes > data.size:
            raise MalformedGGUF(f"tensor {name!r} ({n_bytes} bytes at offset {offset} of the data, which starts at "
                                f"byte {start}) runs past the end of the file ({data.size} bytes): truncated or "
                                "damaged?")
        extents.append((first, first + n_bytes, name))
        array = data[first:first + n_bytes].view(item).reshape(rows)
        tensors.append(GGUFTensor(name, kind, np.asarray(dims, dtype=np.uint64), n_elements, n_bytes, first, array))
    extents.sort()
    for (_, end, before), (first, _, after) in zip(extents, extents[1:]):
        if first < end:
            raise MalformedGGUF(f"tensors {before!r} and {after!r} overlap in the data section")
    return GGUFFile(path, fields, tensors, alignment, start)


def open_gguf(path: str | Path) -> Any:
    """The metadata and tensor table of the GGUF file ``path``.

    Parameters
    ----------
    path : str or Path
        A GGUF file.

    Returns
    -------
    GGUFFile
        Of a version 2 or 3 file, little- or big-endian, its values scalars, strings or arrays
        (of arrays too).

    Raises
    ------
    MalformedGGUF
        The file is not a well-formed GGUF file (see the module docstring); the message names
        the key, tensor or value (callers add the file).
    OSError
        The file cannot be read.
    """
    path = Path(path)
    try:
        return _parse(path)
    except RecursionError:
        raise MalformedGGUF("arrays of arrays nested too deep to read") from None
