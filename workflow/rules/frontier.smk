# Stage 4b: the rate-distortion frontier (kvasym.frontier): measured total bits per coordinate
# against attention damage, for the grid's schemes and the frontier's own (frontier.schemes),
# on the frontier's distributions and the real rows. Only with frontier.schemes.


rule frontier:
    input:
        wiring.as_inputs(wiring.frontier_per_query()),
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
        **stage_params(
            "frontier",
            slice=wiring.param("frontier"),
            per_query=wiring.frontier_per_query(),
            cells=wiring.frontier_cells(),
        ),
        code=STAGE_CODE["frontier"],  # reruns the job when the code it runs changes
    shell:
        "kvasym stage frontier {params.args} > {log:q} 2>&1"
