"""benchmarks/makespan.py: the list scheduler and critical path against hand-computed cases, the
cost reader on a tiny results folder, and the parsers of Snakemake's dry-run and --d3dag output
(given as text: no Snakemake call)."""

from __future__ import annotations

import importlib.util
import itertools
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("makespan", ROOT / "benchmarks" / "makespan.py")
makespan = importlib.util.module_from_spec(_spec)
sys.modules["makespan"] = makespan  # its dataclasses look their module up while it loads
_spec.loader.exec_module(makespan)

HEAD = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"


def test_a_chain_takes_its_sum_on_any_number_of_cores():
    jobs, deps, cost = ["a", "b", "c"], {"b": ["a"], "c": ["b"]}, {"a": 1.0, "b": 2.0, "c": 3.0}
    for cores in (1, 2, 8):
        span, start = makespan.schedule(jobs, deps, cost, None, cores)
        assert span == 6.0
        assert start == {"a": 0.0, "b": 1.0, "c": 3.0}
    assert makespan.critical_path(jobs, deps, cost) == (6.0, ["a", "b", "c"])


def test_a_fork_join_by_hand():
    # s -> x, y, z -> t; longest remaining paths x 5, z 4, y 3
    jobs = ["s", "x", "y", "z", "t"]
    deps = {"x": ["s"], "y": ["s"], "z": ["s"], "t": ["x", "y", "z"]}
    cost = {"s": 1.0, "x": 4.0, "y": 2.0, "z": 3.0, "t": 1.0}
    # 2 cores: x and z start at 1, y when z ends (4), t when y ends (6)
    span, start = makespan.schedule(jobs, deps, cost, None, 2)
    assert span == 7.0
    assert start == {"s": 0.0, "x": 1.0, "z": 1.0, "y": 4.0, "t": 6.0}
    assert makespan.schedule(jobs, deps, cost, None, 1)[0] == 11.0
    assert makespan.schedule(jobs, deps, cost, None, 3)[0] == 6.0
    assert makespan.critical_path(jobs, deps, cost) == (6.0, ["s", "x", "t"])


def test_jobs_with_threads_take_that_many_cores_for_cost_over_threads():
    jobs, cost, threads = ["a", "b", "c"], {"a": 4.0, "b": 2.0, "c": 2.0}, {"a": 2}
    # 2 cores: a (2 threads, 2 s) first by job order, then b and c together
    span, start = makespan.schedule(jobs, {}, cost, threads, 2)
    assert (span, start) == (4.0, {"a": 0.0, "b": 2.0, "c": 2.0})
    # 1 core: a's threads are capped at 1, so it takes its 4 CPU s
    assert makespan.schedule(jobs, {}, cost, threads, 1)[0] == 8.0
    assert makespan.schedule(jobs, {}, cost, threads, 4) == (2.0, {"a": 0.0, "b": 0.0, "c": 0.0})
    assert makespan.critical_path(jobs, {}, cost, threads, 1) == (4.0, ["a"])
    assert makespan.critical_path(jobs, {}, cost, threads, 2) == (2.0, ["a"])


def test_a_job_that_does_not_fit_waits_and_a_smaller_one_goes_first():
    # priorities b 3, a 1, c 1 (a before c by order); a needs both cores
    jobs, cost, threads = ["a", "b", "c"], {"a": 2.0, "b": 3.0, "c": 1.0}, {"a": 2}
    span, start = makespan.schedule(jobs, {}, cost, threads, 2)
    assert (span, start) == (4.0, {"b": 0.0, "c": 0.0, "a": 3.0})


def _layered_dag() -> tuple[list[str], dict[str, list[str]], dict[str, float]]:
    jobs = [f"j{i}" for i in range(12)]
    deps = {f"j{i}": [f"j{k}" for k in range(i) if (i * 7 + k * 3) % 5 == 0] for i in range(12)}
    cost = {f"j{i}": float((i * 37) % 11 + 1) for i in range(12)}
    return jobs, deps, cost


def test_enough_cores_give_the_critical_path_and_one_core_the_total():
    jobs, deps, cost = _layered_dag()
    length, path = makespan.critical_path(jobs, deps, cost)
    for a, b in itertools.pairwise(path):
        assert a in deps[b]
    assert length == sum(cost[j] for j in path)
    assert makespan.schedule(jobs, deps, cost, None, len(jobs))[0] == length
    assert makespan.schedule(jobs, deps, cost, None, 100)[0] == length
    span, start = makespan.schedule(jobs, deps, cost, None, 1)
    assert span == sum(cost.values())
    for job, before in deps.items():
        for dep in before:
            assert start[job] >= start[dep] + cost[dep]
    for cores in (2, 3, 4):
        span = makespan.schedule(jobs, deps, cost, None, cores)[0]
        assert max(length, sum(cost.values()) / cores) <= span <= sum(cost.values())


def test_no_jobs_zero_costs_and_bad_input():
    assert makespan.schedule([], {}, {}, None, 4) == (0.0, {})
    assert makespan.critical_path([], {}, {}) == (0.0, [])
    assert makespan.schedule(["a", "b"], {"b": iter(["a"])}, {}, None, 2) == (0.0, {"a": 0.0, "b": 0.0})
    with pytest.raises(ValueError, match="cycle"):
        makespan.schedule(["a", "b"], {"a": ["b"], "b": ["a"]}, {}, None, 1)
    with pytest.raises(ValueError, match="unknown"):
        makespan.schedule(["a"], {"a": ["z"]}, {}, None, 1)
    with pytest.raises(ValueError, match="cores"):
        makespan.schedule(["a"], {}, {}, None, 0)


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def test_costs_come_from_the_log_line_else_the_benchmark_file(tmp_path):
    results = tmp_path / "results"
    done = "kvasym: stage {} done: cpu_s={} max_rss_mib=300\n"
    _write(results, "logs/cells/t3/d128.log", "kvasym 0.1.0 stage cells\n" + done.format("cells", "12.50"))
    _write(results, "benchmarks/cells/t3/d128.tsv", HEAD + "20.0\t0:00:20\t1\t1\t1\t1\t0\t0\t0\t9.0\n")
    _write(results, "logs/figures/marginals.log", "kvasym 0.1.0 stage figure\n" + done.format("figure", "3.25"))
    # a log without its line (still running): the benchmark file's cpu_time, or its wall time when 0 or NA
    _write(results, "logs/stats/t3/d128.log", "kvasym 0.1.0 stage stats\n")
    _write(results, "benchmarks/stats/t3/d128.tsv", HEAD + "11.5\t0:00:11\t1\t1\t1\t1\t0\t0\t0\t9.75\n")
    _write(results, "benchmarks/real/capture.tsv", HEAD + "0.4\t0:00:00\tNA\tNA\tNA\tNA\tNA\tNA\tNA\tNA\n")
    jobs = [
        makespan.Job(0, "all"),
        makespan.Job(1, "cells", {"distribution": "t3", "dim": "128"}),
        makespan.Job(2, "figure_marginals"),
        makespan.Job(3, "stats", {"distribution": "t3", "dim": "128"}),
        makespan.Job(4, "capture"),
        makespan.Job(5, "stats", {"distribution": "t5", "dim": "128"}),
        makespan.Job(6, "stats", {"distribution": "t2", "dim": "128"}),
        makespan.Job(7, "theory", {"distribution": "t3", "dim": "128"}),
    ]
    _write(results, "logs/theory/t3/d128.log", "kvasym 0.1.0 stage theory\n")  # running, no benchmark yet
    _write(results, "logs/stats/t2/d128.log", done.format("stats", "8.25"))
    costs = makespan.job_costs(results, jobs)
    assert costs[0] == makespan.Cost(0.0, "none")
    assert costs[1] == makespan.Cost(12.5, "log", str(results / "logs/cells/t3/d128.log"))
    assert costs[2] == makespan.Cost(3.25, "log", str(results / "logs/figures/marginals.log"))
    assert costs[3] == makespan.Cost(9.75, "benchmark cpu_time", str(results / "benchmarks/stats/t3/d128.tsv"))
    assert costs[4] == makespan.Cost(0.4, "benchmark wall s", str(results / "benchmarks/real/capture.tsv"))
    assert costs[5] == makespan.Cost(0.0, "none")
    assert costs[7] == makespan.Cost(0.0, "none", str(results / "logs/theory/t3/d128.log"))
    filled = makespan.job_costs(results, jobs, fill="rule-median")
    assert filled[5] == makespan.Cost(9.0, "rule median")  # median of 9.75 and 8.25
    assert filled[0] == makespan.Cost(0.0, "none")


DRY_RUN = """\
Building DAG of jobs...
Job stats:
job      count
total        4

[Sat Dec  5 13:03:30 2026]
rule cells:
    output: results/data/lowrank2/d128.json, results/packed/lowrank2/d128
    log: results/logs/cells/lowrank2/d128.log
    jobid: 2
    benchmark: results/benchmarks/cells/lowrank2/d128.tsv
    reason: Forced execution
    wildcards: distribution=lowrank2, dim=128
    threads: 4
    resources: tmpdir=/tmp, runtime=7, mem_mb=720, mem=720 MB, mem_mib=687
Shell command: kvasym stage cells --slice '{}' > results/logs/cells/lowrank2/d128.log 2>&1

[Sat Dec  5 13:03:30 2026]
localrule figure_marginals:
    input: results/stats/summary.parquet
    log: results/logs/figures/marginals.log
    jobid: 1
    reason: Forced execution
    resources: tmpdir=/tmp
Shell command: kvasym stage figure --family marginals

[Sat Dec  5 13:03:30 2026]
rule all:
    input: results/data/lowrank2/d128.json
    jobid: 0
    reason: Forced execution
    resources: tmpdir=/tmp
Shell command: None
This was a dry-run (flag -n). The order of jobs does not reflect the order of execution.
"""


def test_the_dry_run_and_d3dag_parsers():
    jobs = makespan.parse_dry_run(DRY_RUN)
    assert jobs == {
        2: makespan.Job(2, "cells", {"distribution": "lowrank2", "dim": "128"}, 4,
                        "results/logs/cells/lowrank2/d128.log"),
        1: makespan.Job(1, "figure_marginals", {}, 1, "results/logs/figures/marginals.log"),
        0: makespan.Job(0, "all"),
    }
    d3 = {"nodes": [{"id": i, "value": {"jobid": i, "label": r, "rule": r}}
                    for i, r in ((0, "all"), (1, "figure_marginals"), (2, "cells"))],
          "edges": [{"u": 2, "v": 1}, {"u": 1, "v": 0}, {"u": 2, "v": 0}]}
    rules, edges = makespan.parse_d3dag("Building DAG of jobs...\n" + json.dumps(d3) + "\n")
    assert rules == {0: "all", 1: "figure_marginals", 2: "cells"}
    assert edges == [(2, 1), (1, 0), (2, 0)]
    assert makespan.job_key("figure_marginals", {}) == "figures/marginals"
    assert makespan.job_key("cells", jobs[2].wildcards) == "cells/lowrank2/d128"
    assert makespan.job_key("all", {}) is None
