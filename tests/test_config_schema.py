"""The config schema is the one source of the config's keys, types, ranges, defaults and docs.

- config/README.md's key tables are what the schema renders (a key missing from the docs fails);
- every key of the schema has a description (the docs' "meaning");
- the defaults the schema fills are what kvasym.study.load_study uses, and what Snakemake fills;
- bad configs give one line naming the key (more rows: tests/test_bad_inputs.py, CONFIG_CASES);
- the headline cell: its default rule and its errors.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from kvasym import config_schema
from kvasym.config_schema import (
    defaults,
    doc_blocks,
    kind_params,
    kind_rows,
    key_rows,
    load_schema,
    render_docs,
    undocumented,
    validate_config,
)
from kvasym.errors import KvasymError
from kvasym.study import load_study, load_study_file

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "config/README.md"
SCHEMA_FILE = ROOT / "workflow/schemas/config.schema.yaml"
TINY = yaml.safe_load((ROOT / "config/test.yaml").read_text())
MINIMAL = {
    "dims": [16],
    "budgets": [2],
    "schemes": ["KV"],
    "distributions": [{"name": "g", "kind": "gaussian"}],
}


def _config(**changes):
    """The tiny config without its headline (so the default rule applies) and its frontier (whose
    distributions name the tiny grid's), plus ``changes`` (a key mapped to None is removed)."""
    config = copy.deepcopy(TINY)
    config.pop("headline", None)
    config.pop("frontier", None)
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = copy.deepcopy(value)
    return config


# ---------------------------------------------------------------------------------------------
# the schema file and the docs


def test_schema_file_is_the_one_snakemake_reads():
    """The DAG validates its config once, through the library's reader of the workflow's schema
    file (kvasym.wiring.Wiring), and through no second validator."""
    assert config_schema.schema_path().resolve() == SCHEMA_FILE.resolve()
    common = (ROOT / "workflow/rules/common.smk").read_text()
    assert "Wiring(config, workflow.configfiles" in common
    assert "validate(" not in common and "validate_config" not in common


def test_schema_is_a_valid_draft_2020_12_schema():
    from jsonschema import Draft202012Validator

    schema = load_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)


def test_readme_key_tables_are_generated_from_the_schema():
    """(a) The README's blocks equal what the schema renders: a key added to the schema and not
    to the docs fails here (regenerate: python3 -m kvasym.config_schema --write-docs config/README.md)."""
    assert doc_blocks(README.read_text()) == render_docs()


def test_every_key_has_a_row_in_the_readme():
    text = README.read_text()
    for key, _, _ in key_rows():
        assert f"| `{key}` |" in text, key
    for kind, _ in kind_rows():
        assert f"| `{kind}` |" in text, kind


def test_a_new_key_changes_the_rendered_docs():
    schema = load_schema()
    schema["properties"]["new_key"] = {"description": "A key nobody documented yet.", "type": "integer"}
    assert render_docs(schema) != doc_blocks(README.read_text())
    assert "`new_key`" in render_docs(schema)["keys"]


def test_every_key_has_a_description():
    assert undocumented() == []


@pytest.mark.parametrize(
    "path, where",
    [
        (["properties", "stats", "properties", "n_boot"], "stats.n_boot"),
        (["properties", "headline", "properties", "dim"], "headline.dim"),
        (["$defs", "side", "properties", "qjl"], "user_schemes.<name>.K.qjl"),
        (["properties", "real", "then", "properties", "max_tokens"], "real.max_tokens"),
        (["properties", "distributions", "items", "properties", "dims"], "distributions[].dims"),
    ],
)
def test_a_key_without_description_fails(path, where):
    """(b) A property whose description is removed is reported, and the docs refuse to render."""
    schema = load_schema()
    node = schema
    for part in path:
        node = node[part]
    del node["description"]
    assert where in undocumented(schema)
    with pytest.raises(KvasymError, match="no description for"):
        render_docs(schema)


def test_a_kind_parameter_without_description_fails():
    schema = load_schema()
    for branch in schema["properties"]["distributions"]["items"]["allOf"]:
        if branch["if"]["properties"]["kind"]["const"] == "student_t":
            del branch["then"]["properties"]["params"]["properties"]["nu"]["description"]
    assert "distributions[].params.nu (kind student_t)" in undocumented(schema)


def test_kinds_and_params_match_the_library():
    """The schema's per-kind params are the ones kvasym.distributions accepts, with the same
    required ones and defaults (the schema checks them first; DistributionSpec still builds them)."""
    from kvasym.distributions import DISTRIBUTION_KINDS
    from kvasym.study import FILE_KIND

    branches = dict(kind_rows())
    assert set(branches) == set(DISTRIBUTION_KINDS) | {FILE_KIND}
    enum = load_schema()["properties"]["distributions"]["items"]["properties"]["kind"]["enum"]
    assert set(enum) == set(branches)
    for kind, params in DISTRIBUTION_KINDS.items():
        schema = kind_params(branches[kind])
        assert set(schema.get("properties", {})) == set(params), kind
        assert set(schema.get("required", ())) == {k for k, p in params.items() if p.default is None}, kind
        for name, param in params.items():
            if param.default is not None:
                assert schema["properties"][name]["default"] == param.default, (kind, name)


def test_cli_checks_and_writes_the_docs(tmp_path, capsys):
    fresh = tmp_path / "fresh.md"
    fresh.write_text(README.read_text())
    assert config_schema.main(["--check-docs", str(fresh)]) == 0
    stale = tmp_path / "stale.md"
    stale.write_text(README.read_text().replace("| `seq_len` |", "| `seq_lenn` |"))
    assert config_schema.main(["--check-docs", str(stale)]) == 1
    assert "stale" in capsys.readouterr().err
    assert config_schema.main(["--write-docs", str(stale)]) == 0
    assert stale.read_text() == README.read_text()
    unmarked = tmp_path / "unmarked.md"
    unmarked.write_text("# no markers\n")
    assert config_schema.main(["--write-docs", str(unmarked)]) == 2
    assert "keys:begin" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# defaults


def test_schema_defaults_are_what_load_study_uses():
    """(c) A config with only the required keys gets exactly the schema's defaults."""
    expected = defaults()
    study = load_study(MINIMAL)
    got = {
        "base_seed": study.base_seed,
        "norm_dtype": study.norm_dtype,
        "user_schemes": {name: s.to_dict() for name, s in study.schemes.items() if name not in MINIMAL["schemes"]},
        "seq_len": study.seq_len,
        "n_queries": study.n_queries,
        "trials": study.trials,
        "per_key_trials": study.per_key_trials,
        "sharpness": list(study.sharpness),
        "stats": study.stats,
        "theory": study.theory,
        "claims_file": study.claims_file,
        "frontier": {"schemes": list(study.frontier_schemes), "distributions_of": study.frontier_distributions_of,
                     "keep_packed": study.frontier_keep_packed, "extra_budgets": study.frontier_extra_budgets,
                     "real_query_aware": list(study.frontier_real_query_aware)},
        "query_models": study.query_models,
        # no lengths: no sweep (the study keeps nothing of it)
        "seq_len_sweep": {"n_queries": 64, "seq_lens": [], "trials": 8} if not study.seq_len_sweep else None,
    }
    assert got == expected
    assert expected["stats"] == {"n_boot": 1000, "n_permutations": 200, "energy_max_n": 512}


@pytest.mark.parametrize(
    "config",
    [
        MINIMAL,
        {**MINIMAL, "stats": {"n_boot": 10}, "real": {"max_tokens": 48}},
        {**MINIMAL, "distributions": [{"name": "g", "kind": "gaussian"}, {"name": "lr", "kind": "low_rank",
                                                                           "params": {"rank": 2}},
                                      {"name": "f", "kind": "file", "params": {"path": "c.npz"}}]},
        TINY,
        yaml.safe_load((ROOT / "config/config.yaml").read_text()),
    ],
    ids=["minimal", "partial_sections", "kinds", "tiny", "paper"],
)
def test_snakemake_fills_the_same_defaults(config):
    """Snakemake's validate (set_default=True) and validate_config fill the same values."""
    from snakemake.utils import validate

    ours = validate_config(config)
    theirs = copy.deepcopy(config)
    validate(theirs, str(SCHEMA_FILE))
    assert ours == theirs


def test_partial_sections_are_filled_key_by_key():
    filled = validate_config({**MINIMAL, "stats": {"n_boot": 10}})
    assert filled["stats"] == {"n_boot": 10, "n_permutations": 200, "energy_max_n": 512}
    filled = validate_config({**MINIMAL, "distributions": [{"name": "f", "kind": "file", "params": {"path": "c.npz"}},
                                                           {"name": "lr", "kind": "low_rank", "params": {"rank": 2}}]})
    assert filled["distributions"][0]["params"] == {"path": "c.npz", "causal": True}
    assert filled["distributions"][1]["params"] == {"rank": 2, "noise": 0.0}


def test_validate_config_leaves_its_argument_alone():
    config = copy.deepcopy(MINIMAL)
    validate_config(config)
    assert config == MINIMAL


def test_real_defaults_match_real_settings():
    """The schema's defaults of the real section are kvasym.real.real_settings' own."""
    from kvasym.real import real_settings

    filled = validate_config({**MINIMAL, "real": {}})["real"]
    assert filled == {"texts": "all", "max_tokens": 512, "layers": "all", "models": {}}
    assert real_settings(filled) == real_settings({})
    for off in ("off", False, None):
        assert validate_config({**MINIMAL, "real": off})["real"] is off
        assert real_settings(off) is None


def test_validate_key_checks_one_section_as_the_whole_config_does():
    """kvasym.real.real_settings gets the real section alone: validate_key applies the schema's
    checks and defaults of that key, with the whole config's error, word for word."""
    from kvasym.config_schema import validate_key
    from kvasym.real import real_settings

    assert validate_key("real.e2e", {"own": "quantized"}) == {
        "texts": "all", "schemes": "all", "draws": 1, "rope": ["post", "pre"], "extra_budgets": {}, "own": "quantized",
        "sensitivity_layers": "all", "sensitivity_schemes": "study", "query_aware": [], "calibration_texts": "auto",
        "recent_windows": {}, "causal_chunks": {}, "global_only": [], "extra_schemes": [], "parts": 1}
    assert validate_key("real", {}) == validate_config({**MINIMAL, "real": {}})["real"]
    for real in ({"max_tokens": 1}, {"layers": [0, 0]}, {"e2e": {"rope": []}}, {"e2e": {"blocks": 3}}, "on"):
        with pytest.raises(KvasymError) as whole:
            validate_config({**MINIMAL, "real": real})
        with pytest.raises(KvasymError) as alone:
            real_settings(real)
        assert str(alone.value) == str(whole.value), real


# ---------------------------------------------------------------------------------------------
# errors


@pytest.mark.parametrize(
    "change, message",
    [
        ({"stats": 5}, "config key stats: must be a mapping, got 5"),
        ({"theory": {"n_probes": 0}}, "config key theory.n_probes: must be in 1..10000000, got 0"),
        ({"dims": [64.0]}, "config key dims[0]: must be an integer, got 64.0"),
        ({"sharpness": [1.0, 1]}, "config key sharpness: has duplicates: [1.0, 1]"),
        ({"sharpness": [float("nan")]}, "config key sharpness[0]: must be a finite number, got nan"),
        ({"distributions": [{"name": "g", "kind": "gaussian", "params": {"nu": 3}}]},
         "unknown config key(s): distributions[0].params.nu; allowed: none"),
        ({"distributions": [{"name": "g", "kind": "gaussian"}, {"name": "c", "kind": "concentrated",
                                                                 "params": {"n_outliers": 2, "outlier_scale": 0}}]},
         "config key distributions[1].params.outlier_scale: must be > 0 and <= 1000000, got 0"),
        ({"distributions": [{"name": "g"}]}, "config key distributions[0]: missing required key(s): kind"),
        ({"user_schemes": {"AB": {"K": {"rotate": True, "scalar_bits": "n-x", "qjl": False},
                                  "V": {"rotate": True, "scalar_bits": "n", "qjl": False}}}},
         "config key user_schemes.AB.K.scalar_bits: must be n or n-k (k a whole number), got 'n-x'"),
        ({"user_schemes": {"AB": {"K": {"rotate": True, "scalar_bits": "n", "qjl": False}}}},
         "config key user_schemes.AB: missing required key(s): V"),
        ({"claims_file": "  "}, "config key claims_file: must be a path to a YAML file, got '  '"),
        ({"real": {"texts": "some"}}, "config key real.texts: must be all or a non-empty list of distinct text names"),
        ({"real": {"layers": [0, 30]}}, "config key real.layers: must be all or a non-empty list of distinct layer"),
        ({"real": {"max_token": 5}},
         "unknown config key(s): real.max_token; allowed: card, e2e, layers, max_tokens, models, texts"),
        ({"real": 3}, "config key real: must be a mapping, or off (or false), got 3"),
        ({"headline": {"dim": 64.0}}, "config key headline.dim: must be an integer, got 64.0"),
        ({"headline": [64]}, "config key headline: must be a mapping, got [64]"),
    ],
)
def test_bad_config_is_one_line_naming_the_key(change, message):
    """(d) Schema errors: one line, the key path, the rule, the value given (no jsonschema dump)."""
    with pytest.raises(KvasymError) as info:
        load_study(_config(**change))
    text = str(info.value)
    assert message in text
    assert "\n" not in text and "Failed validating" not in text


def test_bad_config_file_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_config(trials=0)))
    with pytest.raises(KvasymError, match=r"bad\.yaml: config key trials: must be in 1\.\.100000, got 0"):
        load_study_file(path)


# ---------------------------------------------------------------------------------------------
# the headline cell


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({}, {"distribution": "gaussian", "dim": 64, "sharpness": 1.0, "budget": 4}),
        ({"budgets": [2, 3]}, {"distribution": "gaussian", "dim": 64, "sharpness": 1.0, "budget": 3}),
        ({"sharpness": [4.0, 1.0]}, {"distribution": "gaussian", "dim": 64, "sharpness": 4.0, "budget": 4}),
        (
            {"distributions": [{"name": "mine", "kind": "file", "params": {"path": "c.npz"}},
                               {"name": "t3", "kind": "student_t", "params": {"nu": 3}, "dims": [32, 64]},
                               {"name": "gaussian", "kind": "gaussian"}]},
            {"distribution": "t3", "dim": 32, "sharpness": 1.0, "budget": 4},
        ),
        (
            {"headline": {"distribution": "lowrank4"}},
            {"distribution": "lowrank4", "dim": 64, "sharpness": 1.0, "budget": 4},
        ),
        (
            {"headline": {"sharpness": 4, "budget": 2}},
            {"distribution": "gaussian", "dim": 64, "sharpness": 4.0, "budget": 2},
        ),
        (
            {"dims": [32, 64], "headline": {"dim": 64}},
            {"distribution": "gaussian", "dim": 64, "sharpness": 1.0, "budget": 4},
        ),
    ],
    ids=["default", "no_budget_4", "first_sharpness", "first_synthetic", "partial_distribution",
         "partial_sharpness_budget", "partial_dim"],
)
def test_headline_default_rule(changes, expected):
    """(e) Fields left out: the first synthetic distribution, its first dim, the first sharpness,
    budget 4 if the grid has it, else the largest."""
    headline = load_study(_config(**changes)).headline
    assert headline == expected
    assert set(headline) == {"distribution", "dim", "sharpness", "budget"}
    assert [type(headline[k]) for k in ("distribution", "dim", "sharpness", "budget")] == [str, int, float, int]


def test_shipped_headlines():
    assert load_study_file(ROOT / "config/config.yaml").headline == {
        "distribution": "gaussian", "dim": 128, "sharpness": 2.0, "budget": 4}
    assert load_study_file(ROOT / "config/test.yaml").headline == {
        "distribution": "gaussian", "dim": 64, "sharpness": 1.0, "budget": 4}
    # what the default rule gives the tiny grid is the same cell
    assert load_study(_config()).headline == load_study_file(ROOT / "config/test.yaml").headline


@pytest.mark.parametrize(
    "headline, message",
    [
        ({"distribution": "nope"}, "config key headline.distribution: must be a synthetic distribution of the grid "
                                   "(gaussian, t1.05, lowrank4), got 'nope'"),
        ({"dim": 128}, "config key headline.dim: must be a dim of gaussian (64), got 128"),
        ({"sharpness": 2.0}, "config key headline.sharpness: must be one of sharpness (1, 4), got 2.0"),
        ({"budget": 3}, "config key headline.budget: must be one of budgets (2, 4), got 3"),
        ({"budget": 9}, "config key headline.budget: must be in 1..8, got 9"),
        ({"cell": 1}, "unknown config key(s): headline.cell; allowed: budget, dim, distribution, sharpness"),
    ],
)
def test_headline_errors_name_the_field(headline, message):
    """(e) Each given field must be in the grid."""
    with pytest.raises(KvasymError) as info:
        load_study(_config(headline=headline))
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_headline_cannot_be_a_file_distribution():
    config = _config(distributions=[{"name": "gaussian", "kind": "gaussian"},
                                    {"name": "mine", "kind": "file", "params": {"path": "c.npz"}}],
                     headline={"distribution": "mine"})
    with pytest.raises(KvasymError, match=r"headline\.distribution: .*\(a file distribution cannot be the headline\)"):
        load_study(config)


def test_the_workflow_reports_a_schema_error_in_one_line(tmp_path):
    """Snakemake's own validator printed an ~18-line schema dump with the key only at its end;
    the workflow now asks the library first (a dry run, so no job runs)."""
    from snakemake_workdir import make_workdir, snakemake

    workdir = make_workdir(tmp_path / "w")
    config = yaml.safe_load((ROOT / "config" / "test.yaml").read_text())
    config["seq_len"] = 0
    (workdir / "bad.yaml").write_text(yaml.safe_dump(config))
    proc = snakemake(workdir, "-n", "--configfile", "bad.yaml")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "invalid config: config key seq_len: must be in 2..10000000, got 0" in out, out[-2000:]
    assert "Failed validating" not in out and "On instance" not in out


def test_every_key_of_the_docs_has_a_type() -> None:
    """A key whose schema gives only an enum was documented as of type "None" (18 keys: the
    scheme sides' sketch, transform, scalar, ...; real.e2e's rope and own): its type is its
    values' type."""
    rows = [line.split(" | ") for block in render_docs().values() for line in block.splitlines()
            if line.startswith("| `")]
    untyped = [row[0] for row in rows if "None" in row[1]]
    assert rows and not untyped, untyped
