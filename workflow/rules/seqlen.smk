# Stage 4c: the sequence-length sweep (kvasym.seqlen): attention damage against the number of keys
# at fixed sharpness, with the slope of log damage on log length. Only with seq_len_sweep.seq_lens.


rule seq_len_sweep:
    output:
        **{name: pattern(f"seq_len_{name}") for name in ("rows", "summary", "slopes")},
    log:
        log_path("seq_len_sweep"),
    benchmark:
        benchmark_path("seq_len_sweep")
    threads: 1
    resources:
        **resources_of("seq_len_sweep"),
    params:
        **stage_params("seq_len_sweep", slice=wiring.param("seq_len_sweep")),
        code=STAGE_CODE["seq_len_sweep"],  # reruns the job when the code it runs changes
    shell:
        "kvasym stage seq_len_sweep {params.args} > {log:q} 2>&1"
