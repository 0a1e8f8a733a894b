# Stage 6: every figure of the paper (Shannon-phi planes, KL ECDFs, budget, tail, rank and
# sharpness sweeps, QJL theory check, rotated marginals, Jensen bias) from the gathered tables,
# the metrics dataset and the data manifests, in one job: results/figures/<name>.{pdf,png}.


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
    log:
        f"{RESULTS}/logs/figures.log",
    benchmark:
        f"{RESULTS}/benchmarks/figures.tsv"
    conda:
        "../../environment.yml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        slice=lambda w: canonical_json(
            figures_slice(STUDY, claims_defaults(STUDY.claims_file))
        ),
        out_dir=out_dir,
    shell:
        "kvasym stage figures --slice {params.slice:q} --summary {input.summary:q}"
        " --comparisons {input.comparisons:q} --theory {input.theory:q}"
        " --per-query {input.per_query:q} --per-key {input.per_key:q} --data {input.data:q}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"
