# The wiring of this config's DAG (kvasym.wiring.Wiring): the config validated once, the parts
# of the study it has, every job's inputs, slices and flags. This file builds it, says what it
# runs, and names what the rules use; the maths and the wiring live in the library.
import os
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

from kvasym.artifacts import (
    BENCHMARKS_FOLDER,
    LOGS_FOLDER,
    benchmark_path,
    log_path,
    path,
    pattern,
)
from kvasym.errors import KvasymError
from kvasym.resources import stage_threads
from kvasym.render.figures.registry import FIGURE_FAMILIES as FIGURE_REGISTRY
from kvasym.stages import stage_module
from kvasym.study import canonical_json
from kvasym.wiring import Wiring, names_pattern

# BLAS runs at one thread in every job: on a busy 2-core machine OpenBLAS's spinning threads
# made a 64x1024 matmul 14x slower, and a fixed thread count keeps floating-point results
# independent of --cores. A rule's threads are its job's worker processes instead
# (kvasym.workers), each at one BLAS thread. Snakemake sets these variables to a job's threads
# in its shell, so the shell's prefix sets them back (and this process's, for what it runs).
_BLAS_THREADS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "GOTO_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
)
for _var in _BLAS_THREADS:
    os.environ[_var] = "1"
shell.prefix(
    "set -euo pipefail; export " + " ".join(f"{v}=1" for v in _BLAS_THREADS) + "; "
)

try:
    # one line naming the offending key, value or file, not a traceback or the whole schema
    wiring = Wiring(config, workflow.configfiles, paper_dir="paper")
except KvasymError as exc:
    raise WorkflowError(str(exc)) from None
# What this run uses, defaults filled in: the files it came from and the whole config.
print(
    f"kvasym: config from {', '.join(map(str, workflow.configfiles)) or 'the command line'}; "
    f"effective config: {canonical_json(wiring.config)}",
    file=sys.stderr,
)
for _notice in wiring.notices:
    print(_notice, file=sys.stderr)

STUDY = wiring.study
STAGE_CODE = wiring.stage_code
FIGURE_CODE = wiring.figure_code
NAME = "[A-Za-z0-9_.+-]+"
# what every rule calls: its resources, and its `kvasym stage` arguments derived from its
# inputs, outputs and params and the stage's own flags (no flag is spelled in a rule)
resources_of = wiring.resources_of
# a rule's threads: the worker processes of its job (kvasym.resources.STAGE_THREADS)
threads_of = stage_threads
stage_params = wiring.stage_params
out_dir = wiring.out_dir
