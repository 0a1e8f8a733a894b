# Config validation (schema, then the library's deeper checks) and the grid's targets.
import os

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from kvasym.errors import KvasymError
from kvasym.study import canonical_json, job_resources, load_study


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
