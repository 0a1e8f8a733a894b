"""Issue 18 (reliability, second pass): regression tests for inputs that used to give a
traceback or a silently wrong result. Each test failed before its fix."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml
from snakemake_workdir import ROOT, make_workdir, snakemake

from kvasym.claims import load_claims
from kvasym.cli import main
from kvasym.errors import KvasymError
from kvasym.render.figures.registry import figures_slice
from kvasym.stages.figure import run_figures
from kvasym.stages.theory import run_theory
from kvasym.study import load_study
from kvasym.manifest import write_manifest
from cell_files import one_cell, one_unit

TINY = yaml.safe_load((ROOT / "config/test.yaml").read_text())


def test_per_key_trials_zero_writes_an_empty_per_key_table(tmp_path):
    """(3) A documented-valid value: no per-key rows, an empty table of the right schema, theory
    without a Jensen slope, and a Jensen figure that says it has nothing to draw; it used to
    kill every metrics job with a pyarrow traceback."""
    study = load_study({**TINY, "per_key_trials": 0, "trials": 2, "seq_len": 32, "n_queries": 4})
    cell = one_cell(study, "gaussian", 64, "KQV", 4, tmp_path)
    data, per_query, per_key, theory = cell.manifest, cell.per_query, cell.per_key, tmp_path / "th.parquet"
    keys = pd.read_parquet(per_key)
    assert len(keys) == 0 and {"distribution", "scheme", "key"} <= set(keys.columns)
    assert str(pq.read_schema(per_key).field("distribution").type) == "string"
    assert len(pd.read_parquet(per_query)) == 2 * 4 * 2  # 2 trials x 4 queries x 2 sharpness values
    run_theory(study.theory_slice("gaussian", 64), data, [per_key], theory)
    checks = set(pd.read_parquet(theory)["check"])
    assert checks == {"qjl_vs_residual", "qjl_vs_nbit", "hadamard_vs_residual", "hadamard_vs_nbit",
                      "ks_beta", "haar_vs_residual", "haar_vs_nbit", "ks_beta_haar"}  # no slope without per-key rows
    # stage gather's Jensen bins of no per-key rows: an empty table, which the figure says it cannot draw
    from kvasym.stages.gather import write_display

    sl = figures_slice(study)
    bins = tmp_path / "jensen_bins.parquet"
    write_display([], [per_key], sl, {"out_jensen_bins": bins})
    assert len(pd.read_parquet(bins)) == 0
    written = run_figures(sl, {"jensen_bins": bins, "theory": theory}, tmp_path / "f", ["jensen_bias"])
    assert sorted(p.name for p in written) == ["jensen_bias.caption.tex", "jensen_bias.pdf", "jensen_bias.png"]
    assert "nothing to show" in (tmp_path / "f" / "jensen_bias.caption.tex").read_text()


@pytest.mark.parametrize("command", ["quantize", "dequantize"])
def test_the_cli_refuses_to_overwrite_its_input(tmp_path, capsys, command):
    """(10) The output named as the input used to replace it (atomically, but still lost)."""
    keys = tmp_path / "k.npy"
    np.save(keys, np.random.default_rng(0).standard_normal((8, 16)))
    packed = tmp_path / "k.npz"
    assert main(["quantize", "--scheme", "KQV", "--bits", "4", "--side", "K", str(keys), str(packed)]) == 0
    target = keys if command == "quantize" else packed
    before = hashlib.sha256(target.read_bytes()).hexdigest()
    args = (["quantize", "--scheme", "KQV", "--bits", "4", "--side", "K", str(keys), str(keys)]
            if command == "quantize" else ["dequantize", str(packed), str(tmp_path / "." / "k.npz")])
    assert main(args) == 2
    assert "is the input" in capsys.readouterr().err
    assert hashlib.sha256(target.read_bytes()).hexdigest() == before


@pytest.mark.parametrize("text", ["KQV ≥ QKQV", "ratio 2π", "tab\there"])
def test_a_claim_text_the_pdf_cannot_typeset_is_refused(tmp_path, text):
    """(11) A non-ASCII statement used to pass validation and stop the PDF build."""
    data = yaml.safe_load((ROOT / "config/claims.test.yaml").read_text())
    data["claims"][1]["statement"] = text
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    with pytest.raises(KvasymError) as info:
        load_claims(path)
    message = str(info.value)
    odd = next(c for c in text if not (c.isascii() and c.isprintable()))
    assert f"claim {data['claims'][1]['id']}: key claims[1].statement: must be printable ASCII" in message
    assert f"got {text!r}: the character {odd!r} (U+{ord(odd):04X}) at position {text.index(odd)}" in message
    assert "\n" not in message


def test_a_configfile_is_the_whole_config_and_the_run_prints_it(tmp_path):
    """(2) `--configfile` used to merge onto config/config.yaml, so left-out keys took the
    paper's values (seed 20261130, 1024 keys, 32 trials, real rows on), not the documented
    defaults. Now the given file is the whole config and every run prints its effective config."""
    workdir = make_workdir(tmp_path / "w")
    minimal = {"dims": [16], "budgets": [2], "schemes": ["KV", "KQV"], "claims_file": "config/claims.test.yaml",
               "distributions": [{"name": "gaussian", "kind": "gaussian"}]}
    (workdir / "minimal.yaml").write_text(yaml.safe_dump(minimal))
    proc = snakemake(workdir, "-n", "--quiet", "rules", configfile="minimal.yaml", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stderr.splitlines() if x.startswith("kvasym: config from"))
    assert "minimal.yaml" in line and "config/config.yaml" not in line
    effective = json.loads(line.split("effective config: ", 1)[1])
    schema_defaults = {"base_seed": 0, "seq_len": 256, "n_queries": 32, "trials": 8, "per_key_trials": 2}
    assert {k: effective[k] for k in schema_defaults} == schema_defaults
    assert "real" not in effective or effective["real"] in (None, "off")
    assert "capture" not in proc.stdout  # no real rows: the paper's real: section is not inherited


@pytest.mark.parametrize(
    "low, high, why",
    [(float("nan"), 2.0, "has no interval"), (1.5, float("nan"), "has no interval"), (1.7, 1.7, "zero-width")],
)
def test_a_degenerate_interval_is_inconclusive_not_the_estimates_verdict(low, high, why):
    """(4) A NaN bound (a replicate dividing by zero, a single cluster) or a zero-width interval
    (one trial) used to fall back to the point estimate, which then 'held'."""
    from kvasym.claims import HOLDS, INCONCLUSIVE, Measurement, verdict

    rule = {"op": ">", "value": 1.0}
    result, reason = verdict(Measurement(1.7, low, high, details={"n_trials": 1}, interval=True), rule)
    assert result == INCONCLUSIVE and why in reason
    # a statistic without an interval by design is still decided on its estimate
    assert verdict(Measurement(1.7), rule)[0] == HOLDS
    assert verdict(Measurement(1.7, 1.2, 2.2, interval=True), rule)[0] == HOLDS


def test_a_jensen_slope_from_one_trial_is_inconclusive():
    """The tiny grid's C9 (per_key_trials: 1) used to 'hold' on its point estimate alone."""
    from kvasym.claims import INCONCLUSIVE, Tables, evaluate_claims

    theory = pd.DataFrame([{"distribution": "g", "kind": "gaussian", "dim": 16, "check": "jensen_slope",
                            "scheme": "QKQV", "budget": 4, "sharpness": 1.0, "estimate": 0.54, "low": float("nan"),
                            "high": float("nan"), "theory": float("nan"), "statistic": 0.3, "p": float("nan"),
                            "n": 100.0}])
    claim = {"id": "C9", "statement": "s", "statistic": "theory", "holds_if": {"op": ">", "value": 0.0},
             "where": {"check": "jensen_slope", "distribution": "g", "dim": 16, "budget": 4, "scheme": "QKQV",
                       "sharpness": 1.0}}
    empty = pd.DataFrame()
    (result,) = evaluate_claims([claim], Tables(comparisons=empty, summary=empty, trials=empty, theory=theory))
    assert result["verdict"] == INCONCLUSIVE and "has no interval" in result["reason"]


def test_capture_names_shipped_texts_independent_of_the_install_path(tmp_path, capsys):
    """The capture rule used to pass the text's absolute path inside the installed package: the
    same checkout installed elsewhere changed the param and reran every capture. It now passes
    the text's name (stage capture --shipped NAME); an unknown name is refused."""
    assert main(["stage", "capture", "--shipped", "no_such_text", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "--shipped: no shipped text 'no_such_text'; shipped: " in err and "bicycle_repair" in err
    rule = (ROOT / "workflow/rules/real.smk").read_text()
    assert "shipped=wiring.real_texts" in rule and "TEXTS_DIR" not in rule  # names: --shipped NAME...


@pytest.mark.parametrize("dim, bits", [(3, 2), (4, 8), (64, 4), (128, 3), (1024, 8), (16384, 4)])
def test_centroid_defects_confirm_the_solver_independently(dim, bits):
    """numpy-only Gauss-Legendre cell means (x = sin theta) against the scipy-based solver."""
    from kvasym.codebook import TOLERANCE, centroid_defects, compute_codebook

    book = compute_codebook(dim, bits)
    c, t = np.asarray(book.centroids), np.asarray(book.thresholds)
    assert centroid_defects(c, t, dim).max() < TOLERANCE  # both agree to the solver's tolerance
    moved = c.copy()
    moved[len(c) // 2] += 1e-5 / np.sqrt(dim)
    assert centroid_defects(moved, t, dim)[len(c) // 2] == pytest.approx(1e-5, rel=1e-3)


def test_a_tampered_codebook_cache_entry_is_recomputed_not_used(tmp_path, monkeypatch, capsys):
    """(6) A plausible edit of the on-disk codebook cache used to be trusted (KL moved ~10x)."""
    from kvasym import codebook

    monkeypatch.setenv("KVASYM_CACHE_DIR", str(tmp_path))
    codebook._cached_codebook.cache_clear()
    try:
        good = codebook.lloyd_max_codebook(64, 4)
        (path,) = (tmp_path / "codebooks").glob("beta_lloyd_max_*_d64_b4.json")
        data = json.loads(path.read_text())
        # a plausible edit: centroids shrunk by 10%, thresholds kept at their midpoints
        data["centroids"] = [0.9 * c for c in data["centroids"]]
        data["thresholds"] = [0.5 * (a + b) for a, b in zip(data["centroids"][:-1], data["centroids"][1:])]
        path.write_text(json.dumps(data))
        codebook._cached_codebook.cache_clear()
        again = codebook.lloyd_max_codebook(64, 4)
        assert np.array_equal(again.centroids, good.centroids)
        assert "sigma from its cell's mean" in capsys.readouterr().err
        assert json.loads(path.read_text())["centroids"] == list(map(float, good.centroids))  # repaired
    finally:
        codebook._cached_codebook.cache_clear()


@pytest.mark.parametrize(
    "distribution, message",
    [
        ({"name": "o", "kind": "concentrated", "params": {"n_outliers": 2, "outlier_scale": 1e300}},
         "distributions[1].params.outlier_scale"),
        ({"name": "l", "kind": "low_rank", "params": {"rank": 4, "noise": 1e300}}, "distributions[1].params.noise"),
    ],
)
def test_scales_that_overflow_are_refused_naming_the_key(distribution, message):
    """(8) outlier_scale or noise of 1e300 validated, then overflowed while the DAG was built
    (squaring it to rank the facet distributions), naming no key."""
    config = {**TINY, "distributions": [{"name": "gaussian", "kind": "gaussian"}, distribution]}
    with pytest.raises(KvasymError) as info:
        load_study(config)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_job_that_cannot_fit_is_refused_before_any_job(monkeypatch):
    """(8) seq_len x dims under the per-matrix guard (2^31 entries) but a job needing ~150 GB in
    all used to be accepted and killed mid-run."""
    config = {**TINY, "seq_len": 10_000_000, "dims": [128], "n_queries": 4, "headline": {}}  # 1.28e9 per matrix
    with pytest.raises(KvasymError, match=r"a metrics job would need about \d+ GiB .* more than 65536 MB"):
        load_study(config)
    monkeypatch.setenv("KVASYM_MAX_JOB_MEM_MB", str(10**9))
    assert load_study(config).seq_len == 10_000_000  # a machine that has it may say so
    monkeypatch.setenv("KVASYM_MAX_JOB_MEM_MB", "lots")
    with pytest.raises(KvasymError, match="KVASYM_MAX_JOB_MEM_MB must be a positive integer"):
        load_study(config)


def test_seq_len_one_is_refused_naming_the_key():
    """(8) seq_len 1 validated, then every stats job died: over one key every attention weight
    is 1, every KL is 0 and no ratio between schemes exists."""
    with pytest.raises(KvasymError, match="seq_len") as info:
        load_study({**TINY, "seq_len": 1})
    assert "\n" not in str(info.value)
    assert load_study({**TINY, "seq_len": 2}).seq_len == 2


def test_seq_len_two_runs_to_a_ledger_with_undefined_slopes(tmp_path):
    """(8) seq_len 2 left too few per-key points for any Jensen slope, so the theory table had no
    jensen_slope rows and the claims stage died on 'unknown check'. The rows now say the slope
    is undefined and the claim on it is inconclusive."""
    from kvasym.claims import INCONCLUSIVE, Tables, evaluate_claims

    study = load_study({**TINY, "seq_len": 2, "trials": 2, "n_queries": 4})
    theory = tmp_path / "th.parquet"
    cells = one_unit(study, "gaussian", 64, tmp_path, schemes=list(study.schemes), budgets=[4])
    data = cells[next(iter(study.schemes)), 4].manifest
    per_key = [cells[scheme, 4].per_key for scheme in study.schemes]
    run_theory(study.theory_slice("gaussian", 64), data, per_key, theory)
    frame = pd.read_parquet(theory)
    for check in ("jensen_slope", "jensen_slope_adjusted", "jensen_slope_norm"):  # every scheme, beside 1/2
        slopes = frame[frame["check"] == check]
        assert len(slopes) == len(study.schemes) * len(study.sharpness)
        assert slopes["estimate"].isna().all() and (slopes["n"] < 3).all() and (slopes["theory"] == 0.5).all()
    claim = {"id": "C9", "statement": "s", "statistic": "theory", "holds_if": {"op": ">", "value": 0.0},
             "where": {"check": "jensen_slope", "distribution": "gaussian", "dim": 64, "budget": 4,
                       "scheme": "QKQV", "sharpness": 1.0}}
    empty = pd.DataFrame()
    (result,) = evaluate_claims([claim], Tables(comparisons=empty, summary=empty, trials=empty, theory=frame))
    assert result["verdict"] == INCONCLUSIVE and "the estimate is undefined" in result["reason"], result


def test_a_theory_check_without_rows_is_not_evaluated_not_an_error():
    """(3) per_key_trials 0 gives no Jensen rows at all: the claims stage died on 'theory check
    jensen_slope does not exist'. A known check without rows is 'not evaluated'; a typo still fails."""
    from kvasym.claims import NOT_EVALUATED, Tables, evaluate_claims

    theory = pd.DataFrame([{"distribution": "g", "kind": "gaussian", "dim": 16, "check": "ks_beta", "scheme": "",
                            "budget": -1, "sharpness": float("nan"), "estimate": 0.1, "low": float("nan"),
                            "high": float("nan"), "theory": float("nan"), "statistic": 0.1, "p": 0.5, "n": 9.0}])
    where = {"check": "jensen_slope", "distribution": "g", "dim": 16, "budget": 4, "scheme": "QKQV", "sharpness": 1.0}
    claim = {"id": "C9", "statement": "s", "statistic": "theory", "holds_if": {"op": ">", "value": 0.0},
             "where": where}
    empty = pd.DataFrame()
    tables = Tables(comparisons=empty, summary=empty, trials=empty, theory=theory)
    (result,) = evaluate_claims([claim], tables)
    assert result["verdict"] == NOT_EVALUATED, result
    with pytest.raises(KvasymError, match="theory check 'jensen_slop' does not exist"):
        evaluate_claims([{**claim, "where": {**where, "check": "jensen_slop"}}], tables)


def test_a_ratio_over_a_zero_statistic_is_nan_in_the_stats_tables():
    """A lossless cell (KL 0 everywhere) killed the stats job; the stage asks for NaN instead,
    which claims read as inconclusive. The library default still refuses."""
    from kvasym import stats

    a, b = [np.array([0.1, 0.2]), np.array([0.3, 0.1])], [np.zeros(2), np.zeros(2)]
    ci = stats.bootstrap_ratio_ci(a, b, n_boot=50, base_seed=1, identity=("x",), undefined="nan")
    assert np.isnan([ci["estimate"], ci["low"], ci["high"]]).all() and ci["stat_b"] == 0.0
    with pytest.raises(KvasymError, match="the ratio is undefined"):
        stats.bootstrap_ratio_ci(a, b, n_boot=50, base_seed=1, identity=("x",))
    with pytest.raises(KvasymError, match="undefined must be 'raise' or 'nan'"):
        stats.bootstrap_ratio_ci(a, b, n_boot=50, base_seed=1, identity=("x",), undefined="zero")


def test_a_hand_edited_data_manifest_statistic_is_refused_and_moved_aside(small_data, tmp_path, capsys):
    """A data manifest's per-trial statistics had no digest of their own: tail_index edited
    to 99.0 by hand was accepted silently (load_manifest checked only the trial digests) and
    flowed into the paper's cache-statistics table. The manifest now carries content_sha256; an
    edit is a DamagedFile, which the stage command moves aside so the data rule rebuilds it."""
    from kvasym.errors import DamagedFile
    from kvasym.manifest import content_digest, load_manifest, read_manifest
    from kvasym.study import canonical_json

    study, slice_, path = small_data
    manifest = read_manifest(path)
    assert manifest["content_sha256"] == content_digest(manifest)
    assert len(load_manifest(path, slice_)) == 2
    # deterministic: the same bytes from a second build, a digest independent of key order
    again = tmp_path / "again.json"
    write_manifest(dict(reversed(list(slice_.items()))), again)
    assert again.read_bytes() == path.read_bytes()
    assert content_digest(dict(reversed(list(manifest.items())))) == manifest["content_sha256"]

    edited = json.loads(path.read_text())
    assert edited["trials"][0]["keys"]["tail_index"] != 99.0
    edited["trials"][0]["keys"]["tail_index"] = 99.0
    path.write_text(json.dumps(edited, indent=1, sort_keys=True) + "\n")
    for read in (lambda: read_manifest(path), lambda: load_manifest(path, slice_)):
        with pytest.raises(DamagedFile, match=r"d64\.json: .*its content does not match its digest \(edited"):
            read()
    # what the Snakemake rule runs: exit 2, one line, and the manifest moved aside to be rebuilt
    code = main(["stage", "theory", "--slice", canonical_json(study.theory_slice("gaussian", 64)),
                 "--data", str(path), "--per-key", str(tmp_path / "none.parquet"),
                 "--out", str(tmp_path / "t.parquet")])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and "does not match its digest" in last and "Traceback" not in last, last
    assert last.endswith("moved aside to .d64.json.damaged; rerun and the rule that writes it rebuilds it"), last
    assert not path.exists() and path.with_name(".d64.json.damaged").is_file()
    assert not (tmp_path / "t.parquet").exists()


def test_a_stale_or_old_format_data_manifest_is_damaged_not_a_dead_end(small_data, tmp_path):
    """A manifest made for another config slice raised a plain KvasymError ("rerun the data
    rule"), so the stage never moved it aside and every run failed on it again; an old-format
    manifest (no content digest) was accepted. Both are now DamagedFile (rebuilt)."""
    from kvasym.errors import DamagedFile
    from kvasym.manifest import DATA_FORMAT, load_manifest, read_manifest

    _, slice_, path = small_data
    with pytest.raises(DamagedFile, match=r"made for another config slice \(differs in seq_len\)"):
        load_manifest(path, {**slice_, "seq_len": 33})
    manifest = json.loads(path.read_text())
    old = {k: v for k, v in manifest.items() if k != "content_sha256"}
    path.write_text(json.dumps({**old, "format": DATA_FORMAT - 1}))
    for read in (lambda: read_manifest(path), lambda: load_manifest(path, slice_)):
        with pytest.raises(DamagedFile, match=rf"data manifest of format {DATA_FORMAT - 1}, not {DATA_FORMAT}"):
            read()
    path.write_text(json.dumps(old))
    with pytest.raises(DamagedFile, match="data manifest without its digest"):
        load_manifest(path, slice_)


@pytest.mark.parametrize("case", ["where_typo", "missing"])
def test_a_bad_or_missing_claims_file_stops_the_workflow_when_it_loads(tmp_path, case):
    """A claims file with a typo in a `where` reached the user inside a Snakemake
    InputFunctionException with a Traceback block (it was first read in the numbers rule's param
    function); a missing one let any run not needing the ledger say all was fine (exit 0, and
    "Nothing to be done" with the old ledger kept when the results were up to date). Both now stop
    Snakemake as it loads, with one `invalid config: claims_file:` line naming the file."""
    workdir = make_workdir(tmp_path / "wd")
    if case == "where_typo":
        text = (workdir / "config/claims.test.yaml").read_text()
        assert "check: qjl_vs_residual, budget: 4" in text
        (workdir / "config/claims.typo.yaml").write_text(
            text.replace("check: qjl_vs_residual, budget: 4", "check: qjl_vs_residual, budgte: 4"))
        claims, targets = "config/claims.typo.yaml", ()  # the default target: the numbers rule too
        problem = "claim C1a: unknown key(s): claims[0].where.budgte; allowed: a, against, all_sharpness"
    else:
        claims, targets = "config/nope.yaml", ("results/data/gaussian/d64.json",)  # needs no ledger
        problem = "no such file"
    (workdir / "bad.yaml").write_text(yaml.safe_dump({**TINY, "claims_file": claims}, sort_keys=False))
    proc = snakemake(workdir, "-n", *targets, configfile="bad.yaml", timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert f"invalid config: claims_file: {claims}: {problem}" in out, out[-3000:]
    assert "Traceback" not in out and "InputFunctionException" not in out, out[-3000:]


def test_a_file_of_another_cell_is_refused_by_itself_when_the_dag_says_where_it_belongs(tmp_path):
    """Two per-cell files holding the same cell were refused naming both, forever: the stage could
    not tell which one was misfiled. Given the cell each path is filed under (the rules pass it),
    the misfiled file itself is a DamagedFile, which kvasym stage moves aside to be rebuilt."""
    from kvasym.cells import parse_cells, read_cell_tables
    from kvasym.errors import DamagedFile

    paths = []
    for scheme in ("KV", "KQV"):
        path = tmp_path / f"{scheme}.parquet"
        pd.DataFrame({"distribution": ["g"] * 2, "dim": [16] * 2, "scheme": [scheme] * 2,
                      "budget": np.array([4, 4], dtype=np.int32)}).to_parquet(path)
        paths.append(path)
    cells = parse_cells('[{"scheme": "KV", "budget": 4}, {"scheme": "KQV", "budget": 4}]', "cells")
    assert len(read_cell_tables(paths, "per-query", ("scheme", "budget"), cells=cells, distribution="g", dim=16)) == 4
    paths[1].write_bytes(paths[0].read_bytes())  # KV's table copied over KQV's
    with pytest.raises(DamagedFile) as info:
        read_cell_tables(paths, "per-query", ("scheme", "budget"), cells=cells, distribution="g", dim=16)
    assert info.value.path == str(paths[1])
    assert "holds scheme = 'KV' but is filed under scheme = 'KQV'" in str(info.value)
    with pytest.raises(KvasymError, match="2 per-query files but 1 cells"):
        read_cell_tables(paths, "per-query", ("scheme", "budget"), cells=cells[:1])
    with pytest.raises(KvasymError, match="--cells must be a JSON list of objects"):
        parse_cells('{"scheme": "KV"}', "cells")
