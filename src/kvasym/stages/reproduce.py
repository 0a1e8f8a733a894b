"""Stage ``reproduce`` (rule ``reproduce``): ``reproduce.tex``, the paper's "Reproducing this paper".

It runs after every job whose cost it reports (the rule's inputs are the claims ledger, the
tables and the figures) and reads, at build time, the git state, the package versions, the
machine, the ``benchmark:`` files and the jobs' logs' cost lines, the capture files' metadata
and the claims file's history
(:mod:`kvasym.render.reproduce`). Without git the amendment log is one line saying so.
"""

from __future__ import annotations

import argparse

from ..artifacts import add_input_arguments

#: The stage's inputs: argument -> artifact (kvasym.artifacts); a damaged one is moved aside.
INPUTS = {"captures": "captures"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--slice", required=True, help="reproduce_slice JSON (what the DAG passes as params)")
    parser.add_argument("--benchmarks", required=True, help="the folder of the benchmark: files (results/benchmarks)")
    parser.add_argument("--logs", help="the folder of the jobs' logs (results/logs), whose closing cost lines give "
                        "each job's CPU time; without it the benchmark files' sampled CPU time is printed")
    add_input_arguments(parser, INPUTS, many=INPUTS, notes={"captures": "their metadata"})
    parser.add_argument("--repo", default=".", help="the repository whose git state and history are printed")
    parser.add_argument("--out", required=True, help="the .tex file to write (paper/generated/reproduce.tex)")


def run(args: argparse.Namespace) -> None:
    from ..atomic import write_text_atomic
    from ..render.format import render_template
    from ..render.reproduce import reproduce_context
    from ._slice import parse_slice

    context = reproduce_context(parse_slice(args.slice), bench_dir=args.benchmarks, repo=args.repo,
                                captures=args.captures, log_dir=args.logs)
    write_text_atomic(render_template("reproduce.tex.j2", **context), args.out)
    print(args.out)
