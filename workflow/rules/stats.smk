# Stage 4: statistics per (distribution, dim), theory checks, and the study-wide gathered tables
# (with the query-model table of C5's ratio under each query model, from the gathered trials).


rule stats:
    input:
        wiring.per_query_folders,
    output:
        comparisons=pattern("comparisons_part"),
        summary=pattern("summary_part"),
        trials=pattern("trials_part"),
    log:
        log_path("stats"),
    benchmark:
        benchmark_path("stats")
    threads: 1
    resources:
        **resources_of("stats"),
    params:
        code=STAGE_CODE["stats"],  # reruns the job when the code it runs changes
        slice=slice_param("stats"),
        cells=wiring.metrics_cells,
        per_query=wiring.per_query_inputs,
    shell:
        "kvasym stage stats --slice {params.slice:q} --per-query {params.per_query:q} --cells {params.cells:q}"
        " --comparisons {output.comparisons:q} --summary {output.summary:q}"
        " --trials {output.trials:q} > {log:q} 2>&1"


rule theory:
    input:
        data=pattern("data"),
        per_key=wiring.per_key_folders,
    output:
        pattern("theory_part"),
    log:
        log_path("theory"),
    benchmark:
        benchmark_path("theory")
    threads: 1
    resources:
        **resources_of("theory"),
    params:
        code=STAGE_CODE["theory"],  # reruns the job when the code it runs changes
        slice=slice_param("theory"),
        cells=wiring.metrics_cells,
        per_key=wiring.per_key_inputs,
    shell:
        "kvasym stage theory --slice {params.slice:q} --data {input.data:q}"
        " --per-key {params.per_key:q} --cells {params.cells:q} --out {output:q} > {log:q} 2>&1"


rule gather:
    input:
        **{key: as_inputs(files) for key, files in wiring.display_inputs().items()},
        comparisons=wiring.stats_tables("comparisons"),
        summary=wiring.stats_tables("summary"),
        trials=wiring.stats_tables("trials"),
        theory=wiring.theory_tables(),
        # the facet cells' metrics, summarised into the figures' display tables
    output:
        # the stage's declared outputs (kvasym.stages.gather.OUTPUTS)
        **{name: pattern(name) for name in stage_module("gather").OUTPUTS.values()},
    log:
        log_path("gather"),
    localrule: True
    threads: 1
    resources:
        **resources_of("gather"),
    params:
        code=STAGE_CODE["gather"],  # reruns the job when the code it runs changes
        tables=wiring.gather_flags,
    shell:
        # the Holm families are the library's (kvasym.stages.gather.HOLM_FAMILIES)
        "kvasym stage gather {params.tables} > {log:q} 2>&1"
