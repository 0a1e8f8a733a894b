# Stage 4: statistics per (distribution, dim), theory checks, and the study-wide gathered tables.


rule stats:
    input:
        per_query_inputs,
    output:
        comparisons=f"{RESULTS}/stats/comparisons/{{distribution}}/d{{dim}}.parquet",
        summary=f"{RESULTS}/stats/summary/{{distribution}}/d{{dim}}.parquet",
        trials=f"{RESULTS}/stats/trials/{{distribution}}/d{{dim}}.parquet",
    log:
        f"{RESULTS}/logs/stats/{{distribution}}/d{{dim}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/stats/{{distribution}}/d{{dim}}.tsv"
    conda:
        "../../environment.yml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        slice=lambda w: canonical_json(STUDY.stats_slice(w.distribution, int(w.dim))),
    shell:
        "kvasym stage stats --slice {params.slice:q} --per-query {input:q}"
        " --comparisons {output.comparisons:q} --summary {output.summary:q}"
        " --trials {output.trials:q} > {log:q} 2>&1"


rule theory:
    input:
        data=rules.data.output[0],
        per_key=per_key_inputs,
    output:
        f"{RESULTS}/theory/{{distribution}}/d{{dim}}.parquet",
    log:
        f"{RESULTS}/logs/theory/{{distribution}}/d{{dim}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/theory/{{distribution}}/d{{dim}}.tsv"
    conda:
        "../../environment.yml"
    threads: 1
    resources:
        **resources_of(
            "theory", lambda w: STUDY.theory_slice(w.distribution, int(w.dim))
        ),
    params:
        slice=lambda w: canonical_json(STUDY.theory_slice(w.distribution, int(w.dim))),
    shell:
        "kvasym stage theory --slice {params.slice:q} --data {input.data:q}"
        " --per-key {input.per_key:q} --out {output:q} > {log:q} 2>&1"


rule gather:
    input:
        comparisons=lambda w: stats_tables("comparisons"),
        summary=lambda w: stats_tables("summary"),
        trials=lambda w: stats_tables("trials"),
        theory=lambda w: theory_tables(),
    output:
        comparisons=f"{RESULTS}/stats/comparisons.parquet",
        summary=f"{RESULTS}/stats/summary.parquet",
        trials=f"{RESULTS}/stats/trials.parquet",
        theory=f"{RESULTS}/theory/theory.parquet",
    log:
        f"{RESULTS}/logs/gather.log",
    conda:
        "../../environment.yml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    shell:
        "(kvasym stage gather --inputs {input.comparisons:q} --out {output.comparisons:q}"
        " --holm q_log10_p t_wilcoxon_log10_p t_mw_log10_p q_ks_log10_p energy_log10_p"
        " && kvasym stage gather --inputs {input.summary:q} --out {output.summary:q}"
        " && kvasym stage gather --inputs {input.trials:q} --out {output.trials:q}"
        " && kvasym stage gather --inputs {input.theory:q} --out {output.theory:q}) > {log:q} 2>&1"
