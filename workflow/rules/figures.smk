# Stage 6: the figures of the paper, one rule (one job) per figure family of
# kvasym.render.figures.registry.FIGURE_FAMILIES (wiring.figure_families: the real-model heat map only
# when the DAG has real-model rows). Each reads only its inputs (gathered tables, or the metrics
# files and data manifests of its facet cells, or the real rows' per-query files) and writes
# results/figures/<name>.{pdf,png}; the PNGs go into the Snakemake report with the captions of
# workflow/report/figures/.

for _family, _names in wiring.figure_families.items():

    rule:
        name:
            f"figure_{_family}"
        input:
            # what the family reads (the stage is given the files inside unit folders: raw below)
            list(wiring.figure_rule_inputs(_family).values()),
        output:
            [path("figure", name=name, format="pdf") for name in _names],
            [path("figure", name=name, format="caption.tex") for name in _names],
            [
                report(
                    path("figure", name=name, format="png"),
                    caption=f"../report/figures/{_family}.rst",
                    category="6. Figures",
                    subcategory=FIGURE_REGISTRY[_family].report_group,
                    labels={"figure": name, "cell": wiring.figure_label(_family)},
                )
                for name in _names
            ],
        log:
            log_path("figure", family=_family),
        benchmark:
            benchmark_path("figure", family=_family)
        localrule: True
        threads: 1
        resources:
            **resources_of("figure"),
        params:
            **stage_params(
                "figure",
                raw=wiring.figure_flags(_family),
                family=_family,
                slice=wiring.param("figures"),
                out_dir=out_dir,
            ),
            code=FIGURE_CODE[_family],  # reruns the job when the code it runs (its own family's) changes
            # its input flags with each metrics file's cell digest (kvasym.stages.figure.LISTINGS)
        shell:
            "kvasym stage figure {params.args} > {log:q} 2>&1"
