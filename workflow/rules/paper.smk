# Stage 7: LaTeX tables and macros from the gathered tables (jinja2), then the paper PDF.
# The PDF rule is part of the default target only when latexmk and pdflatex are installed;
# otherwise every generated source is still written and one line says what to install.


rule tables:
    input:
        # with real-model rows: the real caches' statistics and the synthetic data manifests
        unpack(real_table_inputs),
        summary=rules.gather.output.summary,
        comparisons=rules.gather.output.comparisons,
        theory=rules.gather.output.theory,
        claims=rules.claims.output.json,
    output:
        [f"{GENERATED}/table_{name}.tex" for name in TABLES],
    log:
        f"{RESULTS}/logs/tables.log",
    conda:
        "../../environment.yml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    params:
        headline=lambda w: canonical_json(HEADLINE),
        real=real_table_flags,
        out_dir=out_dir,
    shell:
        "python -m kvasym.tables tables --summary {input.summary:q} --comparisons {input.comparisons:q}"
        " --theory {input.theory:q} --claims {input.claims:q} {params.real} --headline {params.headline:q}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"


rule numbers:
    input:
        STUDY.claims_file,
    output:
        f"{GENERATED}/numbers.tex",
    log:
        f"{RESULTS}/logs/numbers.log",
    conda:
        "../../environment.yml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    params:
        slice=lambda w: canonical_json(
            numbers_slice(STUDY, HEADLINE, load_claims(STUDY.claims_file))
        ),
        out_dir=out_dir,
    shell:
        "python -m kvasym.tables numbers --slice {params.slice:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"


rule paper:
    input:
        main="paper/main.tex",
        sections=sorted(str(p) for p in Path("paper/sections").glob("*.tex")),
        tables=rules.tables.output,
        numbers=rules.numbers.output,
        claims=rules.claims.output.tex,
        figures=[path for path in figure_outputs().values() if path.endswith(".pdf")],
    output:
        "paper/build/main.pdf",
    log:
        f"{RESULTS}/logs/paper.log",
    conda:
        "../../environment.yml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    shell:
        "latexmk -pdf -interaction=nonstopmode -halt-on-error -outdir=build -cd {input.main:q} > {log:q} 2>&1"
