#!/usr/bin/env python
"""A model job on 1 and on N worker processes: wall, CPU, peak memory of the process tree, and
whether the outputs are the same (issue 49: a rule's ``threads`` used by its job).

What it measures: one job of a finished run, taken from that run's Snakemake log (the
``Shell command: kvasym stage <stage> ...`` line whose text contains ``--match``), run again in
the run's folder with its outputs redirected to a temporary folder, once with ``--workers 1``
and once with each ``--workers`` value, alternating (``--repeat`` rounds) so that a shared
machine's load falls on both. Per run: wall seconds, the CPU seconds of the job's cost line
(the process and the workers it reaped), and the peak memory of the whole process tree (the
sum over the job's processes of their proportional set size, sampled every 0.2 s from
``/proc``: pages a forked worker shares with its parent count once). Then it reads every Parquet
output of each run and checks that the frames equal the one-worker run's exactly, and the run's
own file (the finished run's result, made by the code that ran it) too.

Usage::

    python benchmarks/bench_workers.py --workdir RUN --log RUN.log --match 'stage card ' \\
        [--workers 2] [--repeat 1] [--output-flags manifest packed per-query per-key]

(``--output-flags``: a stage whose outputs are not ``--out*`` flags, as the cells stage's
folders; a folder output is compared file by file, a file that is not Parquet byte for byte.)

Run it with ``PYTHONPATH=<checkout>/src`` to measure that checkout's code on the run's inputs.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import tempfile
import time
from pathlib import Path


BLAS_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")


def job_command(log: Path, match: str) -> str:
    """The first ``kvasym stage`` shell command of ``log`` whose text contains ``match``."""
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("Shell command: kvasym stage ") and match in line:
            return line.removeprefix("Shell command: ").split(" > ", 1)[0]
    raise SystemExit(f"{log}: no `kvasym stage` command containing {match!r}")


def redirect_outputs(command: str, folder: Path, flags: tuple[str, ...] = ()
                     ) -> tuple[list[str], dict[str, Path], dict[str, Path]]:
    """The command's words with every ``--out*`` path, and the path of each flag in ``flags``
    (a stage's outputs not named ``--out*``: the cells stage's ``--manifest``, ``--packed``,
    ``--per-query``, ``--per-key``), moved into ``folder``; the moved paths and the original
    ones, by flag."""
    words, outputs, originals = shlex.split(command), {}, {}
    for i, word in enumerate(words[:-1]):
        if word.startswith("--out") or word.lstrip("-") in flags:
            target = folder / f"{word.lstrip('-')}{Path(words[i + 1]).suffix}"
            outputs[word], originals[word] = target, Path(words[i + 1])
            words[i + 1] = str(target)
    return words, outputs, originals


def _tree_pss_kib(root: int) -> int:
    """Sum of the proportional set size (``Pss`` of ``/proc/<pid>/smaps_rollup``: a page shared
    by k processes counts 1/k in each) over ``root`` and its descendants (KiB): the memory the
    job's processes hold together, forked workers' shared pages counted once."""
    children: dict[int, list[int]] = {}
    pss: dict[int, int] = {}
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
            rollup = (status.parent / "smaps_rollup").read_text()
        except OSError:
            continue
        pid = int(status.parent.name)
        ppid = int(re.search(r"^PPid:\s+(\d+)", text, re.M).group(1))
        found = re.search(r"^Pss:\s+(\d+)", rollup, re.M)
        pss[pid] = int(found.group(1)) if found else 0
        children.setdefault(ppid, []).append(pid)
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += pss.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total


def run_once(words: list[str], workers: int, workdir: Path, log: Path) -> dict[str, float]:
    """One run: wall s, the cost line's CPU s, the process tree's peak RSS (MiB)."""
    # one BLAS thread, as every job of the DAG runs (workflow/rules/common.smk sets these)
    env = {**os.environ, **dict.fromkeys(BLAS_THREAD_VARIABLES, "1")}
    start = time.perf_counter()
    with log.open("w") as sink:
        proc = subprocess.Popen([*words, "--workers", str(workers)], cwd=workdir, stdout=sink,
                                stderr=subprocess.STDOUT, env=env)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, _tree_pss_kib(proc.pid))
            time.sleep(0.2)
    wall = time.perf_counter() - start
    text = log.read_text()
    if proc.returncode:
        raise SystemExit(f"the job failed with --workers {workers} (exit {proc.returncode}):\n{text[-2000:]}")
    cpu = re.search(r"done: cpu_s=([0-9.]+)", text)
    return {"wall_s": wall, "cpu_s": float(cpu.group(1)) if cpu else float("nan"), "peak_mib": peak / 1024}


def _files(path: Path) -> dict[str, Path]:
    """An output's files by their path inside it (the file itself for a file output), without
    Snakemake's own markers."""
    if not path.is_dir():
        return {"": path}
    return {str(f.relative_to(path)): f for f in sorted(path.rglob("*"))
            if f.is_file() and f.name != ".snakemake_timestamp"}


def same_outputs(a: dict[str, Path], b: dict[str, Path]) -> bool:
    """Whether the outputs of two runs are the same: every Parquet file holds the same frame,
    value for value; any other file (a manifest, a packed ``.npz``) has the same bytes. A folder
    output (the cells stage's) is compared file by file."""
    import pandas as pd

    for flag, path in a.items():
        left_files, right_files = _files(path), _files(b[flag])
        if set(left_files) != set(right_files):
            print(f"  {flag}: not the same files ({len(left_files)} against {len(right_files)})")
            return False
        for name, left in left_files.items():
            right = right_files[name]
            if left.suffix == ".parquet":
                try:
                    pd.testing.assert_frame_equal(pd.read_parquet(left), pd.read_parquet(right), check_exact=True)
                except AssertionError as exc:
                    print(f"  {flag} {name}: differs: {str(exc).splitlines()[0]}")
                    return False
            elif left.read_bytes() != right.read_bytes():
                print(f"  {flag} {name}: different bytes")
                return False
    return True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True, help="the finished run's folder")
    parser.add_argument("--log", type=Path, required=True, help="its Snakemake log (with Shell command lines)")
    parser.add_argument("--match", required=True, help="text the job's command contains")
    parser.add_argument("--workers", type=int, nargs="+", default=[2])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--output-flags", nargs="*", default=[],
                        help="the job's output flags not named --out* (cells: manifest packed per-query per-key)")
    args = parser.parse_args(argv)
    command = job_command(args.log, args.match)
    print(f"job: {command[:160]}{' ...' if len(command) > 160 else ''}")
    with tempfile.TemporaryDirectory() as tmp:
        runs: dict[int, list[dict[str, float]]] = {}
        outputs: dict[int, dict[str, Path]] = {}
        for round_ in range(args.repeat):
            for workers in [1, *args.workers]:
                folder = Path(tmp) / f"w{workers}r{round_}"
                folder.mkdir()
                words, outputs[workers], originals = redirect_outputs(command, folder, tuple(args.output_flags))
                runs.setdefault(workers, []).append(run_once(words, workers, args.workdir, folder / "job.log"))
        print(f"{'workers':>7} {'wall s':>8} {'CPU s':>8} {'peak MiB':>9} {'wall ratio':>10} {'CPU ratio':>9}  "
              "same as 1 / as the run's file")
        base = runs[1]
        for workers, measured in runs.items():
            wall = min(r["wall_s"] for r in measured)
            cpu = min(r["cpu_s"] for r in measured)
            peak = max(r["peak_mib"] for r in measured)
            same = "-" if workers == 1 else str(same_outputs(outputs[1], outputs[workers]))
            same += " / " + str(same_outputs({f: args.workdir / p for f, p in originals.items()}, outputs[workers]))
            print(f"{workers:>7} {wall:>8.1f} {cpu:>8.1f} {peak:>9.0f} "
                  f"{wall / min(r['wall_s'] for r in base):>10.3f} {cpu / min(r['cpu_s'] for r in base):>9.3f}  {same}")


if __name__ == "__main__":
    main()
