"""Cost of the full-precision forward pass at long context, and the model's passkey accuracy.

Issue 31 (points 4 and 5) asks for windows of 1K to 8K tokens and passkey retrieval at those
lengths; this script measures what they cost and whether SmolLM2-135M can do the task at all,
so the paper config can be chosen within the end-to-end stage's budget (~30 CPU-minutes).

Forward pass (``forward`` section)
    Each (threads, length) measure runs in its own process with ``OPENBLAS_NUM_THREADS`` and
    ``OMP_NUM_THREADS`` set to the thread count (set before numpy loads). The process loads the
    model, builds the passkey trial of that length at depth 0.5 (trial 0) and runs one
    teacher-forced pass over it (:func:`kvasym.real.passkey.answer_logits`: the full forward
    pass plus five logit rows). It prints the pass's CPU time (user + system of the process,
    all BLAS threads), its wall time, the peak of numpy's traced allocations during the pass
    (``tracemalloc``: numpy reports its buffers to it) and the process's peak RSS (which
    includes loading the model, ~0.9 GB) — and whether the trial was answered.

Passkey accuracy (``passkey`` section)
    One process (1 BLAS thread) runs ``--trials`` trials per (length, depth) at the depths
    ``--depths`` and prints one line per trial and the accuracy per cell.

Run ``python3 benchmarks/bench_long_context.py`` (``--help`` for the options); on a shared
2-core machine the timings scatter with the load, which the script prints.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

DEFAULT_LENGTHS = (1024, 2048, 4096, 8192)
BASE_SEED = 11


def _usage() -> tuple[float, float]:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024.0


def child_forward(length: int, threads: int) -> dict:
    """One timed teacher-forced pass of the length-``length`` passkey trial (depth 0.5, trial 0)."""
    import tracemalloc

    from kvasym.real.gguf_model import GGUFLlama
    from kvasym.real.passkey import answer_logits, make_trial, score_answer

    model = GGUFLlama.load()
    trial = make_trial(model, length, 0.5, 0, base_seed=BASE_SEED)
    _, rss_loaded = _usage()
    tracemalloc.start()
    cpu0, wall0 = _usage()[0], time.perf_counter()
    logits = answer_logits(model, trial)
    cpu1, wall1 = _usage()[0], time.perf_counter()
    _, traced_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    score = score_answer(logits, trial.answer_ids)
    return {"length": length, "threads": threads, "tokens": int(trial.scored_ids.size),
            "cpu_s": cpu1 - cpu0, "wall_s": wall1 - wall0, "traced_peak_mb": traced_peak / 2**20,
            "rss_after_load_mb": rss_loaded, "peak_rss_mb": _usage()[1], "passkey_correct": score.correct,
            "key": trial.key, "greedy": "".join(model.decode(score.greedy_ids))}


def run_forward(lengths: list[int], threads: list[int], once: set[int]) -> list[dict]:
    """Every (threads, length) measure in its own process (lengths in ``once``: first thread count only)."""
    rows = []
    for count in threads:
        for length in lengths:
            if length in once and count != threads[0]:
                continue
            env = dict(os.environ, OPENBLAS_NUM_THREADS=str(count), OMP_NUM_THREADS=str(count))
            done = subprocess.run([sys.executable, __file__, "--child-forward", str(length), "--child-threads",
                                   str(count)], env=env, capture_output=True, text=True)
            if done.returncode:
                print(f"forward L={length} threads={count} FAILED:\n{done.stderr}", flush=True)
                continue
            row = json.loads(done.stdout.strip().splitlines()[-1])
            row["load"] = os.getloadavg()[0]
            rows.append(row)
            print(f"forward L={length:5d} threads={count}: cpu {row['cpu_s']:7.1f} s  wall {row['wall_s']:7.1f} s  "
                  f"traced peak {row['traced_peak_mb']:6.0f} MB  peak RSS {row['peak_rss_mb']:6.0f} MB "
                  f"(after load {row['rss_after_load_mb']:.0f})  "
                  f"passkey {'right' if row['passkey_correct'] else 'WRONG'} ({row['key']} -> {row['greedy']!r})  "
                  f"load {row['load']:.2f}", flush=True)
    return rows


def run_passkey(plan: dict[int, int], depths: list[float]) -> list[dict]:
    """``plan[length]`` trials per depth at each length, full precision; one line per trial."""
    from kvasym.real.gguf_model import GGUFLlama
    from kvasym.real.passkey import make_trial, run_trial

    model = GGUFLlama.load()
    rows = []
    for length, trials in plan.items():
        for depth in depths:
            for index in range(trials):
                trial = make_trial(model, length, depth, index, base_seed=BASE_SEED)
                cpu0 = _usage()[0]
                score = run_trial(model, trial)
                rows.append({"length": length, "depth": depth, "trial": index, "key": trial.key,
                             "correct": score.correct, "prefix": score.n_correct_prefix,
                             "greedy": model.decode(score.greedy_ids), "cpu_s": _usage()[0] - cpu0})
                r = rows[-1]
                print(f"passkey L={length:5d} depth={depth:.2f} trial={index}: key {r['key']} greedy "
                      f"{r['greedy']!r} {'right' if r['correct'] else 'wrong'} (prefix {r['prefix']}) "
                      f"cpu {r['cpu_s']:.1f} s", flush=True)
    print("\npasskey accuracy (full precision), right/trials per (length, depth):")
    for length in plan:
        cells = []
        for depth in depths:
            hit = [r["correct"] for r in rows if r["length"] == length and r["depth"] == depth]
            if hit:
                cells.append(f"{depth:.2f}: {sum(hit)}/{len(hit)}")
        print(f"  L={length:5d}  " + "  ".join(cells))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=list(DEFAULT_LENGTHS))
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--once", type=int, nargs="*", default=[8192],
                        help="lengths measured at the first thread count only (default 8192)")
    parser.add_argument("--trials", default="1024:5,2048:5,4096:1",
                        help="passkey trials per depth, length:count,... (empty: no passkey section)")
    parser.add_argument("--depths", type=float, nargs="+", default=[0.0, 0.25, 0.5, 0.75, 1.0])
    parser.add_argument("--skip-forward", action="store_true")
    parser.add_argument("--json", help="write every row to this file")
    parser.add_argument("--child-forward", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--child-threads", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_forward:
        print(json.dumps(child_forward(args.child_forward, args.child_threads)))
        return 0
    print(f"load average {os.getloadavg()}, {os.cpu_count()} CPUs", flush=True)
    out: dict = {"forward": [], "passkey": []}
    if not args.skip_forward:
        out["forward"] = run_forward(args.lengths, args.threads, set(args.once))
    plan = {int(k): int(v) for k, v in (p.split(":") for p in args.trials.split(",") if p)}
    if plan:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        out["passkey"] = run_passkey(plan, args.depths)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
