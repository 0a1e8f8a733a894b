#!/usr/bin/env python
"""Makespan model of the paper DAG: how long its jobs would take on N cores, given what each cost.

What it measures: for each core count N (``--cores``, default 2, 4, 8, 16, 64), the makespan of
a list schedule of the whole DAG (every job of ``snakemake --forceall``) on N cores, against the
two lower bounds no schedule can beat: the critical path (the longest chain of dependent jobs)
and the total CPU divided by N. It then prints the critical path job by job. The numbers model
the DAG's shape; they are not a measured run (no Snakemake overhead, no waiting for files, no
contention between jobs).

How:

- the DAG comes from Snakemake without running anything, in two dry invocations in the working
  directory (``--workdir``): ``snakemake --nolock --forceall --d3dag`` gives the jobs and their
  dependency edges (JSON, by job id), ``snakemake --nolock --forceall -n`` each job's rule,
  wildcards, declared ``threads`` (printed when above 1) and log, by the same job id. The two are
  joined by job id and must agree on every job's rule. (The ``--dag`` dot output is not used: a
  node's label shows only the wildcards its job does not share with a job it depends on.)
- a job's cost is its CPU seconds, from its log (``<results>/logs/<job key>.log``, the key of
  :data:`kvasym.artifacts.JOB_KEYS` with the job's wildcards; rule ``figure_<family>`` is stage
  ``figure`` with key ``figures/<family>``): every successful ``kvasym stage`` job ends it with
  ``kvasym: stage <stage> done: cpu_s=<s> max_rss_mib=<MiB>`` (``getrusage`` of the process and
  the children it waited for, :func:`kvasym.cli._cost_line`). A job whose log has no such line
  (still running, failed, or a rule that is not a stage) falls back to its Snakemake benchmark
  file (``<results>/benchmarks/<job key>.tsv``): its ``cpu_time``, which undercounts (sampled
  every 0.5 s for the first 15 s, then every 30 s), or its wall time ``s`` when ``cpu_time`` is
  0 or NA. A job with neither (not run yet; rule ``all``) costs 0, so on a partial run every
  number is a lower bound; ``--fill rule-median`` gives such a job the median cost of the
  measured jobs of its rule instead. The output says how many costs came from where, and names
  the jobs that fell back to a benchmark file.
- a job on N cores takes ``min(threads, N)`` cores (Snakemake scales a rule's threads down to
  the cores it has) for ``cost / min(threads, N)`` seconds, so its area is its CPU seconds and
  total CPU / N stays a lower bound. The schedule is a list schedule (Graham's, with the
  critical-path priority): whenever a job ends, the ready jobs are scanned by longest remaining
  path first (the job's own duration plus the longest chain of its successors' durations; ties
  by the order of the DAG's jobs) and every one that fits in the free cores starts. With
  N >= the sum of all jobs' threads it is the critical path; with N = 1 the total CPU.

The core (:func:`schedule`, :func:`critical_path`, :func:`job_costs`) is pure Python, callable
without Snakemake (``tests/test_makespan.py``).

Usage::

    python benchmarks/makespan.py [--results results] [--cores 2 4 8 16 64] [--json OUT]
        [--workdir .] [--fill none|rule-median] [--snakemake-args="--configfile config/test.yaml"]
"""

from __future__ import annotations

import argparse
import csv
import heapq
import json
import re
import shlex
import statistics
import subprocess
import sys
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: The last line of every successful ``kvasym stage`` job's log (``kvasym.cli``).
from kvasym.cli import COST_LINE

DONE = COST_LINE  # the line kvasym.cli writes, matched as it defines it
#: The core counts of the printed table unless ``--cores`` says otherwise.
DEFAULT_CORES = (2, 4, 8, 16, 64)
#: Where a job's cost came from (:class:`Cost`), in order of preference.
SOURCES = ("log", "benchmark cpu_time", "benchmark wall s", "rule median", "none")

_JOB_HEADER = re.compile(r"^(?:local)?(?:rule|checkpoint) (\S+):$")
_JOB_FIELD = re.compile(r"^    (\w+): (.*)$")
_WILDCARD_SPLIT = re.compile(r", (?=[A-Za-z_]\w*=)")


@dataclass
class Job:
    """One job of the DAG as Snakemake describes it.

    Attributes
    ----------
    id : int
        Snakemake's job id (the same in ``--d3dag`` and the dry run).
    rule : str
        The rule's name (``figure_<family>`` for a figure family).
    wildcards : dict of str to str
        The job's wildcards.
    threads : int
        The rule's declared threads (1 unless the dry run prints more).
    log : str or None
        The first log file Snakemake declares for the job, relative to the working directory.
    """

    id: int
    rule: str
    wildcards: dict[str, str] = field(default_factory=dict)
    threads: int = 1
    log: str | None = None

    def label(self) -> str:
        """``rule`` and its wildcards, e.g. ``cells distribution=t3 dim=128``."""
        return " ".join([self.rule, *(f"{k}={v}" for k, v in self.wildcards.items())])


@dataclass(frozen=True)
class Cost:
    """A job's CPU seconds and where they were read.

    Attributes
    ----------
    cpu_s : float
        CPU seconds (0 when nothing was found).
    source : str
        One of :data:`SOURCES`.
    path : str or None
        The file read (log or benchmark file), if any; for source ``none``, the job's log when it
        exists without its done line (the job is running, or failed).
    """

    cpu_s: float
    source: str
    path: str | None = None


# --------------------------------------------------------------------------------------------
# the scheduler (pure Python)
# --------------------------------------------------------------------------------------------


def _normalized(deps: Mapping[Hashable, Iterable[Hashable]]) -> dict[Hashable, list[Hashable]]:
    """``deps`` with each job's dependencies as a list (an iterator is read once)."""
    return {job: list(before) for job, before in deps.items()}


def _durations(jobs: Sequence[Hashable], cost: Mapping[Hashable, float], threads: Mapping[Hashable, int] | None,
               cores: int | None) -> tuple[dict[Hashable, float], dict[Hashable, int]]:
    """Each job's duration and cores on ``cores`` cores (None: unlimited)."""
    if cores is not None and cores < 1:
        raise ValueError(f"cores must be at least 1, not {cores}")
    duration, need = {}, {}
    for job in jobs:
        t = 1 if threads is None else int(threads.get(job, 1))
        if t < 1:
            raise ValueError(f"job {job!r}: threads must be at least 1, not {t}")
        c = float(cost.get(job, 0.0))
        if c < 0:
            raise ValueError(f"job {job!r}: negative cost {c}")
        need[job] = t if cores is None else min(t, cores)
        duration[job] = c / need[job]
    return duration, need


def _graph(jobs: Sequence[Hashable], deps: Mapping[Hashable, Iterable[Hashable]]
           ) -> tuple[dict[Hashable, int], dict[Hashable, list[Hashable]], list[Hashable]]:
    """Job order, successors and a topological order (ties by job order)."""
    order = {job: i for i, job in enumerate(jobs)}
    if len(order) != len(jobs):
        raise ValueError("a job is listed twice")
    succ: dict[Hashable, list[Hashable]] = {job: [] for job in jobs}
    indegree = dict.fromkeys(jobs, 0)
    for job, before in deps.items():
        if job not in order:
            raise ValueError(f"dependencies of an unknown job {job!r}")
        for dep in set(before):
            if dep not in order:
                raise ValueError(f"job {job!r} depends on an unknown job {dep!r}")
            succ[dep].append(job)
            indegree[job] += 1
    for job in succ:
        succ[job].sort(key=order.__getitem__)
    heap = [order[job] for job in jobs if indegree[job] == 0]
    heapq.heapify(heap)
    topo: list[Hashable] = []
    while heap:
        job = jobs[heapq.heappop(heap)]
        topo.append(job)
        for nxt in succ[job]:
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                heapq.heappush(heap, order[nxt])
    if len(topo) != len(jobs):
        raise ValueError("the dependencies have a cycle")
    return order, succ, topo


def bottom_levels(jobs: Sequence[Hashable], deps: Mapping[Hashable, Iterable[Hashable]],
                  duration: Mapping[Hashable, float]) -> dict[Hashable, float]:
    """Each job's longest remaining path: its duration plus the longest chain of successors'.

    Parameters
    ----------
    jobs : sequence of hashable
        The jobs.
    deps : mapping
        Job -> the jobs it depends on (absent: none).
    duration : mapping
        Job -> its duration (absent: 0).

    Returns
    -------
    dict
        Job -> the length of the longest path from its start to the end of the DAG.
    """
    _, succ, topo = _graph(jobs, _normalized(deps))
    level: dict[Hashable, float] = {}
    for job in reversed(topo):
        level[job] = float(duration.get(job, 0.0)) + max((level[s] for s in succ[job]), default=0.0)
    return level


def critical_path(jobs: Sequence[Hashable], deps: Mapping[Hashable, Iterable[Hashable]],
                  cost: Mapping[Hashable, float], threads: Mapping[Hashable, int] | None = None,
                  cores: int | None = None) -> tuple[float, list[Hashable]]:
    """The longest chain of dependent jobs and its length.

    Parameters
    ----------
    jobs : sequence of hashable
        The jobs; their order breaks ties (the earlier job wins).
    deps : mapping
        Job -> the jobs it depends on (absent: none).
    cost : mapping
        Job -> its CPU seconds (absent: 0).
    threads : mapping, optional
        Job -> its threads (absent or None: 1). A job's duration is ``cost / min(threads, cores)``.
    cores : int, optional
        The cores available (None: unlimited), which cap a job's threads.

    Returns
    -------
    length : float
        The sum of the durations along the path (0 for no jobs).
    path : list
        Its jobs, first to last.
    """
    deps = _normalized(deps)
    duration, _ = _durations(jobs, cost, threads, cores)
    order, succ, _ = _graph(jobs, deps)
    level = bottom_levels(jobs, deps, duration)
    if not jobs:
        return 0.0, []
    has_dep = {job for job, before in deps.items() if before}
    sources = [job for job in jobs if job not in has_dep]
    job = min(sources, key=lambda j: (-level[j], order[j]))
    path = [job]
    while succ[job]:
        job = min(succ[job], key=lambda j: (-level[j], order[j]))
        path.append(job)
    return level[path[0]], path


def schedule(jobs: Sequence[Hashable], deps: Mapping[Hashable, Iterable[Hashable]], cost: Mapping[Hashable, float],
             threads: Mapping[Hashable, int] | None, cores: int) -> tuple[float, dict[Hashable, float]]:
    """List-schedule the DAG on ``cores`` cores, longest remaining path first.

    At time 0 and whenever a job ends, the ready jobs (all their dependencies ended) are taken
    in order of their longest remaining path (:func:`bottom_levels`; ties by their order in
    ``jobs``) and each one whose cores fit in the free cores starts (a job that does not fit
    waits; the next one may start before it). A job takes ``min(threads, cores)`` cores for
    ``cost / min(threads, cores)`` seconds.

    Parameters
    ----------
    jobs : sequence of hashable
        The jobs.
    deps : mapping
        Job -> the jobs it depends on (absent: none).
    cost : mapping
        Job -> its CPU seconds (absent: 0).
    threads : mapping or None
        Job -> its declared threads (absent or None: 1).
    cores : int
        The cores of the machine (at least 1).

    Returns
    -------
    makespan : float
        When the last job ends (0 for no jobs).
    start : dict
        Job -> its start time.

    Raises
    ------
    ValueError
        For a cycle, an unknown job in ``deps``, cores or threads below 1, or a negative cost.
    """
    deps = _normalized(deps)
    duration, need = _durations(jobs, cost, threads, cores)
    order, succ, _ = _graph(jobs, deps)
    level = bottom_levels(jobs, deps, duration)
    waiting = {job: len(set(deps.get(job, ()))) for job in jobs}
    ready = [(-level[job], order[job]) for job in jobs if waiting[job] == 0]
    heapq.heapify(ready)
    running: list[tuple[float, int]] = []  # (end, order)
    start: dict[Hashable, float] = {}
    free, now, makespan = cores, 0.0, 0.0
    while ready or running:
        held = []
        while ready:
            item = heapq.heappop(ready)
            job = jobs[item[1]]
            if need[job] <= free:
                start[job] = now
                free -= need[job]
                end = now + duration[job]
                makespan = max(makespan, end)
                heapq.heappush(running, (end, item[1]))
            else:
                held.append(item)
        for item in held:
            heapq.heappush(ready, item)
        if not running:  # cannot happen: a job never needs more than `cores`
            raise RuntimeError("no job running and none can start")
        now = running[0][0]
        while running and running[0][0] <= now:
            job = jobs[heapq.heappop(running)[1]]
            free += need[job]
            for nxt in succ[job]:
                waiting[nxt] -= 1
                if waiting[nxt] == 0:
                    heapq.heappush(ready, (-level[nxt], order[nxt]))
    return makespan, start


# --------------------------------------------------------------------------------------------
# job costs from a run's logs and benchmark files
# --------------------------------------------------------------------------------------------


def job_key(rule: str, wildcards: Mapping[str, str]) -> str | None:
    """The job key of a job (its log is ``logs/<key>.log`` under the results folder), or None.

    The key is the stage's template in :data:`kvasym.artifacts.JOB_KEYS` with the wildcards
    filled in; rule ``figure_<family>`` is stage ``figure`` with ``family``. None for a rule that
    is no stage (``all``) or a template the wildcards do not fill.
    """
    from kvasym.artifacts import JOB_KEYS

    stage, fixed = rule, dict(wildcards)
    if rule.startswith("figure_") and rule not in JOB_KEYS:
        stage, fixed = "figure", {**fixed, "family": rule.removeprefix("figure_")}
    template = JOB_KEYS.get(stage)
    if template is None:
        return None
    try:
        return template.format(**fixed)
    except (KeyError, IndexError):
        return None


def log_cost(log: Path) -> float | None:
    """The ``cpu_s`` of the last ``kvasym: stage ... done`` line of a log, or None."""
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in reversed(text.splitlines()):
        match = DONE.match(line.strip())
        if match:
            return float(match[2])
    return None


def benchmark_cost(tsv: Path) -> tuple[float, str] | None:
    """(seconds, source) of a Snakemake benchmark file's last row, or None.

    ``cpu_time`` when it is a positive number (source ``benchmark cpu_time``), else the wall
    time ``s`` (``benchmark wall s``: the job ended before Snakemake's first reading).
    """
    try:
        with tsv.open(newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle, delimiter="\t"))
    except OSError:
        return None
    if not rows:
        return None
    last = rows[-1]
    for column, source in (("cpu_time", "benchmark cpu_time"), ("s", "benchmark wall s")):
        try:
            value = float(last.get(column) or "nan")
        except ValueError:
            continue
        if value > 0:
            return value, source
    return None


def job_costs(results: Path, jobs: Sequence[Job], fill: str = "none") -> dict[int, Cost]:
    """Each job's :class:`Cost` from the run in ``results``.

    Parameters
    ----------
    results : Path
        The run's results folder (holding ``logs/`` and ``benchmarks/``).
    jobs : sequence of Job
        The DAG's jobs. A job's key is :func:`job_key`; a rule without one uses the log the job
        declares when it lies under ``results/logs/``.
    fill : {"none", "rule-median"}
        What a job without a record costs: 0, or the median of its rule's measured jobs (0 when
        it has none).

    Returns
    -------
    dict
        Job id -> its cost.
    """
    if fill not in ("none", "rule-median"):
        raise ValueError(f"fill must be none or rule-median, not {fill!r}")
    costs: dict[int, Cost] = {}
    for job in jobs:
        key = job_key(job.rule, job.wildcards)
        if key is None and job.log and job.log.startswith("results/logs/") and job.log.endswith(".log"):
            key = job.log.removeprefix("results/logs/").removesuffix(".log")
        if key is None:
            costs[job.id] = Cost(0.0, "none")
            continue
        log = results / "logs" / f"{key}.log"
        cpu = log_cost(log)
        if cpu is not None:
            costs[job.id] = Cost(cpu, "log", str(log))
            continue
        tsv = results / "benchmarks" / f"{key}.tsv"
        bench = benchmark_cost(tsv)
        if bench:
            costs[job.id] = Cost(bench[0], bench[1], str(tsv))
        else:  # the log, if there is one, has no done line: the job is running or failed
            costs[job.id] = Cost(0.0, "none", str(log) if log.is_file() else None)
    if fill == "rule-median":
        measured: dict[str, list[float]] = {}
        for job in jobs:
            if costs[job.id].source != "none":
                measured.setdefault(job.rule, []).append(costs[job.id].cpu_s)
        for job in jobs:
            if costs[job.id].source == "none" and job.rule in measured:
                costs[job.id] = Cost(statistics.median(measured[job.rule]), "rule median")
    return costs


# --------------------------------------------------------------------------------------------
# the DAG from Snakemake (dry invocations only)
# --------------------------------------------------------------------------------------------


def parse_d3dag(text: str) -> tuple[dict[int, str], list[tuple[int, int]]]:
    """(job id -> rule, edges (dependency, job)) of ``snakemake --d3dag``'s JSON in ``text``."""
    at = text.find('{"nodes"')
    if at < 0:
        raise ValueError("no --d3dag JSON in Snakemake's output")
    dag, _ = json.JSONDecoder().raw_decode(text[at:])
    rules = {int(node["id"]): node["value"]["rule"] for node in dag["nodes"]}
    edges = [(int(edge["u"]), int(edge["v"])) for edge in dag["edges"]]
    return rules, edges


def parse_dry_run(text: str) -> dict[int, Job]:
    """Job id -> :class:`Job` from a dry run's job blocks (``rule <name>:`` and its indented fields)."""
    jobs: dict[int, Job] = {}
    rule: str | None = None
    fields: dict[str, str] = {}

    def flush() -> None:
        if rule is None or "jobid" not in fields:
            return
        wildcards = {}
        if fields.get("wildcards"):
            for item in _WILDCARD_SPLIT.split(fields["wildcards"]):
                name, _, value = item.partition("=")
                wildcards[name] = value
        logs = [p for p in fields.get("log", "").split(", ") if p]
        job = Job(int(fields["jobid"]), rule, wildcards, int(fields.get("threads", 1)), logs[0] if logs else None)
        jobs[job.id] = job

    for line in text.splitlines():
        header = _JOB_HEADER.match(line)
        if header:
            flush()
            rule, fields = header[1], {}
            continue
        item = _JOB_FIELD.match(line) if rule is not None else None
        if item:
            fields[item[1]] = item[2]
        elif rule is not None:
            flush()
            rule, fields = None, {}
    flush()
    return jobs


#: The cores the dry run is given: more than any rule declares, so each job shows its declared
#: threads (Snakemake scales threads down to --cores, and a dry run without --cores has one).
DECLARED_CORES = 1024


def _run_snakemake(workdir: Path, args: Sequence[str]) -> str:
    command = [sys.executable, "-m", "snakemake", "--nolock", "--forceall", *args]
    out = subprocess.run(command, cwd=workdir, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"makespan: {shlex.join(command)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return out.stdout + "\n" + out.stderr


def snakemake_dag(workdir: Path, extra: Sequence[str] = ()) -> tuple[list[Job], dict[int, list[int]]]:
    """The DAG of ``snakemake --forceall`` in ``workdir``: its jobs (by id) and their dependencies.

    Runs ``snakemake --nolock --forceall --d3dag`` and ``snakemake --nolock --forceall -n`` (no
    job runs, no lock is taken) with ``extra`` arguments, and joins them by job id.

    Raises
    ------
    SystemExit
        If Snakemake fails or the two invocations disagree on the jobs.
    """
    rules, edges = parse_d3dag(_run_snakemake(workdir, ["--d3dag", *extra]))
    # cores enough that no rule's threads are scaled down: the dry run prints what rules declare
    described = parse_dry_run(_run_snakemake(workdir, ["-n", "--cores", str(DECLARED_CORES), *extra]))
    if set(rules) != set(described):
        raise SystemExit(f"makespan: --d3dag has {len(rules)} jobs, the dry run describes {len(described)} "
                         f"({len(set(rules) ^ set(described))} job ids differ)")
    wrong = [i for i in rules if described[i].rule != rules[i]]
    if wrong:
        raise SystemExit(f"makespan: --d3dag and the dry run disagree on the rule of {len(wrong)} job ids "
                         f"(e.g. {wrong[0]}: {rules[wrong[0]]} / {described[wrong[0]].rule})")
    jobs = [described[i] for i in sorted(rules)]
    deps: dict[int, list[int]] = {job.id: [] for job in jobs}
    for dep, job in edges:
        deps[job].append(dep)
    return jobs, deps


# --------------------------------------------------------------------------------------------
# the report
# --------------------------------------------------------------------------------------------


def model(jobs: Sequence[Job], deps: Mapping[int, Iterable[int]], costs: Mapping[int, Cost],
          cores: Sequence[int]) -> dict:
    """The table's numbers (seconds) for each core count, and the critical path at the largest.

    Returns
    -------
    dict
        ``rows``: per core count ``cores``, ``makespan_s``, ``total_cpu_s``, ``critical_path_s``,
        ``cpu_per_core_s``, ``bound_s`` (the larger bound) and ``makespan_over_bound``;
        ``critical_path``: ``cores``, ``length_s`` and its jobs (``id``, ``rule``, ``wildcards``, ``threads``,
        ``cpu_s``, ``source``).
    """
    ids = [job.id for job in jobs]
    cost = {i: costs[i].cpu_s for i in ids}
    threads = {job.id: job.threads for job in jobs}
    total = sum(cost.values())
    rows = []
    for n in cores:
        makespan, _ = schedule(ids, deps, cost, threads, n)
        length, _ = critical_path(ids, deps, cost, threads, n)
        bound = max(length, total / n)
        rows.append({"cores": n, "makespan_s": makespan, "total_cpu_s": total, "critical_path_s": length,
                     "cpu_per_core_s": total / n, "bound_s": bound,
                     "makespan_over_bound": makespan / bound if bound > 0 else 1.0})
    by_id = {job.id: job for job in jobs}
    widest = max(cores)
    length, path = critical_path(ids, deps, cost, threads, widest)
    return {"rows": rows, "critical_path": {
        "cores": widest, "length_s": length,
        "jobs": [{"id": i, "rule": by_id[i].rule, "wildcards": by_id[i].wildcards, "threads": by_id[i].threads,
                  "cpu_s": costs[i].cpu_s, "source": costs[i].source} for i in path]}}


def _cores_list(values: Sequence[str]) -> list[int]:
    out = [int(v) for value in values for v in value.split(",") if v.strip()]
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError("core counts must be integers >= 1")
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the makespan table of the DAG in ``--workdir`` with the costs of the run in ``--results``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("results"), help="the run's results folder")
    parser.add_argument("--cores", nargs="+", default=[str(n) for n in DEFAULT_CORES],
                        help="core counts N (space- or comma-separated; default 2 4 8 16 64)")
    parser.add_argument("--json", type=Path, help="also write the numbers and every job's cost here")
    parser.add_argument("--workdir", type=Path, default=Path("."), help="where to ask Snakemake for the DAG")
    parser.add_argument("--fill", choices=("none", "rule-median"), default="none",
                        help="cost of a job without a record: 0, or its rule's median measured cost")
    parser.add_argument("--snakemake-args", default="",
                        help='extra Snakemake arguments, one string (--snakemake-args="--configfile c.yaml")')
    args = parser.parse_args(argv)
    try:
        cores = _cores_list(args.cores)
    except (ValueError, argparse.ArgumentTypeError):
        parser.error("--cores: integers >= 1")
    if not (args.results / "logs").is_dir() and not (args.results / "benchmarks").is_dir():
        print(f"makespan: error: {args.results} has no logs/ or benchmarks/ folder", file=sys.stderr)
        return 2

    jobs, deps = snakemake_dag(args.workdir, shlex.split(args.snakemake_args))
    costs = job_costs(args.results, jobs, args.fill)
    numbers = model(jobs, deps, costs, cores)
    by_source = {s: [j for j in jobs if costs[j.id].source == s] for s in SOURCES}

    rules = {job.rule for job in jobs}
    print(f"DAG of snakemake --forceall in {args.workdir}: {len(jobs)} jobs of {len(rules)} rules, "
          f"{sum(len(d) for d in deps.values())} dependencies; costs from {args.results}:")
    print(f"  {len(by_source['log'])} jobs from their log's cpu_s")
    bench = by_source["benchmark cpu_time"] + by_source["benchmark wall s"]
    if bench:
        print(f"  {len(bench)} jobs from their benchmark file (the log has no 'done' line):")
        for job in bench:
            print(f"    {job.label()}: {costs[job.id].cpu_s:.2f} s ({costs[job.id].source})")
    differ = [job for job in jobs if job.log and (key := job_key(job.rule, job.wildcards)) is not None
              and job.log != f"results/logs/{key}.log"]
    if differ:
        print(f"  warning: {len(differ)} jobs declare another log than their JOB_KEYS key "
              f"(e.g. {differ[0].label()}: {differ[0].log}); their JOB_KEYS log was read")
    used = {Path(c.path) for c in costs.values() if c.path}
    used |= {args.results / "logs" / f"{key}.log" for job in jobs if (key := job_key(job.rule, job.wildcards))}
    orphans = sorted(p for p in (args.results / "logs").rglob("*.log") if p not in used)
    if orphans:
        print(f"  warning: {len(orphans)} logs under {args.results / 'logs'} belong to no job of this DAG (a run "
              f"of another config or code): {', '.join(str(p) for p in orphans[:5])}"
              f"{', ...' if len(orphans) > 5 else ''}")
    if by_source["rule median"]:
        print(f"  {len(by_source['rule median'])} jobs without a record given their rule's median (--fill)")
    none = by_source["none"]
    if none:
        counts: dict[str, int] = {}
        for job in none:
            counts[job.rule] = counts.get(job.rule, 0) + 1
        listed = ", ".join(f"{rule} {n}" for rule, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
        print(f"  {len(none)} jobs cost 0 (no log line, no benchmark file): {listed}")
        unfinished = [job for job in none if costs[job.id].path]
        if unfinished:
            print(f"  of which {len(unfinished)} have a log without its done line (running or failed): "
                  f"{', '.join(job.label() for job in unfinished)}")
    if none and args.fill == "none":
        print("  partial run: every number below is a lower bound for the whole DAG")
    print()
    print(f"{'cores':>5s} {'makespan min':>12s} {'total CPU min':>13s} {'crit. path min':>14s} "
          f"{'CPU/N min':>10s} {'makespan/bound':>14s}")
    for row in numbers["rows"]:
        print(f"{row['cores']:5d} {row['makespan_s'] / 60:12.2f} {row['total_cpu_s'] / 60:13.2f} "
              f"{row['critical_path_s'] / 60:14.2f} {row['cpu_per_core_s'] / 60:10.2f} "
              f"{row['makespan_over_bound']:14.3f}")
    path = numbers["critical_path"]
    length = path["length_s"]
    print()
    print(f"critical path at N = {path['cores']}: {len(path['jobs'])} jobs, {length:.1f} s ({length / 60:.2f} min)")
    print(f"  {'CPU s':>9s} {'threads':>7s}  {'source':18s} job")
    for j in path["jobs"]:
        label = " ".join([j["rule"], *(f"{k}={v}" for k, v in j["wildcards"].items())])
        print(f"  {j['cpu_s']:9.2f} {j['threads']:7d}  {j['source']:18s} {label}")

    if args.json:
        payload = {"workdir": str(args.workdir), "results": str(args.results), "fill": args.fill,
                   "dag_jobs": len(jobs), "sources": {s: len(v) for s, v in by_source.items()}, **numbers,
                   "jobs": [{"id": j.id, "rule": j.rule, "wildcards": j.wildcards, "threads": j.threads,
                             "deps": sorted(deps[j.id]), "cpu_s": costs[j.id].cpu_s,
                             "source": costs[j.id].source, "file": costs[j.id].path} for j in jobs]}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
