# kvasym: every number, figure and table of the study, regenerated from one DAG.
# The maths lives in the kvasym library (src/kvasym); rules only name inputs, outputs, params,
# logs and resources and call `kvasym stage ...`. See README.md and config/README.md.
from snakemake.utils import min_version

min_version("9.0")


# The paper's grid, unless --configfile names the config: a config file given on the command
# line is the whole config (keys it leaves out take the schema's documented defaults, not the
# paper's values); --config KEY=VALUE overrides apply on top of either.
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"


wildcard_constraints:
    distribution=NAME,
    scheme=NAME,
    dim=r"\d+",
    budget=r"\d+",


include: "workflow/rules/cells.smk"
include: "workflow/rules/real.smk"
include: "workflow/rules/files.smk"
include: "workflow/rules/stats.smk"
include: "workflow/rules/frontier.smk"
include: "workflow/rules/seqlen.smk"
include: "workflow/rules/claims.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/paper.smk"


# What a run leaves: its RO-Crate (rule crate, last) lists every file of these.
RUN_OUTPUTS = [
    wiring.data_manifests(),
    wiring.metrics_tables(),
    list(rules.gather.output),
    list(rules.claims.output),
    wiring.frontier_targets(),
    wiring.seq_len_targets(),
    wiring.e2e_targets(),
    wiring.card_targets(),
    wiring.greedy_targets(),
    list(wiring.figure_outputs().values()),
    wiring.paper_targets(),
]


include: "workflow/rules/crate.smk"


rule all:
    default_target: True
    input:
        RUN_OUTPUTS,
        rules.crate.output,
