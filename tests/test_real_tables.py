"""Real keys beside synthetic ones: the real caches' statistics (kvasym.real.cachestats) and the
paper table ``table_real`` (kvasym.tables.real_context and its template).

Checked against numbers computed independently: the batched statistics equal
:func:`kvasym.cachestats.cache_statistics` applied to each (layer, head) slice by hand; the
medians and interquartile ranges equal numpy's; every cell of the rendered table holds the
formatted value of its own (distribution, budget, scheme, column), with the computed best in
bold. Also: the variant without real rows (install hint, no table), escaping, bad inputs, the
command line, and (with LaTeX installed) the paper compiling with the real table.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvasym.cli import main
from kvasym.display import median_iqr
from kvasym.render import format as fmt
from kvasym.stages.real_cachestats import run_real_cachestats
from kvasym.render import numbers, tables
from kvasym.cachestats import STATISTICS, TOP_CHANNELS, batched_cache_statistics, cache_statistics
from kvasym.errors import KvasymError
from kvasym.render.format import escape_latex
from kvasym.manifest import DATA_FORMAT, content_digest
from kvasym.manifest import write_manifest
from kvasym.real import INSTALL_COMMANDS, REAL_MODEL_NAME
from kvasym.real.cachestats import (
    COLUMNS,
    TENSORS,
    capture_statistics,
    captures_statistics,
)
from kvasym.real.capture import write_capture
from kvasym.study import load_study_file
from test_paper_sources import _claims_results, _latexmk, _need_latex, _paper_copy, make_summary
from test_real_evaluate import HKV, HQ, LAYERS, D, T, make_capture

ROOT = Path(__file__).resolve().parents[1]
SCHEMES = ["KV", "KQV", "QKQV", "RKV"]
BUDGETS = (2, 4)
HEADLINE = {"distribution": "gaussian", "dim": 128, "sharpness": 2.0, "budget": 4}
REAL = ("smollm2", "smollm2-prerope")
RESULT_COLUMNS = list(tables.REAL_RESULT_COLUMNS)

# --------------------------------------------------------------------------------------------
# the real caches' statistics
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(3, 40, 8), (2, 3, 6, 16), (5, 2, 4)])
def test_batched_statistics_equal_cache_statistics(shape):
    """Heavy tails, per-channel scales, a mean offset; rows > dim, rows < dim, rows = 2."""
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_t(1.5, size=shape) * rng.uniform(0.1, 10, size=shape[-1]) + rng.normal(size=shape[-1])
    batched = batched_cache_statistics(x)
    for index in np.ndindex(*shape[:-2]):
        expected = cache_statistics(x[index])
        for name in STATISTICS:
            assert batched[name][index] == pytest.approx(expected[name], rel=1e-11, abs=1e-13), (index, name)


def test_batched_statistics_of_degenerate_matrices():
    x = np.zeros((2, 5, 4))
    x[1] = 3.0  # a constant matrix: no spread, all energy in the mean
    out = batched_cache_statistics(x)
    for i in range(2):
        expected = cache_statistics(x[i])
        assert {k: float(out[k][i]) for k in STATISTICS} == pytest.approx(expected)
    assert out["mean_energy"][1] == pytest.approx(1.0) and out["participation_ratio"][1] == 0.0
    with pytest.raises(KvasymError, match="rows, dim"):
        batched_cache_statistics(np.ones(3))


def test_capture_statistics_equal_cache_statistics_of_each_slice():
    capture = make_capture(seed=2)
    cols = capture_statistics(capture, "bike")
    frame = pd.DataFrame(cols)
    assert list(frame.columns) == list(COLUMNS)
    heads = {"k_post_rope": HKV, "k_pre_rope": HKV, "v": HKV, "q_post_rope": HQ, "q_pre_rope": HQ}
    assert len(frame) == len(LAYERS) * sum(heads.values())
    assert list(dict.fromkeys(frame["tensor"])) == list(TENSORS)
    assert set(frame["text"]) == {"bike"} and set(frame["head_dim"]) == {D} and set(frame["n_rows"]) == {T}
    for tensor, n_heads in heads.items():
        array = getattr(capture, tensor)
        for li, layer in enumerate(LAYERS):
            for head in range(n_heads):
                row = frame[(frame["tensor"] == tensor) & (frame["layer"] == layer) & (frame["head"] == head)]
                assert len(row) == 1, (tensor, layer, head)
                expected = cache_statistics(array[li, head].astype(np.float64))
                for name in STATISTICS:
                    assert row[name].iloc[0] == pytest.approx(expected[name], rel=1e-11, abs=1e-13)
                # queries carry the KV head they read (grouped-query attention)
                kv = head // (HQ // HKV) if tensor.startswith("q_") else head
                assert row["kv_head"].iloc[0] == kv


def test_captures_to_parquet_and_command_line(tmp_path, capsys):
    paths = []
    for i, text in enumerate(("alpha", "beta")):
        capture = make_capture(seed=i)
        capture.metadata["name"] = text
        paths.append(write_capture(capture, tmp_path / f"{text}.npz"))
    out = tmp_path / "real" / "cachestats.parquet"
    assert main(["stage", "real_cachestats", "--captures", *map(str, paths), "--out", str(out)]) == 0
    assert str(out) in capsys.readouterr().out
    frame = pd.read_parquet(out)
    assert list(frame.columns) == list(COLUMNS)
    assert list(dict.fromkeys(frame["text"])) == ["alpha", "beta"]
    again = captures_statistics(paths)
    pd.testing.assert_frame_equal(frame, again)
    # the second text's values are those of its own capture
    beta = frame[(frame["text"] == "beta") & (frame["tensor"] == "v") & (frame["layer"] == LAYERS[1])
                 & (frame["head"] == 1)]
    expected = cache_statistics(make_capture(seed=1).v[1, 1].astype(np.float64))
    assert beta["tail_index"].iloc[0] == pytest.approx(expected["tail_index"], rel=1e-11)
    # the same text twice, a broken capture, nothing: errors naming the problem
    with pytest.raises(KvasymError, match="already read"):
        run_real_cachestats([paths[0], paths[0]], tmp_path / "x.parquet")
    broken = tmp_path / "broken.npz"
    broken.write_bytes(b"PK\x03\x04 not a zip")
    assert main(["stage", "real_cachestats", "--captures", str(broken), "--out", str(tmp_path / "y.parquet")]) == 2
    assert "broken.npz" in capsys.readouterr().err
    assert not (tmp_path / "y.parquet").exists()
    with pytest.raises(KvasymError, match="at least one capture"):
        captures_statistics([])


# --------------------------------------------------------------------------------------------
# the results part of table_real
# --------------------------------------------------------------------------------------------

# per (distribution, scheme, budget): a value per column, distinct everywhere so that a value in
# the wrong row or group cannot pass for the right one
_DIST_BASE = {"gaussian": 0.0011, "smollm2": 0.0023, "smollm2-prerope": 0.0037}
_SCHEME_FACTOR = {"KV": 7.0, "KQV": 1.0, "QKQV": 3.0, "RKV": 1.0}  # KQV and RKV tie on keys
_COLUMN_SHIFT = {"kl_mean": 1.0, "kl_p99": 11.0, "recall_top5_mean": None, "t_eps_dir_mean": 0.5}


def expected_value(dist: str, scheme: str, budget: int, column: str) -> float:
    if column == "recall_top5_mean":
        return {"KV": 0.61, "KQV": 0.83, "QKQV": 0.72, "RKV": 0.83}[scheme] - 0.01 * budget - 0.1 * REAL.count(dist)
    if column == "t_eps_dir_mean":
        # RKV's output error is the lowest (its values keep all n bits)
        return _DIST_BASE[dist] * {"KV": 9.0, "KQV": 2.0, "QKQV": 5.0, "RKV": 1.5}[scheme] / budget
    return _DIST_BASE[dist] * _SCHEME_FACTOR[scheme] * _COLUMN_SHIFT[column] / budget


def real_summary(headline_name: str = "gaussian", schemes=SCHEMES, drop=None) -> pd.DataFrame:
    """A gathered summary: the headline distribution at its dim and sharpness (plus rows at other
    sharpness values and a second synthetic distribution that must not show), and the two real
    distributions at d = 64, sharpness 1."""
    def value(dist, scheme, budget, column):
        if column in RESULT_COLUMNS and dist in _DIST_BASE and scheme in _SCHEME_FACTOR:
            return expected_value(dist, scheme, budget, column)
        return None

    def renamed(frame, old, new):
        frame = frame.copy()
        frame["distribution"] = frame["distribution"].replace({old: new})
        return frame

    synthetic = make_summary(["gaussian", "t3"], list(schemes), budgets=BUDGETS, dim=128, sharpness=(1.0, 2.0),
                             value=value)
    synthetic.loc[synthetic["sharpness"] == 1.0, "kl_mean"] = 777.0  # not the headline sharpness
    synthetic = renamed(synthetic, "gaussian", headline_name)
    real = make_summary(list(REAL), list(schemes), budgets=BUDGETS, dim=64, sharpness=(1.0,), value=value)
    real["kind"] = "smollm2"
    real["n_trials"] = 6
    real["n_queries"] = 6 * 3 * 48
    frame = pd.concat([synthetic, real], ignore_index=True)
    if drop is not None:
        frame = frame[~drop(frame)].reset_index(drop=True)
    return frame


def data_rows(text: str, n_cells: int) -> dict[tuple[str, str], list[str]]:
    """(budget, scheme) -> cells of the first longtable's data rows (budget carried down)."""
    body = text.split("\\endlastfoot", 1)[1].split("\\end{longtable}", 1)[0]
    out, budget = {}, None
    for line in body.splitlines():
        cells = [c.strip() for c in line.rstrip().removesuffix("\\\\").split(" & ")]
        if len(cells) == n_cells:
            budget = cells[0] or budget
            out[(budget, cells[1])] = cells
    return out


def test_results_cells_hold_their_own_values_and_bold_the_best():
    frame = real_summary()
    text = tables.table_texts({"summary": frame}, HEADLINE, ["table_real"])["table_real"]
    groups = ["gaussian", *REAL]
    rows = data_rows(text, 2 + 4 * len(groups))
    assert set(rows) == {(str(b), s) for b in BUDGETS for s in SCHEMES}
    for budget in BUDGETS:
        for scheme in SCHEMES:
            cells = rows[(str(budget), scheme)]
            for g, dist in enumerate(groups):
                for c, column in enumerate(RESULT_COLUMNS):
                    cell = cells[2 + 4 * g + c]
                    value = expected_value(dist, scheme, budget, column)
                    better = tables.REAL_RESULT_COLUMNS[column]
                    values = [expected_value(dist, s, budget, column) for s in SCHEMES]
                    best = min(values) if better == "lower" else max(values)
                    plain = fmt.sig(value)
                    assert cell == (f"$\\mathbf{{{plain}}}$" if value == best else f"${plain}$"), \
                        (budget, scheme, dist, column, cell)
    # spot checks against strings typed by hand
    assert rows[("4", "QKQV")][2] == "$8.25\\times10^{-4}$"  # gaussian mean KL: 0.0011 * 3 / 4
    assert rows[("2", "KQV")][2 + 4] == "$\\mathbf{0.00115}$"  # smollm2 mean KL: 0.0023 / 2, tied with RKV
    assert rows[("2", "RKV")][2 + 4] == "$\\mathbf{0.00115}$"
    assert rows[("4", "RKV")][2 + 8 + 3] == "$\\mathbf{0.00139}$"  # smollm2-prerope eps_T: 0.0037 * 1.5 / 4
    assert "777" not in text  # the other sharpness of the headline distribution
    assert "t3" not in text  # another synthetic distribution
    # the caption: both dims and both sharpness values, the real cells' sizes
    assert "$d = 128$ vs $d = 64$" in text and "($2$ vs $1$)" in text
    assert "6 caches (text, layer, KV head) and 864 queries" in text
    assert "\\label{tab:real}" in text and "\\kvfigure{real_kl_heatmap}" in text
    assert "at the headline budget $n = 4$" in text


def test_missing_cells_print_a_dash_and_never_bold():
    drop = lambda f: (f["distribution"] == "smollm2-prerope") & (f["scheme"] == "KV") & (f["budget"] == 2)  # noqa: E731
    frame = real_summary(drop=drop)
    text = tables.table_texts({"summary": frame}, HEADLINE, ["table_real"])["table_real"]
    rows = data_rows(text, 14)
    assert rows[("2", "KV")][10:14] == ["--"] * 4
    assert rows[("4", "KV")][10] == f"${fmt.sig(expected_value('smollm2-prerope', 'KV', 4, 'kl_mean'))}$"


def test_only_the_post_rope_rows():
    frame = real_summary(drop=lambda f: f["distribution"] == "smollm2-prerope")
    text = tables.table_texts({"summary": frame}, HEADLINE, ["table_real"])["table_real"]
    assert "smollm2-prerope" not in text
    assert len(next(iter(data_rows(text, 10).values()))) == 10


def test_same_dim_and_sharpness_says_nothing_about_differences():
    frame = real_summary()
    frame = frame[frame["distribution"] != "gaussian"]
    extra = frame[frame["distribution"] == "smollm2"].assign(distribution="gaussian", kind="gaussian")
    text = tables.table_texts({"summary": pd.concat([frame, extra])},
                              {"distribution": "gaussian", "dim": 64, "sharpness": 1.0, "budget": 4},
                              ["table_real"])["table_real"]
    assert "differ" not in text


def test_without_real_rows_a_paragraph_with_the_install_command_and_no_table():
    frame = real_summary()
    frame = frame[~frame["distribution"].isin(REAL)]
    text = tables.table_texts({"summary": frame}, HEADLINE, ["table_real"])["table_real"]
    assert "not evaluated" in text and escape_latex(INSTALL_COMMANDS) in text
    assert "\\&\\&" in text  # the shell's && is escaped
    assert "tabular" not in text and "longtable" not in text and "\\kvfigure" not in text
    assert "\\label{tab:real}" in text  # the prose's reference still resolves
    # cache statistics given without real rows change nothing
    stats = pd.DataFrame(capture_statistics(make_capture(), "t"))
    assert tables.table_texts({"summary": frame, "real_cachestats": stats}, HEADLINE,
                              ["table_real"])["table_real"] == text


def test_names_are_escaped():
    hostile = "R&D_50%#1"
    frame = real_summary(headline_name=hostile, schemes=["KV", "K~Q^V", "{x}"])
    text = tables.table_texts({"summary": frame}, {**HEADLINE, "distribution": hostile}, ["table_real"])["table_real"]
    for name in (hostile, "K~Q^V", "{x}"):
        assert escape_latex(name) in text
        assert name not in text.replace(escape_latex(name), "\0"), name
    assert r"\texttt{R\&D\_50\%\#1}" in text


def test_headline_or_real_sharpness_absent_raises():
    frame = real_summary()
    with pytest.raises(KvasymError, match="no rows at the headline"):
        tables.table_texts({"summary": frame}, {**HEADLINE, "sharpness": 8.0}, ["table_real"])
    frame.loc[frame["distribution"].isin(REAL), "sharpness"] = 4.0
    with pytest.raises(KvasymError, match="sharpness 1"):
        tables.table_texts({"summary": frame}, HEADLINE, ["table_real"])
    with pytest.raises(KvasymError, match=r"lacks column\(s\) \['kl_p99'\]"):
        tables.table_texts({"summary": real_summary().drop(columns="kl_p99")}, HEADLINE, ["table_real"])


# --------------------------------------------------------------------------------------------
# the cache-statistics part: medians and interquartile ranges
# --------------------------------------------------------------------------------------------


def test_median_iqr_against_numpy():
    rng = np.random.default_rng(5)
    for n in (1, 2, 7, 100):
        x = rng.standard_t(2, size=n)
        median, iqr = median_iqr(x)
        assert median == pytest.approx(np.median(x), rel=1e-14, abs=1e-15)
        assert iqr == pytest.approx(np.percentile(x, 75) - np.percentile(x, 25), rel=1e-14, abs=1e-15)
    assert median_iqr([1.0, np.nan, 3.0, np.inf]) == (2.0, 1.0)  # non-finite values left out
    assert all(math.isnan(v) for v in median_iqr([np.nan]))
    assert fmt.mediqr(113.71, 0.1181) == "$114$ {\\scriptsize($0.118$)}"
    assert fmt.mediqr(0.5, math.nan) == "$0.500$" and fmt.mediqr(math.nan, 1.0) == "--"


def _manifests(tmp_path: Path) -> list[Path]:
    """Data manifests written by the data stage itself (tiny grid, two distributions, and one at
    another dim that must be left out)."""
    study = load_study_file(ROOT / "config" / "test.yaml")
    paths = []
    for dist, dim in (("gaussian", 64), ("lowrank4", 64)):
        path = tmp_path / "data" / dist / f"d{dim}.json"
        write_manifest(study.data_slice(dist, dim), path)
        paths.append(path)
    other = json.loads(paths[0].read_text())
    other["slice"]["dim"] = 32
    other["content_sha256"] = content_digest(other)  # a valid manifest of another dim
    (tmp_path / "data" / "gaussian" / "d32.json").write_text(json.dumps(other))
    return [*paths, tmp_path / "data" / "gaussian" / "d32.json"]


def _stamped(manifest: dict) -> str:
    """A hand-written manifest with the current format and its content digest (what the data
    stage writes), so that the checks after the digest are the ones exercised."""
    manifest = {**manifest, "format": DATA_FORMAT}
    return json.dumps({**manifest, "content_sha256": content_digest(manifest)})


def stats_rows(text: str) -> dict[tuple[str, str], list[str]]:
    """(source, tensor) -> cells of the cache-statistics table (source carried down)."""
    body = text.split("\\label{tab:real_stats}", 1)[1].split("\\endlastfoot", 1)[1].split("\\end{longtable}", 1)[0]
    out, source = {}, None
    for line in body.splitlines():
        cells = [c.strip() for c in line.rstrip().removesuffix("\\\\").split(" & ")]
        if len(cells) == 10:
            source = cells[0] or source
            out[(source, cells[1])] = cells
    return out


def _expected_cells(values: np.ndarray, dims: np.ndarray | float, stat: str) -> str:
    if stat == "pr_fraction":
        values = values / dims
    q25, q50, q75 = np.percentile(values, [25, 50, 75])
    return fmt.mediqr(q50, q75 - q25)


def test_statistics_rows_are_medians_and_iqrs_of_their_own_matrices(tmp_path):
    summary = real_summary()
    manifest_paths = _manifests(tmp_path)
    capture_paths = []
    for i, text in enumerate(("alpha", "beta")):
        capture = make_capture(seed=10 + i)
        capture.metadata["name"] = text
        capture_paths.append(write_capture(capture, tmp_path / f"{text}.npz"))
    cachestats = run_real_cachestats(capture_paths, tmp_path / "cachestats.parquet")
    # the manifests are the tiny grid's (d = 64): the headline moves there
    headline = {"distribution": "gaussian", "dim": 64, "sharpness": 2.0, "budget": 4}
    summary.loc[summary["distribution"] == "gaussian", "dim"] = 64
    summary_path = tmp_path / "summary.parquet"
    summary.to_parquet(summary_path)
    [path] = tables.render_tables({"summary": summary_path, "real_cachestats": cachestats,
                                   "data_manifests": manifest_paths}, headline, tmp_path / "out", ["table_real"])
    text = path.read_text(encoding="utf-8")
    rows = stats_rows(text)
    synthetic = [("\\texttt{gaussian}", "K"), ("\\texttt{gaussian}", "V"), ("\\texttt{lowrank4}", "K"),
                 ("\\texttt{lowrank4}", "V")]
    real = [(f"\\texttt{{{REAL_MODEL_NAME}}}", label) for label in
            ("K after RoPE", "K before RoPE", "V", "Q after RoPE", "Q before RoPE")]
    queries = [("\\texttt{gaussian}", "Q"), ("\\texttt{lowrank4}", "Q")]
    assert list(rows) == [synthetic[0], synthetic[1], queries[0], synthetic[2], synthetic[3], queries[1]] + real
    # the queries' alignment: per trial from the manifests (gaussian about 1, lowrank4 d/r = 16)
    for (source, label) in queries:
        dist = source[len("\\texttt{"):-1]
        manifest = json.loads((tmp_path / "data" / dist / "d64.json").read_text())
        values = np.array([t["queries"]["alignment"] for t in manifest["trials"]])
        assert rows[(source, label)][9] == _expected_cells(values, 64.0, "alignment")
        assert rows[(source, label)][4] == "--"
        assert abs(np.median(values) - {"gaussian": 1.0, "lowrank4": 16.0}[dist]) < 0.25 * {"gaussian": 1.0,
                                                                                             "lowrank4": 16.0}[dist]
    for (source, label) in synthetic:
        assert rows[(source, label)][9] == "--"
    columns = ["tail_index", "participation_ratio", "pr_fraction", "top_channel_energy", "mean_energy"]
    # synthetic: per trial, from the manifests as the data stage wrote them (d = 32 left out)
    for (source, label) in synthetic:
        dist = source[len("\\texttt{"):-1]
        manifest = json.loads((tmp_path / "data" / dist / "d64.json").read_text())
        side = {"K": "keys", "V": "values"}[label]
        cells = rows[(source, label)]
        assert cells[2:4] == ["64", str(len(manifest["trials"]))]
        for c, stat in enumerate(columns):
            values = np.array([t[side]["participation_ratio" if stat == "pr_fraction" else stat]
                               for t in manifest["trials"]])
            assert cells[4 + c] == _expected_cells(values, 64.0, stat), (dist, label, stat)
    # real: per (text, layer, head), recomputed from the captures by hand
    arrays = {"K after RoPE": "k_post_rope", "K before RoPE": "k_pre_rope", "V": "v", "Q after RoPE": "q_post_rope",
              "Q before RoPE": "q_pre_rope"}
    for (source, label) in real:
        per_matrix = [cache_statistics(m.astype(np.float64))
                      for i in range(2) for layer in getattr(make_capture(seed=10 + i), arrays[label]) for m in layer]
        cells = rows[(source, label)]
        assert cells[2:4] == [str(D), str(len(per_matrix))]
        for c, stat in enumerate(columns):
            values = np.array([s["participation_ratio" if stat == "pr_fraction" else stat] for s in per_matrix])
            assert cells[4 + c] == _expected_cells(values, float(D), stat), (label, stat)
        if label.startswith("Q"):
            # the alignment of each query head with its KV head's keys, by a direct covariance
            keys_of = {"Q after RoPE": "k_post_rope", "Q before RoPE": "k_pre_rope"}[label]
            means = []
            for i in range(2):
                capture = make_capture(seed=10 + i)
                for layer, k_layer in zip(getattr(capture, arrays[label]), getattr(capture, keys_of)):
                    for head, q in enumerate(layer):
                        k = k_layer[capture.kv_head_of_query_head[head]].astype(np.float64)
                        cov = np.cov(k, rowvar=False, ddof=0)
                        q = q.astype(np.float64)
                        a = np.einsum("td,de,te->t", q, cov, q) / (np.sum(q * q, axis=1) * np.trace(cov) / D)
                        means.append(np.mean(a))
            assert cells[9] == _expected_cells(np.array(means), float(D), "alignment"), label
        else:
            assert cells[9] == "--", label
    assert f"top-{TOP_CHANNELS} energy" in text
    assert "(2 texts, 2 layers)" in text and "at $d = 64$ (3 trials)" in text


def test_statistics_without_manifests_show_the_real_rows_only(tmp_path):
    stats = pd.DataFrame(capture_statistics(make_capture(), "only"))
    text = tables.table_texts({"summary": real_summary(), "real_cachestats": stats}, HEADLINE,
                              ["table_real"])["table_real"]
    rows = stats_rows(text)
    assert [tensor for _, tensor in rows] == ["K after RoPE", "K before RoPE", "V", "Q after RoPE", "Q before RoPE"]
    assert "Synthetic distributions" not in text and "(1 text, 2 layers)" in text


# --------------------------------------------------------------------------------------------
# bad inputs name the file or the column
# --------------------------------------------------------------------------------------------


def test_bad_inputs_name_the_file_or_column(tmp_path):
    summary_path = tmp_path / "summary.parquet"
    real_summary().to_parquet(summary_path)
    stats = pd.DataFrame(capture_statistics(make_capture(), "t"))
    missing_column = tmp_path / "no_tail_index.parquet"
    stats.drop(columns="tail_index").to_parquet(missing_column)
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"not parquet at all")
    out = tmp_path / "out"

    def render(**extra):
        return tables.render_tables({"summary": summary_path, **extra}, HEADLINE, out, ["table_real"])

    with pytest.raises(KvasymError, match=r"no_tail_index\.parquet.*\['tail_index'\]"):
        render(real_cachestats=missing_column)
    with pytest.raises(KvasymError, match=r"garbage\.parquet: not a readable Parquet"):
        render(real_cachestats=garbage)
    with pytest.raises(KvasymError, match=r"nope\.parquet: no such file"):
        render(real_cachestats=tmp_path / "nope.parquet")
    with pytest.raises(KvasymError, match=r"absent\.json: no such file"):
        render(data_manifests=[tmp_path / "absent.json"])
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{ not json")
    with pytest.raises(KvasymError, match=r"bad\.json: unreadable data manifest"):
        render(data_manifests=[bad_json])
    no_stats = tmp_path / "old.json"
    no_stats.write_text(_stamped({"slice": {"distribution": {"name": "g", "kind": "gaussian"}, "dim": 128},
                                    "trials": [{"trial": 0, "sha256": "x"}]}))
    with pytest.raises(KvasymError, match=r"old\.json: trial 0 has no 'keys' statistics"):
        render(data_manifests=[no_stats])
    partial = tmp_path / "partial.json"
    partial.write_text(_stamped({"slice": {"distribution": {"name": "g", "kind": "gaussian"}, "dim": 128},
                                   "trials": [{"keys": {"tail_index": 0.1}, "values": {}}]}))
    with pytest.raises(KvasymError, match=r"partial\.json: trial 0 'keys' statistics lack \['participation_ratio'"):
        render(data_manifests=[partial])
    not_manifest = tmp_path / "list.json"
    not_manifest.write_text("[1, 2]")
    with pytest.raises(KvasymError, match=r"list\.json: unreadable data manifest"):
        render(data_manifests=[not_manifest])
    other_dim = tmp_path / "d64.json"
    other_dim.write_text(_stamped({"slice": {"distribution": {"name": "g", "kind": "gaussian"}, "dim": 64},
                                     "trials": [{"keys": dict.fromkeys(STATISTICS, 1.0),
                                                 "values": dict.fromkeys(STATISTICS, 1.0)}]}))
    with pytest.raises(KvasymError, match=r"no data manifest at the headline dim 128 \(have dims \[64\]\)"):
        render(data_manifests=[other_dim])
    assert not out.exists() or not list(out.iterdir())  # nothing half-written


def test_command_line_flags(tmp_path, capsys):
    summary_path = tmp_path / "summary.parquet"
    real_summary().to_parquet(summary_path)
    stats_path = tmp_path / "cachestats.parquet"
    pd.DataFrame(capture_statistics(make_capture(), "t")).to_parquet(stats_path)
    args = ["tables", "--summary", str(summary_path), "--headline", json.dumps(HEADLINE), "--out-dir",
            str(tmp_path / "out"), "--table", "table_real"]
    assert main(['stage', *args, "--real-cachestats", str(stats_path)]) == 0
    text = (tmp_path / "out" / "table_real.tex").read_text(encoding="utf-8")
    assert "\\label{tab:real_stats}" in text and "\\label{tab:real}" in text
    assert main(['stage', *args, "--real-cachestats", str(tmp_path / "nope.parquet")]) == 2
    assert "nope.parquet: no such file" in capsys.readouterr().err
    assert main(['stage', *args, "--data-manifests", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 2
    assert "a.json: no such file" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# the paper compiles with the real table (when a TeX installation is there)
# --------------------------------------------------------------------------------------------


def test_paper_compiles_with_the_real_table(tmp_path):
    _need_latex()
    from kvasym.claims import load_claims
    from kvasym.render.claims import render_latex

    study = load_study_file(ROOT / "config" / "config.yaml")
    claims = load_claims(ROOT / study.claims_file, study.headline)
    headline = study.headline
    paper = _paper_copy(tmp_path)
    generated = paper / "generated"
    (generated / "claims.tex").write_text(render_latex(_claims_results(claims)), encoding="utf-8")
    numbers.render_numbers(numbers.numbers_slice(study, headline, claims, commit="c0ffee"), generated)
    summary = real_summary()
    stats = pd.DataFrame(capture_statistics(make_capture(), "t"))
    manifests = pd.concat([tables.manifest_statistics(json.loads(p.read_text()), str(p))
                           for p in _manifests(tmp_path / "m")[:2]], ignore_index=True)
    manifests["dim"] = headline["dim"]
    text = tables.table_texts({"summary": summary, "real_cachestats": stats, "data_manifests": manifests},
                              headline, ["table_real"])["table_real"]
    (generated / "table_real.tex").write_text(text, encoding="utf-8")
    # the prose references the end-to-end floats by number: their table (here its no-passes form)
    e2e = tables.table_texts({"summary": summary}, headline,
                             ["table_e2e", "table_model", "table_bands", "table_card", "table_models",
                              "table_greedy", "table_practice", "table_frontier"])
    (generated / "table_e2e.tex").write_text(e2e["table_e2e"], encoding="utf-8")
    (generated / "table_practice.tex").write_text(e2e["table_practice"], encoding="utf-8")
    (generated / "table_models.tex").write_text(e2e["table_models"], encoding="utf-8")
    (generated / "table_model.tex").write_text(e2e["table_model"], encoding="utf-8")
    (generated / "table_bands.tex").write_text(e2e["table_bands"], encoding="utf-8")
    (generated / "table_greedy.tex").write_text(e2e["table_greedy"], encoding="utf-8")
    (generated / "table_card.tex").write_text(e2e["table_card"], encoding="utf-8")
    # the frontier's prose names its side-information table: the no-frontier form labels it too
    (generated / "table_frontier.tex").write_text(e2e["table_frontier"], encoding="utf-8")
    pdf_text = _latexmk(paper)
    assert "8.25 × 10" in pdf_text  # a cell of the real table, typeset
    assert "K before RoPE" in pdf_text and "smollm2-prerope" in pdf_text
    assert "real_kl_heatmap has not" in pdf_text  # no figure file in this test: the placeholder
    assert "??" not in pdf_text  # tab:real and tab:real_stats resolve
    log = (paper / "build" / "main.log").read_text(errors="replace")
    overfull = re.findall(r"Overfull \\hbox \((\d+\.\d+)pt too wide\) in alignment", log)
    assert not [w for w in overfull if float(w) > 1.0], overfull
