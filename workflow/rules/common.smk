# Config validation (schema, then the library's cross-field checks), the grid's targets and the
# rules' input functions. Everything else (slices, resources, the figure registry, the Holm
# families, the headline cell) lives in the library; this file only maps wildcards onto it.
import os
import re
import shlex
import shutil
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from kvasym.artifacts import (
    ARTIFACTS,
    BENCHMARKS_FOLDER,
    benchmark_path,
    input_flags,
    log_path,
    model_pattern,
    path,
    pattern,
    stage_flags,
    template_regex,
)
from kvasym.cachefile import file_content_sha256, inspect_cache_file
from kvasym.cells import cell_of_path, slice_digest
from kvasym.claims import claims_files, load_claims
from kvasym.config_io import read_yaml_mapping
from kvasym.config_schema import validate_config
from kvasym.errors import KvasymError
from kvasym.render.figures.registry import FIGURES as ALL_FIGURES
from kvasym.render.figures.registry import (
    FIGURE_CELL_INPUTS,
    FIGURE_FAMILIES as FIGURE_REGISTRY,
    FIGURE_INPUTS,
    FORMATS,
    dag_families,
    facet_cells,
    family_cells,
    figures_slice,
)
from kvasym.real import HEAD_DIM as REAL_HEAD_DIM
from kvasym.real import REAL_MODEL_NAME
from kvasym.real import missing_extra_reason, model_section, real_settings
from kvasym.real.model_registry import MODELS, PRIMARY as PRIMARY_MODEL
from kvasym.real.models import missing_reason as model_missing_reason
from kvasym.render.table_model import PUBLISHED_BANDS
from kvasym.render.tables import TABLES as RENDERED_TABLES
from kvasym.render.paper_inputs import check_paper_inputs
from kvasym.real.evaluate import REAL_DISTRIBUTIONS
from kvasym.render.numbers import numbers_slice
from kvasym.render.crate import crate_slice
from kvasym.render.reproduce import reproduce_slice
from kvasym.resources import SLICE_STAGES, job_resources
from kvasym.stages import STAGES, stage_code_digest, stage_module
from kvasym.stages.paper import LATEX_PACKAGES, have_latex
from kvasym.study import canonical_json, load_study

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

try:
    # Snakemake's YAML reader keeps the last of two equal keys silently; the library's refuses
    for _configfile in workflow.configfiles:
        read_yaml_mapping(_configfile)
except KvasymError as exc:
    raise WorkflowError(f"invalid config: {exc}")
try:
    # the library reads the same schema and says what is wrong in one line naming the key;
    # Snakemake's validate below (which fills the defaults in) would dump the whole schema
    validate_config(config)
except KvasymError as exc:
    raise WorkflowError(f"invalid config: {exc}")
validate(config, schema="../schemas/config.schema.yaml")
try:
    STUDY = load_study(config)
except KvasymError as exc:
    raise WorkflowError(f"invalid config: {exc}")
# The claims file, read and checked now (as the config is): a missing, malformed or mistyped
# claims file stops the run here with one line naming it, not inside the numbers rule's param
# function (a Snakemake InputFunctionException traceback) nor, when it is missing and every
# result is up to date, a silent "Nothing to be done" that keeps the old ledger.
try:
    CLAIMS = load_claims(STUDY.claims_file, STUDY.headline)
    # the claims file and those it extends (key extends), which the claims and numbers jobs read
    CLAIMS_FILES = claims_files(STUDY.claims_file)
except KvasymError as exc:
    raise WorkflowError(f"invalid config: claims_file: {exc}")
# What this run uses, defaults filled in: the files it came from and the whole config.
print(
    f"kvasym: config from {', '.join(map(str, workflow.configfiles)) or 'the command line'}; "
    f"effective config: {canonical_json(validate_config(config))}",
    file=sys.stderr,
)

# The digest of the code each stage runs (kvasym.stages.stage_code_digest): a param of its rules,
# so that editing a stage's code (or a template) reruns that stage and what follows it.
STAGE_CODE = {stage: stage_code_digest(stage) for stage in STAGES}

# Real-model rows (SmolLM2-135M captures): only with a `real:` config section and the extra.
try:
    REAL = real_settings(
        config.get("real"), list(STUDY.schemes), list(STUDY.frontier_real_schemes)
    )
except KvasymError as exc:
    raise WorkflowError(f"invalid config: {exc}")
_shadowed = sorted(
    (set(STUDY.distributions) | set(STUDY.files)) & set(REAL_DISTRIBUTIONS)
)
if _shadowed:
    raise WorkflowError(
        f"invalid config: distribution name(s) {_shadowed} are reserved for the real-model rows"
    )
REAL_MISSING = missing_extra_reason() if REAL else None
if REAL and REAL_MISSING:
    print(
        f"kvasym: the real-model rows are skipped: {REAL_MISSING}",
        file=sys.stderr,
    )
REAL_CELLS = (
    [(name, REAL_HEAD_DIM) for name in REAL_DISTRIBUTIONS]
    if REAL and not REAL_MISSING
    else []
)
NAME = "[A-Za-z0-9_.+-]+"


def _file_cells():
    """(name, head_dim) of every bring-your-own cache (kind: file), read from the file headers
    now, so a missing or malformed file stops the DAG before any job runs."""
    cells = []
    for name, spec in STUDY.files.items():
        try:
            layout = inspect_cache_file(spec["params"]["path"])
        except KvasymError as exc:
            raise WorkflowError(
                f"invalid config: distributions[{name}].params.path: {exc}"
            )
        cells.append((name, layout.head_dim))
    return cells


FILE_CELLS = _file_cells()
# The content digest of each bring-your-own cache, in its cells' slices: replacing the file by
# another that keeps the old mtime (mv, cp -p, rsync -t, tar x) changes the params and so reruns
# its jobs, which an mtime comparison would not (issue 33, point 8).
FILE_DIGESTS = {
    name: file_content_sha256(spec["params"]["path"])
    for name, spec in STUDY.files.items()
}

# The synthetic grid's units (kvasym.stages.cells): a job per (distribution, dim) writes every
# cell of it into the unit's folders; a query-model variant's unit is the metrics rule's.
CELL_UNITS = [name for name in STUDY.distributions if name not in STUDY.query_variants]
VARIANT_UNITS = list(STUDY.query_variants)
# a cell file of a unit folder: the folder artifact each cell artifact lives in
_UNIT_OF = {
    "per_query": "per_query_unit",
    "per_key": "per_key_unit",
    "packed": "packed_unit",
}


def names_pattern(names):
    """A wildcard constraint matching exactly these names."""
    return "|".join(re.escape(name) for name in names) or "(?!)"


def as_inputs(paths):
    """Snakemake inputs for cell files: a synthetic cell's file is inside its unit's folder (a
    directory() output of rule cells or metrics), which is the input; a real or file cell's
    file is its own rule's output. The stages are given the files themselves (a param).
    """
    out = []
    for cell_path in paths:
        item = cell_path
        for cell, unit in _UNIT_OF.items():
            match = template_regex(cell).fullmatch(cell_path)
            if match and match["distribution"] in STUDY.distributions:
                item = path(unit, distribution=match["distribution"], dim=match["dim"])
        if item not in out:
            out.append(item)
    return out


def variant_packed(w):
    """The packed-caches folder a query-model variant's unit measures: its parent's."""
    return path(
        "packed_unit", distribution=STUDY.packed_distribution(w.distribution), dim=w.dim
    )


def data_manifests():
    return [path("data", distribution=d, dim=n) for d, n in STUDY.data_cells()]


def metrics_tables():
    """The metrics folders of every unit (each holds its cells' files)."""
    return [
        path(unit, distribution=d, dim=n)
        for d, n in STUDY.data_cells()
        for unit in ("per_query_unit", "per_key_unit")
    ]


# The rate-distortion frontier (kvasym.frontier; its rule is in frontier.smk), only with frontier.schemes.
FRONTIER = bool(STUDY.frontier_schemes)


def frontier_cells(wildcards=None):
    """The slice digest of each of frontier_per_query's files, in order (--cells of the frontier
    stage, which checks every file's provenance against it)."""
    return canonical_json(
        [
            slice_digest(cell_table_slice(**cell_of_path(path)))
            for path in frontier_per_query()
        ]
    )


def frontier_per_query(wildcards=None):
    """Every scheme's (the grid's and the frontier's) per-query files at every budget, on the
    frontier's synthetic cells (with their schemes' frontier.extra_budgets: files of the same
    unit folders) and the real cells."""
    synthetic = [
        (dist, dim, scheme, budget)
        for dist, dim in STUDY.frontier_data_cells()
        for scheme in STUDY.frontier_shown_schemes(dist)
        for budget in STUDY.frontier_budgets(dist, scheme)
    ]
    # the query-aware variants' bases are of post-RoPE queries: post-RoPE rows only
    real = [
        (dist, dim, scheme, budget)
        for dist, dim in (REAL_CELLS if FRONTIER else [])
        for scheme in [
            *STUDY.schemes,
            *STUDY.frontier_real_schemes,
            *(
                STUDY.frontier_real_query_aware
                if REAL_DISTRIBUTIONS[dist] == "post"
                else ()
            ),
        ]
        for budget in [*STUDY.budgets, *REAL_EXTRA_BUDGETS.get(scheme, ())]
    ]
    return [
        path("per_query", distribution=dist, dim=dim, scheme=scheme, budget=budget)
        for dist, dim, scheme, budget in [*synthetic, *real]
    ]


# The real rows' extra budgets (kvasym.study.Study.real_extra_budgets), a real_metrics_extra job
# per cell, and the wildcard constraints of that rule's scheme and budget.
REAL_EXTRA_BUDGETS = STUDY.real_extra_budgets()
REAL_EXTRA_SCHEMES_PATTERN = names_pattern(REAL_EXTRA_BUDGETS)
REAL_EXTRA_BUDGETS_PATTERN = names_pattern(
    sorted({str(b) for budgets in REAL_EXTRA_BUDGETS.values() for b in budgets})
)


def frontier_targets():
    return [pattern("frontier_points"), pattern("frontier_units")] if FRONTIER else []


def frontier_param(wildcards):
    return canonical_json(STUDY.frontier_slice())


# The sequence-length sweep (kvasym.seqlen; its rule is in seqlen.smk), only with seq_len_sweep.seq_lens.
SEQ_LEN = bool(STUDY.seq_len_sweep)


def seq_len_targets():
    return (
        [pattern(f"seq_len_{name}") for name in ("rows", "summary", "slopes")]
        if SEQ_LEN
        else []
    )


def seq_len_sweep_param(wildcards):
    return canonical_json(STUDY.seq_len_sweep_slice())


def gathered_cells(kind):
    """The (distribution, dim) of the stats parts gathered into table ``kind``: every synthetic
    data cell, then the file and real cells; the query-model variants (kvasym.study) only into
    the per-trial table (claims may name them; no comparison, summary or theory row of theirs).
    """
    synthetic = STUDY.data_cells() if kind == "trials" else STUDY.main_data_cells()
    return [*synthetic, *FILE_CELLS, *REAL_CELLS]


def stats_tables(kind):
    """The stats parts gathered into table ``kind`` (gathered_cells)."""
    return [
        path(f"{kind}_part", distribution=d, dim=n) for d, n in gathered_cells(kind)
    ]


# End-to-end passes (kvasym.real.endtoend): with the real rows, unless real.e2e is off.
E2E = REAL["e2e"] if REAL_CELLS else None
QUERY_AWARE = bool(E2E and E2E["query_aware"])
CARD_OUTPUTS = stage_module("card").OUTPUTS  # the card stage declares what it writes


# The models of the end-to-end passes: the primary (SmolLM2-135M), then real.models whose files
# are installed (one line names what is missing for the others, as for the real extra).
E2E_MODELS = [PRIMARY_MODEL] if E2E else []
for _model, _section in (REAL["models"] if E2E else {}).items():
    _missing = model_missing_reason(_model)
    if _missing:
        print(
            f"kvasym: the end-to-end passes of {_model} are skipped: {_missing}",
            file=sys.stderr,
        )
    else:
        E2E_MODELS.append(_model)
MODEL_SECTIONS = {m: model_section(REAL, m) for m in E2E_MODELS}
ASSEMBLED_STEMS = sorted(
    MODELS[m].stem for m in E2E_MODELS if MODELS[m].chunked is not None
)
# Each model's long-context windows, passkey trials and card (None when off; a further model's
# are its own, off unless its real.models entry sets them).
LONG_OF = {m: MODEL_SECTIONS[m]["e2e"]["long_context"] for m in E2E_MODELS}
PASSKEY_OF = {m: MODEL_SECTIONS[m]["e2e"]["passkey"] for m in E2E_MODELS}
CARD_OF = {m: MODEL_SECTIONS[m]["card"] for m in E2E_MODELS}
# each model's greedy-decode agreement (real.e2e.greedy: inherited by a further model)
GREEDY_OF = {m: MODEL_SECTIONS[m]["e2e"]["greedy"] for m in E2E_MODELS}
LONG_MODELS = [m for m in E2E_MODELS if LONG_OF[m]]
PASSKEY_MODELS = [m for m in E2E_MODELS if PASSKEY_OF[m]]
CARD_MODELS = [m for m in E2E_MODELS if CARD_OF[m]]
GREEDY_MODELS = [m for m in E2E_MODELS if GREEDY_OF[m]]
# a greedy scheme with statistics over blocks of rows needs its chunk: checked now for every
# configured model (installed or not), one line naming the key, not a params-function traceback
for _model in [PRIMARY_MODEL, *REAL["models"]] if REAL and REAL["e2e"] else []:
    try:
        if model_section(REAL, _model)["e2e"]["greedy"]:
            STUDY.greedy_slice(model_section(REAL, _model))
    except KvasymError as exc:
        raise WorkflowError(f"invalid config: {exc}")
# the primary's: what the tables, figures and claims read (the cross-model table reads the rest)
CARD = CARD_OF.get(PRIMARY_MODEL)
# e2e_stats writes the long-context and passkey tables when any model has their passes.
E2E_TABLES = (
    "summary",
    "comparisons",
    "equal_bits",
    "sensitivity",
    "agreement",
    *(("long_summary", "long_positions", "long_comparisons") if LONG_MODELS else ()),
    *(("passkey_summary",) if PASSKEY_MODELS else ()),
)


def assembled_model(wildcards):
    """The model key of an assembled file's job (rule model_file) from its file stem."""
    return next(m for m in E2E_MODELS if MODELS[m].stem == wildcards.stem)


def e2e_parts(wildcards):
    """The part files of one (model, text), part 0 first (real.e2e.parts; rule e2e)."""
    parts = MODEL_SECTIONS[wildcards.model]["e2e"]["parts"]
    return [
        path("e2e_part", model=wildcards.model, text=wildcards.text, part=p)
        for p in range(parts)
    ]


def e2e_texts(wildcards=None):
    return [
        path("e2e_text", model=m, text=text)
        for m in E2E_MODELS
        for text in MODEL_SECTIONS[m]["e2e"]["texts"]
    ]


def model_inputs(stage):
    """An input function of a model-level stage: the query-aware bases of the job's model (with
    query-aware variants) and its assembled file (a model from chunk packages)."""
    inputs = stage_module(stage).INPUTS

    def present(w):
        model = dict(w.items()).get("model", PRIMARY_MODEL)
        out = {}
        if "query_bases" in inputs and MODEL_SECTIONS[model]["e2e"]["query_aware"]:
            out["query_bases"] = path("query_bases", model=model)
        if "model_file" in inputs and MODELS[model].chunked is not None:
            out["model_file"] = path("model_file", stem=MODELS[model].stem)
        return out

    return present


def e2e_long_windows(wildcards=None):
    """The long-context tables of every model with long-context passes, each length's parts
    (its long_context.parts)."""
    return [
        path("e2e_long_window", model=m, length=n, part=p)
        for m in LONG_MODELS
        for n in LONG_OF[m]["lengths"]
        for p in range(LONG_OF[m]["parts"])
    ]


def passkey_tables(wildcards=None):
    """The passkey trial tables of every model with passkey trials, each length's parts (its
    passkey.parts)."""
    return [
        path("passkey_trials", model=m, length=n, part=p)
        for m in PASSKEY_MODELS
        for n in PASSKEY_OF[m]["lengths"]
        for p in range(PASSKEY_OF[m]["parts"])
    ]


def card_sensitivity_parts(wildcards=None, model=None):
    """One model's card sensitivity tables, each calibration text's parts (its card.parts): the
    input of rule card (the job's wildcards), or of the crate (``model``)."""
    model = model or wildcards.model
    card = CARD_OF[model]
    return [
        path("card_sensitivity", model=model, text=t, part=p)
        for t in card["calibration_texts"]
        for p in range(card["parts"])
    ]


def greedy_targets():
    """Every model's greedy-agreement tables (none when real.e2e.greedy is off)."""
    return [
        path(name, model=m)
        for m in GREEDY_MODELS
        for name in ("e2e_greedy", "e2e_greedy_summary")
    ]


def card_targets():
    """Every model's card outputs (none without a card)."""
    names = [*CARD_OUTPUTS, "html"]  # the page: rule card_page
    return [path(f"card_{name}", model=m) for m in CARD_MODELS for name in names]


def primary_pattern(name):
    """The pattern of artifact ``name``, its model wildcard (if any) the primary model: the
    tables, figures and claims read the primary model's card."""
    return model_pattern(name, PRIMARY_MODEL)


def e2e_stats_table_name(name):
    """The artifact of an e2e_stats output: e2e_<name>, or <name> for passkey_summary."""
    return name if name.startswith("passkey") else f"e2e_{name}"


def e2e_targets():
    """The end-to-end tables, when configured (empty otherwise)."""
    return [pattern(e2e_stats_table_name(name)) for name in E2E_TABLES] if E2E else []


# The artifacts only some DAGs have, by the part of the study they exist for (kvasym.artifacts).
OPTIONAL_PARTS = {
    "real": bool(REAL_CELLS),
    "e2e": bool(E2E),
    "query_aware": QUERY_AWARE,
    "long_context": bool(LONG_MODELS),
    "passkey": bool(PASSKEY_MODELS),
    "greedy": bool(GREEDY_MODELS),
    "card": bool(CARD),
    "frontier": FRONTIER,
    "seq_len": SEQ_LEN,
}


def optional_of(stage):
    """The inputs of ``stage`` (its module's INPUTS) whose artifacts only some DAGs have."""
    inputs = stage_module(stage).INPUTS
    return tuple(name for name in inputs if ARTIFACTS[inputs[name]].when != "always")


# The models each per-model artifact exists for (the card's: the models with a card).
MODELS_OF_PART = {"card": CARD_MODELS, "greedy": GREEDY_MODELS}


def optional_inputs(stage):
    """An input function: the optional inputs of ``stage`` that this DAG has, by name; a
    per-model artifact the primary model's, or every model's for an input the stage reads per
    model (its module's PER_MODEL)."""
    inputs = stage_module(stage).INPUTS
    per_model = getattr(stage_module(stage), "PER_MODEL", ())

    def present(wildcards):
        out = {}
        for name in optional_of(stage):
            item = ARTIFACTS[inputs[name]]
            if name in per_model:
                models = MODELS_OF_PART[item.when]
                if models:
                    out[name] = [path(inputs[name], model=m) for m in models]
            elif OPTIONAL_PARTS[item.when]:
                out[name] = primary_pattern(inputs[name])
        return out

    return present


def output_flags(names):
    """A params function: a job's ``--out-<name>`` flags (underscores as dashes) for its named
    outputs, quoted."""

    def flags(wildcards, output):
        return " ".join(
            f"--out-{name.replace('_', '-')} {shlex.quote(str(output[name]))}"
            for name in names
        )

    return flags


def flags_of(*names):
    """A params function: the `kvasym stage` flags of the named inputs the job has (quoted)."""

    def flags(wildcards, input):
        return input_flags(
            {name: input[name] for name in names if name in input.keys()}
        )

    return flags


def theory_tables():
    return [
        path("theory_part", distribution=d, dim=n) for d, n in STUDY.main_data_cells()
    ]


def job_slice(stage, w):
    """The config slice a job of grid stage ``stage`` depends on (kvasym.study.Study.job_slice)."""
    return STUDY.job_slice(stage, dict(w.items()), real=REAL, file_digests=FILE_DIGESTS)


def cell_table_slice(distribution, dim, scheme, budget):
    """The slice a cell's metrics file is made from (kvasym.study.Study.cell_table_slice)."""
    return STUDY.cell_table_slice(
        distribution, dim, scheme, budget, real=REAL, file_digests=FILE_DIGESTS
    )


def slice_param(stage):
    """The ``--slice`` param of a grid stage: its config slice of the job's wildcards, as JSON."""
    return lambda w: canonical_json(job_slice(stage, w))


def resources_of(stage):
    """A rule's resources (kvasym.resources.job_resources): from the job's slice for grid
    stages, from the input size for file_metrics, fixed otherwise."""

    def request(key):
        def of(w, input):
            sliced = job_slice(stage, w) if stage in SLICE_STAGES else None
            return job_resources(
                stage, sliced, input.size_mb if stage == "file_metrics" else 0
            )[key]

        return of

    return {"mem_mb": request("mem_mb"), "runtime": request("runtime")}


def per_query_inputs(w):
    return cell_paths("per_query", w)


def metrics_cells(w):
    """The (scheme, budget) each per-query (and per-key) input of a stats or theory job is filed
    under, in the order of per_query_inputs, and the digest of the slice it is made from: the
    stage refuses (and moves aside) a file that holds another cell's table, or one made under
    another configuration (kvasym.cells.check_provenance)."""
    return canonical_json(
        [
            {
                "scheme": s,
                "budget": b,
                "slice_sha256": slice_digest(
                    cell_table_slice(w.distribution, w.dim, s, b)
                ),
            }
            for s in STUDY.schemes
            for b in STUDY.budgets
        ]
    )


def per_query_folders(w):
    """The inputs of a stats job: its cells' unit folder (or, for real and file cells, files)."""
    return as_inputs(per_query_inputs(w))


def per_key_folders(w):
    """The inputs of a theory job: its unit's per-key folder."""
    return as_inputs(per_key_inputs(w))


def per_key_inputs(w):
    return cell_paths("per_key", w)


def cell_paths(table, w):
    """Every (scheme, budget) cell file of ``table`` of the job's (distribution, dim)."""
    return [
        path(table, distribution=w.distribution, dim=w.dim, scheme=s, budget=b)
        for s in STUDY.schemes
        for b in STUDY.budgets
    ]


# the figures: what each family draws, reads and is shown as in the report
# the figure families of this DAG: the real-model heat map only with real-model rows
FIGURE_FAMILIES = dag_families(
    bool(REAL_CELLS), bool(E2E), FRONTIER, bool(LONG_OF.get(PRIMARY_MODEL)), bool(CARD)
)


def figure_outputs():
    return {
        f"{name}_{fmt}": path("figure", name=name, format=fmt)
        for names in FIGURE_FAMILIES.values()
        for name in names
        for fmt in FORMATS
    }


FIGURES_SLICE = figures_slice(STUDY)
HEADLINE = STUDY.headline
HEADLINE_LABEL = (
    f"{HEADLINE['distribution']}, d = {HEADLINE['dim']}, "
    f"sharpness {HEADLINE['sharpness']:g}, n = {HEADLINE['budget']}"
)


def figure_label(family):
    """The cell a family's figures show (the report's "cell" label)."""
    if "real_per_query" in FIGURE_REGISTRY[family].inputs:
        return f"{REAL_MODEL_NAME}, d = {REAL_HEAD_DIM}, n = {HEADLINE['budget']}"
    if "e2e_summary" in FIGURE_REGISTRY[family].inputs:
        return f"{REAL_MODEL_NAME}, end to end, every budget"
    if "e2e_long_positions" in FIGURE_REGISTRY[family].inputs:
        return f"{REAL_MODEL_NAME}, long-context windows"
    if "frontier_points" in FIGURE_REGISTRY[family].inputs:
        return f"frontier cells, sharpness {HEADLINE['sharpness']:g}, every budget"
    return HEADLINE_LABEL


def figure_inputs(family):
    """The files one figure family reads (kvasym.render.figures.registry.FIGURE_FAMILIES): gathered
    tables, and the metrics files or data manifests of its facet cells only."""
    wanted = FIGURE_REGISTRY[family].inputs
    cells = family_cells(FIGURES_SLICE, family)
    inputs = {}
    for key in wanted:
        name = FIGURE_INPUTS[key]
        if key == "real_per_query":
            # every scheme of every real distribution at the headline budget
            inputs[key] = [
                path(name, distribution=d, dim=n, scheme=s, budget=HEADLINE["budget"])
                for d, n in REAL_CELLS
                for s in STUDY.schemes
            ]
        elif key in FIGURE_CELL_INPUTS:  # the family's facet cells
            inputs[key] = [
                path(
                    name,
                    distribution=c["distribution"],
                    dim=c["dim"],
                    scheme=s,
                    budget=b,
                )
                for c in cells
                for s in (
                    STUDY.schemes if "scheme" in ARTIFACTS[name].wildcards else [None]
                )
                for b in (
                    [None]
                    if "budget" not in ARTIFACTS[name].wildcards
                    else STUDY.budgets if c["budget"] is None else [c["budget"]]
                )
            ]
        else:  # a gathered table
            inputs[key] = primary_pattern(name)
    return inputs


def cell_digests(paths):
    """The slice digest of each metrics file's cell (the consumer checks its provenance)."""
    return {
        cell: slice_digest(cell_table_slice(**cell_of_path(cell))) for cell in paths
    }


def figure_flags(inputs):
    """The `kvasym stage figure` flags of a family's named input files, with the digest of each
    metrics file's cell (kvasym.stages.figure: INPUTS, LISTINGS)."""
    return stage_flags(
        stage_module("figure"),
        inputs,
        listings={
            key: cell_digests(paths)
            for key, paths in inputs.items()
            if key in stage_module("figure").LISTINGS
        },
    )


def display_inputs():
    """The metrics files stage gather summarises into the figures' display tables
    (kvasym.display): the facet cells' per-query files (every scheme and budget) and per-key
    files (every scheme, the headline budget), kvasym.render.figures.registry.facet_cells.
    """
    return {
        f"display_{table}": [
            path(
                table, distribution=c["distribution"], dim=c["dim"], scheme=s, budget=b
            )
            for c in facet_cells(FIGURES_SLICE, table)
            for s in STUDY.schemes
            for b in (STUDY.budgets if c["budget"] is None else [c["budget"]])
        ]
        for table in ("per_query", "per_key")
    }


# every table the tables stage writes (kvasym.render.tables.TABLES), whatever the config: a
# table whose part is off is written with its "not in this run" text
TABLES = [name.removeprefix("table_") for name in RENDERED_TABLES]
# a table or figure the paper's TeX uses that no rule can make is an error before the DAG runs
try:
    check_paper_inputs("paper", TABLES, ALL_FIGURES)
except KvasymError as exc:
    raise WorkflowError(str(exc)) from None


def real_capture_files(wildcards=None):
    """The real-model captures (rule capture), one per configured text."""
    if not REAL_CELLS:
        raise WorkflowError(
            "the real-model rows are not configured or their extra is missing: "
            f"{REAL_MISSING or 'add a real: section to the config'}"
        )
    return [path("captures", text=text) for text in REAL["texts"]]


def published_bands_input(wildcards):
    """The published small-model bands (config/published_bands.yaml), only with end-to-end passes."""
    return (
        {"published_bands": PUBLISHED_BANDS}
        if E2E and Path(PUBLISHED_BANDS).is_file()
        else {}
    )


def manifests_input(wildcards):
    """The real table's data manifests, only with real rows: the synthetic distributions' at
    the headline dim (their statistics beside the real caches')."""
    if not REAL_CELLS:
        return {}
    return {
        "data_manifests": [
            path("data", distribution=d, dim=n)
            for d, n in STUDY.data_cells()
            if n == HEADLINE["dim"]
        ]
    }


HAVE_LATEX = have_latex()
LATEX_HINT = (
    "kvasym: no LaTeX engine found, so the paper PDF is skipped (every generated source is still "
    f"written). Debian: apt-get install {LATEX_PACKAGES}; conda: add texlive-core to environment.yml."
)


def paper_targets():
    targets = [path("table", name=name) for name in TABLES] + [
        pattern("numbers"),
        pattern("reproduce"),
    ]
    if HAVE_LATEX:
        targets.append(pattern("paper_pdf"))
    else:
        print(LATEX_HINT, file=sys.stderr)
    return targets


def out_dir(wildcards, output):
    """The folder of a rule's first output (a param derived from the output, not hardcoded)."""
    return os.path.dirname(output[0])


def part_cells(artifact, parts):
    """The (distribution, dim) each part (of a stats or theory ``artifact``) is filed under, in
    order, and the digest of the slice of the job that wrote it: a part copied over another, or
    made under another config, is refused (and moved aside) by the gather stage."""
    cells = [template_regex(artifact).fullmatch(part).groupdict() for part in parts]
    (writer,) = ARTIFACTS[artifact].writers
    return [
        {
            "distribution": cell["distribution"],
            "dim": int(cell["dim"]),
            "slice_sha256": slice_digest(job_slice(writer, cell)),
        }
        for cell in cells
    ]


def gather_flags(wildcards, input, output):
    """The `kvasym stage gather` flags (kvasym.stages.gather: INPUTS, OUTPUTS, LISTINGS): each
    table's parts, its gathered file and its parts' cells; the query-model table and its slice;
    the display tables, the facet cells' metrics files they summarise, those files' cell
    digests and the rows kept (the figures slice's gather.DISPLAY_SLICE_KEYS)."""
    gather = stage_module("gather")
    display = (
        display_inputs()
    )  # the metrics files (the rule's input may name their folders)
    display_slice = {key: FIGURES_SLICE[key] for key in gather.DISPLAY_SLICE_KEYS}
    return stage_flags(
        gather,
        {name: display.get(name) or list(input[name]) for name in gather.INPUTS},
        {name: output[name] for name in output.keys()},
        {
            **{
                name: part_cells(artifact, input[name])
                for name, artifact in gather.INPUTS.items()
                if name not in display
            },
            **{name: cell_digests(paths) for name, paths in display.items()},
            "query_model": STUDY.query_model_slice(),
            **{name: display_slice for name, _ in gather.DISPLAY_OUTPUTS.values()},
        },
    )


def real_outputs(wildcards, output):
    """The real_metrics job's --out flags: BUDGET=FILE for each budget's per-query file."""
    return " ".join(
        shlex.quote(f"{budget}={out}") for budget, out in zip(STUDY.budgets, output)
    )


def real_text_names(wildcards):
    """The configured shipped texts' names for `kvasym stage capture --shipped` (quoted)."""
    return " ".join(shlex.quote(text) for text in REAL["texts"])


def real_layers(wildcards):
    return ",".join(map(str, REAL["layers"]))


def file_cache(wildcards):
    return STUDY.files[wildcards.distribution]["params"]["path"]


def numbers_param(wildcards):
    return canonical_json(numbers_slice(STUDY, HEADLINE, CLAIMS))


def reproduce_param(wildcards):
    return canonical_json(
        reproduce_slice(
            STUDY,
            validate_config(config),
            [os.path.relpath(f) for f in workflow.configfiles],
        )
    )


def reproduce_forward(wildcards):
    """The committed forward-pass check (benchmarks/validate_forward.py), when the checkout has it."""
    path = "tests/expected/forward_reference.json"
    return [path] if os.path.isfile(path) else []


def reproduce_captures(wildcards):
    """The real-model captures whose metadata the reproduce section prints (none without them)."""
    return real_capture_files() if REAL_CELLS else []


def headline_param(wildcards):
    return canonical_json(HEADLINE)


def schemes_param(wildcards):
    """Every scheme the DAG runs with its description (the paper's scheme table)."""
    return canonical_json(STUDY.scheme_definitions(REAL))


def figures_param(wildcards):
    return canonical_json(FIGURES_SLICE)


def crate_parts():
    """What the run wrote beyond RUN_OUTPUTS that its crate lists: the stats and theory parts (a
    claim decided in one cell names its parts), the real and file cells' metrics files (written
    per cell, not as unit folders), the frontier's per-query files, the captures, the real
    caches' statistics, the end-to-end passes' per-text tables and the parts the model jobs
    wrote (end-to-end passes, long-context windows, passkey trials, sensitivity rows).
    """
    parts = [stats_tables(kind) for kind in ("comparisons", "summary", "trials")]
    parts.append(theory_tables())
    parts.append(
        [
            path("per_query", distribution=d, dim=n, scheme=s, budget=b)
            for d, n in [*FILE_CELLS, *REAL_CELLS]
            for s in STUDY.schemes
            for b in STUDY.budgets
        ]
    )
    parts.append(as_inputs(frontier_per_query()))
    if REAL_CELLS:
        parts.append(real_capture_files())
        parts.append([path("capture_sidecar", text=text) for text in REAL["texts"]])
        parts.append(list(optional_inputs("tables")(None).values()))
    if E2E:
        # the model jobs' parts, so that each job that computed is an action of the crate
        parts.append(e2e_texts())
        parts.append(
            [
                path("e2e_part", model=m, text=text, part=p)
                for m in E2E_MODELS
                for text in MODEL_SECTIONS[m]["e2e"]["texts"]
                for p in range(MODEL_SECTIONS[m]["e2e"]["parts"])
            ]
        )
        parts.append(e2e_long_windows())
        parts.append(passkey_tables())
        parts.append([f for m in CARD_MODELS for f in card_sensitivity_parts(model=m)])
    return parts


def crate_param(wildcards):
    """The crate's slice: the files the run read and who wrote each distribution's metrics."""
    writers = {name: "cells" for name in CELL_UNITS}
    writers.update({name: "metrics" for name in VARIANT_UNITS})
    writers.update({name: "file_metrics" for name, _ in FILE_CELLS})
    writers.update({name: "real_metrics" for name, _ in REAL_CELLS})
    return canonical_json(
        crate_slice(
            validate_config(config),
            [os.path.relpath(f) for f in workflow.configfiles],
            STUDY.claims_file,
            writers,
        )
    )
