# Stage 5: every claim of the paper evaluated from the gathered tables, with a verdict.


rule claims:
    input:
        # the end-to-end, frontier and sweep tables, when configured
        unpack(wiring.optional_inputs("claims")),
        claims=STUDY.claims_file,
        extended=wiring.claims_files[:-1],  # the claims files it extends (its key extends)
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
        code=STAGE_CODE["claims"],  # reruns the job when the code it runs changes
        base_seed=STUDY.base_seed,
        n_boot=STUDY.stats["n_boot"],
        headline=wiring.param("headline"),
        # the query model of each low-rank distribution, named in the ledger's reasons
        query_variants=canonical_json(STUDY.query_variants),
        optional=flags_of(*wiring.optional_of("claims")),
    shell:
        "kvasym stage claims --claims {input.claims:q} --comparisons {input.comparisons:q}"
        " --summary {input.summary:q} --trials {input.trials:q} --theory {input.theory:q}"
        " --base-seed {params.base_seed} --n-boot {params.n_boot} --headline {params.headline:q}"
        " --query-variants {params.query_variants:q} {params.optional}"
        " --json {output.json:q} --md {output.md:q} --tex {output.tex:q} --html {output.html:q}"
        " > {log:q} 2>&1"
