# Config validation (schema, then the library's deeper checks) and the grid's targets.
import os

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from kvasym.errors import KvasymError
from kvasym.study import canonical_json, job_resources, load_study


# Every rule runs with threads: 1 and parallelism comes from jobs. BLAS must not spawn its own
# threads: on a busy 2-core machine OpenBLAS's spinning threads made a 64x1024 matmul 14x
# slower, and a fixed thread count keeps floating-point results independent of --cores.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

validate(config, schema="../schemas/config.schema.yaml")
try:
    STUDY = load_study(config)
except KvasymError as exc:
    raise WorkflowError(f"invalid config: {exc}")

RESULTS = "results"
NAME = "[A-Za-z0-9_.+-]+"


wildcard_constraints:
    distribution=NAME,
    scheme=NAME,
    dim=r"\d+",
    budget=r"\d+",


def data_manifests():
    return [f"{RESULTS}/data/{dist}/d{dim}.json" for dist, dim in STUDY.data_cells()]


def metrics_tables():
    return [
        f"{RESULTS}/metrics/{table}/{dist}/d{dim}/{scheme}/n{budget}.parquet"
        for dist, dim, scheme, budget in STUDY.cells()
        for table in ("per_query", "per_key")
    ]


def stats_tables(kind):
    return [f"{RESULTS}/stats/{kind}/{dist}/d{dim}.parquet" for dist, dim in STUDY.data_cells()]


def theory_tables():
    return [f"{RESULTS}/theory/{dist}/d{dim}.parquet" for dist, dim in STUDY.data_cells()]


def data_slice(w):
    return STUDY.data_slice(w.distribution, int(w.dim))


def cell_slice(w):
    return STUDY.cell_slice(w.distribution, int(w.dim), w.scheme, int(w.budget))


def metrics_slice(w):
    return STUDY.metrics_slice(w.distribution, int(w.dim), w.scheme, int(w.budget))


def resources_of(stage, slicer):
    return {
        key: (lambda w, key=key: job_resources(stage, slicer(w))[key])
        for key in ("mem_mb", "runtime")
    }
