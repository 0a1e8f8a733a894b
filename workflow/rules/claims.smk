# Stage 5: every claim of the paper evaluated from the gathered tables, with a verdict.


rule claims:
    input:
        wiring.claims_files[:-1],  # the claims files it extends (its key extends)
        # the end-to-end, frontier and sweep tables, when configured
        unpack(wiring.optional_inputs("claims")),
        claims=STUDY.claims_file,
        comparisons=rules.gather.output.comparisons,
        summary=rules.gather.output.summary,
        trials=rules.gather.output.trials,
        theory=rules.gather.output.theory,
    output:
        json=pattern("claims_json"),
        md=pattern("claims_md"),
        tex=pattern("claims_tex"),
        html=report(
            pattern("claims_html"),
            caption="../report/claims.rst",
            category="5. Claims",
            labels={"table": "claims ledger"},
        ),
    log:
        log_path("claims"),
    localrule: True
    threads: 1
    resources:
        **resources_of("claims"),
    params:
        **stage_params(
            "claims",
            base_seed=STUDY.base_seed,
            n_boot=STUDY.stats["n_boot"],
            headline=wiring.param("headline"),
            # the query model of each low-rank distribution, named in the ledger's reasons
            query_variants=wiring.param("query_variants"),
        ),
        code=STAGE_CODE["claims"],  # reruns the job when the code it runs changes
    shell:
        "kvasym stage claims {params.args} > {log:q} 2>&1"
