"""Stage ``claims`` (rule ``claims``): every claim of the paper evaluated from the gathered tables.

Reads the claims file and the gathered comparisons, summary, trials and theory tables,
evaluates each claim (:func:`kvasym.claims.evaluate_claims`) and writes the ledger as JSON,
Markdown, HTML (the report) and LaTeX macros (:mod:`kvasym.render.claims`).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ..artifacts import add_input_arguments
from ..atomic import write_text_atomic
from ..claims import Tables, evaluate_claims, json_safe, load_claims
from ..render.claims import render_html, render_latex, render_markdown

TABLES = ("comparisons", "summary", "trials", "theory")
#: Tables only some DAGs have (the end-to-end passes of the real model; the frontier's
#: per-unit values, stage frontier; the sequence-length sweep's slopes, stage seq_len_sweep).
OPTIONAL_TABLES = ("e2e_comparisons", "e2e_equal_bits", "e2e_agreement", "e2e_long_summary", "passkey_summary",
                   "card_comparisons", "frontier_units", "seq_len_slopes")
#: The stage's inputs: argument -> artifact (kvasym.artifacts), one each but the card's
#: comparisons: one per model with a card (:data:`PER_MODEL`).
INPUTS = {name: name for name in TABLES + OPTIONAL_TABLES}
#: Tables given once per model (each model's own file), stacked with a ``model`` column.
PER_MODEL = ("card_comparisons",)


def run_claims(
    claims_path: str | os.PathLike,
    tables: Mapping[str, str | os.PathLike | Sequence[str | os.PathLike]],
    out_json: str | os.PathLike,
    out_md: str | os.PathLike,
    out_tex: str | os.PathLike,
    *,
    base_seed: int = 0,
    n_boot: int = 1000,
    out_html: str | os.PathLike | None = None,
    headline: Mapping[str, Any] | None = None,
    query_variants: Mapping[str, Mapping[str, str]] | None = None,
) -> list[dict[str, Any]]:
    """Evaluate the claims of ``claims_path`` on the gathered ``tables`` and write the ledger;
    ``query_variants`` (:attr:`kvasym.study.Study.query_variants`) names the query model of each
    low-rank distribution in the reasons. A :data:`PER_MODEL` table is given as its models'
    paths (:func:`read_per_model`)."""
    from ..dataset import read_parquet_checked

    claims = load_claims(claims_path, headline=headline)
    from ..real.models import read_per_model

    frames = {name: read_per_model([path] if isinstance(path, (str, os.PathLike)) else path)
              if name in PER_MODEL else read_parquet_checked(path)
              for name, path in tables.items() if path}
    results = evaluate_claims(claims, Tables(**frames, base_seed=base_seed, n_boot=n_boot,
                                             query_variants=dict(query_variants or {})))
    safe = json_safe(results)
    write_text_atomic(json.dumps(safe, indent=1) + "\n", out_json)
    write_text_atomic(render_markdown(safe), out_md)
    write_text_atomic(render_latex(safe), out_tex)
    if out_html is not None:
        write_text_atomic(render_html(safe), out_html)
    return results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--claims", required=True, help="the claims file (config/claims.yaml)")
    add_input_arguments(parser, INPUTS, required=TABLES, many=PER_MODEL)
    parser.add_argument("--headline", help="the study's headline cell as JSON (fills each claim's where)")
    for name in ("json", "md", "tex"):
        parser.add_argument(f"--{name}", required=True, help=f"the ledger as {name}")
    parser.add_argument("--html", help="also write the ledger as an HTML page (for the Snakemake report)")
    parser.add_argument("--base-seed", type=int, default=0)
    parser.add_argument("--n-boot", type=int, default=1000)
    parser.add_argument("--query-variants", dest="query_variants",
                        help='the query-model variants as JSON, {name: {"of": parent, "query": model}}')


def run(args: argparse.Namespace) -> None:
    from ._slice import parse_slice

    headline = parse_slice(args.headline) if args.headline else None
    tables = {name: getattr(args, name) for name in TABLES + OPTIONAL_TABLES}
    variants = parse_slice(args.query_variants) if args.query_variants else None
    results = run_claims(args.claims, tables, args.json, args.md, args.tex, base_seed=args.base_seed,
                         n_boot=args.n_boot, out_html=args.html, headline=headline, query_variants=variants)
    for r in results:
        print(f"{r['id']:>5}  {r['verdict']:<14} {r.get('reason', '')}")
