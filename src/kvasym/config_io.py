"""Reading user YAML files with errors that name the file."""

from __future__ import annotations

from pathlib import Path

import yaml

from .errors import KvasymError


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
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise KvasymError(f"{p} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise KvasymError(f"{p}: the top level must be a mapping, got {type(data).__name__}")
    return data
