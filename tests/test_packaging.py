"""The conda environment and the pip metadata list the same packages."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~ \[]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_matches_pyproject() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pip_side = {_name(r) for r in project["dependencies"]}
    pip_side |= {_name(r) for r in project["optional-dependencies"]["test"]}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda_side = {_name(d) for d in env["dependencies"] if isinstance(d, str)} - {"python", "pip"}
    assert conda_side == pip_side, (
        f"only in environment.yml: {sorted(conda_side - pip_side)}; "
        f"only in pyproject.toml: {sorted(pip_side - conda_side)}"
    )


def test_console_script_declared() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["kvasym"] == "kvasym.cli:main"
