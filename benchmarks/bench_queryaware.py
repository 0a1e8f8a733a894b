"""Query-aware key quantization on SmolLM2-135M: calibration cost and query-weighted key error.

Calibration
    :func:`kvasym.real.querybases.calibrate` on every shipped text that is not an evaluation
    text (:func:`~kvasym.real.querybases.default_calibration_texts`), the first ``--tokens``
    tokens of each: the full-precision pass over each text, accumulating ``q q^T`` per (layer,
    KV head). Printed: CPU and wall seconds, the peak of numpy's traced allocations during
    calibration (``tracemalloc``) and the process's peak RSS (including the ~0.9 GB model).

Error
    On each evaluation text's own post-RoPE queries and keys (``GGUFLlama.forward``'s captured
    layers), per layer, KV head and budget ``n``, the keys are quantized by RKV, SKLT and,
    as references that separate the centring from the query basis, CRKV and CWF (QWF's side
    on the raw keys) (:func:`kvasym.evaluate.quantize_pair`, identity ``(text, layer, kv_head)``) and by QRKV and
    QWF (:func:`kvasym.real.queryaware.quantize_pair_query_aware`, same identity), and scored by
    the query-weighted error ``mean_{i,j} (q_i . (k_j - k_hat_j))^2`` over every query ``i`` of
    the KV head's group and every key ``j`` (all pairs, not only causal ones), divided by
    ``mean_{i,j} (q_i . k_j)^2`` (relative: the logits' own mean square). The table gives its
    mean over texts and KV heads. ``top8`` is the share of query energy along the 8 leading
    calibrated directions: of the calibration queries (``lam``) and of the evaluation queries
    (``trace(U_8^T M_eval U_8) / trace(M_eval)``: whether the basis transfers).

Measured (512 tokens, 12 calibration texts, 6,144 positions): calibration 24-32 CPU-s (12-22 s
wall on the loaded 2-core machine), 24 MB traced peak, 911 MB peak RSS with the model. The 8
leading directions hold 0.70-0.78 of the query energy, the same on the evaluation queries (the
basis transfers). QWF's error is 0.05-0.12x RKV's and 0.43-0.76x SKLT's at n = 2, 3, 4 in
layers 0, 10, 20, 29, with 0.625 key side bits per coordinate (RKV 0.502, SKLT 2.625); QRKV is
0.98-1.07x RKV (the WHT's error is near isotropic); CWF (QWF without the basis) is 3.1-8.2x QWF.

Run ``python3 benchmarks/bench_queryaware.py`` (``--help``); ~2-4 CPU-minutes on a loaded 2-core machine.
"""

from __future__ import annotations

import argparse
import resource
import time
import tracemalloc

import numpy as np

EVALUATION = ("bakery_morning", "bicycle_repair", "river_walk", "town_library")
LAYERS = (0, 10, 20, 29)
BUDGETS = (2, 3, 4)
SCHEMES = ("RKV", "SKLT", "QRKV", "QWF", "CRKV", "CWF")
#: CWF: QWF's key side on the raw keys (centre, water-filling, no transform): QWF without the
#: query basis, to tell the basis's share of the gain from the centring's and the allocation's.
CWF = {"K": {"transform": "none", "scalar_bits": "n", "qjl": False, "center": True, "allocation": "waterfill"},
       "V": {"rotate": True, "scalar_bits": "n", "qjl": False}}
BASE_SEED = 11


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _key_hat(name: str, keys: np.ndarray, values: np.ndarray, budget: int, bases, layer: int, kv: int,
             identity: tuple) -> tuple[np.ndarray, float]:
    """Reconstructed keys and their measured side bits per coordinate."""
    from kvasym.evaluate import dequantize_with, quantize_pair
    from kvasym.real.queryaware import VARIANTS, quantize_pair_query_aware
    from kvasym.schemes import get_scheme, scheme_from_dict

    scheme = scheme_from_dict("CWF", CWF) if name == "CWF" else get_scheme(name) if name not in VARIANTS else None
    if name in VARIANTS:
        k_hat, _, bits = quantize_pair_query_aware(keys, values, name, budget, bases, layer, kv, base_seed=BASE_SEED,
                                                   identity=identity)
        return k_hat, bits["k_bits_side"]
    packed = quantize_pair(keys, values, scheme, budget, base_seed=BASE_SEED, identity=identity,
                           kernel="auto")
    return dequantize_with(packed["K"], "auto"), packed["K"].bits_per_coordinate()["side"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tokens", type=int, default=512, help="tokens per text (default 512)")
    args = parser.parse_args()

    from kvasym.real.gguf_model import GGUFLlama
    from kvasym.real.querybases import calibrate, check_disjoint, default_calibration_texts, text_token_ids
    from kvasym.real.queryaware import query_weighted_error

    model = GGUFLlama.load()
    c = model.config
    names = default_calibration_texts(EVALUATION)
    check_disjoint(names, EVALUATION)
    calibration_ids = text_token_ids(model, names, args.tokens)
    tracemalloc.start()
    cpu0, wall0 = _cpu(), time.perf_counter()
    bases = calibrate(model, calibration_ids)
    cpu1, wall1 = _cpu(), time.perf_counter()
    traced = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"calibration: {len(names)} texts, {bases.n_positions} positions; {cpu1 - cpu0:.1f} CPU-s, "
          f"{wall1 - wall0:.1f} s wall; traced peak {traced:.0f} MB; peak RSS {rss:.0f} MB")
    print(f"calibration texts: {', '.join(names)}")

    rel: dict[tuple, list[float]] = {}
    side: dict[tuple, list[float]] = {}
    eval_share: dict[int, list[float]] = {}
    for text, ids in text_token_ids(model, EVALUATION, args.tokens).items():
        captured = model.forward(ids, capture_layers=LAYERS).layers
        for layer in LAYERS:
            acts = captured[layer]
            for kv in range(c.n_kv_heads):
                queries = acts.q[kv * c.group:(kv + 1) * c.group].reshape(-1, c.head_dim).astype(np.float64)
                keys = acts.k[kv].astype(np.float64)
                values = acts.v[kv].astype(np.float64)
                scale = query_weighted_error(queries, keys, np.zeros_like(keys))
                m_eval = queries.T @ queries / queries.shape[0]
                top = bases.bases[layer, kv][:, :8]
                eval_share.setdefault(layer, []).append(np.trace(top.T @ m_eval @ top) / np.trace(m_eval))
                for budget in BUDGETS:
                    for name in SCHEMES:
                        k_hat, bits = _key_hat(name, keys, values, budget, bases, layer, kv, (text, layer, kv))
                        rel.setdefault((layer, budget, name), []).append(
                            query_weighted_error(queries, keys, k_hat) / scale)
                        side.setdefault((budget, name), []).append(bits)
        print(f"  {text}: {ids.size} tokens done")

    share = bases.energy_share(8)
    print("\nrelative query-weighted key error, mean over 4 texts x 3 KV heads (x 1e-3)")
    print("| layer | top8 calib | top8 eval | n | " + " | ".join(SCHEMES) + " | QWF/RKV | QWF/SKLT |")
    print("|---|---|---|---|" + "---|" * (len(SCHEMES) + 2))
    for layer in LAYERS:
        for budget in BUDGETS:
            means = {name: float(np.mean(rel[(layer, budget, name)])) for name in SCHEMES}
            cells = " | ".join(f"{1e3 * means[name]:.3g}" for name in SCHEMES)
            print(f"| {layer} | {share[layer].mean():.3f} | {np.mean(eval_share[layer]):.3f} | {budget} | {cells} "
                  f"| {means['QWF'] / means['RKV']:.2f} | {means['QWF'] / means['SKLT']:.2f} |")
    print("\nmeasured key side bits per coordinate (T = %d; payload = n for all):" % args.tokens)
    for name in SCHEMES:
        print(f"  {name}: {np.mean(side[(BUDGETS[0], name)]):.4f}")


if __name__ == "__main__":
    main()
