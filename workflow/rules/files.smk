# Bring-your-own caches: distributions of kind `file` (kvasym.cachefile), one metrics job per
# (distribution, scheme, budget) over every layer and KV head of the file, into the synthetic
# study's per-query schema, so stats, gather, claims and tables read them like any distribution.
# The file itself is the job's input: replacing it reruns its cells.

if wiring.file_cells:

    rule file_metrics:
        input:
            cache=wiring.file_cache,
        output:
            pattern("per_query"),
        log:
            log_path("file_metrics"),
        benchmark:
            benchmark_path("file_metrics")
        wildcard_constraints:
            distribution=names_pattern(STUDY.files),
        threads: 1
        resources:
            **resources_of("file_metrics"),
        params:
            **stage_params("file_metrics"),
            code=STAGE_CODE["file_metrics"],  # reruns the job when the code it runs changes
        shell:
            "kvasym stage file_metrics {params.args} > {log:q} 2>&1"
