# Stage 1: for each (distribution, dim), a manifest of every trial's data (digests, statistics).


rule data:
    output:
        f"{RESULTS}/data/{{distribution}}/d{{dim}}.json",
    params:
        slice=lambda w: canonical_json(data_slice(w)),
    log:
        f"{RESULTS}/logs/data/{{distribution}}/d{{dim}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/data/{{distribution}}/d{{dim}}.tsv"
    threads: 1
    resources:
        **resources_of("data", data_slice),
    shell:
        "kvasym stage data --slice {params.slice:q} --out {output:q} > {log:q} 2>&1"
