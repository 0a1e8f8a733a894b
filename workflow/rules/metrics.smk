# Stage 3: per-query and per-key metrics of each cell, as one Parquet dataset per table.


rule metrics:
    input:
        data=rules.data.output.manifest,
        trials=rules.data.output.trials,
        packed=packed_input,
    output:
        per_query=f"{RESULTS}/metrics/per_query/{{distribution}}/d{{dim}}/{{scheme}}/n{{budget}}.parquet",
        per_key=f"{RESULTS}/metrics/per_key/{{distribution}}/d{{dim}}/{{scheme}}/n{{budget}}.parquet",
    log:
        f"{RESULTS}/logs/metrics/{{distribution}}/d{{dim}}/{{scheme}}/n{{budget}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/metrics/{{distribution}}/d{{dim}}/{{scheme}}/n{{budget}}.tsv"
    threads: 1
    resources:
        **resources_of("metrics"),
    params:
        code=STAGE_CODE["metrics"],  # reruns the job when the code it runs changes
        slice=slice_param("metrics"),
    shell:
        "kvasym stage metrics --slice {params.slice:q} --data {input.data:q}"
        " --trials {input.trials:q}"
        " --packed {input.packed:q} --per-query {output.per_query:q}"
        " --per-key {output.per_key:q} > {log:q} 2>&1"
