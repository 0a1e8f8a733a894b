"""Query-aware key quantization (kvasym.real.querybases, kvasym.real.queryaware).

References used: the eigen-equations themselves and kvasym.klt's eigendecomposition (another
implementation) for the bases; the model's own forward pass and an explicit RMSNorm/Wq/RoPE
recomputation with 2x2 rotations for the calibration; RKV and a declaratively built
centred-water-filling scheme (kvasym.schemes grammar) for the quantizers in the identity basis;
the byte counts of the packed arrays, recomputed by hand, for the bits; a double loop for the
query-weighted error.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvasym.errors import KvasymError
from kvasym.evaluate import dequantize_with, quantize_pair
from kvasym.klt import klt_basis
from kvasym.real import shipped_texts
from kvasym.real.queryaware import (
    SCALE_FLOOR,
    VARIANTS,
    QueryBases,
    bases_from_moments,
    basis_bytes,
    calibrate,
    check_disjoint,
    default_calibration_texts,
    load_query_bases,
    quantize_pair_query_aware,
    query_scales,
    query_second_moments,
    query_weighted_error,
    save_query_bases,
)
from kvasym.schemes import get_scheme, scheme_from_dict
from kvasym.seeds import rng
from test_longtext import real_model_or_skip

BASE_SEED = 11
D = 64
EVALUATION = ("bakery_morning", "bicycle_repair", "river_walk", "town_library")


def random_bases(n_layers: int = 2, n_kv: int = 3, d: int = D, seed_name: str = "bases") -> QueryBases:
    g = rng(BASE_SEED, seed_name)
    x = g.standard_normal((n_layers, n_kv, 4 * d, d)) * np.linspace(3.0, 0.1, d)
    bases, lam = bases_from_moments(np.einsum("lhni,lhnj->lhij", x, x) / x.shape[2])
    return QueryBases(bases=bases, eigenvalues=lam, calibration_texts=("a", "b"), n_positions=4 * d,
                      model_sha256="0" * 64)


def identity_bases(d: int = D) -> QueryBases:
    return QueryBases(bases=np.eye(d)[None, None], eigenvalues=np.ones((1, 1, d)), calibration_texts=("a",),
                      n_positions=1, model_sha256="0" * 64)


def low_rank_setting(d: int = D, n_keys: int = 256, n_queries: int = 2000):
    """Queries mostly in a 4-dimensional subspace (amplitudes 4, 3, 2, 1.5; 0.05 elsewhere) of a
    random orthogonal frame; keys and values isotropic N(0, I)."""
    g = rng(BASE_SEED, "low-rank-queries")
    frame = np.linalg.qr(g.standard_normal((d, d)))[0]
    amplitudes = np.r_[4.0, 3.0, 2.0, 1.5, np.full(d - 4, 0.05)]
    queries = (g.standard_normal((n_queries, d)) * amplitudes) @ frame.T
    keys = g.standard_normal((n_keys, d))
    values = g.standard_normal((n_keys, d))
    bases, lam = bases_from_moments((queries.T @ queries / n_queries)[None, None])
    qb = QueryBases(bases=bases, eigenvalues=lam, calibration_texts=("synthetic",), n_positions=n_queries,
                    model_sha256="0" * 64)
    return queries, keys, values, qb


# --------------------------------------------------------------------------- bases


def test_bases_solve_the_eigen_equations_with_the_klt_sign_rule():
    g = rng(BASE_SEED, "psd")
    full = g.standard_normal((200, 16)) * np.linspace(2.0, 0.2, 16)
    low = g.standard_normal((5, 16))  # rank 5 of 16: eigenvalues 0 to round-off, clipped
    moments = np.stack([full.T @ full / 200, low.T @ low / 5])
    bases, lam = bases_from_moments(moments)
    for m, u, values in zip(moments, bases, lam):
        np.testing.assert_allclose(u.T @ u, np.eye(16), rtol=0, atol=1e-12)
        np.testing.assert_allclose(m @ u, u * values, rtol=0, atol=1e-12 * np.abs(m).max())
        assert np.all(np.diff(values) <= 0) and np.all(values >= 0)
        peak = u[np.argmax(np.abs(u), axis=0), np.arange(16)]
        assert np.all(peak > 0)
    assert np.all(lam[1, 5:] < 1e-12 * lam[1, 0])
    # another implementation: klt_basis of a zero-mean block has covariance = second moment
    centred = full - full.mean(axis=0)
    klt_values, klt_vectors = klt_basis(centred)
    bases_c, lam_c = bases_from_moments(centred.T @ centred / 200)
    np.testing.assert_allclose(lam_c, klt_values, rtol=1e-12)
    np.testing.assert_allclose(bases_c, klt_vectors, rtol=0, atol=1e-10)


def test_energy_share_is_the_eigenvalue_fraction():
    qb = random_bases()
    lam = qb.eigenvalues[1, 2]
    assert qb.energy_share(8)[1, 2] == pytest.approx(lam[:8].sum() / lam.sum(), rel=1e-14)
    # trace M = E|q|^2 is the total: the share of all directions is 1
    np.testing.assert_allclose(qb.energy_share(D), 1.0, rtol=1e-14)


# --------------------------------------------------------------------------- calibration on the real model


@pytest.fixture(scope="module")
def model():
    return real_model_or_skip("the query calibration was")


def _explicit_layer0_queries(model, ids: np.ndarray) -> np.ndarray:
    """(n_heads, T, d) post-RoPE queries of layer 0 from the weights, RoPE as 2x2 rotations."""
    c = model.config
    layer = model.layers[0]
    x = model.token_embedding[ids].astype(np.float64)
    h = x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + c.rms_eps) * layer.attn_norm
    q = (h @ layer.wq.T.astype(np.float64)).reshape(ids.size, c.n_heads, c.head_dim)
    half = c.head_dim // 2
    out = np.empty_like(q)
    for t in range(ids.size):
        for j in range(half):
            angle = t * c.rope_base ** (-2.0 * j / c.head_dim)
            rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
            pair = np.stack([q[t, :, j], q[t, :, j + half]])  # (2, heads): rotate-half pairs j, j + d/2
            out[t, :, j], out[t, :, j + half] = rot @ pair
    return out.transpose(1, 0, 2)


def _brute_moment(q: np.ndarray, kv_of_head: np.ndarray, kv_head: int) -> np.ndarray:
    total, count = np.zeros((q.shape[2], q.shape[2])), 0
    for head in np.flatnonzero(kv_of_head == kv_head):
        for t in range(q.shape[1]):
            total += np.outer(q[head, t], q[head, t])
            count += 1
    return total / count


def test_query_second_moments_match_a_brute_force_recomputation(model):
    c = model.config
    ids = model.encode("The baker opened the shop before dawn, lit the old oven and swept the floor.")[:16]
    assert ids.size == 16
    moments = query_second_moments(model, [ids])
    assert moments.shape == (c.n_layers, c.n_kv_heads, c.head_dim, c.head_dim) and moments.dtype == np.float64
    kv_of_head = c.kv_head_of_query_head()
    last = c.n_layers - 1
    captured = model.forward(ids, capture_layers=[0, last]).layers
    explicit = _explicit_layer0_queries(model, ids)
    for kv in range(c.n_kv_heads):
        for layer in (0, last):
            ref = _brute_moment(captured[layer].q.astype(np.float64), kv_of_head, kv)
            np.testing.assert_allclose(moments[layer, kv], ref, rtol=0, atol=1e-12 * np.abs(ref).max())
        ref0 = _brute_moment(explicit, kv_of_head, kv)
        np.testing.assert_allclose(moments[0, kv], ref0, rtol=0, atol=2e-5 * np.abs(ref0).max())
    # texts are weighted by their positions: M(a, b) = (T_a M(a) + T_b M(b)) / (T_a + T_b)
    short = ids[:5]
    both = query_second_moments(model, [ids, short])
    np.testing.assert_allclose(both, (16 * moments + 5 * query_second_moments(model, [short])) / 21,
                               rtol=0, atol=1e-12 * np.abs(moments).max())
    qb = calibrate(model, {"sixteen": ids})
    assert qb.n_positions == 16 and qb.calibration_texts == ("sixteen",)
    assert qb.model_sha256 == model.model_sha256 and qb.shape == (c.n_layers, c.n_kv_heads, c.head_dim)
    u, lam = qb.bases[last, 1], qb.eigenvalues[last, 1]
    np.testing.assert_allclose(u.T @ u, np.eye(c.head_dim), rtol=0, atol=1e-12)
    np.testing.assert_allclose(moments[last, 1] @ u, u * lam, rtol=0, atol=1e-10 * lam[0])


# --------------------------------------------------------------------------- the quantizers


def test_qrkv_in_the_identity_basis_is_rkv_bit_for_bit():
    g = rng(BASE_SEED, "identity-rkv")
    keys, values = g.standard_normal((50, D)) * 3, g.standard_normal((50, D))
    for budget in (2, 3):
        ref = quantize_pair(keys, values, get_scheme("RKV"), budget, base_seed=BASE_SEED,
                            identity=("text", 0, 0), kernel="auto")
        k_hat, v_hat, bits = quantize_pair_query_aware(keys, values, "QRKV", budget, identity_bases(), 0, 0,
                                                       base_seed=BASE_SEED, identity=("text", 0, 0))
        np.testing.assert_array_equal(k_hat, dequantize_with(ref["K"], "auto"))
        np.testing.assert_array_equal(v_hat, dequantize_with(ref["V"], "auto"))
        assert bits["k_bits_side"] == ref["K"].bits_per_coordinate()["side"]


def test_qwf_in_the_identity_basis_is_centred_waterfilling_of_the_keys():
    cwf = scheme_from_dict("CWF", {"K": {"transform": "none", "scalar_bits": "n", "qjl": False, "center": True,
                                         "allocation": "waterfill"},
                                   "V": {"rotate": True, "scalar_bits": "n", "qjl": False}})
    g = rng(BASE_SEED, "identity-cwf")
    keys = g.standard_normal((80, D)) * np.linspace(4.0, 0.1, D) + 1.5
    values = g.standard_normal((80, D))
    for budget in (2, 3):
        ref = quantize_pair(keys, values, cwf, budget, base_seed=BASE_SEED, identity=("t", 4, 2), kernel="auto")
        k_hat, v_hat, _ = quantize_pair_query_aware(keys, values, "QWF", budget, identity_bases(), 0, 0,
                                                    base_seed=BASE_SEED, identity=("t", 4, 2))
        np.testing.assert_array_equal(k_hat, dequantize_with(ref["K"], "auto"))
        np.testing.assert_array_equal(v_hat, dequantize_with(ref["V"], "auto"))


def _errors(budget: int) -> dict[str, float]:
    queries, keys, values, qb = low_rank_setting()
    out = {}
    for name in ("RKV", "SKLT"):
        packed = quantize_pair(keys, values, get_scheme(name), budget, base_seed=BASE_SEED, identity=("syn", 0, 0),
                               kernel="auto")
        out[name] = query_weighted_error(queries, keys, dequantize_with(packed["K"], "auto"))
    for variant in VARIANTS:
        k_hat, _, _ = quantize_pair_query_aware(keys, values, variant, budget, qb, 0, 0, base_seed=BASE_SEED,
                                                identity=("syn", 0, 0))
        out[variant] = query_weighted_error(queries, keys, k_hat)
    return out


@pytest.mark.parametrize("budget", [2, 3])
def test_qwf_beats_rkv_when_queries_live_in_a_small_subspace(budget):
    errors = _errors(budget)
    # measured: QWF / RKV = 0.016 (n = 2), 0.017 (n = 3); SKLT (blind to the queries) ~ RKV
    assert errors["QWF"] < 0.05 * errors["RKV"]
    assert errors["QWF"] < 0.05 * errors["SKLT"]
    assert 0.7 < errors["SKLT"] / errors["RKV"] < 1.3


def test_qrkv_changes_little_because_the_wht_error_is_near_isotropic():
    """The docstring's expectation, as a property: over 8 rotation seeds QRKV's query-weighted
    error stays within a third of RKV's and equals it on average to 10% (measured 0.91-1.17,
    mean 1.04 at n = 2 and 1.02 at n = 3), although these queries are far from isotropic."""
    queries, keys, values, qb = low_rank_setting()
    for budget in (2, 3):
        ratios = []
        for trial in range(8):
            identity = ("syn", trial, 0)
            ref = quantize_pair(keys, values, get_scheme("RKV"), budget, base_seed=BASE_SEED, identity=identity,
                                kernel="auto")
            k_hat, _, _ = quantize_pair_query_aware(keys, values, "QRKV", budget, qb, 0, 0, base_seed=BASE_SEED,
                                                    identity=identity)
            ratios.append(query_weighted_error(queries, keys, k_hat)
                          / query_weighted_error(queries, keys, dequantize_with(ref["K"], "auto")))
        assert all(0.75 < r < 1.33 for r in ratios), ratios
        assert abs(np.mean(ratios) - 1.0) < 0.1, ratios


def test_query_weighted_key_error_is_lambda1_times_the_error_of_y():
    """The docstring's identity e^T M e = lam_1 |e U diag(s)|^2 when every lam_i is above the floor."""
    qb = random_bases()
    u, lam = qb.bases[1, 0], qb.eigenvalues[1, 0]
    assert lam[-1] > SCALE_FLOOR * lam[0]
    m = u @ np.diag(lam) @ u.T
    e = rng(BASE_SEED, "errors").standard_normal((10, D))
    eps = (e @ u) * query_scales(lam)
    np.testing.assert_allclose(np.einsum("ni,ij,nj->n", e, m, e), lam[0] * np.sum(eps**2, axis=1), rtol=1e-12)


def test_query_scales_floor():
    lam = np.array([4.0, 1.0, 4e-6, 1e-9, 0.0])
    np.testing.assert_allclose(query_scales(lam), [1.0, 0.5, 1e-3, 1e-3, 1e-3], rtol=1e-15)
    np.testing.assert_array_equal(query_scales(np.zeros(3)), np.ones(3))
    with pytest.raises(KvasymError, match="eigenvalues"):
        query_scales(np.array([1.0, -1.0]))


@pytest.mark.parametrize("norm_dtype", ["float32", "float16"])
@pytest.mark.parametrize("n_rows", [40, 256])
def test_bits_payload_is_n_and_side_bits_follow_the_formula(norm_dtype, n_rows):
    """Side bits per coordinate, w = bits of norm_dtype, T rows of d coordinates:
    QRKV keys and RKV values: T norms + one 64-bit WHT seed, (T w + 64) / (T d);
    QWF keys: T norms + the mean (d) + the coordinate scales (d), no seed, (T + 2 d) w / (T d)."""
    qb = random_bases()
    g = rng(BASE_SEED, "bits", n_rows)
    keys, values = g.standard_normal((n_rows, D)), g.standard_normal((n_rows, D))
    w = np.dtype(norm_dtype).itemsize * 8
    seeded = (n_rows * w + 64) / (n_rows * D)
    for budget in (2, 3, 4):
        for variant, k_side in (("QRKV", seeded), ("QWF", (n_rows + 2 * D) * w / (n_rows * D))):
            _, _, bits = quantize_pair_query_aware(keys, values, variant, budget, qb, 1, 2, base_seed=BASE_SEED,
                                                   identity=("b", 1, 2), norm_dtype=norm_dtype)
            assert bits["k_bits_payload"] == budget and bits["v_bits_payload"] == budget
            assert bits["k_bits_side"] == pytest.approx(k_side, rel=1e-15)
            assert bits["v_bits_side"] == pytest.approx(seeded, rel=1e-15)


def test_basis_bytes_counts_every_basis_and_qwf_scales():
    qb = random_bases(n_layers=30, n_kv=3)
    assert basis_bytes(qb) == 30 * 3 * 64 * 64 * 2
    assert basis_bytes(qb, "float32", "QWF") == 30 * 3 * 64 * 65 * 4
    with pytest.raises(KvasymError, match="'QXX'"):
        basis_bytes(qb, variant="QXX")


def test_refusals_name_the_offending_value():
    qb = random_bases()
    keys = np.zeros((8, D))
    with pytest.raises(KvasymError, match="'QKLT'"):
        quantize_pair_query_aware(keys, keys, "QKLT", 2, qb, 0, 0, base_seed=1, identity=())
    with pytest.raises(KvasymError, match="layer 2"):
        quantize_pair_query_aware(keys, keys, "QWF", 2, qb, 2, 0, base_seed=1, identity=())
    with pytest.raises(KvasymError, match="kv_head 3"):
        quantize_pair_query_aware(keys, keys, "QWF", 2, qb, 0, 3, base_seed=1, identity=())
    with pytest.raises(KvasymError, match=r"\(8, 32\)"):
        quantize_pair_query_aware(np.zeros((8, 32)), keys, "QRKV", 2, qb, 0, 0, base_seed=1, identity=())


def test_query_weighted_error_is_the_mean_over_pairs():
    g = rng(BASE_SEED, "pairs")
    q, k, k_hat = g.standard_normal((7, 5)), g.standard_normal((4, 5)), g.standard_normal((4, 5))
    brute = np.mean([(q[i] @ (k[j] - k_hat[j])) ** 2 for i in range(7) for j in range(4)])
    assert query_weighted_error(q, k, k_hat) == pytest.approx(brute, rel=1e-13)


# --------------------------------------------------------------------------- texts and files


def test_check_disjoint_names_the_shared_text():
    check_disjoint(["chess_club", "power_cut"], EVALUATION)
    with pytest.raises(KvasymError, match="river_walk") as info:
        check_disjoint(["chess_club", "river_walk"], EVALUATION)
    assert "chess_club" not in str(info.value)


def test_default_calibration_texts_are_the_other_shipped_texts():
    chosen = default_calibration_texts(EVALUATION)
    assert chosen == sorted(chosen) and not set(chosen) & set(EVALUATION)
    assert set(chosen) | set(EVALUATION) == set(shipped_texts()) and len(chosen) == len(shipped_texts()) - 4
    with pytest.raises(KvasymError, match="river_walks"):
        default_calibration_texts(["river_walks"])


def test_save_load_round_trip_and_refusals(tmp_path):
    qb = random_bases()
    path = save_query_bases(qb, tmp_path / "bases.npz")
    back = load_query_bases(path, "0" * 64, shape=(2, 3, D))
    np.testing.assert_array_equal(back.bases, qb.bases)
    np.testing.assert_array_equal(back.eigenvalues, qb.eigenvalues)
    assert (back.calibration_texts, back.n_positions, back.model_sha256) == (("a", "b"), 4 * D, "0" * 64)
    with pytest.raises(KvasymError, match=f"{path}.*sha256") as info:
        load_query_bases(path, "f" * 64)
    assert "f" * 64 in str(info.value)
    with pytest.raises(KvasymError, match=f"{path}.*expected \\(30, 3, 64\\)"):
        load_query_bases(path, "0" * 64, shape=(30, 3, 64))
    damaged = QueryBases(bases=qb.bases * 1.01, eigenvalues=qb.eigenvalues, calibration_texts=("a",),
                         n_positions=1, model_sha256="0" * 64)
    bad = save_query_bases(damaged, tmp_path / "damaged.npz")
    with pytest.raises(KvasymError, match=f"{bad}.*not orthogonal"):
        load_query_bases(bad, "0" * 64)
    np.savez(tmp_path / "foreign.npz", bases=qb.bases)
    with pytest.raises(KvasymError, match="foreign.npz.*not a query-bases file"):
        load_query_bases(tmp_path / "foreign.npz", "0" * 64)


def test_leave_one_text_out_bases_from_captures_are_calibrate_on_the_other_texts(model):
    """The per-head rows' bases (from the captured queries) are what calibrate() fits on the other
    texts' forward passes, at the captured layers."""
    from kvasym.real.capture import capture_text
    from kvasym.real.querybases import capture_moment_sums, leave_one_text_out_bases

    c = model.config
    texts = {"a": "The baker opened the shop before dawn and lit the old oven.",
             "b": "A bicycle chain slipped twice on the hill before the repair.",
             "c": "The river ran high after the storm, and the path was closed."}
    layers = [0, c.n_layers - 1]
    captures = {name: capture_text(model, text, name=name, max_tokens=12, layers=layers)
                for name, text in texts.items()}
    loo = leave_one_text_out_bases({n: capture_moment_sums(cap) for n, cap in captures.items()}, c.group,
                                   model.model_sha256)
    for name in texts:
        others = {o: captures[o].token_ids for o in texts if o != name}
        ref = calibrate(model, others)
        assert loo[name].calibration_texts == tuple(others) and loo[name].n_positions == ref.n_positions
        for i, layer in enumerate(layers):
            np.testing.assert_allclose(loo[name].eigenvalues[i], ref.eigenvalues[layer], rtol=1e-10,
                                       atol=1e-12 * ref.eigenvalues[layer, :, 0].max())
            np.testing.assert_allclose(loo[name].bases[i], ref.bases[layer], rtol=0, atol=1e-8)
