"""The DAG's wiring (kvasym.wiring.Wiring) without Snakemake: the config validated once, every
refusal one line naming the key, and the jobs' inputs and targets checked against the artifact
catalogue and against a brute-force listing of what the config asks for."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from kvasym import config_schema
from kvasym.artifacts import ARTIFACTS, template_regex
from kvasym.config_io import read_yaml_mapping
from kvasym.errors import KvasymError
from kvasym.render.tables import TABLES
from kvasym.wiring import Wiring, names_pattern, wildcards

ROOT = Path(__file__).resolve().parents[1]
TEST_CONFIG = ROOT / "config/test.yaml"


@pytest.fixture(scope="module")
def tiny() -> Wiring:
    config = read_yaml_mapping(TEST_CONFIG)
    config["claims_file"] = str(ROOT / config["claims_file"])
    return Wiring(config, [TEST_CONFIG], paper_dir=ROOT / "paper")


def _config(**changes) -> dict:
    config = read_yaml_mapping(TEST_CONFIG)
    config["claims_file"] = str(ROOT / config["claims_file"])
    config.update(copy.deepcopy(changes))
    return config


def _flat(items) -> list[str]:
    return [f for item in items for f in (_flat(item) if isinstance(item, (list, tuple)) else [item])]


def _artifact_of(file: str) -> str:
    """The one artifact whose template ``file`` is an instance of."""
    names = [name for name in ARTIFACTS if template_regex(name).fullmatch(file)]
    assert names, f"{file} is no artifact's path"
    return names[0]


def test_the_config_gets_two_schema_passes_not_four(monkeypatch):
    """Two passes of the schema over the whole config: the wiring's, then the Study's own over the
    filled-in copy, which leaves it as it is (before, a parse ran four and the reproduce and crate
    params one more each); the real section's sub-schema passes are not counted."""
    calls = []
    real = config_schema.first_error

    def counting(instance, schema):
        if isinstance(instance, dict) and "base_seed" in instance:  # the whole config, not a section
            calls.append(schema.get("title"))
        return real(instance, schema)

    monkeypatch.setattr(config_schema, "first_error", counting)
    wiring = Wiring(_config(), [TEST_CONFIG], paper_dir=ROOT / "paper")
    whole = [c for c in calls if c == "kvasym study configuration"]
    assert len(whole) == 2, calls
    assert wiring.config == config_schema.validate_config(_config())


@pytest.mark.parametrize("change, message", [
    ({"budgets": [1]}, "invalid config: "),
    ({"schemes": ["KV", "NOPE"]}, "schemes[1] = 'NOPE'"),
    ({"claims_file": "config/does-not-exist.yaml"}, "invalid config: claims_file: "),
])
def test_a_bad_config_is_one_line_naming_it(change, message):
    with pytest.raises(KvasymError) as info:
        Wiring(_config(**change), [TEST_CONFIG], paper_dir=ROOT / "paper")
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_a_distribution_named_as_a_real_row_is_refused():
    config = _config()
    config["distributions"] = [*config["distributions"], {"name": "smollm2", "kind": "gaussian", "params": {}}]
    with pytest.raises(KvasymError, match=r"invalid config: distribution name\(s\) \['smollm2'\] are reserved"):
        Wiring(config, [TEST_CONFIG], paper_dir=ROOT / "paper")


def test_a_missing_cache_file_is_named_by_its_key(tmp_path):
    entry = {"name": "mine", "kind": "file", "params": {"path": str(tmp_path / "absent.npz")}}
    config = _config()
    config["distributions"] = [*config["distributions"], entry]
    with pytest.raises(KvasymError, match=r"invalid config: distributions\[mine\]\.params\.path"):
        Wiring(config, [TEST_CONFIG], paper_dir=ROOT / "paper")


def test_a_paper_using_an_unknown_table_is_refused(tmp_path):
    (tmp_path / "sections").mkdir()
    (tmp_path / "main.tex").write_text("\\kvtable{nonesuch}\n")
    with pytest.raises(KvasymError, match="nonesuch"):
        Wiring(_config(), [TEST_CONFIG], paper_dir=tmp_path)


def test_names_pattern_matches_exactly_the_names():
    pattern = re.compile(names_pattern(["t1.05", "a+b"]))
    assert pattern.fullmatch("t1.05") and pattern.fullmatch("a+b")
    assert not pattern.fullmatch("t1x05") and not pattern.fullmatch("ab")
    assert not re.compile(names_pattern([])).fullmatch("")


def test_e2e_parts_are_every_part_in_order(tiny):
    model = tiny.e2e_models[0]
    parts = tiny.model_sections[model]["e2e"]["parts"]
    files = tiny.e2e_parts(wildcards(model=model, text="bicycle_repair"))
    assert len(files) == parts
    assert [int(re.search(r"part(\d+)", f).group(1)) for f in files] == list(range(parts))


def test_model_level_inputs_are_the_configs_brute_force_listing(tiny):
    """Long windows, passkey parts and card parts: one file per (model, length or text, part),
    counted from the config's numbers, each the path of the artifact its rule writes."""
    long_ = tiny.e2e_long_windows()
    assert len(long_) == sum(len(tiny.long_of[m]["lengths"]) * tiny.long_of[m]["parts"] for m in tiny.long_models)
    assert {_artifact_of(f) for f in long_} == {"e2e_long_window"}
    passkey = tiny.passkey_tables()
    assert len(passkey) == sum(len(tiny.passkey_of[m]["lengths"]) * tiny.passkey_of[m]["parts"]
                               for m in tiny.passkey_models)
    for model in tiny.card_models:
        card = tiny.card_of[model]
        files = tiny.card_sensitivity_parts(model=model)
        assert len(files) == len(card["calibration_texts"]) * card["parts"] == len(set(files))


def test_synthetic_cell_files_become_their_unit_folders(tiny):
    w = wildcards(distribution="gaussian", dim=64)
    files = tiny.per_query_inputs(w)
    assert len(files) == len(tiny.study.schemes) * len(tiny.study.budgets)
    assert tiny.as_inputs(files) == ["results/metrics/per_query/gaussian/d64"]
    real = wildcards(distribution=tiny.real_cells[0][0], dim=tiny.real_cells[0][1])
    assert tiny.as_inputs(tiny.per_query_inputs(real)) == tiny.per_query_inputs(real)


def test_every_target_and_crate_part_is_a_catalogued_artifact(tiny):
    files = [*tiny.data_manifests(), *tiny.metrics_tables(), *tiny.e2e_targets(), *tiny.card_targets(),
             *tiny.greedy_targets(), *tiny.frontier_targets(), *tiny.seq_len_targets(),
             *tiny.figure_outputs().values(), *_flat(tiny.crate_parts())]
    for file in files:
        _artifact_of(file)
    tables = {Path(f).stem for f in tiny.paper_targets() if f.endswith(".tex") and "/table_" in f}
    assert tables == set(TABLES)


def test_metrics_cells_name_every_cell_in_the_order_of_its_files(tiny):
    import json

    w = wildcards(distribution="t1.05", dim=64)
    cells = json.loads(tiny.metrics_cells(w))
    files = tiny.per_query_inputs(w)
    assert [(c["scheme"], c["budget"]) for c in cells] == [
        (m["scheme"], int(m["budget"])) for m in (template_regex("per_query").fullmatch(f).groupdict() for f in files)]
    assert len({c["slice_sha256"] for c in cells}) == len(cells)


def test_real_captures_without_real_rows_are_refused_with_the_reason():
    wiring = Wiring(_config(real=None), [TEST_CONFIG], paper_dir=ROOT / "paper")
    assert wiring.real_cells == [] and wiring.e2e_targets() == []
    with pytest.raises(KvasymError, match="real-model rows are not configured"):
        wiring.real_capture_files()


# ---------------------------------------------------------------------------------------------
# the jobs' command lines, derived from the stages' parsers (Wiring.stage_params)


class _Files(list):
    """A job's input or output files as Snakemake's params functions see them: a list whose named
    items are also keys."""

    def __init__(self, *unnamed: str, **named: str | list[str]) -> None:
        super().__init__([*unnamed, *[f for v in named.values() for f in ([v] if isinstance(v, str) else v)]])
        self._named = named

    def keys(self):
        return self._named.keys()

    def __getitem__(self, key):
        return self._named[key] if isinstance(key, str) else super().__getitem__(key)


def _parsed(stage: str, args: str) -> dict:
    import argparse
    import shlex

    from kvasym.stages import stage_module

    parser = argparse.ArgumentParser()
    stage_module(stage).add_arguments(parser)
    return vars(parser.parse_args(shlex.split(args)))


def test_a_jobs_arguments_are_what_its_stage_parses(tiny):
    """The e2e_join job: its slice, named input (parts) and single unnamed output (--out), as
    the stage's own parser reads them back."""
    model = tiny.e2e_models[0]
    w = wildcards(model=model, text="bicycle_repair")
    params = tiny.stage_params("e2e_join")
    parts = tiny.e2e_parts(w)
    args = params["args"](w, _Files(parts=parts), _Files("results/x.parquet"))
    parsed = _parsed("e2e_join", args)
    assert parsed["parts"] == parts and parsed["out"] == "results/x.parquet"
    assert json.loads(parsed["slice"]) == tiny.job_slice("e2e_join", w)


def test_named_outputs_take_the_out_flag_the_stage_has(tiny):
    outputs = {name: f"results/{name}.parquet" for name in tiny.card_outputs}
    model = tiny.card_models[0]
    w = wildcards(model=model)
    sensitivity = tiny.card_sensitivity_parts(w)
    args = tiny.stage_params("card")["args"](w, _Files(sensitivity=sensitivity), _Files(**outputs))
    parsed = _parsed("card", args)
    assert all(parsed[f"out_{name}"] == path for name, path in outputs.items())
    assert parsed["sensitivity"] == sensitivity


def test_a_given_value_replaces_the_input_of_its_name_and_is_recorded(tiny):
    """Theory: the job depends on its unit's folder, the stage is given the files inside it and
    their cells; the config param (what Snakemake records and compares) holds the slice and the
    cells, not the files' folder."""
    import inspect

    w = wildcards(distribution="gaussian", dim=64)
    params = tiny.stage_params("theory", per_key=tiny.per_key_inputs, cells=tiny.metrics_cells)
    args = params["args"](w, _Files(*tiny.per_key_folders(w), data="results/data/gaussian/d64.json"),
                          _Files("results/theory/part.parquet"))
    parsed = _parsed("theory", args)
    assert parsed["per_key"] == tiny.per_key_inputs(w)
    assert json.loads(parsed["cells"]) == json.loads(tiny.metrics_cells(w))
    # Snakemake records a param only when its function names neither input nor output
    assert set(inspect.signature(params["config"]).parameters) == {"wildcards"}
    recorded = json.loads(params["config"](w))
    assert recorded["slice"] == tiny.job_slice("theory", w)
    assert recorded["cells"] == tiny.metrics_cells(w) and recorded["per_key"] == tiny.per_key_inputs(w)


def test_the_recorded_config_follows_the_slice():
    """A changed setting changes the recorded param (Snakemake's rerun trigger)."""
    one = Wiring(_config(), [TEST_CONFIG], paper_dir=ROOT / "paper")
    other = Wiring(_config(trials=4), [TEST_CONFIG], paper_dir=ROOT / "paper")
    w = wildcards(distribution="gaussian", dim=64)
    assert one.stage_params("cells")["config"](w) != other.stage_params("cells")["config"](w)


def test_a_name_without_a_flag_and_a_missing_required_flag_are_refused(tiny):
    w = wildcards(distribution="gaussian", dim=64)
    with pytest.raises(KvasymError, match=r"rule theory: input per_keys has no flag .*--per-keys"):
        tiny.stage_params("theory")["args"](w, _Files(per_keys=["a"], data="d.json"), _Files("o.parquet"))
    with pytest.raises(KvasymError, match=r"rule theory: `kvasym stage theory` requires --per-key,"):
        tiny.stage_params("theory")["args"](w, _Files(data="d.json"), _Files("o.parquet"))


def test_every_dry_run_command_is_one_its_stage_parses(tmp_path):
    """Each job of the tiny config's dry run: its shell command parses with its stage's parser, and
    the rules spell no flag (every one comes from stage_params or a stage's own declarations)."""
    import shlex
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-p", "-F", "--configfile", "config/test.yaml"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    commands = [line.removeprefix("Shell command: ") for line in (proc.stdout + proc.stderr).splitlines()
                if line.startswith("Shell command: kvasym stage")]
    assert len(commands) >= 60
    for command in commands:
        words = shlex.split(re.sub(r" > \S+ 2>&1$", "", command))
        _parsed(words[2], " ".join(map(shlex.quote, words[3:])))
    for rules in (ROOT / "workflow/rules").glob("*.smk"):
        shells = re.findall(r'shell:\s*\n\s*((?:"[^"\n]*"\s*)+)', rules.read_text())
        assert not any(re.search(r"--[a-z]", s) for s in shells), rules.name


def test_e2e_stats_waits_for_the_gathered_summary_only_without_a_frontier(tiny):
    """Rule e2e_stats reads the real rows' attention KL from the frontier's points when the config
    has a frontier, so it does not wait for the gathered summary (every stats job, then gather):
    that wait made the paper DAG's longest chain run through the synthetic grid's stats. Without
    a frontier the summary is its input, and the stage refuses to run with neither."""
    from kvasym.artifacts import pattern
    from kvasym.stages.e2e_stats import run_e2e_stats

    assert tiny.frontier and tiny.e2e_attention_summary() == []
    assert tiny.frontier_targets()[:1] == [pattern("frontier_points")]
    config = _config(frontier={"schemes": []})
    assert Wiring(config, [TEST_CONFIG], paper_dir=ROOT / "paper").e2e_attention_summary() == [pattern("summary")]
    slice_ = {"schemes": ["RKV"], "study_schemes": ["RKV"], "budgets": [2], "base_seed": 1, "n_boot": 20}
    with pytest.raises(KvasymError, match=r"--frontier \(the frontier's points\) or --summary"):
        run_e2e_stats(slice_, ["t.parquet"], None, {}, frontier_points=None)
