"""Shared test configuration: codebooks are cached in a per-session temporary directory, and
the end-to-end tests share one local run of the tiny config."""

from __future__ import annotations

import os
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


@pytest.fixture(scope="session")
def tiny_local_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One complete local run of the tiny config (snakemake --cores 2) in a copy of the
    workflow: the reference the end-to-end tests compare other runs with. Treat it as read-only."""
    from snakemake_workdir import make_workdir, snakemake

    workdir = make_workdir(tmp_path_factory.mktemp("tiny_local_run"))
    proc = snakemake(workdir, "--cores", "2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return workdir
