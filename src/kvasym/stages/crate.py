"""Stage ``crate`` (rule ``crate``): the run as a Workflow Run RO-Crate, its metadata at the checkout's root.

It runs last (its inputs are the run's outputs and the statistics' per-cell parts), lists every
file of those outputs with its SHA-256 and its artifact, one action per job, and each claim of
the ledger with the files it was computed from (:mod:`kvasym.render.crate`). The git state and
the package versions are read when it runs, as the reproduce section reads them.
"""

from __future__ import annotations

import argparse

from ..artifacts import add_input_arguments

#: The stage's inputs: argument -> artifact (kvasym.artifacts); a damaged one is moved aside.
INPUTS = {"claims": "claims_json"}
#: The run's outputs it lists are the DAG's files too: one cut short after its job ended (refused by
#: kvasym.render.crate.check_complete) is moved aside when it lies in results/, so that the next
#: run rebuilds it instead of failing on it again (a file elsewhere, as the paper's, is left alone).
INTERMEDIATE_INPUTS = ("files",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--slice", required=True, help="crate_slice JSON (what the DAG passes as params)")
    add_input_arguments(parser, INPUTS, required=INPUTS, notes={"claims": "its claims become Claim entities"})
    parser.add_argument("--files", nargs="+", required=True,
                        help="the run's outputs: files, and folders whose files are all listed")
    parser.add_argument("--root", default=".", help="the crate's root: the checkout the DAG ran in")
    parser.add_argument("--out", required=True, help="the metadata file to write (at the crate's root)")


def run(args: argparse.Namespace) -> None:
    from ..render.crate import build_crate, collect_files, read_ledger, write_crate
    from ..render.reproduce import git_state, package_versions
    from ._slice import parse_slice

    slice_ = parse_slice(args.slice)
    ledger = read_ledger(args.claims)
    git = git_state(args.root)
    crate = build_crate(args.root, collect_files(args.root, [*args.files, args.claims]), ledger=ledger,
                        unit_writers=slice_["unit_writers"], inputs=slice_["inputs"],
                        config_sha256=slice_["config_sha256"], commit=git["commit"], clean=git["clean"],
                        packages=package_versions())
    write_crate(crate, args.out)
    print(args.out)
