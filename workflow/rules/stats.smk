# Stage 4: statistics per (distribution, dim), theory checks, and the study-wide gathered tables.


rule stats:
    input:
        per_query_folders,
    output:
        comparisons=f"{RESULTS}/stats/comparisons/{{distribution}}/d{{dim}}.parquet",
        summary=f"{RESULTS}/stats/summary/{{distribution}}/d{{dim}}.parquet",
        trials=f"{RESULTS}/stats/trials/{{distribution}}/d{{dim}}.parquet",
    log:
        f"{RESULTS}/logs/stats/{{distribution}}/d{{dim}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/stats/{{distribution}}/d{{dim}}.tsv"
    threads: 1
    resources:
        **resources_of("stats"),
    params:
        code=STAGE_CODE["stats"],  # reruns the job when the code it runs changes
        slice=slice_param("stats"),
        cells=metrics_cells,
        per_query=per_query_inputs,
    shell:
        "kvasym stage stats --slice {params.slice:q} --per-query {params.per_query:q} --cells {params.cells:q}"
        " --comparisons {output.comparisons:q} --summary {output.summary:q}"
        " --trials {output.trials:q} > {log:q} 2>&1"


rule theory:
    input:
        data=f"{RESULTS}/data/{{distribution}}/d{{dim}}.json",
        per_key=per_key_folders,
    output:
        f"{RESULTS}/theory/{{distribution}}/d{{dim}}.parquet",
    log:
        f"{RESULTS}/logs/theory/{{distribution}}/d{{dim}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/theory/{{distribution}}/d{{dim}}.tsv"
    threads: 1
    resources:
        **resources_of("theory"),
    params:
        code=STAGE_CODE["theory"],  # reruns the job when the code it runs changes
        slice=slice_param("theory"),
        cells=metrics_cells,
        per_key=per_key_inputs,
    shell:
        "kvasym stage theory --slice {params.slice:q} --data {input.data:q}"
        " --per-key {params.per_key:q} --cells {params.cells:q} --out {output:q} > {log:q} 2>&1"


rule gather:
    input:
        comparisons=stats_tables("comparisons"),
        summary=stats_tables("summary"),
        trials=stats_tables("trials"),
        theory=theory_tables(),
    output:
        comparisons=f"{RESULTS}/stats/comparisons.parquet",
        summary=f"{RESULTS}/stats/summary.parquet",
        trials=f"{RESULTS}/stats/trials.parquet",
        theory=f"{RESULTS}/theory/theory.parquet",
    log:
        f"{RESULTS}/logs/gather.log",
    localrule: True
    threads: 1
    resources:
        **resources_of("gather"),
    params:
        code=STAGE_CODE["gather"],  # reruns the job when the code it runs changes
        tables=gather_flags,
    shell:
        # the Holm families are the library's (kvasym.stages.gather.HOLM_FAMILIES)
        "kvasym stage gather {params.tables} > {log:q} 2>&1"
