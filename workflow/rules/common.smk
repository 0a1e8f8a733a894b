# Config validation (schema, then the library's deeper checks) and the grid's targets.
import os
import shutil
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from kvasym.claims import load_claims
from kvasym.errors import KvasymError
from kvasym.figures_stage import FIGURES, FORMATS, claims_defaults, figures_slice
from kvasym.study import canonical_json, job_resources, load_study
from kvasym.tables import headline_cell, numbers_slice

# Every job runs with threads: 1 and parallelism comes from jobs. BLAS must not spawn its own
# threads: on a busy 2-core machine OpenBLAS's spinning threads made a 64x1024 matmul 14x
# slower, and a fixed thread count keeps floating-point results independent of --cores.
for _var in (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
):
    os.environ[_var] = "1"

validate(config, schema="../schemas/config.schema.yaml")
try:
    STUDY = load_study(config)
except KvasymError as exc:
    raise WorkflowError(f"invalid config: {exc}")

RESULTS = "results"
NAME = "[A-Za-z0-9_.+-]+"


def data_manifests():
    return [f"{RESULTS}/data/{dist}/d{dim}.json" for dist, dim in STUDY.data_cells()]


def metrics_tables():
    return [
        f"{RESULTS}/metrics/{table}/{dist}/d{dim}/{scheme}/n{budget}.parquet"
        for dist, dim, scheme, budget in STUDY.cells()
        for table in ("per_query", "per_key")
    ]


def stats_tables(kind):
    return [
        f"{RESULTS}/stats/{kind}/{dist}/d{dim}.parquet"
        for dist, dim in STUDY.data_cells()
    ]


def theory_tables():
    return [
        f"{RESULTS}/theory/{dist}/d{dim}.parquet" for dist, dim in STUDY.data_cells()
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


def per_query_inputs(w):
    return [
        f"{RESULTS}/metrics/per_query/{w.distribution}/d{w.dim}/{scheme}/n{budget}.parquet"
        for scheme in STUDY.schemes
        for budget in STUDY.budgets
    ]


def per_key_inputs(w):
    return [
        f"{RESULTS}/metrics/per_key/{w.distribution}/d{w.dim}/{scheme}/n{budget}.parquet"
        for scheme in STUDY.schemes
        for budget in STUDY.budgets
    ]


FIGURES_DIR = f"{RESULTS}/figures"


def figure_outputs():
    return {
        f"{name}_{fmt}": f"{FIGURES_DIR}/{name}.{fmt}"
        for name in FIGURES
        for fmt in FORMATS
    }


def figure_metrics(table):
    return [path for path in metrics_tables() if f"metrics/{table}/" in path]


GENERATED = "paper/generated"
TABLES = ["results", "tests", "theory", "claims", "disagreements"]
HEADLINE = headline_cell(STUDY, STUDY.claims_file)
HAVE_LATEX = all(shutil.which(tool) for tool in ("latexmk", "pdflatex"))
LATEX_HINT = (
    "kvasym: no LaTeX engine found, so the paper PDF is skipped (every generated source is still "
    "written). Debian: apt-get install latexmk texlive-latex-recommended texlive-latex-extra "
    "texlive-fonts-recommended; conda: add texlive-core to environment.yml."
)


def paper_targets():
    targets = [f"{GENERATED}/table_{name}.tex" for name in TABLES] + [
        f"{GENERATED}/numbers.tex"
    ]
    if HAVE_LATEX:
        targets.append("paper/build/main.pdf")
    else:
        print(LATEX_HINT, file=sys.stderr)
    return targets


def out_dir(wildcards, output):
    """The folder of a rule's first output (a param derived from the output, not hardcoded)."""
    return os.path.dirname(output[0])
