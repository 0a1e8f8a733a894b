"""How much of the queries' energy the query-aware bases hold, early and late in a long window.

The bases of rule calibrate (kvasym.real.querybases) are fitted on post-RoPE queries of the first
512 positions of short texts. RoPE turns its slow pairs by angles that grow with the position, so
queries far into a long window can point where the calibration never saw them. This measures,
per layer and averaged over the KV heads, the share of the query second moment's energy in the
top 8 calibration directions, over positions 0-511 and 2048-4095 of the first 4K window of the
pydoc text (one window, the same text at both spans).

Measured at 976d205 (bases of the paper config: 12 shipped texts x 512 tokens):

    layer   0-511   2048-4095
    0       0.700   0.296
    10      0.687   0.321
    20      0.703   0.474
    29      0.736   0.475

so late queries put half or less of their energy where QWF spends its bits, which is where QWF's
4-bit damage grows 12.5x from the first 512 positions to the second half of 4K windows
(results/real/e2e/long_summary.parquet). Usage:

    python3 benchmarks/bench_queryaware_positions.py --bases results/real/e2e/query_bases/smollm2-135m.npz
"""

import argparse

import numpy as np

from kvasym.real.gguf_model import GGUFLlama
from kvasym.real.longtext import long_text_ids, windows
from kvasym.real.querybases import load_query_bases

LAYERS = (0, 10, 20, 29)
SPANS = {"0-511": slice(0, 512), "2048-4095": slice(2048, 4096)}
TOP = 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bases", required=True, help="the query-bases file (rule calibrate)")
    args = parser.parse_args()
    model = GGUFLlama.load()
    c = model.config
    bases = load_query_bases(args.bases, model.model_sha256, (len(model.layers), c.n_kv_heads, c.head_dim))
    ids = windows(long_text_ids(model), 4096, c.context_length, 1)[0][0]
    frame = model.sequence_frame(ids)
    x = model.embed(frame.ids)
    print("layer  " + "  ".join(f"{name:>9}" for name in SPANS))
    for layer in range(len(model.layers)):
        acts = model.attention_inputs(layer, x, frame)
        if layer in LAYERS:
            q = acts.q.reshape(c.n_kv_heads, c.group, len(ids), c.head_dim)
            row = []
            for span in SPANS.values():
                shares = []
                for head in range(c.n_kv_heads):
                    rows = q[head, :, span].reshape(-1, c.head_dim)
                    moment = rows.T @ rows / len(rows)
                    basis = bases.bases[layer, head]
                    energy = np.einsum("ji,jk,ki->i", basis, moment, basis)  # u_i^T M u_i
                    shares.append(energy[:TOP].sum() / energy.sum())
                row.append(float(np.mean(shares)))
            print(f"{layer:5d}  " + "  ".join(f"{v:9.3f}" for v in row))
        x = model.finish_layer(layer, x, model.attention(acts.q, acts.k, acts.v, frame.at(layer)))


if __name__ == "__main__":
    main()
