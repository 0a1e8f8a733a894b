# Stages 1-3 in one job per (distribution, dim) unit of the synthetic grid (kvasym.stages.cells):
# the data drawn once, then every scheme (the grid's and the frontier's on this distribution) at
# every budget quantized and measured. A query-model variant's unit is the metrics rule's: its
# own queries against its parent's packed caches. Every cell file keeps its path inside the
# unit's folders (results/packed/<dist>/d<d>/<scheme>/n<n>.npz,
# results/metrics/{per_query,per_key}/<dist>/d<d>/<scheme>/n<n>.parquet); changing a unit's
# schemes, budgets or settings reruns the unit whole. A frontier unit also runs its schemes'
# frontier.extra_budgets (cells of the frontier only): changing them reruns the frontier's units
# they add cells to, and the frontier; the other units keep their slices.


rule cells:
    output:
        manifest=pattern("data"),
        packed=directory(pattern("packed_unit")),
        per_query=directory(pattern("per_query_unit")),
        per_key=directory(pattern("per_key_unit")),
    log:
        log_path("cells"),
    benchmark:
        benchmark_path("cells")
    wildcard_constraints:
        distribution=names_pattern(wiring.cell_units),
    threads: threads_of("cells")
    resources:
        **resources_of("cells"),
    params:
        **stage_params("cells"),
        code=STAGE_CODE["cells"],  # reruns the job when the code it runs changes
    shell:
        "kvasym stage cells {params.args} > {log:q} 2>&1"


if wiring.variant_units:

    rule metrics:
        input:
            packed=wiring.variant_packed,
        output:
            manifest=pattern("data"),
            per_query=directory(pattern("per_query_unit")),
            per_key=directory(pattern("per_key_unit")),
        log:
            log_path("metrics"),
        benchmark:
            benchmark_path("metrics")
        wildcard_constraints:
            distribution=names_pattern(wiring.variant_units),
        threads: 1
        resources:
            **resources_of("metrics"),
        params:
            **stage_params("metrics"),
            code=STAGE_CODE["metrics"],  # reruns the job when the code it runs changes
        shell:
            "kvasym stage metrics {params.args} > {log:q} 2>&1"
