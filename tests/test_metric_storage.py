"""The metrics tables store their measured values as float32 (kvasym.dataset.METRIC_TYPE, issue 29
point 4) and every reader widens them back to float64; the per-query output site's decibels and
``1 - cos`` are not stored but derived, by every reader, from its Shannon bits and angle.

Checked against IEEE round-to-nearest found by brute force (the two float32 neighbours of each
float64, the nearer kept, ties to the even one), not against numpy's own cast alone.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from kvasym.metrics import SNR_DB_CAP, error_coordinates

from kvasym.cells import iter_cell_tables, read_metrics_rows
from kvasym.dataset import (
    DERIVED_COLUMNS,
    METRIC_TYPE,
    PER_KEY_SCHEMA,
    PER_QUERY_SCHEMA,
    from_stored,
    read_table,
    stored_columns,
    to_table,
    write_parquet_atomic,
)

IDS = {"distribution", "kind", "dim", "scheme", "budget", "sharpness", "trial", "query", "key", "n_queries"}


def _nearest_float32(x: float) -> np.float32:
    """Round-to-nearest-even of one float64 into float32, by comparing its two float32 neighbours."""
    if not np.isfinite(x):
        return np.float32(x)
    low = np.float32(x)
    if float(low) > x:
        low = np.nextafter(low, np.float32(-np.inf))
    high = np.nextafter(low, np.float32(np.inf)) if float(low) != x else low
    d_low, d_high = x - float(low), float(high) - x
    if d_low < d_high:
        return low
    if d_high < d_low:
        return high
    return low if int(low.view(np.uint32)) % 2 == 0 else high


def _columns(schema: pa.Schema, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for field in schema:
        if pa.types.is_string(field.type):
            out[field.name] = np.array(["gaussian"] * n)
        elif pa.types.is_integer(field.type):
            out[field.name] = np.arange(n) % 100
        else:
            out[field.name] = rng.lognormal(-4.0, 3.0, n) * rng.choice([-1.0, 1.0], n)
    return out


def test_the_measured_columns_are_float32_and_the_identifiers_and_bits_float64():
    for schema in (PER_QUERY_SCHEMA, PER_KEY_SCHEMA):
        for field in schema:
            if pa.types.is_floating(field.type):
                wide = field.name in IDS or "_bits_" in field.name
                assert field.type == (pa.float64() if wide else METRIC_TYPE), field.name
    assert METRIC_TYPE == pa.float32()
    assert PER_QUERY_SCHEMA.field("kl").type == pa.float32()
    assert PER_QUERY_SCHEMA.field("k_bits_side").type == pa.float64()  # read by the equal-rate interpolation


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.floats(min_value=-3e38, max_value=3e38, allow_nan=False, allow_infinity=False),
                          st.sampled_from([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, 5e-324])),
                min_size=1, max_size=40))
def test_a_stored_metric_is_its_value_rounded_to_the_nearest_float32(values: list[float]) -> None:
    n = len(values)
    columns = _columns(PER_QUERY_SCHEMA, n, np.random.default_rng(0))
    columns["kl"] = np.array(values, dtype=np.float64)
    stored = to_table(columns, PER_QUERY_SCHEMA).column("kl").to_numpy()
    assert stored.dtype == np.float32
    for x, got in zip(values, stored):
        want = _nearest_float32(x)
        if np.isnan(x):
            assert np.isnan(got)
        else:
            assert got.view(np.uint32) == want.view(np.uint32), (x, got, want)
            if np.isfinite(x) and abs(x) >= 2.0**-126:  # a normal float32: a relative change of at most 2^-24
                assert abs(float(got) - x) <= abs(x) * 2.0**-24


def test_readers_widen_the_stored_values_to_float64_exactly(tmp_path):
    rng = np.random.default_rng(1)
    n = 500
    columns = _columns(PER_QUERY_SCHEMA, n, rng)
    columns.update({"scheme": np.array(["KV"] * n), "budget": np.full(n, 4), "dim": np.full(n, 64),
                    "sharpness": np.full(n, 1.0), "k_bits_side": np.full(n, 2.6)})
    path = tmp_path / "metrics" / "per_query" / "gaussian" / "d64" / "KV" / "n4.parquet"
    write_parquet_atomic(to_table(columns, PER_QUERY_SCHEMA), path, {})
    raw = pq.read_table(path).to_pandas()
    assert raw["kl"].dtype == np.float32 and raw["k_bits_side"].dtype == np.float64
    np.testing.assert_array_equal(raw["kl"].to_numpy(), columns["kl"].astype(np.float32))
    assert (raw["k_bits_side"] == 2.6).all()  # not rounded
    for frame in (read_table(tmp_path / "metrics", "per_query"),
                  read_metrics_rows([path], "per_query", {}),
                  from_stored(raw.copy())):
        floats = [c for c in frame.columns if frame[c].dtype.kind == "f"]
        assert floats and all(frame[c].dtype == np.float64 for c in floats)
        np.testing.assert_array_equal(frame["kl"].to_numpy(), raw["kl"].to_numpy().astype(np.float64))
    # a mean over the widened values is the float64 mean of the stored ones, not a float32 sum's
    stored = raw["kl"].to_numpy()
    assert from_stored(raw.copy())["kl"].mean() == np.mean(stored.astype(np.float64))
    # from_stored leaves other columns and frames without float32 columns as they are
    plain = pd.DataFrame({"a": np.arange(3), "b": ["x", "y", "z"], "c": np.ones(3)})
    assert from_stored(plain.copy()).equals(plain)


def test_the_output_sites_decibels_and_one_minus_cos_are_derived_not_stored():
    assert set(DERIVED_COLUMNS["per_query"]) == {"t_snr_db", "t_eps_dir"}
    for name in ("t_snr_db", "t_eps_dir"):
        assert name not in PER_QUERY_SCHEMA.names
    for name in ("t_eff_bits", "t_phi", "k_snr_db", "k_eps_dir", "v_snr_db", "v_eps_dir"):
        assert name in PER_QUERY_SCHEMA.names  # K and V: eps_dir is a mean over rows, no function of the mean angle
    assert stored_columns(["kl", "t_eps_dir", "t_phi", "t_snr_db"]) == ["kl", "t_phi", "t_eff_bits"]


def test_derived_columns_equal_the_float64_coordinates_to_float32_rounding(tmp_path):
    """Against :func:`kvasym.metrics.error_coordinates` (``10 log10`` of the SNR and
    ``1 - cos phi`` by its own formulas) on vectors from exact to opposite."""
    rng = np.random.default_rng(2)
    n, d = 400, 64
    x = rng.standard_normal((n, d))
    scale = np.concatenate([10.0 ** rng.uniform(-9, 0.5, n - 4), [0.0, 1e-30, 2.0, 3.0]])
    x_hat = x + scale[:, None] * rng.standard_normal((n, d))
    x_hat[-2:] = -x[-2:] * np.array([[1.0], [0.5]])  # opposite: phi = pi
    coords = error_coordinates(x, x_hat)
    columns = _columns(PER_QUERY_SCHEMA, n, rng)
    columns.update({"scheme": np.array(["KV"] * n), "budget": np.full(n, 4), "dim": np.full(n, 64),
                    "sharpness": np.full(n, 1.0), "t_eff_bits": coords["eff_bits"], "t_phi": coords["phi"]})
    path = tmp_path / "per_query" / "gaussian" / "d64" / "KV" / "n4.parquet"
    write_parquet_atomic(to_table(columns, PER_QUERY_SCHEMA), path, {})
    assert not {"t_snr_db", "t_eps_dir"} & set(pq.read_schema(path).names)
    read = [read_table(tmp_path, "per_query"), read_metrics_rows([path], "per_query", {}),
            next(iter_cell_tables([path], "per-query", ("distribution", "dim", "scheme", "budget"),
                                  columns=["t_snr_db", "t_eps_dir"]))[1]]
    for frame in read:
        snr_db, eps = frame["t_snr_db"].to_numpy(), frame["t_eps_dir"].to_numpy()
        assert snr_db.dtype == eps.dtype == np.float64
        # a float32 rounding of eff_bits or phi: relative 2^-24, at most doubled by 1 - cos
        np.testing.assert_allclose(snr_db, coords["snr_db"], rtol=2.0**-23, atol=0)
        np.testing.assert_allclose(eps, coords["eps_dir"], rtol=2.0**-22, atol=0)
        assert snr_db[-4] == coords["snr_db"][-4] == SNR_DB_CAP  # exact reconstruction: the cap, exactly
        assert eps[0] != coords["eps_dir"][0]  # derived from the stored angle, not a stored eps
    # a frame that already holds a derived column (a file written before) keeps it
    old = pd.DataFrame({"t_phi": np.float32([0.5]), "t_eps_dir": np.float32([0.25])})
    assert from_stored(old)["t_eps_dir"].tolist() == [0.25]


def test_a_file_without_a_derived_column_or_its_source_is_named_with_both(tmp_path):
    import pytest

    from kvasym.dataset import read_metrics_file
    from kvasym.errors import DamagedFile

    path = tmp_path / "n4.parquet"
    pq.write_table(pa.table({"kl": np.float32([0.5]), "t_eff_bits": np.float32([3.0])}), path)
    assert read_metrics_file(path, ["kl", "t_snr_db"])["t_snr_db"].tolist() == [2 * 10 * np.log10(2.0) * 3.0]
    with pytest.raises(DamagedFile, match=r"n4\.parquet: has no column\(s\) t_eps_dir \(or t_phi, which it is "
                                          r"derived from\), recall_top5$"):
        read_metrics_file(path, ["kl", "t_eps_dir", "recall_top5"])
    path.write_bytes(b"not parquet")
    with pytest.raises(DamagedFile, match="n4.parquet: not a readable Parquet table"):
        read_metrics_file(path, ["t_eps_dir"])
