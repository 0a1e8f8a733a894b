"""Stage ``numbers`` (rule ``numbers``): ``numbers.tex``, a macro for every number the prose quotes.

The slice (:func:`kvasym.render.numbers.numbers_slice`) is everything the macros depend on: a
Snakemake param, so a change of grid, headline, claims file or commit rewrites them.
"""

from __future__ import annotations

import argparse

from ..render.numbers import numbers_slice, render_numbers


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--slice", help="numbers_slice JSON (what the DAG passes as params)")
    source.add_argument("--config", help="a config YAML: the slice is computed from it and its claims file")
    parser.add_argument("--commit", help="with --config: the commit to print (default: the checkout's, via git)")
    parser.add_argument("--out-dir", required=True)


def run(args: argparse.Namespace) -> None:
    from ..claims import load_claims
    from ..study import load_study_file
    from ._slice import parse_slice

    if args.slice:
        slice_ = parse_slice(args.slice)
    else:
        study = load_study_file(args.config)
        slice_ = numbers_slice(study, study.headline, load_claims(study.claims_file, study.headline),
                               commit=args.commit)
    print(render_numbers(slice_, args.out_dir))
