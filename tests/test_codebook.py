"""Lloyd-Max codebooks for the Beta coordinate law, checked against independent references.

References: Max's (1960) Gaussian table in the high-d limit, the closed-form 1-bit quantizer
(+-E|x|), the exact uniform quantizer at d = 3 (the law is uniform on [-1, 1]), the Lloyd
conditions recomputed with scipy.integrate.quad / scipy.stats.beta (not the module's closed
forms), the Panter-Dite high-resolution formula at 8 bits, and a Monte-Carlo estimate on random
unit vectors.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import integrate, stats

from kvasym import codebook as cb
from kvasym.codebook import (
    CODEBOOK_FORMAT,
    MAX_DIM,
    MAX_ITERATIONS,
    Codebook,
    compute_codebook,
    coordinate_cdf,
    coordinate_pdf,
    coordinate_sf,
    lloyd_max_codebook,
)
from kvasym.errors import KvasymError

MAX_1960 = {1: 0.3634, 2: 0.1175, 3: 0.03454, 4: 0.009497}


def beta_pdf(x: np.ndarray | float, dim: int) -> np.ndarray:
    """Coordinate density from scipy: (x + 1)/2 ~ Beta(a, a), a = (d - 1)/2."""
    a = 0.5 * (dim - 1)
    return stats.beta.pdf((np.asarray(x) + 1) / 2, a, a) / 2


def scalar_pdf(dim: int):
    """A fast pure-Python density for quad, c_d (1 - x^2)^((d-3)/2) (checked against scipy below)."""
    log_c = math.lgamma(dim / 2) - 0.5 * math.log(math.pi) - math.lgamma((dim - 1) / 2)
    power = 0.5 * (dim - 3)
    return lambda x: math.exp(log_c + power * math.log1p(-x * x)) if abs(x) < 1 else 0.0


def test_scalar_pdf_matches_scipy_beta() -> None:
    for dim in (3, 4, 6, 7, 16, 64, 128, 1024):
        f = scalar_pdf(dim)
        xs = np.linspace(-0.99, 0.99, 97) * min(1.0, 6 / math.sqrt(dim))
        np.testing.assert_allclose([f(x) for x in xs], beta_pdf(xs, dim), rtol=1e-11)


def beta_conditional_means(book: Codebook) -> tuple[np.ndarray, np.ndarray]:
    """E[x | cell] and P(cell) from scipy.stats.beta only.

    With u = (x + 1)/2 ~ Beta(a, a): E[u; p < u < q] = (1/2) P_{Beta(a+1, a)}(p < u < q).
    """
    a = 0.5 * (book.dim - 1)
    edges = np.concatenate(([-1.0], book.thresholds, [1.0]))
    p = (edges + 1) / 2
    b0, b1 = stats.beta(a, a), stats.beta(a + 1, a)

    def interval(dist):
        upper = dist.sf(p[:-1]) - dist.sf(p[1:])
        lower = dist.cdf(p[1:]) - dist.cdf(p[:-1])
        return np.where(p[:-1] >= 0.5, upper, lower)

    mass = interval(b0)
    mean_u = 0.5 * interval(b1) / mass
    return 2 * mean_u - 1, mass


def mean_abs(dim: int) -> float:
    """E|x| = Gamma(d/2) / (sqrt(pi) Gamma((d+1)/2)), accurate to ~1e-15 at any d.

    Not through gammaln (whose difference loses ~1e-12 at d = 4096): with r(d) the Gamma ratio,
    r(d + 2) = r(d) d / (d + 1), r(3) = sqrt(pi)/2, r(4) = 4 / (3 sqrt(pi)); the log of the
    product is an exactly rounded sum (math.fsum) of log1p terms.
    """
    start = 3 if dim % 2 else 4
    log_r0 = math.log(math.sqrt(math.pi) / 2) if start == 3 else math.log(4 / (3 * math.sqrt(math.pi)))
    terms = [math.log1p(-1 / (k + 1)) for k in range(start, dim, 2)]
    return math.exp(math.fsum([log_r0, *terms])) / math.sqrt(math.pi)


def test_mean_abs_reference() -> None:
    """The reference itself: E|x| by quadrature, and the exact values at d = 3 (1/2) and 4."""
    assert mean_abs(3) == pytest.approx(0.5, rel=1e-15)
    assert mean_abs(4) == pytest.approx(4 / (3 * math.pi), rel=1e-15)
    for dim in (5, 10, 64):
        quad = 2 * integrate.quad(lambda x: x * float(beta_pdf(x, dim)), 0, 1, epsabs=0, epsrel=1e-13)[0]
        assert mean_abs(dim) == pytest.approx(quad, rel=1e-11)
    # Gaussian limit sqrt(2 / (pi d))
    assert mean_abs(16384) == pytest.approx(math.sqrt(2 / (math.pi * 16384)), rel=1e-4)


# ---------------------------------------------------------------------------------------------
# the coordinate law


@pytest.mark.parametrize("dim", [3, 4, 5, 10, 64, 100, 1000, 4096])
def test_pdf_integrates_to_one_and_matches_scipy_beta(dim: int) -> None:
    sd = 1 / math.sqrt(dim)
    pts = sorted({max(-1.0, -8 * sd), 0.0, min(1.0, 8 * sd)} - {-1.0, 1.0})
    total, err = integrate.quad(lambda x: float(coordinate_pdf(x, dim)), -1, 1, points=pts, limit=200)
    assert total == pytest.approx(1.0, abs=1e-9)
    x = np.linspace(-0.999, 0.999, 401) * min(1.0, 10 * sd)
    np.testing.assert_allclose(coordinate_pdf(x, dim), beta_pdf(x, dim), rtol=1e-10)
    # second moment of a unit vector's coordinate is 1/d
    m2 = integrate.quad(lambda x: x * x * float(coordinate_pdf(x, dim)), -1, 1, points=pts, limit=200)[0]
    assert m2 == pytest.approx(1 / dim, rel=1e-8)
    assert coordinate_pdf(np.array([-1.5, 1.5, 7.0]), dim).tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("dim", [3, 4, 7, 64, 1024])
def test_cdf_sf_match_scipy(dim: int) -> None:
    a = 0.5 * (dim - 1)
    t = np.linspace(-0.99, 0.99, 199) * min(1.0, 8 / math.sqrt(dim))
    np.testing.assert_allclose(coordinate_cdf(t, dim), stats.beta.cdf((t + 1) / 2, a, a), rtol=1e-10, atol=1e-300)
    np.testing.assert_allclose(coordinate_sf(t, dim), stats.beta.sf((t + 1) / 2, a, a), rtol=1e-10, atol=1e-300)
    assert coordinate_cdf(np.array([-2.0, 2.0]), dim).tolist() == [0.0, 1.0]
    assert coordinate_sf(np.array([-2.0, 2.0]), dim).tolist() == [1.0, 0.0]


def test_empirical_coordinates_follow_the_law() -> None:
    """KS of one coordinate of normalised Gaussian vectors against the module's CDF."""
    dim = 9
    g = np.random.default_rng(1).standard_normal((4000, dim))
    u = g / np.linalg.norm(g, axis=1, keepdims=True)
    result = stats.kstest(u[:, 0], lambda t: coordinate_cdf(t, dim))
    assert result.pvalue > 1e-3


# ---------------------------------------------------------------------------------------------
# closed forms and tables


@pytest.mark.parametrize("bits", [1, 2, 3, 4])
def test_high_dimension_limit_is_max_1960(bits: int) -> None:
    book = lloyd_max_codebook(4096, bits)
    assert book.mse_per_vector == pytest.approx(MAX_1960[bits], rel=3e-3)
    # and a wrong bit count would be far off (the table drops ~4x per bit)
    assert abs(book.mse_per_vector / MAX_1960[bits] - 1) < 0.1 * abs(MAX_1960.get(bits + 1, 0) / MAX_1960[bits] - 1)


@pytest.mark.parametrize("dim", [3, 4, 5, 7, 10, 64, 128, 1000, 4096, MAX_DIM])
def test_one_bit_closed_form(dim: int) -> None:
    book = lloyd_max_codebook(dim, 1)
    e_abs = mean_abs(dim)
    # float64 floor of the module's gammaln-based normalizer: log c_d is a difference of two
    # gammaln values ~ (d/2) log(d/2) (1.4e4 at d = 4096), so it is only known to a few ulps of
    # gammaln(d/2); that is < 1e-12 relative up to d ~ 1000.
    tol = max(1e-12, 4 * math.ulp(math.lgamma(dim / 2)))
    np.testing.assert_allclose(book.centroids, [-e_abs, e_abs], rtol=tol)
    assert book.thresholds.tolist() == [0.0]
    assert abs(book.mse_per_vector - (1 - dim * e_abs**2)) < tol
    assert book.mse_per_coordinate == pytest.approx(1 / dim - e_abs**2, rel=10 * tol)


def test_one_bit_gaussian_limit() -> None:
    # 1 - 2/pi is the 1-bit Gaussian MSE (times the variance)
    assert lloyd_max_codebook(MAX_DIM, 1).mse_per_vector == pytest.approx(1 - 2 / math.pi, rel=2e-4)


@pytest.mark.parametrize("bits", range(1, 9))
def test_dimension_three_is_uniform_quantizer(bits: int) -> None:
    book = lloyd_max_codebook(3, bits)
    levels = 1 << bits
    i = np.arange(levels)
    np.testing.assert_allclose(book.centroids, (2 * i + 1) / levels - 1, rtol=0, atol=1e-13)
    np.testing.assert_allclose(book.thresholds, 2 * np.arange(1, levels) / levels - 1, rtol=0, atol=1e-13)
    step = 2 / levels
    assert book.mse_per_coordinate == pytest.approx(step**2 / 12, rel=1e-10)
    assert book.mse_per_vector == pytest.approx(3 * step**2 / 12, rel=1e-10)


def test_eight_bits_matches_panter_dite() -> None:
    """High resolution: d * C -> (sqrt(3) pi / 2) 4^-b for the Gaussian limit."""
    book = lloyd_max_codebook(4096, 8)
    assert book.mse_per_vector == pytest.approx(math.sqrt(3) * math.pi / 2 * 4.0**-8, rel=0.02)


# ---------------------------------------------------------------------------------------------
# Lloyd conditions, checked independently


CASES = [(4, 1), (4, 3), (5, 2), (7, 4), (16, 4), (64, 3), (1024, 2), (128, 5)]


@pytest.mark.parametrize(("dim", "bits"), CASES)
def test_centroid_condition_and_mse_with_quad(dim: int, bits: int) -> None:
    book = lloyd_max_codebook(dim, bits)
    edges = np.concatenate(([-1.0], book.thresholds, [1.0]))
    f = scalar_pdf(dim)
    mse = 0.0
    for i in range(book.levels):
        lo, hi = edges[i], edges[i + 1]
        mass = integrate.quad(f, lo, hi, epsabs=0, epsrel=1e-12, limit=200)[0]
        first = integrate.quad(lambda x: x * f(x), lo, hi, epsabs=0, epsrel=1e-12, limit=200)[0]
        c = book.centroids[i]
        assert abs(first / mass - c) < 1e-9 / math.sqrt(dim), (i, first / mass, c)
        mse += integrate.quad(lambda x: (x - c) ** 2 * f(x), lo, hi, epsabs=0, epsrel=1e-12, limit=200)[0]
    assert mse == pytest.approx(book.mse_per_coordinate, rel=1e-7)


@pytest.mark.parametrize("dim", [4, 64, 1000, 1024, 4096, MAX_DIM - 1, MAX_DIM])
@pytest.mark.parametrize("bits", [6, 8])
def test_centroid_condition_high_resolution(dim: int, bits: int) -> None:
    book = lloyd_max_codebook(dim, bits)
    assert book.iterations < MAX_ITERATIONS
    means, mass = beta_conditional_means(book)
    assert np.all(mass > 0)
    assert np.max(np.abs(means - book.centroids)) < 1e-9 / math.sqrt(dim)


@pytest.mark.parametrize(("dim", "bits"), [(3, 8), (4, 2), (64, 7), (100, 4), (1024, 8), (4096, 3)])
def test_structure_nearest_neighbour_and_symmetry(dim: int, bits: int) -> None:
    book = lloyd_max_codebook(dim, bits)
    levels = 1 << bits
    assert book.dim == dim and book.bits == bits and book.levels == levels
    assert book.centroids.shape == (levels,) and book.thresholds.shape == (levels - 1,)
    assert np.all(np.diff(book.centroids) > 0)
    assert -1 < book.centroids[0] and book.centroids[-1] < 1
    np.testing.assert_array_equal(book.thresholds, 0.5 * (book.centroids[:-1] + book.centroids[1:]))
    np.testing.assert_array_equal(book.centroids, -book.centroids[::-1])
    np.testing.assert_array_equal(book.thresholds, -book.thresholds[::-1])
    assert book.thresholds[levels // 2 - 1] == 0.0
    assert book.centroids[0] < book.thresholds[0] and book.thresholds[-1] < book.centroids[-1]
    assert not book.centroids.flags.writeable and not book.thresholds.flags.writeable


@pytest.mark.parametrize("dim", [3, 5, 64, 1024])
def test_mse_decreases_with_bits(dim: int) -> None:
    mses = [lloyd_max_codebook(dim, b).mse_per_vector for b in range(1, 9)]
    assert all(a > b for a, b in zip(mses, mses[1:], strict=False))
    # roughly 6 dB per bit at high resolution
    assert 3.5 < mses[6] / mses[7] < 4.5


def test_optimality_against_perturbation() -> None:
    """Moving any single threshold away from the midpoint increases the exact MSE (quad)."""
    dim, bits = 6, 2
    book = lloyd_max_codebook(dim, bits)
    f = scalar_pdf(dim)

    def mse_of(thresholds: np.ndarray) -> float:
        edges = np.concatenate(([-1.0], thresholds, [1.0]))
        total = 0.0
        for i in range(len(edges) - 1):
            lo, hi = edges[i], edges[i + 1]
            m = integrate.quad(f, lo, hi, epsabs=0, epsrel=1e-11)[0]
            c = integrate.quad(lambda x: x * f(x), lo, hi, epsabs=0, epsrel=1e-11)[0] / m
            total += integrate.quad(lambda x: (x - c) ** 2 * f(x), lo, hi, epsabs=0, epsrel=1e-11)[0]
        return total

    base = mse_of(np.asarray(book.thresholds))
    assert base == pytest.approx(book.mse_per_coordinate, rel=1e-9)
    for j in range(book.thresholds.size):
        for delta in (-0.03, 0.03):
            t = np.array(book.thresholds)
            t[j] += delta
            assert mse_of(t) > base


@pytest.mark.parametrize("bits", [1, 2, 3, 4])
def test_monte_carlo_mse_on_random_unit_vectors(bits: int) -> None:
    dim, n = 64, 20000
    book = lloyd_max_codebook(dim, bits)
    g = np.random.default_rng(100 + bits).standard_normal((n, dim))
    u = g / np.linalg.norm(g, axis=1, keepdims=True)
    codes = np.searchsorted(book.thresholds, u, side="right")
    err = np.sum((u - book.centroids[codes]) ** 2, axis=1)
    se = err.std(ddof=1) / math.sqrt(n)
    assert abs(err.mean() - book.mse_per_vector) < 5 * se
    # the check has teeth: the MSE of a neighbouring bit width is far outside the band
    for other in (bits - 1, bits + 1):
        if 1 <= other <= 8:
            assert abs(err.mean() - lloyd_max_codebook(dim, other).mse_per_vector) > 20 * se


# ---------------------------------------------------------------------------------------------
# convergence range and validation


@pytest.mark.parametrize("dim", [64, 1000, 1024, 4096, MAX_DIM])
@pytest.mark.parametrize("bits", [7, 8])
def test_high_bits_converge_up_to_max_dim(dim: int, bits: int) -> None:
    """Every (dim, bits) that validate_dim_bits accepts must be computable (MAX_DIM at 8 bits)."""
    book = compute_codebook(dim, bits)
    assert book.iterations < MAX_ITERATIONS
    assert book.centroids.size == 1 << bits
    assert 0 < book.mse_per_vector < 2e-4


@pytest.mark.parametrize("dim", [2, 1, 0, -5, MAX_DIM + 1, 3.0, 64.0, True, "64", None])
def test_bad_dim_raises(dim: object) -> None:
    with pytest.raises(KvasymError, match="dimension"):
        lloyd_max_codebook(dim, 2)  # type: ignore[arg-type]
    with pytest.raises(KvasymError, match="dimension"):
        compute_codebook(dim, 2)  # type: ignore[arg-type]


@pytest.mark.parametrize("bits", [0, -1, 9, 16, 2.0, True, "2", None])
def test_bad_bits_raises(bits: object) -> None:
    with pytest.raises(KvasymError, match="bits"):
        lloyd_max_codebook(64, bits)  # type: ignore[arg-type]


def test_numpy_integers_accepted() -> None:
    a = lloyd_max_codebook(np.int64(64), np.int32(3))
    b = lloyd_max_codebook(64, 3)
    np.testing.assert_array_equal(a.centroids, b.centroids)
    assert type(a.dim) is int and type(a.bits) is int


# ---------------------------------------------------------------------------------------------
# caching


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KVASYM_CACHE_DIR", str(tmp_path))
    cb._cached_codebook.cache_clear()
    yield tmp_path / "codebooks"
    cb._cached_codebook.cache_clear()


def cache_file(root, dim: int, bits: int):
    return root / f"beta_lloyd_max_v{CODEBOOK_FORMAT}_d{dim}_b{bits}.json"


def test_cache_dir_from_environment(fresh_cache, monkeypatch, tmp_path) -> None:
    assert cb.cache_dir() == fresh_cache
    monkeypatch.delenv("KVASYM_CACHE_DIR")
    assert cb.cache_dir().parts[-2:] == ("kvasym", "codebooks")


def test_disk_cache_written_then_read(fresh_cache, monkeypatch) -> None:
    calls = []
    real = cb.compute_codebook

    def counting(dim, bits):
        calls.append((dim, bits))
        return real(dim, bits)

    monkeypatch.setattr(cb, "compute_codebook", counting)
    first = lloyd_max_codebook(37, 3)
    assert calls == [(37, 3)]
    path = cache_file(fresh_cache, 37, 3)
    data = json.loads(path.read_text())
    assert data["format"] == CODEBOOK_FORMAT and data["dim"] == 37 and data["bits"] == 3
    np.testing.assert_array_equal(data["centroids"], first.centroids)
    assert data["mse"] == first.mse_per_vector
    # in-memory cache: no recompute, same object
    assert lloyd_max_codebook(37, 3) is first
    # disk cache: clear memory, forbid computing, read back bit-identical
    cb._cached_codebook.cache_clear()

    def forbidden(dim, bits):
        raise AssertionError("must read the disk cache, not recompute")

    monkeypatch.setattr(cb, "compute_codebook", forbidden)
    second = lloyd_max_codebook(37, 3)
    assert second is not first
    np.testing.assert_array_equal(second.centroids, first.centroids)
    np.testing.assert_array_equal(second.thresholds, first.thresholds)
    assert second.mse_per_coordinate == first.mse_per_coordinate
    assert second.iterations == first.iterations
    assert not second.centroids.flags.writeable


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "",
        "[1, 2, 3]",  # valid JSON, not an object
        "null",
        "42",
        json.dumps({"format": CODEBOOK_FORMAT + 1}),
        "STALE_FORMAT",
        "WRONG_DIM",
        "MISSING_KEY",
    ],
)
def test_corrupt_or_stale_cache_file_is_recomputed(fresh_cache, monkeypatch, content: str) -> None:
    dim, bits = 19, 2
    good = compute_codebook(dim, bits)
    if content == "STALE_FORMAT":
        data = good.to_json()
        data["format"] = CODEBOOK_FORMAT - 1
        data["centroids"] = [-0.5, -0.1, 0.1, 0.5]
        content = json.dumps(data)
    elif content == "WRONG_DIM":
        data = compute_codebook(20, bits).to_json()
        data["dim"] = 20
        content = json.dumps(data)
    elif content == "MISSING_KEY":
        data = good.to_json()
        del data["thresholds"]
        content = json.dumps(data)
    path = cache_file(fresh_cache, dim, bits)
    path.parent.mkdir(parents=True)
    path.write_text(content)
    calls = []
    real = cb.compute_codebook
    monkeypatch.setattr(cb, "compute_codebook", lambda d, b: calls.append((d, b)) or real(d, b))
    book = lloyd_max_codebook(dim, bits)
    assert calls == [(dim, bits)]
    np.testing.assert_array_equal(book.centroids, good.centroids)
    # and the file was rewritten with the good codebook
    data = json.loads(path.read_text())
    np.testing.assert_array_equal(data["centroids"], good.centroids)


def test_no_disk_cache_flag(fresh_cache) -> None:
    book = lloyd_max_codebook(23, 2, use_disk_cache=False)
    assert not cache_file(fresh_cache, 23, 2).exists()
    np.testing.assert_array_equal(book.centroids, compute_codebook(23, 2).centroids)


def test_unwritable_cache_dir_does_not_fail(tmp_path, monkeypatch) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    monkeypatch.setenv("KVASYM_CACHE_DIR", str(blocker / "sub"))
    cb._cached_codebook.cache_clear()
    try:
        book = lloyd_max_codebook(29, 2)
        np.testing.assert_array_equal(book.centroids, compute_codebook(29, 2).centroids)
    finally:
        cb._cached_codebook.cache_clear()


def test_json_round_trip() -> None:
    book = compute_codebook(50, 4)
    back = Codebook.from_json(json.loads(json.dumps(book.to_json())))
    np.testing.assert_array_equal(back.centroids, book.centroids)
    np.testing.assert_array_equal(back.thresholds, book.thresholds)
    assert back.mse_per_vector == book.mse_per_vector
