"""The config model: schema defaults agree with the library, bad configs name their key."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from kvasym.errors import KvasymError
from kvasym.study import DEFAULTS, canonical_json, load_study, load_study_file

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
TINY = yaml.safe_load((ROOT / "config/test.yaml").read_text())


def test_library_defaults_are_the_schema_defaults():
    """kvasym.study.DEFAULTS is derived from the schema (one source): every optional key with a
    default, nested sections filled key by key."""
    from kvasym.config_schema import defaults

    assert DEFAULTS == defaults()
    assert set(DEFAULTS) == {k for k, v in SCHEMA["properties"].items() if "default" in v}
    assert DEFAULTS["stats"] == {k: v["default"] for k, v in SCHEMA["properties"]["stats"]["properties"].items()}


def test_schema_top_level_keys_equal_library_keys():
    from kvasym.study import TOP_KEYS

    assert set(SCHEMA["properties"]) == TOP_KEYS


@pytest.mark.parametrize("path", ["config/config.yaml", "config/test.yaml"])
def test_shipped_configs_load(path):
    study = load_study_file(ROOT / path)
    cells = list(study.cells())
    assert len(cells) == len(set(cells)) > 0


def test_paper_grid_size():
    study = load_study_file(ROOT / "config/config.yaml")
    n_data = len(list(study.data_cells()))
    n_cells = len(list(study.cells()))
    assert n_cells == n_data * len(study.schemes) * len(study.budgets)
    assert 100 <= n_data + 2 * n_cells <= 1000, "job count must stay in the hundreds"
    assert study.trials * study.n_queries >= 1000, "thousands of per-query samples per cell"


#: The tiny frontier without its RKV n = 5 (frontier.extra_budgets names RKV), for configs without RKV.
FRONTIER_NO_EXTRA = {k: v for k, v in TINY["frontier"].items() if k != "extra_budgets"}


def _mutated(**changes):
    config = copy.deepcopy(TINY)
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    return config


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"budgetz": [4]}, "unknown config key(s): budgetz"),
        ({"budgets": [0, 4]}, "budgets[0]"),
        ({"budgets": [4, 4]}, "duplicates"),
        ({"dims": [2]}, "dims[0]"),
        ({"dims": [10**6]}, "dims[0]"),
        ({"trials": 0}, "trials"),
        ({"schemes": ["KQV", "XYZ"]}, "schemes[1] = 'XYZ'"),
        ({"sharpness": [0.0]}, "sharpness[0]"),
        ({"norm_dtype": "float64"}, "norm_dtype"),
        ({"per_key_trials": 99}, "per_key_trials"),
        ({"distributions": [{"name": "a", "kind": "gaussian"}, {"name": "a", "kind": "gaussian"}]}, "duplicated"),
        ({"distributions": [{"name": "lr", "kind": "low_rank", "params": {"rank": 65}}]}, "rank = 65 exceeds dim = 64"),
        ({"distributions": [{"name": "t", "kind": "student_t", "params": {"nu": 1.0}}]}, "nu"),
        ({"distributions": [{"name": "bad/name", "kind": "gaussian"}]}, "bad/name"),
        ({"dims": None}, "missing required key(s): dims"),
        (
            {"user_schemes": {"UH": {"K": {"rotate": True, "scalar_bits": "n", "qjl": False},
                                     "V": {"rotate": False, "scalar_bits": "n-1", "qjl": True, "sketch": "hadamard"}}},
             "schemes": ["UH"], "dims": [64, 96]},
            "scheme UH side V uses the hadamard sketch without rotation, which needs a power-of-two dimension; "
            "the grid has dims [96]",
        ),
        (
            {"user_schemes": {"UH": {"K": {"rotate": True, "scalar_bits": "n", "qjl": False},
                                     "V": {"rotate": True, "scalar_bits": "n-1", "qjl": True, "sketch": "haar"}}},
             "schemes": ["UH"]},
            "sketch",
        ),
        (
            {"user_schemes": {"Q2": {"K": {"rotate": True, "scalar_bits": "n-2", "qjl": True},
                                     "V": {"rotate": True, "scalar_bits": "n", "qjl": False}}},
             "schemes": ["Q2"]},
            "scheme Q2 side K at budget n=2: spends 1 bits",
        ),
    ],
)
def test_bad_config_names_the_key(changes, message):
    with pytest.raises(KvasymError) as info:
        load_study(_mutated(**changes))
    assert message in str(info.value)


def test_user_scheme_runs_alongside_builtins():
    config = _mutated(
        user_schemes={"VQ": {"K": {"rotate": True, "scalar_bits": "n", "qjl": False},
                             "V": {"rotate": False, "scalar_bits": "n-1", "qjl": True}}},
        schemes=["KQV", "VQ"], frontier=FRONTIER_NO_EXTRA,
    )
    study = load_study(config)
    assert list(study.schemes) == ["KQV", "VQ"]
    assert study.cell_slice("gaussian", 64, "VQ", 4)["scheme"]["V"] == {"rotate": False, "scalar_bits": "n-1",
                                                                       "qjl": True}


def test_hadamard_user_scheme_is_accepted_and_reaches_the_slice():
    """A rotated side pads any dim to a power of two, so the hadamard sketch runs at every dim."""
    hadamard = {"rotate": True, "scalar_bits": "n-1", "qjl": True, "sketch": "hadamard"}
    config = _mutated(user_schemes={"KQVH": {"K": {"rotate": True, "scalar_bits": "n", "qjl": False}, "V": hadamard}},
                      schemes=["KQV", "KQVH"], dims=[64, 96], frontier=FRONTIER_NO_EXTRA)
    study = load_study(config)
    assert study.cell_slice("gaussian", 96, "KQVH", 4)["scheme"]["V"] == hadamard
    assert "sketch" not in study.cell_slice("gaussian", 96, "KQV", 4)["scheme"]["V"]


def test_slices_are_narrow_and_canonical():
    study = load_study(TINY)
    data = study.data_slice("gaussian", 64)
    cell = study.cell_slice("gaussian", 64, "KQV", 4)
    # the data slice does not depend on schemes, budgets or sharpness: adding a budget or a
    # sharpness leaves every existing job's params (Snakemake's rerun trigger) unchanged
    assert "budget" not in data and "sharpness" not in data and "scheme" not in data
    assert "sharpness" not in cell
    wider = load_study(_mutated(budgets=[2, 3, 4], sharpness=[1.0, 2.0, 4.0]))
    assert canonical_json(wider.cell_slice("gaussian", 64, "KQV", 4)) == canonical_json(cell)
    assert canonical_json(cell) == canonical_json(dict(reversed(list(cell.items()))))
