"""Issue 14, point 9: the ablations (KQV without its value sketch, the Haar rotation against the
WHT, the sequence-length sweep), each checked against an independent reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from kvasym.errors import KvasymError
from kvasym.evaluate import quantize_pair
from kvasym.schemes import get_scheme, scheme_from_dict

ROOT = Path(__file__).resolve().parents[1]


def _pair(name: str, budget: int, keys: np.ndarray, values: np.ndarray) -> dict:
    return quantize_pair(keys, values, get_scheme(name), budget, base_seed=11, identity=("abl", keys.shape[1], 0))


def test_kqv_noqjl_is_kqv_keys_and_rkv_values_one_bit_lower() -> None:
    """KQV-NS's keys are KQV's bit for bit; its values are exactly RKV's values at n - 1 (the
    same rotation seed, codebook and norms), so its measured V payload is n - 1 bits."""
    rng = np.random.default_rng(3)
    keys, values = rng.standard_normal((64, 32)), rng.standard_normal((64, 32))
    for n in (2, 4):
        ablated, kqv, rkv_lower = _pair("KQV-NS", n, keys, values), _pair("KQV", n, keys, values), \
            _pair("RKV", n - 1, keys, values)
        assert np.array_equal(ablated["K"].codes, kqv["K"].codes)
        assert np.array_equal(ablated["K"].norms, kqv["K"].norms)
        assert ablated["V"].budget == n - 1 and ablated["V"].scalar_bits == n - 1 and not ablated["V"].qjl
        assert np.array_equal(ablated["V"].codes, rkv_lower["V"].codes)
        assert np.array_equal(ablated["V"].dequantize("float64"), rkv_lower["V"].dequantize("float64"))
        assert ablated["V"].bits_per_coordinate()["payload"] == n - 1
        assert kqv["V"].bits_per_coordinate()["payload"] == n


def test_dropping_the_value_sketch_lowers_the_value_error_by_the_sketch_energy() -> None:
    """C1a's closed form: the Gaussian sketch of the (n-1)-bit residual r leaves error energy
    (pi/2 - 1/d) |r|^2, the bare residual |r|^2, so KQV's value error over KQV-NS's is
    pi/2 - 1/d (averaged over rows and over independent sketches: 8 identities)."""
    from kvasym.theory import sketch_error_energy

    d, rows = 64, 512
    rng = np.random.default_rng(5)
    ratios = []
    for trial in range(8):
        keys, values = rng.standard_normal((rows, d)), rng.standard_normal((rows, d))
        err = {}
        for name in ("KQV", "KQV-NS"):
            pair = quantize_pair(keys, values, get_scheme(name), 3, base_seed=2, identity=("abl", d, trial))
            err[name] = float(np.sum((pair["V"].dequantize("float64") - values) ** 2))
        ratios.append(err["KQV"] / err["KQV-NS"])
    assert np.mean(ratios) == pytest.approx(sketch_error_energy("gaussian", d), rel=0.05)
    assert min(ratios) > 1.0  # the sketch never helped the values here


def test_a_side_spends_the_budget_or_declares_less() -> None:
    spec = {"K": {"rotate": True, "scalar_bits": "n", "qjl": False},
            "V": {"rotate": True, "scalar_bits": "n-1", "qjl": False}}
    with pytest.raises(KvasymError, match="not the budget 3"):
        scheme_from_dict("U", spec).validate_budget(3)
    spec["V"]["spend"] = "n-1"
    scheme = scheme_from_dict("U", spec)
    scheme.validate_budget(3)
    assert scheme.to_dict()["V"]["spend"] == "n-1" and scheme_from_dict("U", scheme.to_dict()) == scheme
    spec["V"]["qjl"] = True  # n-1 scalar + 1 sketch bit = n: more than the declared n-1
    with pytest.raises(KvasymError, match="declared spend n-1 = 2"):
        scheme_from_dict("U", spec).validate_budget(3)
    with pytest.raises(KvasymError, match=r"V\.spend must be 'n' or 'n-k'"):
        scheme_from_dict("U", {**spec, "V": {**spec["V"], "spend": "n+1"}})
    with pytest.raises(KvasymError, match="stores nothing"):
        get_scheme("KQV-NS").validate_budget(1)


def test_frontier_distributions_of_restricts_a_scheme() -> None:
    from kvasym.study import load_study

    tiny = yaml.safe_load((ROOT / "config/test.yaml").read_text())
    study = load_study(tiny)
    own = study.frontier_distributions_of
    assert own and all(set(v) <= set(study.distributions) for v in own.values())
    cells = list(study.frontier_cells())
    for scheme in study.frontier_schemes:
        on = {c[0] for c in cells if c[2] == scheme}
        assert on == set(own.get(scheme, study.frontier_distributions))
    assert {c[:2] for c in cells} == set(study.frontier_data_cells())
    bad = {**tiny, "frontier": {**tiny["frontier"], "distributions_of": {"KQV-NS": ["nope"]}}}
    with pytest.raises(KvasymError, match=r"frontier\.distributions_of\.KQV-NS\[0\]"):
        load_study(bad)
    bad = {**tiny, "frontier": {**tiny["frontier"], "distributions_of": {"KQV": ["gaussian"]}}}
    with pytest.raises(KvasymError, match=r"frontier\.distributions_of\.KQV: 'KQV' is not one of frontier"):
        load_study(bad)


def test_haar_rotation_is_orthogonal_and_its_inverse() -> None:
    from kvasym.rotation import HaarRotation, haar_orthogonal

    for d in (3, 64, 100):
        q = haar_orthogonal(d, 17)
        assert np.abs(q.T @ q - np.eye(d)).max() < 1e-12 and np.abs(q @ q.T - np.eye(d)).max() < 1e-12
        x = np.random.default_rng(d).standard_normal((5, d))
        rot = HaarRotation(d, 17)
        assert np.abs(rot.inverse(rot.forward(x)) - x).max() < 1e-12
        assert np.allclose(np.linalg.norm(rot.forward(x), axis=1), np.linalg.norm(x, axis=1), rtol=1e-12)
    assert np.array_equal(haar_orthogonal(16, 3), haar_orthogonal(16, 3))
    assert not np.array_equal(haar_orthogonal(16, 3), haar_orthogonal(16, 4))


def test_haar_rotation_maps_a_basis_vector_to_a_uniform_point_of_the_sphere() -> None:
    """Over seeds, an entry Q_ij = <e_i, Q e_j> of a Haar matrix has the law of one coordinate of
    a uniform unit vector: Q_ij^2 ~ Beta(1/2, (d-1)/2), symmetric in sign (KS test against that
    closed form), E Q_ij^4 = 3 / (d (d + 2)). Without Mezzadri's sign fix LAPACK's Q_00 has one
    sign, which the same KS test rejects."""
    from scipy import stats

    from kvasym.rotation import haar_orthogonal

    d, seeds = 8, 1500

    def cdf(x: np.ndarray) -> np.ndarray:
        return 0.5 + 0.5 * np.sign(x) * stats.beta(0.5, (d - 1) / 2).cdf(x * x)

    for i, j in ((0, 0), (3, 5)):
        entries = np.array([haar_orthogonal(d, s)[i, j] for s in range(seeds)])
        assert stats.kstest(entries, cdf).pvalue > 1e-3
        fourth = np.mean(entries**4)
        se = np.std(entries**4) / np.sqrt(seeds)
        assert abs(fourth - 3 / (d * (d + 2))) < 4 * se
    unfixed = np.array([np.linalg.qr(np.random.Generator(np.random.PCG64(s)).standard_normal((d, d)))[0][0, 0]
                        for s in range(seeds)])
    assert stats.kstest(unfixed, cdf).pvalue < 1e-10  # the test can tell a non-Haar Q


def test_haar_schemes_store_the_seed_and_round_trip(tmp_path: Path) -> None:
    """HRKV quantizes z = Q x with the Beta codebook of dimension d; its packed cache holds
    the seed (counted: the same side bits as RKV's at a power-of-two d), reloads and decodes to
    the brute-force reconstruction Q^T (norm * centroids[codes])."""
    from kvasym.cache import load_packed, save_packed
    from kvasym.codebook import lloyd_max_codebook
    from kvasym.packing import unpack_codes
    from kvasym.rotation import haar_orthogonal

    rng = np.random.default_rng(9)
    keys, values = rng.standard_normal((40, 64)), rng.standard_normal((40, 64))
    haar, rkv = _pair("HRKV", 3, keys, values), _pair("RKV", 3, keys, values)
    k = haar["K"]
    assert k.primitives == {"transform": "haar"} and k.rotation_seed != 0 and not k.rotate
    assert k.side_bits == rkv["K"].side_bits and k.bits_per_coordinate() == rkv["K"].bits_per_coordinate()
    q = haar_orthogonal(64, k.rotation_seed)
    brute = (lloyd_max_codebook(64, 3).centroids[unpack_codes(k.codes, 3, 64)] * k.norms[:, None]) @ q
    assert np.allclose(k.dequantize("float64"), brute, rtol=1e-12, atol=1e-12)
    save_packed(tmp_path / "haar.npz", haar)
    back = load_packed(tmp_path / "haar.npz")
    assert np.array_equal(back["K"].dequantize("float64"), k.dequantize("float64"))
    kqv_haar = _pair("HKQV", 3, keys, values)
    assert np.array_equal(kqv_haar["K"].codes, k.codes) and kqv_haar["V"].qjl
    for name in ("HRKV", "HKQV"):
        assert scheme_from_dict(name, get_scheme(name).to_dict()) == get_scheme(name)


def test_the_wht_flattens_a_one_hot_key_and_haar_does_not() -> None:
    """The review's mechanism: H D e_j = +-1/sqrt(d) in every coordinate (exactly), so every
    coordinate of a one-hot key falls in the same codebook cell and its reconstruction is e_j
    scaled (direction error 0); a Haar rotation leaves it a uniform point of the sphere, whose
    direction error is the codebook's typical distortion."""
    from kvasym.cache import quantize
    from kvasym.rotation import RandomizedHadamard
    from kvasym.schemes import SideSpec

    d = 64
    e = np.eye(d)[:8]
    assert np.allclose(np.abs(RandomizedHadamard(d, 5).forward(e)), 1 / np.sqrt(d), rtol=1e-12)
    for transform in ("wht", "haar"):
        spec = SideSpec(rotate=transform == "wht", transform=transform, scalar_offset=0, qjl=False)
        x = quantize(e, spec, 3, rotation_seed=5, qjl_seed=6).dequantize("float64")
        cos = np.sum(x * e, axis=1) / np.linalg.norm(x, axis=1)
        if transform == "wht":
            assert np.allclose(cos, 1.0, atol=1e-12)
        else:
            assert np.all(1 - cos > 1e-3)


def test_haar_qjl_ratio_matches_the_closed_form_and_undoes_the_wht_on_one_hot_keys() -> None:
    """Under a Haar rotation every unit key is a uniform point of the sphere, so the QJL vs
    residual ratio is pi/2 - 1/d (qjl_closed_forms) even for one-hot keys, whose WHT images are
    flat (+-1/sqrt(d)) and put the (n-1)-bit vs n-bit ratio off its closed form."""
    from kvasym.theory import inner_product_errors, qjl_closed_forms

    d = 64
    one_hot = np.repeat(np.eye(d), 4, axis=0) * 3.0
    sums = {t: inner_product_errors(one_hot, 2, base_seed=1, identity=("oh", d, 0), n_probes=64, transform=t)
            for t in ("wht", "haar")}
    closed = qjl_closed_forms(d, 2)
    haar = sums["haar"]
    assert haar["ss_qjl"] / haar["ss_residual"] == pytest.approx(closed["vs_residual"], rel=0.15)
    assert haar["ss_residual"] / haar["ss_nbit"] == pytest.approx(closed["vs_nbit"] / closed["vs_residual"], rel=0.25)
    wht = sums["wht"]  # D(1)/D(2) on the flat vector is not the Beta law's (about 3.1 at d = 64)
    assert abs(wht["ss_residual"] / wht["ss_nbit"] - closed["vs_nbit"] / closed["vs_residual"]) > 1.0
    with pytest.raises(KvasymError, match="transform must be wht or haar"):
        inner_product_errors(one_hot, 2, base_seed=1, identity=("oh", d, 0), n_probes=4, transform="klt")


def test_length_slopes_recover_a_known_power_law() -> None:
    """Rows built as c L^b times trial noise: the fitted slope of log metric on log L is b (OLS on
    exact power laws is exact; with noise, within the interval), and the interval resamples trials."""
    import pandas as pd

    from kvasym.seqlen import length_slopes

    rng = np.random.default_rng(1)
    lengths = [32, 64, 128, 256]
    rows = [{"distribution": "g", "dim": 8, "sharpness": 1.0, "seq_len": L, "scheme": "S", "budget": 2,
             "trial": t, "kl": 0.3 * L**0.5 * np.exp(0.01 * rng.standard_normal()), "t_eps_dir": 0.1 * L**-0.25}
            for t in range(6) for L in lengths]
    slopes = length_slopes(pd.DataFrame(rows), n_boot=200, base_seed=3).set_index("metric")
    assert slopes.loc["t_eps_dir", "slope"] == pytest.approx(-0.25, abs=1e-12)
    kl = slopes.loc["kl"]
    assert kl["low"] <= kl["slope"] <= kl["high"] and kl["slope"] == pytest.approx(0.5, abs=0.02)
    assert kl["n_lengths"] == 4 and kl["n_trials"] == 6 and (kl["min_seq_len"], kl["max_seq_len"]) == (32, 256)


def test_sweep_rows_are_seeded_by_length_and_trial() -> None:
    """Each length is its own draw (the data name carries it), a rerun is bit-identical, and KQV's
    keys are RKV's (same seeds): equal KL, different output error."""
    from kvasym.distributions import DistributionSpec
    from kvasym.seqlen import sweep_trial_rows

    spec = DistributionSpec("gaussian", "gaussian", {})
    schemes = {n: get_scheme(n) for n in ("KQV", "RKV")}
    a = sweep_trial_rows(spec, 16, 32, 4, 2, schemes, [2], 1.0, base_seed=5)
    again = sweep_trial_rows(spec, 16, 32, 4, 2, schemes, [2], 1.0, base_seed=5)
    longer = sweep_trial_rows(spec, 16, 64, 4, 2, schemes, [2], 1.0, base_seed=5)
    assert a.equals(again) and len(a) == 4 and not np.allclose(a["kl"], longer["kl"])
    by = a.set_index(["scheme", "trial"])
    assert np.array_equal(by.loc["KQV", "kl"].to_numpy(), by.loc["RKV", "kl"].to_numpy())
    assert not np.array_equal(by.loc["KQV", "t_eps_dir"].to_numpy(), by.loc["RKV", "t_eps_dir"].to_numpy())


def test_seq_len_sweep_config_is_checked_and_its_claim_reads_the_slopes() -> None:
    import pandas as pd

    from kvasym.claims import Tables, stat_seq_len_slope
    from kvasym.study import load_study

    tiny = yaml.safe_load((ROOT / "config/test.yaml").read_text())
    study = load_study(tiny)
    assert study.seq_len_sweep["seq_lens"] == [32, 64] and study.seq_len_sweep["dim"] == 64
    assert not load_study({**tiny, "seq_len_sweep": {}}).seq_len_sweep
    for bad, message in (({"distribution": "nope"}, r"seq_len_sweep\.distribution = 'nope'"),
                         ({"schemes": ["SKLT"]}, r"seq_len_sweep\.schemes\[0\] = 'SKLT'"),
                         ({"budgets": [9]}, r"seq_len_sweep\.budgets\[0\]"),
                         ({"distribution": "lowrank4+isotropic"}, "query-model variant")):
        with pytest.raises(KvasymError, match=message):
            load_study({**tiny, "seq_len_sweep": {**tiny["seq_len_sweep"], **bad}})
    slopes = pd.DataFrame([{"distribution": "gaussian", "dim": 64, "sharpness": 1.0, "scheme": "KQV", "budget": 4,
                            "metric": "kl", "slope": 0.02, "low": 0.01, "high": 0.03, "n_lengths": 2, "n_trials": 2,
                            "min_seq_len": 32, "max_seq_len": 64}])
    empty = pd.DataFrame()
    tables = Tables(empty, empty, empty, empty, seq_len_slopes=slopes)
    m = stat_seq_len_slope(tables, {"distribution": "gaussian", "dim": 64, "sharpness": 1.0, "scheme": "KQV",
                                    "budget": 4})
    assert (m.estimate, m.low, m.high, m.interval) == (0.02, 0.01, 0.03, True)
    with pytest.raises(KvasymError, match="does not exist"):
        stat_seq_len_slope(tables, {"distribution": "gaussian", "dim": 64, "sharpness": 1.0, "scheme": "KQV",
                                    "budget": 4, "metric": "nope"})


def test_seq_len_table_places_each_length_and_slope() -> None:
    import pandas as pd

    from kvasym.render.format import render_template
    from kvasym.render.table_seqlen import seq_len_context

    summary = pd.DataFrame([{"distribution": "gaussian", "dim": 64, "sharpness": 1.0, "scheme": "KQV", "budget": 4,
                             "seq_len": L, "kl": kl, "t_eps_dir": 0.1, "kl_se": 0.0, "t_eps_dir_se": 0.0,
                             "n_trials": 2} for L, kl in ((64, 0.25), (32, 0.125))])
    slopes = pd.DataFrame([{"scheme": "KQV", "budget": 4, "metric": m, "slope": s, "low": s - 0.5, "high": s + 0.5}
                           for m, s in (("kl", 1.0), ("t_eps_dir", 0.0))])
    context = seq_len_context(summary, slopes)
    assert context["lengths"] == [32, 64]
    kl_row = context["blocks"][0]["rows"][0]
    assert kl_row["cells"] == [0.125, 0.25] and (kl_row["slope"], kl_row["low"], kl_row["high"]) == (1.0, 0.5, 1.5)
    text = render_template("table_seq_len.tex.j2", **context)
    assert "\\label{tab:seq_len}" in text and "$0.125$ & $0.250$" in text
    assert "\\begin{table}" not in render_template("table_seq_len.tex.j2", **seq_len_context(None, None))


def test_frontier_real_schemes_choose_the_real_rows_schemes() -> None:
    from kvasym.study import load_study

    tiny = yaml.safe_load((ROOT / "config/test.yaml").read_text())
    default = {**tiny, "frontier": {k: v for k, v in tiny["frontier"].items() if k != "real_schemes"}}
    assert load_study(default).frontier_real_schemes == tuple(load_study(default).frontier_schemes)
    study = load_study({**tiny, "frontier": {**tiny["frontier"], "real_schemes": ["HRKV", "CRKV"]}})
    assert study.frontier_real_schemes == ("CRKV", "HRKV")  # in frontier.schemes order
    with pytest.raises(KvasymError, match=r"frontier\.real_schemes\[0\] = 'KQV'"):
        load_study({**tiny, "frontier": {**tiny["frontier"], "real_schemes": ["KQV"]}})


def test_frontier_real_query_aware_variants_get_cross_fitted_slices_and_frontier_rows() -> None:
    """frontier.real_query_aware: a real_metrics slice that names the variant and its
    cross-fitting, the variant among the frontier's schemes, the schema's enum the library's
    variants, and a refusal of a name that is also a scheme."""
    from kvasym.config_schema import load_schema
    from kvasym.real import real_settings
    from kvasym.real.queryaware import VARIANTS, variant_scheme
    from kvasym.study import load_study

    tiny = yaml.safe_load((ROOT / "config/test.yaml").read_text())
    study = load_study(tiny)
    assert study.frontier_real_query_aware == ("QWF",)
    assert "QWF" in study.frontier_slice()["schemes"] and "QWF" not in study.frontier_slice()["frontier_schemes"]
    real = real_settings(tiny["real"], list(study.schemes), list(study.frontier_real_schemes))
    qwf = study.job_slice("real_metrics", {"distribution": "smollm2", "scheme": "QWF"}, real=real)
    spec = variant_scheme("QWF").to_dict()
    spec.pop("description", None)
    assert qwf["scheme"] == {"name": "QWF", **spec}
    assert qwf["query_aware"] == {"variant": "QWF", "calibration": "leave-one-text-out"}
    rkv = study.job_slice("real_metrics", {"distribution": "smollm2", "scheme": "RKV"}, real=real)
    assert "query_aware" not in rkv and {k: v for k, v in qwf.items() if k not in ("scheme", "query_aware")} == {
        k: v for k, v in rkv.items() if k != "scheme"}
    without = load_study({**tiny, "frontier": {k: v for k, v in tiny["frontier"].items() if k != "real_query_aware"}})
    assert without.frontier_real_query_aware == ()
    assert without.frontier_slice() == {**study.frontier_slice(),
                                        "schemes": [s for s in study.frontier_slice()["schemes"] if s != "QWF"]}
    enum = load_schema()["properties"]["frontier"]["properties"]["real_query_aware"]["items"]["enum"]
    assert enum == list(VARIANTS)
    with pytest.raises(KvasymError, match=r"frontier.real_query_aware\[0\] = 'QX'|real_query_aware"):
        load_study({**tiny, "frontier": {**tiny["frontier"], "real_query_aware": ["QX"]}})
    clash = {**tiny, "user_schemes": {"QWF": {"K": {"rotate": True, "scalar_bits": "n", "qjl": False},
                                             "V": {"rotate": True, "scalar_bits": "n", "qjl": False}}},
             "schemes": [*tiny["schemes"], "QWF"]}
    with pytest.raises(KvasymError, match=r"frontier.real_query_aware\[0\] = 'QWF' is also a scheme"):
        load_study(clash)
