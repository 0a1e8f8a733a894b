# Stage 8: the run as a Workflow Run RO-Crate (kvasym.render.crate): every file the run wrote,
# with its SHA-256 and its artifact, one action per job, each claim linked to the files it was
# computed from. Its root is the checkout, so its metadata file stands there.


rule crate:
    input:
        claims=rules.claims.output.json,
        # what the run leaves, the statistics' per-cell parts (what a claim decided in one cell
        # was computed from) and the other files the run wrote beyond its targets
        files=[RUN_OUTPUTS, wiring.crate_parts()],
    output:
        pattern("crate"),
    log:
        log_path("crate"),
    localrule: True
    threads: 1
    resources:
        **resources_of("crate"),
    params:
        **stage_params("crate", slice=wiring.param("crate")),
        code=STAGE_CODE["crate"],  # reruns the job when the code it runs changes
    shell:
        "kvasym stage crate {params.args} > {log:q} 2>&1"
