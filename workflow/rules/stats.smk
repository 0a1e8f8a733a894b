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
        **stage_params(
            "stats", per_query=wiring.per_query_inputs, cells=wiring.metrics_cells
        ),
        code=STAGE_CODE["stats"],  # reruns the job when the code it runs changes
        # the cell files inside the unit folder the job depends on, and their cells
    shell:
        "kvasym stage stats {params.args} > {log:q} 2>&1"


rule theory:
    input:
        wiring.per_key_folders,
        data=pattern("data"),
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
        **stage_params(
            "theory", per_key=wiring.per_key_inputs, cells=wiring.metrics_cells
        ),
        code=STAGE_CODE["theory"],  # reruns the job when the code it runs changes
    shell:
        "kvasym stage theory {params.args} > {log:q} 2>&1"


rule gather:
    input:
        **{
            key: wiring.as_inputs(files)
            for key, files in wiring.display_inputs().items()
        },
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
        # the flags the gather stage derives from its declarations (INPUTS, OUTPUTS, LISTINGS)
        args=wiring.gather_flags,
    shell:
        "kvasym stage gather {params.args} > {log:q} 2>&1"
