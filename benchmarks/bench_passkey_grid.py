"""Cost and accuracy of a small passkey grid: full precision against RKV at n = 2 and 3 bits.

One process at 1 BLAS thread (set before numpy loads) runs
:func:`kvasym.real.passkey_grid.run_grid` at one length (default 1024 tokens), depths 0, 0.5
and 1, ``--trials`` trials each, under the passes ``fp``, ``RKV n=2`` and ``RKV n=3``
(every layer's cache quantized, keys after RoPE, own position exact), prints each pass's
per-trial CPU seconds (``time.process_time``, median and range) and
:func:`kvasym.real.passkey_grid.summarize_grid` (accuracy, Clopper-Pearson 95% interval,
McNemar's exact test against fp), and writes the rows to ``--out`` (CSV).

Measured (da815d9, 1024 tokens, base seed 11, depths 0/0.5/1 x 5 trials, shared 2-core machine)
    Per-trial CPU seconds, median (range): fp 3.38 (3.21-3.62), RKV n=2 3.60 (3.42-3.90, plus
    one first pass of 15.7 that built the codebook into an empty cache), RKV n=3 3.61
    (3.39-3.82): a quantized pass costs ~6.5% more than fp; the 45 passes took 172 CPU-s.
    Accuracy: fp 15/15, RKV n=3 15/15 (McNemar b = c = 0, p = 1), RKV n=2 3/15 (1/5 at each
    depth; b = 12, c = 0, exact p = 2^-11 = 4.9e-4; Clopper-Pearson 95% [0.043, 0.481]).

Run ``python3 benchmarks/bench_passkey_grid.py`` (``--help`` for the options). On a shared
2-core machine the timings scatter with the load.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

BASE_SEED = 11


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--depths", type=float, nargs="+", default=[0.0, 0.5, 1.0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--budgets", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--out", default="passkey_grid.csv")
    args = parser.parse_args()

    import pandas as pd

    from kvasym.real.endtoend import CacheQuantization
    from kvasym.real.gguf_model import GGUFLlama
    from kvasym.real.passkey_grid import run_grid, summarize_grid
    from kvasym.schemes import get_scheme

    model = GGUFLlama.load()
    rkv = get_scheme("RKV")
    passes = {"fp": None}
    passes.update({f"RKV n={n}": CacheQuantization(rkv, n, BASE_SEED, "passkey") for n in args.budgets})
    frame = run_grid(model, [args.length], args.depths, args.trials, passes, base_seed=BASE_SEED)
    frame.to_csv(args.out, index=False)
    cost = frame.groupby("pass", sort=False)["cpu_s"].describe()[["count", "50%", "min", "max"]]
    print(f"per-trial CPU seconds at {args.length} tokens (1 BLAS thread):\n{cost.to_string()}")
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(summarize_grid(frame).to_string(index=False))


if __name__ == "__main__":
    main()
