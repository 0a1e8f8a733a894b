"""The kvasym command line: results match the library, bad input gives one clear line."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import numpy as np
import pytest

from kvasym.cli import main
from kvasym.codebook import lloyd_max_codebook
from kvasym.evaluate import causal_mask


@pytest.fixture()
def cache_files(tmp_path):
    rng = np.random.default_rng(7)
    files = {}
    for name, rows in (("keys", 96), ("values", 96), ("queries", 12)):
        path = tmp_path / f"{name}.npy"
        np.save(path, rng.standard_normal((rows, 64)).astype(np.float32))
        files[name] = path
    return files


def test_codebook_json_matches_library(capsys):
    assert main(["codebook", "--dim", "64", "--bits", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    book = lloyd_max_codebook(64, 3)
    np.testing.assert_array_equal(out["centroids"], book.centroids)
    np.testing.assert_array_equal(out["thresholds"], book.thresholds)
    assert out["mse"] == pytest.approx(64 * book.mse_per_coordinate, rel=1e-15)
    assert len(out["centroids"]) == 8 and len(out["thresholds"]) == 7


def test_quantize_dequantize_round_trip(cache_files, tmp_path):
    packed, restored = tmp_path / "k.npz", tmp_path / "k_hat.npy"
    assert main(["quantize", "--scheme", "RKV", "--bits", "4", "--side", "K", str(cache_files["keys"]),
                 str(packed)]) == 0
    assert main(["dequantize", "--dtype", "float64", str(packed), str(restored)]) == 0
    x = np.load(cache_files["keys"]).astype(np.float64)
    x_hat = np.load(restored)
    assert x_hat.shape == x.shape
    rel = np.sum((x - x_hat) ** 2, axis=1) / np.sum(x**2, axis=1)
    # 4-bit Lloyd-Max on rotated unit vectors: relative MSE is the codebook's d*C (~0.009).
    expected = lloyd_max_codebook(64, 4).mse_per_vector
    assert abs(rel.mean() - expected) < 0.15 * expected


def test_evaluate_json(cache_files, capsys):
    argv = [
        "evaluate", "--keys", str(cache_files["keys"]), "--values", str(cache_files["values"]),
        "--queries", str(cache_files["queries"]), "--scheme", "KQV", "--bits", "4", "--json", "--causal",
    ]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n_keys"] == 96 and out["n_queries"] == 12
    assert 0 <= out["kl_mean"] <= out["kl_max"]
    assert 0 <= out["recall_top5_mean"] <= 1
    assert out["k_bits_payload"] == 4 and out["v_bits_payload"] == 4


def test_causal_mask_layout():
    mask = causal_mask(3, 5)
    assert mask.tolist() == [
        [True, True, True, False, False],
        [True, True, True, True, False],
        [True, True, True, True, True],
    ]


@pytest.mark.parametrize(
    "argv_tail, message",
    [
        (["codebook", "--dim", "2", "--bits", "3"], "dimension"),
        (["codebook", "--dim", "64", "--bits", "9"], "bits"),
        (["quantize", "--scheme", "NOPE", "--bits", "4", "--side", "K", "{keys}", "{out}"], "unknown scheme 'NOPE'"),
        (["quantize", "--scheme", "KV", "--bits", "4", "--side", "K", "{missing}", "{out}"], "no such file"),
        (["quantize", "--scheme", "KV", "--bits", "4", "--side", "K", "{nan}", "{out}"], "non-finite"),
        (["quantize", "--scheme", "KV", "--bits", "4", "--side", "K", "{vector}", "{out}"], "2-D"),
        (["quantize", "--scheme", "KV", "--bits", "4", "--side", "K", "{text}", "{out}"], "not a readable"),
        (["dequantize", "{keys}", "{out}"], "plain .npy array"),
        (["dequantize", "{truncated}", "{out}"], "not a readable"),
        (
            ["evaluate", "--keys", "{keys}", "--values", "{short}", "--queries", "{queries}", "--scheme", "KV",
             "--bits", "4"],
            "values have 5",
        ),
        (
            ["evaluate", "--keys", "{keys}", "--values", "{values}", "--queries", "{wide}", "--scheme", "KV",
             "--bits", "4"],
            "head_dim 32",
        ),
    ],
)
def test_bad_input_one_clear_line(cache_files, tmp_path, argv_tail, message):
    np.save(tmp_path / "nan.npy", np.full((4, 8), np.nan))
    np.save(tmp_path / "vector.npy", np.ones(8))
    np.save(tmp_path / "short.npy", np.ones((5, 64)))
    np.save(tmp_path / "wide.npy", np.ones((5, 32)))
    (tmp_path / "text.npy").write_text("not an array")
    main(["quantize", "--scheme", "KV", "--bits", "2", "--side", "K", str(cache_files["keys"]),
          str(tmp_path / "ok.npz")])
    (tmp_path / "truncated.npz").write_bytes((tmp_path / "ok.npz").read_bytes()[:500])
    names = dict(
        keys=cache_files["keys"], values=cache_files["values"], queries=cache_files["queries"],
        out=tmp_path / "out.npz", missing=tmp_path / "missing.npy", nan=tmp_path / "nan.npy",
        vector=tmp_path / "vector.npy", text=tmp_path / "text.npy", truncated=tmp_path / "truncated.npz",
        short=tmp_path / "short.npy", wide=tmp_path / "wide.npy",
    )
    argv = [a.format(**{k: str(v) for k, v in names.items()}) for a in argv_tail]
    proc = subprocess.run([sys.executable, "-m", "kvasym.cli", *argv], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert message in proc.stderr
    assert not (tmp_path / "out.npz").exists()


def test_capture_command_rejects_bad_input_in_one_line(tmp_path):
    """`kvasym capture` (kvasym.real) is wired into the CLI: bad texts or layers exit 2 with one
    line naming them, before any model is loaded."""
    import subprocess
    import sys

    for args, expected in ((["--texts", str(tmp_path / "missing.txt")], "missing.txt"),
                           (["--layers", "3-1"], "--layers")):
        run = subprocess.run([sys.executable, "-m", "kvasym.cli", "capture", "--out", str(tmp_path / "o"), *args],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 2, run.stderr
        last = run.stderr.strip().splitlines()[-1]
        assert last.startswith("kvasym: error:") and expected in last, run.stderr
        assert "Traceback" not in run.stderr
    assert not (tmp_path / "o").exists()


def test_real_stage_names_missing_slice_keys(tmp_path, capsys):
    from kvasym.cli import main

    code = main(["stage", "real_metrics", "--slice", '{"distribution": "smollm2"}',
                 "--captures", str(tmp_path / "a.npz"), "--out", f"4={tmp_path / 'o.parquet'}"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--slice of the real_metrics stage lacks key(s) base_seed, budgets, norm_dtype, scheme, sharpness" in err
    assert not (tmp_path / "o.parquet").exists()


# Found by a hostile sweep (issue 18): inputs that used to exit 0 with a wrong or lost result.


def test_an_output_that_is_a_device_or_a_folder_is_refused(cache_files, tmp_path, capsys):
    """As root, the atomic rename replaced /dev/null with a regular file; "out/" wrote a file
    named "out"."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    quantize = ["quantize", "--scheme", "KV", "--bits", "4", "--side", "K", str(cache_files["keys"])]
    assert main([*quantize, str(fifo)]) == 2
    assert "pipe: exists and is not a regular file" in capsys.readouterr().err
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert main([*quantize, str(tmp_path / "newdir") + "/"]) == 2
    assert "names a folder (ends with /), not a file" in capsys.readouterr().err
    assert not (tmp_path / "newdir").exists()


def test_symbolic_links_that_lead_nowhere_are_one_line(cache_files, tmp_path, capsys):
    """Issue 33, point 5: a symlink loop as quantize's or dequantize's input (or output) gave a
    RuntimeError traceback from pathlib; a dangling link said "no such file" of a path that is
    there. Each is one line naming the path, exit 2, and nothing is written."""
    loop_a, loop_b, dangling = tmp_path / "a", tmp_path / "b", tmp_path / "dangling.npy"
    os.symlink(loop_b, loop_a)
    os.symlink(loop_a, loop_b)
    os.symlink(tmp_path / "gone.npy", dangling)
    quantize = ["quantize", "--scheme", "KV", "--bits", "4", "--side", "K"]
    for argv, message in (
        ([*quantize, str(loop_a), str(tmp_path / "o.npz")], f"the input {loop_a} is a symbolic link"),
        (["dequantize", str(loop_a), str(tmp_path / "o.npy")], f"the input {loop_a} is a symbolic link"),
        ([*quantize, str(cache_files["keys"]), str(loop_a)], f"the output {loop_a} is a symbolic link"),
        ([*quantize, str(dangling), str(tmp_path / "o.npz")], "is a symbolic link that leads to no file (its target"),
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "Traceback" not in err and message in err.strip().splitlines()[-1], err
    assert not (tmp_path / "o.npz").exists() and not (tmp_path / "o.npy").exists()


def test_one_key_is_refused_by_the_matrix_path(tmp_path, capsys):
    """Over one key every attention weight is 1: KL 0 and recall 1 for any scheme."""
    np.save(tmp_path / "k.npy", np.ones((1, 16)))
    np.save(tmp_path / "q.npy", np.ones((3, 16)))
    assert main(["evaluate", "--scheme", "KQV", "--bits", "3", "--keys", str(tmp_path / "k.npy"), "--values",
                 str(tmp_path / "k.npy"), "--queries", str(tmp_path / "q.npy")]) == 2
    assert "keys need at least 2 rows (positions), got 1" in capsys.readouterr().err


def test_a_closed_standard_output_is_an_error(cache_files):
    """`kvasym evaluate --json >&-` printed nowhere and exited 0."""
    proc = subprocess.run(
        f"{sys.executable} -m kvasym.cli evaluate --scheme KV --bits 4 --keys {cache_files['keys']} "
        f"--values {cache_files['values']} --queries {cache_files['queries']} --json >&-",
        shell=True, capture_output=False, stderr=subprocess.PIPE, text=True,
    )
    assert proc.returncode != 0 and "standard output is closed" in proc.stderr


def test_a_cache_file_error_names_layer_head_and_side(tmp_path, capsys):
    k = np.random.default_rng(1).standard_normal((2, 2, 8, 16))
    k[1, 1, 5] *= 1e300
    np.savez(tmp_path / "c.npz", k=k, v=np.ones((2, 2, 8, 16)))
    assert main(["evaluate", "--cache", str(tmp_path / "c.npz"), "--scheme", "KQV", "--bits", "4"]) == 2
    err = capsys.readouterr().err
    assert "layer 1, KV head 1: keys: norm of row 5" in err, err


def test_flags_that_would_be_ignored_are_refused(cache_files, tmp_path, capsys):
    """--n-queries with matrices, and --sharpness or --n-queries on a cache file that has q, were
    accepted and ignored (identical output): a user could believe they had swept them."""
    matrices = ["evaluate", "--scheme", "KV", "--bits", "4", "--keys", str(cache_files["keys"]), "--values",
                str(cache_files["values"]), "--queries", str(cache_files["queries"])]
    assert main([*matrices, "--n-queries", "10"]) == 2
    assert "--n-queries applies only to a --cache file without q" in capsys.readouterr().err
    assert main([*matrices, "--sharpness", "2"]) == 0  # matrices: the sharpness is applied
    capsys.readouterr()
    rng = np.random.default_rng(3)
    np.savez(tmp_path / "withq.npz", k=rng.standard_normal((1, 1, 16, 8)), v=rng.standard_normal((1, 1, 16, 8)),
             q=rng.standard_normal((1, 2, 4, 8)))
    cache = ["evaluate", "--scheme", "KV", "--bits", "4", "--cache", str(tmp_path / "withq.npz")]
    for flag, value in (("--sharpness", "2"), ("--n-queries", "10")):
        assert main([*cache, flag, value]) == 2
        assert f"{flag} applies only to a cache file without q" in capsys.readouterr().err
    assert main(cache) == 0
