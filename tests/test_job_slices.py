"""The DAG's job slices and stage flags, computed by the library without Snakemake.

Each grid stage's ``--slice`` (:meth:`kvasym.study.Study.job_slice`) holds exactly the keys its
stage checks for (:data:`kvasym.stages._slice.SLICE_KEYS`) and reads, stays the same when an
unrelated config key changes, and is byte for byte what the DAG passed before the slices moved
out of ``workflow/rules/common.smk`` (digests of the tiny config's dry run at 5df4e05). The flags
:func:`kvasym.artifacts.stage_flags` derives from a stage's declarations are accepted by that
stage's own parser, with the values given.
"""

from __future__ import annotations

import argparse
import ast
import copy
import hashlib
import inspect
import json
import shlex
from pathlib import Path

import pytest
import yaml

from kvasym.artifacts import ARTIFACTS, stage_flags
from kvasym.errors import KvasymError
from kvasym.real import real_settings
from kvasym.stages import STAGES, stage_module
from kvasym.stages._slice import SLICE_KEYS, stage_slice
from kvasym.study import canonical_json, load_study

ROOT = Path(__file__).resolve().parents[1]
TINY = yaml.safe_load((ROOT / "config/test.yaml").read_text())
#: A bring-your-own cache beside the tiny grid (its file is never read by these functions).
FILE = {"name": "mycache", "kind": "file", "params": {"path": "caches/mine.npz"}}
FILE_DIGESTS = {"mycache": "ab" * 32}
#: One job of each grid stage: its wildcards.
JOBS = {
    "cells": {"distribution": "gaussian", "dim": "64"},
    "metrics": {"distribution": "lowrank4+isotropic", "dim": "64"},
    "stats": {"distribution": "t1.05", "dim": "64"},
    "theory": {"distribution": "lowrank4", "dim": "64"},
    "file_metrics": {"distribution": "mycache", "dim": "64", "scheme": "KQV", "budget": "4"},
    "real_metrics": {"distribution": "smollm2", "scheme": "QKQV"},
    "real_metrics_extra": {"distribution": "smollm2-prerope", "scheme": "RKV", "budget": "5"},
    "e2e": {"text": "bicycle_repair", "part": "0"},
    "e2e_join": {"text": "bicycle_repair"},
    "e2e_stats": {},
    "calibrate": {},
    "e2e_long": {"length": "64", "part": "0"},
    "passkey": {"length": "96", "part": "0"},
    "sensitivity": {"text": "allotment_spring", "part": "0"},
    "card": {},
    "greedy": {},
}
#: Keys a stage reads when present (slice_.get): the real rows' layers, the file's digest, a
#: frontier unit's extra budgets (frontier.extra_budgets, in the tiny config: RKV at n = 5), a
#: job's part (kvasym.real.jobparts.part_of; the tiny config runs its windows and trials as parts).
OPTIONAL_KEYS = {"real_metrics": {"layers"}, "file_metrics": {"content_sha256"},
                 "cells": {"extra_budgets", "packed_extra"}, "e2e_long": {"part"}, "passkey": {"part"},
                 "sensitivity": {"part"}}


def _config(**changes):
    config = copy.deepcopy(TINY)
    config["distributions"] = [*config["distributions"], FILE]
    for key, value in changes.items():
        where = config
        *parents, last = key.split(".")
        for parent in parents:
            where = where[parent]
        where[last] = value
    return config


def _slices(config):
    study = load_study(config)
    real = real_settings(config.get("real"), list(study.schemes), list(study.frontier_real_schemes))
    return {stage: study.job_slice(stage, wildcards, real=real, file_digests=FILE_DIGESTS)
            for stage, wildcards in JOBS.items()}


SLICES = _slices(_config())


def test_every_grid_stage_has_a_job():
    assert set(JOBS) == set(SLICE_KEYS)


def _keys_read(stage: str) -> set[str]:
    """The string keys the stage module reads from its slice: ``slice_["k"]``, ``slice_.get("k")``
    and ``slice_[key] for key in ("k", ...)`` (the slice is ``slice_``, or ``unit`` in cells)."""
    tree = ast.parse(inspect.getsource(stage_module(stage)))
    names = {"slice_", "unit"}
    keys: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in names:
            if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                keys.add(node.slice.value)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and isinstance(node.func.value, ast.Name) and node.func.value.id in names and node.args
              and isinstance(node.args[0], ast.Constant)):
            keys.add(node.args[0].value)
        elif isinstance(node, ast.comprehension) and isinstance(node.iter, ast.Tuple):
            keys |= {e.value for e in node.iter.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return keys


@pytest.mark.parametrize("stage", sorted(JOBS))
def test_a_slice_holds_exactly_the_keys_its_stage_checks_and_reads(stage):
    sliced = SLICES[stage]
    assert set(sliced) == SLICE_KEYS[stage] | OPTIONAL_KEYS.get(stage, set())
    # every key the stage module reads by name is there (the data keys of cells, metrics and
    # theory are read by the library functions they call, not by name in the module)
    read = _keys_read(stage) & (SLICE_KEYS[stage] | OPTIONAL_KEYS.get(stage, set()) | {"budget", "scheme"})
    assert read <= set(sliced), sorted(read - set(sliced))
    # and the stage takes it: its own check of --slice finds nothing missing
    assert stage_slice(argparse.Namespace(slice=canonical_json(sliced)), stage) == json.loads(canonical_json(sliced))


def test_the_optional_keys_are_read_by_their_stage():
    for stage, keys in OPTIONAL_KEYS.items():
        assert keys <= _keys_read(stage), stage


# an unrelated key for every stage (it changes no slice), and a related one for each (it does,
# so the first check is not vacuous)
UNRELATED = {"headline.sharpness": 4.0, "claims_file": "config/claims.yaml", "stats.n_permutations": 7,
             "theory.n_probes": 32, "seq_len_sweep.trials": 3}
RELATED = {
    "cells": ("seq_len", 64), "metrics": ("per_key_trials", 2), "stats": ("stats.n_permutations", 7),
    "theory": ("theory.n_probes", 32), "file_metrics": ("n_queries", 8), "real_metrics": ("real.layers", [0]),
    "real_metrics_extra": ("real.layers", [0]),
    "e2e": ("real.max_tokens", 40), "e2e_join": ("real.max_tokens", 40),
    "e2e_stats": ("stats.n_boot", 100), "calibrate": ("real.max_tokens", 40),
    "e2e_long": ("real.e2e.long_context.windows", 3), "passkey": ("real.e2e.passkey.trials", 3),
    "sensitivity": ("real.card.widths", [1, 2]), "card": ("real.card.budgets", [1]),
    "greedy": ("real.e2e.greedy.new_tokens", 3),
}


@pytest.mark.parametrize("key", sorted(UNRELATED))
def test_an_unrelated_key_leaves_each_slice_unchanged(key):
    changed = _slices(_config(**{key: UNRELATED[key]}))
    for stage, sliced in SLICES.items():
        if RELATED[stage][0] == key:
            continue
        assert canonical_json(changed[stage]) == canonical_json(sliced), (stage, key)


@pytest.mark.parametrize("stage", sorted(RELATED))
def test_a_related_key_changes_the_slice(stage):
    key, value = RELATED[stage]
    assert canonical_json(_slices(_config(**{key: value}))[stage]) != canonical_json(SLICES[stage])


def test_extra_budgets_change_only_the_slices_of_the_units_they_add_cells_to():
    """Issue 31, point 7: ``frontier.extra_budgets`` adds ``extra_budgets`` and ``packed_extra``
    to the slices of the frontier's units (gaussian: its distributions; t1.05: HRKV's own) and
    changes the frontier's slice; every other job's slice (lowrank4, outside the frontier, its
    query-model variant, every stats and theory job) stays byte for byte, so it reruns nothing else."""
    changes = {"frontier.distributions": ["gaussian"]}
    base = load_study(_config(**changes, **{"frontier.extra_budgets": {}}))
    extra = load_study(_config(**changes, **{"frontier.extra_budgets": {"RKV": [5]}}))
    assert [d for d, _ in extra.frontier_data_cells()] == ["gaussian", "t1.05"]
    for dist, dim in base.data_cells():
        wildcards = {"distribution": dist, "dim": str(dim)}
        stage = "metrics" if dist in base.query_variants else "cells"
        before, after = (s.job_slice(stage, wildcards) for s in (base, extra))
        if dist in ("gaussian", "t1.05"):
            assert after == {**before, "extra_budgets": {"RKV": [5]}, "packed_extra": False}, dist
        else:
            assert canonical_json(after) == canonical_json(before), dist
        for other in ("stats", "theory") if dist not in base.query_variants else ():
            assert canonical_json(extra.job_slice(other, wildcards)) == canonical_json(base.job_slice(other, wildcards))
    assert extra.frontier_slice() == {**base.frontier_slice(), "extra_budgets": {"RKV": [5]}}
    assert extra.frontier_budgets("gaussian", "RKV") == [2, 4, 5]
    assert extra.frontier_budgets("lowrank4", "RKV") == [2, 4] and extra.frontier_budgets("gaussian", "KQV") == [2, 4]
    kept = load_study(_config(**changes, **{"frontier.extra_budgets": {"RKV": [5]}, "frontier.keep_packed": True}))
    assert kept.unit_slice("gaussian", 64)["packed_extra"] is True


def _sha(texts):
    return hashlib.sha256("\n".join(sorted(set(texts))).encode()).hexdigest()


def test_the_real_slices_are_those_the_dag_passed_before():
    """The sorted --slice JSON of every real_metrics job of the tiny config, hashed, as `snakemake
    -n -p` printed them at 5df4e05 (built in common.smk then); the e2e and e2e_stats slices as
    issue 31 changed them (draws, per-mode schemes, extra budgets, a query-aware variant's among
    them; no block_tokens)."""
    config = copy.deepcopy(TINY)
    study = load_study(config)
    real = real_settings(config["real"], list(study.schemes), list(study.frontier_real_schemes))
    schemes = [*study.schemes, *study.frontier_real_schemes]
    real_metrics = [canonical_json(study.job_slice("real_metrics", {"distribution": d, "scheme": s}, real=real))
                    for d in ("smollm2", "smollm2-prerope") for s in schemes]
    assert len(set(real_metrics)) == 16
    # issue 48, point 3: a slice holds a scheme's specs without its description (the scheme
    # table's alone); with the descriptions put back, the slices are 5df4e05's, byte for byte
    assert not any("description" in s for s in real_metrics)
    described = []
    for text in real_metrics:
        slice_ = json.loads(text)
        description = study.scheme(slice_["scheme"]["name"]).description
        described.append(canonical_json({**slice_, "scheme": {**slice_["scheme"], "description": description}}))
    assert _sha(described) == "74d5621f4a95703c912ed09cbcd7f140e4ef245e3499d6c284a024f4fa620e97"
    e2e = study.job_slice("e2e", {"text": "bicycle_repair", "part": "0"}, real=real)
    assert study.job_slice("e2e_join", {"text": "bicycle_repair"}, real=real) == e2e  # one part: the text's slice
    e2e_schemes = ["KV", "KQV", "QKQV", "RKV", "KQV-H", "QKQV-H", "CRKV", "SKLT", "GGML-Q0"]  # + extra_schemes
    assert [s["name"] for s in e2e["schemes"]] == e2e_schemes
    assert e2e["schemes"][7] == {"name": "SKLT", **study.scheme("SKLT").spec_dict()}
    assert {k: v for k, v in e2e.items() if k != "schemes"} == {
        "text": "bicycle_repair", "max_tokens": 48, "budgets": [2, 4], "base_seed": 7, "norm_dtype": "float32",
        "e2e": {"draws": 2, "rope": {"post": e2e_schemes, "pre": ["KQV", "RKV"]},
                "extra_budgets": {"QWF": [5], "RKV": [5]}, "own": "exact", "sensitivity_layers": [0, 29],
                "sensitivity_schemes": ["KV", "KQV", "QKQV", "RKV"],
                "query_aware": ["QWF"], "recent_windows": {"RKV": [8]}, "causal_chunks": {"KQV": 16}}}
    assert canonical_json(study.job_slice("e2e_stats", {}, real=real)) == (
        '{"base_seed":7,"budgets":[2,4],"n_boot":200,"schemes":'
        + canonical_json([*e2e_schemes, "QWF", "RKV+R8", "KQV+C16"]) + ',"study_schemes":["KV","KQV","QKQV","RKV"]}')
    calibrate = study.job_slice("calibrate", {}, real=real)
    assert calibrate["evaluation_texts"] == ["bicycle_repair"] and "bicycle_repair" not in calibrate["texts"]
    assert len(calibrate["texts"]) == 15 and calibrate["max_tokens"] == 48
    long = study.job_slice("e2e_long", {"length": "128", "part": "0"}, real=real)
    assert (long["length"], long["windows"], long["query_variants"], [s["name"] for s in long["schemes"]]) == (
        128, 2, ["QWF"], ["RKV"])
    passkey = study.job_slice("passkey", {"length": "96", "part": "0"}, real=real)
    assert (passkey["depths"], passkey["trials"], passkey["budgets"]) == ([0.0, 1.0], 2, [2])


def test_a_cells_table_slice_is_its_writers_slice():
    study = load_study(_config())
    real = real_settings(TINY["real"], list(study.schemes), list(study.frontier_real_schemes))
    # a real cell: its job's slice with its one budget in place of the budgets
    job = study.job_slice("real_metrics", {"distribution": "smollm2", "scheme": "KQV"}, real=real)
    cell = study.cell_table_slice("smollm2", "64", "KQV", "2", real=real, file_digests=FILE_DIGESTS)
    assert cell == {**{k: v for k, v in job.items() if k != "budgets"}, "budget": 2}
    # a real cell at an extra budget (frontier.extra_budgets: RKV at n = 5): the real_metrics_extra
    # job's slice is the scheme's real_metrics slice with that one budget, so the file's provenance
    # is the cell's slice the frontier checks
    extra = study.job_slice("real_metrics_extra", {"distribution": "smollm2", "scheme": "RKV", "budget": "5"},
                            real=real)
    rkv = study.job_slice("real_metrics", {"distribution": "smollm2", "scheme": "RKV"}, real=real)
    assert extra == {**rkv, "budgets": [5]}
    assert study.cell_table_slice("smollm2", "64", "RKV", "5", real=real) == {
        **{k: v for k, v in extra.items() if k != "budgets"}, "budget": 5}
    assert study.real_extra_budgets() == {"RKV": [5]}
    # a scheme with extra budgets that does not run on the real rows has none there
    hrkv = load_study(_config(**{"frontier.extra_budgets": {"RKV": [5], "HRKV": [5]}}))
    assert hrkv.frontier_extra_budgets["HRKV"] == (5,) and hrkv.real_extra_budgets() == {"RKV": [5]}
    with pytest.raises(KvasymError, match="real cell HRKV n = 5: not an extra budget"):
        hrkv.job_slice("real_metrics_extra", {"distribution": "smollm2", "scheme": "HRKV", "budget": "5"}, real=real)
    for scheme, budget in (("RKV", "4"), ("KQV", "5")):  # a grid budget; a scheme without extra budgets
        with pytest.raises(KvasymError, match=f"real cell {scheme} n = {budget}: not an extra budget"):
            study.job_slice("real_metrics_extra", {"distribution": "smollm2", "scheme": scheme, "budget": budget},
                            real=real)
    # a file cell: the file_metrics job's own slice, the file's digest in it
    wildcards = {"distribution": "mycache", "dim": "64", "scheme": "KQV", "budget": "4"}
    assert study.cell_table_slice(*wildcards.values(), real=real, file_digests=FILE_DIGESTS) == study.job_slice(
        "file_metrics", wildcards, file_digests=FILE_DIGESTS)
    assert study.cell_table_slice("mycache", 64, "KQV", 4, file_digests=FILE_DIGESTS)["content_sha256"] == "ab" * 32
    # a synthetic cell: the metrics slice
    assert study.cell_table_slice("gaussian", 64, "KQV", 4) == study.metrics_slice("gaussian", 64, "KQV", 4)


def test_a_slice_without_its_settings_says_what_is_missing():
    study = load_study(_config())
    with pytest.raises(KvasymError, match="real-model rows"):
        study.job_slice("e2e", {"text": "bicycle_repair", "part": "0"})
    with pytest.raises(KvasymError, match="no real-model rows"):
        study.cell_table_slice("smollm2", 64, "KQV", 4)
    with pytest.raises(KvasymError, match="mycache.*no content digest"):
        study.cell_table_slice("mycache", 64, "KQV", 4)
    with pytest.raises(KvasymError, match="gather"):
        study.job_slice("gather", {})


# ----------------------------------------------------------------------------- derived flags


def _parser(stage: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"kvasym stage {stage}", exit_on_error=False)
    stage_module(stage).add_arguments(parser)
    return parser


def _required_filled(parser: argparse.ArgumentParser, given: set[str]) -> list[str]:
    """Placeholder values for the required flags the derived ones leave out (--slice, --out-dir)."""
    extra = []
    for action in parser._actions:
        if action.required and action.dest not in given:
            extra += [action.option_strings[0], "{}"]
    return extra


def _outputs(module) -> dict[str, str]:
    """The module's OUTPUTS as argument -> artifact (e2e_stats's OUTPUTS are its table names)."""
    outputs = getattr(module, "OUTPUTS", {})
    return outputs if isinstance(outputs, dict) else {}


def _everything(stage: str):
    """Every declared input (two paths each where it takes several), output and listing of ``stage``."""
    module = stage_module(stage)
    many = {a.dest for a in _parser(stage)._actions if a.nargs == "+"}
    inputs = {dest: [f"in/{dest}/a", f"in/{dest}/b"] if dest in many else f"in/{dest}/a" for dest in module.INPUTS}
    outputs = {made: f"out/{made}" for made in _outputs(module).values()}
    listings = {}
    for dest in getattr(module, "LISTINGS", {}):
        key = dest if dest in inputs else module.OUTPUTS[dest]
        listings[key] = {f"in/{dest}/a": f"listing of {dest}"}
    return inputs, outputs, listings


@pytest.mark.parametrize("stage", [s for s in STAGES if hasattr(stage_module(s), "INPUTS")])
def test_every_derived_flag_is_accepted_by_its_stage(stage):
    module = stage_module(stage)
    inputs, outputs, listings = _everything(stage)
    parser = _parser(stage)
    flags = shlex.split(stage_flags(module, inputs, outputs, listings))
    args = parser.parse_args(flags + _required_filled(parser, set(inputs)))
    for dest, paths in inputs.items():
        assert getattr(args, dest) == paths, dest
    for dest, made in _outputs(module).items():
        assert getattr(args, dest) == outputs[made]
    shared = {}
    for dest, listing in getattr(module, "LISTINGS", {}).items():
        shared.setdefault(listing, {}).update(listings[dest if dest in inputs else module.OUTPUTS[dest]])
    for listing, value in shared.items():
        assert json.loads(getattr(args, listing)) == value


def test_every_output_and_listing_names_an_artifact_and_an_argument():
    for stage in STAGES:
        module = stage_module(stage)
        outputs = _outputs(module)
        assert set(outputs.values()) <= set(ARTIFACTS), stage
        dests = {a.dest for a in _parser(stage)._actions}
        for described, listing in getattr(module, "LISTINGS", {}).items():
            assert described in (*module.INPUTS, *outputs) and listing in dests, (stage, described)


def test_gather_flags_keep_each_tables_parts_output_and_cells_together():
    """The order the DAG's gather param has had (issue 30): per table its parts, its gathered file
    and its parts' cells, then the query-model table and its slice."""
    module = stage_module("gather")
    flags = stage_flags(module, {"comparisons": ["c/a b.parquet"], "theory": ["t/a.parquet"]},
                        {"comparisons": "c.parquet", "theory": "t.parquet", "query_model": "q.parquet"},
                        {"comparisons": [{"dim": 64}], "theory": [], "query_model": {"scheme": "KQV"}})
    assert flags == ("--comparisons 'c/a b.parquet' --out-comparisons c.parquet --comparisons-cells "
                     "'[{\"dim\":64}]' --theory t/a.parquet --out-theory t.parquet --theory-cells '[]' "
                     "--out-query-model q.parquet --query-model-slice '{\"scheme\":\"KQV\"}'")


def test_figure_cell_digests_follow_every_input_merged():
    module = stage_module("figure")
    flags = stage_flags(module, {"per_query": ["q.parquet"], "theory": "t.parquet"},
                        listings={"per_query": {"q.parquet": "d1"}})
    assert flags == "--per-query q.parquet --cell-digests '{\"q.parquet\":\"d1\"}' --theory t.parquet"
    # no metrics file, no digests flag
    assert stage_flags(module, {"summary": "s.parquet"}, listings={}) == "--summary s.parquet"
    # gather's two display inputs share one --cell-digests, merged in declaration order
    flags = stage_flags(stage_module("gather"), {"display_per_key": ["k.parquet"], "display_per_query": ["q.parquet"]},
                        listings={"display_per_key": {"k.parquet": "d2"}, "display_per_query": {"q.parquet": "d1"}})
    assert flags == ("--display-per-key k.parquet --display-per-query q.parquet "
                     "--cell-digests '{\"k.parquet\":\"d2\",\"q.parquet\":\"d1\"}'")


def test_stage_flags_refuse_what_the_stage_does_not_declare():
    module = stage_module("gather")
    with pytest.raises(KeyError, match="per_query"):
        stage_flags(module, {"per_query": ["x"]})
    with pytest.raises(KeyError, match="claims_json"):
        stage_flags(module, outputs={"claims_json": "x"})
    with pytest.raises(KeyError, match="listing 'summary'"):
        stage_flags(module, listings={"summary": []})


def test_greedy_slice_refuses_block_statistics_without_a_chunk():
    """A scheme with statistics over blocks of rows (SKLT) scored greedy without a causal chunk
    would be scored on rows a streaming engine never stores: refused, naming the key."""
    config = _config(**{"real.e2e.greedy": {"schemes": ["RKV", "SKLT"], "budgets": [2]}})
    with pytest.raises(KvasymError, match=r"config key real.e2e.greedy.schemes: SKLT keeps statistics over blocks "
                                          r"of rows; give it a chunk in real.e2e.greedy.causal_chunks"):
        _slices(config)
    chunked = _config(**{"real.e2e.greedy": {"schemes": ["RKV", "SKLT"], "budgets": [2], "causal_chunks": {"SKLT": 8}}})
    assert _slices(chunked)["greedy"]["causal_chunks"] == {"SKLT": 8}


def test_scheme_definitions_list_every_scheme_the_dag_runs_once():
    """The paper's scheme table: the grid's, the frontier's and the end-to-end schemes, each once
    with its registry description, then the query-aware variants with theirs."""
    from kvasym.real.queryaware import VARIANT_DESCRIPTIONS

    config = _config()
    study = load_study(config)
    real = real_settings(config.get("real"), list(study.schemes), list(study.frontier_real_schemes))
    rows = study.scheme_definitions(real)
    names = [r["name"] for r in rows]
    assert len(names) == len(set(names))
    assert names[:4] == list(study.schemes) and set(study.frontier_schemes) <= set(names)
    assert set(real["e2e"]["schemes"]) <= set(names)
    for row in rows:
        expected = VARIANT_DESCRIPTIONS.get(row["name"]) or study.scheme(row["name"]).description
        assert row["description"] == expected and row["description"], row
    assert "QWF" in names and study.scheme_definitions(None)[:4] == rows[:4]


@pytest.mark.parametrize("text,match", [("[1", "not valid JSON"), ('{"a": 1}', "must be a JSON list"),
                                        ('[{"name": "KV"}]', "entry 0: expected")])
def test_the_tables_stage_refuses_a_bad_scheme_list(text, match):
    from kvasym.stages.tables import parse_schemes

    with pytest.raises(KvasymError, match=f"--schemes.*{match}|{match}"):
        parse_schemes(text)
    assert parse_schemes('[{"name": "KV", "description": "d"}]') == [{"name": "KV", "description": "d"}]
