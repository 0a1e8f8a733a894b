"""The numeric environment a result depends on, and how to pin it for a reproducible comparison.

The pipeline is deterministic on one machine: the same config gives bit-identical results
whatever ``--cores`` and job order. Across CPUs the last bits of floating-point results move,
without any change of code, for two reasons:

- OpenBLAS (numpy's and scipy's BLAS, a ``DYNAMIC_ARCH`` build) picks its GEMM kernels by CPU:
  Haswell kernels on AVX2 machines, SkylakeX / Cooper Lake / Sapphire Rapids kernels on AVX-512
  ones, each with its own blocking and so its own order of summation, in float32 and float64;
- numpy dispatches its ufunc loops (``exp``, ``log``, reductions, sorting) by CPU feature
  group: ``X86_V3`` (AVX2, FMA) on every x86-64 CPU since 2013, ``X86_V4`` and ``AVX512_*``
  where present.

A last-bit difference in the float32 forward pass of the real model becomes a relative
difference of about 1e-8 in a table's sums, and on the tiny grid's few units it can flip a tie,
a rank or a discrete p-value. Measured on a Sapphire Rapids machine (numpy 2.4.6, OpenBLAS
0.3.31) against the expected results recorded on an AVX2 machine: 168 differing values of the
tiny grid's digest; 23 with OpenBLAS held at its Haswell kernels; none with numpy's AVX-512
loops switched off as well.

:func:`pinned_environment` holds both at the AVX2 level (:data:`PINNED_CORETYPE`, and numpy's
dispatch groups above ``X86_V3`` disabled through ``NPY_DISABLE_CPU_FEATURES``), which every
x86-64 CPU that has AVX2 and FMA can run. The expected-results test (tests/expected,
:mod:`tools.expected`) runs the tiny grid under it, so its comparison at rtol 1e-9 holds on any
such machine. The pipeline itself runs in the machine's own environment (the pin costs speed on
AVX-512 CPUs), so a user's results agree with the paper's to rounding, not bit for bit, across
CPU families.

A machine that sets ``OPENBLAS_CORETYPE`` itself (some do, for processors on which older
OpenBLAS builds compute wrong results) keeps its value: the pin is then not available and the
reason says so.

References
----------
.. [1] OpenBLAS, "Runtime variables" (``OPENBLAS_CORETYPE``), https://github.com/OpenMathLib/OpenBLAS
.. [2] NumPy, "CPU build options" / "Runtime dispatch" (``NPY_DISABLE_CPU_FEATURES``),
   https://numpy.org/doc/stable/reference/simd/build-options.html
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping

#: The OpenBLAS kernel family the pin selects (AVX2 + FMA GEMM kernels).
PINNED_CORETYPE = "Haswell"
#: numpy's dispatch groups at or below the pinned level (x86-64-v3: AVX2, FMA, BMI2, F16C, MOVBE).
_KEPT_GROUPS = ("X86_V3", "AVX2", "FMA3", "AVX_VNNI", "AVX", "F16C", "SSE", "SSE2", "SSE3", "SSSE3", "SSE41",
                "SSE42", "POPCNT", "X86_V2")


def _numpy_cpu() -> tuple[list[str], dict[str, bool]]:
    """numpy's dispatch groups and the features it detected (its private runtime tables, as
    ``numpy.show_runtime`` reads them; empty when this numpy does not expose them)."""
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    except ImportError:  # numpy < 2
        try:
            from numpy.core._multiarray_umath import __cpu_dispatch__, __cpu_features__
        except ImportError:
            return [], {}
    return list(__cpu_dispatch__), dict(__cpu_features__)


def disabled_dispatch_groups() -> list[str]:
    """numpy's dispatch groups above x86-64-v3 (``X86_V4``, ``AVX512_*``, ...), the ones the pin
    disables: every dispatched group not among the AVX2-level ones."""
    dispatch, _ = _numpy_cpu()
    return [group for group in dispatch if group not in _KEPT_GROUPS]


def pin_unavailable_reason(env: Mapping[str, str] | None = None) -> str | None:
    """None when the pin applies on this machine, else one line saying why not."""
    env = os.environ if env is None else env
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the pin is defined for x86-64 CPUs; this is {platform.machine()}"
    _, features = _numpy_cpu()
    if not features:
        return "this numpy does not expose its CPU feature tables"
    missing = [f for f in ("AVX2", "FMA3") if not features.get(f)]
    if missing:
        return f"this CPU lacks {', '.join(missing)} (the pinned kernels need x86-64-v3)"
    set_by_machine = env.get("OPENBLAS_CORETYPE")
    if set_by_machine and set_by_machine.lower() != PINNED_CORETYPE.lower():
        return (f"OPENBLAS_CORETYPE={set_by_machine} is set by this machine (kept: it may be needed for "
                f"correct results here), not {PINNED_CORETYPE}")
    return None


def pinned_environment(env: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """A copy of ``env`` (default: this process's) with OpenBLAS held at its Haswell kernels and
    numpy's dispatch above x86-64-v3 disabled; None where :func:`pin_unavailable_reason` says so.
    Only child processes see it: numpy and OpenBLAS read these variables when they load."""
    env = dict(os.environ if env is None else env)
    if pin_unavailable_reason(env) is not None:
        return None
    env["OPENBLAS_CORETYPE"] = PINNED_CORETYPE
    disabled = disabled_dispatch_groups()
    if disabled:
        env["NPY_DISABLE_CPU_FEATURES"] = " ".join(disabled)
    else:
        env.pop("NPY_DISABLE_CPU_FEATURES", None)
    return env


def describe(env: Mapping[str, str] | None = None) -> dict[str, object]:
    """What a result computed in ``env`` depends on: the pin's variables as set there, numpy's
    version and the dispatch groups this CPU offers it."""
    import numpy as np

    env = os.environ if env is None else env
    dispatch, features = _numpy_cpu()
    return {"numpy": np.__version__,
            "cpu_dispatch_available": [g for g in dispatch if features.get(g)],
            "OPENBLAS_CORETYPE": env.get("OPENBLAS_CORETYPE"),
            "NPY_DISABLE_CPU_FEATURES": env.get("NPY_DISABLE_CPU_FEATURES")}


def main(argv: list[str] | None = None) -> int:
    """``python3 -m tools.numeric_env CMD [ARG ...]``: run CMD in the pinned environment (its
    exit status is ours); with no CMD, print the pinned variables. Exit status 2, with the reason,
    where the pin is not available; 127 (not found) or 126 (not executable), with one line, when
    CMD cannot be started, as a shell would."""
    import subprocess
    import sys

    argv = sys.argv[1:] if argv is None else argv
    pinned = pinned_environment()
    if pinned is None:
        print(f"tools.numeric_env: no pinned environment here: {pin_unavailable_reason()}", file=sys.stderr)
        return 2
    if not argv:
        for key in ("OPENBLAS_CORETYPE", "NPY_DISABLE_CPU_FEATURES"):
            if key in pinned:
                print(f"{key}={pinned[key]}")
        return 0
    try:
        return subprocess.run(argv, env=pinned).returncode
    except OSError as exc:  # the command does not exist, is not executable, ...: one line, the shell's codes
        print(f"tools.numeric_env: cannot run {argv[0]!r}: {exc.strerror or exc}", file=sys.stderr)
        return 127 if isinstance(exc, FileNotFoundError) else 126


if __name__ == "__main__":
    raise SystemExit(main())
