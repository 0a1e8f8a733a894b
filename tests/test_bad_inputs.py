"""Bad input, tried as a hostile user would: every case is a row of a parametrized table.

Each row names the input and the behaviour observed: rejected with a :class:`KvasymError` (the
CLI: ``kvasym: error: ...`` and a non-zero exit) whose one-line message names the offending key,
file or value, no traceback from inside numpy/pandas, nothing half-written; or *accepted*, for
inputs that are legitimate (documented below and in config/README.md).

Tables (ids are the pytest ids):

- ``CONFIG_CASES``: the study config, through the library (``kvasym.study.load_study``, what
  ``kvasym stage --config`` uses) and through the JSON schema + library as
  ``workflow/rules/common.smk`` runs them; ``SNAKEMAKE_CASES`` replays a handful through the real
  ``snakemake -n`` to check the message the user actually sees and that results/ is not created.
- ``NAME_POLICY``: distribution names. Rejected: ``/``, spaces, ``%``, non-ASCII, names starting
  with ``.``, ``_`` or ``-`` (``..`` escapes results/, and pyarrow's dataset reader silently skips
  folders starting with ``.`` or ``_``), more than 64 characters, names equal but for case.
  Accepted and escaped: ``_ . + -`` inside a name (``_`` becomes ``\\_`` in LaTeX).
- ``CLAIMS_CASES``: the claims ledger (``load_claims``) and claims that name a statistic, metric,
  check or column that does not exist (evaluated on real tables from a mini run).
- ``CLI_REJECTED`` / ``CLI_ACCEPTED``: caches given to ``kvasym evaluate`` (and quantize /
  dequantize). Accepted on purpose: integer and float16 dtypes (converted to float64), zero
  rows, all-zero K, V or Q, a single key, values whose head_dim differs from the keys' (attention
  allows it; V is quantized in its own dimension). Rejected although finite: norms beyond the
  norm dtype's range, non-zero norms that would be stored as 0 (the row silently lost), logits
  that overflow float64 or pass ``kvasym.metrics.LOGIT_LIMIT``.
- ``TAMPERED``: intermediates changed between runs (truncated, foreign or stale packed caches,
  manifests and Parquet tables): the next stage stops with an error naming the file and saying
  how to rebuild it, and writes nothing.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from snakemake_workdir import ROOT, make_workdir, run_env, snakemake

from kvasym.claims import STATISTICS, evaluate_claims, load_claims
from kvasym.stages.claims import run_claims
from kvasym.stages.cells import run_cells
from kvasym.stages.gather import HOLM_FAMILIES, gather
from kvasym.stages.metrics import run_metrics
from kvasym.stages.stats import run_stats
from kvasym.stages.theory import run_theory
from kvasym.cli import main
from kvasym.dataset import read_table, to_table, write_parquet_atomic, PER_QUERY_SCHEMA
from kvasym.errors import DamagedFile, KvasymError
from kvasym.render.format import escape_latex
from kvasym.study import load_study

SCHEMA = ROOT / "workflow/schemas/config.schema.yaml"
TINY = yaml.safe_load((ROOT / "config/test.yaml").read_text())
# the tiny frontier names the tiny grid's distributions, which these tests replace
TINY.pop("frontier", None)


# ---------------------------------------------------------------------------------------------
# config


def _side(scalar: str, qjl: bool, rotate: bool = True) -> dict:
    return {"rotate": rotate, "scalar_bits": scalar, "qjl": qjl}


def _user(name: str, k: dict, v: dict | None = None) -> dict:
    return {"user_schemes": {name: {"K": k, "V": v or _side("n", False)}}, "schemes": ["KQV", name]}


def _dists(*entries: dict) -> dict:
    return {"distributions": list(entries)}


@dataclass(frozen=True)
class BadConfig:
    """``change`` updates the tiny config (a key mapped to None is removed); ``message`` must be
    in the library's error; ``token`` (the offending key or value) in whatever error a Snakemake
    user sees first (the schema's, or the library's when the schema lets it through)."""

    id: str
    change: dict[str, Any]
    message: str
    token: str


CONFIG_CASES = [
    # unknown keys (typos) at every level
    BadConfig("typo_top_level_key", {"trails": 3}, "unknown config key(s): trails", "trails"),
    BadConfig("typo_distribution_key", _dists({"name": "g", "kind": "gaussian", "parms": {}}),
              "unknown config key(s): distributions[0].parms", "parms"),
    BadConfig("typo_distribution_param", _dists({"name": "t", "kind": "student_t", "params": {"n": 3}}),
              "unknown config key(s): distributions[0].params.n; allowed: nu", "n"),
    BadConfig("typo_stats_key", {"stats": {"nboot": 10}}, "stats.nboot", "nboot"),
    BadConfig("typo_scheme_side_key", _user("AB", {"rotate": True, "scalar_bit": "n", "qjl": False}),
              "unknown config key(s): user_schemes.AB.K.scalar_bit", "scalar_bit"),
    # wrong types
    BadConfig("dims_not_a_list", {"dims": "64"}, "config key dims: must be a list, got '64'", "dims"),
    BadConfig("dims_fraction", {"dims": [64.5]}, "config key dims[0]: must be an integer, got 64.5", "64.5"),
    BadConfig("dims_bool", {"dims": [True]}, "config key dims[0]: must be an integer, got True", "True"),
    BadConfig("budget_string", {"budgets": ["4"]}, "config key budgets[0]: must be an integer, got '4'", "'4'"),
    BadConfig("n_queries_string", {"n_queries": "16"},
              "config key n_queries: must be an integer, got '16'", "n_queries"),
    BadConfig("nu_string", _dists({"name": "t", "kind": "student_t", "params": {"nu": "2"}}),
              "config key distributions[0].params.nu: must be a number, got '2'", "nu"),
    BadConfig("params_not_mapping", _dists({"name": "lr", "kind": "low_rank", "params": [2]}),
              "config key distributions[0].params: must be a mapping, got [2]", "params"),
    BadConfig("distributions_not_list", {"distributions": {"name": "g", "kind": "gaussian"}},
              "config key distributions: must be a list", "distributions"),
    BadConfig("claims_file_not_string", {"claims_file": 3},
              "config key claims_file: must be a path to a YAML file, got 3", "claims_file"),
    # dimensions
    BadConfig("dim_below_3", {"dims": [2]}, "config key dims[0]: must be in 3..16384, got 2", "dims"),
    BadConfig("dim_absurd", {"dims": [10**9]}, "config key dims[0]: must be in 3..16384, got 1000000000", "dims"),
    BadConfig("dims_empty", {"dims": []}, "config key dims: must be a non-empty list, got []", "dims"),
    BadConfig("dims_duplicated", {"dims": [64, 64]}, "config key dims: has duplicates: [64, 64]", "dims"),
    BadConfig("distribution_dim_below_3", _dists({"name": "g", "kind": "gaussian", "dims": [2]}),
              "config key distributions[0].dims[0]: must be in 3..16384, got 2", "dims"),
    BadConfig("dims_missing", {"dims": None}, "missing required key(s): dims", "dims"),
    # budgets and schemes
    BadConfig("budget_0", {"budgets": [0]}, "config key budgets[0]: must be in 1..8, got 0", "budgets"),
    BadConfig("budget_9", {"budgets": [2, 9]}, "config key budgets[1]: must be in 1..8, got 9", "budgets"),
    BadConfig("scheme_scalar_below_zero", _user("Q3", _side("n-3", True)),
              "scheme Q3 side K at budget n=2: scalar_bits n-3 = -1 < 0 is impossible", "Q3"),
    BadConfig("scheme_overspends", _user("QX", _side("n", True)),
              "scheme QX side K at budget n=2: spends 3 bits", "QX"),
    BadConfig("scheme_underspends", _user("QY", _side("n-1", False)),
              "scheme QY side K at budget n=2: spends 1 bits", "QY"),
    BadConfig("scheme_unknown", {"schemes": ["KQV", "XYZ"]}, "schemes[1] = 'XYZ' is not a known scheme", "XYZ"),
    BadConfig("scheme_duplicated", {"schemes": ["KV", "KV"]}, "config key schemes: has duplicates: ['KV', 'KV']", "KV"),
    BadConfig("scheme_redefines_builtin", {"user_schemes": {"KV": {"K": _side("n", False), "V": _side("n", False)}}},
              "redefines the built-in scheme KV", "KV"),
    BadConfig("scheme_name_with_slash", {"user_schemes": {"a/b": {"K": _side("n", False), "V": _side("n", False)}}},
              "config key user_schemes: must be a scheme name: a letter, then up to 39 letters", "a/b"),
    BadConfig("scheme_names_differ_by_case", {**_user("kv", _side("n", False)), "schemes": ["KV", "kv"]},
              "'KV' and 'kv' differ only in case", "kv"),
    # distribution parameters
    BadConfig("nu_equal_1", _dists({"name": "t", "kind": "student_t", "params": {"nu": 1}}),
              "config key distributions[0].params.nu: must be > 1, got 1", "nu"),
    BadConfig("nu_below_1", _dists({"name": "t", "kind": "student_t", "params": {"nu": 0.5}}),
              "config key distributions[0].params.nu: must be > 1, got 0.5", "nu"),
    BadConfig("nu_nan", _dists({"name": "t", "kind": "student_t", "params": {"nu": float("nan")}}),
              "config key distributions[0].params.nu: must be a finite number, got nan", "nu"),
    BadConfig("nu_missing", _dists({"name": "t", "kind": "student_t"}),
              "config key distributions[0].params: missing required key(s): nu", "nu"),
    BadConfig("rank_above_dim", _dists({"name": "lr", "kind": "low_rank", "params": {"rank": 65}}),
              "distributions[lr].rank = 65 exceeds dim = 64", "rank"),
    BadConfig("rank_above_own_dim", _dists({"name": "lr", "kind": "low_rank", "params": {"rank": 16}, "dims": [8]}),
              "rank = 16 exceeds dim = 8", "rank"),
    BadConfig("rank_0", _dists({"name": "lr", "kind": "low_rank", "params": {"rank": 0}}),
              "config key distributions[0].params.rank: must be >= 1, got 0", "rank"),
    BadConfig("rank_fraction", _dists({"name": "lr", "kind": "low_rank", "params": {"rank": 2.5}}),
              "config key distributions[0].params.rank: must be an integer, got 2.5", "rank"),
    BadConfig("noise_negative", _dists({"name": "lr", "kind": "low_rank", "params": {"rank": 2, "noise": -1}}),
              "config key distributions[0].params.noise: must be in 0..1000000, got -1", "noise"),
    BadConfig("outliers_above_dim",
              _dists({"name": "c", "kind": "concentrated", "params": {"n_outliers": 100, "outlier_scale": 3}}),
              "n_outliers = 100 exceeds dim = 64", "n_outliers"),
    BadConfig("kind_unknown", _dists({"name": "g", "kind": "gauss"}),
              "config key distributions[0].kind: must be one of gaussian, student_t", "gauss"),
    # sizes and counts
    BadConfig("trials_0", {"trials": 0}, "config key trials: must be in 1..100000, got 0", "trials"),
    BadConfig("n_queries_0", {"n_queries": 0}, "config key n_queries: must be in 1..10000000, got 0", "n_queries"),
    BadConfig("seq_len_0", {"seq_len": 0}, "config key seq_len: must be in 2..10000000, got 0", "seq_len"),
    BadConfig("seq_len_absurd", {"seq_len": 10**12}, "config key seq_len: must be in 2..10000000", "seq_len"),
    BadConfig("attention_matrix_absurd", {"seq_len": 10**6, "n_queries": 10**5}, "seq_len x n_queries", "seq_len"),
    BadConfig("per_key_trials_above_trials", {"per_key_trials": 5},
              "config key per_key_trials: must be in 0..trials = 0..3, got 5", "per_key_trials"),
    BadConfig("stats_n_boot_0", {"stats": {"n_boot": 0}},
              "config key stats.n_boot: must be in 1..10000000, got 0", "n_boot"),
    BadConfig("sharpness_0", {"sharpness": [0.0]},
              "config key sharpness[0]: must be > 0 and < 1000000, got 0.0", "sharpness"),
    BadConfig("sharpness_inf", {"sharpness": [float("inf")]},
              "config key sharpness[0]: must be a finite number, got inf", "sharpness"),
    BadConfig("norm_dtype_float64", {"norm_dtype": "float64"},
              "config key norm_dtype: must be one of float16, float32, got 'float64'", "float64"),
    BadConfig("base_seed_negative", {"base_seed": -1},
              "config key base_seed: must be in 0..9223372036854775807, got -1", "base_seed"),
    BadConfig("base_seed_above_2_63", {"base_seed": 2**64},
              "config key base_seed: must be in 0..9223372036854775807, got 18446744073709551616", "base_seed"),
    # names (see NAME_POLICY for the accepted ones)
    BadConfig("names_duplicated", _dists({"name": "a", "kind": "gaussian"}, {"name": "a", "kind": "gaussian"}),
              "duplicated distribution name 'a'", "a"),
    BadConfig("names_differ_by_case",
              _dists({"name": "gauss", "kind": "gaussian"}, {"name": "Gauss", "kind": "gaussian"}),
              "'gauss' and 'Gauss' differ only in case", "Gauss"),
    BadConfig("name_with_slash", _dists({"name": "a/b", "kind": "gaussian"}),
              "config key distributions[0].name: must be 1 to 64 ASCII letters", "a/b"),
    BadConfig("name_with_space", _dists({"name": "a b", "kind": "gaussian"}),
              "config key distributions[0].name: must be 1 to 64 ASCII letters", "a b"),
    BadConfig("name_with_percent", _dists({"name": "a%b", "kind": "gaussian"}),
              "config key distributions[0].name: must be 1 to 64 ASCII letters", "a%b"),
    BadConfig("name_unicode", _dists({"name": "gauß", "kind": "gaussian"}),
              "config key distributions[0].name: must be 1 to 64 ASCII letters", "gauß"),
    BadConfig("name_dotdot", _dists({"name": "gaussian", "kind": "gaussian"}, {"name": "..", "kind": "gaussian"}),
              "config key distributions[1].name: must be 1 to 64 ASCII letters", ".."),
    BadConfig("name_dot", _dists({"name": "gaussian", "kind": "gaussian"}, {"name": ".", "kind": "gaussian"}),
              "config key distributions[1].name: must be 1 to 64 ASCII letters", "."),
    BadConfig("name_hidden", _dists({"name": "gaussian", "kind": "gaussian"}, {"name": ".t3", "kind": "gaussian"}),
              "config key distributions[1].name: must be 1 to 64 ASCII letters", ".t3"),
    BadConfig("name_leading_underscore",
              _dists({"name": "gaussian", "kind": "gaussian"}, {"name": "_t3", "kind": "gaussian"}),
              "config key distributions[1].name: must be 1 to 64 ASCII letters", "_t3"),
    BadConfig("name_leading_dash",
              _dists({"name": "gaussian", "kind": "gaussian"}, {"name": "-t3", "kind": "gaussian"}),
              "config key distributions[1].name: must be 1 to 64 ASCII letters", "-t3"),
    BadConfig("name_too_long", _dists({"name": "g" * 65, "kind": "gaussian"}), "1 to 64 ASCII letters", "g" * 65),
    BadConfig("name_empty", _dists({"name": "", "kind": "gaussian"}),
              "config key distributions[0].name: must be 1 to 64 ASCII letters, digits and _ . + -, "
              "starting with a letter or digit, got ''",
              "name"),
    BadConfig("name_not_string", _dists({"name": 5, "kind": "gaussian"}),
              "config key distributions[0].name: must be 1 to 64 ASCII letters", "5"),
    BadConfig("config_not_mapping", {"__whole__": [1, 2]}, "the config must be a mapping", "mapping"),
    # bring-your-own caches (kind: file); the file itself is read when the DAG is built
    # (SNAKEMAKE_CASES)
    BadConfig("file_without_path", _dists({"name": "g", "kind": "gaussian"}, {"name": "mine", "kind": "file"}),
              "config key distributions[1].params: missing required key(s): path", "path"),
    BadConfig("file_suffix", _dists({"name": "g", "kind": "gaussian"},
                                    {"name": "mine", "kind": "file", "params": {"path": "c.pt"}}),
              "distributions[mine].params.path = 'c.pt' must end in one of .npz, .safetensors, .npy", "c.pt"),
    BadConfig("file_causal_string",
              _dists({"name": "g", "kind": "gaussian"},
                     {"name": "mine", "kind": "file", "params": {"path": "c.npz", "causal": "yes"}}),
              "config key distributions[1].params.causal: must be true or false, got 'yes'", "causal"),
    BadConfig("file_with_dims", _dists({"name": "g", "kind": "gaussian"},
                                       {"name": "mine", "kind": "file", "params": {"path": "c.npz"}, "dims": [64]}),
              "distributions[mine]: a file distribution takes no dims", "dims"),
    BadConfig("file_unknown_param", _dists({"name": "g", "kind": "gaussian"},
                                           {"name": "mine", "kind": "file", "params": {"path": "c.npz", "queries": 8}}),
              "unknown config key(s): distributions[1].params.queries; allowed: causal, path", "queries"),
    BadConfig("file_name_clash", _dists({"name": "g", "kind": "gaussian"},
                                        {"name": "G", "kind": "file", "params": {"path": "c.npz"}}),
              "'g' and 'G' differ only in case", "G"),
    BadConfig("file_only", _dists({"name": "mine", "kind": "file", "params": {"path": "c.npz"}}),
              "config key distributions has no synthetic distribution", "synthetic"),
    # the headline cell: typed by the schema, then checked against the grid
    BadConfig("headline_typo", {"headline": {"budgt": 4}}, "unknown config key(s): headline.budgt", "budgt"),
    BadConfig("headline_dim_string", {"headline": {"dim": "64"}},
              "config key headline.dim: must be an integer, got '64'", "headline"),
    BadConfig("headline_distribution_absent", {"headline": {"distribution": "t3"}},
              "config key headline.distribution: must be a synthetic distribution of the grid", "headline"),
    BadConfig("headline_distribution_file", {**_dists({"name": "g", "kind": "gaussian"},
                                                      {"name": "mine", "kind": "file", "params": {"path": "c.npz"}}),
                                             "headline": {"distribution": "mine"}},
              "(a file distribution cannot be the headline)", "headline"),
    BadConfig("headline_dim_outside_grid", {"headline": {"dim": 128}},
              "config key headline.dim: must be a dim of gaussian (64), got 128", "headline.dim"),
    BadConfig("headline_sharpness_outside_grid", {"headline": {"sharpness": 2.0}},
              "config key headline.sharpness: must be one of sharpness (1, 4), got 2.0", "headline.sharpness"),
    BadConfig("headline_budget_outside_grid", {"headline": {"budget": 3}},
              "config key headline.budget: must be one of budgets (2, 4), got 3", "headline.budget"),
    # the real-model rows' section (its texts are checked by kvasym.real.real_settings)
    BadConfig("real_max_tokens_1", {"real": {"max_tokens": 1}},
              "config key real.max_tokens: must be in 2..8192, got 1", "max_tokens"),
    BadConfig("real_on", {"real": "on"}, "config key real: must be a mapping, or off (or false), got 'on'", "real"),
    # frontier.extra_budgets (issue 31, point 7): typed by the schema, then checked against the grid
    *(BadConfig(f"frontier_extra_{case}", {"frontier": {"schemes": ["CRKV", "KQV-NS"], "extra_budgets": extra}},
                message, token) for case, extra, message, token in (
        ("unknown_scheme", {"NOPE": [5]}, "config key frontier.extra_budgets.NOPE: 'NOPE' is not one of schemes or "
         "frontier.schemes (KV, KQV, QKQV, RKV, CRKV, KQV-NS)", "NOPE"),
        ("in_budgets", {"RKV": [5, 4]}, "config key frontier.extra_budgets.RKV[1] = 4 is already in budgets (2, 4)",
         "extra_budgets"),
        ("above_8", {"RKV": [9]}, "config key frontier.extra_budgets.RKV[0]: must be in 1..8, got 9", "9"),
        ("zero", {"RKV": [0]}, "config key frontier.extra_budgets.RKV[0]: must be in 1..8, got 0", "0"),
        ("fraction", {"RKV": [4.5]}, "config key frontier.extra_budgets.RKV[0]: must be an integer, got 4.5", "4.5"),
        ("bool", {"RKV": [True]}, "config key frontier.extra_budgets.RKV[0]: must be an integer, got True", "True"),
        ("string", {"RKV": "5"}, "config key frontier.extra_budgets.RKV: must be a list, got '5'", "'5'"),
        ("empty", {"RKV": []}, "config key frontier.extra_budgets.RKV: must be a non-empty list, got []", "RKV"),
        ("unrealisable", {"KQV-NS": [1]}, "config key frontier.extra_budgets.KQV-NS[0] = 1: scheme KQV-NS side V at "
         "budget n=1: no scalar bits and no QJL stores nothing", "KQV-NS"))),
    BadConfig("frontier_extra_without_frontier", {"frontier": {"extra_budgets": {"RKV": [5]}}},
              "config key frontier.extra_budgets.RKV: frontier.schemes is empty, so there is no frontier", "RKV"),
]


def _mutated(change: dict[str, Any]) -> Any:
    if "__whole__" in change:
        return copy.deepcopy(change["__whole__"])
    config = copy.deepcopy(TINY)
    for key, value in change.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = copy.deepcopy(value)
    return config


@pytest.mark.parametrize("case", CONFIG_CASES, ids=[c.id for c in CONFIG_CASES])
def test_bad_config_library(case: BadConfig) -> None:
    """The library alone (as `kvasym stage --config` uses it) rejects every case, naming it."""
    with pytest.raises(KvasymError) as info:
        load_study(_mutated(case.change))
    message = str(info.value)
    assert case.message in message
    assert "\n" not in message, "one line"


@pytest.mark.parametrize("case", CONFIG_CASES, ids=[c.id for c in CONFIG_CASES])
def test_bad_config_schema_then_library(case: BadConfig) -> None:
    """What common.smk does: the JSON schema first, then the library; the first error a
    Snakemake user sees names the offending key or value."""
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    config = _mutated(case.change)
    with pytest.raises((WorkflowError, KvasymError)) as info:
        if isinstance(config, dict):
            validate(config, str(SCHEMA))
        load_study(config)
    assert case.token in str(info.value)


def test_config_cases_table_is_large_enough() -> None:
    assert len(CONFIG_CASES) >= 35
    assert len({c.id for c in CONFIG_CASES}) == len(CONFIG_CASES)


#: Distribution names that are valid: they make safe folder names and are escaped in LaTeX.
NAME_POLICY = ["t1.05", "low_rank_8", "x+y", "A-1", "0lead", "g" * 64]


@pytest.mark.parametrize("name", NAME_POLICY)
def test_accepted_names_are_safe_paths_latex_and_dataset_members(tmp_path, name: str) -> None:
    from snakemake.utils import validate

    config = _mutated(_dists({"name": "gaussian", "kind": "gaussian"}, {"name": name, "kind": "gaussian"}))
    validate(config, str(SCHEMA))
    study = load_study(config)
    assert name in study.distributions
    # a folder directly under results/<stage>/, never outside it
    folder = (tmp_path / "results/metrics/per_query" / name).resolve()
    assert folder.parent == (tmp_path / "results/metrics/per_query").resolve()
    # LaTeX: every special character escaped ("_" -> "\_"), nothing else touched
    escaped = escape_latex(name)
    assert escaped.replace(r"\_", "") .count("_") == 0
    assert escaped.replace(r"\_", "_") == name
    # the metrics dataset reader sees the folder (pyarrow skips names starting with "." or "_")
    for dist in ("gaussian", name):
        row = {f.name: np.zeros(1) for f in PER_QUERY_SCHEMA}
        row.update(distribution=np.array([dist]), kind=np.array(["gaussian"]), scheme=np.array(["KV"]))
        write_parquet_atomic(to_table(row, PER_QUERY_SCHEMA), tmp_path / f"per_query/{dist}/d64/KV/n2.parquet", {})
    assert sorted(read_table(tmp_path, "per_query")["distribution"]) == sorted(["gaussian", name])


#: (id, config change, what the user must see) through the real `snakemake -n`.
SNAKEMAKE_CASES = [
    ("typo_top_level_key", {"trails": 3}, "invalid config: unknown config key(s): trails; allowed: base_seed"),
    ("rank_above_dim", _dists({"name": "gaussian", "kind": "gaussian"},
                              {"name": "lr", "kind": "low_rank", "params": {"rank": 100}}),
     "invalid config: distributions[lr].rank = 100 exceeds dim = 64"),
    # the schema's error in one line (Snakemake's validate printed an ~18-line schema dump)
    ("name_dotdot", _dists({"name": "gaussian", "kind": "gaussian"}, {"name": "..", "kind": "gaussian"}),
     "invalid config: config key distributions[1].name: must be 1 to 64 ASCII letters"),
    ("frontier_extra_in_budgets", {"frontier": {"schemes": ["CRKV"], "extra_budgets": {"RKV": [4]}}},
     "invalid config: config key frontier.extra_budgets.RKV[0] = 4 is already in budgets (2, 4)"),
    ("names_duplicated", _dists({"name": "gaussian", "kind": "gaussian"}, {"name": "gaussian", "kind": "gaussian"}),
     "duplicated distribution name 'gaussian'"),
    ("claims_unknown_statistic", {"claims_file": "bad_claims.yaml"},
     f"claims[2].statistic: must be one of {', '.join(sorted(STATISTICS))}, got 'kl_ratioo'"),
    ("file_missing", _dists({"name": "gaussian", "kind": "gaussian"},
                            {"name": "mine", "kind": "file", "params": {"path": "nope.npz"}}),
     "invalid config: distributions[mine].params.path: cache file nope.npz: no such file"),
    ("file_bad_layout", _dists({"name": "gaussian", "kind": "gaussian"},
                               {"name": "mine", "kind": "file", "params": {"path": "q_heads.npz"}}),
     "invalid config: distributions[mine].params.path: cache file q_heads.npz: "
     "3 query heads are not a multiple of 2 KV heads"),
    ("file_reserved_name", _dists({"name": "gaussian", "kind": "gaussian"},
                                  {"name": "smollm2", "kind": "file", "params": {"path": "q_heads.npz"}}),
     "reserved for the real-model rows"),
    ("greedy_block_statistics_without_chunk",
     {"real": {**TINY["real"], "e2e": {**TINY["real"]["e2e"], "extra_schemes": ["KIVI32"],
                                       "greedy": {"schemes": ["RKV", "KIVI32"], "budgets": [2]}}}},
     "invalid config: config key real.e2e.greedy.schemes: KIVI32 keeps statistics over blocks of rows; give it a "
     "chunk in real.e2e.greedy.causal_chunks"),
]


@pytest.fixture(scope="module")
def dry_workdir(tmp_path_factory) -> Path:
    workdir = make_workdir(tmp_path_factory.mktemp("dry"))
    claims = yaml.safe_load((workdir / "config/claims.test.yaml").read_text())
    claims["claims"][2]["statistic"] = "kl_ratioo"
    (workdir / "bad_claims.yaml").write_text(yaml.safe_dump(claims, sort_keys=False))
    rng = np.random.default_rng(0)
    np.savez(workdir / "q_heads.npz", k=rng.standard_normal((2, 24, 16)), v=rng.standard_normal((2, 24, 16)),
             q=rng.standard_normal((3, 24, 16)))
    return workdir


@pytest.mark.parametrize("case_id, change, message", SNAKEMAKE_CASES, ids=[c[0] for c in SNAKEMAKE_CASES])
def test_bad_config_through_snakemake_dry_run(dry_workdir: Path, case_id: str, change: dict,
                                              message: str) -> None:
    config = _mutated(change)
    (dry_workdir / f"{case_id}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    proc = snakemake(dry_workdir, "-n", configfile=f"{case_id}.yaml", timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-2000:]
    assert message in out, out[-3000:]
    # no traceback from inside numpy, pandas or pyarrow: the error was raised on purpose
    for lib in ("numpy", "pandas", "pyarrow"):
        assert f"site-packages/{lib}/" not in out, out[-3000:]
    assert not (dry_workdir / "results").exists()


# ---------------------------------------------------------------------------------------------
# claims ledger


def _ledger(mutate: Callable[[dict], None] | None = None, text: str | None = None) -> Callable[[Path], Path]:
    def write(folder: Path) -> Path:
        path = folder / "claims.yaml"
        if text is not None:
            path.write_text(text)
            return path
        data = yaml.safe_load((ROOT / "config/claims.test.yaml").read_text())
        if mutate is not None:
            mutate(data)
        path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
        return path

    return write


def _set(index: int, key: str, value: Any) -> Callable[[dict], None]:
    def mutate(data: dict) -> None:
        data["claims"][index][key] = value

    return mutate


def _append(claim: dict) -> Callable[[dict], None]:
    return lambda data: data["claims"].append(claim)


_C = {"statement": "s", "statistic": "ranking_disagreement", "holds_if": {"op": ">=", "value": 1.0}}

#: (id, ledger writer, message) for load_claims: structural errors, caught before any job.
CLAIMS_CASES = [
    ("statistic_does_not_exist", _ledger(_set(0, "statistic", "kl_ratioo")),
     f"claim C1a: key claims[0].statistic: must be one of {', '.join(sorted(STATISTICS))}, got 'kl_ratioo'"),
    ("claim_key_typo", _ledger(lambda d: d["claims"][0].update(wher=d["claims"][0].pop("where"))),
     "claim C1a: unknown key(s): claims[0].wher; allowed: construction, decided_by, holds_if, id"),
    # issue 50, point 6b: the deciding test is one of the library's, and the statistic's own
    ("decided_by_unknown", _ledger(_set(0, "decided_by", "welch")),
     "claim C1a: key claims[0].decided_by: must be one of fieller, t, bootstrap, fisher_z, agresti_min, "
     "wilcoxon_holm, ratio_cis, estimate, got 'welch'"),
    ("decided_by_not_the_statistics", _ledger(_set(0, "decided_by", "t")),
     "claim C1a: key decided_by: theory decides on fieller (Fieller CI) here, not t"),
    ("holds_if_key_typo", _ledger(_set(2, "holds_if", {"op": ">", "value": 1.0, "max_log_p": -23})),
     "unknown key(s): claims[2].holds_if.max_log_p; allowed: max_log10_p, op, target, value"),
    ("holds_if_value_not_number", _ledger(_set(0, "holds_if", {"op": ">=", "value": "big"})),
     "key claims[0].holds_if.value: must be a number, got 'big'"),
    ("holds_if_value_not_finite", _ledger(_set(0, "holds_if", {"op": ">=", "value": float("inf")})),
     "key claims[0].holds_if.value: must be a finite number, got inf"),
    ("holds_if_op_unknown", _ledger(_set(0, "holds_if", {"op": "=>", "value": 1})),
     "key claims[0].holds_if.op: must be one of >=, >, <=, <, all, within, got '=>'"),
    ("where_key_typo", _ledger(_set(0, "where", {"check": "qjl_vs_residual", "budgt": 4})),
     "unknown key(s): claims[0].where.budgt; allowed: a, against, all_sharpness"),
    ("where_not_mapping", _ledger(_set(0, "where", [1, 2])), "key claims[0].where: must be a mapping, got [1, 2]"),
    ("where_dim_not_integer", _ledger(_set(0, "where", {"check": "qjl_vs_residual", "dim": 64.0})),
     "key claims[0].where.dim: must be an integer, got 64.0"),
    ("defaults_not_mapping", _ledger(lambda d: d.update(defaults=[1])), "key defaults: must be a mapping, got [1]"),
    ("top_level_typo", _ledger(lambda d: d.update(claim=d.pop("claims"))),
     "unknown key(s): claim; allowed: claims, defaults, extends"),
    ("claims_empty", _ledger(lambda d: d.update(claims=[])), "key claims: must be a non-empty list, got []"),
    ("claim_missing_statistic", _ledger(lambda d: d["claims"][0].pop("statistic")),
     "claim C1a: key claims[0]: missing required key(s): statistic"),
    ("claim_id_duplicated", _ledger(_append({"id": "C2", **_C})), "duplicated claim id C2"),
    ("claim_id_unicode", _ledger(_append({"id": "C2é", **_C})),
     ".id: must be 1 to 40 ASCII letters, digits and _.+-, starting with a letter or digit (it names the "
     "claim's LaTeX macros), got 'C2é'"),
    # the headline cell is the config's; a claims file that sets it would give claims another cell
    ("defaults_move_the_headline", _ledger(lambda d: d.update(defaults={"dim": 64, "alpha": 0.05})),
     "key defaults.dim: must be set by the config's `headline` key (claims, tables and figures read it), not by "
     "a claims-file default; move it there, got 64"),
    ("yaml_duplicate_key", _ledger(text="claims:\n  - {id: X1, statement: s, statistic: ranking_disagreement, "
                                        "holds_if: {op: '>=', value: 1}, holds_if: {op: all}}\n"),
     "found duplicate key 'holds_if'"),
    ("yaml_syntax_error", _ledger(text="claims: [\n"), "is not valid YAML (line"),
    ("file_missing", lambda folder: folder / "nope.yaml", "nope.yaml: no such file"),
    # a claims file that extends another (config/claims.long.yaml extends config/claims.yaml)
    ("extends_missing", _ledger(lambda d: d.update(extends="base.yaml")), "key extends: "),
    ("extends_itself", _ledger(lambda d: d.update(extends="claims.yaml")), "key extends: "),
    ("extends_not_a_string", _ledger(lambda d: d.update(extends=["a.yaml"])), "key extends: must be"),
    ("extends_duplicates_an_id", lambda folder: _extending(folder, {"id": "C1a", **_C}),
     "duplicated claim id C1a"),
    ("extends_a_bad_file", lambda folder: _extending(folder, {"id": "X9", **_C}, base_text="claims: []\n"),
     "key claims: must be a non-empty list, got []"),
]


def _extending(folder: Path, claim: dict, base_text: str | None = None) -> Path:
    """A claims file ``claims.yaml`` with one claim that extends ``sub/base.yaml`` (the test
    ledger, or ``base_text``)."""
    (folder / "sub").mkdir()
    base = folder / "sub" / "base.yaml"
    base.write_text(base_text if base_text is not None else (ROOT / "config/claims.test.yaml").read_text())
    path = folder / "claims.yaml"
    path.write_text(yaml.safe_dump({"extends": "sub/base.yaml", "claims": [claim]}, sort_keys=False))
    return path


def test_a_claims_file_extends_another(tmp_path) -> None:
    """The extended file's claims first, each with its own file's defaults; the files read in
    that order (the DAG's claims and numbers jobs depend on both)."""
    from kvasym.claims import claims_files

    base = yaml.safe_load((ROOT / "config/claims.test.yaml").read_text())
    path = _extending(tmp_path, {"id": "X9", **_C, "where": {"budget": 2}})
    data = yaml.safe_load(path.read_text())
    data["defaults"] = {"alpha": 0.01}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    claims = load_claims(path)
    assert [c["id"] for c in claims] == [c["id"] for c in base["claims"]] + ["X9"]
    assert claims[-1]["where"] == {"alpha": 0.01, "budget": 2}
    assert claims[0]["where"]["alpha"] == base["defaults"]["alpha"]
    assert claims_files(path) == [str(tmp_path / "sub" / "base.yaml"), str(path)]
    # the repository's long-context claims extend the paper's, which come first, unchanged
    paper, long = load_claims(ROOT / "config/claims.yaml"), load_claims(ROOT / "config/claims.long.yaml")
    assert long[:len(paper)] == paper and len(long) > len(paper)


@pytest.mark.parametrize("case_id, write, message", CLAIMS_CASES, ids=[c[0] for c in CLAIMS_CASES])
def test_bad_claims_file(tmp_path, case_id: str, write, message: str) -> None:
    path = write(tmp_path)
    with pytest.raises(KvasymError) as info:
        load_claims(path)
    assert message in str(info.value)
    assert str(path.name) in str(info.value)


# ---------------------------------------------------------------------------------------------
# a mini run of every library stage (data .. claims), for the claims and tampering cases

MINI = {
    **{k: v for k, v in TINY.items() if k not in ("distributions", "headline")},  # headline: the default rule
    "dims": [16],
    "budgets": [2, 4],
    "schemes": ["KV", "KQV"],
    "seq_len": 32,
    "n_queries": 4,
    "trials": 3,
    "per_key_trials": 1,
    "sharpness": [1.0],
    "distributions": [{"name": "gaussian", "kind": "gaussian"},
                      {"name": "t1.05", "kind": "student_t", "params": {"nu": 1.05}}],
    "stats": {"n_boot": 20, "n_permutations": 10, "energy_max_n": 16},
    "theory": {"trials": 3, "n_probes": 16, "n_boot": 20},
}


@dataclass
class MiniRun:
    root: Path
    study: Any
    paths: dict[str, Path] = field(default_factory=dict)

    def cell(self, dist: str, scheme: str, budget: int) -> dict[str, Path]:
        base = f"{dist}/d16/{scheme}/n{budget}"
        return {
            "packed": self.root / f"packed/{base}.npz",
            "per_query": self.root / f"metrics/per_query/{base}.parquet",
            "per_key": self.root / f"metrics/per_key/{base}.parquet",
        }


def _run_unit(study: Any, dist: str, dim: int, root: Path) -> None:
    """The unit job of (dist, dim) as the DAG runs it: cells, or metrics for a query-model variant."""
    folders = [root / f"{table}/{dist}/d{dim}" for table in ("metrics/per_query", "metrics/per_key")]
    manifest = root / f"data/{dist}/d{dim}.json"
    if dist in study.query_variants:
        parent = root / f"packed/{study.packed_distribution(dist)}/d{dim}"
        run_metrics(study.unit_slice(dist, dim), parent, manifest, *folders)
    else:
        run_cells(study.unit_slice(dist, dim), manifest, root / f"packed/{dist}/d{dim}", *folders)


#: The mini grid on low-rank keys with a query-model variant, whose metrics job reads its
#: parent's packed caches (the DAG's one reader of packed files).
VARIANT_MINI = {**MINI, "distributions": [{"name": "lowrank4", "kind": "low_rank", "params": {"rank": 4}},
                                          {"name": "lowrank2", "kind": "low_rank", "params": {"rank": 2}}],
                "query_models": {"models": ["isotropic"]}}


@pytest.fixture(scope="module")
def variant_mini(tmp_path_factory) -> MiniRun:
    root = tmp_path_factory.mktemp("variant_mini")
    study = load_study(VARIANT_MINI)
    for dist, dim in study.main_data_cells():
        _run_unit(study, dist, dim, root)
    return MiniRun(root, study)


@pytest.fixture(scope="module")
def mini(tmp_path_factory) -> MiniRun:
    root = tmp_path_factory.mktemp("mini")
    study = load_study(MINI)
    run = MiniRun(root, study)
    stats_out = {kind: [] for kind in ("comparisons", "summary", "trials", "theory")}
    for dist, dim in study.data_cells():
        data = root / f"data/{dist}/d{dim}.json"
        _run_unit(study, dist, dim, root)
        per_query = [run.cell(dist, s, b)["per_query"] for s in study.schemes for b in study.budgets]
        per_key = [run.cell(dist, s, b)["per_key"] for s in study.schemes for b in study.budgets]
        outs = {kind: root / f"stats/{kind}/{dist}/d{dim}.parquet"
                for kind in ("comparisons", "summary", "trials")}
        run_stats(study.stats_slice(dist, dim), per_query, outs["comparisons"], outs["summary"], outs["trials"])
        theory = root / f"theory/{dist}/d{dim}.parquet"
        run_theory(study.theory_slice(dist, dim), data, per_key, theory)
        for kind, path in {**outs, "theory": theory}.items():
            stats_out[kind].append(path)
    for kind, paths in stats_out.items():
        gather(paths, root / f"gathered/{kind}.parquet", HOLM_FAMILIES[kind])
        run.paths[kind] = root / f"gathered/{kind}.parquet"
        run.paths[f"{kind}_parts"] = paths
    return run


def _tables(run: MiniRun) -> dict[str, Path]:
    return {k: run.paths[k] for k in ("comparisons", "summary", "trials", "theory")}


#: The headline cell of the mini grid, which the claims' where starts from.
MINI_HEADLINE = {"distribution": "gaussian", "dim": 16, "sharpness": 1.0, "budget": 4}


def _claims_with(tmp_path: Path, claim: dict) -> Path:
    path = tmp_path / "claims.yaml"
    base = {"defaults": {"alpha": 0.05},
            "claims": [{"id": "C1", "statement": "tail", **{k: v for k, v in _C.items() if k != "statement"}},
                       claim]}
    path.write_text(yaml.safe_dump(base, sort_keys=False))
    return path


#: Claims naming something that can never exist in the tables: an error at the claims stage,
#: not "not evaluated" (which is for cells absent from a smaller grid).
CLAIMS_EVAL_CASES = [
    ("cells_better_metric_typo", {"statistic": "cells_better", "where": {"a": "KQV", "b": "KV", "metrics": ["klx"]},
                                  "holds_if": {"op": "all"}},
     "metric 'klx' does not exist"),
    ("theory_check_typo", {"statistic": "theory", "where": {"check": "ks_betta"},
                           "holds_if": {"op": ">", "value": 0.01}},
     "theory check 'ks_betta' does not exist"),
    ("ranking_by_typo", {"statistic": "ranking_disagreement", "where": {"by": "kl_p999"},
                         "holds_if": {"op": ">=", "value": 0.1}},
     "summary column (by) 'kl_p999' does not exist"),
    ("kl_ratio_which_typo", {"statistic": "kl_ratio", "where": {"a": "KV", "b": "KQV", "budget": 4, "which": "median"},
                             "holds_if": {"op": ">", "value": 1}},
     "which 'median' does not exist"),
    ("distribution_ratio_metric_typo", {"statistic": "distribution_ratio",
                                        "where": {"num": "gaussian", "den": "t1.05", "budget": 4, "scheme": "KQV",
                                                  "metric": "kll"},
                                        "holds_if": {"op": ">=", "value": 2}}, "metric 'kll' does not exist"),
]


@pytest.mark.parametrize("case_id, claim, message", CLAIMS_EVAL_CASES, ids=[c[0] for c in CLAIMS_EVAL_CASES])
def test_claim_naming_a_missing_statistic_fails_the_stage(mini: MiniRun, tmp_path, case_id, claim,
                                                          message) -> None:
    path = _claims_with(tmp_path, {"id": "X1", "statement": case_id, **claim})
    outputs = [tmp_path / "claims.json", tmp_path / "claims.md", tmp_path / "claims.tex"]
    with pytest.raises(KvasymError) as info:
        run_claims(path, _tables(mini), *outputs, headline=MINI_HEADLINE)
    assert message in str(info.value) and "X1" in str(info.value)
    assert not any(p.exists() for p in outputs), "nothing half-written"


def test_claim_on_a_cell_outside_the_grid_is_not_evaluated(mini: MiniRun, tmp_path) -> None:
    """The contrast: a valid claim about a distribution this grid lacks is reported, not fatal."""
    claim = {"id": "X2", "statement": "absent", "statistic": "distribution_ratio",
             "where": {"num": "lowrank8", "den": "t1.05", "budget": 4, "scheme": "KQV"},
             "holds_if": {"op": ">=", "value": 2}}
    results = evaluate_claims(load_claims(_claims_with(tmp_path, claim), MINI_HEADLINE), _load_tables(mini))
    assert results[1]["verdict"] == "not evaluated"


def _load_tables(run: MiniRun):
    from kvasym.claims import Tables

    return Tables(**{k: pd.read_parquet(p) for k, p in _tables(run).items()})


# ---------------------------------------------------------------------------------------------
# caches given to the CLI


@pytest.fixture(scope="module")
def arrays(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("cli")
    rng = np.random.default_rng(0)
    k, v, q = rng.standard_normal((40, 16)), rng.standard_normal((40, 16)), rng.standard_normal((6, 16))
    save = lambda name, a: np.save(folder / name, a)  # noqa: E731
    save("K.npy", k), save("V.npy", v), save("Q.npy", q)
    save("k_rank3.npy", rng.standard_normal((2, 40, 16)))
    save("k_rank1.npy", rng.standard_normal(16))
    save("k_0d.npy", np.float64(3.0))
    save("v_30.npy", rng.standard_normal((30, 16)))
    save("v_dim8.npy", rng.standard_normal((40, 8)))
    save("q_dim8.npy", rng.standard_normal((6, 8)))
    bad = k.copy()
    bad[3, 2] = np.nan
    save("k_nan.npy", bad)
    bad = k.copy()
    bad[0, 0] = np.inf
    save("k_inf.npy", bad)
    bad = v.copy()
    bad[1, 1] = np.nan
    save("v_nan.npy", bad)
    bad = q.copy()
    bad[0, 0] = -np.inf
    save("q_ninf.npy", bad)
    save("k_bool.npy", k > 0)
    save("k_complex.npy", k.astype(complex))
    save("k_str.npy", np.array([["a", "b", "c"]]))
    save("k_struct.npy", np.zeros((4, 3), dtype=[("a", "f8")]))
    np.save(folder / "k_object.npy", np.array([[1, 2, 3]], dtype=object), allow_pickle=True)
    save("k_empty_rows.npy", np.zeros((0, 16)))
    save("k_empty_cols.npy", np.zeros((40, 0)))
    save("k_dim2.npy", k[:, :2]), save("v_dim2.npy", v[:, :2]), save("q_dim2.npy", q[:, :2])
    save("k_huge.npy", k * 1e300)
    save("k_1e5.npy", k * 1e5)
    save("k_1e20.npy", k * 1e20)
    save("q_1e300.npy", q * 1e300)
    save("q_1e200.npy", q * 1e200)
    save("k_2rows.npy", k[:2]), save("v_2rows.npy", v[:2])
    # accepted inputs
    save("k_int32.npy", np.round(k * 10).astype(np.int32))
    save("k_uint8.npy", np.round(np.abs(k) * 10).astype(np.uint8))
    save("k_f16.npy", k.astype(np.float16))
    zero_row = k.copy()
    zero_row[5] = 0
    save("k_zero_row.npy", zero_row)
    save("k_zeros.npy", np.zeros((40, 16))), save("v_zeros.npy", np.zeros((40, 16))), save("q_zeros.npy",
                                                                                         np.zeros((6, 16)))
    save("k_1row.npy", k[:1]), save("v_1row.npy", v[:1])
    save("k_tiny.npy", k * 1e-300)
    save("k_1e-9.npy", k * 1e-9)
    np.savez(folder / "k_one.npz", a=k)
    # files that are not (good) arrays
    np.savez(folder / "two.npz", a=k, b=v)
    np.savez(folder / "none.npz")
    raw = (folder / "two.npz").read_bytes()
    (folder / "trunc.npz").write_bytes(raw[: len(raw) // 2])
    corrupt = bytearray((folder / "k_one.npz").read_bytes())
    corrupt[200:260] = b"\0" * 60  # inside the member's data: the zip CRC check fails on read
    (folder / "crc.npz").write_bytes(bytes(corrupt))
    (folder / "trunc.npy").write_bytes((folder / "K.npy").read_bytes()[:300])
    (folder / "text.npy").write_text("hello, I am not an array\n")
    np.savetxt(folder / "K.csv", k, delimiter=",")
    (folder / "empty.npy").write_bytes(b"")
    import pickle

    (folder / "pickle.npy").write_bytes(pickle.dumps(k))
    (folder / "adir").mkdir()
    (folder / "schemes_list.yaml").write_text("schemes: [1, 2]\n")
    (folder / "schemes_broken.yaml").write_text("schemes: {A: [\n")
    (folder / "schemes_over.yaml").write_text("schemes:\n  OVER:\n    K: {rotate: true, scalar_bits: n, qjl: true}\n"
                                              "    V: {rotate: true, scalar_bits: n, qjl: false}\n")
    (folder / "a_file").write_text("x")
    _write_cache_files(folder / "caches", rng)
    return folder


def _write_cache_files(folder: Path, rng: np.random.Generator) -> None:
    """Bring-your-own cache files (kvasym.cachefile), good and bad, for ``kvasym evaluate --cache``."""
    from safetensors.numpy import save_file

    folder.mkdir()
    k = rng.standard_normal((2, 2, 24, 16)).astype(np.float32)
    v = rng.standard_normal((2, 2, 24, 16)).astype(np.float32)
    q = rng.standard_normal((2, 4, 24, 16)).astype(np.float32)
    npz = lambda name, **arrays: np.savez(folder / name, **arrays)  # noqa: E731
    npz("good.npz", k=k, v=v, q=q, layers=np.array([3, 11]))
    npz("good_rank2.npz", keys=k[0, 0], values=v[0, 0])
    npz("good_int.npz", k=np.round(k * 8).astype(np.int16), v=v)
    save_file({"k": k, "v": v}, str(folder / "good.safetensors"))
    np.save(folder / "good.npy", np.stack([k, v]))
    npz("rank5.npz", k=k[None], v=v[None])
    npz("rank1.npz", k=k[0, 0, 0], v=v[0, 0, 0])
    npz("q_head_dim.npz", k=k, v=v, q=q[..., :8])
    npz("v_positions.npz", k=k, v=v[:, :, :20])
    npz("q_rank.npz", k=k, v=v, q=q[0])
    npz("q_layers.npz", k=k, v=v, q=q[:1])
    npz("q_heads.npz", k=k, v=v, q=q[:, :3])
    npz("q_positions.npz", k=k, v=v, q=np.concatenate([q, q], axis=2))
    bad = k.copy()
    bad[1, 0, 5, 2] = np.nan
    npz("k_nan.npz", k=bad, v=v)
    bad = v.copy()
    bad[0, 1, 0, 0] = np.inf
    npz("v_inf.npz", k=k, v=bad)
    bad = q.copy()
    bad[0, 3, 2, 1] = -np.inf
    npz("q_ninf.npz", k=k, v=v, q=bad)
    npz("empty.npz", k=k[:, :, :0], v=v[:, :, :0])
    npz("one_position.npz", k=k[:, :, :1], v=v[:, :, :1])
    npz("head_dim_2.npz", k=k[..., :2], v=v[..., :2])
    npz("k_bool.npz", k=k > 0, v=v)
    npz("k_complex.npz", k=k.astype(np.complex64), v=v)
    npz("unknown_name.npz", key=k, v=v)
    npz("no_values.npz", k=k)
    npz("two_keys.npz", k=k, keys=k, v=v)
    npz("layers_shape.npz", k=k, v=v, layers=np.array([1, 2, 3]))
    npz("layers_duplicated.npz", k=k, v=v, layers=np.array([4, 4]))
    npz("layers_float.npz", k=k, v=v, layers=np.array([0.0, 1.0]))
    npz("groups_out_of_range.npz", k=k, v=v, q=q, kv_head_of_query_head=np.array([0, 1, 2, 1]))
    npz("groups_without_q.npz", k=k, v=v, kv_head_of_query_head=np.array([0, 1]))
    npz("groups_unread_head.npz", k=k, v=v, q=q, kv_head_of_query_head=np.array([0, 0, 0, 0]))
    np.save(folder / "npy_three.npy", np.stack([k, v, v]))
    raw = (folder / "good.npz").read_bytes()
    (folder / "truncated.npz").write_bytes(raw[: len(raw) // 2])
    (folder / "garbage.safetensors").write_bytes(b"\xff" * 64)
    (folder / "cache.pt").write_bytes(b"torch")
    (folder / "adir.npz").mkdir()
    import struct

    header = json.dumps({"k": {"dtype": "BF16", "shape": [24, 16], "data_offsets": [0, 768]},
                         "v": {"dtype": "F32", "shape": [24, 16], "data_offsets": [768, 2304]}}).encode()
    (folder / "bf16.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(2304))


def _cache(name: str, *extra: str) -> list[str]:
    return ["evaluate", "--cache", f"caches/{name}", "--scheme", "KQV", "--bits", "4", "--json", *extra]


def _evaluate(keys="K.npy", values="V.npy", queries="Q.npy", *extra: str) -> list[str]:
    return ["evaluate", "--keys", keys, "--values", values, "--queries", queries, "--scheme", "KQV", "--bits", "4",
            "--json", *extra]


#: (id, argv, message): rejected with exit status 2 and one line naming the problem.
CLI_REJECTED = [
    ("keys_rank3", _evaluate("k_rank3.npy"),
     "keys (k_rank3.npy) must be 2-D (rows are vectors), got shape (2, 40, 16)"),
    ("keys_rank1", _evaluate("k_rank1.npy"), "must be 2-D (rows are vectors), got shape (16,)"),
    ("keys_scalar", _evaluate("k_0d.npy"), "must be 2-D (rows are vectors), got shape ()"),
    ("values_fewer_rows", _evaluate("K.npy", "v_30.npy"), "keys have 40 rows but values have 30"),
    ("queries_other_head_dim", _evaluate("K.npy", "V.npy", "q_dim8.npy"),
     "queries have head_dim 8 but keys have 16"),
    ("keys_nan", _evaluate("k_nan.npy"),
     "keys (k_nan.npy) has 1 non-finite values (first at row 3, column 2)"),
    ("keys_inf", _evaluate("k_inf.npy"),
     "keys (k_inf.npy) has 1 non-finite values (first at row 0, column 0)"),
    ("values_nan", _evaluate("K.npy", "v_nan.npy"), "values (v_nan.npy) has 1 non-finite values"),
    ("queries_minus_inf", _evaluate("K.npy", "V.npy", "q_ninf.npy"),
     "queries (q_ninf.npy) has 1 non-finite values"),
    ("keys_bool", _evaluate("k_bool.npy"), "must be a numeric array, got dtype bool"),
    ("keys_complex", _evaluate("k_complex.npy"), "must be a numeric array, got dtype complex128"),
    ("keys_strings", _evaluate("k_str.npy"), "must be a numeric array, got dtype <U1"),
    ("keys_structured", _evaluate("k_struct.npy"), "must be a numeric array"),
    ("keys_object_pickle", _evaluate("k_object.npy"),
     "keys file k_object.npy is not a readable .npy/.npz array"),
    ("keys_no_rows", _evaluate("k_empty_rows.npy"),
     "keys (k_empty_rows.npy) is empty (shape (0, 16))"),
    ("keys_no_columns", _evaluate("k_empty_cols.npy"), "is empty (shape (40, 0))"),
    ("head_dim_2", _evaluate("k_dim2.npy", "v_dim2.npy", "q_dim2.npy"),
     "need at least 3 coordinates"),
    ("npz_two_arrays", _evaluate("two.npz"),
     "keys file two.npz is an .npz with 2 arrays; give one array"),
    ("npz_no_arrays", _evaluate("none.npz"), "is an .npz with 0 arrays"),
    ("npz_truncated", _evaluate("trunc.npz"),
     "keys file trunc.npz is not a readable .npy/.npz array"),
    ("npz_bad_crc", _evaluate("crc.npz"),
     "keys file crc.npz is not a readable .npy/.npz array (BadZipFile"),
    ("npy_truncated", _evaluate("trunc.npy"),
     "keys file trunc.npy is not a readable .npy/.npz array"),
    ("text_file", _evaluate("text.npy"),
     "keys file text.npy is not a readable .npy/.npz array: it starts with b'hello,'"),
    ("csv_file", _evaluate("K.csv"),
     "keys file K.csv is not a readable .npy/.npz array: it starts with"),
    ("empty_file", _evaluate("empty.npy"),
     "keys file empty.npy is not a readable .npy/.npz array"),
    ("pickle_file", _evaluate("pickle.npy"),
     "keys file pickle.npy is not a readable .npy/.npz array"),
    ("directory", _evaluate("adir"), "keys file adir is a directory"),
    ("missing_file", _evaluate("nope.npy"), "keys file nope.npy: no such file"),
    ("causal_more_queries_than_keys", _evaluate("k_2rows.npy", "v_2rows.npy", "Q.npy", "--causal"),
     "a causal mask needs n_queries <= n_keys, got 6 > 2"),
    ("norm_beyond_float32", _evaluate("k_huge.npy"), "norm of row 0 is"),
    ("norm_beyond_float16", _evaluate("k_1e5.npy", "V.npy", "Q.npy", "--norm-dtype", "float16"),
     "beyond float16's range (6.55e+04); use norm_dtype float32"),
    ("norm_underflows_float32", _evaluate("k_tiny.npy"),
     "below float32's smallest positive value (1.4e-45): it would be stored as 0"),
    ("norm_underflows_float16", _evaluate("k_1e-9.npy", "V.npy", "Q.npy", "--norm-dtype", "float16"),
     "below float16's smallest positive value"),
    ("logits_overflow", _evaluate("k_1e20.npy", "V.npy", "q_1e300.npy"),
     "attention logits of the keys reach inf"),
    ("logits_beyond_limit", _evaluate("K.npy", "V.npy", "q_1e200.npy"),
     "attention logits of the keys reach"),
    ("sharpness_inf", _evaluate("K.npy", "V.npy", "Q.npy", "--sharpness", "inf"),
     "argument --sharpness: sharpness must be a finite number in (0, 1e6), got inf"),
    ("sharpness_nan", _evaluate("K.npy", "V.npy", "Q.npy", "--sharpness", "nan"), "got nan"),
    ("sharpness_0", _evaluate("K.npy", "V.npy", "Q.npy", "--sharpness", "0"), "in (0, 1e6), got 0"),
    ("sharpness_negative", _evaluate("K.npy", "V.npy", "Q.npy", "--sharpness", "-1"),
     "in (0, 1e6), got -1"),
    ("sharpness_word", _evaluate("K.npy", "V.npy", "Q.npy", "--sharpness", "sharp"),
     "sharpness must be a number, got 'sharp'"),
    ("seed_negative", _evaluate("K.npy", "V.npy", "Q.npy", "--seed", "-1"),
     "argument --seed: seed must be an integer in 0..2^63-1, got -1"),
    ("seed_2_64", _evaluate("K.npy", "V.npy", "Q.npy", "--seed", str(2**64)),
     "seed must be an integer in 0..2^63-1"),
    ("bits_0", ["evaluate", "--keys", "K.npy", "--values", "V.npy", "--queries", "Q.npy", "--scheme", "KQV",
                "--bits", "0"],
     "bits must be an integer in 1..8, got 0"),
    ("scheme_unknown", ["evaluate", "--keys", "K.npy", "--values", "V.npy", "--queries", "Q.npy", "--scheme", "KVQ",
                        "--bits", "4"],
     "unknown scheme 'KVQ'"),
    ("schemes_file_not_mapping", _evaluate("K.npy", "V.npy", "Q.npy", "--schemes", "schemes_list.yaml"),
     "schemes_list.yaml: 'schemes' must be a mapping"),
    ("schemes_file_bad_yaml", _evaluate("K.npy", "V.npy", "Q.npy", "--schemes", "schemes_broken.yaml"),
     "schemes_broken.yaml is not valid YAML (line"),
    ("scheme_overspends", ["evaluate", "--keys", "K.npy", "--values", "V.npy", "--queries", "Q.npy", "--scheme", "OVER",
                           "--bits", "4", "--schemes", "schemes_over.yaml"],
     "scheme OVER side K at budget n=4: spends 5 bits"),
    ("stage_slice_not_json", ["stage", "cells", "--slice", "{dim: 3", "--manifest", "out/d.json", "--packed", "p",
                              "--per-query", "q", "--per-key", "k"],
     "--slice is not valid JSON"),
    ("stage_slice_not_object", ["stage", "cells", "--slice", "[1, 2]", "--manifest", "out/d.json", "--packed", "p",
                                "--per-query", "q", "--per-key", "k"],
     "--slice must be a JSON object"),
    ("stage_slice_missing_keys", ["stage", "cells", "--slice", '{"dim": 16}', "--manifest", "d.json", "--packed",
                                  "p", "--per-query", "q", "--per-key", "k"],
     "--slice of the cells stage lacks key(s) base_seed, budgets, distribution"),
    # one key: every attention weight is 1, KL 0 and recall 1 whatever the scheme (was accepted)
    ("single_key", _evaluate("k_1row.npy", "v_1row.npy"), "keys need at least 2 rows (positions), got 1"),
    ("dequantize_plain_array", ["dequantize", "K.npy", "out/k.npy"], "is a plain .npy array, not a packed cache"),
    ("dequantize_truncated", ["dequantize", "trunc.npz", "out/k.npy"],
     "trunc.npz: not a readable .npz packed cache"),
    ("dequantize_foreign_npz", ["dequantize", "two.npz", "out/k.npy"], "two.npz holds no packed cache"),
    # bring-your-own cache files (kvasym.cachefile)
    ("cache_rank5", _cache("rank5.npz"),
     "keys 'k' must have rank 2, 3 or 4 ((T, d), (H_kv, T, d) or (L, H_kv, T, d)), got shape (1, 2, 2, 24, 16)"),
    ("cache_rank1", _cache("rank1.npz"), "keys 'k' must have rank 2, 3 or 4"),
    ("cache_q_head_dim", _cache("q_head_dim.npz"), "queries have head_dim 8 but keys have head_dim 16"),
    ("cache_v_positions", _cache("v_positions.npz"),
     "values 'v' shape (2, 2, 20, 16) does not match keys shape (2, 2, 24, 16)"),
    ("cache_q_rank", _cache("q_rank.npz"),
     "queries 'q' have rank 3 (shape (4, 24, 16)) but keys have rank 4"),
    ("cache_q_layers", _cache("q_layers.npz"), "queries have 1 layers but keys have 2"),
    ("cache_q_heads", _cache("q_heads.npz"), "3 query heads are not a multiple of 2 KV heads"),
    ("cache_q_positions", _cache("q_positions.npz"), "48 query positions but only 24 cached positions"),
    ("cache_k_nan", _cache("k_nan.npz"),
     "array 'k' has 1 non-finite values (NaN/Inf), first at index (1, 0, 5, 2)"),
    ("cache_v_inf", _cache("v_inf.npz"),
     "array 'v' has 1 non-finite values (NaN/Inf), first at index (0, 1, 0, 0)"),
    ("cache_q_minus_inf", _cache("q_ninf.npz"),
     "array 'q' has 1 non-finite values (NaN/Inf), first at index (0, 3, 2, 1)"),
    ("cache_empty", _cache("empty.npz"), "empty cache (keys shape (2, 2, 0, 16)"),
    ("cache_one_position", _cache("one_position.npz"), "1 cached position(s); at least 2 are needed"),
    ("cache_head_dim_2", _cache("head_dim_2.npz"), "head_dim 2 (keys) / 2 (values); at least 3 are needed"),
    ("cache_bool", _cache("k_bool.npz"), "array 'k' has dtype bool; expected a float or integer type"),
    ("cache_complex", _cache("k_complex.npz"), "array 'k' has dtype complex64"),
    ("cache_bfloat16", _cache("bf16.safetensors"),
     "array 'k' has dtype BF16; expected a float or integer type (convert bfloat16 to float32"),
    ("cache_unknown_name", _cache("unknown_name.npz"),
     "unknown array name(s) ['key']; allowed: k, keys, v, values, q, queries"),
    ("cache_no_values", _cache("no_values.npz"), "no values array (name it v or values)"),
    ("cache_two_key_arrays", _cache("two_keys.npz"), "arrays 'k' and 'keys' both give the keys; keep one"),
    ("cache_layers_shape", _cache("layers_shape.npz"), "layers has shape (3,), expected (2,)"),
    ("cache_layers_duplicated", _cache("layers_duplicated.npz"), "'layers' has duplicates: [4, 4]"),
    ("cache_layers_float", _cache("layers_float.npz"), "'layers' must hold integers, got dtype float64"),
    ("cache_groups_out_of_range", _cache("groups_out_of_range.npz"),
     "'kv_head_of_query_head' must be in 0..1, got [0, 1, 2, 1]"),
    ("cache_groups_without_q", _cache("groups_without_q.npz"), "kv_head_of_query_head without queries"),
    ("cache_groups_unread_head", _cache("groups_unread_head.npz"), "no query head reads KV head(s) [1]"),
    ("cache_npy_three", _cache("npy_three.npy"),
     "a .npy cache is one array of shape (2, [L,] [H,] T, d) stacking K and V, got shape (3,"),
    ("cache_truncated", _cache("truncated.npz"),
     "cache file caches/truncated.npz is not a readable .npz file"),
    ("cache_garbage_safetensors", _cache("garbage.safetensors"),
     "cache file caches/garbage.safetensors is not a readable .safetensors file"),
    ("cache_suffix", _cache("cache.pt"), "unsupported suffix '.pt'; use one of .npz, .safetensors, .npy"),
    ("cache_directory", _cache("adir.npz"), "cache file caches/adir.npz is a directory"),
    ("cache_missing", _cache("nope.npz"), "cache file caches/nope.npz: no such file"),
    ("cache_and_matrices", _cache("good.npz", "--keys", "K.npy"),
     "give --cache or --keys/--values/--queries, not both"),
    ("matrices_incomplete", ["evaluate", "--keys", "K.npy", "--scheme", "KQV", "--bits", "4"],
     "missing --queries, --values"),
    ("cache_n_queries_0", _cache("good.safetensors", "--n-queries", "0"),
     "n-queries must be an integer in 1..100000, got 0"),
]


def _run_cli_output(argv: list[str], cwd: Path, capsys) -> tuple[int, str, str]:
    """cli.main in-process (argparse errors exit via SystemExit, as on the command line):
    exit code, stdout, stderr."""
    import os

    old = os.getcwd()
    os.chdir(cwd)
    try:
        try:
            code = main(argv)
        except SystemExit as exc:
            code = int(exc.code or 0)
    finally:
        os.chdir(old)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _run_cli(argv: list[str], cwd: Path, capsys) -> tuple[int, str]:
    code, _out, err = _run_cli_output(argv, cwd, capsys)
    return code, err


@pytest.mark.parametrize("case_id, argv, message", CLI_REJECTED, ids=[c[0] for c in CLI_REJECTED])
def test_cli_rejects_bad_cache(arrays: Path, capsys, case_id: str, argv: list[str], message: str) -> None:
    shutil.rmtree(arrays / "out", ignore_errors=True)
    code, err = _run_cli(argv, arrays, capsys)
    assert code == 2, err
    assert message in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-1].startswith("kvasym") and ": error: " in lines[-1] and message in lines[-1]
    assert not (arrays / "out").exists(), "nothing written"


#: A few of the same cases through a real subprocess: exit status 2, no traceback at all.
SUBPROCESS_IDS = ["npz_bad_crc", "text_file", "logits_overflow", "seed_negative", "keys_nan",
                  "stage_slice_missing_keys"]


@pytest.mark.parametrize("case_id", SUBPROCESS_IDS)
def test_cli_subprocess_one_line_no_traceback(arrays: Path, case_id: str) -> None:
    _, argv, message = next(c for c in CLI_REJECTED if c[0] == case_id)
    proc = subprocess.run([sys.executable, "-m", "kvasym.cli", *argv], cwd=arrays, capture_output=True, text=True,
                          env=run_env())
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "Warning" not in proc.stderr, proc.stderr
    assert message in proc.stderr
    # one error line (argparse prints its usage lines above it)
    assert [line for line in proc.stderr.splitlines() if "error:" in line] == proc.stderr.strip().splitlines()[-1:]


#: (id, argv) accepted on purpose: exit 0 and finite, in-range metrics.
CLI_ACCEPTED = [
    ("keys_int32", _evaluate("k_int32.npy")),
    ("keys_uint8", _evaluate("k_uint8.npy")),
    ("keys_float16", _evaluate("k_f16.npy")),
    ("keys_one_zero_row", _evaluate("k_zero_row.npy")),
    ("keys_all_zero", _evaluate("k_zeros.npy")),
    ("values_all_zero", _evaluate("K.npy", "v_zeros.npy")),
    ("queries_all_zero", _evaluate("K.npy", "V.npy", "q_zeros.npy")),
    ("values_other_head_dim", _evaluate("K.npy", "v_dim8.npy")),
    ("keys_single_array_npz", _evaluate("k_one.npz")),
    ("causal", _evaluate("K.npy", "V.npy", "Q.npy", "--causal")),
]


@pytest.mark.parametrize("case_id, argv", CLI_ACCEPTED, ids=[c[0] for c in CLI_ACCEPTED])
def test_cli_accepts_legitimate_cache(arrays: Path, capsys, case_id: str, argv: list[str]) -> None:
    code, out, err = _run_cli_output(argv, arrays, capsys)
    assert code == 0, err
    assert err == ""
    summary = json.loads(out)
    for key, value in summary.items():
        if isinstance(value, float):
            assert math.isfinite(value), key
    assert summary["kl_mean"] >= 0 and summary["kl_max"] >= summary["kl_mean"]
    assert 0 <= summary["recall_top5_mean"] <= 1


#: (id, argv, expected) bring-your-own caches accepted on purpose: every documented format and rank.
CACHE_ACCEPTED = [
    ("npz_gqa_queries", _cache("good.npz"), {"layers": [3, 11], "kv_heads": 2, "n_queries": 2 * 24}),
    ("npz_rank2_long_names", _cache("good_rank2.npz"), {"layers": [0], "kv_heads": 1, "n_queries": 64}),
    ("npz_integer_keys", _cache("good_int.npz"), {"layers": [0, 1], "kv_heads": 2, "n_queries": 64}),
    ("safetensors_no_queries", _cache("good.safetensors", "--n-queries", "10"),
     {"layers": [0, 1], "kv_heads": 2, "n_queries": 10}),
    ("npy_stacked", _cache("good.npy", "--no-causal"), {"layers": [0, 1], "kv_heads": 2, "n_queries": 64}),
]


@pytest.mark.parametrize("case_id, argv, expected", CACHE_ACCEPTED, ids=[c[0] for c in CACHE_ACCEPTED])
def test_cli_accepts_documented_cache_files(arrays: Path, capsys, case_id: str, argv: list[str],
                                            expected: dict) -> None:
    code, out, err = _run_cli_output(argv, arrays, capsys)
    assert code == 0, err
    report = json.loads(out)
    heads = report["heads"]
    assert sorted({h["layer"] for h in heads}) == expected["layers"]
    assert len(heads) == len(expected["layers"]) * expected["kv_heads"]
    assert {h["n_queries"] for h in heads} == {expected["n_queries"]}
    assert report["overall"]["n_queries"] == expected["n_queries"] * len(heads)
    assert all(0 <= h["kl_mean"] <= h["kl_max"] and 0 <= h["recall_top5_mean"] <= 1 for h in heads)


def test_cli_write_failure_is_one_line(arrays: Path, capsys) -> None:
    """An output path that cannot be created (its parent is a file): exit 1, the path named."""
    code, err = _run_cli(["quantize", "--scheme", "KV", "--bits", "2", "--side", "K", "K.npy", "a_file/k.npz"], arrays,
                         capsys)
    assert code == 1
    assert err.startswith("kvasym: error: a_file") and "not a directory" in err
    assert len(err.strip().splitlines()) == 1


def test_cli_bad_input_leaves_existing_output_untouched(arrays: Path, capsys) -> None:
    out = arrays / "keep.npz"
    assert _run_cli(["quantize", "--scheme", "KV", "--bits", "2", "--side", "K", "K.npy", "keep.npz"], arrays,
                    capsys)[0] == 0
    before = out.read_bytes()
    code, _ = _run_cli(["quantize", "--scheme", "KV", "--bits", "2", "--side", "K", "k_nan.npy", "keep.npz"], arrays,
                       capsys)
    assert code == 2 and out.read_bytes() == before


def test_cli_tables_are_large_enough() -> None:
    assert len(CLI_REJECTED) >= 35
    assert len({c[0] for c in CLI_REJECTED + CLI_ACCEPTED}) == len(CLI_REJECTED) + len(CLI_ACCEPTED)


# ---------------------------------------------------------------------------------------------
# intermediates tampered with between runs


def _truncate(path: Path, keep: float = 0.5) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[: int(len(raw) * keep)])


def _garbage(path: Path) -> None:
    path.write_bytes(np.random.default_rng(1).bytes(path.stat().st_size))


def _flip_member_byte(path: Path) -> None:
    """Change one byte inside the codes array of the first cache (the zip CRC must catch it)."""
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("t0.K/codes.npy")
    raw = bytearray(path.read_bytes())
    offset = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra) + 140
    raw[offset] ^= 0xFF
    path.write_bytes(bytes(raw))


def _rename_members(path: Path, mapping: dict[str, str]) -> None:
    """Rewrite the .npz with caches renamed (t0 <-> t1): a valid file, the wrong trial's data."""
    with np.load(path) as npz:
        arrays = {k: npz[k] for k in npz.files}
    renamed = {}
    for key, value in arrays.items():
        name, rest = key.split("/", 1)
        renamed[f"{mapping.get(name, name)}/{rest}"] = value
    np.savez(path, **renamed)


def _restamped(manifest: dict) -> dict:
    from kvasym.manifest import CONTENT_DIGEST_KEY, content_digest

    return {**manifest, CONTENT_DIGEST_KEY: content_digest(manifest)}


@dataclass(frozen=True)
class Tamper:
    id: str
    stage: str  # which stage reads the tampered file: metrics (of a query-model variant), stats, theory, gather,
    # claims
    target: str  # packed, data, per_query, per_key, gathered, stats_part
    action: Callable[[Path, "MiniRun"], None]
    message: str


TAMPERED = [
    Tamper("packed_truncated", "metrics", "packed", lambda p, r: _truncate(p), "not a readable .npz packed cache"),
    Tamper("packed_empty", "metrics", "packed", lambda p, r: p.write_bytes(b""), "not a readable .npz packed cache"),
    Tamper("packed_garbage", "metrics", "packed", lambda p, r: _garbage(p), "not a readable .npz packed cache"),
    Tamper("packed_byte_flipped", "metrics", "packed", lambda p, r: _flip_member_byte(p), "BadZipFile"),
    Tamper("packed_from_other_budget", "metrics", "packed",
           lambda p, r: shutil.copy(r.cell("lowrank4", "KQV", 2)["packed"], p),
           "has budget = 2 but cell KQV n=4 needs 4"),
    Tamper("packed_from_other_scheme", "metrics", "packed",
           lambda p, r: shutil.copy(r.cell("lowrank4", "KV", 4)["packed"], p), "but cell KQV n=4 needs"),
    Tamper("packed_from_other_distribution", "metrics", "packed",
           lambda p, r: shutil.copy(r.cell("lowrank2", "KQV", 4)["packed"], p), "rotation_seed"),
    Tamper("packed_trials_swapped", "metrics", "packed",
           lambda p, r: _rename_members(p, {"t0.K": "t1.K", "t1.K": "t0.K", "t0.V": "t1.V", "t1.V": "t0.V"}),
           "trial 0 side K has rotation_seed"),
    Tamper("packed_trial_missing", "metrics", "packed",
           lambda p, r: _rename_members(p, {"t2.K": "x2.K", "t2.V": "x2.V"}), "no packed caches for trial 2"),
    Tamper("manifest_truncated", "theory", "data", lambda p, r: _truncate(p), "unreadable data manifest"),
    Tamper("manifest_not_object", "theory", "data", lambda p, r: p.write_text("[1, 2]"), "unreadable data manifest"),
    Tamper("manifest_other_slice", "theory", "data",
           lambda p, r: p.write_text(p.read_text().replace('"seq_len": 32', '"seq_len": 33')),
           "made for another config slice"),
    Tamper("manifest_digest_changed", "theory", "data",
           lambda p, r: p.write_text(json.dumps({**json.loads(p.read_text()),
                                                 "trials": [{"trial": t, "sha256": "0" * 64} for t in range(3)]})),
           "does not match its digest"),
    # a consistent manifest (its content digest restamped) whose trial digests are wrong: the
    # regenerated data is then refused trial by trial
    Tamper("manifest_trial_digest_restamped", "theory", "data",
           lambda p, r: p.write_text(json.dumps(_restamped({**json.loads(p.read_text()),
                                                            "trials": [{"trial": t, "sha256": "0" * 64}
                                                                       for t in range(3)]}))),
           "differs from its manifest digest"),
    Tamper("per_query_truncated", "stats", "per_query", lambda p, r: _truncate(p), "not a readable Parquet table"),
    Tamper("per_query_garbage", "stats", "per_query", lambda p, r: _garbage(p), "not a readable Parquet table"),
    Tamper("per_query_deleted", "stats", "per_query", lambda p, r: p.unlink(), "no such file"),
    Tamper("per_key_truncated", "theory", "per_key", lambda p, r: _truncate(p, 0.8), "not a readable Parquet table"),
    # valid tables filed under another cell (issue 18, class 1): refused naming both
    Tamper("per_query_from_other_distribution", "stats", "per_query",
           lambda p, r: shutil.copy(r.cell("t1.05", "KQV", 4)["per_query"], p),
           "holds distribution = 't1.05' but is filed under distribution = 'gaussian'"),
    Tamper("per_query_from_other_budget", "stats", "per_query",
           lambda p, r: shutil.copy(r.cell("gaussian", "KQV", 2)["per_query"], p),
           "both hold the cell scheme = 'KQV', "),
    Tamper("per_key_from_other_scheme", "theory", "per_key",
           lambda p, r: shutil.copy(r.cell("gaussian", "KV", 4)["per_key"], p), "both hold the cell scheme = 'KV', "),
    Tamper("stats_part_copied_over_another", "gather", "stats_part",
           lambda p, r: shutil.copy(r.paths["summary_parts"][1], p), "both hold the cell distribution = 't1.05'"),
    Tamper("stats_part_truncated", "gather", "stats_part", lambda p, r: _truncate(p),
           "not a readable Parquet table"),
    Tamper("gathered_table_truncated", "claims", "gathered", lambda p, r: _truncate(p),
           "not a readable Parquet table"),
]


def _copy_run(run: MiniRun, dest: Path) -> MiniRun:
    shutil.copytree(run.root, dest)
    moved = MiniRun(dest, run.study)
    moved.paths = {
        k: ([dest / Path(p).relative_to(run.root) for p in v] if isinstance(v, list)
            else dest / Path(v).relative_to(run.root))
        for k, v in run.paths.items()
    }
    return moved


@pytest.mark.parametrize("case", TAMPERED, ids=[c.id for c in TAMPERED])
def test_tampered_intermediate_is_detected(mini: MiniRun, variant_mini: MiniRun, tmp_path, case: Tamper) -> None:
    run = _copy_run(variant_mini if case.stage == "metrics" else mini, tmp_path / "run")
    dist = "lowrank4" if case.stage == "metrics" else "gaussian"
    study, dim, scheme, budget = run.study, 16, "KQV", 4
    cell = run.cell(dist, scheme, budget)
    data = run.root / f"data/{dist}/d{dim}.json"
    target = {
        "packed": cell["packed"], "data": data, "per_query": cell["per_query"], "per_key": cell["per_key"],
        "gathered": run.paths.get("comparisons"), "stats_part": (run.paths.get("summary_parts") or [None])[0],
    }[case.target]
    case.action(target, run)
    out = tmp_path / "out"
    with pytest.raises(KvasymError) as info:
        if case.stage == "metrics":
            run_metrics(study.unit_slice("lowrank4+isotropic", dim), cell["packed"].parent.parent,
                        out / "m.json", out / "pq", out / "pk")
        elif case.stage == "stats":
            paths = [run.cell(dist, s, b)["per_query"] for s in study.schemes for b in study.budgets]
            run_stats(study.stats_slice(dist, dim), paths, out / "c.parquet", out / "s.parquet", out / "t.parquet")
        elif case.stage == "theory":
            paths = [run.cell(dist, s, b)["per_key"] for s in study.schemes for b in study.budgets]
            run_theory(study.theory_slice(dist, dim), data, paths, out / "theory.parquet")
        elif case.stage == "gather":
            gather(run.paths["summary_parts"], out / "summary.parquet")
        else:
            run_claims(ROOT / "config/claims.test.yaml", _tables(run), out / "c.json", out / "c.md", out / "c.tex",
                       headline=run.study.headline)
    message = str(info.value)
    assert case.message in message, message
    assert "\n" not in message
    if case.id != "manifest_trial_digest_restamped":  # regenerated data is refused trial by trial
        assert target.name in message, "the message names the file"
    if (case.target in ("packed", "per_query", "per_key", "gathered", "stats_part")
            and "no such file" not in case.message):
        # the stage command moves a DamagedFile aside (test_damaged_intermediate_is_moved_aside...);
        # a conflict between two files it cannot blame on one says what to delete
        assert (isinstance(info.value, DamagedFile) and Path(info.value.path) == target
                or "delete the wrong one" in message), message
    assert not out.exists() or not any(out.iterdir()), "nothing written"


def test_tampered_packed_cache_through_the_stage_command(variant_mini: MiniRun, tmp_path) -> None:
    """What the Snakemake rule runs: exit status 2 and one line in the job's log."""
    from kvasym.study import canonical_json

    # under a results/ folder, where the DAG writes: only there is a damaged file its to move aside
    run = _copy_run(variant_mini, tmp_path / "results")
    cell = run.cell("lowrank4", "KQV", 4)
    _truncate(cell["packed"])
    slice_ = canonical_json(run.study.unit_slice("lowrank4+isotropic", 16))
    proc = subprocess.run(
        [sys.executable, "-m", "kvasym.cli", "stage", "metrics", "--slice", slice_,
         "--packed", str(run.root / "packed/lowrank4/d16"), "--manifest", str(tmp_path / "m.json"),
         "--per-query", str(tmp_path / "pq"), "--per-key", str(tmp_path / "pk")],
        capture_output=True, text=True, env=run_env(),
    )
    assert proc.returncode == 2
    # the stage names itself first (so its log has content even on a full disk), then the error
    assert proc.stderr.startswith("kvasym ") and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("kvasym: error: ") and "n4.npz" in last
    assert not (tmp_path / "pq").exists() and not (tmp_path / "m.json").exists()
    # the parent's packed folder (written whole by its cells job) is moved aside, so the next
    # Snakemake run reruns that job
    assert last.endswith("moved aside to .d16.damaged; rerun and the rule that writes it rebuilds it"), last
    folder = run.root / "packed/lowrank4/d16"
    assert not folder.exists() and (folder.with_name(".d16.damaged") / "KQV" / "n4.npz").is_file()


def test_damaged_input_of_the_figure_stage_is_one_line_and_moved_aside(mini: MiniRun, tmp_path) -> None:
    """A figure job read its per-query files with bare pyarrow: a truncated one gave a traceback."""
    from kvasym.render.figures.registry import figures_slice
    from kvasym.study import canonical_json

    run = _copy_run(mini, tmp_path / "results")  # where the DAG writes (move_aside_damaged)
    files = [run.cell("gaussian", s, b)["per_query"] for s in run.study.schemes for b in run.study.budgets]
    _truncate(files[1])
    proc = subprocess.run(
        [sys.executable, "-m", "kvasym.cli", "stage", "figure", "--family", "kl_ecdf",
         "--slice", canonical_json(figures_slice(run.study)), "--per-query", *map(str, files),
         "--summary", str(run.paths["summary"]), "--out-dir", str(tmp_path / "figures")],
        capture_output=True, text=True, env=run_env(),
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"kvasym: error: {files[1]}: not a readable Parquet table"), last
    # the file is in its unit's folder, which its cells job writes whole: the folder goes aside
    assert last.endswith("moved aside to .d16.damaged; rerun and the rule that writes it rebuilds it"), last
    assert (run.root / "metrics/per_query/gaussian/.d16.damaged" / files[1].relative_to(files[1].parents[1])).is_file()
    assert not (tmp_path / "figures").exists() or not any((tmp_path / "figures").iterdir())


def test_figure_stage_refuses_a_cell_file_copied_over_another(mini: MiniRun, tmp_path) -> None:
    from kvasym.render.figures.registry import figures_slice
    from kvasym.stages.figure import run_figures

    run = _copy_run(mini, tmp_path / "run")
    files = [run.cell("gaussian", s, b)["per_query"] for s in run.study.schemes for b in run.study.budgets]
    shutil.copyfile(files[0], files[1])
    # the copy itself is named (the cell its path files it under), not only the clash of two files
    with pytest.raises(DamagedFile, match=rf"{files[1].name}: holds budget = 2 but is filed under budget = 4"):
        run_figures(figures_slice(run.study), {"per_query": files, "summary": run.paths["summary"]},
                    tmp_path / "figures", ["kl_ecdf"])
    # and with the DAG's digests, a table of the right cell made under another config is refused
    from kvasym.cells import cell_of_path, slice_digest

    other = load_study({**MINI, "base_seed": MINI["base_seed"] + 1})
    digests = {str(p): slice_digest(other.metrics_slice(**cell_of_path(p))) for p in files[:1]}
    with pytest.raises(DamagedFile, match="was made under another configuration"):
        run_figures(figures_slice(run.study), {"per_query": files[:1], "cell_digests": digests,
                                               "summary": run.paths["summary"]}, tmp_path / "f2", ["kl_ecdf"])


def test_a_damaged_user_file_is_never_moved(tmp_path) -> None:
    """Only a stage's declared DAG intermediates, and only those a stage wrote (under a results/
    folder, or inside a folder a stage wrote whole), are moved aside; a user's file stays put,
    even when given by a flag that names an intermediate (issue 33, point 1: ``kvasym stage
    metrics --packed`` given the user's own read-only caches renamed one of them)."""
    import argparse
    import stat

    from kvasym.stages import move_aside_damaged

    mine, packed = tmp_path / "mine.npz", tmp_path / "results" / "packed.npz"
    packed.parent.mkdir()
    for path in (mine, packed):
        path.write_bytes(b"damaged")
    # the user's own packed-caches folder (no stage wrote it), read-only, given to the metrics stage
    own = tmp_path / "my_caches"
    (own / "KQV").mkdir(parents=True)
    theirs = own / "KQV" / "n4.npz"
    theirs.write_bytes(b"another cell's cache")
    theirs.chmod(stat.S_IRUSR)
    by_hand = argparse.Namespace(stage_name="metrics", packed=str(own))
    assert "so it is yours: fix or replace it and rerun" in move_aside_damaged(by_hand, str(theirs))
    assert theirs.read_bytes() == b"another cell's cache"
    assert sorted(p.name for p in own.rglob("*")) == ["KQV", "n4.npz"]
    # file_metrics reads a user's cache dump: it declares no intermediate
    user = argparse.Namespace(stage_name="file_metrics", cache=str(mine))
    assert move_aside_damaged(user, str(mine)) == "fix or replace it and rerun"
    # theory declares --data and --per-key; a path it was not given is not its to move
    dag = argparse.Namespace(stage_name="theory", data=str(tmp_path / "d.json"), per_key=[str(packed)])
    assert move_aside_damaged(dag, str(mine)) == "fix or replace it and rerun"
    assert mine.read_bytes() == b"damaged"
    assert move_aside_damaged(dag, str(packed)).startswith("moved aside to .packed.npz.damaged")
    assert not packed.exists() and (tmp_path / "results" / ".packed.npz.damaged").read_bytes() == b"damaged"
    # a second consumer of the same damaged file finds it gone
    assert "moved aside by another job" in move_aside_damaged(dag, str(packed))


@pytest.mark.parametrize("read_only", [True, False])
def test_a_copied_stage_folder_outside_results_is_the_users(tmp_path, read_only) -> None:
    """Issue 51, point 1: a `cp -r` copy of a folder a stage wrote whole carries its marker file;
    outside results/ it is the user's all the same (read-only or writable): one line, nothing
    moved. The same folder inside results/ goes aside whole."""
    import argparse
    import shutil
    import stat

    from kvasym.atomic import FOLDER_MARKER, atomic_folder
    from kvasym.stages import move_aside_damaged

    written = tmp_path / "results" / "packed" / "t"
    with atomic_folder(written) as folder:
        (folder / "KQV").mkdir()
        (folder / "KQV" / "n4.npz").write_bytes(b"a damaged cache")
    assert (written / FOLDER_MARKER).is_file()
    mine = tmp_path / "mine"
    shutil.copytree(written, mine)  # what `cp -r` does: the marker comes along
    if read_only:
        for path in [*mine.rglob("*"), mine]:
            path.chmod(stat.S_IRUSR | (stat.S_IXUSR if path.is_dir() else 0))
    before = sorted(str(p.relative_to(mine)) for p in mine.rglob("*"))
    by_hand = argparse.Namespace(stage_name="metrics", packed=str(mine))
    said = move_aside_damaged(by_hand, str(mine / "KQV" / "n4.npz"))
    assert "so it is yours" in said and "\n" not in said
    assert sorted(str(p.relative_to(mine)) for p in mine.rglob("*")) == before and mine.is_dir()
    assert not (tmp_path / ".mine.damaged").exists()
    if read_only:
        for path in [*mine.rglob("*"), mine]:
            path.chmod(stat.S_IRWXU)
    dag = argparse.Namespace(stage_name="metrics", packed=str(written))
    assert move_aside_damaged(dag, str(written / "KQV" / "n4.npz")).startswith("moved aside to .t.damaged")
    assert (written.parent / ".t.damaged" / "KQV" / "n4.npz").is_file() and not written.exists()


def test_untampered_mini_run_is_sane(mini: MiniRun) -> None:
    """The baseline every tampering case departs from: the stages agree with each other."""
    df = pd.concat([pd.read_parquet(mini.cell(d, s, b)["per_query"]) for d, _, s, b in mini.study.cells()])
    assert np.isfinite(df.select_dtypes("number").to_numpy()).all()
    assert (df["kl"] >= 0).all() and df["recall_top5"].between(0, 1).all()


@pytest.mark.parametrize("magnitude", [1e-7, 1e-30])
def test_float16_side_arrays_too_coarse_for_the_cache_are_refused(magnitude):
    """Issue 33, point 3: KIVI's float16 group zero points and scales on a cache near 1e-7 were
    stored with exit 0 and reconstructed with relative errors of 1 to 1.8 (worse than zeros);
    float16 norms likewise. Both are refused naming float16 and the remedy; the same cache at
    1e-3 (inside float16's normal range), or one tiny channel in a cache of ordinary size, is
    quantized with the error of its bits; float32 norms keep the tiny cache."""
    from kvasym.cache import quantize
    from kvasym.schemes import get_scheme

    rng = np.random.default_rng(3)
    g = rng.standard_normal((256, 64))
    kivi, rkv = get_scheme("KIVI32"), get_scheme("RKV")
    for spec in (kivi.K, kivi.V):
        with pytest.raises(KvasymError, match=r"minmax group zero points and scales stored in float16 would be off"):
            quantize(g * magnitude, spec, 4, rotation_seed=1, qjl_seed=2)
        for x in (g * 1e-3, np.where(np.arange(64) == 5, g * magnitude, g)):
            x_hat = quantize(x, spec, 4, rotation_seed=1, qjl_seed=2).dequantize("float64")
            assert np.linalg.norm(x_hat - x) / np.linalg.norm(x) < 0.1
    if magnitude * 8 > np.finfo(np.float16).smallest_subnormal:  # norms that float16 keeps, coarsely
        with pytest.raises(KvasymError, match=r"norms stored in float16 would be off by .*norm_dtype float32"):
            quantize(g * magnitude, rkv.K, 4, rotation_seed=1, qjl_seed=2, norm_dtype="float16")
    x = g * magnitude
    x_hat = quantize(x, rkv.K, 4, rotation_seed=1, qjl_seed=2, norm_dtype="float32").dequantize("float64")
    assert np.linalg.norm(x_hat - x) / np.linalg.norm(x) < 0.12


def _unit_into(study: Any, root: Path, dist: str = "gaussian", dim: int = 16) -> dict[str, Path]:
    """The cells unit of (dist, dim) run into ``root/results`` as the DAG lays it out."""
    results = root / "results"
    folders = {t: results / f"metrics/{t}/{dist}/d{dim}" for t in ("per_query", "per_key")}
    run_cells(study.unit_slice(dist, dim), results / f"data/{dist}/d{dim}.json", results / f"packed/{dist}/d{dim}",
              folders["per_query"], folders["per_key"])
    return folders


def test_a_cell_table_made_under_another_config_is_refused_and_moved_aside(tmp_path, capsys) -> None:
    """Issue 33, point 7: a per-query table filed under the right cell but made under another
    config (base seed 8 where the grid's is 7) was read by the stats stage with exit 0, pairing
    trials of different data. With the slice digests the DAG passes (--cells), the stage
    refuses it naming the file and the configuration, and moves the unit folder aside; without
    them (a hand run) only the cell columns are checked, as before."""
    from kvasym.cells import slice_digest
    from kvasym.study import canonical_json

    study, other = load_study(MINI), load_study({**MINI, "base_seed": MINI["base_seed"] + 1})
    ours = _unit_into(study, tmp_path / "run")
    theirs = _unit_into(other, tmp_path / "elsewhere")
    victim = ours["per_query"] / "KQV" / "n4.parquet"
    shutil.copyfile(theirs["per_query"] / "KQV" / "n4.parquet", victim)
    files = [str(ours["per_query"] / s / f"n{b}.parquet") for s in study.schemes for b in study.budgets]
    cells = [{"scheme": s, "budget": b, "slice_sha256": slice_digest(study.metrics_slice("gaussian", 16, s, b))}
             for s in study.schemes for b in study.budgets]
    outs = ["--comparisons", str(tmp_path / "c.parquet"), "--summary", str(tmp_path / "s.parquet"),
            "--trials", str(tmp_path / "t.parquet")]
    stats = ["stage", "stats", "--slice", canonical_json(study.stats_slice("gaussian", 16)), "--per-query", *files]
    bare = [{k: v for k, v in c.items() if k != "slice_sha256"} for c in cells]
    assert main([*stats, "--cells", canonical_json(bare), *outs]) == 0  # what the issue saw: accepted
    capsys.readouterr()
    outs2 = [o.replace(".parquet", "2.parquet") for o in outs]
    assert main([*stats, "--cells", canonical_json(cells), *outs2]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "n4.parquet: was made under another configuration" in last and "Traceback" not in last, last
    assert f"base_seed = {MINI['base_seed'] + 1}" in last
    assert last.endswith("moved aside to .d16.damaged; rerun and the rule that writes it rebuilds it"), last
    assert not ours["per_query"].exists() and (ours["per_query"].parent / ".d16.damaged").is_dir()
    assert not (tmp_path / "c2.parquet").exists()


def test_the_frontier_refuses_a_cell_file_copied_over_another(tmp_path) -> None:
    """Issue 33, point 9: a frontier-only scheme's n = 2 file copied over its n = 4 file was read
    by the frontier stage as both (exit 0, n = 4 gone from the points, n = 2 twice). Every file
    now goes through the stats stage's reader: the cell its path files it under must be the one
    it holds; with the DAG's digests, its provenance must be this config's."""
    from kvasym.cells import cell_of_path, slice_digest
    from kvasym.stages.frontier import run_frontier

    study = load_study({**MINI, "frontier": {"schemes": ["CRKV"], "distributions": ["gaussian"]}})
    ours = _unit_into(study, tmp_path / "run")
    scheme = study.frontier_schemes_on("gaussian")[0]
    assert scheme not in study.schemes
    paths = [ours["per_query"] / s / f"n{b}.parquet" for s in study.unit_schemes("gaussian") for b in study.budgets]
    digests = [slice_digest(study.metrics_slice(**cell_of_path(p))) for p in paths]
    fslice = {"schemes": study.unit_schemes("gaussian")}
    run_frontier(fslice, paths, tmp_path / "p.parquet", tmp_path / "u.parquet", digests)  # untampered: fine
    shutil.copyfile(ours["per_query"] / scheme / "n2.parquet", ours["per_query"] / scheme / "n4.parquet")
    for given in (None, digests):
        with pytest.raises(DamagedFile, match=r"n4\.parquet.*holds budget = 2 but is filed under budget = 4"):
            run_frontier(fslice, paths, tmp_path / "p2.parquet", tmp_path / "u2.parquet", given)
    assert not (tmp_path / "p2.parquet").exists()
    with pytest.raises(KvasymError, match="not a cell file of the results layout"):
        run_frontier(fslice, [tmp_path / "p.parquet"], tmp_path / "p3.parquet", tmp_path / "u3.parquet")


@pytest.mark.parametrize("stage", ["stats", "theory"])
def test_a_stage_run_by_hand_from_config_checks_provenance_as_the_dag(tmp_path, capsys, stage) -> None:
    """Issue 51, point 2: ``kvasym stage stats --config c7.yaml`` with scheme and budget in
    --cells (no digests), or with no --cells at all, read a per-query table whose provenance says
    base seed 8 in a base-seed-7 grid, and exited 0; run by hand it now computes each cell's digest
    from its own config, as the DAG does, and refuses (exit 2, one line); the config the tables
    were made under passes."""
    import json as _json

    import yaml

    from kvasym.cli import main
    from kvasym.study import canonical_json

    made = {**MINI, "base_seed": MINI["base_seed"] + 1}
    study = load_study(made)
    folders = _unit_into(study, tmp_path)
    configs = {}
    for name, config in (("c7", MINI), ("c8", made)):
        configs[name] = tmp_path / f"{name}.yaml"
        configs[name].write_text(yaml.safe_dump(_json.loads(_json.dumps(config))), encoding="utf-8")
    table = "per_query" if stage == "stats" else "per_key"
    files = [str(folders[table] / s / f"n{b}.parquet") for s in study.schemes for b in study.budgets]
    cells = canonical_json([{"scheme": s, "budget": b} for s in study.schemes for b in study.budgets])
    # theory also reads the unit's data manifest, which must be the config's own (checked first)
    _unit_into(load_study(MINI), tmp_path / "c7run")
    data = {"c7": tmp_path / "c7run" / "results" / "data" / "gaussian" / "d16.json",
            "c8": tmp_path / "results" / "data" / "gaussian" / "d16.json"}
    for name, with_cells in (("c7", True), ("c7", False), ("c8", True), ("c8", False)):
        out = tmp_path / f"out-{name}-{with_cells}"
        common = ["--config", str(configs[name]), "--distribution", "gaussian", "--dim", "16",
                  *(["--cells", cells] if with_cells else [])]
        if stage == "stats":
            argv = ["stage", "stats", *common, "--per-query", *files, "--comparisons", str(out / "c.parquet"),
                    "--summary", str(out / "s.parquet"), "--trials", str(out / "t.parquet")]
        else:
            argv = ["stage", "theory", *common, "--data", str(data[name]), "--per-key", *files, "--out",
                    str(out / "theory.parquet")]
        code = main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        if name == "c8":
            assert code == 0, err
        else:
            assert code == 2 and "was made under another configuration" in err[-1] and "base_seed" in err[-1], err
            assert not out.exists() or not any(out.iterdir())
            # inside results/, the refused table went aside to be rebuilt: put it back for the next case
            for aside in (tmp_path / "results").rglob(".*.damaged"):
                aside.rename(aside.with_name(aside.name[1:-len(".damaged")]))


def _hand_run_configs(tmp_path: Path, config: dict[str, Any]) -> tuple[Any, dict[str, Path]]:
    """The study of ``config`` with its base seed + 1 (c8, the tables are made under it) and the
    YAML files of both: ``c7`` (``config``, the grid read) and ``c8``."""
    made = {**config, "base_seed": config["base_seed"] + 1}
    files = {}
    for name, data in (("c7", config), ("c8", made)):
        files[name] = tmp_path / f"{name}.yaml"
        files[name].write_text(yaml.safe_dump(json.loads(json.dumps(data))), encoding="utf-8")
    return load_study(made), files


def _check_hand_runs(tmp_path: Path, capsys, argv_of: Callable[[Path, Path], list[str]], refused: Path) -> None:
    """Run ``kvasym stage`` (``argv_of(config, out folder)``) by hand under c7 (the tables were made
    under c8): exit 2, one line naming ``refused`` and its base seed, no traceback, nothing
    written; then under c8: exit 0. A refused table inside results/ went aside: it is put back."""
    for name in ("c7", "c8"):
        out = tmp_path / f"out-{name}"
        code = main(argv_of(tmp_path / f"{name}.yaml", out))
        err = capsys.readouterr().err.strip()
        assert "Traceback" not in err, err
        lines = err.splitlines()
        if name == "c8":
            assert code == 0, lines
            continue
        assert code == 2 and lines[-1].startswith(f"kvasym: error: {refused}: was made under another configuration"), \
            lines
        assert "base_seed = 8" in lines[-1] and len([x for x in lines if "error" in x]) == 1, lines
        assert not out.exists() or not any(out.rglob("*.*")), sorted(out.rglob("*"))
        for aside in (tmp_path / "results").rglob(".*.damaged"):
            aside.rename(aside.with_name(aside.name[1:-len(".damaged")]))


def test_the_frontier_run_by_hand_from_config_checks_provenance_as_the_dag(tmp_path, capsys) -> None:
    """Issue 51, point 2: ``kvasym stage frontier`` took only ``--slice`` and checked provenance
    only with the DAG's ``--cells``; by hand with ``--config`` it now builds both as the rule does
    (Study.frontier_slice, each file's cell_table_slice digest) and refuses a per-query file of
    base seed 8 in a base-seed-7 config; the config the files were made under passes."""
    config = {**MINI, "base_seed": 7, "frontier": {"schemes": ["CRKV"], "distributions": ["gaussian"]}}
    study, _ = _hand_run_configs(tmp_path, config)
    folder = _unit_into(study, tmp_path)["per_query"]
    files = [folder / s / f"n{b}.parquet" for s in study.unit_schemes("gaussian") for b in study.budgets]

    def argv(config_file: Path, out: Path) -> list[str]:
        return ["stage", "frontier", "--config", str(config_file), "--per-query", *map(str, files),
                "--points", str(out / "points.parquet"), "--units", str(out / "units.parquet")]

    _check_hand_runs(tmp_path, capsys, argv, files[0])
    assert (tmp_path / "out-c8" / "points.parquet").is_file()


@pytest.mark.parametrize("table", ["comparisons", "display"])
def test_gather_run_by_hand_from_config_checks_provenance_as_the_dag(tmp_path, capsys, table) -> None:
    """Issue 51, point 2: ``kvasym stage gather`` checked a stats part's provenance only with the
    DAG's ``--comparisons-cells`` digests, and a display input's only with its ``--cell-digests``;
    by hand with ``--config`` it builds both (and the display slice) as the rule does, and
    refuses a part or per-query file of base seed 8 in a base-seed-7 config."""
    study, _ = _hand_run_configs(tmp_path, {**MINI, "base_seed": 7})
    folder = _unit_into(study, tmp_path)["per_query"]
    files = [folder / s / f"n{b}.parquet" for s in study.schemes for b in study.budgets]
    stats = {k: tmp_path / f"results/stats/{k}/gaussian/d16.parquet" for k in ("comparisons", "summary", "trials")}
    run_stats(study.stats_slice("gaussian", 16), files, stats["comparisons"], stats["summary"], stats["trials"])

    def argv(config_file: Path, out: Path) -> list[str]:
        inputs = (["--comparisons", str(stats["comparisons"]), "--out-comparisons", str(out / "c.parquet")]
                  if table == "comparisons" else
                  ["--display-per-query", *map(str, files), "--out-phi-summary", str(out / "phi.parquet")])
        return ["stage", "gather", "--config", str(config_file), *inputs]

    _check_hand_runs(tmp_path, capsys, argv, stats["comparisons"] if table == "comparisons" else files[0])


def test_the_figure_stage_run_by_hand_from_config_checks_provenance_as_the_dag(tmp_path, capsys) -> None:
    """Issue 51, point 2: ``kvasym stage figure`` took only ``--slice`` and checked a per-query
    file's provenance only with the DAG's ``--cell-digests``; by hand with ``--config`` it builds
    both as the rule does (figures_slice, cell_table_slice digests) and refuses a per-query file
    of base seed 8 in a base-seed-7 config; the config the files were made under passes."""
    study, _ = _hand_run_configs(tmp_path, {**MINI, "base_seed": 7})
    folder = _unit_into(study, tmp_path)["per_query"]
    files = [folder / s / f"n{b}.parquet" for s in study.schemes for b in study.budgets]
    stats = {k: tmp_path / f"elsewhere/{k}.parquet" for k in ("comparisons", "summary", "trials")}
    run_stats(study.stats_slice("gaussian", 16), files, stats["comparisons"], stats["summary"], stats["trials"])

    def argv(config_file: Path, out: Path) -> list[str]:
        return ["stage", "figure", "--config", str(config_file), "--family", "kl_ecdf", "--per-query",
                *map(str, files), "--summary", str(stats["summary"]), "--out-dir", str(out)]

    _check_hand_runs(tmp_path, capsys, argv, files[0])
    assert any((tmp_path / "out-c8").glob("*.pdf"))
