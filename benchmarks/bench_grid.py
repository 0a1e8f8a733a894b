#!/usr/bin/env python
"""A whole run's job CPU time per rule, from its ``benchmark:`` files, and two runs side by side.

``python benchmarks/bench_grid.py RUN_A/results/benchmarks [RUN_B/results/benchmarks]`` sums the
``cpu_time`` and the wall time ``s`` of every benchmark file (the last row of each) per rule; with
two directories it also sums both over the jobs they have in common (same relative path), which
is the comparison the two runs can support, and prints their ratio B / A.

The rule of a file is its first path component under the directory (``metrics/t3/d128/KV/n4.tsv``
is ``metrics``), and for the real rows ``real_<stage>`` (``real/metrics/...``).

Snakemake's ``cpu_time`` is sampled, not exact: the job's process tree is read every 0.5 s for the
first 15 s and every 30 s after that, and the CPU spent after the last reading is lost. So a job
shorter than the first reading records 0, and a job of 20 s records its first 15. The table
counts both kinds per rule (``cpu 0`` and ``wall > 15 s``): where they are many, the sums are lower
bounds and a ratio of two sums is biased towards 1. ``bench_dag.py`` times single jobs exactly
(``getrusage`` of the child process).
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from pathlib import Path

#: Wall time (s) after which Snakemake's benchmark samples only every 30 s (30 samples at 0.5 s).
SAMPLED_EVERY_HALF_SECOND_UNTIL = 15.0


def rule_of(relative: Path) -> str:
    """The rule a benchmark file belongs to, from its path under the benchmarks directory."""
    parts = relative.parts
    if parts[0] == "real" and len(parts) > 2:
        return f"real_{parts[1]}"
    if len(parts) == 1:
        return relative.stem
    return parts[0]


def load_benchmarks(directory: Path) -> dict[str, tuple[float, float]]:
    """``{relative path: (cpu_time, wall s)}`` of every ``*.tsv`` benchmark file under ``directory``.

    Raises
    ------
    SystemExit
        If the directory does not exist, holds no benchmark file, or a file lacks the
        ``s`` / ``cpu_time`` columns or a value that parses as a number (named with its path).
    """
    if not directory.is_dir():
        raise SystemExit(f"bench_grid: {directory} is not a directory")
    out: dict[str, tuple[float, float]] = {}
    for path in sorted(directory.rglob("*.tsv")):
        with path.open(newline="") as handle:
            rows = list(csv.DictReader(handle, delimiter="\t"))
        if not rows:
            continue
        last = rows[-1]
        try:
            cpu, wall = float(last["cpu_time"]), float(last["s"])
        except (KeyError, TypeError, ValueError):
            raise SystemExit(f"bench_grid: {path} is not a Snakemake benchmark file (needs numeric s and cpu_time)")
        out[str(path.relative_to(directory))] = (cpu, wall)
    if not out:
        raise SystemExit(f"bench_grid: no benchmark file (*.tsv) under {directory}")
    return out


def summarize(a: dict[str, tuple[float, float]], b: dict[str, tuple[float, float]] | None = None) -> list[dict]:
    """Per-rule sums, busiest rule of ``a`` first, then a ``total`` row.

    Each row: ``rule``, ``jobs``, ``cpu``, ``wall``, ``cpu_zero`` (jobs recording 0 CPU),
    ``long`` (jobs over :data:`SAMPLED_EVERY_HALF_SECOND_UNTIL` s of wall time); with ``b``, the
    same for ``b`` (suffix ``_b``) and ``common`` jobs with their ``cpu_common_a`` / ``cpu_common_b``.
    """
    rules: dict[str, dict] = defaultdict(lambda: defaultdict(float))
    for side, data in (("", a), ("_b", b or {})):
        for rel, (cpu, wall) in data.items():
            row = rules[rule_of(Path(rel))]
            row["jobs" + side] += 1
            row["cpu" + side] += cpu
            row["wall" + side] += wall
            row["cpu_zero" + side] += cpu == 0.0
            row["long" + side] += wall > SAMPLED_EVERY_HALF_SECOND_UNTIL
    if b is not None:
        for rel in a.keys() & b.keys():
            row = rules[rule_of(Path(rel))]
            row["common"] += 1
            row["cpu_common_a"] += a[rel][0]
            row["cpu_common_b"] += b[rel][0]
    ordered = sorted(rules.items(), key=lambda kv: (-kv[1]["cpu"], kv[0]))
    table = [{"rule": name, **row} for name, row in ordered]
    total: dict = defaultdict(float)
    for row in table:
        for key, value in row.items():
            if key != "rule":
                total[key] += value
    table.append({"rule": "total", **total})
    return table


def render(table: list[dict], two: bool) -> str:
    """The summary as a Markdown table."""
    head = ["rule", "jobs", "CPU-s", "wall-s", "cpu 0", "wall > 15 s"]
    if two:
        head += ["jobs B", "CPU-s B", "wall-s B", "cpu 0 B", "wall > 15 s B", "common", "CPU-s A common",
                 "CPU-s B common", "B / A"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in table:
        get = row.get
        cells = [row["rule"], f"{get('jobs', 0):.0f}", f"{get('cpu', 0):.1f}", f"{get('wall', 0):.1f}",
                 f"{get('cpu_zero', 0):.0f}", f"{get('long', 0):.0f}"]
        if two:
            a_common, b_common = get("cpu_common_a", 0.0), get("cpu_common_b", 0.0)
            ratio = f"{b_common / a_common:.2f}x" if a_common > 0 else "-"
            cells += [f"{get('jobs_b', 0):.0f}", f"{get('cpu_b', 0):.1f}", f"{get('wall_b', 0):.1f}",
                      f"{get('cpu_zero_b', 0):.0f}", f"{get('long_b', 0):.0f}", f"{get('common', 0):.0f}",
                      f"{a_common:.1f}", f"{b_common:.1f}", ratio]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def target_line(total: dict, at_most: float) -> str:
    """``[MET]`` or ``[NOT MET]``: B's summed CPU over the common jobs against ``at_most`` times A's."""
    a, b = total.get("cpu_common_a", 0.0), total.get("cpu_common_b", 0.0)
    if not a > 0:
        return f"[NOT MEASURED] B's CPU at most {at_most:g}x A's: the runs have no common job with CPU recorded"
    ratio = b / a
    mark = "MET" if ratio <= at_most else "NOT MET"
    return (f"[{mark}] B's summed job CPU at most {at_most:g}x A's, on {total.get('common', 0):.0f} common jobs: "
            f"{b:.1f} / {a:.1f} CPU-s = {ratio:.3f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_a", type=Path, help="a run's benchmarks directory (results/benchmarks)")
    parser.add_argument("run_b", type=Path, nargs="?", help="a second run's, to compare on common jobs")
    parser.add_argument("--at-most", type=float, metavar="RATIO",
                        help="a target for two runs: B's CPU on the common jobs at most RATIO times A's "
                             "(issue 19: 0.333); marked MET or NOT MET as measured")
    args = parser.parse_args(argv)
    if args.at_most is not None and (args.run_b is None or not args.at_most > 0):
        parser.error("--at-most needs two runs and a positive ratio")
    a = load_benchmarks(args.run_a)
    b = load_benchmarks(args.run_b) if args.run_b is not None else None
    table = summarize(a, b)
    print(render(table, two=b is not None))
    if args.at_most is not None:
        print(target_line(table[-1], args.at_most))
    print("\ncpu 0: jobs whose sampled CPU is 0 (shorter than Snakemake's first reading); wall > 15 s: jobs "
          "whose CPU after their last reading (up to 30 s) is lost. Both make the sums lower bounds.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
