"""Helpers shared by the reliability tests: a throw-away copy of the workflow to run Snakemake in.

Not a test module (pytest collects only ``test_*.py``). The copy holds exactly what a run reads
(Snakefile, workflow/, config/, paper sources, environment.yml), so a run never touches the
checkout's own results/.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
FINAL_SUFFIXES = {".npz", ".parquet", ".json"}
TARGET = "results/claims/claims.json"
GATHERED = ("stats/comparisons.parquet", "stats/summary.parquet", "stats/trials.parquet", "theory/theory.parquet")


def claims_targets() -> list[str]:
    """What ``rule all`` lists up to the claims, for the tiny config (tests/test_faults.py)."""
    from kvasym.study import load_study_file

    study = load_study_file(ROOT / "config/test.yaml")
    data = [f"results/data/{dist}/d{dim}.json" for dist, dim in study.data_cells()]
    # every unit's metrics folders (a unit job writes its cells' files into them, whole)
    metrics = [
        f"results/metrics/{table}/{dist}/d{dim}"
        for dist, dim in study.data_cells()
        for table in ("per_query", "per_key")
    ]
    # the gathered tables too: once a job that reads them has failed, Snakemake has deleted them,
    # and asked only for claims.json (which still exists) it would not rebuild them
    gathered = [f"results/{name}" for name in GATHERED]
    return [*data, *metrics, *gathered, TARGET]


def make_workdir(path: Path) -> Path:
    """Copy the workflow into ``path`` (created) and return it."""
    path.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "Snakefile", path / "Snakefile")
    shutil.copy(ROOT / "environment.yml", path / "environment.yml")
    shutil.copytree(ROOT / "workflow", path / "workflow")
    shutil.copytree(ROOT / "config", path / "config")
    shutil.copytree(ROOT / "paper", path / "paper", ignore=shutil.ignore_patterns("build", "generated"))
    # Snakemake looks for the default workflow profile in profiles/ beside the Snakefile
    os.symlink("workflow/profiles", path / "profiles")
    return path


def copy_run(run: Path, path: Path) -> Path:
    """A copy of a finished run, for a test that writes into it (the session's tiny run is shared,
    also across xdist workers). Snakemake's own log folder is left out: a dry run in the shared
    folder may be writing or removing its log file while the copy is made."""
    def ignore(folder: str, names: list[str]) -> set[str]:
        return {"log"} & set(names) if Path(folder).name == ".snakemake" else set()

    shutil.copytree(run, path, symlinks=True, ignore=ignore)
    return path


def run_env() -> dict[str, str]:
    """The environment for Snakemake and the `kvasym` commands its rules run: this checkout's
    library first on the path (whatever the installed copy points at), and the numeric
    environment of the committed expected results (tools.numeric_env: OpenBLAS and numpy's
    loops at x86-64-v3) where this machine allows it, so that every tiny run of the suite, the
    shared one that tests/expected is checked against included, computes the same bits on any
    such CPU."""
    from tools.numeric_env import pinned_environment

    pinned = pinned_environment()
    env = pinned or dict(os.environ)
    if pinned and env.get("KVASYM_CACHE_DIR"):
        # codebooks are cached on disk and dequantization reads their centroids: one computed by
        # this (unpinned) test process differs from a pinned one in its last bits, and a DAG run
        # that read it would move every metric at ~1e-10 (which test wrote it first decided)
        env["KVASYM_CACHE_DIR"] = env["KVASYM_CACHE_DIR"].rstrip(os.sep) + "-pinned"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH", "")) if p)
    return env


def snakemake_cmd(*args: str, configfile: str = "config/test.yaml") -> list[str]:
    return [sys.executable, "-m", "snakemake", "--configfile", configfile, *args]


#: The bound of one whole run of the tiny grid (Snakemake, local or through Slurm): a guard
#: against a hang, not a speed test. Idle, a run takes about 2 min at --cores 2 and 3 at
#: --cores 1, the Slurm run about 5; a loaded 2-core machine has needed over 10 (issue 33,
#: point 6: a 600 s bound failed there). Speed is measured in benchmarks/, not here.
RUN_BOUND_S = 1800


def snakemake(workdir: Path, *args: str, configfile: str = "config/test.yaml",
              timeout: float = RUN_BOUND_S) -> subprocess.CompletedProcess:
    """Run Snakemake to completion in ``workdir``; stdout and stderr captured as text."""
    return subprocess.run(
        snakemake_cmd(*args, configfile=configfile), cwd=workdir, capture_output=True, text=True,
        timeout=timeout, env=run_env(),
    )


def final_outputs(workdir: Path) -> list[Path]:
    """Outputs under their final names (temporary files and folders are hidden: '.name.XXXX.tmp'; a
    file inside a hidden folder is not under its final name)."""
    results = workdir / "results"
    if not results.is_dir():
        return []
    found = []
    # os.walk, not Path.rglob: a job renaming its hidden temporary folder into place while the
    # walk lists it makes rglob raise FileNotFoundError (seen on a loaded machine); walk skips
    # what vanished, and hidden folders are not entered at all
    for folder, subfolders, files in os.walk(results, onerror=lambda exc: None):
        subfolders[:] = [d for d in subfolders if not d.startswith(".")]
        rel = Path(folder).relative_to(results)
        if rel.parts and rel.parts[0] in ("logs", "benchmarks"):
            subfolders[:] = []
            continue
        found += [Path(folder) / f for f in files if not f.startswith(".") and Path(f).suffix in FINAL_SUFFIXES]
    return found


def wait_for(condition: Callable[[], bool], timeout: float, poll: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll)
    return condition()


def _terminal_signals() -> None:
    """In the child before exec: SIGINT as in a terminal. A test run started in the background
    by a shell without job control (``cmd &`` in a script) inherits SIGINT *ignored*, and an
    ignored signal stays ignored across exec: Python then installs no KeyboardInterrupt handler
    and every Ctrl-C of the kill test is lost (seen in a fresh-clone CI started that way)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(workdir: Path, log: Path, *args: str) -> subprocess.Popen:
    """Snakemake in its own process group, as a terminal would run it (Ctrl-C reaches all)."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            snakemake_cmd(*args), cwd=workdir, stdout=out, stderr=subprocess.STDOUT, env=run_env(),
            start_new_session=True, preexec_fn=_terminal_signals,
        )
