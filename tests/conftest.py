"""Shared test configuration: codebooks are cached in a per-session temporary directory, and
the end-to-end tests share one local run of the tiny config.

Under pytest-xdist (``-n 2``, the default in pyproject.toml) the tiny run is built once for the
whole session, by whichever worker asks first, in the session's shared temporary folder; the
other workers wait for it on a file lock and read the same folder."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest


@pytest.fixture(autouse=True, scope="session")
def _kvasym_cache_dir(tmp_path_factory: pytest.TempPathFactory):
    """Point KVASYM_CACHE_DIR at a fresh temporary directory for the whole session."""
    old = os.environ.get("KVASYM_CACHE_DIR")
    os.environ["KVASYM_CACHE_DIR"] = str(tmp_path_factory.mktemp("kvasym_cache"))
    yield
    if old is None:
        os.environ.pop("KVASYM_CACHE_DIR", None)
    else:
        os.environ["KVASYM_CACHE_DIR"] = old


@dataclass
class TinyRun:
    """The session's tiny run, and what a second Snakemake started in its folder while it ran
    met (tests/test_faults.py checks that Snakemake's lock refused it)."""

    workdir: Path
    returncode: int
    log_tail: str
    concurrent: subprocess.CompletedProcess
    first_was_running: bool
    seconds: float


def _build_tiny_run(workdir: Path) -> dict:
    """One uninterrupted ``snakemake --cores 2`` of the tiny config in a fresh copy of the
    workflow. While it runs, a second Snakemake asking for the claims is started in the same
    folder: Snakemake's lock must refuse it (the first one holds it until it ends)."""
    from snakemake_workdir import (RUN_BOUND_S, claims_targets, final_outputs, make_workdir, run_env, snakemake_cmd,
                                   start, wait_for)

    make_workdir(workdir)
    log = workdir / "tiny_local_run.log"
    t0 = time.monotonic()
    proc = start(workdir, log, "--cores", "2")
    try:
        # the lock is taken once the DAG is built; the first finished output proves it is held
        wait_for(lambda: len(final_outputs(workdir)) >= 1 or proc.poll() is not None, 300)
        concurrent = subprocess.run(
            snakemake_cmd("--cores", "1", *claims_targets()), cwd=workdir, capture_output=True, text=True,
            env=run_env(), timeout=300
        )
        first_was_running = proc.poll() is None
        rc = proc.wait(timeout=RUN_BOUND_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return {"returncode": rc, "log_tail": log.read_text()[-3000:], "first_was_running": first_was_running,
            "seconds": time.monotonic() - t0,
            "concurrent": {"args": concurrent.args, "returncode": concurrent.returncode,
                           "stdout": concurrent.stdout, "stderr": concurrent.stderr}}


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> TinyRun:
    """The tiny run, built once per session (once across xdist workers, under a file lock)."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    workdir = shared / "tiny_local_run"
    record = shared / "tiny_local_run.json"
    with open(shared / "tiny_local_run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not record.exists():
                record.write_text(json.dumps(_build_tiny_run(workdir)))
            data = json.loads(record.read_text())
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    c = data["concurrent"]
    concurrent = subprocess.CompletedProcess(c["args"], c["returncode"], c["stdout"], c["stderr"])
    return TinyRun(workdir, data["returncode"], data["log_tail"], concurrent, data["first_was_running"],
                   data["seconds"])


@pytest.fixture(scope="session")
def tiny_local_run(tiny_run: TinyRun) -> Path:
    """One complete local run of the tiny config (snakemake --cores 2) in a copy of the
    workflow: the reference the end-to-end tests compare other runs with. Treat it as read-only
    (a test that writes into a run works on its own copy: shutil.copytree(..., symlinks=True))."""
    assert tiny_run.returncode == 0, tiny_run.log_tail
    return tiny_run.workdir


@pytest.fixture
def small_data(tmp_path: Path):
    """(study, data slice, manifest path): the data manifest for gaussian d = 64 of the
    tiny config cut to two short trials (seq_len 32, 4 queries), written under ``tmp_path``."""
    import yaml

    from kvasym.manifest import write_manifest
    from kvasym.study import load_study

    tiny = yaml.safe_load((Path(__file__).resolve().parents[1] / "config/test.yaml").read_text())
    study = load_study({**tiny, "trials": 2, "seq_len": 32, "n_queries": 4})
    slice_ = study.data_slice("gaussian", 64)
    manifest = tmp_path / "results" / "data" / "gaussian" / "d64.json"  # where the DAG writes it
    write_manifest(slice_, manifest)
    return study, slice_, manifest
