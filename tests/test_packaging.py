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
    pip_section = [r for d in env["dependencies"] if isinstance(d, dict) for r in d.get("pip", [])]
    conda_side = {_name(d) for d in env["dependencies"] if isinstance(d, str)} - {"python", "pip", "matplotlib"}
    conda_side |= {_name(r) for r in pip_section if not r.startswith("-")}
    assert conda_side == pip_side, (
        f"only in environment.yml: {sorted(conda_side - pip_side)}; "
        f"only in pyproject.toml: {sorted(pip_side - conda_side)}"
    )


def test_console_script_declared() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["kvasym"] == "kvasym.cli:main"


def test_environment_yml_pins_every_package() -> None:
    """Every package has one exact version (what CI tested), so a conda user gets that stack."""
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = [r for d in env["dependencies"] if isinstance(d, dict) for r in d.get("pip", [])]
    for dep in [d for d in env["dependencies"] if isinstance(d, str) and d != "pip"]:
        assert re.fullmatch(r"[A-Za-z0-9_.-]+=[0-9][0-9A-Za-z.]*", dep), f"environment.yml: {dep!r} is not pinned"
    for dep in pip_section:
        assert dep == "-e ." or re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.]*", dep), f"{dep!r} is not pinned"


def test_rules_have_no_conda_directives() -> None:
    """Conda users run Snakemake inside environment.yml's environment (see its header)."""
    for path in [ROOT / "Snakefile", *sorted((ROOT / "workflow/rules").glob("*.smk"))]:
        assert not re.search(r"^\s*conda:\s*$", path.read_text(), re.M), f"{path.name} has a conda: directive"


def test_every_module_folder_is_a_package_the_build_finds() -> None:
    """pyproject's ``packages.find`` (setuptools' find_packages over ``src``) takes only folders
    with an ``__init__.py``: a folder of modules without one (``kvasym/render`` had none) is left
    out of a wheel, and a user's ``pip install .`` (not ``-e``) loses every module in it."""
    from setuptools import find_packages

    found = set(find_packages(where=str(ROOT / "src")))
    folders = {p.parent.relative_to(ROOT / "src").as_posix().replace("/", ".")
               for p in (ROOT / "src/kvasym").rglob("*.py") if "__pycache__" not in p.parts}
    assert folders <= found, f"module folders a wheel would leave out: {sorted(folders - found)}"
