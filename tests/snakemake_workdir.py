"""Helpers shared by the reliability tests: a throw-away copy of the workflow to run Snakemake in.

Not a test module (pytest collects only ``test_*.py``). The copy holds exactly what a run reads
(Snakefile, workflow/, config/, paper sources, environment.yml), so a run never touches the
checkout's own results/.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"


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


def run_env() -> dict[str, str]:
    """The environment for Snakemake and the `kvasym` commands its rules run: this checkout's
    library first on the path (whatever the installed copy points at), one BLAS thread."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH", "")) if p)
    return env


def snakemake_cmd(*args: str, configfile: str = "config/test.yaml") -> list[str]:
    return [sys.executable, "-m", "snakemake", "--configfile", configfile, *args]


def snakemake(workdir: Path, *args: str, configfile: str = "config/test.yaml",
              timeout: float = 600) -> subprocess.CompletedProcess:
    """Run Snakemake to completion in ``workdir``; stdout and stderr captured as text."""
    return subprocess.run(
        snakemake_cmd(*args, configfile=configfile), cwd=workdir, capture_output=True, text=True,
        timeout=timeout, env=run_env(),
    )
