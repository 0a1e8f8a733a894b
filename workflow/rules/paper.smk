# Stage 7: LaTeX tables and macros from the gathered tables (jinja2), then the paper PDF.
# The PDF rule is part of the default target only when latexmk and pdflatex are installed;
# otherwise every generated source is still written and one line says what to install.


rule tables:
    input:
        # each optional part's inputs, when the DAG has that part (kvasym.artifacts)
        unpack(wiring.optional_inputs("tables")),
        # with real-model rows: the synthetic distributions' data manifests at the headline dim
        unpack(wiring.manifests_input),
        # with end-to-end passes: the published small-model bands our rows are placed against
        unpack(wiring.published_bands_input),
        summary=rules.gather.output.summary,
        comparisons=rules.gather.output.comparisons,
        theory=rules.gather.output.theory,
        claims=rules.claims.output.json,
    output:
        [path("table", name=name) for name in wiring.tables],
    log:
        log_path("tables"),
    localrule: True
    threads: 1
    resources:
        **resources_of("tables"),
    params:
        code=STAGE_CODE["tables"],  # reruns the job when the code it runs changes
        headline=wiring.param("headline"),
        schemes=wiring.param("schemes"),
        optional=flags_of(
            *wiring.optional_of("tables"), "data_manifests", "published_bands"
        ),
        out_dir=out_dir,
    shell:
        "kvasym stage tables --summary {input.summary:q} --comparisons {input.comparisons:q}"
        " --theory {input.theory:q} --claims {input.claims:q} {params.optional} --headline {params.headline:q}"
        " --schemes {params.schemes:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"


rule numbers:
    input:
        wiring.claims_files,
    output:
        pattern("numbers"),
    log:
        log_path("numbers"),
    localrule: True
    threads: 1
    resources:
        **resources_of("numbers"),
    params:
        code=STAGE_CODE["numbers"],  # reruns the job when the code it runs changes
        slice=wiring.param("numbers"),
        out_dir=out_dir,
    shell:
        "kvasym stage numbers --slice {params.slice:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"


rule reproduce:
    input:
        # after every job whose benchmark: file it sums (the ledger, the tables, the figures)
        claims=rules.claims.output.json,
        claims_file=STUDY.claims_file,
        extended=wiring.claims_files[:-1],  # the claims files it extends: their hashes and amendments
        tables=rules.tables.output,
        figures=[
            path for path in wiring.figure_outputs().values() if path.endswith(".pdf")
        ],
        captures=wiring.reproduce_captures,
        forward=wiring.reproduce_forward,
    output:
        pattern("reproduce"),
    log:
        log_path("reproduce"),
    localrule: True
    threads: 1
    resources:
        **resources_of("reproduce"),
    params:
        code=STAGE_CODE["reproduce"],  # reruns the job when the code it runs changes
        slice=wiring.param("reproduce"),
        captures=flags_of("captures"),
        benchmarks=BENCHMARKS_FOLDER,
    shell:
        "kvasym stage reproduce --slice {params.slice:q} --benchmarks {params.benchmarks:q}"
        " {params.captures} --out {output:q} > {log:q} 2>&1"


rule paper:
    input:
        main="paper/main.tex",
        layout="paper/layout.tex",
        sections=sorted(str(p) for p in Path("paper/sections").glob("*.tex")),
        bibliography="paper/references.bib",
        tables=rules.tables.output,
        numbers=rules.numbers.output,
        claims=rules.claims.output.tex,
        reproduce=rules.reproduce.output,
        figures=[
            path
            for path in wiring.figure_outputs().values()
            if path.endswith((".pdf", ".caption.tex"))
        ],
    output:
        pattern("paper_pdf"),
    log:
        log_path("paper"),
    localrule: True
    threads: 1
    resources:
        **resources_of("paper"),
    params:
        code=STAGE_CODE["paper"],  # reruns the job when the code it runs changes
    shell:
        "kvasym stage paper --main {input.main:q} > {log:q} 2>&1"
