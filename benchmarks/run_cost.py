"""CPU per rule of a finished run, from its job logs.

Every ``kvasym stage`` job ends its log (``results/logs/...``) with a line
``kvasym: stage <rule> done: cpu_s=<s> max_rss_mib=<MiB>``: the CPU seconds (user + system) of
the job's process and of the children it waited for, read with ``getrusage`` at its end. This
script sums them by rule and prints one row a rule (jobs, CPU s, share, the largest job, peak
resident set). Given the whole run's CPU seconds (``--total-cpu``, e.g. user + system of
``/usr/bin/time -v snakemake ...``), it prints the rest as Snakemake's own CPU plus what the
jobs' logs do not cover (process start before ``main``, the shell, LaTeX).

Snakemake's ``benchmark:`` files are not used: they sample the process tree at intervals and
give short jobs a CPU time that is too small or missing.

Usage::

    python benchmarks/run_cost.py [--results results] [--total-cpu SECONDS]
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

from kvasym.cli import COST_LINE

DONE = COST_LINE  # the line kvasym.cli writes, matched as it defines it


def job_costs(results: Path) -> list[tuple[str, Path, float, int]]:
    """(rule, log, CPU s, peak MiB) of every log under ``results/logs`` that ends with the line."""
    rows = []
    for log in sorted((results / "logs").rglob("*.log")):
        for line in reversed(log.read_text(encoding="utf-8", errors="replace").splitlines()):
            match = DONE.match(line)
            if match:
                rows.append((match[1], log, float(match[2]), int(match[3])))
                break
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("results"), help="the run's results folder")
    parser.add_argument("--total-cpu", type=float, help="the whole run's CPU seconds (user + system)")
    args = parser.parse_args(argv)
    if not (args.results / "logs").is_dir():
        print(f"run_cost: error: {args.results / 'logs'} is not a folder (run the DAG first)", file=sys.stderr)
        return 2
    rows = job_costs(args.results)
    if not rows:
        print(f"run_cost: error: no log under {args.results / 'logs'} has a 'kvasym: stage ... done' line",
              file=sys.stderr)
        return 2
    by_rule: dict[str, list[tuple[float, int, Path]]] = defaultdict(list)
    for rule, log, cpu, rss in rows:
        by_rule[rule].append((cpu, rss, log))
    jobs_cpu = sum(cpu for _, _, cpu, _ in rows)
    print(f"{'rule':24s} {'jobs':>5s} {'CPU s':>9s} {'share':>6s} {'largest job s':>14s} {'peak MiB':>9s}")
    for rule, jobs in sorted(by_rule.items(), key=lambda item: -sum(j[0] for j in item[1])):
        cpu = sum(j[0] for j in jobs)
        print(f"{rule:24s} {len(jobs):5d} {cpu:9.1f} {cpu / jobs_cpu:6.1%} {max(j[0] for j in jobs):14.1f} "
              f"{max(j[1] for j in jobs):9d}")
    print(f"{'all kvasym jobs':24s} {len(rows):5d} {jobs_cpu:9.1f}")
    if args.total_cpu is not None:
        rest = args.total_cpu - jobs_cpu
        print(f"{'rest (Snakemake, starts, LaTeX)':24s} {'':5s} {rest:9.1f} of {args.total_cpu:.1f} in all "
              f"({rest / args.total_cpu:.1%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
