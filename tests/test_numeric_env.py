"""The pinned numeric environment (tools.numeric_env) that the expected results are computed in."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools import numeric_env as ne

ROOT = Path(__file__).resolve().parent.parent

PIN = ne.pin_unavailable_reason()


def test_a_machine_set_coretype_is_kept_and_named():
    reason = ne.pin_unavailable_reason({"OPENBLAS_CORETYPE": "Zen"})
    if PIN is not None:
        pytest.skip(f"no pin on this machine: {PIN}")
    assert reason is not None and "OPENBLAS_CORETYPE=Zen" in reason
    assert ne.pinned_environment({"OPENBLAS_CORETYPE": "Zen", "HOME": "/x"}) is None
    # the pinned value itself, set by the machine, is no conflict (any case, as OpenBLAS reads it)
    assert ne.pin_unavailable_reason({"OPENBLAS_CORETYPE": "haswell"}) is None


def test_pinned_environment_copies_and_only_adds_the_two_variables():
    if PIN is not None:
        pytest.skip(f"no pin on this machine: {PIN}")
    base = {"HOME": "/x", "NPY_DISABLE_CPU_FEATURES": "stale"}
    pinned = ne.pinned_environment(base)
    assert base == {"HOME": "/x", "NPY_DISABLE_CPU_FEATURES": "stale"}  # not modified in place
    assert pinned["OPENBLAS_CORETYPE"] == "Haswell" and pinned["HOME"] == "/x"
    disabled = ne.disabled_dispatch_groups()
    assert pinned.get("NPY_DISABLE_CPU_FEATURES", "") == " ".join(disabled)
    assert "X86_V3" not in disabled and set(pinned) <= {"HOME", "OPENBLAS_CORETYPE", "NPY_DISABLE_CPU_FEATURES"}


def test_a_child_in_the_pinned_environment_runs_numpy_at_x86_64_v3():
    """numpy in the child reports every dispatch group above x86-64-v3 off, and the CLI runner
    passes the command's exit status through."""
    if PIN is not None:
        pytest.skip(f"no pin on this machine: {PIN}")
    script = ("import json, os; from tools.numeric_env import describe; "
              "print(json.dumps(describe())); raise SystemExit(3)")
    run = subprocess.run([sys.executable, "-m", "tools.numeric_env", sys.executable, "-c", script],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 3, run.stderr
    seen = json.loads(run.stdout)
    assert seen["OPENBLAS_CORETYPE"] == "Haswell"
    assert not set(seen["cpu_dispatch_available"]) & set(ne.disabled_dispatch_groups())
    assert "X86_V3" in seen["cpu_dispatch_available"]


def test_without_a_pin_the_runner_says_why_and_exits_2(monkeypatch):
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Zen")
    if PIN is not None:
        pytest.skip(f"no pin on this machine: {PIN}")
    assert ne.main(["true"]) == 2


def test_a_command_that_cannot_start_is_one_line_with_the_shell_codes(tmp_path, capsys):
    """Issue 33, point 5: a missing or non-executable CMD was a FileNotFoundError or
    PermissionError traceback; now one line and 127 or 126, as a shell gives."""
    if PIN is not None:
        pytest.skip(f"no pin on this machine: {PIN}")
    script = tmp_path / "not_executable.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    assert ne.main([str(tmp_path / "no_such_command")]) == 127
    assert ne.main([str(script)]) == 126
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("tools.numeric_env: cannot run ") for line in err)
    assert "No such file or directory" in err[0] and "Permission denied" in err[1]
