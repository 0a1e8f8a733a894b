"""End to end: the Snakemake DAG on the tiny config (caching, reruns, bad config). Determinism
over core counts and job orders and resuming after kills are tests/test_faults.py's kill test
(its final resume runs on one core against the session's two-core reference run).

Each run happens in a fresh copy of the workflow under a temporary folder, so these tests never
touch the checkout's own results/.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from snakemake_workdir import RUN_BOUND_S, copy_run, run_env

from kvasym.dataset import read_metadata, read_table
from kvasym.study import load_study_file

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
IDS = ["distribution", "dim", "scheme", "budget", "sharpness", "trial"]


def make_workdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "Snakefile", path / "Snakefile")
    shutil.copy(ROOT / "environment.yml", path / "environment.yml")  # the rules' conda env
    shutil.copytree(ROOT / "workflow", path / "workflow")
    shutil.copytree(ROOT / "config", path / "config")
    shutil.copytree(ROOT / "paper", path / "paper", ignore=shutil.ignore_patterns("build", "generated"))
    # Snakemake looks for the default workflow profile in profiles/ beside the Snakefile
    os.symlink("workflow/profiles", path / "profiles")
    return path


def snakemake(workdir: Path, *args: str, timeout: float = RUN_BOUND_S) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "--configfile", "config/test.yaml", *args]
    return subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=timeout, env=run_env())


def sorted_table(workdir: Path, table: str) -> pd.DataFrame:
    df = read_table(workdir / "results/metrics", table)
    keys = IDS + (["query"] if table == "per_query" else ["key"])
    return df.sort_values(keys).reset_index(drop=True)


@pytest.fixture(scope="module")
def complete_run(tiny_local_run) -> Path:
    """The session's local run of the tiny config (tests/conftest.py)."""
    return tiny_local_run


def test_dataset_is_complete_and_sane(complete_run):
    study = load_study_file(complete_run / "config/test.yaml")
    df = read_table(complete_run / "results/metrics", "per_query")
    df = df[df["distribution"].isin(list(study.distributions))]  # the real rows: their own test
    cells = [*study.cells(), *study.frontier_cells()]  # the grid's and the frontier's (config key frontier)
    assert len(df) == len(cells) * study.trials * study.n_queries * len(study.sharpness)
    assert set(map(tuple, df[["distribution", "dim", "scheme", "budget"]].drop_duplicates().values)) == set(cells)
    numeric = df.select_dtypes("number")
    assert np.isfinite(numeric.to_numpy()).all()
    assert (df["kl"] >= 0).all() and df["recall_top5"].between(0, 1).all()
    # d = 64 is a power of two: the measured payload is exactly the budget on both sides
    # (a side that spends n - k bits, KQV-NS's values, pays n - k)
    for side in ("k", "v"):
        specs = [study.scheme(name).side(side.upper()) for name in df["scheme"]]
        spent = [spec.scalar_bits(int(n)) + spec.sketch_bits for spec, n in zip(specs, df["budget"])]
        assert (df[f"{side}_bits_payload"] == np.array(spent, dtype=float)).all(), side
    keys = read_table(complete_run / "results/metrics", "per_key")
    assert len(keys) == len(cells) * study.per_key_trials * study.seq_len * len(study.sharpness)
    # one file, provenance in its metadata
    meta = read_metadata(complete_run / "results/metrics/per_query/gaussian/d64/KQV/n4.parquet")
    assert meta["kvasym_version"] and '"scheme"' in meta["config_slice"]
    # the compressed artifacts exist, one per cell of the grid's schemes at the grid's budgets (the
    # frontier's, RKV n = 5 of frontier.extra_budgets too, are measured in memory: frontier.keep_packed
    # is false), except for the query-model variants' cells (they read their parents' caches:
    # kvasym.study.Study.packed_distribution)
    assert ("gaussian", 64, "RKV", 5) in cells
    packed_cells = [c for c in cells if c[0] not in study.query_variants and c[2] in study.schemes
                    and c[3] in study.budgets]
    assert study.query_variants and study.frontier_schemes and len(packed_cells) < len(cells)
    packed = sorted((complete_run / "results/packed").rglob("*.npz"))
    assert sorted(tuple(p.relative_to(complete_run / "results/packed").parts) for p in packed) == sorted(
        (d, f"d{n}", s, f"n{b}.npz") for d, n, s, b in packed_cells)


def test_claims_ledger_is_complete(complete_run):
    import json

    from kvasym.claims import load_claims

    ledger = json.loads((complete_run / "results/claims/claims.json").read_text())
    from kvasym.study import load_study_file

    study = load_study_file(complete_run / "config/test.yaml")
    declared = load_claims(complete_run / "config/claims.test.yaml", study.headline)
    assert [c["id"] for c in ledger] == [c["id"] for c in declared]
    from kvasym.claims import VERDICTS

    assert {c["verdict"] for c in ledger} <= set(VERDICTS)
    assert next(c for c in ledger if c["id"] == "C6a")["verdict"] == "determined by construction"
    by_id = {c["id"]: c for c in ledger}
    assert by_id["C99"]["verdict"] == "not evaluated"  # a cell outside the tiny grid
    # the QJL variance penalty measured on the tiny grid is near its closed form pi/2 - 1/d
    assert by_id["C1a"]["estimate"] == pytest.approx(np.pi / 2 - 1 / 64, rel=0.1)
    md = (complete_run / "results/claims/claims.md").read_text()
    assert all(c["id"] in md for c in ledger)
    tex = (complete_run / "paper/generated/claims.tex").read_text()
    assert r"\expandafter\newcommand\csname claim:C1a:Estimate\endcsname" in tex


def test_the_query_model_figure_draws_the_ledgers_numbers(complete_run):
    """Issue 30: rendering computes no statistic. The query-model table (stage gather) holds C5's
    ratio under each query model with the claims' own interval; at the cells of C5 and C5i its
    rows are the ledger's estimate and interval, to the bit, and the figure is drawn from it."""
    import json

    from kvasym.artifacts import path

    points = pd.read_parquet(complete_run / path("query_model"))
    ledger = {c["id"]: c for c in json.loads((complete_run / path("claims_json")).read_text())}
    assert set(points["query"]) == {"subspace", "isotropic"}
    for cid in ("C5", "C5i"):
        where = ledger[cid]["where"]
        row = points[(points["distribution"] == where["num"]) & (points["reference"] == where["den"])
                     & (points["dim"] == where["dim"])]
        assert len(row) == 1, cid
        assert row["scheme"].iloc[0] == where["scheme"] and row["budget"].iloc[0] == where["budget"]
        assert row["sharpness"].iloc[0] == where["sharpness"]
        for column, key in (("ratio", "estimate"), ("low", "low"), ("high", "high")):
            value, claimed = float(row[column].iloc[0]), ledger[cid][key]  # the ledger writes NaN as null
            assert value == claimed or (np.isnan(value) and claimed is None), (cid, column, value, claimed)
    assert (complete_run / path("figure", name="query_model", format="pdf")).is_file()


def test_real_model_rows_when_the_extra_is_installed(complete_run):
    """With the real extra, the tiny config's `real:` section adds SmolLM2 captures and the
    rows smollm2 / smollm2-prerope to the gathered stats and the claims; without it, the real
    claims are 'not evaluated' and the test says loudly that the real path was not run."""
    import json

    from kvasym.real import missing_extra_reason

    ledger = {c["id"]: c for c in json.loads((complete_run / "results/claims/claims.json").read_text())}
    reason = missing_extra_reason()
    if reason is not None:
        assert ledger["C2r"]["verdict"] == "not evaluated"
        pytest.skip(f"REAL-MODEL EXTRA MISSING: the DAG skipped the real rows ({reason})")
    assert (complete_run / "results/real/captures/bicycle_repair.npz").is_file()
    summary = pd.read_parquet(complete_run / "results/stats/summary.parquet")
    real = summary[summary["distribution"].isin(["smollm2", "smollm2-prerope"])]
    assert set(real["distribution"]) == {"smollm2", "smollm2-prerope"}
    assert set(real["scheme"]) == {"KV", "KQV", "QKQV", "RKV"} and set(real["dim"]) == {64}
    assert ledger["C2r"]["verdict"] in {"holds", "does not hold", "inconclusive"}
    assert ledger["C2r"]["estimate"] > 0
    # the end-to-end passes (real.e2e): their tables, figures and claims
    for name in ("summary", "comparisons", "equal_bits", "sensitivity", "agreement", "long_summary",
                 "long_positions", "passkey_summary", "query_bases/smollm2-135m"):
        suffix = "npz" if name.startswith("query_bases") else "parquet"
        assert (complete_run / f"results/real/e2e/{name}.{suffix}").is_file(), name
    for name in ("e2e_ppl_bits", "e2e_layer_sensitivity", "e2e_context"):
        assert (complete_run / f"results/figures/{name}.pdf").is_file(), name
    e2e = pd.read_parquet(complete_run / "results/real/e2e/summary.parquet")
    assert set(e2e["model"]) == {"smollm2-135m"}  # the tiny config runs the primary model only
    # every study and frontier real scheme, an extra scheme (llama.cpp's q4_0 type), the query-aware
    # QWF, a recent window and a causal variant
    assert set(e2e["scheme"]) == {"KV", "KQV", "QKQV", "RKV", "KQV-H", "QKQV-H", "CRKV", "SKLT", "GGML-Q0", "QWF",
                                  "RKV+R8", "KQV+C16"}
    assert set(e2e.loc[e2e["rope"] == "pre", "scheme"]) == {"KQV", "RKV", "RKV+R8", "KQV+C16"}  # every mode
    assert set(e2e.loc[e2e["scheme"] == "RKV", "budget"]) == {2, 4, 5}  # real.e2e.extra_budgets
    assert set(e2e.loc[e2e["scheme"] == "QWF", "budget"]) == {2, 4, 5}  # a query-aware variant's too
    study = e2e[e2e["scheme"].isin(["KV", "KQV", "QKQV", "RKV"]) & (e2e["budget"] == 2)]
    assert (study["ppl_ratio"] > 1).all()  # at two bits every study scheme hurts the model
    assert (e2e.loc[e2e["scheme"] == "RKV", "n_units"] == 2).all()  # (text, draw): one text, two draws
    assert (e2e.loc[e2e["scheme"] == "KV", "n_units"] == 1).all()  # KV draws nothing: one pass per text
    passkey = pd.read_parquet(complete_run / "results/real/e2e/passkey_summary.parquet")
    assert set(passkey["pass"]) == {"fp", "RKV@2", "QWF@2"} and (passkey["n"] > 0).all()
    for cid in ("C12e", "C2e", "C10e", "C22a", "C24b"):
        assert ledger[cid]["verdict"] in {"holds", "does not hold", "inconclusive"}, cid


def test_dag_builds_the_paper_pdf_with_its_numbers(complete_run):
    """The PDF the DAG built from the tiny grid: a plausible page count, and its text carries
    the generated numbers (claims estimates and verdicts, grid macros)."""
    import json
    import re
    import shutil

    from kvasym.render.format import sig_text

    missing = [tool for tool in ("latexmk", "pdflatex", "pdftotext", "pdfinfo") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"LaTeX/poppler TOOLS MISSING ({', '.join(missing)}): the DAG did NOT build the paper PDF "
                    "(apt-get install latexmk texlive-latex-recommended texlive-latex-extra "
                    "texlive-fonts-recommended poppler-utils)")
    pdf = complete_run / "paper/build/main.pdf"
    assert pdf.is_file(), "snakemake --cores 2 did not build paper/build/main.pdf"
    info = subprocess.run(["pdfinfo", str(pdf)], capture_output=True, text=True, check=True).stdout
    pages = int(re.search(r"^Pages:\s+(\d+)", info, re.M).group(1))
    # 41 pages measured for the tiny grid with the model-level tables of issue 31 (50 for the paper
    # grid before them)
    assert 10 <= pages <= 60, pages
    text = re.sub(r"\s+", " ", subprocess.run(["pdftotext", str(pdf), "-"], capture_output=True, text=True,
                                                check=True).stdout)
    ledger = json.loads((complete_run / "results/claims/claims.json").read_text())
    for claim in ledger:
        if claim.get("estimate") is not None:
            # the PDF prints the ledger's digits (a power of ten is typeset, so compare mantissas)
            # (a negative estimate is typeset with a minus sign, which pdftotext gives as U+2212)
            assert sig_text(claim["estimate"]).split("×")[0].replace("-", "\u2212") in text, claim["id"]
    assert "gaussian, t1.05, lowrank4" in text  # \DistributionList of the tiny grid
    for name in ("kl_ecdf", "jensen_bias", "shannon_phi_t"):  # every figure is the DAG's, not a placeholder
        assert f"figure {name} has not been generated" not in text
    assert "has not been generated" not in text


def test_report_opens_in_a_headless_browser(complete_run, tmp_path):
    """snakemake --report builds the HTML report, and it renders in Chromium: the claims ledger
    is embedded and every figure of a category decodes to an image."""
    from tools.report_check import check_report, find_browser

    complete_run = copy_run(complete_run, tmp_path / "report")

    proc = snakemake(complete_run, "--report", "results/report.html")
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = (complete_run / "results/report.html").read_text(encoding="utf-8")
    for expected in ("5. Claims", "6. Figures", "jensen_bias", "Theory checks"):
        assert expected in page
    if find_browser() is None:
        pytest.skip("CHROMIUM MISSING: the report was built but NOT opened in a browser (apt-get install chromium)")
    records = check_report(complete_run / "results/report.html", {"5. Claims": [], "6. Figures": ["Theory checks"]})
    views = {" > ".join(r["path"]): r for r in records}
    assert views["5. Claims > view:claims ledger"]["iframes"][0].startswith("data:text/html")
    for name in ("jensen_bias", "marginals", "theory_check"):
        images = views[f"6. Figures > Theory checks > view:{name}"]["images"]
        assert any(w > 500 and h > 300 for w, h in images), (name, images)


def test_every_file_the_run_wrote_is_an_output_its_rules_declare(complete_run):
    """Issue 48, point 1: a stage writes only what its rule declares (the rules' outputs come from
    the catalogue and the stages' flags from those outputs, kvasym.wiring.Wiring.stage_params): every
    file of results/ and paper/generated is a declared output, inside a declared folder output, or
    a job's declared log or benchmark file."""
    from kvasym.artifacts import BENCHMARKS_FOLDER, GENERATED_FOLDER, LOGS_FOLDER

    proc = subprocess.run([sys.executable, "-m", "snakemake", "--configfile", "config/test.yaml", "--summary"],
                          cwd=complete_run, capture_output=True, text=True, timeout=RUN_BOUND_S, env=run_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    declared = {line.split("\t")[0] for line in proc.stdout.splitlines()[1:] if line.strip()}
    folders = [d for d in declared if (complete_run / d).is_dir()]
    assert len(declared) > 100 and folders
    written = [p.relative_to(complete_run).as_posix() for top in ("results", GENERATED_FOLDER)
               for p in (complete_run / top).rglob("*") if p.is_file()]
    undeclared = [f for f in written
                  if f not in declared and not any(f.startswith(d.rstrip("/") + "/") for d in folders)
                  and not f.startswith((LOGS_FOLDER + "/", BENCHMARKS_FOLDER + "/"))]
    assert len(written) > 100 and undeclared == [], undeclared[:20]


def test_every_job_ran_blas_at_one_thread_and_its_workers_forked(complete_run):
    """Issue 49: a rule's threads are its job's worker processes (kvasym.workers), each at one
    BLAS thread. Snakemake exports OMP_NUM_THREADS and OPENBLAS_NUM_THREADS = the job's threads to
    its shell; the workflow's shell prefix sets them back to 1 (with them at 2, a job's reference
    pass changed in its last bits, its quantized passes far more, and its CPU grew fivefold).
    Every stage's log says what it ran with; the jobs of rules with several threads were given
    them as --workers (the tiny run has --cores 2)."""
    from kvasym.artifacts import LOGS_FOLDER
    from kvasym.resources import STAGE_THREADS

    logs = sorted((complete_run / LOGS_FOLDER).rglob("*.log"))
    heads = {log: log.read_text(encoding="utf-8").splitlines()[0] for log in logs if log.stat().st_size}
    stage_heads = {log: head for log, head in heads.items() if " stage " in head}
    assert len(stage_heads) > 40
    wrong = [f"{log.relative_to(complete_run)}: {head}" for log, head in stage_heads.items()
             if "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1" not in head]
    assert wrong == [], wrong[:5]
    proc = snakemake(complete_run, "--cores", "2", "--dry-run", "--forceall", "--printshellcmds")
    assert proc.returncode == 0, proc.stderr[-2000:]
    threaded = {rule for rule, n in STAGE_THREADS.items() if n > 1}
    commands = re.findall(r"kvasym stage (\S+) .*?--workers (\d+)", proc.stdout + proc.stderr)
    assert {stage for stage, _ in commands} >= threaded and all(n == "2" for _, n in commands)


def test_second_run_does_nothing(complete_run):
    proc = snakemake(complete_run, "--cores", "2", "--dry-run")
    assert proc.returncode == 0
    assert "Nothing to be done" in proc.stdout + proc.stderr


def test_adding_a_budget_reruns_every_unit_and_a_frontier_scheme_only_its_own(complete_run, tmp_path):
    """Issue 29: the unit of work is a (distribution, d) (rule cells; metrics for a query-model
    variant). A budget enters every unit, so every unit job reruns; a frontier scheme added on
    one distribution reruns that distribution's unit only (and what reads it), no other unit."""
    complete_run = copy_run(complete_run, tmp_path / "budgets")
    study = load_study_file(complete_run / "config/test.yaml")
    (complete_run / "more_budgets.yaml").write_text("budgets: [2, 3, 4]\n")
    proc = snakemake(complete_run, "--cores", "2", "--dry-run", "--configfile", "config/test.yaml", "more_budgets.yaml")
    assert proc.returncode == 0, proc.stderr
    counts = _rules_to_run(proc.stdout + proc.stderr)
    n_variants = len(list(study.data_cells())) - len(list(study.main_data_cells()))
    assert counts["cells"] == len(list(study.main_data_cells())) and counts["metrics"] == n_variants, counts
    schemes = [*study.frontier_schemes, "KIVI32"]
    (complete_run / "more_schemes.yaml").write_text(
        f"frontier: {{schemes: {schemes}, distributions_of: {{KIVI32: [gaussian]}}}}\n".replace("'", ""))
    proc = snakemake(complete_run, "--cores", "2", "--dry-run", "--configfile", "config/test.yaml", "more_schemes.yaml")
    assert proc.returncode == 0, proc.stderr
    counts = _rules_to_run(proc.stdout + proc.stderr)
    assert counts["cells"] == 1 and "metrics" not in counts, counts  # gaussian's unit only
    assert counts["stats"] == 1 and counts["theory"] == 1 and counts["frontier"] == 1, counts


def test_changing_extra_budgets_reruns_only_the_frontier_units_it_adds_cells_to(complete_run, tmp_path):
    """Issue 31, point 7: frontier.extra_budgets enters the slices of the units it adds cells to,
    and no other. A frontier scheme's extra budget reruns its own distributions' units (KQV-NS:
    gaussian), a grid scheme's every frontier unit (RKV: gaussian, t1.05, lowrank4); with them
    what reads their folders (their stats and theory jobs, lowrank4's query-model variant, whose
    input is lowrank4's packed folder: their inputs' contents unchanged) and the frontier."""
    complete_run = copy_run(complete_run, tmp_path / "extra")
    study = load_study_file(complete_run / "config/test.yaml")
    assert [d for d, _ in study.frontier_data_cells()] == ["gaussian", "t1.05", "lowrank4"]
    assert list(study.query_variants) == ["lowrank4+isotropic"]
    for extra, units, variants in (("{KQV-NS: [3]}", 1, 0), ("{RKV: [5, 6]}", 3, 1)):
        (complete_run / "extra.yaml").write_text(f"frontier: {{extra_budgets: {extra}}}\n")
        proc = snakemake(complete_run, "--cores", "2", "--dry-run", "--configfile", "config/test.yaml", "extra.yaml")
        assert proc.returncode == 0, proc.stderr
        counts = _rules_to_run(proc.stdout + proc.stderr)
        assert (counts["cells"], counts.get("metrics", 0), counts["frontier"]) == (units, variants, 1), (extra, counts)
        assert (counts["stats"], counts["theory"]) == (units + variants, units), (extra, counts)


def _rules_to_run(out: str) -> dict[str, int]:
    """The job counts of a dry run's table (rule name -> count), without the total."""
    counts = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit() and parts[0] not in ("total", "all"):
            counts[parts[0]] = int(parts[1])
    return counts


@pytest.mark.parametrize(
    "edited, expected",
    [
        # reproduce follows the tables and figures (it sums their benchmark: files); the crate
        # follows every output (it lists each file with its hash)
        ("kvasym/templates/table_results.tex.j2", {"tables", "reproduce", "paper", "crate"}),
        ("kvasym/templates/reproduce.tex.j2", {"reproduce", "paper", "crate"}),
        ("kvasym/render/figures/_style.py", {"figure_"}),
        # one family's module: that family's job alone (its own code digest), and what lists it
        ("kvasym/render/figures/kl_ecdf.py", {"figure_kl_ecdf", "reproduce", "paper", "crate"}),
        ("kvasym/render/claims.py", {"claims", "tables", "numbers", "reproduce", "paper", "crate"}),
        ("kvasym/render/crate.py", {"crate"}),
        # issue 48, point 3: a comment and a docstring are not code (kvasym.stages.normalized_code)
        ("kvasym/metrics.py#comment", set()),
    ],
)
def test_editing_code_reruns_the_stages_that_run_it_and_only_them(complete_run, tmp_path, edited, expected):
    """Issue 18, class 5: the code a stage runs decides whether it reruns (before, editing the
    library, a figure or a template left every result stale); an edit of a module's comments or
    docstrings reruns nothing."""
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    edited, _, kind = edited.partition("#")
    text = (src / edited).read_text(encoding="utf-8")
    if kind == "comment":  # the module docstring reworded, a comment and blank lines added
        text = text.replace('"""', '"""Reworded. ', 1) + "\n\n# an edit\n"
    else:
        text += "\n" if edited.endswith(".j2") else "\n_EDITED_FOR_A_TEST = 1\n"
    (src / edited).write_text(text, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(src)}
    cmd = [sys.executable, "-m", "snakemake", "--configfile", "config/test.yaml", "--dry-run", "--quiet", "rules"]
    proc = subprocess.run(cmd, cwd=complete_run, capture_output=True, text=True, timeout=RUN_BOUND_S, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rules = set(_rules_to_run(proc.stdout + proc.stderr))
    paper = {"paper"} if (complete_run / "paper/build/main.pdf").exists() else set()
    if expected == {"figure_"}:
        after = paper | {"reproduce", "crate", "card_page"}
        assert rules and all(r.startswith("figure_") or r in after for r in rules), rules
        assert "card_page" in rules  # the tiny config has the card
        assert rules - after == {r for r in rules if r.startswith("figure_")} and len(rules - after) >= 9
    else:
        assert rules == (expected - {"paper"}) | (paper & expected), rules


@pytest.mark.parametrize(
    "edited, old, new, expected",
    [
        # a scheme's description reaches the scheme table (rule tables' params) and no slice
        ("src/kvasym/schemes.py", "no QJL (TurboQuant_mse as deployed)", "no QJL (reworded)",
         {"tables", "reproduce", "paper", "crate"}),
        # a memory request or a thread count changes no result
        ("src/kvasym/resources.py", '"tables": (1000, 5)', '"tables": (1100, 5)', set()),
        ("src/kvasym/resources.py", '"card": 8,', '"card": 6,', set()),
        # an artifact moved: its writer (frontier), the stages that read it (e2e_stats, the
        # figures: one stage, so every family; the tables, the crate) and what follows them
        ("src/kvasym/artifacts.py", 'f"{_R}/frontier/points.parquet"', 'f"{_R}/frontier/points_v2.parquet"',
         {"frontier", "e2e_stats", "figure_", "card_page", "claims", "tables", "reproduce", "paper", "crate"}),
        # a model's entry (its display name): that model's jobs (their params hold it), the
        # stages that print every model, and what follows them; no synthetic job
        ("src/kvasym/real/model_registry.py", 'name="SmolLM2-135M"', 'name="SmolLM2 135M"',
         {"calibrate", "e2e", "e2e_join", "e2e_long", "passkey", "greedy", "sensitivity", "card", "card_page",
          "e2e_stats", "gather", "figure_", "claims", "tables", "numbers", "reproduce", "paper", "crate"}),
        # a figure's caption is the paper's text: the paper, and the crate that lists its PDF
        ("paper/sections/claims.tex", r"\kvfigure{kl_ecdf}{Empirical distribution functions",
         r"\kvfigure{kl_ecdf}{The empirical distribution functions", {"paper", "crate"}),
    ],
    ids=["scheme-description", "memory-request", "threads", "artifact-path", "model-entry", "figure-caption"],
)
def test_editing_one_registry_entry_reruns_the_jobs_that_read_it(complete_run, tmp_path, edited, old, new, expected):
    """Issue 48, point 3: a registry entry's edit reruns the jobs whose slice, params or files it
    changes (kvasym.stages._registries). Before, each of the first five reran every job of the
    tiny DAG (69 to 75); the paper's text reran the paper and the crate already."""
    run = copy_run(complete_run, tmp_path / "run")
    shutil.copytree(ROOT / "src", run / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    path = run / edited
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(run / "src")}
    cmd = [sys.executable, "-m", "snakemake", "--configfile", "config/test.yaml", "--dry-run", "--quiet", "rules"]
    proc = subprocess.run(cmd, cwd=run, capture_output=True, text=True, timeout=RUN_BOUND_S, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rules = set(_rules_to_run(proc.stdout + proc.stderr))
    if not (run / "paper/build/main.pdf").exists():
        expected = expected - {"paper"}
    if "figure_" in expected:  # every figure family of the tiny config
        families = {r for r in rules if r.startswith("figure_")}
        assert "figure_frontier" in families and len(families) >= 9, families
        expected = (expected - {"figure_"}) | families
    assert rules == expected, (sorted(rules - expected), sorted(expected - rules))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"budgetz": [4]}, "budgetz"),
        ({"budgets": [9]}, "budgets"),
        ({"distributions": [{"name": "lr", "kind": "low_rank", "params": {"rank": 100}}]},
         "rank = 100 exceeds dim = 64"),
    ],
)
def test_invalid_config_stops_before_any_job(tmp_path, change, message):
    workdir = make_workdir(tmp_path / "bad")
    config = yaml.safe_load((workdir / "config/test.yaml").read_text())
    config.update(change)
    (workdir / "config/test.yaml").write_text(yaml.safe_dump(config))
    proc = snakemake(workdir, "--cores", "1")
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr
    assert not (workdir / "results").exists()


def test_duplicated_key_in_a_configfile_is_refused(tmp_path):
    """YAML readers keep the last of two equal keys; the workflow names the key and the file."""
    workdir = make_workdir(tmp_path / "dup")
    (workdir / "dup.yaml").write_text("budgets: [2]\nbudgets: [4]\n")
    proc = snakemake(workdir, "--cores", "1", "--dry-run", "--configfile", "config/test.yaml", "dup.yaml")
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "dup.yaml" in out and "duplicate key 'budgets'" in out
    assert not (workdir / "results").exists()


def test_a_paper_using_a_table_no_rule_makes_stops_before_any_job(tmp_path):
    """Issue 48, point 4: the paper's inputs are read from its TeX; a \\kvtable or \\kvfigure
    that names no table of kvasym.render.tables.TABLES (nor figure of the registry) is an error
    at parse time, naming the name and the line, not a placeholder box in a PDF."""
    workdir = make_workdir(tmp_path / "typo")
    section = workdir / "paper/sections/endtoend.tex"
    section.write_text(section.read_text() + "\n\\kvtable{modles}\n\\kvfigure{e2e_paretto}{x}\n")
    proc = snakemake(workdir, "--cores", "1", "--dry-run")
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "table 'modles' (used at sections/endtoend.tex:" in out
    assert "figure 'e2e_paretto'" in out
    assert not (workdir / "results").exists()
