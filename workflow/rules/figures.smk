# Stage 6: every figure of the paper (Shannon-phi planes, KL ECDFs, budget, tail, rank and
# sharpness sweeps, QJL theory check, rotated marginals, Jensen bias) from the gathered tables,
# the metrics dataset and the data manifests, in one job: results/figures/<name>.{pdf,png}.
# The figure names live in the library (kvasym.figures_stage.FIGURES); the slice carries the
# headline cell (from the claims file's defaults) and the distributions' kinds and params.
from kvasym.figures_stage import FIGURES, FORMATS, claims_defaults, figures_slice

FIGURES_DIR = f"{RESULTS}/figures"


def figure_outputs():
    return {f"{name}_{fmt}": f"{FIGURES_DIR}/{name}.{fmt}" for name in FIGURES for fmt in FORMATS}


def figure_metrics(table):
    return [path for path in metrics_tables() if f"/metrics/{table}/" in path]


rule figures:
    input:
        summary=rules.gather.output.summary,
        comparisons=rules.gather.output.comparisons,
        theory=rules.gather.output.theory,
        per_query=figure_metrics("per_query"),
        per_key=figure_metrics("per_key"),
        data=data_manifests(),
    output:
        **figure_outputs(),
    params:
        slice=lambda w: canonical_json(figures_slice(STUDY, claims_defaults(STUDY.claims_file))),
        out_dir=FIGURES_DIR,
    log:
        f"{RESULTS}/logs/figures.log",
    benchmark:
        f"{RESULTS}/benchmarks/figures.tsv"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    shell:
        "kvasym stage figures --slice {params.slice:q} --summary {input.summary:q}"
        " --comparisons {input.comparisons:q} --theory {input.theory:q}"
        " --per-query {input.per_query:q} --per-key {input.per_key:q} --data {input.data:q}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"
