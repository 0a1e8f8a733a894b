"""The "Reproducing this paper" section (kvasym.render.reproduce, stage reproduce).

(a) job costs: sums of hand-written benchmark tables (wall, CPU) and the largest peak, per stage
    and in total; a file that is not a benchmark table is named;
(b) git: a temporary repository whose claims file is declared, amended (a rule changed, a claim
    added, one removed) and merged: the log lists the declaration then each amendment with the
    claims and fields it changed, a merge counted against its first parent; the work tree's
    clean flag flips when a tracked file changes; without git, or outside a repository, one line;
(c) the section renders to LaTeX with every name escaped.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from kvasym.errors import KvasymError
from kvasym.render import reproduce as rp
from kvasym.render.format import render_template

HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"


def _bench(path: Path, wall: float, rss: float, cpu: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HEADER + f"{wall}\t0:00:01\t{rss}\t1\t1\t1\t0\t0\t0\t{cpu}\n", encoding="utf-8")


def test_benchmark_costs_sum_times_and_keep_the_largest_peak(tmp_path):
    _bench(tmp_path / "metrics" / "g" / "d64" / "KV" / "n2.tsv", 1.5, 80.0, 1.0)
    _bench(tmp_path / "metrics" / "g" / "d64" / "KV" / "n4.tsv", 2.25, 120.0, 2.0)
    _bench(tmp_path / "data" / "g" / "d64.tsv", 0.5, 30.0, 0.25)
    _bench(tmp_path / "real" / "capture" / "t.tsv", 8.0, 900.0, 3.0)
    costs = rp.benchmark_costs(tmp_path)
    by = {s["stage"]: s for s in costs["stages"]}
    assert by["metrics"] == {"stage": "metrics", "jobs": 2, "wall_s": 3.75, "cpu_s": 3.0, "peak_rss_mb": 120.0}
    assert by["real/capture"]["jobs"] == 1
    assert costs["total"] == {"jobs": 4, "wall_s": 12.25, "cpu_s": 6.25, "peak_rss_mb": 900.0}
    assert rp.benchmark_costs(tmp_path / "absent")["total"]["jobs"] == 0
    (tmp_path / "data" / "bad.tsv").write_text("a\tb\n1\t2\n", encoding="utf-8")
    with pytest.raises(KvasymError, match="bad.tsv: not a Snakemake benchmark"):
        rp.benchmark_costs(tmp_path)


def test_benchmark_costs_take_cpu_and_memory_from_the_jobs_own_cost_lines(tmp_path):
    from kvasym.cli import _cost_line

    bench, logs = tmp_path / "benchmarks", tmp_path / "logs"
    _bench(bench / "metrics" / "g" / "d64.tsv", 1.5, 80.0, 1.0)  # its log has the cost line
    _bench(bench / "metrics" / "g" / "d128.tsv", 2.0, 90.0, 0.5)  # its log does not (a failed job)
    _bench(bench / "data" / "g.tsv", 0.5, 30.0, 0.25)  # no log at all
    (logs / "metrics" / "g").mkdir(parents=True)
    # an earlier attempt's line, then the last one: the last counts
    (logs / "metrics" / "g" / "d64.log").write_text(
        "kvasym: stage metrics done: cpu_s=1.00 max_rss_mib=10\nwrote x\n"
        "kvasym: stage metrics done: cpu_s=7.25 max_rss_mib=1000\n", encoding="utf-8")
    (logs / "metrics" / "g" / "d128.log").write_text("Traceback ...\n", encoding="utf-8")
    costs = rp.benchmark_costs(bench, logs)
    by = {s["stage"]: s for s in costs["stages"]}
    assert by["metrics"]["cpu_s"] == pytest.approx(7.25 + 0.5) and by["metrics"]["wall_s"] == 3.5
    assert by["metrics"]["peak_rss_mb"] == pytest.approx(1000 * 1.048576)  # MiB -> MB
    assert by["data"] == {"stage": "data", "jobs": 1, "wall_s": 0.5, "cpu_s": 0.25, "peak_rss_mb": 30.0}
    assert costs["from_logs"] == 1 and costs["total"]["cpu_s"] == pytest.approx(8.0)
    # the line the CLI writes is the line the reader parses
    line = _cost_line()
    (logs / "data").mkdir()
    (logs / "data" / "g.log").write_text(f"kvasym: stage data done: {line}\n", encoding="utf-8")
    cpu = float(line.split()[0].split("=")[1])
    assert rp.job_log_cost(logs / "data" / "g.log")[0] == pytest.approx(cpu)
    assert rp.benchmark_costs(bench, logs)["from_logs"] == 2
    assert rp.benchmark_costs(bench)["from_logs"] == 0  # without the folder: the benchmark files' CPU


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                               "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(repo), "PATH": "/usr/bin:/bin"}).stdout


def _claims(*claims: dict) -> str:
    return json.dumps({"claims": list(claims)})  # JSON is YAML


def _commit(repo: Path, text: str, message: str) -> None:
    (repo / "config").mkdir(exist_ok=True)
    (repo / "config" / "claims.yaml").write_text(text, encoding="utf-8")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)


@pytest.fixture
def repo(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("GIT MISSING: the amendment log was NOT tested")
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    a = {"id": "C1", "holds_if": {"op": ">", "value": 1.0}}
    b = {"id": "C2", "holds_if": {"op": "all"}}
    _commit(repo, _claims(a, b), "declare C1 and C2")
    _commit(repo, _claims({**a, "holds_if": {"op": ">=", "value": 1.5}}, b), "C1: a stricter rule")
    _git(repo, "checkout", "-q", "-b", "side")
    _commit(repo, _claims({**a, "holds_if": {"op": ">=", "value": 1.5}}, b, {"id": "C3"}), "add C3 on a branch")
    _git(repo, "checkout", "-q", "main")
    _commit(repo, _claims({**a, "holds_if": {"op": ">=", "value": 1.5}}), "drop C2")
    # the merge resolves to C1 and the branch's C3
    _git(repo, "merge", "-q", "--no-ff", "--no-commit", "-s", "ours", "side")
    _commit(repo, _claims({**a, "holds_if": {"op": ">=", "value": 1.5}}, {"id": "C3"}), "merge side")
    return repo


def test_amendment_log_lists_declaration_then_amendments(repo):
    log = rp.amendment_log(repo, repo / "config" / "claims.yaml")
    assert log["available"] and log["path"] == "config/claims.yaml"
    rows = [(e["kind"], e["subject"], e["added"], e["removed"], e["changed"]) for e in log["entries"]]
    assert rows[:3] == [
        ("declared", "declare C1 and C2", ["C1", "C2"], [], {}),
        ("amended", "C1: a stricter rule", [], [], {"C1": ["holds_if"]}),
        ("amended", "drop C2", [], ["C2"], {}),
    ]
    # the merge, against its first parent (main); the branch's own commit is not listed
    assert rows[3] == ("amended", "merge side", ["C3"], [], {}) and len(rows) == 4


def test_git_state_flags_a_changed_work_tree(repo):
    state = rp.git_state(repo)
    assert state["available"] and state["clean"] and len(state["commit"]) == 40
    (repo / "config" / "claims.yaml").write_text("claims: []\n", encoding="utf-8")
    state = rp.git_state(repo)
    assert state["clean"] is False and state["changed"] == ["config/claims.yaml"]


def test_without_git_or_a_repository_the_log_is_one_line(tmp_path, monkeypatch):
    claims = tmp_path / "claims.yaml"
    claims.write_text("claims: []\n", encoding="utf-8")
    if shutil.which("git") is not None:
        outside = rp.amendment_log(tmp_path, claims)
        assert not outside["available"] and "outside a git repository" in outside["reason"]
    monkeypatch.setattr(rp.shutil, "which", lambda name: None)
    absent = rp.amendment_log(tmp_path, claims)
    assert not absent["available"] and "git is not installed" in absent["reason"]
    assert rp.git_state(tmp_path)["available"] is False


def test_the_section_renders_with_names_escaped(tmp_path):
    claims = tmp_path / "claims_R&D.yaml"
    claims.write_text("claims: []\n", encoding="utf-8")
    slice_ = {"commands": ["snakemake --cores 2 --configfile a_b.yaml"], "configfiles": ["a_b.yaml"],
              "config_sha256": "ab" * 32, "claims_file": str(claims), "outputs": {"tests": "results/x_y/"},
              "commit": "c0ffee"}
    _bench(tmp_path / "bench" / "stats" / "g.tsv", 2.0, 50.0, 1.0)
    context = rp.reproduce_context(slice_, bench_dir=tmp_path / "bench", repo=tmp_path)
    text = render_template("reproduce.tex.j2", **context)
    assert rp.tt("a_b.yaml") in text and rp.tt(claims) in text and rp.tt("results/x_y/") in text
    assert rp.tt("R&D_1") == r"\texttt{R\&D\_\allowbreak{}1}"  # escaped, and breakable
    assert context["claims_sha256"] == rp.file_sha256(claims) and rp.tt(context["claims_sha256"]) in text
    assert r"\label{tab:reproduce_costs}" in text and r"\texttt{stats} & 1 & $2.00$ & $1.00$ & $50.0$" in text
    assert "Amendment log unavailable" in text and r"\label{tab:amendments}" in text
    assert "numpy~" in text
    assert context["forward"] is None  # no fixture named in this slice


def test_forward_validation_reads_the_committed_fixture(tmp_path):
    root = Path(__file__).resolve().parents[1]
    forward = rp.forward_validation(root / rp.FORWARD_REFERENCE)
    assert forward["tokens"] >= 8 and forward["max_abs_delta_logit"] < 1e-3 and forward["argmax_agreement"] == 1.0
    assert "transformers" in forward["reference"]
    assert rp.forward_validation(tmp_path / "absent.json") is None
    (tmp_path / "bad.json").write_text("{}", encoding="utf-8")
    with pytest.raises(KvasymError, match="bad.json: not a forward-pass reference"):
        rp.forward_validation(tmp_path / "bad.json")


def test_an_extended_claims_file_prints_its_hash_and_amendments(repo):
    """A claims file with ``extends`` (config/claims.long.yaml over the paper's): the section
    prints the extended file's SHA-256 and its own amendment log beside the main file's."""
    long = repo / "config" / "claims.long.yaml"
    long.write_text('extends: claims.yaml\nclaims: [{"id": "L1", "statement": "s", "statistic": "theory", '
                    '"where": {"check": "qjl_vs_residual"}, "holds_if": {"op": ">", "value": 1.0}}]\n',
                    encoding="utf-8")
    (repo / "config" / "claims.yaml").write_text(_claims({"id": "C1", "statement": "s", "statistic": "theory",
                                                          "where": {"check": "qjl_vs_residual"},
                                                          "holds_if": {"op": ">=", "value": 1.5}}), encoding="utf-8")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "the long claims, and C1 given its statement")
    extended = rp.extended_claims(repo, long)
    assert [x["file"] for x in extended] == [str(repo / "config" / "claims.yaml")]
    assert extended[0]["sha256"] == rp.file_sha256(repo / "config" / "claims.yaml")
    entries = extended[0]["amendments"]["entries"]
    assert [e["subject"] for e in entries] == ["declare C1 and C2", "C1: a stricter rule", "drop C2", "merge side",
                                               "the long claims, and C1 given its statement"]
    assert rp.extended_claims(repo, repo / "config" / "claims.yaml") == []
    slice_ = {"commands": ["snakemake"], "configfiles": [], "config_sha256": "ab" * 32, "claims_file": str(long),
              "outputs": {}, "commit": "c0ffee"}
    text = render_template("reproduce.tex.j2", **rp.reproduce_context(slice_, bench_dir=repo / "bench", repo=repo))
    assert "These claims extend those of" in text and rp.tt(extended[0]["sha256"][:16]) in text
    assert "merge side" not in text and "+C3" in text and "$-$C2" in text and "C1 (holds_if" not in text
