"""A job's units on several processes (kvasym.workers): the same results, in the same order, as
the loop in one process, for the helper and for each stage that uses it (issue 49: a rule's
threads used by the job)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvasym.errors import KvasymError
from kvasym.workers import check_workers, map_ordered, usable_workers

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "tiny_gguf"
CAN_FORK = usable_workers(2, 2) == 2


def _square_and_pid(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


def _slow_square_and_pid(x: int) -> tuple[int, int]:
    __import__("time").sleep(0.05)  # long enough that one worker cannot take every unit
    return x * x, os.getpid()


def test_results_come_in_the_units_order_from_several_processes() -> None:
    units = list(range(23))
    got = map_ordered(_slow_square_and_pid, units, workers=3)
    assert [value for value, _ in got] == [x * x for x in units]
    pids = {pid for _, pid in got}
    if CAN_FORK:  # the units ran in forked workers, not in this process
        assert os.getpid() not in pids and 1 < len(pids) <= 3
    else:
        assert pids == {os.getpid()}


def test_one_worker_is_the_plain_loop_in_this_process() -> None:
    got = map_ordered(_square_and_pid, [1, 2, 3], workers=1)
    assert got == [(1, os.getpid()), (4, os.getpid()), (9, os.getpid())]
    assert map_ordered(_square_and_pid, [], workers=4) == []


def test_a_closure_over_unpicklable_state_runs_in_the_workers() -> None:
    """The workers are forked: what the unit function closes over is inherited, not pickled."""
    state = {"lock": __import__("threading").Lock(), "offset": 100}  # a lock cannot be pickled
    assert map_ordered(lambda x: x + state["offset"], [1, 2, 3, 4], workers=2) == [101, 102, 103, 104]


def _fails_on_three(x: int) -> int:
    if x == 3:
        raise KvasymError(f"unit {x} is bad")
    return x


def test_a_units_error_is_raised_in_the_caller_and_the_pool_is_gone() -> None:
    import multiprocessing

    with pytest.raises(KvasymError, match="unit 3 is bad"):
        map_ordered(_fails_on_three, [1, 2, 3, 4, 5], workers=2)
    assert multiprocessing.active_children() == []
    assert map_ordered(_fails_on_three, [1, 2], workers=2) == [1, 2]  # usable again


@pytest.mark.parametrize("bad", [0, -1, 1025, 2.0, "2", True, None])
def test_bad_worker_counts_are_refused(bad) -> None:
    with pytest.raises(KvasymError, match="workers must be an integer in 1..1024"):
        check_workers(bad)
    with pytest.raises(KvasymError, match="workers must be an integer in 1..1024"):
        map_ordered(_square_and_pid, [1], workers=bad)


def test_usable_workers_never_exceeds_the_units() -> None:
    assert usable_workers(8, 3) == (3 if CAN_FORK else 1)
    assert usable_workers(8, 0) == 1
    assert usable_workers(1, 50) == 1


# --- the stages' loops: bit for bit the same frames whatever the workers --------------------------

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module", params=["gemma3_swa_q5_0.gguf", "llama_tied_f32.gguf"])
def tiny_model(request):
    from kvasym.real.gguf_model import GGUFLlama

    return GGUFLlama.load(FIXTURES / request.param)


def _token_ids(model, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, model.config.vocab_size, size=n).astype(np.int64)


def _assert_same_columns(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_a_texts_passes_on_workers_equal_the_loop(tiny_model) -> None:
    """execute_passes/evaluate_text: every pass after the one reference pass, on 1 or 3 workers."""
    from kvasym.real.endtoend import evaluate_text
    from kvasym.schemes import get_scheme

    ids = _token_ids(tiny_model, 40, 1)
    run = dict(text="t", base_seed=5, ropes=["post", "pre"], draws=2, sensitivity_budget=2,
               sensitivity_layers=[0, 1])
    schemes = [get_scheme("RKV"), get_scheme("KQV"), get_scheme("KIVI32")]
    one = evaluate_text(tiny_model, ids, schemes, [2, 3], workers=1, causal_chunks={"KIVI32": 8}, **run)
    three = evaluate_text(tiny_model, ids, schemes, [2, 3], workers=3, causal_chunks={"KIVI32": 8}, **run)
    _assert_same_columns(one, three)
    assert len(set(zip(one["scheme"], one["budget"], one["draw"], one["layer"]))) > 8  # many passes


def test_greedy_prompts_on_workers_equal_the_loop(tiny_model) -> None:
    from kvasym.real.greedy import greedy_grid
    from kvasym.schemes import get_scheme

    texts = {"a": _token_ids(tiny_model, 30, 2), "b": _token_ids(tiny_model, 30, 3)}
    run = dict(prompt_tokens=9, prompts_per_text=3, n_new=5, schemes=[get_scheme("RKV"), get_scheme("KV")],
               budgets=[2, 4], base_seed=9)
    one = greedy_grid(tiny_model, texts, workers=1, **run)
    two = greedy_grid(tiny_model, texts, workers=2, **run)
    pd.testing.assert_frame_equal(one, two, check_exact=True)
    assert len(one) == 2 * 3 * 2 * 2 and list(one["text"].unique()) == ["a", "b"]


def test_card_evaluation_passes_on_workers_equal_the_loop(tiny_model) -> None:
    from kvasym.real.card import evaluation_rows
    from kvasym.real.endtoend import reference_pass
    from kvasym.real.mixed import measured_allocation, sensitivity
    from kvasym.schemes import get_scheme

    scheme = get_scheme("RKV")
    calibration = _token_ids(tiny_model, 24, 4)
    table = pd.DataFrame(sensitivity(tiny_model, reference_pass(tiny_model, calibration), scheme, [1, 2, 3, 4],
                                     "layer_side", text="cal", base_seed=3))
    budgets = [2, 3]
    n_layers, n_kv = len(tiny_model.layers), tiny_model.config.n_kv_heads
    free = measured_allocation(table, n_layers, n_kv, "layer_side", budgets)
    tied = measured_allocation(table, n_layers, n_kv, "layer_side", budgets, tie_sides=True)
    evaluation = {"x": _token_ids(tiny_model, 24, 5), "y": _token_ids(tiny_model, 24, 6)}
    run = dict(reference="RKV", budgets=budgets, draws=2, base_seed=3, tied=tied)
    one = evaluation_rows(tiny_model, evaluation, free, scheme, workers=1, **run)
    four = evaluation_rows(tiny_model, evaluation, free, scheme, workers=4, **run)
    pd.testing.assert_frame_equal(one, four, check_exact=True)
    assert set(one["scheme"]) == {"RKV", "RKV-MA", "RKV-MAT"}


def test_a_stage_is_given_its_rules_threads_as_workers() -> None:
    """Wiring.stage_params: a stage with --workers gets the job's threads (Snakemake passes them
    to the params function); they are not recorded in the job's params record."""
    import inspect

    from kvasym.wiring import Wiring

    wiring = Wiring.__new__(Wiring)  # stage_params reads only what the job gives it here
    params = Wiring.stage_params(wiring, "e2e", slice='{"text": "t"}')
    assert "threads" in inspect.signature(params["args"]).parameters

    class Files(list):
        def keys(self):
            return []

    args = params["args"]({}, Files(), Files(["t.parquet"]), threads=3)
    assert "--workers 3" in args and "--out t.parquet" in args
    assert "--workers 1" in params["args"]({}, Files(), Files(["t.parquet"]))
    # an e2e job always has its model (the recorded params hold its registry entry, not workers)
    recorded = params["config"]({"model": "smollm2-135m"})
    assert "workers" not in recorded and '"model_entry"' in recorded


def test_sensitivity_rows_on_workers_equal_the_loop(tiny_model) -> None:
    from kvasym.real.endtoend import reference_pass
    from kvasym.real.mixed import sensitivity
    from kvasym.schemes import get_scheme

    ref = reference_pass(tiny_model, _token_ids(tiny_model, 24, 7))
    run = dict(text="cal", base_seed=3, part=(1, 2))
    one = sensitivity(tiny_model, ref, get_scheme("RKV"), [1, 2, 4], "layer_side", workers=1, **run)
    three = sensitivity(tiny_model, ref, get_scheme("RKV"), [1, 2, 4], "layer_side", workers=3, **run)
    _assert_same_columns(one, three)
    assert one["layer"].size > 3


def test_end_to_end_tables_on_workers_equal_the_loop(tmp_path) -> None:
    """Stage e2e_stats: every (table, model) computed on three workers, the same files' frames as
    on one (two models' texts and passkey trials, as tests/test_models.py builds them)."""
    from test_models import _passkey_parts, _texts

    from kvasym.stages.e2e_stats import run_e2e_stats

    texts = _texts(tmp_path, None, 0.0) + _texts(tmp_path, "gemma3-270m", 2.0)
    trials = _passkey_parts(tmp_path, None, 0.9)[0] + _passkey_parts(tmp_path, "gemma3-270m", 0.3)[0]
    slice_ = {"schemes": ["RKV", "KQV"], "study_schemes": ["RKV", "KQV"], "budgets": [2, 4], "base_seed": 1,
              "n_boot": 20, "models": {"gemma3-270m": {"schemes": ["RKV", "KQV"], "study_schemes": ["RKV", "KQV"]}}}
    gathered = tmp_path / "gathered.parquet"
    pd.DataFrame([{"distribution": "smollm2", "sharpness": 1.0, "scheme": s, "budget": b, "kl_mean": 0.1 * b}
                  for s in ("RKV", "KQV") for b in (2, 4)]).to_parquet(gathered)
    names = ("summary", "comparisons", "equal_bits", "sensitivity", "agreement", "passkey_summary")
    frames = {}
    for workers in (1, 3):
        out = {name: str(tmp_path / f"w{workers}-{name}.parquet") for name in names}
        run_e2e_stats(slice_, texts, str(gathered), out, passkey_paths=trials, workers=workers)
        frames[workers] = {name: pd.read_parquet(out[name]) for name in names}
    for name in names:
        pd.testing.assert_frame_equal(frames[1][name], frames[3][name], check_exact=True)
        assert len(frames[1][name]) > 0 or name == "sensitivity", name  # the texts hold no one-layer pass



def test_imap_ordered_yields_as_it_goes_and_an_early_close_reaps_the_pool() -> None:
    """The generator form: the same values in order; closed after two results (the caller's loop
    broke off), it terminates the pool, leaves no child and can run again."""
    import multiprocessing

    from kvasym import workers as workers_module
    from kvasym.workers import imap_ordered

    units = list(range(9))
    assert [value for value, _ in imap_ordered(_slow_square_and_pid, units, workers=3)] == [x * x for x in units]
    generator = imap_ordered(_slow_square_and_pid, units, workers=3)
    assert [next(generator)[0], next(generator)[0]] == [0, 1]
    generator.close()
    assert multiprocessing.active_children() == [] and workers_module._TASK is None
    assert [value for value, _ in imap_ordered(_square_and_pid, [3, 4], workers=2)] == [9, 16]


def _digests(root: Path) -> dict[str, str]:
    import hashlib

    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_synthetic_units_trials_on_workers_write_the_loops_files(tmp_path) -> None:
    """Stage cells: a unit's trials on three workers (more trials than workers, so a worker takes
    several) write the same manifest, packed caches and metrics files, byte for byte, as the
    loop in one process. The unit is the tiny grid's Gaussian one, every scheme of it (the
    frontier's, its extra budget and the QJL ones among them), with four trials."""
    from kvasym.stages.cells import run_cells
    from kvasym.study import load_study_file

    study = load_study_file(Path(__file__).resolve().parents[1] / "config" / "test.yaml")
    unit = study.unit_slice("gaussian", 64)
    unit["trials"] = 4
    assert {"KQV", "QKQV", "KQV-NS"} <= {s["name"] for s in unit["schemes"]} and unit["extra_budgets"]
    files = {}
    for workers in (1, 3):
        root = tmp_path / f"w{workers}"
        run_cells(unit, root / "data.json", root / "packed", root / "per_query", root / "per_key", workers=workers)
        files[workers] = _digests(root)
    assert files[1] == files[3]
    kept = {name.split("/")[1] for name in files[1] if name.startswith("packed/") and name.endswith(".npz")}
    assert kept == set(unit["packed_schemes"]) and len(files[1]) > 20


def test_a_manifest_needs_every_trials_record_in_order() -> None:
    """kvasym.manifest.manifest_of, which a unit job on workers builds from its trials' records:
    records missing or out of order are refused, not written as a shorter manifest."""
    from kvasym.manifest import build_manifest, manifest_of, regenerate_trial, trial_record

    slice_ = {"distribution": {"name": "gaussian", "kind": "gaussian", "params": {}}, "dim": 8, "seq_len": 16,
              "n_queries": 4, "trials": 3, "base_seed": 5}
    records = [trial_record(t, regenerate_trial(slice_, t)) for t in range(3)]
    assert manifest_of(slice_, records) == build_manifest(slice_)
    for bad in (records[:2], [records[1], records[0], records[2]]):
        with pytest.raises(KvasymError, match="records of trials 0..2 in order"):
            manifest_of(slice_, bad)
