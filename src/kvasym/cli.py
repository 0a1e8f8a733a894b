"""The ``kvasym`` command line: codebooks, quantizing your own caches, evaluating them.

Every failure the user can cause (a wrong shape, NaN, an unknown scheme, a bad file) exits with
status 2 and one line ``kvasym: error: ...`` on stderr naming the problem; a failure of the
machine (full disk, unwritable output folder) exits with status 1 and one such line naming the
file; tracebacks are for bugs only.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from . import __version__
from .atomic import atomic_target
from .errors import DamagedFile, KvasymError

EXIT_BAD_INPUT = 2
#: The environment failed us (disk full, permission denied on an output): not the input's fault.
EXIT_ENVIRONMENT = 1
_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK"


def _load_matrix(path: str, what: str) -> np.ndarray:
    """Load a 2-D float matrix from .npy (or a single-array .npz), with clear errors."""
    from .cache import check_matrix

    p = Path(path)
    if p.is_dir():
        raise KvasymError(f"{what} file {path} is a directory, not a .npy/.npz file")
    if not p.is_file():
        if p.is_symlink():  # is_file() is False for a link whose target is missing or loops
            raise KvasymError(f"{what} file {path} is a symbolic link that leads to no file ({_link_problem(p)})")
        raise KvasymError(f"{what} file {path}: no such file")
    try:
        with p.open("rb") as fh:
            magic = fh.read(6)
    except OSError as exc:
        raise KvasymError(f"{what} file {path} cannot be read ({exc.strerror})") from None
    # Without this, numpy calls any non-.npy file (CSV, text, torch) "pickled (object) data".
    if not (magic.startswith(_NPY_MAGIC) or magic.startswith(_ZIP_MAGIC)):  # PK: any zip, even empty
        raise KvasymError(
            f"{what} file {path} is not a readable .npy/.npz array: it starts with {magic!r}, not NumPy's "
            "format (save it with numpy.save)"
        )
    try:
        loaded = np.load(p, allow_pickle=False)
        if isinstance(loaded, np.lib.npyio.NpzFile):
            with loaded:
                if len(loaded.files) != 1:
                    raise KvasymError(f"{what} file {path} is an .npz with {len(loaded.files)} arrays; give one array")
                # members are decompressed (and CRC-checked) only here, so this read is inside the try
                loaded = loaded[loaded.files[0]]
    except KvasymError:
        raise
    except Exception as exc:  # noqa: BLE001 - zipfile/zlib/numpy raise many types for a corrupt file
        raise KvasymError(f"{what} file {path} is not a readable .npy/.npz array "
                          f"({type(exc).__name__}: {exc})") from None
    return check_matrix(loaded, f"{what} ({path})")


def _save_npy_atomic(path: str, array: np.ndarray) -> None:
    with atomic_target(path) as tmp, open(tmp, "wb") as fh:  # a file object: np.save adds no suffix
        np.save(fh, array)


def _int_in(name: str, low: int, high: int, shown: str) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high], the message naming the flag's range."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer in {shown}, got {value!r}") from None
        if not low <= number <= high:
            raise argparse.ArgumentTypeError(f"{name} must be an integer in {shown}, got {number}")
        return number

    return parse


_budget = _int_in("bits", 1, 8, "1..8")
_seed = _int_in("seed", 0, 2**63 - 1, "0..2^63-1")
_threads = _int_in("threads", 1, 1024, "1..1024")


def _sharpness(value: str) -> float:
    """The logit multiplier: finite and in (0, 1e6), the range the study's config accepts."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"sharpness must be a number, got {value!r}") from None
    if not 0 < number < 1e6:  # also False for nan
        raise argparse.ArgumentTypeError(f"sharpness must be a finite number in (0, 1e6), got {value}")
    return number


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


def _link_problem(path: Path) -> str:
    """Why a symbolic link leads nowhere: a loop, or a missing target."""
    try:
        os.stat(path)
    except OSError as exc:
        return "a loop of links" if exc.errno == errno.ELOOP else f"its target: {exc.strerror}"
    return "its target is not a regular file"


def _resolved(path: str, what: str) -> Path:
    """``Path(path).resolve()``, or one line naming the path when its links loop (Python 3.11
    raises RuntimeError there, 3.13 OSError)."""
    try:
        return Path(path).resolve()
    except (OSError, RuntimeError):
        raise KvasymError(f"{what} {path} is a symbolic link that leads to no file (a loop of links)") from None


def _not_the_input(output: str, input_: str) -> None:
    """Refuse an output that is the input file (the atomic write would replace what was read) or
    that names a folder ("out/": Path() would drop the slash and write a file named "out")."""
    if output.endswith(("/", os.sep)):
        raise KvasymError(f"the output {output} names a folder (ends with /), not a file")
    out, inp = Path(output), Path(input_)
    same = (_resolved(output, "the output") == _resolved(input_, "the input")
            or (out.exists() and inp.exists() and os.path.samefile(out, inp)))
    if same:
        raise KvasymError(f"the output {output} is the input {input_}: it would be overwritten; give another path")


def cmd_quantize(args: argparse.Namespace) -> int:
    from .cache import quantize, save_packed
    from .seeds import derived_seed

    _not_the_input(args.output, args.input)
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
        kernel=args.kernel,
        threads=args.threads,
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

    _not_the_input(args.output, args.input)
    caches = load_packed(args.input)
    if len(caches) != 1:
        raise KvasymError(f"{args.input} holds {len(caches)} caches ({', '.join(caches)}); expected one")
    (cache,) = caches.values()
    _save_npy_atomic(args.output, cache.dequantize(args.dtype, kernel=args.kernel, threads=args.threads))
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from .evaluate import evaluate_cache

    scheme = _scheme(args)
    matrices = [flag for flag in ("keys", "values", "queries") if getattr(args, flag) is not None]
    if args.cache is not None:
        if matrices:
            raise KvasymError(f"give --cache or --keys/--values/--queries, not both (got --cache and --{matrices[0]})")
        return _evaluate_cache_file(args, scheme)
    if len(matrices) != 3:
        missing = sorted({"keys", "values", "queries"} - set(matrices))
        raise KvasymError(f"give --cache FILE, or all of --keys, --values, --queries "
                          f"(missing --{', --'.join(missing)})")
    if args.n_queries is not None:
        raise KvasymError("--n-queries applies only to a --cache file without q (its queries are drawn); "
                          "with --queries the queries are yours")
    keys = _load_matrix(args.keys, "keys")
    values = _load_matrix(args.values, "values")
    queries = _load_matrix(args.queries, "queries")
    summary = evaluate_cache(
        keys,
        values,
        queries,
        scheme,
        args.bits,
        sharpness=1.0 if args.sharpness is None else args.sharpness,
        seed=args.seed,
        norm_dtype=args.norm_dtype,
        causal=bool(args.causal),
    )
    if args.json:
        print(json.dumps(summary, indent=1, sort_keys=True))
    else:
        width = max(len(k) for k in summary)
        for key, value in summary.items():
            shown = f"{value:.6g}" if isinstance(value, float) else str(value)
            print(f"{key:<{width}}  {shown}")
    return 0


def _evaluate_cache_file(args: argparse.Namespace, scheme) -> int:
    """``kvasym evaluate --cache``: every (layer, KV head) of a dumped cache, then all of them."""
    import pandas as pd

    from .cachefile import describe, evaluate_cache_file, inspect_cache_file, load_cache_file

    layout = inspect_cache_file(args.cache)  # header errors before a large read
    if layout.n_query_heads is not None:
        # the file's own queries are the model's: its attention has sharpness 1 and its count
        for flag, value in (("--sharpness", args.sharpness), ("--n-queries", args.n_queries)):
            if value is not None:
                raise KvasymError(f"{flag} applies only to a cache file without q; {args.cache} has q (the model's "
                                  "own queries, read at sharpness 1)")
    cache = load_cache_file(args.cache)
    columns, trial_map = evaluate_cache_file(
        cache, scheme, args.bits, name=Path(args.cache).stem, base_seed=args.seed,
        n_queries=64 if args.n_queries is None else args.n_queries,
        sharpness=[1.0 if args.sharpness is None else args.sharpness], causal=args.causal is not False,
        norm_dtype=args.norm_dtype)
    frame = pd.DataFrame({key: columns[key] for key in ("trial", "kl", "recall_top5", "t_eps_dir")})
    heads = pd.DataFrame(trial_map).set_index("trial")

    def summary(part: pd.DataFrame) -> dict[str, float | int]:
        return {"n_queries": int(len(part)), "kl_mean": float(part["kl"].mean()),
                "kl_p99": float(part["kl"].quantile(0.99)), "kl_max": float(part["kl"].max()),
                "recall_top5_mean": float(part["recall_top5"].mean()),
                "t_eps_dir_mean": float(part["t_eps_dir"].mean())}

    rows = [{"layer": int(heads.loc[t, "layer"]), "kv_head": int(heads.loc[t, "kv_head"]), **summary(part)}
            for t, part in frame.groupby("trial", sort=True)]
    overall = summary(frame)
    bits = {key: float(columns[key][0]) for key in columns if "_bits_" in key}
    if args.json:
        print(json.dumps({"file": args.cache, "scheme": scheme.name, "budget": args.bits, "layout": layout.__dict__,
                          "bits": bits, "heads": rows, "overall": overall}, indent=1, sort_keys=True))
        return 0
    print(f"{args.cache}: {describe(layout)}")
    print(f"{scheme.name} at n={args.bits}: K {bits['k_bits_payload']:.4g}+{bits['k_bits_side']:.4g}, "
          f"V {bits['v_bits_payload']:.4g}+{bits['v_bits_side']:.4g} bits/coordinate (payload+side)")
    names = ["kl_mean", "kl_p99", "kl_max", "recall_top5_mean", "t_eps_dir_mean"]
    print(f"{'layer':>5} {'kv_head':>7} " + " ".join(f"{n:>16}" for n in names))
    for row in [*rows, {"layer": "all", "kv_head": "", **overall}]:
        print(f"{row['layer']!s:>5} {row['kv_head']!s:>7} " + " ".join(f"{row[n]:>16.6g}" for n in names))
    return 0


def _scheme(args: argparse.Namespace):
    from .schemes import get_scheme

    scheme = get_scheme(args.scheme, _user_schemes(args.schemes))
    scheme.validate_budget(args.bits)
    return scheme


def cmd_capture(args: argparse.Namespace) -> int:
    from .real.capture import run_from_args

    run_from_args(args)
    return 0


def cmd_card(args: argparse.Namespace) -> int:
    from .real.card_cli import run

    return run(args)


def build_parser(stage_name: str | None = None) -> argparse.ArgumentParser:
    """The command line. Of the ``kvasym stage`` subcommands only ``stage_name`` (all when None,
    none when "") imports its module and declares its flags: a data or metrics job must not pay for the
    figure stage's pandas and matplotlib imports. With a ``stage_name``, ``capture`` is listed
    without its flags (a stage job does not import :mod:`kvasym.real.capture` for them)."""
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
        q.add_argument("--seed", type=_seed, default=0, help="base seed for the rotation and QJL draws")
        q.add_argument("--norm-dtype", default="float32", choices=["float16", "float32"])

    def compute(q: argparse.ArgumentParser) -> None:
        q.add_argument("--kernel", default="numpy", choices=["numpy", "numba"],
                       help="numpy: the reference passes (default); numba: the fused compiled row pass, "
                       "faster per coordinate after a one-off ~0.5-1 s to load its compiled code (kvasym.kernels)")
        q.add_argument("--threads", type=_threads, default=1, help="threads over rows for --kernel numba (default 1)")

    p = sub.add_parser("quantize", help="quantize rows of a .npy matrix into a packed .npz cache")
    common(p)
    compute(p)
    p.add_argument("--side", required=True, choices=["K", "V"])
    p.add_argument("input")
    p.add_argument("output")
    p.set_defaults(func=cmd_quantize)

    p = sub.add_parser("dequantize", help="reconstruct a .npy matrix from a packed .npz cache")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    compute(p)
    p.add_argument("input")
    p.add_argument("output")
    p.set_defaults(func=cmd_dequantize)

    p = sub.add_parser(
        "evaluate",
        help="attention metrics of one scheme on your own cache: --cache FILE, or --keys/--values/--queries matrices",
        description="Either --cache FILE (every layer and KV head of a dumped cache, layout in "
        "kvasym.cachefile / config/README.md) or the three 2-D matrices --keys, --values, --queries.",
    )
    common(p)
    p.add_argument("--cache",
                   help="a cache file (.npz/.safetensors/.npy): k, v, optional q, layers, kv_head_of_query_head")
    p.add_argument("--keys", help="(n_keys, d) .npy matrix (without --cache)")
    p.add_argument("--values", help="(n_keys, d_v) .npy matrix (without --cache)")
    p.add_argument("--queries", help="(n_queries, d) .npy matrix (without --cache)")
    p.add_argument("--sharpness", type=_sharpness, default=None,
                   help="logit multiplier (default 1 = plain q.k/sqrt(d)); with --cache, only for the drawn queries "
                        "of a file without q")
    p.add_argument("--n-queries", type=_int_in("n-queries", 1, 100_000, "1..100000"), default=None,
                   help="with --cache and no q in the file: queries drawn per KV head (the keys-family rule, "
                        "default 64)")
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=None,
                   help="query i attends keys 0..i+(n_keys-n_queries) (default: on with --cache, off with matrices)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("capture", help="capture real K, V and queries from SmolLM2-135M (needs the real-model extra)")
    if not stage_name:  # a stage job never parses these: it does not import the capture module for them
        from .real.capture import add_arguments as capture_arguments  # numpy only: the model loads lazily

        capture_arguments(p)
    p.set_defaults(func=cmd_capture)

    p = sub.add_parser("card", help="the KV-cache card of a LLaMA-family GGUF model: cache statistics, K/V "
                       "sensitivity per layer, measured bit allocation, frontier, recommendation (real-model extra)")
    if not stage_name:
        from .real.card_cli import add_arguments as card_arguments

        card_arguments(p)
    p.set_defaults(func=cmd_card)

    from .stages import add_stage_parsers

    stage = sub.add_parser("stage",
                           help="run one stage of the study's DAG (what the Snakemake rule of that name calls)")
    add_stage_parsers(stage.add_subparsers(dest="stage", required=True), only=stage_name)
    return parser


def _say(line: str) -> None:
    """One line on stderr, best effort: on a full disk even the job's log may refuse it."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass


#: The job log's closing line that :func:`_cost_line` writes after ``kvasym: stage <stage> done: ``;
#: its readers (the reproduce section's cost table, ``benchmarks/makespan.py``,
#: ``benchmarks/run_cost.py``) match it with this pattern: stage, CPU seconds, peak RSS in MiB.
COST_LINE = re.compile(r"^kvasym: stage (?P<stage>\S+) done: cpu_s=(?P<cpu>[0-9.]+) max_rss_mib=(?P<rss>[0-9]+)$",
                       re.MULTILINE)


def _cost_line() -> str:
    """This process's cost so far, for the job's log: CPU seconds of the process and of the
    children it waited for (user + system), and the peak resident set in MiB. Summed over the
    logs of a run (``benchmarks/run_cost.py``) they give CPU per rule; Snakemake's ``benchmark:``
    files sample the process tree and miss short jobs' CPU."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
    peak_mib = max(own.ru_maxrss, children.ru_maxrss) / 1024  # Linux: kibibytes
    return f"cpu_s={cpu:.2f} max_rss_mib={peak_mib:.0f}"


def main(argv: Sequence[str] | None = None) -> int:
    tokens = sys.argv[1:] if argv is None else list(argv)
    from .stages import STAGES

    stage_name = tokens[1] if len(tokens) > 1 and tokens[0] == "stage" and tokens[1] in STAGES else None
    parser = build_parser(stage_name or "")  # "": list the stages without importing any
    args = parser.parse_args(tokens)
    if sys.stdout is None:
        # a closed standard output (`>&-`): the printed results would vanish with exit 0
        _say("kvasym: error: standard output is closed; the results would be lost")
        return EXIT_ENVIRONMENT
    if args.command == "stage":
        # Snakemake sends a stage's stderr to its log file. Writing a first line now gives the
        # log its first disk block while there may still be room, so that an error line later
        # (e.g. "No space left on device") still fits: otherwise a full disk shows an empty log.
        # and says the BLAS threads it runs with: every DAG job runs one (workflow/rules/common.smk)
        blas = " ".join(f"{v}={os.environ.get(v, 'unset')}" for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"))
        _say(f"kvasym {__version__} stage {args.stage} ({blas})")
    try:
        status = int(args.func(args) or 0)
        if args.command == "stage" and status == 0:
            _say(f"kvasym: stage {args.stage} done: {_cost_line()}")
        return status
    except DamagedFile as exc:
        if args.command == "stage":
            from .stages import move_aside_damaged

            _say(f"kvasym: error: {exc}; {move_aside_damaged(args, exc.path)}")
        else:
            _say(f"kvasym: error: {exc}")
        return EXIT_BAD_INPUT
    except KvasymError as exc:
        _say(f"kvasym: error: {exc}")
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        return 1
    except OSError as exc:
        # A full disk, an unwritable output folder, a vanished input: one line naming the file
        # (when the OS says which), not a traceback. pyarrow's OSErrors carry no filename.
        where = f"{exc.filename}: " if exc.filename else ""
        reason = exc.strerror if exc.filename and exc.strerror else str(exc)
        if isinstance(exc, FileExistsError) and not os.path.isdir(exc.filename):
            reason = "exists and is not a directory"  # mkdir's own "File exists" hides the point
        _say(f"kvasym: error: {where}{reason}")
        return EXIT_ENVIRONMENT


if __name__ == "__main__":
    sys.exit(main())
