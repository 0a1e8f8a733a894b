# Stage 4b: the rate-distortion frontier (kvasym.frontier): measured total bits per coordinate
# against attention damage, for the grid's schemes and the frontier's own (frontier.schemes),
# on the frontier's distributions and the real rows. Only with frontier.schemes.


rule frontier:
    input:
        as_inputs(wiring.frontier_per_query()),
    output:
        points=pattern("frontier_points"),
        units=pattern("frontier_units"),
    log:
        log_path("frontier"),
    benchmark:
        benchmark_path("frontier")
    threads: 1
    resources:
        **resources_of("frontier"),
    params:
        code=STAGE_CODE["frontier"],  # reruns the job when the code it runs changes
        slice=wiring.param("frontier"),
        per_query=wiring.frontier_per_query(),
        cells=wiring.frontier_cells(),
    shell:
        "kvasym stage frontier --slice {params.slice:q} --per-query {params.per_query:q}"
        " --cells {params.cells:q} --points {output.points:q} --units {output.units:q} > {log:q} 2>&1"
