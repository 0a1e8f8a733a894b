"""Expected results of the tiny grid (tests/expected/tiny_grid.json): a change in any number is deliberate.

The session's tiny run (``tiny_local_run``, tests/conftest.py) must match the committed digest of
every claim and every table (tools.expected); the rest are unit tests of the digest and of the
comparison, on synthetic tables.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kvasym.dataset import SCHEMAS
from tools import expected as ex

EXPECTED = Path(__file__).resolve().parent / "expected" / "tiny_grid.json"


@pytest.mark.slow
def test_tiny_run_matches_the_expected_results(tiny_local_run):
    """Every claim's estimate, interval, p-value and verdict, and the digest of every gathered
    table and metrics dataset of the tiny run, as committed."""
    from kvasym.real import missing_extra_reason
    from tools.numeric_env import pin_unavailable_reason

    reason = missing_extra_reason()
    if reason is not None:
        pytest.skip(f"REAL-MODEL EXTRA MISSING: the expected results include the real rows ({reason})")
    reason = pin_unavailable_reason()
    if reason is not None:
        pytest.skip(f"NUMERIC ENVIRONMENT NOT PINNED: the expected results were computed with OpenBLAS's "
                    f"Haswell kernels and numpy's x86-64-v3 loops (tools.numeric_env), and {reason}")
    diffs = ex.compare(ex.load(EXPECTED), ex.snapshot(tiny_local_run / "results"))
    assert not diffs, (
        f"the tiny run differs from {EXPECTED.relative_to(EXPECTED.parents[2])} in {len(diffs)} place(s) "
        f"(floats within rtol {ex.RTOL:g}, atol {ex.ATOL:g}):\n  " + "\n  ".join(diffs)
        + "\nIf the change is intended, regenerate the file from the repository root with\n  "
        + ex.REGENERATE
        + "\nand commit it with a message that says why the numbers changed."
    )


# --- unit tests: compare() ---------------------------------------------------------------------


def _table() -> pd.DataFrame:
    rng = np.random.default_rng(3)
    n = 40
    return pd.DataFrame({
        "distribution": np.repeat(["gaussian", "t1.05"], n // 2),
        "scheme": np.tile(["KV", "KQV", "QKQV", "RKV"], n // 4),
        "trial": np.arange(n, dtype=np.int32) % 5,
        "query": np.arange(n, dtype=np.int32),
        "significant": np.arange(n) % 3 == 0,
        "sharpness": np.where(np.arange(n) % 2, 1.0, 4.0),
        "kl": rng.exponential(1e-3, n),
        "log_ratio": rng.normal(0.0, 1.0, n),
    })


def _snap() -> dict:
    claims = {
        "C1": {"verdict": "holds", "estimate": 1.5869132572040008, "low": 1.55, "high": 1.61, "log10_p": None},
        "C2": {"verdict": "does not hold", "estimate": 5.6, "low": 5.3, "high": 6.0, "log10_p": -16.4},
        "C99": {"verdict": "not evaluated", "estimate": None, "low": None, "high": None, "log10_p": None},
    }
    return {"format": ex.FORMAT, "claims": claims, "tables": {"summary": ex.table_digest(_table())}}


def test_compare_equal_snapshots_have_no_difference():
    assert ex.compare(_snap(), _snap()) == []
    # through the committed file's JSON form too
    assert ex.compare(json.loads(ex.dumps(_snap())), _snap()) == []


def test_compare_reports_an_estimate_beyond_the_tolerance_not_within_it():
    actual = _snap()
    actual["claims"]["C1"]["estimate"] *= 1 + 1e-6
    diffs = ex.compare(_snap(), actual)
    assert len(diffs) == 1 and diffs[0].startswith("claim C1: estimate expected 1.5869132572040008, actual 1.58691")
    within = _snap()
    within["claims"]["C1"]["estimate"] *= 1 + 1e-12
    assert within["claims"]["C1"]["estimate"] != _snap()["claims"]["C1"]["estimate"]
    assert ex.compare(_snap(), within) == []
    # a value appearing where there was none is a difference
    appeared = _snap()
    appeared["claims"]["C99"]["estimate"] = 1.0
    assert ex.compare(_snap(), appeared) == ["claim C99: estimate expected null, actual 1.0"]


def test_compare_reports_a_changed_verdict_and_a_missing_or_extra_claim():
    actual = _snap()
    actual["claims"]["C2"]["verdict"] = "inconclusive"
    assert ex.compare(_snap(), actual) == ['claim C2: verdict expected "does not hold", actual "inconclusive"']
    missing = _snap()
    del missing["claims"]["C99"]
    assert ex.compare(_snap(), missing) == ["claim C99: expected, missing from the actual results"]
    assert ex.compare(missing, _snap()) == ["claim C99: in the actual results, not expected"]


def test_compare_reports_a_changed_row_count_and_key_hash():
    fewer = _snap()
    fewer["tables"]["summary"] = ex.table_digest(_table().iloc[:-1])
    diffs = ex.compare(_snap(), fewer)
    assert "table summary: rows expected 40, actual 39" in diffs
    assert any(d.startswith("table summary: key_sha256 expected") for d in diffs)
    # the same rows and floats with one key changed: only the hash tells
    relabelled = _table()
    relabelled.loc[0, "scheme"] = "KQV"
    changed = _snap()
    changed["tables"]["summary"] = ex.table_digest(relabelled)
    diffs = ex.compare(_snap(), changed)
    assert len(diffs) == 1 and diffs[0].startswith("table summary: key_sha256 expected")
    assert diffs[0].count(_snap()["tables"]["summary"]["key_sha256"]) == 1


def test_compare_reports_float_columns_and_missing_tables():
    frame = _table()
    frame.loc[7, "kl"] *= 1.001
    changed = _snap()
    changed["tables"]["summary"] = ex.table_digest(frame)
    diffs = ex.compare(_snap(), changed)
    assert diffs and all(d.startswith("table summary: column kl: ") for d in diffs)
    assert any(": sum expected " in d for d in diffs)
    # a NaN where a number was: the counts tell
    frame = _table()
    frame.loc[3, "log_ratio"] = np.nan
    nan = _snap()
    nan["tables"]["summary"] = ex.table_digest(frame)
    assert "table summary: column log_ratio: nan expected 0, actual 1" in ex.compare(_snap(), nan)
    dropped = _snap()
    dropped["tables"]["summary"] = ex.table_digest(_table().drop(columns="kl"))
    assert ex.compare(_snap(), dropped) == ["table summary: float column kl expected, missing from the actual results"]
    gone = _snap()
    del gone["tables"]["summary"]
    assert ex.compare(_snap(), gone) == ["table summary: expected, missing from the actual results"]


def test_compare_sum_tolerance_scales_with_the_terms():
    """A column summing to about zero by cancellation: last-bit noise in its terms is not a change."""
    frame = pd.DataFrame({"id": [0, 1, 2], "x": [1.0e6, -1.0e6, 1e-3]})
    noisy = frame.copy()
    noisy.loc[0, "x"] = np.nextafter(1.0e6, 2.0e6)  # one ulp: the sum moves by 1e-10, 1e-7 of itself
    assert ex.compare({"tables": {"t": ex.table_digest(frame)}}, {"tables": {"t": ex.table_digest(noisy)}}) == []


# --- unit tests: snapshot() ----------------------------------------------------------------------


def _metrics_frame(table: str, rng: np.random.Generator) -> pd.DataFrame:
    """A small synthetic metrics table with the dataset's schema (two cells, a few rows each)."""
    n = 24
    cols = {}
    for field in SCHEMAS[table]:
        if pa.types.is_string(field.type):
            cols[field.name] = np.repeat(["gaussian", "lowrank4"], n // 2) if field.name in ("distribution", "kind") \
                else np.tile(["KV", "KQV"], n // 2)
        elif pa.types.is_integer(field.type):
            cols[field.name] = (np.arange(n) % 7 + 1).astype(field.type.to_pandas_dtype())
        else:
            cols[field.name] = rng.normal(size=n)
    cols["sharpness"] = np.where(np.arange(n) % 2, 1.0, 4.0)
    return pd.DataFrame(cols)


def _write_results(root: Path, frames: dict[str, pd.DataFrame], claims: list[dict], split: int) -> None:
    """A results folder: the gathered tables, the claims and the metrics datasets (each metrics
    table in ``split`` files)."""
    for name, rel in ex.GATHERED_TABLES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        frames[name].to_parquet(root / rel, index=False)
    for table in ex.METRICS_TABLES:
        for i, part in enumerate(np.array_split(np.arange(len(frames[table])), split)):
            path = root / "metrics" / table / f"part{i}" / "n2.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            chunk = pa.Table.from_pandas(frames[table].iloc[part], schema=SCHEMAS[table], preserve_index=False)
            pq.write_table(chunk, path)
    (root / "claims").mkdir(parents=True, exist_ok=True)
    (root / "claims" / "claims.json").write_text(json.dumps(claims))


def test_snapshot_is_independent_of_file_and_row_order(tmp_path):
    rng = np.random.default_rng(11)
    frames = {name: _table() for name in ex.GATHERED_TABLES}
    frames["summary"].loc[5, "kl"] = np.nan
    frames.update({table: _metrics_frame(table, rng) for table in ex.METRICS_TABLES})
    claims = [{"id": "C1", "estimate": 1.25, "low": 1.0, "high": 1.5, "log10_p": -3.5, "verdict": "holds",
               "details": {"n": 3}},
              {"id": "C99", "estimate": None, "low": None, "high": None, "log10_p": None, "verdict": "not evaluated"}]
    _write_results(tmp_path / "a", frames, claims, split=1)
    shuffled = {name: f.sample(frac=1.0, random_state=5) for name, f in frames.items()}
    _write_results(tmp_path / "b", shuffled, claims[::-1], split=3)

    a, b = ex.snapshot(tmp_path / "a"), ex.snapshot(tmp_path / "b")
    assert ex.dumps(a) == ex.dumps(b)
    assert set(a["tables"]) == set(ex.GATHERED_TABLES) | set(ex.METRICS_TABLES)
    assert a["claims"]["C1"] == {"verdict": "holds", "estimate": 1.25, "low": 1.0, "high": 1.5, "log10_p": -3.5}
    assert a["tables"]["per_query"]["rows"] == 24 and "kl" in a["tables"]["per_query"]["float_columns"]
    assert a["tables"]["summary"]["float_columns"]["kl"]["nan"] == 1
    assert a["tables"]["summary"]["key_columns"] == ["distribution", "query", "scheme", "significant", "trial"]

    # one value of one metrics file changed: the snapshot tells
    frames["per_key"].loc[4, "k_snr_db"] += 0.5
    _write_results(tmp_path / "c", frames, claims, split=2)
    diffs = ex.compare(a, ex.snapshot(tmp_path / "c"))
    assert diffs and all(d.startswith("table per_key: column k_snr_db: ") for d in diffs)


def test_cli_write_check_and_exit_codes(tmp_path, capsys):
    rng = np.random.default_rng(2)
    frames = {name: _table() for name in ex.GATHERED_TABLES}
    frames.update({table: _metrics_frame(table, rng) for table in ex.METRICS_TABLES})
    claims = [{"id": "C1", "estimate": 2.0, "low": 1.0, "high": 3.0, "log10_p": None, "verdict": "holds"}]
    _write_results(tmp_path / "results", frames, claims, split=2)
    out = tmp_path / "expected.json"
    results = str(tmp_path / "results")
    assert ex.main(["--results", results, "--write", str(out)]) == 0
    assert ex.main(["--results", results, "--check", str(out)]) == 0
    assert json.loads(out.read_text())["format"] == ex.FORMAT
    edited = copy.deepcopy(json.loads(out.read_text()))
    edited["claims"]["C1"]["verdict"] = "fails"
    out.write_text(json.dumps(edited))
    capsys.readouterr()
    assert ex.main(["--results", results, "--check", str(out)]) == 1
    printed = capsys.readouterr().out
    assert 'claim C1: verdict expected "fails", actual "holds"' in printed and "--write" in printed
    # unreadable inputs: one line, exit 2
    assert ex.main(["--results", str(tmp_path / "nowhere"), "--check", str(out)]) == 2
    assert ex.main(["--results", results, "--check", str(tmp_path / "missing.json")]) == 2
    (tmp_path / "bad.json").write_text("{not json")
    assert ex.main(["--results", results, "--check", str(tmp_path / "bad.json")]) == 2
    (tmp_path / "results" / "claims" / "claims.json").write_text("[")
    assert ex.main(["--results", results, "--write", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # the tool's own prefix (it is not the kvasym CLI), each line naming the file
    assert len(err) == 4 and all(line.startswith("tools.expected: error: ") for line in err), err
    assert "nowhere" in err[0] and "missing.json" in err[1] and "bad.json" in err[2] and "claims.json" in err[3], err


def test_committed_expected_file_is_a_current_snapshot():
    """The committed file loads, is in the current layout and is written as write() writes it."""
    snap = ex.load(EXPECTED)
    assert snap["format"] == ex.FORMAT
    # the tiny grid has a frontier (config/test.yaml), so its optional tables are digested too
    assert set(snap["tables"]) == set(ex.GATHERED_TABLES) | set(ex.METRICS_TABLES) | set(ex.OPTIONAL_TABLES)
    assert EXPECTED.read_text() == ex.dumps(snap)
    # its note names the command that regenerates it, as write() would write it today
    assert snap["_about"] == ex._ABOUT and ex.REGENERATE in snap["_about"]
    assert all(c["verdict"] for c in snap["claims"].values())


def test_report_check_errors_carry_its_own_prefix(monkeypatch, capsys):
    """tools.report_check is not the kvasym CLI: its one-line errors say which tool failed, name
    the report, and exit 2."""
    from kvasym.errors import KvasymError
    from tools import report_check

    def fails(report, categories=None, *, screenshots=None):
        raise KvasymError(f"report {report}: 'Figures' not found after (home)")

    monkeypatch.setattr(report_check, "check_report", fails)
    assert report_check.main(["some/report.html"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["tools.report_check: error: report some/report.html: 'Figures' not found after (home)"]
