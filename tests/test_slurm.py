"""The cluster path, for real: the tiny config through Snakemake's SLURM executor plugin on a
single-node Slurm stood up on this machine (workflow/scripts/local_slurm.sh), with the
workflow's own profile (workflow/profiles/slurm), and its results compared with a local run.

Needs root and apt (to install slurm-wlm and munge) or a running Slurm whose node is idle;
otherwise it skips and says so. CI runs it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from snakemake_workdir import ROOT, RUN_BOUND_S, make_workdir, run_env, snakemake_cmd

from kvasym.dataset import read_table
from kvasym.render.figures.registry import dag_families
from kvasym.real import missing_extra_reason

pytestmark = pytest.mark.slow
LOCAL_SLURM = ROOT / "workflow" / "scripts" / "local_slurm.sh"
IDS = ["distribution", "dim", "scheme", "budget", "sharpness", "trial"]
RUN_TIMEOUT = RUN_BOUND_S  # the whole Slurm run: a hang guard (660 s were seen on a loaded machine)


#: The single node has this machine's CPUs: a rule declaring more threads (its job's worker
#: processes, kvasym.resources.STAGE_THREADS) is capped to them, or Slurm refuses the job.
NODE_THREADS = ("--max-threads", str(os.cpu_count() or 1))


def _node_idle() -> bool:
    if shutil.which("sinfo") is None:
        return False
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True)
    return out.returncode == 0 and out.stdout.strip().startswith("idle")


@pytest.fixture(scope="module")
def slurm():
    """An idle single-node Slurm: the one running, or one started here (and stopped after)."""
    if _node_idle():
        yield "already running"
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("SLURM NOT AVAILABLE: no idle Slurm node, and installing one needs root and apt-get; "
                    "the cluster profile was NOT exercised (run workflow/scripts/local_slurm.sh up as root)")
    up = subprocess.run([str(LOCAL_SLURM), "up"], capture_output=True, text=True, timeout=300)
    assert up.returncode == 0, f"local_slurm.sh up failed:\n{up.stdout[-2000:]}\n{up.stderr[-3000:]}"
    yield "started"
    subprocess.run([str(LOCAL_SLURM), "down"], capture_output=True, timeout=60)


def _run_bounded(cmd: list[str], cwd: Path, timeout: float) -> tuple[int, str, float]:
    """Run Snakemake; on timeout send SIGINT (the plugin then cancels its Slurm jobs), then kill."""
    start = time.monotonic()
    log = cwd / "slurm_run.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, text=True, env=run_env())
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            code = -1
    return code, log.read_text(errors="replace"), time.monotonic() - start


def local_rule_names(families: list[str], real: bool, latex: bool) -> list[str]:
    """The rules that run on the submitting host: ``all`` (no action) and the summary rules
    (``localrule: True``); the Slurm run below checks this list against what ran locally."""
    names = ["all", "gather", "claims", "tables", "numbers", "reproduce", "crate"] + [f"figure_{f}" for f in families]
    return names + (["e2e_join", "e2e_stats", "card_page"] if real else []) + (["paper"] if latex else [])


def predicted_slurm_jobs(workdir: Path, configfile: str, local_rules: list[str]) -> tuple[int, int]:
    """(Slurm submissions, jobs) of a config's whole DAG under the Slurm profile, from a dry
    run (``--d3dag``): one submission per group job (a connected component of the jobs whose
    rules share a group name of the profile's ``groups``, as Snakemake forms them), plus one per
    other job that is not local."""
    import yaml

    groups = yaml.safe_load((ROOT / "workflow/profiles/slurm/config.yaml").read_text())["groups"]
    out = subprocess.run(snakemake_cmd("-n", "--forceall", "--d3dag", configfile=configfile), cwd=workdir,
                         capture_output=True, text=True, timeout=300, env=run_env())
    assert out.returncode == 0, out.stderr[-3000:]
    dag = json.loads(out.stdout[out.stdout.index("{"):])
    rule = {node["id"]: node["value"]["rule"] for node in dag["nodes"]}
    parent = {job: job for job in rule}

    def root(job: int) -> int:
        while parent[job] != job:
            parent[job] = parent[parent[job]]
            job = parent[job]
        return job

    for edge in dag["edges"]:
        u, v = edge["u"], edge["v"]
        if rule[u] in groups and groups[rule[u]] == groups.get(rule[v]):
            parent[root(u)] = root(v)
    group_jobs = {root(job) for job, name in rule.items() if name in groups}
    single = [job for job, name in rule.items() if name not in groups and name not in local_rules]
    return len(group_jobs) + len(single), len(rule)


def test_readme_counts_the_paper_grids_slurm_jobs(tmp_path):
    """The README's "the paper grid submits N Slurm jobs for its M jobs" is the paper DAG's, by
    the rule the Slurm run below checks on the tiny grid (the paper grid with its real rows and
    its PDF, as CI has them)."""
    if missing_extra_reason() is not None:
        pytest.skip(f"the paper grid's real rows need the real extra ({missing_extra_reason()})")
    if not all(shutil.which(t) for t in ("latexmk", "pdflatex")):
        pytest.skip("the paper grid's paper job needs LaTeX (latexmk, pdflatex)")
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"the paper grid submits (\d+) Slurm jobs\s+for its (\d+) jobs", readme)
    assert match, "README no longer states the paper grid's Slurm job count"
    local_rules = local_rule_names(dag_families(True), real=True, latex=True)
    submitted, jobs = predicted_slurm_jobs(make_workdir(tmp_path / "paper"), "config/config.yaml", local_rules)
    assert (int(match.group(1)), int(match.group(2))) == (submitted, jobs)


def _sorted(workdir: Path, table: str) -> pd.DataFrame:
    df = read_table(workdir / "results/metrics", table)
    keys = IDS + (["query"] if table == "per_query" else ["key"])
    return df.sort_values(keys).reset_index(drop=True)


def test_tiny_config_through_slurm_matches_a_local_run(slurm, request, tmp_path):
    # the local run is asked for only to compare with (below): the Slurm run, which waits on the
    # queue's polling much of the time, overlaps with its build instead of waiting for it
    workdir = make_workdir(tmp_path / "slurm")
    cmd = snakemake_cmd("--profile", "profiles/slurm", "--slurm-status-command", "squeue", *NODE_THREADS)
    code, log, wall = _run_bounded(cmd, workdir, RUN_TIMEOUT)
    assert code == 0, f"Slurm run failed or timed out after {wall:.0f} s:\n{log[-5000:]}"
    submitted = re.findall(r"has been submitted with SLURM jobid (\d+)", log)
    groups = re.findall(r"has been submitted with SLURM jobid \d+ \(log: \S*/group_", log)
    cells = re.findall(r"has been submitted with SLURM jobid \d+ \(log: \S*/group_cell_cells_", log)
    # one group job per (distribution, d) data cell of the tiny grid; with the real extra, one
    # group for the captures and their metrics plus the two real stats jobs
    assert len(cells) == 3, log[-3000:]
    real = missing_extra_reason() is None
    assert len(groups) == len(cells) + (3 if real else 0), log[-3000:]
    # the summary rules (gather, claims, tables, numbers, reproduce, paper, the figures, e2e_stats:
    # seconds each) are local rules: they run on the submitting host, not as Slurm jobs
    families = dag_families(real)
    # (and the rate-distortion frontier's and the query-model sweep's: the tiny config sets both)
    assert ("real_heatmap" in families) == real and ("e2e" in families) == real and len(families) == 11 + 4 * int(real)
    latex = all(shutil.which(t) for t in ("latexmk", "pdflatex"))
    local_rules = local_rule_names(families, real, latex)
    ran_locally = re.findall(r"^localrule (\w+):", log, flags=re.MULTILINE)
    assert sorted(ran_locally) == sorted(local_rules), log[-3000:]
    # on the cluster: the frontier and the sequence-length sweep (minutes on the paper grid) and,
    # with the real extra, the end-to-end job of the tiny config's one text, the calibration, its
    # two long-context lengths in two parts each, its passkey length in three parts, the greedy
    # agreement, and the model card's calibration text in two parts and card
    cluster_rules = ["frontier", "seq_len_sweep"] + (["e2e", "calibrate", *["e2e_long"] * 4, *["passkey"] * 3,
                                                      "greedy", *["sensitivity"] * 2, "card"] if real else [])
    assert len(submitted) == len(groups) + len(cluster_rules), log[-3000:]
    # and the rule that counts the paper grid's submissions for the README predicts this run's
    assert predicted_slurm_jobs(workdir, "config/test.yaml", local_rules)[0] == len(submitted)
    print(f"\nSlurm run of the tiny config: {len(submitted)} Slurm jobs ({len(groups)} group jobs), {wall:.0f} s wall")

    # the same numbers as the local run, to the bit
    tiny_local_run = request.getfixturevalue("tiny_local_run")
    for table in ("per_query", "per_key"):
        pd.testing.assert_frame_equal(_sorted(workdir, table), _sorted(tiny_local_run, table), check_exact=True)
    for rel in ("results/stats/comparisons.parquet", "results/stats/summary.parquet", "results/stats/trials.parquet",
                "results/theory/theory.parquet"):
        pd.testing.assert_frame_equal(pd.read_parquet(workdir / rel), pd.read_parquet(tiny_local_run / rel),
                                      check_exact=True, obj=rel)
    assert json.loads((workdir / "results/claims/claims.json").read_text()) == \
        json.loads((tiny_local_run / "results/claims/claims.json").read_text())
    for npz in sorted((tiny_local_run / "results/packed").rglob("*.npz")):
        with np.load(npz) as a, np.load(workdir / npz.relative_to(tiny_local_run)) as b:
            assert a.files == b.files
            for key in a.files:
                np.testing.assert_array_equal(a[key], b[key], err_msg=f"{npz.name}:{key}")
    for name in ("jensen_bias.png", "kl_ecdf.pdf"):
        assert (workdir / "results/figures" / name).stat().st_size > 1000
    if latex:
        assert (workdir / "paper/build/main.pdf").is_file()
    # nothing left in the queue
    queue = subprocess.run(["squeue", "-h", "-t", "PD,R"], capture_output=True, text=True).stdout.strip()
    assert queue == "", queue
    if real:
        _long_overlay_through_slurm(workdir)


#: The model-level rules whose jobs the long-study overlay adds (one Slurm job each).
LONG_RULES = ("model_file", "e2e", "calibrate", "greedy", "e2e_long", "passkey", "sensitivity", "card")


def _planned_jobs(text: str) -> list[tuple[str, list[str]]]:
    """(rule, outputs) of every job of a dry run's listing."""
    return [(rule, [o.strip() for o in outputs.split(",")])
            for rule, outputs in re.findall(r"^(?:local)?rule (\w+):\n(?:    (?!output).*\n)*?    output: (.*)$",
                                            text, flags=re.M)]


def _long_overlay_through_slurm(workdir: Path) -> None:
    """config/test.long.yaml, long.yaml in miniature, over the tiny config's finished run in the
    same folder through the Slurm profile (issue 49, point 4): none of the tiny run's model jobs
    runs again (the overlay's promise: the base config's jobs are the same jobs), and every job
    it adds is its own Slurm job, the windows and trials spread over their parts."""
    overlay = ["--configfile", "config/test.yaml", "config/test.long.yaml"]
    dry = subprocess.run(snakemake_cmd("-n", *overlay), cwd=workdir, capture_output=True, text=True, timeout=300,
                         env=run_env())
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
    planned = [(rule, outputs) for rule, outputs in _planned_jobs(dry.stdout) if rule in LONG_RULES]
    rerun = [(rule, o) for rule, outputs in planned for o in outputs if (workdir / o).exists()]
    assert not rerun, f"the overlay reruns jobs the tiny config already ran: {rerun[:5]}"
    counts = {rule: sum(1 for r, _ in planned if r == rule) for rule in LONG_RULES}
    # the primary's third window length and second passkey length in the tiny config's parts (2
    # and 3), the second model's window and trials in two parts each
    assert counts["e2e_long"] == 2 + 2 and counts["passkey"] == 3 + 2, counts
    code, log, wall = _run_bounded(snakemake_cmd("--profile", "profiles/slurm", "--slurm-status-command", "squeue",
                                                 *NODE_THREADS, *overlay), workdir, RUN_TIMEOUT)
    assert code == 0, f"the long overlay's Slurm run failed or timed out after {wall:.0f} s:\n{log[-5000:]}"
    submitted = re.findall(r"has been submitted with SLURM jobid \d+ \(log: \S*/rule_(\w+)/", log)
    for rule in ("e2e_long", "passkey"):
        assert submitted.count(rule) == counts[rule], (rule, submitted)
    assert sorted(r for r in submitted if r in LONG_RULES) == sorted(r for r, _ in planned), submitted
    for rule, outputs in planned:
        assert all((workdir / o).is_file() for o in outputs), (rule, outputs)
    print(f"\nthe long overlay through Slurm: {len(submitted)} Slurm jobs ({counts}), {wall:.0f} s wall")
