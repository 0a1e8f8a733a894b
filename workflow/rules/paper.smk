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
        **stage_params(
            "tables",
            headline=wiring.param("headline"),
            schemes=wiring.param("schemes"),
            out_dir=out_dir,
        ),
        code=STAGE_CODE["tables"],  # reruns the job when the code it runs changes
    shell:
        "kvasym stage tables {params.args} > {log:q} 2>&1"


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
        **stage_params("numbers", slice=wiring.param("numbers"), out_dir=out_dir),
        code=STAGE_CODE["numbers"],  # reruns the job when the code it runs changes
    shell:
        "kvasym stage numbers {params.args} > {log:q} 2>&1"


rule reproduce:
    input:
        # after every job whose benchmark: file it sums (the ledger, the tables, the figures)
        rules.claims.output.json,
        rules.tables.output,
        [path for path in wiring.figure_outputs().values() if path.endswith(".pdf")],
        # the claims files (their hashes and amendments) and the forward-pass check it prints
        wiring.claims_files,
        wiring.reproduce_forward,
        captures=wiring.reproduce_captures,
    output:
        pattern("reproduce"),
    log:
        log_path("reproduce"),
    localrule: True
    threads: 1
    resources:
        **resources_of("reproduce"),
    params:
        **stage_params(
            "reproduce",
            slice=wiring.param("reproduce"),
            benchmarks=BENCHMARKS_FOLDER,
            logs=LOGS_FOLDER,
        ),
        code=STAGE_CODE["reproduce"],  # reruns the job when the code it runs changes
    shell:
        "kvasym stage reproduce {params.args} > {log:q} 2>&1"


rule paper:
    input:
        # the paper's sources and generated parts; the stage is given its main file
        "paper/layout.tex",
        sorted(str(p) for p in Path("paper/sections").glob("*.tex")),
        "paper/references.bib",
        rules.tables.output,
        rules.numbers.output,
        rules.claims.output.tex,
        rules.reproduce.output,
        [
            path
            for path in wiring.figure_outputs().values()
            if path.endswith((".pdf", ".caption.tex"))
        ],
        main="paper/main.tex",
    output:
        pattern("paper_pdf"),
    log:
        log_path("paper"),
    localrule: True
    threads: 1
    resources:
        **resources_of("paper"),
    params:
        **stage_params("paper"),
        code=STAGE_CODE["paper"],  # reruns the job when the code it runs changes
    shell:
        "kvasym stage paper {params.args} > {log:q} 2>&1"
