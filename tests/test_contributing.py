"""CONTRIBUTING.md's recipes, followed word for word on a copy of the tiny run.

Each fenced block tagged ``recipe=<name>`` is applied to a copy of the finished tiny run (and of
this checkout's ``src/``) as its tags say, then the recipe's ``check`` blocks run there and must
succeed. The fast test checks that every block still applies (each anchor stands once in the file
it names, each created file is new, each recipe has a check), so a registry renamed or moved
fails here before anyone follows the guide.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "CONTRIBUTING.md"
RECIPES = ("scheme", "claim", "figure", "table", "stage")
_BLOCK = re.compile(r"^```(?P<lang>\w+) (?P<tags>recipe=[^\n]*)\n(?P<body>.*?)^```[ \t]*$", re.S | re.M)
_ACTIONS = ("create", "merge", "append", "after", "check")


def guide_blocks() -> list[tuple[str, dict[str, str], str]]:
    """(recipe, tags, body) of every tagged block of the guide, in order."""
    out = []
    for m in _BLOCK.finditer(GUIDE.read_text(encoding="utf-8")):
        tags = {}
        for word in shlex.split(m["tags"]):
            key, _, value = word.partition("=")
            tags[key] = value
        out.append((tags["recipe"], tags, m["body"]))
    return out


def _action(tags: dict[str, str]) -> str:
    actions = [a for a in _ACTIONS if a in tags]
    assert len(actions) == 1, f"a recipe block needs exactly one of {_ACTIONS}: {tags}"
    return actions[0]


def _merge(into: dict, extra: dict) -> dict:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        elif isinstance(value, list) and isinstance(into.get(key), list):
            into[key] = into[key] + value
        else:
            into[key] = value
    return into


def apply_block(root: Path, tags: dict[str, str], body: str) -> None:
    """Apply one non-check block to the tree at ``root``."""
    target = root / tags["file"]
    action = _action(tags)
    if action == "create":
        assert not target.exists(), f"{tags['file']} exists already: the recipe would overwrite it"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(body, encoding="utf-8")
    elif action == "merge":
        data = yaml.safe_load(target.read_text(encoding="utf-8"))
        target.write_text(yaml.safe_dump(_merge(data, yaml.safe_load(body)), sort_keys=False), encoding="utf-8")
    elif action == "append":
        text = target.read_text(encoding="utf-8")
        target.write_text(text + ("" if text.endswith("\n") else "\n") + body, encoding="utf-8")
    else:
        lines = target.read_text(encoding="utf-8").splitlines(keepends=True)
        hits = [i for i, line in enumerate(lines) if tags["after"] in line]
        assert len(hits) == 1, f"{tags['file']}: the anchor {tags['after']!r} stands {len(hits)} times, not once"
        lines[hits[0] + 1:hits[0] + 1] = [body]
        target.write_text("".join(lines), encoding="utf-8")


def test_every_recipe_block_still_applies(tmp_path: Path) -> None:
    blocks = guide_blocks()
    assert {recipe for recipe, _, _ in blocks} == set(RECIPES)
    for recipe in RECIPES:
        assert any(_action(tags) == "check" for r, tags, _ in blocks if r == recipe), f"recipe {recipe} has no check"
    # applied to a copy of the files they touch (source tree, config, workflow), each in turn
    for recipe in RECIPES:
        root = tmp_path / recipe
        for _, tags, body in [b for b in blocks if b[0] == recipe and _action(b[1]) != "check"]:
            source = ROOT / tags["file"]
            if source.exists() and not (root / tags["file"]).exists():
                (root / tags["file"]).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(source, root / tags["file"])
            apply_block(root, tags, body)
    # the Python files a recipe creates or edits still compile, and the YAML still parses
    for path in tmp_path.rglob("*.py"):
        compile(path.read_text(encoding="utf-8"), str(path), "exec")
    for path in tmp_path.rglob("*.yaml"):
        yaml.safe_load(path.read_text(encoding="utf-8"))


#: Recipe -> the only jobs (logs under results/logs) its checks may run on the tiny run's copy.
ONLY_JOBS = {"stage": {"scheme_means.log"}}


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_works_on_a_copy_of_the_tiny_run(recipe: str, tiny_local_run: Path, tmp_path: Path) -> None:
    from snakemake_workdir import RUN_BOUND_S, copy_run, run_env

    workdir = copy_run(tiny_local_run, tmp_path / "run")
    shutil.copytree(ROOT / "src", workdir / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    blocks = [(tags, body) for r, tags, body in guide_blocks() if r == recipe]
    for tags, body in blocks:
        if _action(tags) != "check":
            apply_block(workdir, tags, body)
    env = run_env()
    env["PYTHONPATH"] = str(workdir / "src")  # the copy's library, with the recipe's code in it
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    started = time.time()
    for tags, body in blocks:
        if _action(tags) == "check":
            done = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=workdir, env=env, capture_output=True,
                                  text=True, timeout=RUN_BOUND_S)
            logs = "\n".join(p.read_text() for p in (workdir / "results/logs").rglob("*.log")
                             if p.stat().st_mtime >= started)
            assert done.returncode == 0, f"{body}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}\n{logs[-3000:]}"
    if recipe in ONLY_JOBS:  # issue 48, point 3: registry entries added rerun no existing job
        ran = {p.relative_to(workdir / "results/logs").as_posix() for p in (workdir / "results/logs").rglob("*.log")
               if p.stat().st_mtime >= started}
        assert ran == ONLY_JOBS[recipe], ran
