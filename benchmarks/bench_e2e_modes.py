"""End-to-end passes of SmolLM2-135M with a full-precision window, causal chunks and query-aware keys.

What it runs (:mod:`kvasym.real.endtoend`)
    On one evaluation text (default ``bakery_morning``, first 512 tokens), every layer's cache
    quantized, RoPE ``post``, own position exact, draw 0: RKV, QRKV, QWF (bases calibrated on the
    12 shipped texts outside the query-aware benchmark's evaluation texts,
    :func:`kvasym.real.querybases.calibrate`), SKLT and SKLT+C128 (causal chunks of 128 rows),
    KIVI128, KIVI128+C128 and KIVI128+R128 (full-precision window of 128 tokens), and, for
    the cost only, KIVI128+C32, at budgets ``n`` = 2 and 4.

What it prints
    Per pass: CPU seconds of the all-layer pass (``resource.getrusage``, self; the least of
    ``--repeats`` runs, since other processes on a shared machine only ever add to it; the
    plain pass, no layer quantized, beside it), the mean next-token KL (nats), the perplexity ratio
    ``exp(mean nll - mean nll_ref)`` and the measured bits per value of K and V (payload + side,
    full-precision rows included: :func:`kvasym.real.endtoend.add_full_precision_rows`).
    Every scheme's numba kernels are compiled on a 24-token pass first, out of the timings.

Measured (bakery_morning, 512 tokens, draw 0; a 2-core machine shared with other work, load 2-4,
so the CPU times are the least of 5 interleaved runs at n = 2): plain pass 2.2 CPU-s; RKV 2.4,
KIVI128 2.6, KIVI128+R32 2.9, KIVI128+R128 3.7, KIVI128+C128 3.4, KIVI128+C32 4.3 (16 chunks
quantized per head and layer), SKLT 3.4, SKLT+C128 6.1, QWF 2.8 (calibration 33-70 CPU-s).
Mean KL (nats) / PPL ratio / K, V bits per value at n = 2: RKV 0.882 / 2.466 / 2.50, 2.50;
QRKV 0.918 / 2.500; QWF 0.520 / 1.699 / 2.63, 2.50; SKLT 0.626 / 1.825 / 4.63, 4.63;
SKLT+C128 0.223 / 1.219 / 11.0, 11.0 (a float16 64 x 64 basis per 128-row chunk: 8 bits per
value); KIVI128 0.995 / 2.775 / 2.25, 2.50; KIVI128+C128 0.234 / 1.273 / 2.25, 2.50;
KIVI128+R128 0.165 / 1.171 / 5.69, 5.88. At n = 4: RKV 0.041 / 1.036, QRKV 0.040 / 1.055,
QWF 0.029 / 1.024, SKLT 0.232 / 1.179, SKLT+C128 0.033 / 1.016, KIVI128 0.017 / 1.034,
KIVI128+C128 0.0040 / 1.007, KIVI128+R128 0.0031 / 1.003.

Run ``python3 benchmarks/bench_e2e_modes.py`` (``--help``); ~3-5 CPU-minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import resource

import numpy as np

QUERY_BENCH_EVALUATION = ("bakery_morning", "bicycle_repair", "river_walk", "town_library")
PASSES = (  # (scheme or query variant, recent_tokens, causal_chunk, budgets)
    ("RKV", 0, 0, (2, 4)), ("QRKV", 0, 0, (2, 4)), ("QWF", 0, 0, (2, 4)), ("SKLT", 0, 0, (2, 4)),
    ("SKLT", 0, 128, (2, 4)), ("KIVI128", 0, 0, (2, 4)), ("KIVI128", 0, 128, (2, 4)), ("KIVI128", 128, 0, (2, 4)),
    ("KIVI128", 0, 32, (2,)),
)
BASE_SEED = 11


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", default="bakery_morning")
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3, help="runs per pass; the least CPU time is printed")
    args = parser.parse_args()

    from kvasym.real.endtoend import CacheQuantization, next_token_metrics, reference_pass, run_layers
    from kvasym.real.gguf_model import GGUFLlama
    from kvasym.real.queryaware import VARIANTS, calibrate, default_calibration_texts, text_token_ids, variant_scheme
    from kvasym.schemes import get_scheme

    model = GGUFLlama.load()
    names = default_calibration_texts(QUERY_BENCH_EVALUATION)
    start = _cpu()
    bases = calibrate(model, text_token_ids(model, names, args.tokens))
    print(f"calibration on {len(names)} texts x {args.tokens} tokens: {_cpu() - start:.1f} CPU-s")
    ids = text_token_ids(model, [args.text], args.tokens)[args.text]

    def quant(name: str, budget: int, recent: int, chunk: int) -> CacheQuantization:
        if name in VARIANTS:
            return CacheQuantization(variant_scheme(name), budget, BASE_SEED, args.text, recent_tokens=recent,
                                     causal_chunk=chunk, query_variant=name, query_bases=bases)
        return CacheQuantization(get_scheme(name), budget, BASE_SEED, args.text, recent_tokens=recent,
                                 causal_chunk=chunk)

    warm = reference_pass(model, ids[:24])
    for name, recent, chunk, budgets in PASSES:  # compile the kernels outside the timings
        run_layers(model, warm.frame, warm.residuals[0], 0, quant(name, budgets[0], recent, min(chunk, 8)))
    ref = reference_pass(model, ids)

    def timed(q: CacheQuantization | None, bits: list[dict[str, float]] | None = None) -> tuple[np.ndarray, float]:
        best = np.inf
        for _ in range(args.repeats):
            if bits is not None:
                bits.clear()  # one run's bits
            start = _cpu()
            hidden = run_layers(model, ref.frame, ref.residuals[0], 0, q, bits)
            best = min(best, _cpu() - start)
        return hidden, best

    print(f"{ids.size} tokens of {args.text}; plain all-layer pass {timed(None)[1]:.1f} CPU-s")
    print(f"{'pass':14s} {'n':>2s} {'CPU-s':>6s} {'mean KL':>9s} {'PPL ratio':>9s} {'K bits':>7s} {'V bits':>7s}")
    for name, recent, chunk, budgets in PASSES:
        for budget in budgets:
            q = quant(name, budget, recent, chunk)
            bits: list[dict[str, float]] = []
            hidden, seconds = timed(q, bits)
            measured = next_token_metrics(model, ref, hidden)
            ratio = float(np.exp(measured["nll"].mean() - ref.nll.mean()))
            k_bits, v_bits = (float(np.mean([b[f"{s}_bits_payload"] + b[f"{s}_bits_side"] for b in bits]))
                              for s in ("k", "v"))
            print(f"{q.name:14s} {budget:2d} {seconds:6.1f} {measured['kl'].mean():9.4f} {ratio:9.4f} "
                  f"{k_bits:7.3f} {v_bits:7.3f}", flush=True)


if __name__ == "__main__":
    main()
