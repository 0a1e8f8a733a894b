# Stage 2: for each cell (distribution, dim, scheme, budget), the packed K and V caches.


rule quantize:
    input:
        data=rules.data.output.manifest,
        trials=rules.data.output.trials,
    output:
        f"{RESULTS}/packed/{{distribution}}/d{{dim}}/{{scheme}}/n{{budget}}.npz",
    log:
        f"{RESULTS}/logs/quantize/{{distribution}}/d{{dim}}/{{scheme}}/n{{budget}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/quantize/{{distribution}}/d{{dim}}/{{scheme}}/n{{budget}}.tsv"
    threads: 1
    resources:
        **resources_of("quantize"),
    params:
        code=STAGE_CODE["quantize"],  # reruns the job when the code it runs changes
        slice=slice_param("quantize"),
    shell:
        "kvasym stage quantize --slice {params.slice:q} --data {input.data:q}"
        " --trials {input.trials:q}"
        " --out {output:q} > {log:q} 2>&1"
