"""config/long.yaml, the long-context study the paper config leaves out, as the DAG plans it.

A dry run of ``--configfile config/config.yaml config/long.yaml`` (Snakemake merges the overlay
into the paper config key by key, a list replacing a list): the jobs it adds are the ones its
comments promise, counted from the two files by hand here, and each long job asks for the memory
its window needs (kvasym.resources), so that no job of the study is killed under the Slurm profile
for want of it.
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import yaml
from snakemake_workdir import ROOT, make_workdir, run_env, snakemake_cmd

from kvasym.real import missing_extra_reason
from kvasym.real.model_registry import PRIMARY

_JOB = re.compile(r"^rule (\w+):\n(?:    .*\n)*?    wildcards: (.*)\n    resources: (.*)$", re.M)


def _merged() -> dict:
    """config.yaml with long.yaml merged in as Snakemake does (mappings recursively, other values
    replaced)."""
    def merge(base: dict, over: dict) -> dict:
        out = dict(base)
        for key, value in over.items():
            out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        return out

    return merge(yaml.safe_load((ROOT / "config/config.yaml").read_text()),
                 yaml.safe_load((ROOT / "config/long.yaml").read_text()))


def test_long_config_plans_every_window_and_trial_with_the_memory_it_needs(tmp_path: Path) -> None:
    if missing_extra_reason() is not None:
        pytest.skip(f"the long study's model jobs need the real extra ({missing_extra_reason()})")
    workdir = make_workdir(tmp_path / "long")
    out = subprocess.run(snakemake_cmd("-n", "--forceall", configfile="config/config.yaml") + [
        "--configfile", "config/config.yaml", "config/long.yaml"], cwd=workdir, capture_output=True, text=True,
        timeout=300, env=run_env())
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    jobs = []
    for rule, wildcards, resources in _JOB.findall(out.stdout):
        fields = dict(item.split("=", 1) for item in wildcards.split(", "))
        mem = int(re.search(r"mem_mb=(\d+)", resources)[1])
        jobs.append((rule, fields.get("model"), int(fields.get("length", 0) or 0), mem))
    config = _merged()
    e2e = config["real"]["e2e"]
    expected = Counter()
    for model, section in [(PRIMARY, e2e), *((m, s["e2e"]) for m, s in config["real"]["models"].items())]:
        # a further model's section names its own parts; lengths it does not name are the primary's
        for kind, rule in (("long_context", "e2e_long"), ("passkey", "passkey")):
            if kind not in section:
                continue
            block = section[kind]
            for length in block["lengths"]:
                expected[(rule, model, int(length))] += int(block.get("parts", e2e[kind].get("parts", 1)))
    planned = Counter((rule, model, length) for rule, model, length, _ in jobs if rule in ("e2e_long", "passkey"))
    assert planned == expected
    assert expected[("e2e_long", PRIMARY, 8192)] and expected[("passkey", PRIMARY, 8192)]
    mem = {(rule, model, length): m for rule, model, length, m in jobs}
    # a window's job holds its logits (T x vocabulary, twice): twice the tokens, twice the request
    assert mem[("e2e_long", PRIMARY, 8192)] >= 2 * mem[("e2e_long", PRIMARY, 4096)] > 0, mem
    # a passkey pass scores five answer rows only: its peak grows by about 55 MiB per 1K tokens
    # (one trial's two passes on SmolLM2, measured 956, 1,004 and 1,115 MiB at 1K, 2K and 4K), so
    # one request covers every length, 8K's about 1.3 GB included
    passkey = {length: m for (rule, model, length), m in mem.items() if rule == "passkey" and model == PRIMARY}
    peak_8k_mb = (1115 + 4 * 55) * 1.048576  # MiB -> MB
    assert set(passkey) == {1024, 2048, 4096, 8192} and min(passkey.values()) >= peak_8k_mb, passkey


#: Rules that summarise the whole DAG: the overlay's further jobs change what they read.
SUMMARY_RULES = {"gather", "e2e_join", "e2e_stats", "claims", "tables", "numbers", "reproduce", "crate", "paper",
                 "card_page"}


def _shell_commands(workdir: Path, *configfiles: str) -> dict[str, set[str]]:
    """Rule -> the shell commands of its jobs in a forced dry run of ``configfiles``."""
    out = subprocess.run(snakemake_cmd("-n", "-p", "--forceall", configfile=configfiles[0])
                         + ["--configfile", *configfiles], cwd=workdir, capture_output=True, text=True, timeout=300,
                         env=run_env())
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    commands: dict[str, set[str]] = {}
    rule = None
    for line in out.stdout.splitlines():
        started = re.match(r"^(?:local)?rule (\w+):", line)
        if started:
            rule = started[1]
        elif line.startswith("Shell command: ") and rule is not None:
            commands.setdefault(rule, set()).add(line.removeprefix("Shell command: "))
            rule = None
    return commands


def test_long_config_reruns_no_job_of_the_paper_config(tmp_path: Path) -> None:
    """long.yaml's promise: every job the paper config runs is the same job under the overlay
    (the same command, so the same slice and parameters), and results already built are reused;
    only the rules that summarise the DAG read more."""
    if missing_extra_reason() is not None:
        pytest.skip(f"the long study's model jobs need the real extra ({missing_extra_reason()})")
    workdir = make_workdir(tmp_path / "long")
    base = _shell_commands(workdir, "config/config.yaml")
    overlay = _shell_commands(workdir, "config/config.yaml", "config/long.yaml")
    changed = {rule for rule, commands in base.items() if not commands <= overlay.get(rule, set())}
    assert changed <= SUMMARY_RULES | {r for r in changed if r.startswith("figure_")}, sorted(changed)
    assert {"e2e", "e2e_long", "passkey", "calibrate", "cells", "metrics"} <= set(base) - changed
