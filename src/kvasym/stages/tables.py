"""Stage ``tables`` (rule ``tables``): the paper's LaTeX tables from the gathered tables.

Writes ``<out_dir>/table_<name>.tex`` for every table of :data:`kvasym.render.tables.TABLES`
(:func:`kvasym.render.tables.render_tables`) at the study's headline cell.
"""

from __future__ import annotations

import argparse

from ..artifacts import add_input_arguments
from ..render.tables import (
    PER_MODEL_INPUT_KEYS,
    TABLES,
    render_tables,
)


#: The stage's inputs: argument -> artifact (kvasym.artifacts). Only the first four are given in
#: every DAG; each table reads the optional ones of its part of the study.
INPUTS = {"summary": "summary", "comparisons": "comparisons", "theory": "theory", "claims": "claims_json",
          "real_cachestats": "real_cachestats", "data_manifests": "data",
          "e2e_summary": "e2e_summary", "e2e_sensitivity": "e2e_sensitivity", "frontier_points": "frontier_points",
          "seq_len_summary": "seq_len_summary", "seq_len_slopes": "seq_len_slopes",
          "e2e_equal_bits": "e2e_equal_bits", "e2e_long_summary": "e2e_long_summary",
          "e2e_long_comparisons": "e2e_long_comparisons", "passkey_summary": "passkey_summary",
          "card_summary": "card_summary", "card_comparisons": "card_comparisons", "card_allocation": "card_allocation",
          "e2e_greedy_summary": "e2e_greedy_summary"}
#: Inputs given once per model (each model's own file), stacked with a ``model`` column: the
#: renderer's list, so that the flag's nargs and the reading agree.
PER_MODEL = PER_MODEL_INPUT_KEYS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_input_arguments(parser, INPUTS, many=("data_manifests", *PER_MODEL),
                        notes={"real_cachestats": "table_real", "data_manifests": "table_real, the synthetic "
                               "distributions at the headline dim", "e2e_summary": "table_e2e, table_bands, table_kl",
                               "e2e_sensitivity": "table_e2e", "frontier_points": "table_frontier",
                               "seq_len_summary": "table_seq_len", "seq_len_slopes": "table_seq_len",
                               "e2e_equal_bits": "table_model", "e2e_long_summary": "table_model",
                               "e2e_long_comparisons": "table_model",
                               "passkey_summary": "table_model", "card_summary": "table_card",
                               "card_comparisons": "table_card", "card_allocation": "table_card",
                               "e2e_greedy_summary": "table_greedy, one per model"})
    parser.add_argument("--published-bands", dest="published_bands",
                        help="the published small-model bands (config/published_bands.yaml; table_bands)")
    parser.add_argument("--headline", required=True,
                        help='the headline cell as JSON, e.g. {"distribution": "gaussian", "dim": 128, '
                        '"sharpness": 2.0, "budget": 4}')
    parser.add_argument("--schemes", help='every scheme the DAG runs as JSON, [{"name": ..., "description": ...}] '
                        "(the schemes table; kvasym.study.Study.scheme_definitions)")
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--table", action="append", choices=list(TABLES), help="only this table (repeatable)")


def parse_schemes(text: str) -> list[dict[str, str]]:
    """``--schemes``: a JSON list of ``{"name": str, "description": str}``, or a KvasymError naming
    the flag and the offending entry."""
    import json

    from ..errors import KvasymError

    try:
        data = json.loads(text)
    except ValueError as exc:
        raise KvasymError(f"--schemes is not valid JSON ({exc})") from None
    if not isinstance(data, list):
        raise KvasymError("--schemes must be a JSON list of {name, description}")
    for i, entry in enumerate(data):
        if (not isinstance(entry, dict) or set(entry) != {"name", "description"}
                or not all(isinstance(v, str) for v in entry.values())):
            raise KvasymError(f"--schemes entry {i}: expected {{name, description}} strings, got {entry!r}")
    return data


def run(args: argparse.Namespace) -> None:
    from ._slice import parse_slice

    inputs = {k: getattr(args, k) for k in (*INPUTS, "published_bands") if getattr(args, k)}
    schemes = parse_schemes(args.schemes) if args.schemes else None
    for path in render_tables(inputs, parse_slice(args.headline), args.out_dir, args.table, schemes=schemes):
        print(path)
