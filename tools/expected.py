"""Expected results: a digest of a run's numbers, to commit and check so that no number changes by accident.

:func:`snapshot` reduces a finished run (its ``results/`` folder) to a small, deterministic JSON
document: every claim of ``claims/claims.json`` (id, verdict, estimate, low, high, log10_p) and,
for each gathered table (``stats/comparisons``, ``stats/summary``, ``stats/trials``,
``theory/theory``) and each metrics dataset (``metrics/per_query``, ``metrics/per_key``, every
file), the row count, a SHA-256 of the key (non-float) columns and, per float column, the count
of finite and NaN values and the exact sum, sum of absolute values, sum of squares, minimum and
maximum of the finite values. Rows are put in a canonical order first (sorted by the key
columns, then the float columns), and sums are computed with :func:`math.fsum` (correctly
rounded, independent of order), so neither file order nor row order matters.

:func:`compare` lists the differences between two snapshots, one line each. Ids, verdicts, row
counts, column lists and key hashes must be equal; floats must agree within the tolerance
:data:`RTOL` / :data:`ATOL`. The pipeline is deterministic: the same code gives bit-identical
results on one machine whatever ``--cores``. Across CPUs, BLAS kernels and numpy's SIMD loops
change last bits, which on the tiny grid's few units can flip a tie or a discrete p-value: the
tiny grid is therefore run, for the committed file and for its test, in the numeric environment
that :mod:`tools.numeric_env` pins (OpenBLAS's Haswell kernels, numpy's loops at x86-64-v3),
where the results are bit-identical across x86-64 machines. The tolerance only absorbs what is
left of another numpy/BLAS build; any real change of a number is far larger and is reported.

The committed file is ``tests/expected/tiny_grid.json`` (the tiny grid, ``config/test.yaml``,
with the real-model rows), checked by ``tests/test_expected_results.py``. A commit that changes
results regenerates it (:data:`REGENERATE`) and says in its message why the numbers changed.

``python3 -m tools.expected --results results --write FILE`` writes a snapshot;
``python3 -m tools.expected --results results --check FILE`` compares with one and exits 0 when
equal, 1 (printing every difference) when not, 2 (one line) when an input is unreadable.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvasym.artifacts import under_results
from kvasym.atomic import atomic_target
from kvasym.dataset import SCHEMAS, read_parquet_checked, read_table
from kvasym.errors import KvasymError

__all__ = ["ATOL", "ERROR_PREFIX", "FORMAT", "GATHERED_TABLES", "METRICS_TABLES", "REGENERATE", "RTOL", "compare",
           "dumps", "load", "main", "snapshot", "table_digest", "write"]

#: Version of the snapshot layout (a different one is a difference, not a crash).
FORMAT = 1
#: What an error message starts with: this tool's name, not the kvasym CLI's ("kvasym: error:").
ERROR_PREFIX = "tools.expected: error:"
#: Relative tolerance of float comparisons (see the module docstring for why it is this small).
RTOL = 1e-9
#: Absolute tolerance of float comparisons: only for values that should be zero.
ATOL = 1e-12
#: The gathered tables: snapshot name -> path under the results folder.
GATHERED_TABLES = {name: under_results(name) for name in ("comparisons", "summary", "trials", "theory")}
#: Tables only some runs have (a frontier: config key frontier.schemes; a sequence-length sweep:
#: seq_len_sweep.seq_lens), digested when present.
OPTIONAL_TABLES = {name: under_results(name)
                   for name in ("frontier_points", "frontier_units", "seq_len_rows", "seq_len_slopes")}
#: The metrics datasets (every file under ``metrics/<table>/``).
METRICS_TABLES = tuple(SCHEMAS)
#: The claim fields a snapshot keeps (besides the id).
CLAIM_FIELDS = ("verdict", "estimate", "low", "high", "log10_p")
#: How to regenerate the committed file, from the repository root (a copy of the working tree,
#: uncommitted files included, runs the tiny grid; the checkout's own results/ is not touched),
#: in the pinned numeric environment and with an empty codebook cache, as the tests' run has
#: (tests/conftest.py): a codebook cached by an earlier unpinned run differs from a fresh one in
#: its last bits, and dequantization reads the centroids from it, so every metric would move at
#: 1e-12.
REGENERATE = (
    'd=$(mktemp -d) && git ls-files -co --exclude-standard | tar -cf - -T - | tar -xf - -C "$d" && '
    '(cd "$d" && KVASYM_CACHE_DIR="$d/.codebooks" PYTHONPATH="$d/src" python3 -m tools.numeric_env '
    'snakemake --cores 2 --configfile config/test.yaml) && '
    'PYTHONPATH=src python3 -m tools.expected --results "$d/results" --write tests/expected/tiny_grid.json'
)
_ABOUT = (
    "Expected results of the tiny grid (config/test.yaml, with the real-model rows), checked by "
    "tests/test_expected_results.py with tools.expected.compare (floats within RTOL/ATOL of tools.expected). "
    "A commit that changes results regenerates this file and says why the numbers changed. Regenerate with: "
    + REGENERATE
)


def _number(value: Any) -> float | str | None:
    """A JSON-safe number: finite floats as they are, non-finite ones as 'nan', 'inf', '-inf'."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise KvasymError(f"expected a number, got {value!r}")
    value = float(value)
    if math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def _canonical(value: Any) -> Any:
    """A key cell as a plain JSON value (numpy scalars unwrapped, missing values as None)."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return _number(value)
    if isinstance(value, str):
        return value
    try:
        if pd.isna(value):
            return None
    except (TypeError, ValueError):
        pass
    return str(value)


def _is_float(series: pd.Series) -> bool:
    return pd.api.types.is_float_dtype(series.dtype)


def _sort_column(series: pd.Series) -> pd.Series:
    """A column as something pandas sorts deterministically (categoricals and mixed objects as
    the JSON text of their canonical values)."""
    if isinstance(series.dtype, pd.CategoricalDtype) or series.dtype == object:
        return series.astype(object).map(lambda v: json.dumps(_canonical(v)))
    return series


def _float_stats(values: np.ndarray) -> dict[str, Any]:
    """Count of finite and NaN values, and exact sums, min and max of the finite values."""
    values = np.asarray(values, dtype=np.float64)
    finite = values[np.isfinite(values)]
    items = finite.tolist()
    stats: dict[str, Any] = {"finite": len(items), "nan": int(np.isnan(values).sum())}
    try:
        stats["sum"] = _number(math.fsum(items))
        stats["sum_abs"] = _number(math.fsum(abs(x) for x in items))
        stats["sum_sq"] = _number(math.fsum(x * x for x in items))
    except OverflowError:  # finite values whose exact sum leaves the float range
        stats.update({"sum": "overflow", "sum_abs": "overflow", "sum_sq": "overflow"})
    stats["min"] = _number(min(items)) if items else None
    stats["max"] = _number(max(items)) if items else None
    return stats


def table_digest(frame: pd.DataFrame) -> dict[str, Any]:
    """The digest of one table: row count, key columns and their SHA-256, float column statistics.

    Parameters
    ----------
    frame
        The table. Float columns are summarised; every other column (strings, integers, booleans)
        is a key column, hashed exactly.

    Returns
    -------
    dict
        ``rows``, ``key_columns`` (sorted names), ``key_sha256`` (of the key columns, rows in
        canonical order) and ``float_columns`` (name -> ``finite``, ``nan``, ``sum``, ``sum_abs``,
        ``sum_sq``, ``min``, ``max``). Independent of the row order of ``frame``.
    """
    keys = sorted(str(c) for c in frame.columns if not _is_float(frame[c]))
    floats = sorted(str(c) for c in frame.columns if _is_float(frame[c]))
    if len(set(map(str, frame.columns))) != len(frame.columns):
        raise KvasymError(f"table has duplicate column names: {list(frame.columns)}")
    frame = frame.rename(columns=str).reset_index(drop=True)
    order = pd.DataFrame({c: _sort_column(frame[c]) for c in keys + floats}, index=frame.index)
    if len(order.columns):
        order = order.sort_values(by=list(order.columns), kind="mergesort", na_position="last")
    frame = frame.loc[order.index] if len(order.columns) else frame
    digest = hashlib.sha256()
    for name in keys:
        cells = [_canonical(v) for v in frame[name].astype(object).tolist()]
        digest.update(json.dumps([name, cells], separators=(",", ":"), allow_nan=False).encode())
        digest.update(b"\n")
    return {
        "rows": int(len(frame)),
        "key_columns": keys,
        "key_sha256": digest.hexdigest(),
        "float_columns": {name: _float_stats(frame[name].to_numpy(dtype=np.float64, na_value=np.nan))
                          for name in floats},
    }


def _claims(path: Path) -> dict[str, dict[str, Any]]:
    if not path.is_file():
        raise KvasymError(f"{path}: no such file (run the pipeline first)")
    try:
        ledger = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise KvasymError(f"{path}: not a readable claims ledger ({exc})") from None
    if not isinstance(ledger, list) or not all(isinstance(c, Mapping) and "id" in c for c in ledger):
        raise KvasymError(f"{path}: expected a list of claims with an 'id' each")
    out: dict[str, dict[str, Any]] = {}
    for claim in ledger:
        cid = str(claim["id"])
        if cid in out:
            raise KvasymError(f"{path}: claim {cid} appears twice")
        entry: dict[str, Any] = {"verdict": claim.get("verdict")}
        for field in CLAIM_FIELDS[1:]:
            try:
                entry[field] = _number(claim.get(field))
            except (TypeError, ValueError):
                raise KvasymError(f"{path}: claim {cid}: {field} is not a number ({claim.get(field)!r})") from None
        out[cid] = entry
    return out


def snapshot(results_dir: str | Path) -> dict[str, Any]:
    """The digest of a finished run: every claim and every table.

    Parameters
    ----------
    results_dir
        The run's results folder (``results/``): it must hold ``claims/claims.json``, the gathered
        tables of :data:`GATHERED_TABLES` and the metrics datasets ``metrics/per_query`` and
        ``metrics/per_key``; the tables of :data:`OPTIONAL_TABLES` are digested when present.

    Returns
    -------
    dict
        ``format``, ``claims`` (id -> verdict, estimate, low, high, log10_p) and ``tables`` (name
        -> :func:`table_digest`), plus an ``_about`` note. Plain JSON values only; :func:`write`
        stores it with sorted keys.

    Raises
    ------
    KvasymError
        The folder, the ledger or a table is missing or unreadable.
    """
    root = Path(results_dir)
    if not root.is_dir():
        raise KvasymError(f"{root}: no such results folder")
    tables: dict[str, Any] = {}
    for name, rel in GATHERED_TABLES.items():
        tables[name] = table_digest(read_parquet_checked(root / rel))
    for name, rel in OPTIONAL_TABLES.items():
        if (root / rel).is_file():
            tables[name] = table_digest(read_parquet_checked(root / rel))
    for name in METRICS_TABLES:
        tables[name] = table_digest(read_table((root / under_results("metrics_dataset")).parent, name))
    claims = _claims(root / under_results("claims_json"))
    return {"_about": _ABOUT, "format": FORMAT, "claims": claims, "tables": tables}


def dumps(snap: Mapping[str, Any]) -> str:
    """A snapshot as deterministic JSON text (sorted keys, one space indent, final newline)."""
    return json.dumps(snap, sort_keys=True, indent=1, allow_nan=False) + "\n"


def write(snap: Mapping[str, Any], path: str | Path) -> None:
    """Write a snapshot to ``path`` atomically (see :func:`dumps`)."""
    text = dumps(snap)
    with atomic_target(path) as tmp:
        tmp.write_text(text)


def load(path: str | Path) -> dict[str, Any]:
    """Read a snapshot written by :func:`write`.

    Raises
    ------
    KvasymError
        The file is missing, not JSON or not a snapshot.
    """
    path = Path(path)
    try:
        snap = json.loads(path.read_text())
    except FileNotFoundError:
        raise KvasymError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise KvasymError(f"{path}: not a readable snapshot ({exc})") from None
    if not isinstance(snap, dict) or not isinstance(snap.get("claims"), dict) or not isinstance(
            snap.get("tables"), dict):
        raise KvasymError(f"{path}: not a snapshot (expected an object with 'claims' and 'tables')")
    return snap


def _close(a: Any, b: Any, rtol: float, atol: float, scale: float = 0.0) -> bool:
    """Floats within ``atol + rtol * max(|a|, |b|, scale)``; anything else compared exactly."""
    numeric = (int, float)
    if isinstance(a, numeric) and isinstance(b, numeric) and not isinstance(a, bool) and not isinstance(b, bool):
        if isinstance(a, int) and isinstance(b, int):
            return a == b
        return abs(a - b) <= atol + rtol * max(abs(a), abs(b), scale)
    return a == b and type(a) is type(b)


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, float) else json.dumps(value)


def _compare_claims(expected: Mapping[str, Any], actual: Mapping[str, Any], rtol: float, atol: float) -> list[str]:
    out = []
    for cid in sorted(set(expected) | set(actual)):
        if cid not in actual:
            out.append(f"claim {cid}: expected, missing from the actual results")
            continue
        if cid not in expected:
            out.append(f"claim {cid}: in the actual results, not expected")
            continue
        exp, act = expected[cid], actual[cid]
        for field in sorted(set(exp) | set(act)):
            a, b = exp.get(field), act.get(field)
            same = a == b if field == "verdict" else _close(a, b, rtol, atol)
            if not same:
                out.append(f"claim {cid}: {field} expected {_show(a)}, actual {_show(b)}")
    return out


def _compare_table(name: str, exp: Mapping[str, Any], act: Mapping[str, Any], rtol: float, atol: float) -> list[str]:
    out = []
    for field in ("rows", "key_columns", "key_sha256"):
        if exp.get(field) != act.get(field):
            out.append(f"table {name}: {field} expected {_show(exp.get(field))}, actual {_show(act.get(field))}")
    exp_cols, act_cols = exp.get("float_columns", {}), act.get("float_columns", {})
    for col in sorted(set(exp_cols) | set(act_cols)):
        if col not in act_cols:
            out.append(f"table {name}: float column {col} expected, missing from the actual results")
            continue
        if col not in exp_cols:
            out.append(f"table {name}: float column {col} in the actual results, not expected")
            continue
        e, a = exp_cols[col], act_cols[col]
        # a sum is only as exact as its terms: its tolerance scales with the sum of |x|
        scale = max((v for v in (e.get("sum_abs"), a.get("sum_abs")) if isinstance(v, float)), default=0.0)
        for stat in sorted(set(e) | set(a)):
            x, y = e.get(stat), a.get(stat)
            if not _close(x, y, rtol, atol, scale if stat == "sum" else 0.0):
                out.append(f"table {name}: column {col}: {stat} expected {_show(x)}, actual {_show(y)}")
    return out


def compare(expected: Mapping[str, Any], actual: Mapping[str, Any], rtol: float = RTOL,
            atol: float = ATOL) -> list[str]:
    """The differences between two snapshots, one line each (empty when they agree).

    Parameters
    ----------
    expected, actual
        Snapshots (:func:`snapshot` or :func:`load`).
    rtol, atol
        Float tolerance: ``|a - b| <= atol + rtol * max(|a|, |b|)`` (for a column's ``sum``, the
        larger ``sum_abs`` of the two also counts as a scale, since cancellation leaves a sum no
        more exact than its terms). The default 1e-9 / 1e-12 is far above the last-bit noise of
        another numpy/BLAS build and far below any real change; on one machine the pipeline is
        bit-identical.

    Returns
    -------
    list of str
        Each line names the claim or table (and column, statistic) and both values. Ids,
        verdicts, row counts, key columns and key hashes are compared exactly, and a claim, table
        or column present in only one snapshot is a difference.
    """
    out = []
    if expected.get("format") != actual.get("format"):
        out.append(f"snapshot format: expected {_show(expected.get('format'))}, actual {_show(actual.get('format'))}")
    out += _compare_claims(expected.get("claims", {}), actual.get("claims", {}), rtol, atol)
    exp_tables, act_tables = expected.get("tables", {}), actual.get("tables", {})
    for name in sorted(set(exp_tables) | set(act_tables)):
        if name not in act_tables:
            out.append(f"table {name}: expected, missing from the actual results")
        elif name not in exp_tables:
            out.append(f"table {name}: in the actual results, not expected")
        else:
            out += _compare_table(name, exp_tables[name], act_tables[name], rtol, atol)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python3 -m tools.expected [--results DIR] (--write FILE | --check FILE) [--rtol R] [--atol A]``."""
    parser = argparse.ArgumentParser(prog="python3 -m tools.expected", description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", default="results", help="the run's results folder (default: results)")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", metavar="FILE", help="write the snapshot of the results to FILE")
    mode.add_argument("--check", metavar="FILE", help="compare the results with the snapshot in FILE")
    parser.add_argument("--rtol", type=float, default=RTOL, help=f"relative float tolerance (default {RTOL:g})")
    parser.add_argument("--atol", type=float, default=ATOL, help=f"absolute float tolerance (default {ATOL:g})")
    args = parser.parse_args(argv)
    try:
        expected = load(args.check) if args.check else None
        actual = snapshot(args.results)
    except KvasymError as exc:
        print(f"{ERROR_PREFIX} {exc}", file=sys.stderr)
        return 2
    if args.write:
        try:
            write(actual, args.write)
        except OSError as exc:
            print(f"{ERROR_PREFIX} {exc.filename or args.write}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        print(f"wrote {args.write}: {len(actual['claims'])} claims, {len(actual['tables'])} tables")
        return 0
    diffs = compare(expected, actual, rtol=args.rtol, atol=args.atol)
    if not diffs:
        print(f"{args.results} matches {args.check} ({len(actual['claims'])} claims, {len(actual['tables'])} tables,"
              f" rtol {args.rtol:g}, atol {args.atol:g})")
        return 0
    print("\n".join(diffs))
    print(f"{len(diffs)} difference(s) between {args.results} and {args.check}"
          f" (rtol {args.rtol:g}, atol {args.atol:g}). If the change is intended, regenerate the file"
          f" and say why in the commit message:\n  {REGENERATE}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
