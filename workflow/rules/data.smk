# Stage 1: for each (distribution, dim), a manifest of every trial's data (digests, statistics)
# and the trials themselves (K, V, Q), which the quantize and metrics jobs read.


rule data:
    output:
        manifest=f"{RESULTS}/data/{{distribution}}/d{{dim}}.json",
        trials=f"{RESULTS}/data/{{distribution}}/d{{dim}}.trials.npy",
    log:
        f"{RESULTS}/logs/data/{{distribution}}/d{{dim}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/data/{{distribution}}/d{{dim}}.tsv"
    threads: 1
    resources:
        **resources_of("data"),
    params:
        code=STAGE_CODE["data"],  # reruns the job when the code it runs changes
        slice=slice_param("data"),
    shell:
        "kvasym stage data --slice {params.slice:q} --out {output.manifest:q}"
        " --trials {output.trials:q} > {log:q} 2>&1"
