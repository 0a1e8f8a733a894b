"""The config schema: one source of the study config's keys, types, ranges, defaults and docs.

``workflow/schemas/config.schema.yaml`` (JSON Schema, draft 2020-12) is read three ways:

- the DAG's wiring (:class:`kvasym.wiring.Wiring`) validates the config with it and fills its defaults;
- :func:`validate_config` does the same for the library (:func:`kvasym.study.load_study` calls it
  first, so ``kvasym stage --config``, ``load_study_file`` and Snakemake apply the same checks and
  defaults), with one-line errors naming the key, e.g.
  ``config key distributions[2].params.nu: must be > 1, got 0.5``;
- :func:`render_docs` writes the key tables of ``config/README.md`` (between ``<!-- keys:begin -->``
  and ``<!-- keys:end -->``, and the ``kinds`` markers)::

      python3 -m kvasym.config_schema --write-docs config/README.md   # regenerate
      python3 -m kvasym.config_schema --check-docs config/README.md   # exit 1 if stale

Only what spans several keys (schemes realisable at every budget, ranks within every dim, unique
names, the headline cell in the grid) is left to :func:`kvasym.study.load_study`, and for the
``real`` section (checked alone by :func:`validate_key`) to :func:`kvasym.real.real_settings`.
The claims file's schema (``workflow/schemas/claims.schema.yaml``) is read and its errors worded
by the same functions (:func:`load_schema`, :func:`first_error`, :func:`format_error`), from
:func:`kvasym.claims.load_claims`.

Two differences from Snakemake's validator, both stricter: an ``integer`` is a Python int (not
``64.0``, which JSON Schema would accept but which would name folders ``d64.0``), and a
``number`` is finite (not ``nan`` or ``inf``). A config Snakemake accepts may therefore still be
rejected by the library, always with a message naming the key.
"""

from __future__ import annotations

import argparse
import copy
import math
import re
import sys
from collections.abc import Iterator, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from .errors import KvasymError

#: Where the schema lives in the repository.
SCHEMA_RELPATH = Path("workflow/schemas/config.schema.yaml")
#: The generated blocks of config/README.md: (name, what renders it).
DOC_BLOCKS = ("keys", "kinds")
_GENERATED = (
    "<!-- generated from workflow/schemas/config.schema.yaml by "
    "`python3 -m kvasym.config_schema --write-docs config/README.md`: edit the schema, not this table -->"
)


def schema_path(relpath: Path = SCHEMA_RELPATH) -> Path:
    """A schema file of the repository (by default the config's): next to the package's source
    tree (a checkout or an editable install), else under the working directory (a workflow run
    from the repository with a non-editable install).

    Parameters
    ----------
    relpath : Path
        The schema's path inside the repository, e.g. ``workflow/schemas/claims.schema.yaml``.

    Returns
    -------
    Path
        The first of the two candidates that exists.
    """
    candidates = [Path(__file__).resolve().parents[2] / relpath, Path.cwd() / relpath]
    for path in candidates:
        if path.is_file():
            return path
    looked = ", ".join(str(p) for p in candidates)
    raise KvasymError(
        f"schema {relpath.name} not found (looked for {looked}): run from the repository, "
        "or install it editable (pip install -e .)"
    )


@lru_cache(maxsize=None)
def _schema_at(path: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise KvasymError(f"schema {path} cannot be read ({' '.join(str(exc).split())})") from None
    if not isinstance(data, dict):
        raise KvasymError(f"schema {path} is not a mapping")
    return data


def load_schema(relpath: Path = SCHEMA_RELPATH) -> dict[str, Any]:
    """A schema of the repository (by default the config's).

    Parameters
    ----------
    relpath : Path
        The schema's path inside the repository, as in :func:`schema_path`.

    Returns
    -------
    dict
        The schema, a copy: callers may change it.
    """
    return copy.deepcopy(_schema_at(str(schema_path(relpath))))


# ---------------------------------------------------------------------------------------------
# validation


def _is_integer(_checker: Any, instance: Any) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


def _is_number(_checker: Any, instance: Any) -> bool:
    if isinstance(instance, bool) or not isinstance(instance, (int, float)):
        return False
    return isinstance(instance, int) or math.isfinite(instance)


def _validator(schema: Mapping[str, Any]) -> Any:
    """A validator of ``schema`` (the draft it declares) that fills ``default`` values as it goes,
    like ``snakemake.utils.validate(set_default=True)``, but with copies of the defaults and only
    into mappings."""
    from jsonschema import Draft202012Validator, validators

    base = validators.validator_for(schema, default=Draft202012Validator)
    check_properties = base.VALIDATORS["properties"]

    def properties(validator: Any, props: Mapping[str, Any], instance: Any, subschema: Any) -> Iterator[Any]:
        if validator.is_type(instance, "object"):
            for name, sub in props.items():
                if isinstance(sub, Mapping) and "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from check_properties(validator, props, instance, subschema)

    type_checker = base.TYPE_CHECKER.redefine_many({"integer": _is_integer, "number": _is_number})
    cls = validators.extend(base, {"properties": properties}, type_checker=type_checker)
    return cls(schema)


def first_error(instance: Any, schema: Mapping[str, Any]) -> Any:
    """The first error of ``instance`` under ``schema``, checked with this module's types (an
    ``integer`` is an int, a ``number`` is finite).

    Parameters
    ----------
    instance : Any
        The document (YAML as loaded); ``schema``'s defaults are filled into it in place.
    schema : Mapping
        A JSON Schema (the draft it declares, else 2020-12).

    Returns
    -------
    jsonschema.ValidationError or None
        The first error (:func:`format_error` words it), None if ``instance`` is valid.
    """
    return next(iter(_validator(schema).iter_errors(instance)), None)


def validate_config(config: Any, schema: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``config`` checked against the schema, as a new dict with every default filled in
    (recursively). Raises :class:`KvasymError` with one line naming the first offending key."""
    if not isinstance(config, Mapping):
        raise KvasymError(f"the config must be a mapping, got {_short(config)}")
    instance = copy.deepcopy(dict(config))
    error = first_error(instance, schema or _schema_at(str(schema_path())))
    if error is not None:
        raise KvasymError(format_error(error))
    return instance


def validate_key(key: str, value: Any, schema: Mapping[str, Any] | None = None) -> Any:
    """``value`` checked as the config's key ``key`` (dotted, e.g. ``real`` or ``real.e2e``), as a
    copy with its defaults filled in: the schema's checks of one section for a caller that gets
    the section alone (:func:`kvasym.real.real_settings`). Errors are :func:`validate_config`'s,
    naming the key as in the whole config.

    Parameters
    ----------
    key : str
        The key's path of mapping keys from the config's top level.
    value : Any
        What the config gives for it.
    schema : Mapping, optional
        The config schema (default: the repository's).

    Returns
    -------
    Any
        ``value`` with the defaults of its sub-keys filled in.
    """
    root = schema or _schema_at(str(schema_path()))
    parts = key.split(".")
    # the whole schema's other keywords ($defs, $schema) are kept for references; its top-level
    # keys other than the section's first part are dropped, and nothing is required
    wrapper = {k: v for k, v in root.items() if k not in ("properties", "required", "additionalProperties")}
    wrapper["properties"] = {parts[0]: root["properties"][parts[0]]}
    instance: Any = copy.deepcopy(value)
    for part in reversed(parts):
        instance = {part: instance}
    error = first_error(instance, wrapper)
    if error is not None:
        raise KvasymError(format_error(error))
    for part in parts:
        instance = instance[part]
    return instance


def defaults(schema: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The defaults the schema fills into a config that gives no optional key (nested mappings
    such as ``stats`` filled key by key)."""
    instance: dict[str, Any] = {}
    for _ in _validator(schema or _schema_at(str(schema_path()))).iter_errors(instance):
        pass  # only `required` fails on an empty config; every default is filled regardless
    return instance


def key_path(parts: Any) -> str:
    """``distributions[2].params.nu`` from a jsonschema error path."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _number(value: Any) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() and abs(value) < 1e15 else str(value)


def bounds(schema: Mapping[str, Any]) -> str:
    """``in 3..16384``, ``>= 0``, ``> 0 and < 1000000``: the range of a numeric schema ("" if none)."""
    lo, hi = schema.get("minimum"), schema.get("maximum")
    if lo is not None and hi is not None:
        return f"in {_number(lo)}..{_number(hi)}"
    parts = []
    for keyword, op in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<")):
        if keyword in schema:
            parts.append(f"{op} {_number(schema[keyword])}")
    return " and ".join(parts)


_TYPE_WORDS = {
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "array": "a list",
    "object": "a mapping",
    "boolean": "true or false",
    "null": "null",
}


def format_error(error: Any, noun: str = "config key", whole: str = "the config") -> str:
    """One line for a jsonschema ``ValidationError``: the key path, the rule, the value given.

    Parameters
    ----------
    error : jsonschema.ValidationError
        The error (:func:`first_error`).
    noun : str
        What a key of the document is called: ``config key distributions[2].params.nu: ...``,
        ``unknown config key(s): ...``.
    whole : str
        What the document is called when the error is at its top level.

    Returns
    -------
    str
        The message. An ``x-rule`` annotation of the failing schema says what the value must be
        (``{enum}`` in it is the schema's ``enum``); a failed ``pattern`` that is one character
        class (``^[...]*$``) also names the first character outside it.
    """
    where = key_path(error.absolute_path)
    key = f"{noun} {where}" if where else whole
    instance, value, sub = error.instance, error.validator_value, error.schema
    kind = error.validator
    if kind == "additionalProperties" and isinstance(instance, Mapping):
        allowed = sorted((sub.get("properties") or {}))
        extra = sorted(str(k) for k in instance if k not in allowed)
        names = ", ".join(f"{where}.{k}" if where else k for k in extra)
        return f"unknown {noun}(s): {names}; allowed: {', '.join(allowed) or 'none'}"
    if kind == "required" and isinstance(instance, Mapping):
        missing = ", ".join(str(k) for k in value if k not in instance)
        return f"{key}: missing required key(s): {missing}" if where else f"{key} is missing required key(s): {missing}"
    got = _short(instance)
    if kind == "pattern" and isinstance(instance, str):
        got += _outside_class(str(value), instance)
    if isinstance(sub, Mapping) and "x-rule" in sub:
        rule = str(sub["x-rule"]).replace("{enum}", ", ".join(_plain(v) for v in sub.get("enum", ())))
        return f"{key}: must be {rule}, got {got}"
    if kind == "type":
        names = [value] if isinstance(value, str) else list(value)
        words = " or ".join(_TYPE_WORDS.get(n, n) for n in names)
        if isinstance(instance, float) and not math.isfinite(instance):
            words = words.replace("a number", "a finite number")
        return f"{key}: must be {words}, got {got}"
    if kind in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        return f"{key}: must be {bounds(sub)}, got {got}"
    if kind == "enum":
        return f"{key}: must be one of {', '.join(_plain(v) for v in value)}, got {got}"
    if kind == "const":
        return f"{key}: must be {_plain(value)}, got {got}"
    if kind == "uniqueItems":
        return f"{key}: has duplicates: {got}"
    if kind == "minItems":
        need = "a non-empty list" if value == 1 else f"a list of at least {value} items"
        return f"{key}: must be {need}, got {got}"
    if kind == "pattern":
        return f"{key}: must match {value}, got {got}"
    return f"{key}: {' '.join(str(error.message).split())}"


def _outside_class(pattern: str, text: str) -> str:
    """``: the character 'é' (U+00E9) at position 2`` for a ``pattern`` of one character class
    repeated (``^[ -~]*$``): a long text's value is cut short in the message, and the character
    the rule refuses may not be in what is shown. "" for any other pattern."""
    match = re.fullmatch(r"\^(\[.+\])\*\$", pattern)
    if match is None:
        return ""
    allowed = re.compile(match.group(1))
    at = next((i for i, c in enumerate(text) if not allowed.fullmatch(c)), None)
    return "" if at is None else f": the character {text[at]!r} (U+{ord(text[at]):04X}) at position {at}"


def _plain(value: Any) -> str:
    """A value as YAML would spell it in a flow: ``float32``, ``true``, ``null``, ``[1.0]``, ``{}``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_plain(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_plain(v)}" for k, v in value.items()) + "}"
    return str(value)


# ---------------------------------------------------------------------------------------------
# documentation


def _resolve(sub: Mapping[str, Any], root: Mapping[str, Any]) -> dict[str, Any]:
    """``sub`` with a local ``$ref`` (``#/$defs/...``) merged in (its own keywords win)."""
    ref = sub.get("$ref")
    if not isinstance(ref, str):
        return dict(sub)
    if not ref.startswith("#/"):
        raise KvasymError(f"config schema: only local $ref are supported, got {ref!r}")
    target: Any = root
    for part in ref[2:].split("/"):
        target = target[part]
    return {**_resolve(target, root), **{k: v for k, v in sub.items() if k != "$ref"}}


def _is_kind_branches(sub: Mapping[str, Any]) -> bool:
    return isinstance(sub.get("allOf"), list) and all(
        isinstance(b, Mapping) and "if" in b and "then" in b for b in sub["allOf"]
    )


def key_rows(schema: Mapping[str, Any] | None = None) -> Iterator[tuple[str, dict[str, Any], bool]]:
    """(key path, its schema, required?) for every key of the config, in schema order. Paths:
    ``stats.n_boot``, ``distributions[].name``, ``user_schemes.<name>.K.rotate``. The kinds'
    ``params`` are :func:`kind_rows`."""
    root = schema or _schema_at(str(schema_path()))
    yield from _rows(root, root, "")


def _rows(obj: Mapping[str, Any], root: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, dict[str, Any], bool]]:
    required = set(obj.get("required", ()))
    for name, raw in (obj.get("properties") or {}).items():
        sub = _resolve(raw, root)
        key = f"{prefix}.{name}" if prefix else name
        yield key, sub, name in required
        yield from _children(sub, root, key)


def _children(sub: Mapping[str, Any], root: Mapping[str, Any], key: str) -> Iterator[tuple[str, dict[str, Any], bool]]:
    if "properties" in sub:
        yield from _rows(sub, root, key)
    extra = sub.get("additionalProperties")
    if isinstance(extra, Mapping):
        child = _resolve(extra, root)
        yield f"{key}.<name>", child, False
        yield from _children(child, root, f"{key}.<name>")
    items = sub.get("items")
    if isinstance(items, Mapping) and "properties" in items:
        yield from _rows(_resolve(items, root), root, f"{key}[]")
    then = sub.get("then")
    if isinstance(then, Mapping) and "properties" in then and "if" in sub:
        yield from _rows(_resolve(then, root), root, key)


def kind_rows(schema: Mapping[str, Any] | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """(kind, the branch's ``then``) for every distribution kind, in schema order."""
    root = schema or _schema_at(str(schema_path()))
    items = _resolve(root["properties"]["distributions"]["items"], root)
    for branch in items.get("allOf", ()):
        kind = branch["if"]["properties"]["kind"]["const"]
        yield kind, _resolve(branch["then"], root)


def kind_params(then: Mapping[str, Any]) -> dict[str, Any]:
    """The ``params`` schema of one kind branch."""
    return dict((then.get("properties") or {}).get("params") or {})


def undocumented(schema: Mapping[str, Any] | None = None) -> list[str]:
    """Keys (and kinds, and kinds' params) whose schema has no ``description``: each would be a
    row of the docs with no meaning."""
    root = schema or _schema_at(str(schema_path()))
    missing = [key for key, sub, _ in key_rows(root) if not str(sub.get("description", "")).strip()]
    for kind, then in kind_rows(root):
        if not str(then.get("description", "")).strip():
            missing.append(f"distributions[].kind = {kind}")
        for name, sub in (kind_params(then).get("properties") or {}).items():
            if not str(sub.get("description", "")).strip():
                missing.append(f"distributions[].params.{name} (kind {kind})")
    return missing


def _type_text(sub: Mapping[str, Any]) -> str:
    names = {"integer": "int", "number": "number", "string": "string", "boolean": "bool", "object": "mapping",
             "null": "null"}
    kind = sub.get("type")
    if isinstance(kind, list):
        return str(sub.get("x-rule") or " or ".join(names.get(k, k) for k in kind))
    if kind == "array":
        items = sub.get("items")
        inner = _type_text(items) if isinstance(items, Mapping) and items.get("type") != "object" else "mapping"
        return f"list of {inner}"
    if kind is None and isinstance(sub.get("anyOf"), list):
        return " or ".join(f"`{_plain(b['const'])}`" if "const" in b else _type_text(b) for b in sub["anyOf"])
    if kind is None and isinstance(sub.get("enum"), list):
        # an enum without a type: the types of its values (it read "None" in the docs)
        of = {str: "string", bool: "bool", int: "int", float: "number", type(None): "null"}
        return " or ".join(dict.fromkeys(of.get(type(v), "value") for v in sub["enum"]))
    return names.get(str(kind), str(kind))


def _values_text(sub: Mapping[str, Any]) -> str:
    parts = []
    if "enum" in sub:
        parts.append(", ".join(f"`{_plain(v)}`" for v in sub["enum"]))
    if bounds(sub):
        parts.append(bounds(sub))
    items = sub.get("items")
    if sub.get("type") == "array" and isinstance(items, Mapping):
        if bounds(items):
            parts.append(f"each {bounds(items)}")
        if "enum" in items:
            parts.append("each " + ", ".join(f"`{_plain(v)}`" for v in items["enum"]))
    if sub.get("minItems") == 1:
        parts.append("non-empty")
    if sub.get("uniqueItems"):
        parts.append("distinct")
    if "x-rule" in sub and not isinstance(sub.get("type"), list):
        parts.append(str(sub["x-rule"]))
    elif "pattern" in sub:
        parts.append(f"matches `{sub['pattern']}`")
    return "; ".join(parts)


def _default_text(sub: Mapping[str, Any], required: bool) -> str:
    if "default" in sub:
        default = sub["default"]
        if default == {} and sub.get("properties"):
            return "(each key's)"
        return f"`{_plain(default)}`"
    if "x-default" in sub:
        return f"*{sub['x-default']}*"
    return "required" if required else "none"


def _cell(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def render_keys(schema: Mapping[str, Any] | None = None) -> str:
    """The Markdown table of every config key: key, type, values, default, meaning."""
    root = schema or _schema_at(str(schema_path()))
    lines = ["| key | type | values | default | meaning |", "| --- | --- | --- | --- | --- |"]
    for key, sub, required in key_rows(root):
        meaning = sub.get("description", "")
        cells = [f"`{key}`", _type_text(sub), _values_text(sub), _default_text(sub, required), meaning]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def render_kinds(schema: Mapping[str, Any] | None = None) -> str:
    """The Markdown table of the distribution kinds: kind, its ``params``, meaning."""
    root = schema or _schema_at(str(schema_path()))
    lines = ["| kind | params | meaning |", "| --- | --- | --- |"]
    for kind, then in kind_rows(root):
        params = kind_params(then)
        required = set(params.get("required", ()))
        described = []
        for name, sub in (params.get("properties") or {}).items():
            facts = [_type_text(sub)]
            facts += [v for v in [_values_text(sub)] if v]
            if name in required:
                facts.append("required")
            else:
                facts.append(f"default `{_plain(sub['default'])}`" if "default" in sub else "optional")
            meaning = " ".join(str(sub.get("description", "")).split()).rstrip(".")
            described.append(f"`{name}` ({', '.join(facts)}): {meaning}")
        cells = [f"`{kind}`", "; ".join(described) or "none", then.get("description", "")]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def render_docs(schema: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The generated blocks of config/README.md (name -> text between its markers)."""
    root = schema or _schema_at(str(schema_path()))
    missing = undocumented(root)
    if missing:
        raise KvasymError(f"config schema: no description for {', '.join(missing)}")
    return {"keys": f"{_GENERATED}\n\n{render_keys(root)}", "kinds": f"{_GENERATED}\n\n{render_kinds(root)}"}


def _block_pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- {name}:begin -->)(.*?)(<!-- {name}:end -->)", re.DOTALL)


def doc_blocks(text: str) -> dict[str, str]:
    """The generated blocks found in a README's text (name -> text between the markers)."""
    found = {}
    for name in DOC_BLOCKS:
        match = _block_pattern(name).search(text)
        if match is None:
            raise KvasymError(f"no <!-- {name}:begin --> ... <!-- {name}:end --> block")
        found[name] = match.group(2).strip("\n")
    return found


def update_docs(text: str, schema: Mapping[str, Any] | None = None) -> str:
    """``text`` with every generated block replaced by what the schema renders."""
    doc_blocks(text)  # every block present
    for name, block in render_docs(schema).items():
        text = _block_pattern(name).sub(lambda m, b=block: f"{m.group(1)}\n{b}\n{m.group(3)}", text, count=1)
    return text


def main(argv: list[str] | None = None) -> int:
    from .errors import exit_status

    parser = argparse.ArgumentParser(
        prog="python3 -m kvasym.config_schema",
        description="The config schema's key tables (Markdown); without options, print them.",
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write-docs", metavar="README", help="rewrite the generated blocks of README in place")
    group.add_argument("--check-docs", metavar="README", help="exit 1 if README's generated blocks are stale")
    args = parser.parse_args(argv)
    status = {"stale": False}

    def run() -> None:
        if args.write_docs is None and args.check_docs is None:
            blocks = render_docs()
            print(blocks["keys"] + "\n\n" + blocks["kinds"])
            return
        path = Path(args.write_docs or args.check_docs)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise KvasymError(f"{path}: cannot be read ({exc.strerror or exc})") from None
        try:
            new = update_docs(text)
        except KvasymError as exc:
            raise KvasymError(f"{path}: {exc}") from None
        if args.check_docs is not None:
            status["stale"] = new != text
            if status["stale"]:
                print(f"{path}: the key tables are stale; run python3 -m kvasym.config_schema --write-docs {path}",
                      file=sys.stderr)
        elif new != text:
            path.write_text(new, encoding="utf-8")

    code = exit_status(run)
    return code or (1 if status["stale"] else 0)


if __name__ == "__main__":
    raise SystemExit(main())
