# kvasym: the study's DAG (stages are added under workflow/rules/).
from snakemake.utils import min_version

min_version("9.0")


rule all:
    default_target: True
    run:
        print("kvasym: the DAG stages come next (see the issues); the library is in src/kvasym.")
