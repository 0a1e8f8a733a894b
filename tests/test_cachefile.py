"""Bring-your-own caches (kvasym.cachefile): the documented layout in every format, the metrics of
a file cell against a brute-force reference (GQA mapping, causal mask of the last T_q positions),
the query rule of files without queries, and a `file` distribution through the real DAG.

Malformed files are in tests/test_bad_inputs.py (CLI_REJECTED, rows ``cache_*``)."""

from __future__ import annotations

import hashlib
import json
import math
import os

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml
from safetensors.numpy import save_file
from cell_files import FLOAT32_RTOL
from snakemake_workdir import make_workdir, snakemake

from kvasym.cachefile import (
    evaluate_cache_file,
    inspect_cache_file,
    keys_family_queries,
    load_cache_file,
)
from kvasym.evaluate import quantize_pair
from kvasym.schemes import get_scheme
from kvasym.study import load_study_file

RNG = np.random.default_rng(11)
K = RNG.standard_normal((2, 2, 20, 8))
V = RNG.standard_normal((2, 2, 20, 8))
Q = RNG.standard_normal((2, 6, 12, 8))  # 3 query heads per KV head; the last 12 of 20 positions


def test_every_format_and_rank_reads_the_same_cache(tmp_path):
    np.savez(tmp_path / "a.npz", k=K, v=V)
    np.savez(tmp_path / "long.npz", keys=K, values=V)
    save_file({"k": K, "v": V}, str(tmp_path / "a.safetensors"))
    np.save(tmp_path / "a.npy", np.stack([K, V]))
    for name in ("a.npz", "long.npz", "a.safetensors", "a.npy"):
        cache = load_cache_file(tmp_path / name)
        np.testing.assert_array_equal(cache.keys, K)
        np.testing.assert_array_equal(cache.values, V)
        assert cache.queries is None and cache.layers.tolist() == [0, 1]
        layout = inspect_cache_file(tmp_path / name)
        assert (layout.n_layers, layout.n_kv_heads, layout.n_positions, layout.head_dim) == (2, 2, 20, 8)
    # lower ranks are one layer / one head
    np.savez(tmp_path / "r3.npz", k=K[1], v=V[1])
    np.savez(tmp_path / "r2.npz", k=K[1, 0], v=V[1, 0])
    np.testing.assert_array_equal(load_cache_file(tmp_path / "r3.npz").keys, K[1:2])
    np.testing.assert_array_equal(load_cache_file(tmp_path / "r2.npz").keys, K[1:2, :1])


def test_header_inspection_does_not_read_the_data(tmp_path, monkeypatch):
    np.savez(tmp_path / "a.npz", k=K, v=V, q=Q)
    monkeypatch.setattr(np, "load", lambda *a, **k: pytest.fail("inspect_cache_file read the arrays"))
    layout = inspect_cache_file(tmp_path / "a.npz")
    assert (layout.n_query_heads, layout.n_query_positions) == (6, 12)


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max()
    e = np.exp(z)
    return e / e.sum()


def test_file_cell_metrics_match_a_brute_force_reference(tmp_path):
    """KL of every (query head, position) of one (layer, KV head), rebuilt by hand: query head g
    reads KV head g // 3, query row i sits at position 8 + i and sees keys 0..8+i, logits
    q.k/sqrt(d) at sharpness 1."""
    np.savez(tmp_path / "c.npz", k=K, v=V, q=Q, layers=np.array([5, 9]))
    cache = load_cache_file(tmp_path / "c.npz")
    scheme = get_scheme("QKQV")
    columns, trial_map = evaluate_cache_file(cache, scheme, 3, name="mine", base_seed=4, n_queries=99,
                                             sharpness=[2.0, 8.0])
    assert [(t["layer"], t["kv_head"]) for t in trial_map] == [(5, 0), (5, 1), (9, 0), (9, 1)]
    assert set(columns["sharpness"].tolist()) == {1.0}, "own queries: the model's attention scale only"
    trial = 3  # layer 9, KV head 1: query heads 3, 4, 5
    packed = quantize_pair(K[1, 1], V[1, 1], scheme, 3, base_seed=4, identity=("mine", 9, 1))
    k_hat = packed["K"].dequantize("float64")
    expected = []
    for g in (3, 4, 5):
        for i in range(12):
            seen = 8 + i + 1
            q = Q[1, g, i]
            p = _softmax(K[1, 1, :seen] @ q / math.sqrt(8))
            p_hat = _softmax(k_hat[:seen] @ q / math.sqrt(8))
            expected.append(float(np.sum(p * (np.log(p) - np.log(p_hat)))))
    got = columns["kl"][columns["trial"] == trial]
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-15)
    # non-causal: every query sees all 20 keys
    columns, _ = evaluate_cache_file(cache, scheme, 3, name="mine", base_seed=4, n_queries=99, sharpness=[1.0],
                                     causal=False)
    q = Q[1, 4, 0]
    p, p_hat = _softmax(K[1, 1] @ q / math.sqrt(8)), _softmax(k_hat @ q / math.sqrt(8))
    assert columns["kl"][columns["trial"] == trial][12] == pytest.approx(float(np.sum(p * np.log(p / p_hat))), rel=1e-9)


def test_query_rule_of_files_without_queries():
    """Gaussian with the keys' mean and covariance: queries live in the keys' affine span, and
    after the study's rescaling each query's logits have standard deviation exactly 1."""
    rng = np.random.default_rng(0)
    basis = np.linalg.qr(rng.standard_normal((32, 3)))[0]
    keys = rng.standard_normal((50, 3)) @ basis.T  # rank 3, zero-mean subspace of R^32
    queries = keys_family_queries(keys, 400, np.random.default_rng(1))
    residual = queries - queries @ basis @ basis.T
    assert np.abs(residual).max() < 1e-10 * np.abs(queries).max()
    np.testing.assert_allclose(np.std(queries @ keys.T / math.sqrt(32), axis=1), 1.0, rtol=1e-12)
    # the unscaled draws have the keys' covariance: compare directions' second moment
    raw = keys_family_queries(keys, 20000, np.random.default_rng(2))
    unit = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    k_unit_cov = np.cov((keys @ basis).T)
    q_dir = unit @ basis
    # principal axis of the queries matches the keys' principal axis
    assert abs(np.linalg.eigh(np.cov(q_dir.T))[1][:, -1] @ np.linalg.eigh(k_unit_cov)[1][:, -1]) > 0.98
    np.testing.assert_array_equal(keys_family_queries(keys, 5, np.random.default_rng(3)),
                                  keys_family_queries(keys, 5, np.random.default_rng(3)))


def test_drawn_queries_do_not_depend_on_scheme_or_budget(tmp_path):
    """Paired design: the reference attention (queries, keys) of a file cell is the same for
    every scheme and budget, so their KLs differ only by the quantizer. With the identity
    scheme check: RKV and KQV share K quantization (rotated n-bit scalar), so their KL is equal."""
    np.savez(tmp_path / "c.npz", k=K, v=V)
    cache = load_cache_file(tmp_path / "c.npz")
    runs = {name: evaluate_cache_file(cache, get_scheme(name), 4, name="mine", base_seed=1, n_queries=16,
                                      sharpness=[1.0, 4.0])[0] for name in ("KQV", "RKV")}
    np.testing.assert_array_equal(runs["KQV"]["kl"], runs["RKV"]["kl"])
    assert not np.array_equal(runs["KQV"]["v_eps_dir"], runs["RKV"]["v_eps_dir"])
    assert sorted(set(runs["KQV"]["sharpness"].tolist())) == [1.0, 4.0]


def test_run_file_metrics_checks_the_planned_dim(tmp_path):
    from kvasym.errors import KvasymError
    from kvasym.stages.file_metrics import run_file_metrics

    np.savez(tmp_path / "c.npz", k=K, v=V)
    spec = get_scheme("KQV").to_dict()
    slice_ = {"distribution": {"name": "mine", "kind": "file", "params": {"path": "c.npz", "causal": True}},
              "dim": 16, "scheme": {"name": "KQV", **spec}, "budget": 4, "sharpness": [1.0], "n_queries": 4,
              "base_seed": 0, "norm_dtype": "float32"}
    with pytest.raises(KvasymError, match="head_dim 8, but the DAG planned d=16"):
        run_file_metrics(slice_, str(tmp_path / "c.npz"), str(tmp_path / "out.parquet"))
    assert not (tmp_path / "out.parquet").exists()
    # the DAG keys the job on the file's content: a file changed after the DAG was built is refused
    stale = {**slice_, "dim": 8, "content_sha256": "0" * 64}
    with pytest.raises(KvasymError, match=r"c\.npz changed since the DAG was built"):
        run_file_metrics(stale, str(tmp_path / "c.npz"), str(tmp_path / "out.parquet"))
    assert not (tmp_path / "out.parquet").exists()


@pytest.mark.slow
def test_file_distributions_run_through_the_dag(tmp_path):
    """Two bring-your-own caches beside the tiny synthetic grid: their metrics (equal to the
    library's, bit for bit), their stats, and their place in the gathered tables' inputs."""
    workdir = make_workdir(tmp_path / "wd")
    (workdir / "caches").mkdir()
    np.savez(workdir / "caches/gqa.npz", k=K.astype(np.float32), v=V.astype(np.float32), q=Q.astype(np.float32))
    save_file({"k": K[0].astype(np.float32), "v": V[0].astype(np.float32)}, str(workdir / "caches/plain.safetensors"))
    config = yaml.safe_load((workdir / "config/test.yaml").read_text())
    config["distributions"] = config["distributions"][:1] + [
        {"name": "gqa", "kind": "file", "params": {"path": "caches/gqa.npz"}},
        {"name": "plain", "kind": "file", "params": {"path": "caches/plain.safetensors", "causal": False}},
    ]
    config.pop("real", None)
    config["frontier"].pop("distributions_of", None)  # it names t1.05, which this grid leaves out
    (workdir / "files.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    targets = ["results/stats/summary/gqa/d8.parquet", "results/stats/summary/plain/d8.parquet"]
    dry = snakemake(workdir, "-n", "--quiet", "rules", configfile="files.yaml")
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "file_metrics" in dry.stdout + dry.stderr
    proc = snakemake(workdir, "--cores", "2", *targets, configfile="files.yaml")
    assert proc.returncode == 0, proc.stderr[-3000:]
    study = load_study_file(workdir / "files.yaml")
    path = workdir / "results/metrics/per_query/gqa/d8/KQV/n4.parquet"
    table = pq.read_table(path).to_pandas()
    meta = pq.read_metadata(path).metadata
    assert json.loads(meta[b"trial_map"])[3] == {"trial": 3, "text": "gqa", "layer": 1, "kv_head": 1}
    cache = load_cache_file(workdir / "caches/gqa.npz")
    direct, _ = evaluate_cache_file(cache, get_scheme("KQV"), 4, name="gqa", base_seed=study.base_seed,
                                    n_queries=study.n_queries, sharpness=list(study.sharpness))
    # the DAG's jobs run in the pinned numeric environment of the test runs (tools.numeric_env,
    # tests/snakemake_workdir.run_env) and this process in the machine's: BLAS kernels and SIMD
    # loops may move last bits (1e-13 relative on an AVX-512 CPU); bit-identity across runs is
    # what test_workflow and test_expected_results check. And the files store float32
    # (kvasym.dataset.METRIC_TYPE), each value rounded to nearest.
    np.testing.assert_allclose(table["kl"].to_numpy(), direct["kl"], rtol=FLOAT32_RTOL, atol=0)
    assert set(table["kind"]) == {"file"} and set(table["dim"]) == {8}
    summary = pd.read_parquet(workdir / "results/stats/summary/plain/d8.parquet")
    assert set(summary["sharpness"]) == set(study.sharpness), "no queries in the file: the study's sharpness grid"
    assert set(summary["budget"]) == set(study.budgets) and set(summary["scheme"]) == set(study.schemes)
    assert (summary["n_queries"] == study.n_queries * 2).all()  # 2 KV heads of one layer
    gather = snakemake(workdir, "-n", "-p", "results/stats/summary.parquet", configfile="files.yaml")
    assert gather.returncode == 0, gather.stderr[-3000:]
    command = next(line for line in gather.stdout.splitlines() if "kvasym stage gather" in line and "--summary" in line)
    assert "results/stats/summary/gqa/d8.parquet" in command and "results/stats/summary/plain/d8.parquet" in command

    # Issue 33, point 8: the cache replaced by another dump that keeps the old file's mtime (what
    # mv, cp -p, rsync -t and tar x do) is measured again: the jobs are keyed on its content
    before = os.stat(workdir / "caches/gqa.npz")
    np.savez(workdir / "caches/other.npz", k=10 * K.astype(np.float32), v=V.astype(np.float32), q=Q.astype(np.float32))
    os.utime(workdir / "caches/other.npz", ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(workdir / "caches/other.npz", workdir / "caches/gqa.npz")
    assert os.stat(workdir / "caches/gqa.npz").st_mtime_ns == before.st_mtime_ns
    again = snakemake(workdir, "--cores", "2", targets[0], configfile="files.yaml")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "file_metrics" in again.stdout + again.stderr
    remeasured = pq.read_table(path).to_pandas()
    assert not np.allclose(remeasured["kl"].to_numpy(), table["kl"].to_numpy())
    assert json.loads(pq.read_metadata(path).metadata[b"config_slice"])["content_sha256"] == \
        hashlib.sha256((workdir / "caches/gqa.npz").read_bytes()).hexdigest()


def test_head_dim_that_is_not_a_power_of_two_follows_the_padding_rule(tmp_path):
    """d = 24: rotated sides are zero-padded to 32 and store every padded coordinate, so the
    measured payload is n * 32 / 24 bits per coordinate (the study's documented padding rule)."""
    rng = np.random.default_rng(5)
    np.savez(tmp_path / "d24.npz", k=rng.standard_normal((1, 2, 30, 24)), v=rng.standard_normal((1, 2, 30, 24)),
             q=rng.standard_normal((1, 4, 30, 24)))
    cache = load_cache_file(tmp_path / "d24.npz")
    columns, _ = evaluate_cache_file(cache, get_scheme("KQV"), 4, name="d24", base_seed=0, n_queries=8, sharpness=[1.0])
    assert columns["k_bits_payload"][0] == pytest.approx(4 * 32 / 24)
    assert np.all(np.isfinite(columns["kl"])) and np.all(columns["kl"] >= 0)
    unrotated, _ = evaluate_cache_file(cache, get_scheme("KV"), 4, name="d24", base_seed=0, n_queries=8,
                                       sharpness=[1.0])
    assert unrotated["k_bits_payload"][0] == pytest.approx(4.0)
