"""The ``kvasym`` command line: codebooks, quantizing your own caches, evaluating them.

Every failure the user can cause (a wrong shape, NaN, an unknown scheme, a bad file) exits with
status 2 and one line ``kvasym: error: ...`` on stderr naming the problem; tracebacks are for
bugs only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from . import __version__
from .errors import KvasymError

EXIT_BAD_INPUT = 2


def _load_matrix(path: str, what: str) -> np.ndarray:
    """Load a 2-D float matrix from .npy (or a single-array .npz), with clear errors."""
    from .cache import check_matrix

    p = Path(path)
    if not p.is_file():
        raise KvasymError(f"{what} file {path}: no such file")
    try:
        loaded = np.load(p, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise KvasymError(f"{what} file {path} is not a readable .npy/.npz array ({exc})") from None
    if isinstance(loaded, np.lib.npyio.NpzFile):
        with loaded:
            if len(loaded.files) != 1:
                raise KvasymError(f"{what} file {path} is an .npz with {len(loaded.files)} arrays; give one array")
            loaded = loaded[loaded.files[0]]
    return check_matrix(loaded, f"{what} ({path})")


def _save_npy_atomic(path: str, array: np.ndarray) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            np.save(fh, array)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _budget(value: str) -> int:
    try:
        bits = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bits must be an integer in 1..8, got {value!r}") from None
    if not 1 <= bits <= 8:
        raise argparse.ArgumentTypeError(f"bits must be an integer in 1..8, got {bits}")
    return bits


def _user_schemes(path: str | None) -> dict | None:
    if path is None:
        return None
    from .config_io import read_yaml_mapping

    data = read_yaml_mapping(path)
    schemes = data.get("schemes", data)
    if not isinstance(schemes, dict):
        raise KvasymError(f"{path}: 'schemes' must be a mapping of scheme name -> spec")
    return schemes


def cmd_codebook(args: argparse.Namespace) -> int:
    from .codebook import lloyd_max_codebook, validate_dim_bits

    validate_dim_bits(args.dim, args.bits)
    book = lloyd_max_codebook(args.dim, args.bits)
    if args.json:
        print(json.dumps(book.to_json(), indent=1))
    else:
        print(f"Lloyd-Max codebook, unit-vector coordinates in d={book.dim}, {book.bits} bits")
        print(f"  per-vector MSE d*C = {book.mse_per_vector:.6g} (per coordinate {book.mse_per_coordinate:.6g})")
        print("  centroids: " + " ".join(f"{c:+.6g}" for c in book.centroids))
        print("  thresholds: " + " ".join(f"{t:+.6g}" for t in book.thresholds))
    return 0


def cmd_quantize(args: argparse.Namespace) -> int:
    from .cache import quantize, save_packed
    from .seeds import derived_seed

    scheme = _scheme(args)
    x = _load_matrix(args.input, "input")
    cache = quantize(
        x,
        scheme.side(args.side),
        args.bits,
        rotation_seed=derived_seed(args.seed, "rotation", args.side),
        qjl_seed=derived_seed(args.seed, "qjl", args.side),
        norm_dtype=args.norm_dtype,
        meta={"scheme": scheme.name, "side": args.side, "source": os.path.basename(args.input)},
    )
    save_packed(args.output, {args.side: cache})
    bits = cache.bits_per_coordinate()
    print(
        f"{args.output}: {cache.rows} x {cache.dim} {args.side} with {scheme.name} at n={args.bits}: "
        f"{bits['payload']:.4g} payload + {bits['side']:.4g} side = {bits['total']:.4g} bits/coordinate"
    )
    return 0


def cmd_dequantize(args: argparse.Namespace) -> int:
    from .cache import load_packed

    caches = load_packed(args.input)
    if len(caches) != 1:
        raise KvasymError(f"{args.input} holds {len(caches)} caches ({', '.join(caches)}); expected one")
    (cache,) = caches.values()
    _save_npy_atomic(args.output, cache.dequantize(args.dtype))
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from .evaluate import evaluate_cache

    scheme = _scheme(args)
    keys = _load_matrix(args.keys, "keys")
    values = _load_matrix(args.values, "values")
    queries = _load_matrix(args.queries, "queries")
    summary = evaluate_cache(
        keys,
        values,
        queries,
        scheme,
        args.bits,
        sharpness=args.sharpness,
        seed=args.seed,
        norm_dtype=args.norm_dtype,
        causal=args.causal,
    )
    if args.json:
        print(json.dumps(summary, indent=1, sort_keys=True))
    else:
        width = max(len(k) for k in summary)
        for key, value in summary.items():
            shown = f"{value:.6g}" if isinstance(value, float) else str(value)
            print(f"{key:<{width}}  {shown}")
    return 0


def _scheme(args: argparse.Namespace):
    from .schemes import get_scheme

    scheme = get_scheme(args.scheme, _user_schemes(args.schemes))
    scheme.validate_budget(args.bits)
    return scheme


def _stage_slice(args: argparse.Namespace, kind: str) -> dict:
    """The config slice of a stage: --slice JSON (from Snakemake), or --config plus the cell."""
    from .study import load_study_file, parse_slice

    if args.slice is not None:
        return parse_slice(args.slice)
    if args.config is None or args.distribution is None or args.dim is None:
        raise KvasymError("give --slice JSON, or --config FILE with --distribution and --dim")
    study = load_study_file(args.config)
    if kind == "data":
        return study.data_slice(args.distribution, args.dim)
    if kind == "stats":
        return study.stats_slice(args.distribution, args.dim)
    if kind == "theory":
        return study.theory_slice(args.distribution, args.dim)
    if args.scheme is None or args.budget is None:
        raise KvasymError(f"the {kind} stage needs --scheme and --budget with --config")
    if kind == "quantize":
        return study.cell_slice(args.distribution, args.dim, args.scheme, args.budget)
    return study.metrics_slice(args.distribution, args.dim, args.scheme, args.budget)


def cmd_stage(args: argparse.Namespace) -> int:
    from . import pipeline

    if args.stage == "claims":
        from .claims import run_claims

        tables = {"comparisons": args.comparisons, "summary": args.summary, "trials": args.trials, "theory": args.theory}
        results = run_claims(args.claims, tables, args.json, args.md, args.tex, base_seed=args.base_seed, n_boot=args.n_boot)
        for r in results:
            print(f"{r['id']:>5}  {r['verdict']:<14} {r.get('reason', '')}")
        return 0
    if args.stage == "gather":
        from .analysis import gather

        gather(args.inputs, args.out, args.holm or ())
        return 0
    slice_ = _stage_slice(args, args.stage)
    if args.stage in ("stats", "theory"):
        from . import analysis

        if args.stage == "stats":
            analysis.run_stats(slice_, args.per_query, args.comparisons, args.summary, args.trials)
        else:
            analysis.run_theory(slice_, args.data, args.per_key, args.out)
        return 0
    if args.stage == "data":
        pipeline.run_data(slice_, args.out)
    elif args.stage == "quantize":
        pipeline.run_quantize(slice_, args.data, args.out)
    else:
        pipeline.run_metrics(slice_, args.data, args.packed, args.per_query, args.per_key)
    return 0


def cmd_figures(args: argparse.Namespace) -> int:
    from .figures_stage import run_from_args

    for path in run_from_args(args):
        print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvasym", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"kvasym {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("codebook", help="Lloyd-Max codebook for unit-vector coordinates in dimension D")
    p.add_argument("--dim", type=int, required=True)
    p.add_argument("--bits", type=int, required=True)
    p.add_argument("--json", action="store_true", help="JSON with centroids, thresholds, mse (per vector)")
    p.set_defaults(func=cmd_codebook)

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--scheme", required=True, help="KV, KQV, QKQV, RKV or one from --schemes")
        q.add_argument("--bits", type=_budget, required=True, help="budget n, bits per coordinate (1..8)")
        q.add_argument("--schemes", help="YAML file with user-defined schemes (same form as config 'schemes')")
        q.add_argument("--seed", type=int, default=0, help="base seed for the rotation and QJL draws")
        q.add_argument("--norm-dtype", default="float32", choices=["float16", "float32"])

    p = sub.add_parser("quantize", help="quantize rows of a .npy matrix into a packed .npz cache")
    common(p)
    p.add_argument("--side", required=True, choices=["K", "V"])
    p.add_argument("input")
    p.add_argument("output")
    p.set_defaults(func=cmd_quantize)

    p = sub.add_parser("dequantize", help="reconstruct a .npy matrix from a packed .npz cache")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("input")
    p.add_argument("output")
    p.set_defaults(func=cmd_dequantize)

    p = sub.add_parser("evaluate", help="attention metrics of one scheme on your own K, V, queries")
    common(p)
    p.add_argument("--keys", required=True)
    p.add_argument("--values", required=True)
    p.add_argument("--queries", required=True)
    p.add_argument("--sharpness", type=float, default=1.0, help="logit multiplier (1 = plain q.k/sqrt(d))")
    p.add_argument("--causal", action="store_true", help="query i attends keys 0..i+(n_keys-n_queries)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_evaluate)

    stage = sub.add_parser("stage", help="run one stage of the study's DAG (what the Snakemake rules call)")
    stages = stage.add_subparsers(dest="stage", required=True)
    many = {"per_query_list", "per_key_list"}
    for name, outputs in (
        ("data", ("out",)),
        ("quantize", ("data", "out")),
        ("metrics", ("data", "packed", "per_query", "per_key")),
        ("stats", ("per_query_list", "comparisons", "summary", "trials")),
        ("theory", ("data", "per_key_list", "out")),
    ):
        q = stages.add_parser(name)
        q.add_argument("--slice", help="the stage's config slice as JSON (Snakemake passes it)")
        q.add_argument("--config", help="or: a config YAML, with the cell below")
        q.add_argument("--distribution")
        q.add_argument("--dim", type=int)
        if name in ("quantize", "metrics"):
            q.add_argument("--scheme")
            q.add_argument("--budget", type=int)
        for out in outputs:
            dest = out.removesuffix("_list")
            flag = f"--{dest.replace('_', '-')}"
            if out in many:
                q.add_argument(flag, dest=dest, required=True, nargs="+")
            else:
                q.add_argument(flag, dest=dest, required=True)
        q.set_defaults(func=cmd_stage)
    q = stages.add_parser("gather", help="concatenate tables, with Holm-adjusted log10 p columns")
    q.add_argument("--inputs", nargs="+", required=True)
    q.add_argument("--out", required=True)
    q.add_argument("--holm", nargs="*", help="log10-p columns to Holm-adjust per metric")
    q.set_defaults(func=cmd_stage)
    from .figures_stage import add_arguments as figure_arguments

    q = stages.add_parser("figures", help="draw every figure of the paper from the gathered tables")
    figure_arguments(q)
    q.set_defaults(func=cmd_figures)
    q = stages.add_parser("claims", help="evaluate the claims ledger from the gathered tables")
    for name in ("claims", "comparisons", "summary", "trials", "theory", "json", "md", "tex"):
        q.add_argument(f"--{name}", required=True)
    q.add_argument("--base-seed", type=int, default=0)
    q.add_argument("--n-boot", type=int, default=1000)
    q.set_defaults(func=cmd_stage)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KvasymError as exc:
        print(f"kvasym: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        return 1


if __name__ == "__main__":
    sys.exit(main())
