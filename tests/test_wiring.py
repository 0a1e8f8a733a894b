"""The DAG's wiring (kvasym.wiring.Wiring) without Snakemake: the config validated once, every
refusal one line naming the key, and the jobs' inputs and targets checked against the artifact
catalogue and against a brute-force listing of what the config asks for."""

from __future__ import annotations

import copy
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


def test_the_config_is_validated_once_by_the_schema(monkeypatch):
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
