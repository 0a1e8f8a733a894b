"""Reading user YAML files with errors that name the file."""

from __future__ import annotations

from pathlib import Path

import yaml

from .errors import KvasymError


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping.

    Plain YAML keeps the last value silently, so a config or claims file with two ``budgets:``
    lines (or a claim with two ``holds_if:``) would run something other than what was read.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: let the base class report it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark, f"found duplicate key {key!r}", key_node.start_mark
                )
        return super().construct_mapping(node, deep=deep)


def read_yaml_mapping(path: str | Path) -> dict:
    """A YAML file whose top level is a mapping, or a KvasymError naming the file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise KvasymError(f"{p}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise KvasymError(f"{p}: cannot be read ({exc})") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        # one line: where and what (the default message spans five lines with a caret drawing)
        mark = exc.problem_mark or exc.context_mark
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise KvasymError(f"{p} is not valid YAML ({at}{exc.problem or exc.context})") from None
    except yaml.YAMLError as exc:
        raise KvasymError(f"{p} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise KvasymError(f"{p}: the top level must be a mapping, got {type(data).__name__}")
    return data
