"""The metrics tables' Parquet encodings (kvasym.dataset.parquet_encodings): lossless, and smaller.

Continuous float columns are byte-stream split without a dictionary, discrete ones keep the
dictionary; either way every value reads back as the same bits (NaN, infinities, signed zeros,
subnormals and nulls included), and a continuous column takes less room than the dictionary
writer's fallback gave it.
"""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from kvasym.dataset import parquet_encodings, write_parquet_atomic


def _bits(table: pa.Table, name: str) -> np.ndarray:
    column = table.column(name).combine_chunks()
    return np.frombuffer(column.buffers()[1], dtype=np.uint64, count=len(column), offset=column.offset * 8)


def test_each_column_gets_the_encoding_its_values_call_for() -> None:
    rng = np.random.default_rng(0)
    n = 20_000
    table = pa.table({"kl": rng.exponential(size=n), "recall": rng.integers(0, 6, n) / 5.0,
                      "per_trial": np.repeat(rng.normal(size=32), n // 32 + 1)[:n],
                      "trial": np.arange(n, dtype=np.int32), "scheme": ["KV"] * n})
    options = parquet_encodings(table)
    assert options["use_byte_stream_split"] == ["kl"]
    assert options["use_dictionary"] == ["recall", "per_trial", "trial", "scheme"]
    # the file says so: the split column's pages are BYTE_STREAM_SPLIT, the others dictionary pages
    buffer = io.BytesIO()
    pq.write_table(table, buffer, **options)
    meta = pq.ParquetFile(io.BytesIO(buffer.getvalue())).metadata.row_group(0)
    encodings = {meta.column(i).path_in_schema: set(meta.column(i).encodings) for i in range(meta.num_columns)}
    assert "BYTE_STREAM_SPLIT" in encodings["kl"] and not {"RLE_DICTIONARY", "PLAIN_DICTIONARY"} & encodings["kl"]
    assert "RLE_DICTIONARY" in encodings["recall"]
    # and the continuous column is smaller than the dictionary writer's fallback made it
    plain = io.BytesIO()
    pq.write_table(table.select(["kl"]), plain, compression="zstd")
    split = io.BytesIO()
    pq.write_table(table.select(["kl"]), split, **parquet_encodings(table.select(["kl"])))
    assert len(split.getvalue()) < 0.9 * len(plain.getvalue())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True), min_size=1, max_size=600),
       st.integers(0, 3))
def test_values_read_back_bit_for_bit(values: list[float], repeat: int) -> None:
    data = np.array(values * (1 + 300 * repeat), dtype=np.float64)
    with np.errstate(over="ignore"):  # values beyond float32's range become infinities, as intended
        y_values = data.astype(np.float32)
    table = pa.table({"x": data, "y": y_values})
    buffer = io.BytesIO()
    pq.write_table(table, buffer, **parquet_encodings(table))
    back = pq.read_table(io.BytesIO(buffer.getvalue()))
    assert np.array_equal(_bits(back, "x"), _bits(table, "x"))
    y = back.column("y").combine_chunks()
    assert np.array_equal(np.frombuffer(y.buffers()[1], dtype=np.uint32, count=len(y), offset=y.offset * 4),
                          y_values.view(np.uint32))


def test_nulls_survive(tmp_path) -> None:
    table = pa.table({"x": pa.array([1.5, None, -0.0, float("nan")] * 2000)})
    write_parquet_atomic(table, tmp_path / "t.parquet", {"k": "v"})
    back = pq.read_table(tmp_path / "t.parquet")
    assert back.column("x").null_count == 2000
    assert back.column("x").to_pylist()[:3] == [1.5, None, -0.0]
    assert np.signbit(back.column("x").to_pylist()[2])
