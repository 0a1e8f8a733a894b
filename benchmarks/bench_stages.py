"""Side-by-side CPU time of the DAG's heaviest jobs at two commits, and how far their numbers moved.

``python benchmarks/bench_stages.py --before REV`` checks ``REV``'s ``src/`` out into a temporary
folder (``git archive``) and runs, alternately in fresh processes with one BLAS thread, the same
work with that tree's library and with this checkout's:

- ``real:<scheme>``: one capture of a shipped text (``--text``, made once with this checkout's
  ``kvasym stage capture``) through :func:`kvasym.real.evaluate.evaluate_capture` with the paper
  config's real settings (its layers, budgets, sharpness, ``kernel="auto"``): a sixteenth of one
  ``real_metrics`` job;
- ``cells:<distribution>:<dim>:<trials>``: one ``cells`` unit of the paper config
  (:func:`kvasym.stages.cells.run_cells`) with ``trials`` trials.

It prints each job's CPU seconds (user + system of the child, the median of ``--repeats``), the
ratio before / after, and for each job the largest relative difference between the two trees'
per-query columns (KL, TV, JS, top-1, recall, T-site error) among values above
:data:`RELATIVE_FLOOR`, with the largest absolute difference beside it, so that a speed-up and
what it changed in the numbers are read in one table. Numba's on-disk cache is warmed in both trees
before anything is timed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

DRIVER = r'''
import json, os, sys
import kvasym
assert kvasym.__file__.startswith(os.environ["PYTHONPATH"]), (kvasym.__file__, os.environ["PYTHONPATH"])
import numpy as np
import pandas as pd
job, config, capture, out = sys.argv[1:5]
kind, _, rest = job.partition(":")
from kvasym.study import load_study_file
if kind == "real":
    import yaml
    from kvasym.real.capture import load_capture
    from kvasym.real.evaluate import evaluate_capture
    cfg = yaml.safe_load(open(config))
    study = load_study_file(config)
    scheme = study.scheme(rest)
    cols = evaluate_capture(load_capture(capture), [scheme], list(cfg["budgets"]), name="bench",
                            base_seed=int(cfg["base_seed"]), layers=cfg["real"]["layers"], rope="post",
                            sharpness=list(cfg["sharpness"]), norm_dtype=cfg["norm_dtype"], kernel="auto")
    frame = pd.DataFrame({k: v for k, v in cols.items()})
else:
    from kvasym.stages.cells import run_cells
    name, dim, trials = rest.split(":")
    study = load_study_file(config, {"trials": int(trials), "per_key_trials": min(int(trials), 8)})
    unit = study.unit_slice(name, int(dim))
    run_cells(unit, out + "/manifest.json", out + "/packed", out + "/pq", out + "/pk")
    frame = pd.read_parquet(out + "/pq")
frame.to_parquet(out + "/rows.parquet")
'''

COMPARED = ["kl", "tv", "js", "top1", "recall_top5", "t_snr_db", "t_eps_dir"]
#: Values below this are compared absolutely only.
RELATIVE_FLOOR = 1e-9


def _tree_of(rev: str, into: Path) -> Path:
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


def _run(src: Path, job: str, config: Path, capture: Path, out: Path) -> float:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", DRIVER, job, str(config), str(capture), str(out)], check=True, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _largest_difference(a: Path, b: Path) -> dict[str, float]:
    import numpy as np
    import pandas as pd

    x, y = pd.read_parquet(a), pd.read_parquet(b)
    keys = [c for c in ("distribution", "dim", "scheme", "budget", "sharpness", "trial", "query", "layer",
                        "kv_head", "query_head", "position") if c in x.columns]
    x = x.sort_values(keys).reset_index(drop=True)
    y = y.sort_values(keys).reset_index(drop=True)
    if len(x) != len(y):
        raise SystemExit(f"{a} has {len(x)} rows, {b} {len(y)}")
    out = {}
    for column in COMPARED:
        u, v = x[column].to_numpy(float), y[column].to_numpy(float)
        scale = np.maximum(np.abs(u), np.abs(v))
        # relative where the value is above rounding-level zero (a KL of 1e-17 against 0 is
        # "100%" apart and means nothing); the absolute difference beside it covers the rest
        big = scale > RELATIVE_FLOOR
        rel = np.abs(u - v)[big] / scale[big]
        out[column] = (float(rel.max(initial=0.0)), float(np.abs(u - v).max(initial=0.0)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the commit to compare with (e.g. HEAD~1)")
    parser.add_argument("--jobs", nargs="+", default=["real:RKV", "real:SKLT", "real:KIVI32", "cells:gaussian:128:32",
                                                       "cells:gaussian:1024:4"])
    parser.add_argument("--config", default=str(ROOT / "config" / "config.yaml"))
    parser.add_argument("--text", default="bakery_morning", help="shipped text of the real jobs' capture")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench_stages_"))
    try:
        before_src = _tree_of(args.before, work / "tree_before")
        after_src = ROOT / "src"
        capture = work / "capture" / f"{args.text}.npz"
        if any(j.startswith("real:") for j in args.jobs):
            import yaml

            real = yaml.safe_load(Path(args.config).read_text())["real"]
            cli = "import sys; from kvasym.cli import main; sys.exit(main())"
            subprocess.run([sys.executable, "-c", cli, "stage", "capture", "--shipped", args.text, "--out",
                            str(capture.parent), "--max-tokens", str(real["max_tokens"]), "--layers",
                            ",".join(map(str, real["layers"]))],
                           check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(after_src)})
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.before], check=True,
                             capture_output=True, text=True).stdout.strip()
        print(f"before: {rev} ({before_src}); after: this checkout; load average {os.getloadavg()[0]:.2f}")
        for src in (before_src, after_src):  # warm numba's on-disk cache in both trees
            _run(src, "cells:gaussian:128:1", Path(args.config), capture, work / "warm")
        print(f"{'job':<26}{'before CPU-s':>14}{'after CPU-s':>13}{'ratio':>8}  largest relative difference of values"
              f" above {RELATIVE_FLOOR:g} (largest absolute difference)")
        for job in args.jobs:
            times: dict[str, list[float]] = {"before": [], "after": []}
            for _ in range(args.repeats):
                for label, src in (("before", before_src), ("after", after_src)):
                    times[label].append(_run(src, job, Path(args.config), capture, work / f"out_{label}"))
            diff = _largest_difference(work / "out_before" / "rows.parquet", work / "out_after" / "rows.parquet")
            b, a = statistics.median(times["before"]), statistics.median(times["after"])
            shown = ", ".join(f"{k} {rel:.1e} ({absolute:.0e})" for k, (rel, absolute) in diff.items())
            print(f"{job:<26}{b:>14.1f}{a:>13.1f}{b / a:>7.2f}x  {shown}", flush=True)
        print(f"load average after: {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"note": "CPU-s: user + system of each job's process, one BLAS thread"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
