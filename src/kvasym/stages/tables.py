"""Stage ``tables`` (rule ``tables``): the paper's LaTeX tables from the gathered tables.

Writes ``<out_dir>/table_<name>.tex`` for every table of :data:`kvasym.render.tables.TABLES`
(:func:`kvasym.render.tables.render_tables`) at the study's headline cell.
"""

from __future__ import annotations

import argparse

from ..render.tables import (
    E2E_INPUT_KEYS,
    FRONTIER_INPUT_KEYS,
    INPUT_KEYS,
    REAL_INPUT_KEYS,
    SEQ_LEN_INPUT_KEYS,
    TABLES,
    render_tables,
)


#: Arguments naming files other rules write (moved aside when damaged: kvasym.stages).
INTERMEDIATE_INPUTS = (*INPUT_KEYS, *REAL_INPUT_KEYS, *E2E_INPUT_KEYS, *FRONTIER_INPUT_KEYS, *SEQ_LEN_INPUT_KEYS)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for key in INPUT_KEYS:
        parser.add_argument(f"--{key}", help=f"the {key} input")
    parser.add_argument("--real-cachestats", help="table_real: the real caches' statistics (stage real_cachestats)")
    parser.add_argument("--data-manifests", nargs="+", help="table_real: data manifests of the synthetic distributions")
    parser.add_argument("--e2e-summary", help="table_e2e: the end-to-end summary (stage e2e_stats)")
    parser.add_argument("--e2e-sensitivity", help="table_e2e: the end-to-end layer sensitivity (stage e2e_stats)")
    parser.add_argument("--frontier-points", help="table_frontier: the frontier's points (stage frontier)")
    parser.add_argument("--seq-len-summary", help="table_seq_len: the sweep's summary (stage seq_len_sweep)")
    parser.add_argument("--seq-len-slopes", help="table_seq_len: the sweep's slopes (stage seq_len_sweep)")
    parser.add_argument("--headline", required=True,
                        help='the headline cell as JSON, e.g. {"distribution": "gaussian", "dim": 128, '
                        '"sharpness": 2.0, "budget": 4}')
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--table", action="append", choices=list(TABLES), help="only this table (repeatable)")


def run(args: argparse.Namespace) -> None:
    from ..study import parse_slice

    inputs = {k: getattr(args, k) for k in INTERMEDIATE_INPUTS if getattr(args, k)}
    for path in render_tables(inputs, parse_slice(args.headline), args.out_dir, args.table):
        print(path)
