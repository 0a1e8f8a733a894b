"""The figures: every function on small synthetic tables (the real tables' columns), fixed
scheme colours, atomic saving, hostile names, empty selections, and the figures stage."""

from __future__ import annotations

import io
import itertools
import json
import math
import os
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest

from cell_files import FLOAT32_RTOL
from kvasym.errors import KvasymError
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure

from kvasym.render.figures import _style as style
from kvasym.render.figures import files as figfiles
from kvasym.display import density_levels, jensen_bins_table, shannon_phi_summary
from kvasym.render.figures.budget_crossover import budget_crossover
from kvasym.render.figures.jensen_bias import jensen_bias as draw_jensen_bias
from kvasym.render.figures.kl_ecdf import KL_FLOOR
from kvasym.render.figures.kl_ecdf import kl_ecdf as draw_kl_ecdf
from kvasym.render.figures.marginals import marginals
from kvasym.render.figures.query_model import query_model_sweep
from kvasym.render.figures.rank_sweep import rank_sweep
from kvasym.render.figures.real_heatmap import real_kl_heatmap, real_rows_heatmap
from kvasym.render.figures.shannon_phi import shannon_phi_plane as draw_shannon_phi_plane
from kvasym.render.figures.sharpness_sweep import sharpness_sweep
from kvasym.render.figures.tail_sweep import tail_sweep
from kvasym.render.figures.theory_check import theory_check
from kvasym.dataset import PER_KEY_SCHEMA, PER_QUERY_COLUMNS

ROOT = Path(__file__).resolve().parents[1]
SCHEMES = ("KV", "KQV", "QKQV", "RKV")
KINDS = {"gaussian": "gaussian", "t1.05": "student_t", "t3": "student_t", "lowrank4": "low_rank",
         "lowrank16": "low_rank"}
QUALITY = {"KV": 1.0, "KQV": 0.5, "QKQV": 1.5, "RKV": 0.6}  # larger: worse (synthetic)


def _kind(name: str) -> str:
    return KINDS.get(name, "gaussian")


def make_per_query(distributions=("gaussian", "t1.05", "lowrank4"), dims=(64,), schemes=SCHEMES, budgets=(2, 4),
                   sharpness=(1.0, 4.0), trials=2, queries=12, seed=0) -> pd.DataFrame:
    gen = np.random.default_rng(seed)
    rows = []
    for dist, dim, scheme, budget, s, trial in itertools.product(distributions, dims, schemes, budgets, sharpness,
                                                                 range(trials)):
        scale = QUALITY.get(scheme, 1.2) * 2.0 ** (-budget) * s
        cache = {f"{site}_{name}": value for site in ("k", "v") for name, value in (
            ("snr_db", 6.0 * budget + gen.normal()), ("eff_bits", budget + gen.normal(0, 0.1)),
            ("phi", 0.6 * scale + abs(gen.normal(0, 0.02))), ("eps_dir", 0.1 * scale))}
        for q in range(queries):
            phi_t = abs(gen.normal(0.8 * scale, 0.1))
            rows.append({
                "distribution": dist, "kind": _kind(dist), "dim": dim, "scheme": scheme, "budget": budget,
                "sharpness": s, "trial": trial, "query": q,
                "kl": float(gen.lognormal(np.log(0.05 * scale), 1.0)) if q else 0.0,
                "recall_top5": float(gen.integers(0, 6) / 5), **cache,
                "tv": min(1.0, 0.3 * scale), "js": min(math.log(2), 0.05 * scale), "top1": float(q % 3 > 0),
                "catastrophic": float(q % 3 == 0 and 0.3 * scale > 0.5),
                "t_snr_db": 5.0 * budget - 10 * phi_t, "t_eff_bits": budget - 2 * phi_t, "t_phi": phi_t,
                "t_eps_dir": 1 - np.cos(phi_t), "k_bits_payload": float(budget), "k_bits_side": 0.5,
                "v_bits_payload": float(budget), "v_bits_side": 0.5, "k_bits_side16": 0.25, "v_bits_side16": 0.25,
            })
    frame = pd.DataFrame(rows)
    return frame[list(PER_QUERY_COLUMNS)]


def make_summary(per_query: pd.DataFrame) -> pd.DataFrame:
    cell = ["distribution", "kind", "dim", "budget", "sharpness", "scheme"]
    g = per_query.groupby(cell, sort=True)
    out = g.agg(kl_mean=("kl", "mean"), kl_median=("kl", "median"), kl_max=("kl", "max"),
                recall_mean=("recall_top5", "mean"), k_eps_dir_mean=("k_eps_dir", "mean"),
                t_eps_dir_mean=("t_eps_dir", "mean"), v_eps_dir_mean=("v_eps_dir", "mean"))
    out["kl_p99"] = g["kl"].quantile(0.99)
    return out.reset_index()


def make_comparisons(summary: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (dist, kind, dim, budget, s), g in summary.groupby(["distribution", "kind", "dim", "budget", "sharpness"]):
        by = g.set_index("scheme")["kl_mean"]
        for a, b in itertools.combinations(list(by.index), 2):
            r = by[a] / by[b]
            rows.append({"distribution": dist, "kind": kind, "dim": dim, "budget": budget, "sharpness": s,
                         "scheme_a": a, "scheme_b": b, "metric": "kl", "ratio_mean": r,
                         "ratio_mean_low": 0.8 * r, "ratio_mean_high": 1.2 * r})
    return pd.DataFrame(rows)


def make_theory(distributions=("gaussian", "t1.05", "lowrank4"), dims=(64,), budgets=(2, 4), schemes=SCHEMES,
                sharpness=(1.0, 4.0)) -> pd.DataFrame:
    rows = []
    for dist, dim in itertools.product(distributions, dims):
        base = {"distribution": dist, "kind": _kind(dist), "dim": dim}
        for budget in budgets:
            for check, value in (("qjl_vs_residual", np.pi / 2 - 1 / dim), ("qjl_vs_nbit", 1.5 * budget)):
                rows.append({**base, "check": check, "scheme": "", "budget": budget, "sharpness": np.nan,
                             "estimate": value * 1.01, "low": value * 0.97, "high": value * 1.05, "theory": value,
                             "statistic": np.nan, "p": np.nan, "n": 3.0})
        rows.append({**base, "check": "ks_beta", "scheme": "", "budget": -1, "sharpness": np.nan, "estimate": 0.03,
                     "low": np.nan, "high": np.nan, "theory": np.nan, "statistic": 0.03, "p": 0.5, "n": 100.0})
        for scheme, budget, s in itertools.product(schemes, budgets, sharpness):
            rows.append({**base, "check": "jensen_slope", "scheme": scheme, "budget": budget, "sharpness": s,
                         "estimate": 0.1, "low": 0.05, "high": 0.15, "theory": np.nan, "statistic": 0.2, "p": np.nan,
                         "n": 64.0})
    return pd.DataFrame(rows)


def make_per_key(distributions=("gaussian", "t1.05", "lowrank4"), dims=(64,), schemes=SCHEMES, budgets=(2, 4),
                 sharpness=(1.0, 4.0), keys=64, seed=1) -> pd.DataFrame:
    gen = np.random.default_rng(seed)
    parts = []
    for dist, dim, scheme, budget, s in itertools.product(distributions, dims, schemes, budgets, sharpness):
        var = gen.lognormal(np.log(0.01 * QUALITY.get(scheme, 1.0)), 1.0, keys)
        ref = gen.dirichlet(np.ones(keys))
        hat = ref * np.exp(0.5 * var + gen.normal(0, 0.01, keys))
        parts.append(pd.DataFrame({
            "distribution": dist, "kind": _kind(dist), "dim": dim, "scheme": scheme, "budget": budget, "sharpness": s,
            "trial": 0, "key": np.arange(keys), "n_queries": 16, "logit_err_mean": gen.normal(0, 0.01, keys),
            "logit_err_var": var, "weight_ref_mean": ref, "weight_hat_mean": hat / hat.sum(),
            "log_weight_excess": np.log(hat / ref), "k_eps_dir": 0.01, "k_snr_db": 20.0,
            "key_norm": gen.chisquare(dim, keys) ** 0.5,
        }))
    return pd.concat(parts, ignore_index=True)[PER_KEY_SCHEMA.names]


def make_samples(names=("gaussian", "t1.05", "lowrank4"), dim=64, n=300, seed=2):
    gen = np.random.default_rng(seed)
    out = {}
    for name in names:
        x = gen.standard_normal((n, dim))
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        out[name] = (x[:, 0], dim)
    return out


# The figures draw the display numbers stage gather writes (kvasym.display; issue 30: rendering
# never recomputes): these wrappers compute them from the test's rows as the stage does, then draw.


def shannon_phi_plane(per_query, site, *, density_points=None, **kw):
    has = not per_query.empty and "k_phi" in per_query.columns
    summary, density = (shannon_phi_summary(per_query, **({} if density_points is None else
                                                           {"density_points": density_points}))
                        if has else (pd.DataFrame(), pd.DataFrame()))
    return draw_shannon_phi_plane(per_query, site, summary=summary, density=density, **kw)


def kl_ecdf(per_query, **kw):
    summary = make_summary(per_query) if not per_query.empty and "kl" in per_query.columns else pd.DataFrame()
    return draw_kl_ecdf(per_query, summary=summary, **kw)


def jensen_bias(per_key, *, n_bins=20, **kw):
    has = "logit_err_var" in per_key.columns
    return draw_jensen_bias(jensen_bins_table(per_key, n_bins) if has else pd.DataFrame(), **kw)


@pytest.fixture(scope="module")
def tables():
    pq = make_per_query(distributions=("gaussian", "t1.05", "t3", "lowrank4", "lowrank16"))
    summary = make_summary(pq)
    return {"per_query": pq, "summary": summary, "comparisons": make_comparisons(summary),
            "theory": make_theory(), "per_key": make_per_key()}


FACETS = ["gaussian", "t1.05", "lowrank4"]
NU = {"t1.05": 1.05, "t3": 3.0}
RANK = {"lowrank4": 4, "lowrank16": 16}


def draw_all(t, colors=None):
    """(name, figure, expected number of axes) for every figure function."""
    return [
        ("shannon_k", shannon_phi_plane(t["per_query"], "k", sharpness=1.0, dim=64, distributions=FACETS,
                                           colors=colors), 6),
        ("shannon_t", shannon_phi_plane(t["per_query"], "t", sharpness=1.0, dim=64, distributions=FACETS,
                                           colors=colors), 6),
        ("kl_ecdf", kl_ecdf(t["per_query"], sharpness=4.0, dim=64, distributions=FACETS, colors=colors), 6),
        ("budget_crossover", budget_crossover(t["summary"], distribution="gaussian", dim=64, sharpness=1.0,
                                                 colors=colors), 2),
        ("tail_sweep", tail_sweep(t["summary"], NU, dim=64, budget=4, sharpness=1.0, colors=colors), 2),
        ("rank_sweep", rank_sweep(t["summary"], RANK, ["t1.05", "t3"], budget=4, sharpness=1.0, colors=colors), 1),
        ("sharpness_sweep", sharpness_sweep(t["summary"], dim=64, budget=4, distributions=FACETS,
                                               comparisons=t["comparisons"], colors=colors), 6),
        ("theory_check", theory_check(t["theory"], dim=64), 3),
        ("marginals", marginals(make_samples()), 4),
        ("jensen_bias", jensen_bias(t["per_key"], budget=4, sharpness=1.0, dim=64, distributions=FACETS,
                                       slopes=t["theory"], colors=colors), 4),  # 2 x 2, one panel off
    ]


def title_of(fig: Figure) -> str:
    return fig._suptitle.get_text().replace("\n", " ") if fig._suptitle is not None else ""


def scheme_artist_colors(fig: Figure) -> dict[str, set[tuple]]:
    """Scheme -> the set of RGB colours of the artists tagged with it."""
    out: dict[str, set[tuple]] = {}
    for ax in fig.axes:
        for artist in [*ax.lines, *ax.collections]:
            gid = artist.get_gid()
            if not gid or not gid.startswith("scheme="):
                continue
            if hasattr(artist, "get_color") and not hasattr(artist, "get_facecolor"):
                rgba = [to_rgba(artist.get_color())]
            else:
                faces = artist.get_facecolor()
                rgba = [tuple(c) for c in (faces if len(faces) else artist.get_edgecolor())]
            out.setdefault(gid.removeprefix("scheme="), set()).update(tuple(np.round(c[:3], 4)) for c in rgba)
    return out


def test_every_figure_has_the_expected_axes(tables):
    for name, fig, n_axes in draw_all(tables):
        assert isinstance(fig, Figure), name
        assert len(fig.axes) == n_axes, name
        assert "nothing to show" not in title_of(fig), name
        # every figure spans the text width and is included at its natural size (issue 15)
        assert fig.get_figwidth() == pytest.approx(style.TEXT_WIDTH), name


def _text_sizes(fig: Figure) -> list[tuple[float, str]]:
    """(size in pt, text) of every visible, non-empty text of a drawn figure: titles, labels,
    tick labels, legends, annotations."""
    fig.canvas.draw()  # tick labels exist only once drawn
    out = []
    for text in fig.findobj(match=lambda a: hasattr(a, "get_fontsize") and hasattr(a, "get_text")):
        if text.get_visible() and text.get_text().strip():
            out.append((float(text.get_fontsize()), text.get_text()))
    return out


def test_every_text_is_at_least_8_pt_at_its_printed_size(tables):
    """Drawn at the text width and included unscaled (\\kvgraphic never enlarges and the paper's
    text width is wider than TEXT_WIDTH), a font's size in the file is its size on the page."""
    for name, fig, _ in draw_all(tables):
        small = [(size, text[:30]) for size, text in _text_sizes(fig) if size < 8 - 1e-9]
        assert not small, f"{name}: text below 8 pt: {small[:5]}"
    # and the check sees a small font
    fig = budget_crossover(make_summary(make_per_query(distributions=("gaussian",), trials=1, queries=4)))
    fig.axes[0].set_title("tiny", fontsize=6)
    assert (6.0, "tiny") in _text_sizes(fig)


def test_marginals_hide_the_spare_panel():
    fig = marginals(make_samples())
    assert sum(ax.axison for ax in fig.axes) == 3


def test_scheme_colours_are_fixed_and_identical_across_figures(tables):
    seen: dict[str, set[tuple]] = {}
    for name, fig, _ in draw_all(tables):
        for scheme, rgbs in scheme_artist_colors(fig).items():
            seen.setdefault(scheme, set()).update(rgbs)
    assert set(seen) == set(SCHEMES)
    for scheme, rgbs in seen.items():
        assert rgbs == {tuple(np.round(to_rgba(style.SCHEME_COLORS[scheme])[:3], 4))}, scheme


def test_user_scheme_colours_follow_sorted_names():
    colors = style.scheme_colors(["zeta", "KQV", "alpha", "KV"])
    assert colors["KV"] == style.SCHEME_COLORS["KV"] and colors["KQV"] == style.SCHEME_COLORS["KQV"]
    assert colors["alpha"] == style.EXTRA_COLORS[0] and colors["zeta"] == style.EXTRA_COLORS[1]
    assert style.scheme_colors(["alpha", "zeta"]) == {"alpha": style.EXTRA_COLORS[0], "zeta": style.EXTRA_COLORS[1]}
    assert not set(style.EXTRA_COLORS) & set(style.SCHEME_COLORS.values())
    assert style.scheme_order(["zeta", "RKV", "alpha", "KV"]) == ["KV", "RKV", "alpha", "zeta"]
    # twenty extra schemes (the paper's end-to-end set is larger than the palette): colours cycle,
    # but no two share both colour and marker
    names = [f"S{i:02d}" for i in range(20)]
    looks = list(zip(style.scheme_colors(names).values(), style.scheme_markers(names).values()))
    assert len(set(style.scheme_colors(names).values())) == len(style.EXTRA_COLORS) and len(set(looks)) == 20


def test_given_colours_are_used_everywhere(tables):
    pq = tables["per_query"].copy()
    pq.loc[pq["scheme"] == "RKV", "scheme"] = "mine"
    colors = style.scheme_colors(["KV", "KQV", "QKQV", "mine", "another"])
    fig = kl_ecdf(pq, sharpness=1.0, dim=64, distributions=FACETS, colors=colors)
    got = scheme_artist_colors(fig)
    assert got["mine"] == {tuple(np.round(to_rgba(colors["mine"])[:3], 4))}


def test_save_figure_writes_pdf_and_png_atomically(tmp_path, monkeypatch):
    fig = budget_crossover(make_summary(make_per_query(distributions=("gaussian",), trials=1, queries=4)))
    replaced = []
    real_replace = os.replace

    def spy(src, dst):
        replaced.append((Path(src), Path(dst)))
        assert Path(src).parent == Path(dst).parent and Path(src).name.startswith(".")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    written = figfiles.save_figure(fig, tmp_path / "sub" / "crossover")
    assert written == [tmp_path / "sub" / "crossover.pdf", tmp_path / "sub" / "crossover.png"]
    assert [dst for _, dst in replaced] == written
    assert (tmp_path / "sub" / "crossover.pdf").read_bytes().startswith(b"%PDF")
    png = (tmp_path / "sub" / "crossover.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    width = int.from_bytes(png[16:20], "big")
    assert width == pytest.approx(style.TEXT_WIDTH * style.PNG_DPI, abs=2)
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["crossover.pdf", "crossover.png"]
    assert not fig.axes  # closed and cleared


def test_save_figure_records_provenance_in_both_files(tmp_path):
    from PIL import Image

    from kvasym.dataset import provenance

    meta = {"figure": "crossover", **provenance({"base_seed": 123, "headline": {"dim": 64}})}
    figfiles.save_figure(style.nothing_to_show("x", "y"), tmp_path / "a", meta)
    png = Image.open(tmp_path / "a.png")
    assert png.text["figure"] == "crossover" and png.text["git_commit"] == meta["git_commit"]
    assert json.loads(png.text["config_slice"]) == {"base_seed": 123, "headline": {"dim": 64}}
    pdf = (tmp_path / "a.pdf").read_bytes()
    assert b"/Creator (kvasym " in pdf and b"base_seed" in pdf and meta["git_commit"].encode() in pdf
    # the same figure twice gives the same bytes (no creation date)
    figfiles.save_figure(style.nothing_to_show("x", "y"), tmp_path / "b", meta)
    assert (tmp_path / "b.pdf").read_bytes() == pdf


def test_save_figure_leaves_nothing_behind_on_failure(tmp_path, monkeypatch):
    fig = style.nothing_to_show("x", "y")

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(fig, "savefig", boom)
    with pytest.raises(RuntimeError):
        figfiles.save_figure(fig, tmp_path / "broken")
    assert list(tmp_path.iterdir()) == []


HOSTILE_DIST = "t_1%&$x$"
HOSTILE_SCHEME = "_my_$s$%&"


def test_hostile_names_render(tables, tmp_path):
    rename_d = {"t1.05": HOSTILE_DIST}
    rename_s = {"QKQV": HOSTILE_SCHEME}
    t = {}
    for key, frame in tables.items():
        frame = frame.copy()
        frame["distribution"] = frame["distribution"].replace(rename_d)
        for col in ("scheme", "scheme_a", "scheme_b"):
            if col in frame.columns:
                frame[col] = frame[col].replace(rename_s)
        t[key] = frame
    facets = ["gaussian", HOSTILE_DIST, "lowrank4"]
    figs = [
        shannon_phi_plane(t["per_query"], "v", sharpness=1.0, distributions=facets),
        kl_ecdf(t["per_query"], sharpness=1.0, distributions=facets),
        budget_crossover(t["summary"], distribution=HOSTILE_DIST),
        tail_sweep(t["summary"], {HOSTILE_DIST: 1.05, "t3": 3}),
        rank_sweep(t["summary"], RANK, [HOSTILE_DIST]),
        sharpness_sweep(t["summary"], distributions=facets, comparisons=t["comparisons"],
                           pair=(HOSTILE_SCHEME, "KQV")),
        theory_check(t["theory"]),
        marginals({HOSTILE_DIST: make_samples()["gaussian"]}),
        jensen_bias(t["per_key"], distributions=facets, slopes=t["theory"]),
    ]
    for fig in figs:
        texts = [title_of(fig)] + [txt.get_text() for ax in fig.axes for txt in [ax.title, *ax.texts]]
        for legend in [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]:
            texts += [txt.get_text() for txt in legend.get_texts()]
        joined = "\n".join(texts)
        assert "$x$" not in joined.replace(r"\$", "")  # every dollar is escaped
        fig.savefig(io.BytesIO(), format="png", dpi=30)  # drawing parses every text: must not raise
    # the scheme starting with "_" is in the legends (matplotlib hides such labels by default)
    fig = budget_crossover(t["summary"], distribution="gaussian")
    labels = [txt.get_text() for txt in fig.legends[0].get_texts()]
    assert style.safe_text(HOSTILE_SCHEME) in labels


def test_empty_selections_give_nothing_to_show(tables):
    t = tables
    empty = t["per_query"].iloc[0:0]
    figs = [
        shannon_phi_plane(t["per_query"], "t", sharpness=99.0),
        shannon_phi_plane(empty, "k"),
        kl_ecdf(empty),
        kl_ecdf(t["per_query"], distributions=["absent"]),
        budget_crossover(t["summary"], distribution="absent"),
        budget_crossover(t["summary"].iloc[0:0]),
        tail_sweep(t["summary"], {}),
        tail_sweep(t["summary"], {"t9": 9.0}),
        rank_sweep(t["summary"], {}, []),
        rank_sweep(t["summary"].iloc[0:0], RANK, ["t3"]),
        sharpness_sweep(t["summary"], dim=999),
        theory_check(t["theory"].iloc[0:0]),
        theory_check(pd.DataFrame()),
        marginals({}),
        marginals({"gaussian": (np.array([]), 64)}),
        jensen_bias(t["per_key"], budget=99),
        jensen_bias(t["per_key"].iloc[0:0]),
    ]
    no_columns = pd.DataFrame()
    figs += [
        shannon_phi_plane(no_columns, "k"), kl_ecdf(no_columns), budget_crossover(no_columns),
        tail_sweep(no_columns, NU), rank_sweep(no_columns, RANK, ["t3"]), sharpness_sweep(no_columns),
        theory_check(no_columns), jensen_bias(no_columns),
    ]
    for fig in figs:
        assert isinstance(fig, Figure)
        assert "nothing to show" in title_of(fig)


def test_single_point_sweeps_say_so(tables):
    fig = tail_sweep(tables["summary"], {"t1.05": 1.05}, dim=64, budget=4, sharpness=1.0)
    assert "only one tail index" in title_of(fig) and len(fig.axes) == 2
    fig = rank_sweep(tables["summary"], {"lowrank4": 4}, ["t1.05"], budget=4, sharpness=1.0)
    assert "only one rank" in title_of(fig)


def test_missing_pair_in_sharpness_sweep_is_stated(tables):
    summary = tables["summary"][tables["summary"]["scheme"] != "QKQV"]
    fig = sharpness_sweep(summary, dim=64, budget=4, distributions=["gaussian"])
    assert any("absent" in txt.get_text() for ax in fig.axes for txt in ax.texts)


def test_bad_site_is_an_error(tables):
    with pytest.raises(ValueError, match="site"):
        shannon_phi_plane(tables["per_query"], "q")


def test_style_does_not_leak():
    before = matplotlib.rcParams["font.size"]
    style.nothing_to_show("a", "b")
    assert matplotlib.rcParams["font.size"] == before
    assert matplotlib.get_backend().lower() == "agg"


# ----------------------------------------------------------------------------- the stage


def test_figures_slice_from_the_test_config():
    from kvasym.render.figures.registry import figures_slice
    from kvasym.study import load_study_file

    study = load_study_file(ROOT / "config/test.yaml")
    sl = figures_slice(study)
    assert sl["headline"] == {"distribution": "gaussian", "dim": 64, "sharpness": 1.0, "budget": 4}
    assert sl["facet_distributions"] == ["gaussian", "t1.05", "lowrank4"]
    assert sl["rank_references"] == ["t1.05"]
    assert json.loads(json.dumps(sl)) == sl  # JSON-able
    paper = load_study_file(ROOT / "config/config.yaml")
    sl = figures_slice(paper)
    assert sl["headline"] == {"distribution": "gaussian", "dim": 128, "sharpness": 2.0, "budget": 4}
    assert sl["facet_distributions"] == ["gaussian", "t1.05", "lowrank2", "outliers4"]
    assert sl["rank_references"] == ["t1.05", "t3"]  # heaviest tail at d = 128, at d = 1024
    # the headline is the study's own (config key headline), the one tables and claims read
    assert sl["headline"] == paper.headline


def test_run_figures_writes_every_file(tmp_path, monkeypatch, real_rows):
    from kvasym.render.figures.registry import FIGURES, figure_files
    from kvasym.stages.figure import run_figures

    drawn = []

    def fake_save(fig, stem, provenance=None):  # rendering is tested above; here: which figures, which files
        assert provenance["figure"] == Path(stem).name and '"headline"' in provenance["config_slice"]
        drawn.append((Path(stem).name, title_of(fig), len(fig.axes)))
        files = [Path(f"{stem}.{fmt}") for fmt in ("pdf", "png")]
        for f in files:
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_bytes(b"x")
        return files

    monkeypatch.setattr(figfiles, "save_figure", fake_save)
    pq, pk = make_per_query(trials=1, queries=6), make_per_key(keys=32)
    summary = make_summary(pq)
    paths = {}
    for name, frame in (("summary", summary), ("theory", make_theory()), ("comparisons", make_comparisons(summary))):
        paths[name] = tmp_path / f"{name}.parquet"
        frame.to_parquet(paths[name])
    for table, frame in (("per_query", pq), ("per_key", pk)):
        files = []
        for (dist, scheme, budget), g in frame.groupby(["distribution", "scheme", "budget"]):
            path = tmp_path / "metrics" / table / dist / "d64" / scheme / f"n{budget}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            g.to_parquet(path)
            files.append(path)
        paths[table] = files
    paths["real_per_query"] = real_rows["headline"]
    trials = pq.groupby(["distribution", "dim", "scheme", "budget", "sharpness", "trial"], as_index=False)["kl"].mean()
    from kvasym.claims import query_model_points

    # the query-model table as stage gather writes it from the gathered trials
    paths["query_model"] = tmp_path / "query_model.parquet"
    query_model_points(trials, parents={"lowrank4": {"rank": 4, "noise": 0.0}}, variants={}, references=["t1.05"],
                       scheme="KQV", budget=4, sharpness=1.0, n_boot=10, base_seed=0).to_parquet(paths["query_model"])
    sl = {
        "schemes": list(SCHEMES), "budgets": [2, 4], "sharpness": [1.0, 4.0], "base_seed": 0, "seq_len": 8,
        "n_queries": 4, "trials": 1,
        "distributions": [{"name": "gaussian", "kind": "gaussian", "params": {}, "dims": [64]},
                          {"name": "t1.05", "kind": "student_t", "params": {"nu": 1.05}, "dims": [64]},
                          {"name": "lowrank4", "kind": "low_rank", "params": {"rank": 4, "noise": 0.0}, "dims": [64]}],
        "headline": {"distribution": "gaussian", "dim": 64, "sharpness": 1.0, "budget": 4},
        "facet_distributions": FACETS, "rank_references": ["t1.05"], "marginal_trials": 1, "jensen_bins": 10,
        "max_points": 50,
    }
    out = tmp_path / "figures"
    # one family reads only its own inputs: the budget crossover needs nothing but the summary
    drawn.clear()
    written = run_figures(sl, {"summary": paths["summary"]}, tmp_path / "one", ["budget_crossover"])
    assert [p.name for p in written] == ["budget_crossover.pdf", "budget_crossover.png",
                                         "budget_crossover.caption.tex"]
    assert [name for name, _, _ in drawn] == ["budget_crossover"]
    # the display tables as stage gather writes them from the facet cells' metrics (kvasym.display)
    from kvasym.stages.gather import write_display

    outs = {f"out_{name}": tmp_path / f"{name}.parquet" for name in ("phi_summary", "phi_density", "jensen_bins")}
    write_display(paths["per_query"], paths["per_key"], sl, outs)
    paths.update({name: outs[f"out_{name}"] for name in ("phi_summary", "phi_density", "jensen_bins")})
    del paths["per_key"]  # no figure reads the per-key rows: the Jensen figure draws its binned means
    with pytest.raises(KvasymError, match="jensen_bias need inputs\\['theory'\\]"):
        run_figures(sl, {"jensen_bins": paths["jensen_bins"]}, tmp_path / "one", ["jensen_bias"])
    with pytest.raises(KvasymError, match="jensen_bias need inputs\\['jensen_bins'\\]"):
        run_figures(sl, {"theory": paths["theory"]}, tmp_path / "one", ["jensen_bias"])
    with pytest.raises(KvasymError, match="shannon_phi need inputs\\['phi_summary'\\]"):
        run_figures(sl, {"per_query": paths["per_query"]}, tmp_path / "one", ["shannon_phi"])
    with pytest.raises(KvasymError, match="unknown figure family 'jensen'"):
        run_figures(sl, paths, tmp_path / "one", ["jensen"])
    drawn.clear()
    written = run_figures(sl, {**paths, "data": []}, out)  # no manifests: the marginal figure says so
    assert sorted(map(str, written)) == sorted(figure_files(out))
    assert len(written) == 3 * len(FIGURES)  # pdf, png and the caption
    assert [name for name, _, _ in drawn] == list(FIGURES)
    empty = {name for name, title, _ in drawn if "nothing to show" in title}
    # no end-to-end tables given: their figures say so (drawn from data in tests/test_real_endtoend_stats.py);
    # nor frontier points (drawn from data in tests/test_frontier.py)
    assert empty == {"marginals", "e2e_ppl_bits", "e2e_layer_sensitivity", "e2e_pareto", "e2e_context",
                     "card_sensitivity", "card_allocation", *fs_frontier_names()}, drawn
    assert dict((name, n) for name, _, n in drawn)["shannon_phi_k"] == 6


def fs_frontier_names() -> tuple[str, ...]:
    from kvasym.render.figures.registry import FAMILIES

    return FAMILIES["frontier"]


def test_families_partition_the_figures_and_name_their_cells():
    from kvasym.render.figures.registry import FAMILIES, FAMILY_INPUTS, FIGURES, family_cells, figure_files
    from kvasym.render.figures.registry import facet_cells, figures_slice
    from kvasym.study import load_study_file

    names = [n for family in FAMILIES.values() for n in family]
    assert sorted(names) == sorted(FIGURES) and len(set(names)) == len(names)
    assert set(FAMILY_INPUTS) == set(FAMILIES)
    assert figure_files("out", ["shannon_phi"]) == [f"out/shannon_phi_{s}.{f}" for s in "kvt"
                                                    for f in ("pdf", "png", "caption.tex")]
    paper = load_study_file(ROOT / "config/config.yaml")
    sl = figures_slice(paper)
    facets = ["gaussian", "t1.05", "lowrank2", "outliers4"]
    # per-query figures facet by budget (None: every budget); the Jensen figure reads its binned
    # means (stage gather's, of the per-key rows of the facets at the headline budget)
    assert family_cells(sl, "shannon_phi") == [{"distribution": f, "dim": 128, "budget": None} for f in facets]
    assert family_cells(sl, "jensen_bias") == []
    assert facet_cells(sl, "per_key") == [{"distribution": f, "dim": 128, "budget": 4} for f in facets]
    assert facet_cells(sl, "per_query") == family_cells(sl, "shannon_phi")
    assert family_cells(sl, "marginals") == [{"distribution": f, "dim": 128, "budget": None} for f in facets]
    assert family_cells(sl, "budget_crossover") == []  # reads the gathered summary only


# ----------------------------------------------------------------------------- the real-model heat map

REAL_SCHEMES = ["QKQV", "KV", "RKV", "KQV"]  # a config order that is not the fixed scheme order
REAL_BUDGET = 4


def _short_capture(capture, n_tokens: int):
    """The first ``n_tokens`` positions of a capture (texts of different lengths)."""
    from dataclasses import replace

    cut = {name: getattr(capture, name)[..., :n_tokens, :] for name in ("k_pre_rope", "k_post_rope", "v", "q_pre_rope",
                                                                       "q_post_rope")}
    return replace(capture, token_ids=capture.token_ids[:n_tokens], positions=capture.positions[:n_tokens],
                   token_nll_nats=capture.token_nll_nats[: n_tokens - 1],
                   metadata={**capture.metadata, "n_tokens": n_tokens}, **cut)


@pytest.fixture(scope="module")
def real_rows(tmp_path_factory):
    """Genuine real per-query files (kvasym.real.evaluate.run_real_metrics) of two fake captures
    of different lengths (tests/test_real_evaluate.py's make_capture: layers 0 and 3, 2 KV heads
    read by 2 query heads each), for both real distributions and every scheme, at n = 4 (and one
    file at n = 2), plus the captures."""
    from test_real_evaluate import make_capture

    from kvasym.real.capture import write_capture
    from kvasym.real.evaluate import REAL_DISTRIBUTIONS
    from kvasym.stages.real_metrics import run_real_metrics
    from kvasym.schemes import get_scheme

    tmp = tmp_path_factory.mktemp("real_rows")
    captures = {"alpha": make_capture(seed=0), "beta": _short_capture(make_capture(seed=1), 7)}
    paths = []
    for text, capture in captures.items():
        capture.metadata["name"] = text
        paths.append(str(write_capture(capture, tmp / f"{text}.npz")))
    files: dict[tuple[str, str, int], Path] = {}
    for dist, scheme, budget in [*itertools.product(REAL_DISTRIBUTIONS, REAL_SCHEMES, [REAL_BUDGET]),
                                 ("smollm2", "KV", 2)]:
        slice_ = {"distribution": dist, "scheme": {"name": scheme, **get_scheme(scheme).to_dict()}, "budgets": [budget],
                  "sharpness": [1.0], "base_seed": 11, "norm_dtype": "float32", "layers": None}
        out = tmp / "metrics" / "per_query" / dist / "d8" / scheme / f"n{budget}.parquet"
        out.parent.mkdir(parents=True, exist_ok=True)
        run_real_metrics(slice_, paths, {budget: str(out)})
        files[(dist, scheme, budget)] = out
    return {"files": files, "captures": captures, "headline": [f for (_, _, b), f in files.items() if b == REAL_BUDGET]}


def brute_force_means(captures, dist: str, scheme: str, budget: int) -> pd.DataFrame:
    """Mean KL per (layer, kv_head) straight from evaluate_capture (which labels every query with
    its layer and KV head: no trial map involved), pooled over the texts."""
    from kvasym.real.evaluate import REAL_DISTRIBUTIONS, evaluate_capture
    from kvasym.schemes import get_scheme

    frames = [pd.DataFrame(evaluate_capture(c, [get_scheme(scheme)], [budget], name=text, base_seed=11,
                                            rope=REAL_DISTRIBUTIONS[dist]))
              for text, c in captures.items()]
    frame = pd.concat(frames, ignore_index=True)
    return frame.groupby(["layer", "kv_head"])["kl"].agg(["mean", "size"])


def test_real_kl_means_match_a_brute_force_mean(real_rows):
    from kvasym.real.layer_means import real_kl_means

    means = real_kl_means([*real_rows["headline"], real_rows["files"][("smollm2", "KV", 2)]], budget=REAL_BUDGET)
    assert list(means.columns) == ["distribution", "scheme", "budget", "layer", "kv_head", "kl_mean", "n_queries"]
    assert len(means) == 2 * len(REAL_SCHEMES) * 2 * 2  # distributions x schemes x layers x KV heads
    assert set(means["budget"]) == {REAL_BUDGET}  # the n = 2 file adds nothing at n = 4
    assert sorted(means["layer"].unique()) == [0, 3]  # model layer numbers, not indices
    for dist, scheme in [("smollm2", "QKQV"), ("smollm2-prerope", "KV")]:
        expected = brute_force_means(real_rows["captures"], dist, scheme, REAL_BUDGET)
        got = means[(means["distribution"] == dist) & (means["scheme"] == scheme)].set_index(["layer", "kv_head"])
        # the files store each KL rounded to float32 (relative 2^-24), so their mean is within that too
        np.testing.assert_allclose(got["kl_mean"].to_numpy(), expected.loc[got.index, "mean"].to_numpy(),
                                   rtol=FLOAT32_RTOL)
        # every query weighs the same: 2 query heads x (12 + 7) positions per cell
        assert (got["n_queries"] == 2 * (12 + 7)).all() and (expected["size"] == 2 * (12 + 7)).all()
    # pooled over queries, which is not the mean of the two texts' means (the texts differ in length)
    per_text = pd.read_parquet(real_rows["files"][("smollm2", "QKQV", REAL_BUDGET)])
    assert not np.isclose(per_text.groupby("trial")["kl"].mean().mean(), per_text["kl"].mean())


def _panels(fig):
    """{(distribution, scheme): AxesImage} of a heat map figure."""
    out = {}
    for ax in fig.axes:
        for image in ax.images:
            dist, scheme = image.get_gid().removeprefix("heatmap=").split("|")
            out[(dist, scheme)] = (ax, image)
    return out


def test_real_heatmap_draws_the_means_on_one_log_scale(real_rows, tmp_path, monkeypatch):
    from matplotlib.colors import LogNorm

    from kvasym.stages.figure import run_figures

    figures = {}

    def keep(fig, stem, provenance=None):
        figures[Path(stem).name] = (fig, provenance)
        return [Path(f"{stem}.{fmt}") for fmt in ("pdf", "png")]

    monkeypatch.setattr(figfiles, "save_figure", keep)
    slice_ = {"schemes": REAL_SCHEMES,
              "headline": {"distribution": "gaussian", "dim": 64, "sharpness": 1.0, "budget": REAL_BUDGET},
              "facet_distributions": [], "distributions": [], "base_seed": 0, "max_points": 10}
    written = run_figures(slice_, {"real_per_query": [str(p) for p in real_rows["headline"]]}, tmp_path,
                          ["real_heatmap"])
    assert [p.name for p in written] == ["real_kl_heatmap.pdf", "real_kl_heatmap.png", "real_kl_heatmap.caption.tex"]
    fig, provenance = figures["real_kl_heatmap"]
    assert provenance["figure"] == "real_kl_heatmap"
    panels = _panels(fig)
    # 2 x 4 panels (rows: post-RoPE then pre-RoPE; columns: the schemes in config order) + one colour bar
    assert len(fig.axes) == 2 * 4 + 1 and len(panels) == 8
    grid = [[None] * 4 for _ in range(2)]
    for (dist, scheme), (ax, _) in panels.items():
        grid[["smollm2", "smollm2-prerope"].index(dist)][REAL_SCHEMES.index(scheme)] = ax
    axes_order = [ax for ax in fig.axes if ax.images]
    assert axes_order == [ax for row in grid for ax in row]  # row-major: the grid is laid out as named
    assert [ax.get_title() for ax in grid[0]] == REAL_SCHEMES
    assert [ax.get_title() for ax in grid[1]] == [""] * 4
    margins = [t.get_text() for t in grid[0][-1].texts + grid[1][-1].texts if t.get_rotation() == 270]
    assert margins[0].startswith("smollm2\n") and "post-RoPE" in margins[0]
    assert margins[1].startswith("smollm2-prerope\n") and "pre-RoPE" in margins[1]
    assert [t.get_text() for t in grid[0][0].get_yticklabels()] == ["0", "3"]  # model layer numbers
    assert [t.get_text() for t in grid[1][0].get_xticklabels()] == ["0", "1"]  # KV heads
    assert grid[1][0].get_xlabel() == "KV head" and grid[0][0].get_ylabel() == "layer"
    assert fig.get_figwidth() == pytest.approx(style.TEXT_WIDTH)
    title = title_of(fig)
    assert "SmolLM2-135M" in title and f"n = {REAL_BUDGET} bits" in title and "query heads and positions" in title
    # each panel's array: rows = layers (0, 3), columns = KV heads (0, 1), = the brute-force means
    values = []
    for (dist, scheme), (ax, image) in panels.items():
        expected = brute_force_means(real_rows["captures"], dist, scheme, REAL_BUDGET)["mean"].unstack("kv_head")
        assert list(expected.index) == [0, 3] and list(expected.columns) == [0, 1]
        drawn = np.ma.getdata(image.get_array())
        assert drawn.shape == (2, 2) and not np.ma.is_masked(image.get_array())
        np.testing.assert_allclose(drawn, expected.to_numpy(), rtol=FLOAT32_RTOL)  # float32 files
        values.append(drawn)
        # the cells are large enough to carry their values
        assert (sorted(t.get_text() for t in ax.texts if t.get_rotation() == 0)
                == sorted(f"{v:.2g}" for v in drawn.ravel()))
    values = np.concatenate([v.ravel() for v in values])
    # one shared logarithmic norm from the smallest to the largest mean, one colour bar
    norms = {id(image.norm) for _, image in panels.values()}
    norm = next(iter(panels.values()))[1].norm
    assert len(norms) == 1 and isinstance(norm, LogNorm)
    assert norm.vmin == pytest.approx(values.min()) and norm.vmax == pytest.approx(values.max())
    bars = [ax for ax in fig.axes if not ax.images]
    assert len(bars) == 1 and "mean KL" in bars[0].get_xlabel()
    # KQV and RKV share their key side: identical KL, identical panels
    np.testing.assert_array_equal(panels[("smollm2", "KQV")][1].get_array(), panels[("smollm2", "RKV")][1].get_array())


def test_real_heatmap_renders_to_files(real_rows, tmp_path):
    from kvasym.real.layer_means import real_kl_means

    fig = real_rows_heatmap(real_kl_means(real_rows["headline"], budget=REAL_BUDGET), REAL_SCHEMES, REAL_BUDGET)
    written = figfiles.save_figure(fig, tmp_path / "real_kl_heatmap")
    assert written[0].read_bytes().startswith(b"%PDF") and written[1].read_bytes().startswith(b"\x89PNG")


def _means_frame(layers=(0, 5, 29), heads=(0, 1, 2), schemes=("KV", "QKQV"), dists=("smollm2", "smollm2-prerope")):
    rows = [{"distribution": d, "scheme": s, "budget": 4, "layer": layer, "kv_head": h,
             "kl_mean": (1e-3 if s == "KV" else 1e-1) * (1 + layer + h), "n_queries": 10}
            for d, s, layer, h in itertools.product(dists, schemes, layers, heads)]
    return pd.DataFrame(rows)


def test_real_heatmap_grey_cells_missing_panels_and_many_layers():
    means = _means_frame()
    means.loc[0, "kl_mean"] = 0.0  # exact attention: not on a log scale
    means = means[~((means["distribution"] == "smollm2-prerope") & (means["scheme"] == "QKQV"))]  # a missing panel
    fig = real_kl_heatmap(means, distributions=["smollm2", "smollm2-prerope"], schemes=["KV", "QKQV"], budget=4)
    panels = _panels(fig)
    assert len(panels) == 4 and fig.get_figwidth() == pytest.approx(style.TEXT_WIDTH)
    first = panels[("smollm2", "KV")][1].get_array()
    assert first.mask[0, 0] and first.mask.sum() == 1  # the zero is grey, the rest drawn
    missing_ax, missing = panels[("smollm2-prerope", "QKQV")]
    assert missing.get_array().mask.all() and any(t.get_text() == "no data" for t in missing_ax.texts)
    assert "grey: no finite positive mean" in title_of(fig)
    # 30 layers: no values written in the cells, at most ~10 layer labels per panel
    fig = real_kl_heatmap(_means_frame(layers=range(30)), schemes=["KV", "QKQV", "RKV", "KQV"])
    ax, image = _panels(fig)[("smollm2", "KV")]
    assert image.get_array().shape == (30, 3)
    assert not [t for t in ax.texts if t.get_rotation() == 0]
    assert 5 <= len(ax.get_yticks()) <= 10


def test_real_heatmap_empty_and_hostile_inputs():
    for frame, kwargs in [(pd.DataFrame(), {}), (None, {}), (_means_frame(), {"distributions": ["absent"]}),
                          (_means_frame(), {"budget": 2}), (_means_frame().assign(kl_mean=0.0), {})]:
        assert "nothing to show" in title_of(real_kl_heatmap(frame, **kwargs))
    hostile = _means_frame(schemes=("KV", HOSTILE_SCHEME), dists=(HOSTILE_DIST,))
    fig = real_kl_heatmap(hostile, row_labels={HOSTILE_DIST: HOSTILE_DIST + "\n(x)"}, model="m$x$")
    texts = [title_of(fig)] + [t.get_text() for ax in fig.axes for t in [ax.title, *ax.texts]]
    assert "$x$" not in "\n".join(texts).replace(r"\$", "")
    fig.savefig(io.BytesIO(), format="png", dpi=30)
    with pytest.raises(ValueError, match="one row per"):
        real_kl_heatmap(pd.concat([_means_frame(), _means_frame().head(1)]))


def _rewrite(src: Path, dst: Path, *, drop_trial_map: bool = False, trial_map=None, columns=None) -> Path:
    import pyarrow.parquet as pq

    table = pq.read_table(src)
    meta = dict(table.schema.metadata)
    if drop_trial_map:
        meta.pop(b"trial_map")
    if trial_map is not None:
        meta[b"trial_map"] = trial_map.encode() if isinstance(trial_map, str) else json.dumps(trial_map).encode()
    if columns is not None:
        table = table.select(columns)
    pq.write_table(table.replace_schema_metadata(meta), dst)
    return dst


def test_real_kl_means_rejects_files_without_a_complete_trial_map(real_rows, tmp_path):
    from kvasym.dataset import read_metadata
    from kvasym.real.layer_means import real_kl_means

    good = real_rows["files"][("smollm2", "KV", REAL_BUDGET)]
    trial_map = json.loads(read_metadata(good)["trial_map"])
    cases = [
        ("no_map.parquet", {"drop_trial_map": True}, "no trial_map in the Parquet metadata"),
        ("short_map.parquet", {"trial_map": trial_map[:-1]}, r"trial\(s\) 7 are not in its trial_map"),
        ("bad_json.parquet", {"trial_map": "[{"}, "not valid JSON"),
        ("not_a_list.parquet", {"trial_map": {"trial": 0}}, "JSON list"),
        ("no_layer.parquet", {"trial_map": [{k: v for k, v in e.items() if k != "layer"} for e in trial_map]},
         "lacks layer"),
        ("twice.parquet", {"trial_map": [*trial_map, trial_map[0]]}, "lists trial 0 twice"),
        ("float.parquet", {"trial_map": [{**e, "kv_head": 0.5} for e in trial_map]}, "not an integer"),
        ("no_kl.parquet", {"columns": ["distribution", "scheme", "budget", "sharpness", "trial"]}, "no column"),
    ]
    for name, change, message in cases:
        bad = _rewrite(good, tmp_path / name, **change)
        with pytest.raises(KvasymError, match=message) as info:
            real_kl_means([good, bad], budget=REAL_BUDGET)
        assert name in str(info.value)  # the error names the file
    (tmp_path / "garbage.parquet").write_bytes(b"not parquet")
    with pytest.raises(KvasymError, match="garbage.parquet"):
        real_kl_means([tmp_path / "garbage.parquet"], budget=REAL_BUDGET)
    # an empty map is fine for an empty file only
    assert real_kl_means([], budget=REAL_BUDGET).empty


def test_real_family_inputs_flags_and_dag_presence(tmp_path, monkeypatch):
    import argparse

    from kvasym.render.figures import registry as fs
    from kvasym.study import load_study_file

    assert fs.FAMILIES["real_heatmap"] == ("real_kl_heatmap",)
    assert fs.FAMILY_INPUTS["real_heatmap"] == ("real_per_query",)
    assert fs.REAL_FAMILIES == ("real_heatmap",)
    assert not any("real_per_query" in fs.FAMILY_INPUTS[f] for f in fs.FAMILIES if f != "real_heatmap")
    # the DAG has the family only with real-model rows
    assert fs.dag_families(True) == fs.FAMILIES
    assert fs.dag_families(False) == {f: n for f, n in fs.FAMILIES.items()
                                      if f not in ("real_heatmap", "e2e", "e2e_context", "card")}
    # the end-to-end family only with end-to-end passes (real.e2e not off), the long-context one
    # only with long-context passes
    assert fs.E2E_FAMILIES == ("e2e",) and fs.LONG_FAMILIES == ("e2e_context",) and fs.CARD_FAMILIES == ("card",)
    assert fs.dag_families(True, False) == {f: n for f, n in fs.FAMILIES.items()
                                            if f not in ("e2e", "e2e_context", "card")}
    assert fs.dag_families(True, True, True, False) == {f: n for f, n in fs.FAMILIES.items() if f != "e2e_context"}
    assert fs.dag_families(True, True, True, True, False) == {f: n for f, n in fs.FAMILIES.items() if f != "card"}
    # the frontier family only with frontier.schemes
    assert fs.FRONTIER_FAMILIES == ("frontier",)
    assert fs.dag_families(True, True, False) == {f: n for f, n in fs.FAMILIES.items() if f != "frontier"}
    assert fs.figure_files("out", ["real_heatmap"]) == ["out/real_kl_heatmap.pdf", "out/real_kl_heatmap.png",
                                                        "out/real_kl_heatmap.caption.tex"]
    from kvasym.render.figures import registry as registry

    sl = registry.figures_slice(load_study_file(ROOT / "config/test.yaml"))
    assert registry.family_cells(sl, "real_heatmap") == []  # no synthetic cells: the real files are its inputs
    # the input name real_per_query is the flag --real-per-query (common.smk's figure_flags: "_" -> "-")
    parser = argparse.ArgumentParser()
    from kvasym.stages import figure as figure_stage

    figure_stage.add_arguments(parser)
    args = parser.parse_args(["--slice", "{}", "--family", "real_heatmap", "--real-per-query", "a b.parquet",
                              "c.parquet", "--out-dir", str(tmp_path)])
    seen = {}
    monkeypatch.setattr(figure_stage, "run_figures",
                        lambda s, inputs, out, families: seen.update(inputs=inputs, families=families) or [])
    monkeypatch.setattr("kvasym.stages._slice.parse_slice", lambda text, flag="--slice": {})
    figure_stage.run_from_args(args)
    assert seen["families"] == ["real_heatmap"]
    assert seen["inputs"]["real_per_query"] == ["a b.parquet", "c.parquet"]
    # every family has a caption for the Snakemake report
    for family in fs.FAMILIES:
        assert (ROOT / "workflow/report/figures" / f"{family}.rst").is_file(), family


@pytest.mark.slow
def test_the_dag_has_the_real_heatmap_only_with_real_rows(tmp_path):
    """Dry runs of the tiny config: with real-model rows the heat map is a job reading the real
    rows' per-query files at n = 4 and the paper needs it; with no `real:` section anywhere the
    DAG never mentions it (and still builds)."""
    import yaml
    from snakemake_workdir import make_workdir, snakemake

    from kvasym.real import missing_extra_reason

    workdir = make_workdir(tmp_path / "wd")
    if missing_extra_reason() is None:
        proc = snakemake(workdir, "-n", "-p", "paper")
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-3000:]
        assert "rule figure_real_heatmap:" in out
        files = [f"results/metrics/per_query/{d}/d64/{s}/n4.parquet" for d in ("smollm2", "smollm2-prerope")
                 for s in ("KV", "KQV", "QKQV", "RKV")]
        assert "--family real_heatmap" in out and "--real-per-query " + " ".join(files) in out
        paper_inputs = out.split("rule paper:")[1].split("output:")[0]
        assert "results/figures/real_kl_heatmap.pdf" in paper_inputs
    # no real rows, switched off from the command line (the config files keep their section)
    switched_off = snakemake(workdir, "-n", "-p", "--config", "real=off")
    # ... or with no `real:` section anywhere (the Snakefile's config/config.yaml is read too)
    for name in ("config.yaml", "test.yaml"):
        path = workdir / "config" / name
        config = yaml.safe_load(path.read_text())
        config.pop("real", None)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
    for proc in (switched_off, snakemake(workdir, "-n", "-p")):
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-3000:]
        assert "rule figure_jensen_bias:" in out and "rule all:" in out
        assert "real_heatmap" not in out
        assert "real_kl_heatmap" not in out
        assert "rule real_metrics:" not in out and "rule capture:" not in out  # the synthetic study alone
    assert not (workdir / "results").exists()


def test_sharpness_sweep_draws_the_prediction_and_the_papers_value(tables):
    """The ratio panel carries the second-order prediction from the comparisons' ratio_theory
    (oriented like the ratio: a pair stored as KQV/QKQV is inverted) and the paper's value."""
    comparisons = tables["comparisons"].copy()
    forward = (comparisons["scheme_a"] == "QKQV") & (comparisons["scheme_b"] == "KQV")
    comparisons["ratio_theory"] = np.where(forward, 5.7, 1.0 / 5.7)
    fig = sharpness_sweep(tables["summary"], dim=64, budget=4, distributions=["gaussian"],
                             comparisons=comparisons, paper_ratio=2.25)
    lines = {line.get_label(): line for ax in fig.axes for line in ax.get_lines()}
    predicted = lines["closed form (second-order prediction)"].get_ydata()
    assert np.allclose(predicted, 5.7)
    assert np.allclose(lines["paper's value (2.25)"].get_ydata(), 2.25)
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_captions_state_what_the_drawn_figure_shows(tables):
    """The caption's facts come from the figure: its cell (title), its panels and row titles
    (distributions, budgets) and every legend entry (schemes, reference lines)."""
    from kvasym.render.figures.captions import caption_facts, caption_tex

    drawn = {name: fig for name, fig, _ in draw_all(tables)}
    ecdf = caption_facts(drawn["kl_ecdf"])
    assert set(ecdf["rows"]) == set(FACETS) and any("n = 4" in p for p in ecdf["panels"])
    assert {"KV", "KQV", "QKQV", "RKV"} <= set(ecdf["legend"])
    # in the order the figure gave them, not matplotlib's column-major filling of 4 columns
    assert ecdf["legend"] == ["KV", "KQV", "QKQV", "RKV", "ECDF", "mean", "p99"]
    assert "d = 64" in ecdf["title"]
    rank = caption_facts(drawn["rank_sweep"])
    assert any("t1.05" in entry for entry in rank["legend"])  # the reference line is named
    text = caption_tex(drawn["kl_ecdf"])
    assert text.startswith("As drawn:") and "Panels (" in text and "Shown: KV" in text
    # a figure with one distribution lists only that one
    one = kl_ecdf(tables["per_query"][tables["per_query"]["distribution"] == "gaussian"], sharpness=1.0, dim=64,
                     distributions=["gaussian"])
    assert caption_facts(one)["rows"] in ([], ["gaussian"]) and "t1.05" not in caption_tex(one)


def test_query_model_points_are_ratios_of_trial_means_at_each_alignment():
    """C5's statistic per query model: the mean of the low-rank (or variant) trials over the
    reference's, placed at E[a] (subspace d/r, isotropic 1, a<x> x); the figure draws them."""
    from kvasym.claims import QUERY_MODEL_COLUMNS, Tables, query_model_points, stat_distribution_ratio

    rows = []
    for dist, values in (("lr", [2.0, 4.0]), ("lr+isotropic", [10.0, 14.0]), ("lr+a2", [6.0, 8.0]),
                         ("t", [1.0, 3.0])):
        for trial, kl in enumerate(values):
            rows.append({"distribution": dist, "dim": 64, "scheme": "KQV", "budget": 4, "sharpness": 2.0,
                         "trial": trial, "kl": kl})
    rows.append({"distribution": "lr", "dim": 64, "scheme": "KV", "budget": 4, "sharpness": 2.0, "trial": 0,
                 "kl": 99.0})  # another scheme: left out
    trials = pd.DataFrame(rows)
    points = query_model_points(trials, parents={"lr": {"rank": 4, "noise": 0.0}},
                                variants={"lr+isotropic": {"of": "lr", "query": "isotropic"},
                                          "lr+a2": {"of": "lr", "query": "a2"}},
                                references=["t"], scheme="KQV", budget=4, sharpness=2.0, n_boot=1, base_seed=0)
    assert list(points.columns) == list(QUERY_MODEL_COLUMNS)
    got = {r.query: (r.alignment, r.ratio) for r in points.itertuples()}
    assert got == {"subspace": (16.0, 3.0 / 2.0), "isotropic": (1.0, 12.0 / 2.0), "a2": (2.0, 7.0 / 2.0)}
    # the interval is the claims' own (Fieller over trials, unpaired), as stat_distribution_ratio gives it
    from kvasym.stats import bootstrap_ratio_ci

    iso = points[points["query"] == "isotropic"].iloc[0]
    # prediction from the subspace point (ratio 1.5 at a = 16): E[1/a] = r (d-2)/(d (r-2)) = 4 * 62 / (64 * 2)
    assert math.isclose(iso["predicted"], 1.5 * (4 * 62 / (64 * 2)) / (4 / 64), rel_tol=1e-12)
    a2 = points[points["query"] == "a2"].iloc[0]
    assert math.isclose(a2["predicted"], 1.5 * (1 / 2) / (4 / 64), rel_tol=1e-12)
    ci = bootstrap_ratio_ci([10.0, 14.0], [1.0, 3.0], statistic="mean", n_boot=1, base_seed=0,
                            identity=("claims", "lr+isotropic", "t", "kl", 64), paired=False)
    assert (iso["low"], iso["high"]) == (ci["low"], ci["high"])
    # a point and the claim made at its cell are one number: the ledger's estimate and interval
    empty = pd.DataFrame({"check": pd.Series(dtype=str), "distribution": pd.Series(dtype=str),
                          "dim": pd.Series(dtype=int)})
    tables = Tables(comparisons=empty, summary=empty, trials=trials, theory=empty, n_boot=1, base_seed=0)
    for point in points.itertuples():
        claim = stat_distribution_ratio(tables, {"num": point.distribution, "den": "t", "dim": 64, "budget": 4,
                                                 "scheme": "KQV", "sharpness": 2.0, "metric": "kl"})
        assert (claim.estimate, claim.low, claim.high) == (point.ratio, point.low, point.high)
    fig = query_model_sweep(points)
    assert "Query model" in title_of(fig) and "n = 4, sharpness 2" in title_of(fig)
    assert fig.axes[0].get_ylabel() == "mean KL ratio, KQV"
    empty_fig = query_model_sweep(points.iloc[0:0])
    assert "nothing to show" in title_of(empty_fig)


# ----------------------------------------------------------------------------- issue 15: figures a reader can use


def test_log_ticks_label_a_range_holding_every_value():
    """The labelled ticks start at or below the smallest value and end at or above the largest,
    with at most MAX_LOG_LABELS labels: no plotted quantity lies beyond the last label."""
    for values in ([0.004, 0.12], [0.03, 0.09], [1e-27, 1e5], [1e-4, 2e4], [0.05, 5.6], [2.0], [3e-3, 3.2e-3, 0.7]):
        ticks = style.log_ticks(values)
        assert ticks[0] <= min(values) and ticks[-1] >= max(values), (values, ticks)
        assert 2 <= len(ticks) <= style.MAX_LOG_LABELS, (values, ticks)
        assert ticks == sorted(ticks)
    assert style.log_ticks([0.004, 0.12]) == [0.003, 0.01, 0.03, 0.1, 0.3]
    assert style.log_ticks([1e-4, 2e4]) == [1e-4, 0.1, 100.0, 1e5]  # every third decade
    assert style.log_ticks([0.0, -1.0, float("nan")]) == []


def test_tail_sweep_keeps_its_key_quantity_inside_labelled_ticks(tables):
    """KQV's key direction error, C7a's quantity and the smallest value of the panel, lies at or
    above the lowest labelled tick and inside the axis (the review found it below the lowest tick)."""
    summary = tables["summary"].copy()
    rows = summary["scheme"].isin(["KQV", "RKV"])
    summary.loc[rows, "k_eps_dir_mean"] = 0.004  # far below every other scheme's
    fig = tail_sweep(summary, NU, dim=64, budget=4, sharpness=1.0)
    ax = fig.axes[0]
    shown = _select_panel(summary, "k_eps_dir_mean")
    lo, hi = ax.get_ylim()
    ticks = [t for t in ax.yaxis.get_majorticklocs() if lo <= t <= hi]
    assert min(ticks) <= 0.004 <= max(ticks) and lo < 0.004
    assert min(ticks) <= shown.min() and max(ticks) >= shown.max()
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert labels and labels[0] == style.tick_label(min(ticks))  # the lowest tick is labelled


def _select_panel(summary: pd.DataFrame, metric: str) -> np.ndarray:
    cell = summary[summary["distribution"].isin(list(NU)) & (summary["dim"] == 64) & (summary["budget"] == 4)
                   & np.isclose(summary["sharpness"], 1.0)]
    return cell[metric].to_numpy(dtype=float)


def test_theory_check_plots_measured_over_closed_form_with_the_closed_form_on_top():
    """Each point is estimate / theory (1.01 in make_theory), the closed form is the line at 1
    drawn above the markers, a heavy-tailed point 30x off stays on a log axis without setting
    a linear range, and an unbounded interval is a hollow marker, not a bar to the axis edge."""
    theory = make_theory()
    heavy = (theory["distribution"] == "t1.05") & (theory["check"] == "qjl_vs_nbit") & (theory["budget"] == 4)
    theory.loc[heavy, "estimate"] = 30 * theory.loc[heavy, "theory"]
    theory.loc[heavy, ["low", "high"]] = [-np.inf, np.inf]
    fig = theory_check(theory, dim=64)
    for ax in fig.axes[:2]:  # make_theory has no hadamard rows: the third panel is empty
        closed = [line for line in ax.lines if line.get_gid() == "closed-form"]
        assert len(closed) == 1 and np.allclose(closed[0].get_ydata(), 1.0)
        markers = [line for line in ax.lines if line.get_gid() != "closed-form" and line.get_marker() not in
                   ("", "None", None)]
        assert markers and all(closed[0].get_zorder() > m.get_zorder() for m in markers)
        assert ax.get_yscale() == "log"
    ax_nbit = fig.axes[1]
    ys = np.concatenate([np.asarray(line.get_ydata(), dtype=float) for line in ax_nbit.lines
                         if line.get_gid() != "closed-form"])
    assert np.any(np.isclose(ys, 1.01)) and np.any(np.isclose(ys, 30.0))
    lo, hi = ax_nbit.get_ylim()
    assert lo <= 1.0 <= hi and hi >= 30.0 and hi < 300  # the heavy point is shown, on a few decades
    hollow = [line for line in ax_nbit.lines if line.get_gid() == "unbounded-interval"]
    assert len(hollow) == 1 and np.allclose(hollow[0].get_ydata(), 30.0) and hollow[0].get_markerfacecolor() == "white"
    assert "hollow: CI unbounded" in title_of(fig)


def test_jensen_bias_has_one_figure_legend_and_the_slopes_in_its_panel_titles(tables):
    fig = jensen_bias(tables["per_key"], budget=4, sharpness=1.0, dim=64, distributions=FACETS,
                         slopes=tables["theory"])
    assert len(fig.legends) == 1 and not [ax for ax in fig.axes if ax.get_legend() is not None]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == list(SCHEMES)
    # make_theory's jensen_slope estimate is 0.1: the paper's formatter prints 0.100
    title = fig.axes[0].get_title()
    assert title.startswith("gaussian\nslope: KV $0.100$, KQV $0.100$,") and "RKV $0.100$" in title


def test_kl_ecdf_draws_kl_below_its_floor_at_the_floor_and_says_how_many(tables):
    pq = tables["per_query"]
    frame = pq[(pq["dim"] == 64) & np.isclose(pq["sharpness"], 4.0)]
    floor = 0.01
    fig = kl_ecdf(pq, sharpness=4.0, dim=64, distributions=["gaussian"], floor=floor)
    kl = frame.loc[frame["distribution"] == "gaussian", "kl"].to_numpy(dtype=float)
    share = 100 * np.count_nonzero(kl < floor) / kl.size
    assert 0 < share < 100
    assert f"KL below 0.01 nats drawn at it: {share:.2g}% of gaussian's queries" in title_of(fig)
    for ax in fig.axes:
        lo, hi = ax.get_xlim()
        assert floor / 1.2 < lo <= floor and hi >= kl.max()
        steps = [line for line in ax.lines if len(line.get_xdata()) > 2]
        assert steps and min(float(np.min(line.get_xdata())) for line in steps) == pytest.approx(floor)
    # the default floor: 1e-4 nats; no KL under it is said too
    above = pq[pq["kl"] > 1e-3]
    assert "no KL below 1e-4 nats" in title_of(kl_ecdf(above, sharpness=4.0, dim=64, distributions=["gaussian"]))
    assert KL_FLOOR == 1e-4


def test_density_levels_enclose_the_stated_share_of_the_points():
    """The 50% and 90% levels: the share of points whose smoothed density is at least the level
    is the level's mass (a Gaussian cloud of 20000 points, within 3 points)."""
    gen = np.random.default_rng(5)
    x, y = gen.normal(30, 8, 20000), gen.normal(1.0, 0.5, 20000) + 0.02 * gen.normal(30, 8, 20000)
    xc, yc, density, levels = density_levels(x, y, (0.5, 0.9))
    ix = np.clip(np.searchsorted(xc, x) - 1, 0, xc.size - 1)
    iy = np.clip(np.searchsorted(yc, y) - 1, 0, yc.size - 1)
    at_points = density[iy, ix]
    for mass, level in zip((0.5, 0.9), levels):
        assert abs(np.mean(at_points >= level) - mass) < 0.03, (mass, np.mean(at_points >= level))
    assert levels[0] > levels[1] > 0


def test_output_plane_draws_density_contours_above_the_point_threshold(tables):
    """Above density_points queries per scheme and panel the T plane draws contours (tagged
    with the scheme), with none of the scatter; at or below it, the points."""
    from matplotlib.collections import PathCollection
    from matplotlib.contour import ContourSet

    pq = tables["per_query"]
    n = int(((pq["distribution"] == "gaussian") & (pq["dim"] == 64) & np.isclose(pq["sharpness"], 1.0)
             & (pq["budget"] == 4) & (pq["scheme"] == "KV")).sum())
    dense = shannon_phi_plane(pq, "t", sharpness=1.0, dim=64, distributions=FACETS, density_points=n - 1)
    sparse = shannon_phi_plane(pq, "t", sharpness=1.0, dim=64, distributions=FACETS, density_points=n)
    for ax in dense.axes:
        contours = [c for c in ax.collections if isinstance(c, ContourSet)]
        assert {c.get_gid() for c in contours} == {f"scheme={s}" for s in SCHEMES}
        assert not [c for c in ax.collections if isinstance(c, PathCollection) and not isinstance(c, ContourSet)]
    for ax in sparse.axes:
        assert not [c for c in ax.collections if isinstance(c, ContourSet)]
        assert len([c for c in ax.collections if isinstance(c, PathCollection)]) == len(SCHEMES)
    assert "contours: the densest regions holding 50% and 90%" in title_of(dense)
    assert "points: queries" in title_of(sparse)


def test_key_and_value_planes_are_low(tables):
    """The per-trial planes (K, V) have low rows: a 3 x 2 grid is 2 in shorter than the T plane's."""
    k = shannon_phi_plane(tables["per_query"], "k", sharpness=1.0, dim=64, distributions=FACETS)
    t = shannon_phi_plane(tables["per_query"], "t", sharpness=1.0, dim=64, distributions=FACETS)
    assert k.get_figheight() == pytest.approx(3 * 1.0 + 0.75) and t.get_figheight() == pytest.approx(3 * 1.4 + 0.75)


def test_sharpness_sweep_draws_the_closed_form_and_the_claims_files_paper_value(tables):
    """The ratio panels carry the closed form of theory.predicted_kl_ratio, (pi/2 - 1/d) D(n-1)/D(n)
    for QKQV over KQV, and the paper's 2.25 as the claims file (C2's paper_value) gives it to
    the figure stage; every entry is in one figure legend outside the panels."""
    from kvasym.claims import load_claims
    from kvasym.codebook import lloyd_max_codebook
    from kvasym.render.figures.registry import figures_slice
    from kvasym.schemes import get_scheme
    from kvasym.study import load_study_file
    from kvasym.theory import predicted_kl_ratio

    closed = predicted_kl_ratio(get_scheme("QKQV").K, get_scheme("KQV").K, 4, 64)
    assert closed == pytest.approx((math.pi / 2 - 1 / 64) * lloyd_max_codebook(64, 3).mse_per_vector
                                   / lloyd_max_codebook(64, 4).mse_per_vector, rel=1e-12)
    study = load_study_file(ROOT / "config" / "config.yaml")
    paper = figures_slice(study)["paper_kl_ratio"]
    c2 = next(c for c in load_claims(ROOT / study.claims_file, study.headline) if c["id"] == "C2")
    assert paper == c2["paper_value"] == 2.25
    comparisons = tables["comparisons"].copy()
    forward = (comparisons["scheme_a"] == "QKQV") & (comparisons["scheme_b"] == "KQV")
    comparisons["ratio_theory"] = np.where(forward, closed, 1.0 / closed)
    fig = sharpness_sweep(tables["summary"], dim=64, budget=4, distributions=FACETS, comparisons=comparisons,
                             paper_ratio=paper)
    ratio_axes = fig.axes[1::2]
    for ax in ratio_axes:
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert np.allclose(lines["closed form (second-order prediction)"].get_ydata(), closed)
        assert np.allclose(lines["paper's value (2.25)"].get_ydata(), 2.25)
    assert not [ax for ax in fig.axes if ax.get_legend() is not None] and len(fig.legends) == 1
    entries = [t.get_text() for t in fig.legends[0].get_texts()]
    wanted = {"closed form (second-order prediction)", "paper's value (2.25)", "ratio: measured", *SCHEMES}
    assert wanted <= set(entries)
