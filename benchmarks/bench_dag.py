#!/usr/bin/env python
"""CPU time of one DAG job under two source trees, side by side, and whether their outputs agree.

A job is one ``kvasym stage ...`` shell command as Snakemake runs it (``snakemake -n -p`` prints
them; the paper run's logs hold them too), read from ``--job`` or a file (``--job-file``, the
first line starting ``kvasym stage`` or ``python -m kvasym.cli stage``). Its inputs are read from
``--workdir`` (a copied set: the command's relative paths are resolved there); every output the
command names (the stage's arguments listed in ``OUTPUT_FLAGS``, or
``--outputs``) is redirected to ``<scratch>/<side>/<path>`` so the two
sides never share a file and the input set is never written.

Each round runs the job once with ``PYTHONPATH=<before>`` and once with ``PYTHONPATH=<after>``,
in alternating order (before first on even rounds), each in a fresh interpreter with one BLAS /
OpenMP / numba thread, and records the child's user + system CPU seconds
(``resource.getrusage(RUSAGE_CHILDREN)`` around the run) and its wall time. CPU time is what
the ``benchmark:`` files' ``cpu_time`` sums; it is far less sensitive than wall time to other
processes on a shared machine, and interleaving spreads what remains over both sides.

After the rounds the outputs of the last run of each side are compared: Parquet files column by
column (same names, same dtypes, values bit-identical, else the largest absolute and relative
difference of the float columns and the number of unequal cells; NaN equals NaN; the files'
metadata, which holds the git commit, is ignored), JSON and text files by content, ``.npy`` /
``.npz`` by array.

Example (one real-row stats job of the paper grid, inputs copied to /tmp/job)::

    python benchmarks/bench_dag.py --before /tmp/old/src --after src --workdir /tmp/job \\
        --job-file /tmp/stats_smollm2.sh --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

#: Arguments of each ``kvasym stage`` command that name files the job writes (the same flag is
#: an input of one stage and an output of another: ``--per-query``, ``--trials``).
OUTPUT_FLAGS: dict[str, tuple[str, ...]] = {
    "cells": ("--manifest", "--packed", "--per-query", "--per-key"),  # folders but the manifest
    "metrics": ("--manifest", "--per-query", "--per-key"),
    "real_metrics": ("--out",),
    "stats": ("--comparisons", "--summary", "--trials"),
    "theory": ("--out",),
    "capture": ("--out",),
    "e2e": ("--out",),
    "e2e_stats": ("--out-summary", "--out-comparisons", "--out-sensitivity", "--out-agreement"),
}
THREAD_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "NUMBA_NUM_THREADS": "1"}


def parse_job(text: str) -> list[str]:
    """The stage arguments (after ``stage``) of a job's shell command, redirections dropped."""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("Shell command: "):
            line = line[len("Shell command: "):]
        match = re.search(r"(?:^|\s)(?:kvasym|python3? -m kvasym\.cli) stage (.*)$", line)
        if match:
            words = shlex.split(match.group(1))
            if ">" in words:
                words = words[:words.index(">")]
            return [w for w in words if not w.startswith(">") and w != "2>&1"]
    raise SystemExit("no 'kvasym stage ...' command found in the job text")


def redirect_outputs(args: list[str], root: Path, flags: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """``args`` with every output path under ``root``; and the outputs' original paths."""
    out, outputs, in_output = [], [], False
    for word in args:
        if word.startswith("--"):
            in_output = word in flags
            out.append(word)
        elif in_output:
            budget, sep, path = word.partition("=")  # real_metrics: --out BUDGET=FILE ...
            prefix, word = (f"{budget}=", path) if sep and budget.isdigit() else ("", word)
            outputs.append(word)
            target = root / word
            target.parent.mkdir(parents=True, exist_ok=True)
            out.append(prefix + str(target))
        else:
            out.append(word)
    return out, outputs


def run_once(src: str, args: list[str], workdir: Path, log: Path) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one run of the stage in a fresh interpreter."""
    import shutil

    for word in args:  # a folder output must not exist (kvasym.atomic.atomic_folder): the last round's goes
        path = Path(word.partition("=")[2] if "=" in word and word.partition("=")[0].isdigit() else word)
        if path.is_absolute() and path.is_dir() and (path / ".kvasym-folder").is_file():
            shutil.rmtree(path)
    env = {**os.environ, **THREAD_ENV, "PYTHONPATH": str(Path(src).resolve())}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with open(log, "w") as handle:
        code = subprocess.call([sys.executable, "-m", "kvasym.cli", "stage", *args], cwd=workdir, env=env,
                               stdout=handle, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if code != 0:
        raise SystemExit(f"the job failed under {src} (exit {code}); see {log}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def compare_arrays(a: np.ndarray, b: np.ndarray) -> dict[str, float | int | bool]:
    """Bit-identity of two arrays, else the largest differences (floats) and unequal count."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return {"identical": False, "note": f"shape/dtype {a.shape} {a.dtype} vs {b.shape} {b.dtype}"}
    if a.dtype.kind == "f":
        same = (a == b) | (np.isnan(a) & np.isnan(b))
        if same.all():
            return {"identical": True}
        finite = np.isfinite(a) & np.isfinite(b) & ~same
        diff = np.abs(a[finite] - b[finite])
        scale = np.maximum(np.abs(a[finite]), np.abs(b[finite]))
        return {"identical": False, "unequal": int((~same).sum()),
                "max_abs": float(diff.max()) if diff.size else float("nan"),
                "max_rel": float((diff / np.where(scale > 0, scale, 1.0)).max()) if diff.size else float("nan")}
    same = np.array([x == y for x, y in zip(a.ravel().tolist(), b.ravel().tolist())]) if a.dtype == object \
        else (a == b).ravel()
    return {"identical": bool(same.all()), "unequal": int((~same).sum())}


def compare_outputs(left: Path, right: Path) -> dict[str, object]:
    """Per-column (Parquet) or whole-file comparison of one output of the two sides; a folder
    output (a unit's packed caches or metrics) file by file."""
    if left.is_dir():
        names = sorted(str(p.relative_to(left)) for p in left.rglob("*") if p.is_file())
        if names != sorted(str(p.relative_to(right)) for p in right.rglob("*") if p.is_file()):
            return {"identical": False, "note": "the folders hold different files"}
        results = {name: compare_outputs(left / name, right / name) for name in names}
        return {"identical": all(r["identical"] for r in results.values()), "files": len(names),
                "differing": {k: r for k, r in results.items() if not r["identical"]}}
    if left.suffix == ".parquet":
        import pyarrow.parquet as pq

        ta, tb = pq.read_table(left), pq.read_table(right)
        if ta.schema.names != tb.schema.names:
            return {"identical": False, "note": f"columns differ: {ta.schema.names} vs {tb.schema.names}"}
        columns = {}
        for name in ta.schema.names:
            a = ta.column(name).to_numpy(zero_copy_only=False)
            b = tb.column(name).to_numpy(zero_copy_only=False)
            columns[name] = compare_arrays(np.asarray(a), np.asarray(b))
        differing = {k: v for k, v in columns.items() if not v["identical"]}
        return {"identical": not differing, "rows": ta.num_rows, "differing_columns": differing}
    if left.suffix in (".npy", ".npz"):
        la, lb = np.load(left, allow_pickle=False), np.load(right, allow_pickle=False)
        if left.suffix == ".npy":
            return compare_arrays(la, lb)
        keys = sorted(la.files)
        if keys != sorted(lb.files):
            return {"identical": False, "note": "different arrays"}
        results = {k: compare_arrays(la[k], lb[k]) for k in keys}
        return {"identical": all(r["identical"] for r in results.values()),
                "differing": {k: r for k, r in results.items() if not r["identical"]}}
    if left.suffix == ".json":
        return {"identical": json.loads(left.read_text()) == json.loads(right.read_text())}
    return {"identical": left.read_bytes() == right.read_bytes()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="source tree of the old code (its src/ directory)")
    parser.add_argument("--after", required=True, help="source tree of the new code (its src/ directory)")
    parser.add_argument("--workdir", required=True, help="directory the job's relative input paths live in")
    job = parser.add_mutually_exclusive_group(required=True)
    job.add_argument("--job", help="the job's shell command")
    job.add_argument("--job-file", help="a file holding it (e.g. snakemake -n -p output)")
    parser.add_argument("--outputs", nargs="*", help="output flags (default: the stage's OUTPUT_FLAGS)")
    parser.add_argument("--repeats", type=int, default=2, help="rounds (one run of each side per round)")
    parser.add_argument("--scratch", help="where the outputs go (default: a new temporary directory)")
    opts = parser.parse_args(argv)

    text = opts.job if opts.job is not None else Path(opts.job_file).read_text()
    stage_args = parse_job(text)
    if not opts.outputs and stage_args[0] not in OUTPUT_FLAGS:
        raise SystemExit(f"stage {stage_args[0]!r}: name its output flags with --outputs")
    flags = tuple(opts.outputs) if opts.outputs else OUTPUT_FLAGS[stage_args[0]]
    scratch = Path(opts.scratch or tempfile.mkdtemp(prefix="bench_dag_"))
    workdir = Path(opts.workdir).resolve()
    sides = {"before": opts.before, "after": opts.after}
    prepared = {}
    for side in sides:
        args, outputs = redirect_outputs(stage_args, scratch / side, flags)
        prepared[side] = args
    print(f"job: kvasym stage {stage_args[0]}  ({len(outputs)} outputs; scratch {scratch})")
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    times: dict[str, list[tuple[float, float]]] = {side: [] for side in sides}
    for round_ in range(opts.repeats):
        order = ("before", "after") if round_ % 2 == 0 else ("after", "before")
        for side in order:
            cpu, wall = run_once(sides[side], prepared[side], workdir, scratch / f"{side}.{round_}.log")
            times[side].append((cpu, wall))
            print(f"  round {round_}  {side:6s}  cpu {cpu:8.2f} s  wall {wall:8.2f} s")
    cpu = {side: float(np.median([t[0] for t in times[side]])) for side in sides}
    wall = {side: float(np.median([t[1] for t in times[side]])) for side in sides}
    print(f"median cpu  before {cpu['before']:.2f} s  after {cpu['after']:.2f} s  "
          f"ratio before/after {cpu['before'] / cpu['after']:.2f}x  saving {cpu['before'] - cpu['after']:.2f} s")
    print(f"median wall before {wall['before']:.2f} s  after {wall['after']:.2f} s")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    identical = True
    for path in outputs:
        result = compare_outputs(scratch / "before" / path, scratch / "after" / path)
        identical &= bool(result["identical"])
        print(f"output {path}: {'IDENTICAL' if result['identical'] else 'DIFFERS'}"
              + ("" if result["identical"] else f"  {json.dumps(result, default=str)[:2000]}"))
    return 0 if identical else 1


if __name__ == "__main__":
    raise SystemExit(main())
