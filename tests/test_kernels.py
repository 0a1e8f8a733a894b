"""The compiled kernels (kvasym.kernels) against the numpy reference path of kvasym.cache.

References: the numpy path (whole-array passes, tested against theory and brute force in
test_cache/test_rotation/test_scalar/test_packing) and np.searchsorted for the threshold rule.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvasym import kernels
from kvasym.cache import quantize
from kvasym.codebook import lloyd_max_codebook
from kvasym.errors import KvasymError
from kvasym.packing import pack_codes, unpack_codes
from kvasym.rotation import RandomizedHadamard, next_power_of_two
from kvasym.schemes import SideSpec

pytest.importorskip("numba")

ROT = SideSpec(rotate=True, scalar_offset=0, qjl=False)
RAW = SideSpec(rotate=False, scalar_offset=0, qjl=False)
QJL = SideSpec(rotate=True, scalar_offset=1, qjl=True)
DIMS = [3, 5, 12, 64, 100, 128, 1024]


def _pair(x: np.ndarray, spec: SideSpec, bits: int, **kwargs):
    ref = quantize(x, spec, bits, rotation_seed=11, qjl_seed=12, **kwargs)
    fast = quantize(x, spec, bits, rotation_seed=11, qjl_seed=12, kernel="numba", **kwargs)
    return ref, fast


QJL_H = SideSpec(rotate=True, scalar_offset=1, qjl=True, sketch="hadamard")


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("spec", [ROT, RAW, QJL, QJL_H], ids=["rotated", "unrotated", "qjl", "qjl-hadamard"])
def test_float64_packed_caches_are_byte_identical(dim: int, spec: SideSpec) -> None:
    """The study's data is float64: there the kernel must write the reference's bytes (codes,
    norms, and on QJL sides the sketch's sign bits and its stored float)."""
    x = np.random.default_rng(dim).standard_normal((300, dim)) * np.linspace(0.01, 50, 300)[:, None]
    for bits in range(1, 9):  # n = 1 on a QJL side: the sketch alone
        ref, fast = _pair(x, spec, bits)
        assert fast.codes.dtype == np.uint8 and fast.codes.shape == ref.codes.shape
        assert np.array_equal(fast.codes, ref.codes), (dim, bits)
        assert np.array_equal(fast.norms, ref.norms)
        assert fast.arrays().keys() == ref.arrays().keys()
        near_zero_flips = spec.sketch == "hadamard" and not np.array_equal(fast.qjl_signs, ref.qjl_signs)
        if near_zero_flips:
            _signs_differ_only_at_zero_projections(x, ref, fast, dim)
        for name, array in ref.arrays().items():
            if near_zero_flips and name in ("qjl_signs", "header"):  # the header holds their digest
                continue
            assert np.array_equal(fast.arrays()[name], array), name


def _signs_differ_only_at_zero_projections(x: np.ndarray, ref, fast, dim: int) -> None:
    """A hadamard sketch bit may differ only where the reference's projection W r is 0 up to
    rounding: tiny dimensions (D = 4) give residuals whose projections cancel exactly, and the
    butterfly and the factored matmul then leave +-1e-17 of opposite signs."""
    from kvasym.packing import unpack_signs
    from kvasym.sketch import HadamardSketch

    differ = unpack_signs(ref.qjl_signs, ref.work_dim) != unpack_signs(fast.qjl_signs, ref.work_dim)
    unit = _rotated_reference(x, ref, dim)
    residual = unit
    if ref.scalar_bits:
        book = lloyd_max_codebook(ref.work_dim, ref.scalar_bits)
        residual = unit - book.centroids[unpack_codes(ref.codes, ref.scalar_bits, ref.work_dim)]
    first, second = HadamardSketch(ref.work_dim, ref.qjl_seed)._rotations()
    projections = second.forward(first.forward(residual))
    bound = 1e-13 * np.linalg.norm(residual, axis=1, keepdims=True) * np.ones_like(projections)
    assert np.all(np.abs(projections[differ]) <= bound[differ])
    if ref.work_dim >= 16:  # at D = 4 a padded 3-vector's projections cancel to 0 by the percent
        assert differ.mean() < 1e-3


def _rotated_reference(x: np.ndarray, cache, dim: int) -> np.ndarray:
    """The reference's rotated unit vectors (what its encoder compares with the thresholds)."""
    inv = 1.0 / cache.norms.astype(np.float64)
    return RandomizedHadamard(dim, 11).forward(x * inv.astype(x.dtype)[:, None])


@pytest.mark.parametrize("dim", [64, 128, 1024])
def test_float32_codes_differ_only_at_near_ties(dim: int) -> None:
    """float32 butterflies and float32 matmuls add in different orders: a code may move by one
    only where the reference's rotated value lies within the WHT's rounding error of a
    threshold. Count them."""
    x = np.random.default_rng(7).standard_normal((4096, dim)).astype(np.float32)
    total = mismatched = 0
    for bits in (2, 4, 8):
        ref, fast = _pair(x, ROT, bits)
        work = next_power_of_two(dim)
        a, b = unpack_codes(ref.codes, bits, work), unpack_codes(fast.codes, bits, work)
        diff = np.argwhere(a != b)
        total += a.size
        mismatched += len(diff)
        if len(diff):
            u = _rotated_reference(x, ref, dim)
            thresholds = lloyd_max_codebook(work, bits).thresholds.astype(np.float32)
            for row, col in diff:
                assert abs(int(a[row, col]) - int(b[row, col])) == 1
                value = u[row, col]
                nearest = thresholds[np.argmin(np.abs(thresholds - value))]
                # the forward-error bound of a D-point WHT of a unit vector, summed in either
                # order: log2(D) roundings of partial sums of size <= 1 each, twice
                assert abs(value - nearest) <= 2 * np.log2(work) * np.finfo(np.float32).eps, (bits, value, nearest)
    assert mismatched <= 1e-5 * total, f"{mismatched} of {total} codes differ"


def test_a_value_equal_to_a_threshold_goes_up_as_in_searchsorted() -> None:
    """Exact ties: the kernel's rule is np.searchsorted(..., side="right"), like the reference."""
    for bits in range(1, 9):
        thresholds = lloyd_max_codebook(64, bits).thresholds
        values = np.concatenate([thresholds, np.nextafter(thresholds, -np.inf), np.nextafter(thresholds, np.inf),
                                 [-1.0, 1.0, 0.0]])
        pad = (-values.size) % 8
        x = np.concatenate([values, np.zeros(pad)])[None, :]
        got = unpack_codes(kernels.encode_batch(x, np.ones(1), None, thresholds, bits), bits, x.shape[1])
        want = np.searchsorted(thresholds, x, side="right").astype(np.uint8)
        assert np.array_equal(got, want), bits
        assert np.array_equal(kernels.encode_batch(x, np.ones(1), None, thresholds, bits), pack_codes(want, bits))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("dim", DIMS)
def test_reconstructions_agree_to_float_rounding(dtype: str, dim: int) -> None:
    x = np.random.default_rng(3).standard_normal((200, dim)).astype(dtype)
    eps = np.finfo(dtype).eps
    qjl_hadamard = SideSpec(rotate=True, scalar_offset=1, qjl=True, sketch="hadamard")
    for spec in (ROT, RAW, QJL, qjl_hadamard):
        for bits in (2, 4, 8):
            cache = quantize(x, spec, bits, rotation_seed=11, qjl_seed=12)
            ref = cache.dequantize(dtype)
            fast = cache.dequantize(dtype, kernel="numba")
            assert fast.dtype == ref.dtype and fast.shape == ref.shape == x.shape
            scale = cache.norms.astype(np.float64)[:, None]
            # a WHT of D terms in another order: a few D * eps of the row's norm
            tolerance = 4 * next_power_of_two(dim) * eps * scale
            assert np.all(np.abs(fast - ref) <= tolerance), (spec, bits)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("dim", [4, 16, 64, 128, 1024])
def test_hadamard_sketch_kernels_against_the_sketch_class(dtype: str, dim: int) -> None:
    """On the same residuals: the same sign bits, rho and r_hat to the dtype's rounding of the
    2 log2(D) butterfly stages (and the float64 sums, which run in another order)."""
    from kvasym.sketch import HadamardSketch

    gen = np.random.default_rng(dim)
    residual = (gen.standard_normal((203, dim)) * gen.uniform(0, 3, (203, 1))).astype(dtype)
    residual[7] = 0.0
    sketch = HadamardSketch(dim, 99)
    want_signs, want_rho = sketch.encode(residual)
    signs, rho = kernels.hadamard_sketch_encode(residual, *sketch.rotation_signs)
    assert signs.dtype == np.uint8 and signs.shape == want_signs.shape
    assert np.array_equal(signs, want_signs)
    # |W r| carries the dtype's rounding of 2 log2(D) butterfly stages; the float64 sums, 1e-13
    np.testing.assert_allclose(rho, want_rho, rtol=4 * np.log2(dim) * np.finfo(dtype).eps + 1e-13, atol=0)
    assert rho[7] == 0.0
    want = sketch.decode(want_signs, want_rho.astype(np.float32), dtype)
    got = kernels.hadamard_sketch_decode(want_signs, want_rho.astype(np.float32), *sketch.rotation_signs, dtype)
    assert got.dtype == want.dtype and got.shape == want.shape
    eps = np.finfo(dtype).eps
    bound = 4 * np.log2(dim) * eps * want_rho.astype(np.float32)[:, None] + 1e-300
    assert np.all(np.abs(got - want) <= bound)
    # teeth: another sketch seed gives other bits
    other = HadamardSketch(dim, 100)
    assert not np.array_equal(kernels.hadamard_sketch_encode(residual, *other.rotation_signs)[0], signs)


def test_float32_qjl_sides_agree_to_rounding() -> None:
    """float32: the residual inherits the WHT's summation order, so a stored residual norm or rho
    may differ in its last float32 bits and a sign or code only at a near-tie; the
    reconstructions agree to float32 rounding."""
    x = np.random.default_rng(8).standard_normal((2000, 128)).astype(np.float32)
    for spec in (QJL, QJL_H):
        ref, fast = _pair(x, spec, 4)
        assert (ref.codes != fast.codes).sum() <= 2 and (ref.qjl_signs != fast.qjl_signs).sum() <= 4
        np.testing.assert_allclose(fast.residual_norms, ref.residual_norms, rtol=1e-5)
        a, b = ref.dequantize("float32"), fast.dequantize("float32", kernel="numba")
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5 * float(np.abs(x).max()))


def test_threads_give_bit_identical_results() -> None:
    x = np.random.default_rng(5).standard_normal((1001, 128))
    one = quantize(x, ROT, 4, rotation_seed=1, qjl_seed=2, kernel="numba")
    for threads in (2, 3, 7):
        many = quantize(x, ROT, 4, rotation_seed=1, qjl_seed=2, kernel="numba", threads=threads)
        assert np.array_equal(one.codes, many.codes)
        assert np.array_equal(one.dequantize(kernel="numba"), many.dequantize(kernel="numba", threads=threads))
    hadamard = quantize(x, QJL_H, 4, rotation_seed=1, qjl_seed=2, kernel="numba")
    for threads in (2, 5):
        many = quantize(x, QJL_H, 4, rotation_seed=1, qjl_seed=2, kernel="numba", threads=threads)
        for name in ("codes", "qjl_signs", "residual_norms"):
            assert np.array_equal(getattr(hadamard, name), getattr(many, name)), name
        assert np.array_equal(hadamard.dequantize(kernel="numba"), many.dequantize(kernel="numba", threads=threads))


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 40), dim=st.integers(3, 80), bits=st.integers(1, 8), rotate=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_kernel_round_trip_matches_the_reference(rows: int, dim: int, bits: int, rotate: bool, seed: int) -> None:
    x = np.random.default_rng(seed).standard_normal((rows, dim))
    spec = ROT if rotate else RAW
    ref, fast = _pair(x, spec, bits)
    assert np.array_equal(ref.codes, fast.codes)
    np.testing.assert_allclose(fast.dequantize(kernel="numba"), ref.dequantize(), rtol=0, atol=1e-12 * dim)


def test_bad_kernel_arguments_are_refused() -> None:
    x = np.ones((2, 8))
    with pytest.raises(KvasymError, match="kernel must be one of numpy, numba, got 'fast'"):
        quantize(x, ROT, 4, rotation_seed=1, qjl_seed=2, kernel="fast")
    with pytest.raises(KvasymError, match="threads must be an integer in 1..1024, got 0"):
        quantize(x, ROT, 4, rotation_seed=1, qjl_seed=2, kernel="numba", threads=0)
    with pytest.raises(KvasymError, match=r"kernel must be one of numpy, numba, got array\(\['numba', 'x'\]"):
        quantize(x, ROT, 4, rotation_seed=1, qjl_seed=2, kernel=np.array(["numba", "x"]))
    with pytest.raises(KvasymError, match="threads must be an integer in 1..1024, got 0"):
        quantize(x, ROT, 4, rotation_seed=1, qjl_seed=2, threads=0)  # checked on either path
    cache = quantize(x, ROT, 4, rotation_seed=1, qjl_seed=2)
    with pytest.raises(KvasymError, match="kernel must be one of"):
        cache.dequantize(kernel="c")
    with pytest.raises(KvasymError, match="4-bit codes need 15 thresholds, got 3"):
        kernels.encode_batch(x, np.ones(2), None, np.array([-0.1, 0.0, 0.1]), 4)


def test_cli_kernel_flag_writes_the_reference_cache(tmp_path, capsys) -> None:
    from kvasym.cache import load_packed
    from kvasym.cli import main

    x = np.random.default_rng(9).standard_normal((257, 96))
    np.save(tmp_path / "k.npy", x)
    for kernel in ("numpy", "numba"):
        assert main(["quantize", "--scheme", "RKV", "--bits", "3", "--side", "K", "--kernel", kernel,
                     "--threads", "2", str(tmp_path / "k.npy"), str(tmp_path / f"{kernel}.npz")]) == 0
        assert main(["dequantize", "--dtype", "float64", "--kernel", kernel, str(tmp_path / f"{kernel}.npz"),
                     str(tmp_path / f"{kernel}.npy")]) == 0
    ref, fast = load_packed(tmp_path / "numpy.npz")["K"], load_packed(tmp_path / "numba.npz")["K"]
    for name, array in ref.arrays().items():
        assert np.array_equal(fast.arrays()[name], array), name
    np.testing.assert_allclose(np.load(tmp_path / "numba.npy"), np.load(tmp_path / "numpy.npy"), rtol=0, atol=1e-12)
    with pytest.raises(SystemExit):
        main(["quantize", "--scheme", "RKV", "--bits", "3", "--side", "K", "--threads", "0",
              str(tmp_path / "k.npy"), str(tmp_path / "t.npz")])
    assert "threads must be an integer in 1..1024, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fused_norms_equal_the_reference_norms(dtype: str) -> None:
    """The fused encode sums the squares in row order, numpy's einsum in its own: the float64
    norms agree to a few ulps, and the float32 stored norms (what the file keeps) are equal on
    every one of 200,000 rows spanning 16 decades of scale."""
    from kvasym.cache import row_norms

    rng = np.random.default_rng(21)
    x = (rng.standard_normal((200_000, 48)) * 10.0 ** rng.uniform(-8, 8, (200_000, 1))).astype(dtype)
    fused = kernels.encode_batch_with_norms(x, RandomizedHadamard(48, 3).signs, lloyd_max_codebook(64, 3).thresholds, 3)
    assert fused is not None
    _, _, exact, stored = fused
    reference = row_norms(x)
    np.testing.assert_allclose(exact, reference, rtol=8 * np.finfo(np.float64).eps, atol=0)
    assert stored.dtype == np.float32 and np.array_equal(stored, reference.astype(np.float32))
    ref = quantize(x[:5000], ROT, 3, rotation_seed=3, qjl_seed=4)
    fast = quantize(x[:5000], ROT, 3, rotation_seed=3, qjl_seed=4, kernel="numba")
    assert np.array_equal(ref.norms, fast.norms) and np.array_equal(ref.codes, fast.codes)


@pytest.mark.parametrize("case", ["nan", "inf", "tiny32", "huge64", "tiny64", "underflow64", "subnormal64", "zero",
                                  "float16", "above32max"])
def test_rows_the_fused_pass_declines_go_the_reference_way(case: str) -> None:
    """A row the fused pass cannot normalize as the reference does (a non-finite value, a
    float32 norm whose reciprocal overflows, float64 squares outside the plain sum's range) makes
    it decline, and quantize then gives the reference's result or the reference's error; zero
    rows and float16 norms need no decline and still equal the reference."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((100, 64))
    norm_dtype = "float32"
    if case in ("nan", "inf"):
        x[77, 5] = np.nan if case == "nan" else -np.inf
        x[90, 1] = np.inf
        for kernel in ("numpy", "numba"):
            with pytest.raises(KvasymError, match=r"input has 2 non-finite values \(first at row 77, column 5\)"):
                quantize(x, ROT, 4, rotation_seed=1, qjl_seed=2, kernel=kernel)
        assert kernels.encode_batch_with_norms(x, None, lloyd_max_codebook(64, 4).thresholds, 4) is None
        return
    if case == "tiny32":
        x = x.astype(np.float32)
        x[40] *= np.float32(1e-40)  # subnormal float32 entries: 1/norm overflows float32
    elif case == "huge64":
        x[40] *= 1e200  # its squares overflow float64 (the reference rescales the row, then refuses it)
    elif case == "tiny64":
        x[40] *= 1e-160  # its squares underflow to subnormals
    elif case == "underflow64":
        # every square underflows to exactly 0: the fused pass saw a zero row and stored norm 0,
        # losing the row with exit 0, where the reference refuses (issue 33, point 2)
        x[40] *= 1e-170
    elif case == "subnormal64":
        x[40] = 0.0
        x[40, 3] = 5e-324  # float64's smallest subnormal: its square is 0
    elif case == "zero":
        x[40] = 0.0
    elif case == "above32max":  # a norm that float32 would round down to its max: refused all the same
        top = float(np.finfo(np.float32).max)
        x[40] = 0.0
        x[40, 3] = top * (1 + 2.0 ** -26)
        assert np.float32(x[40, 3]) == np.float32(top) and x[40, 3] > top
    else:
        norm_dtype = "float16"
    declined = case in ("tiny32", "huge64", "tiny64", "underflow64", "subnormal64", "above32max")
    if norm_dtype == "float32":
        fused = kernels.encode_batch_with_norms(x, RandomizedHadamard(64, 1).signs,
                                                lloyd_max_codebook(64, 4).thresholds, 4)
        assert (fused is None) == declined
    if case in ("huge64", "tiny64", "underflow64", "subnormal64", "above32max"):
        # norms beyond float32 (the widest storage): both refuse alike
        errors = []
        for kernel in ("numpy", "numba"):
            with pytest.raises(KvasymError) as info:
                quantize(x, ROT, 4, rotation_seed=1, qjl_seed=2, kernel=kernel)
            errors.append(str(info.value))
        assert errors[0] == errors[1] and "norm of row 40" in errors[0]
        return
    for spec in (ROT, QJL):
        ref = quantize(x, spec, 4, rotation_seed=1, qjl_seed=2, norm_dtype=norm_dtype)
        fast = quantize(x, spec, 4, rotation_seed=1, qjl_seed=2, norm_dtype=norm_dtype, kernel="numba")
        for name, array in ref.arrays().items():
            assert np.array_equal(fast.arrays()[name], array), (case, name)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("dim", [5, 64, 100, 1024])
def test_fused_hadamard_sketch_equals_the_separate_kernels_bit_for_bit(dtype: str, dim: int) -> None:
    """The sketch taken from the encode's block buffer, and its decode added inside the decode
    pass, are the separate kernels' passes on the same values: equal bits, not just close."""
    from kvasym.sketch import HadamardSketch

    x = np.random.default_rng(dim).standard_normal((300, dim)).astype(dtype)
    work = next_power_of_two(dim)
    signs = RandomizedHadamard(dim, 4).signs
    book = lloyd_max_codebook(work, 3)
    s1, s2 = HadamardSketch(work, 9).rotation_signs
    fused = kernels.encode_batch_with_norms(x, signs, book.thresholds, 3, centroids=book.centroids,
                                            hadamard_sketch=(s1, s2))
    assert fused is not None
    packed, (sk_signs, rho), _, stored = fused
    inv = 1.0 / stored.astype(np.float64)
    separate, residual = kernels.encode_batch(x, inv, signs, book.thresholds, 3, centroids=book.centroids)
    want_signs, want_rho = kernels.hadamard_sketch_encode(residual, s1, s2)
    assert np.array_equal(packed, separate)
    assert np.array_equal(sk_signs, want_signs) and np.array_equal(rho, want_rho)
    stored_rho = rho.astype(np.float32).astype(np.float64)
    add = kernels.hadamard_sketch_decode(sk_signs, stored_rho, s1, s2, dtype)
    want = kernels.decode_batch(packed, 3, book.centroids, signs, stored, dim, dtype, add=add)
    got = kernels.decode_batch(packed, 3, book.centroids, signs, stored, dim, dtype,
                               hadamard_sketch=(sk_signs, stored_rho, s1, s2))
    assert got.dtype == np.dtype(dtype) and np.array_equal(got, want)
    with pytest.raises(KvasymError, match="add or hadamard_sketch, not both"):
        kernels.decode_batch(packed, 3, book.centroids, signs, stored, dim, dtype, add=add,
                             hadamard_sketch=(sk_signs, stored_rho, s1, s2))
    with pytest.raises(KvasymError, match="needs the codebook's centroids"):
        kernels.encode_batch_with_norms(x, signs, book.thresholds, 3, hadamard_sketch=(s1, s2))


def _radix2_wht_columns(u: np.ndarray) -> np.ndarray:
    """The textbook in-place radix-2 butterfly on the columns of u, stage h = 1, 2, 4, ...
    (upper = a + c, lower = a - c), in numpy: the reference order of additions."""
    u = u.copy()
    n = u.shape[0]
    h = 1
    while h < n:
        blocks = u.reshape(n // (2 * h), 2, h, u.shape[1])
        a, c = blocks[:, 0].copy(), blocks[:, 1].copy()
        blocks[:, 0], blocks[:, 1] = a + c, a - c
        h *= 2
    return u


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_radix_8_wht_adds_in_the_radix_2_order(dtype) -> None:
    """fwht_block fuses stages into radix-8 and radix-4 passes; each output must be the
    radix-2 sequence's, bit for bit (so the fusion changes no code and no reconstruction),
    for every power of two up to 4096 (0, 1 or 2 stages left after the radix-8 passes)."""
    from kvasym import _kernels_numba

    rng = np.random.default_rng(13)
    for n in [2 ** k for k in range(13)]:
        u = rng.standard_normal((n, _kernels_numba.BLOCK)).astype(dtype)
        got = u.copy()
        _kernels_numba.fwht_block(got, _kernels_numba.BLOCK)
        assert np.array_equal(got.view(np.uint8), _radix2_wht_columns(u).view(np.uint8)), n
    u = rng.standard_normal((64, _kernels_numba.BLOCK)).astype(dtype)
    part = u.copy()
    _kernels_numba.fwht_block(part, 5)  # a partial block: only the first 5 columns move
    assert np.array_equal(part[:, :5], _radix2_wht_columns(u)[:, :5]) and np.array_equal(part[:, 5:], u[:, 5:])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n_thresholds", [1, 2, 3, 5, 7, 15, 31, 255])
def test_threshold_codes_count_the_thresholds_at_or_below_each_value(dtype, n_thresholds: int) -> None:
    """Every code path of the threshold count (written out for 1, 3, 7 and 15 thresholds, a
    loop for other counts below 15, a binary search above) is np.searchsorted(side="right"),
    ties included: a value equal to a threshold, and its float neighbours on either side."""
    from kvasym._kernels_numba import BLOCK, threshold_codes

    rng = np.random.default_rng(n_thresholds)
    thresholds = np.sort(rng.standard_normal(n_thresholds)).astype(dtype)
    at = rng.choice(thresholds, 3 * BLOCK * 8)
    ties = np.concatenate([at, np.nextafter(at, -np.inf), np.nextafter(at, np.inf)])
    values = np.concatenate([ties, 3 * rng.standard_normal(ties.size)]).astype(dtype)
    u = values.reshape(-1, BLOCK)
    work, width = u.shape[0], BLOCK - 3  # a partial block: the last 3 lanes stay untouched
    codes = np.full(u.shape, 255, dtype=np.uint8)
    threshold_codes(u, codes, np.zeros(BLOCK, dtype=np.int32), thresholds, width, work)
    expected = np.searchsorted(thresholds, u[:, :width], side="right")
    assert np.array_equal(codes[:, :width], expected)
    assert (codes[:, width:] == 255).all()


@settings(max_examples=60, deadline=None)
@given(bits=st.integers(1, 8), groups=st.integers(1, 5), width=st.integers(1, 32), seed=st.integers(0, 2**32 - 1))
def test_word_packing_is_pack_codes_and_its_inverse(bits: int, groups: int, width: int, seed: int) -> None:
    """pack_words / unpack_words (the path of a working dimension divisible by 32) against
    kvasym.packing: the same bytes as pack_codes for every width 1..8 (3, 5, 6 and 7 bits have
    codes straddling two words), each code's centroid back, and a partial block leaves the other
    rows of the packed array and the other lanes of the buffer untouched."""
    from kvasym._kernels_numba import BLOCK, pack_words, unpack_words

    rng = np.random.default_rng(seed)
    work = 32 * groups
    rows = BLOCK + 3
    codes = rng.integers(0, 1 << bits, (rows, work)).astype(np.uint8)
    start = 2
    buffer = np.ascontiguousarray(codes[start:start + BLOCK].T)  # (work, BLOCK), as encode_rows holds it
    out = np.full((rows, work * bits // 8), 0xA5, dtype=np.uint8)
    pack_words(buffer, out.view(np.uint32), start, width, work, bits, np.zeros(BLOCK, dtype=np.uint32))
    want = pack_codes(codes, bits)
    assert np.array_equal(out[start:start + width], want[start:start + width])
    assert (out[:start] == 0xA5).all() and (out[start + width:] == 0xA5).all()
    centroids = rng.standard_normal(1 << bits).astype(np.float32)
    shifted = np.zeros(want.size + 1, dtype=np.uint8)[1:].reshape(want.shape)  # words at odd addresses
    shifted[...] = want
    for packed in (want, shifted):
        u = np.full((work, BLOCK), -7.0, dtype=np.float32)
        unpack_words(packed.view(np.uint32), start, width, work, bits, centroids, u,
                     np.full((8, BLOCK), 0xFFFFFFFF, dtype=np.uint32))
        assert np.array_equal(u[:, :width], centroids[codes[start:start + width]].T)
        assert (u[:, width:] == -7.0).all()


@settings(max_examples=60, deadline=None)
@given(dim=st.sampled_from([1, 2, 15, 16, 17, 31, 32, 33, 100, 128, 129, 256, 1024]), width=st.integers(1, 32),
       start=st.integers(0, 5), f64=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_the_transposing_load_and_the_factored_store(dim: int, width: int, start: int, f64: bool, seed: int) -> None:
    """load_rows (unsigned indices, TILE coordinates at a time: dims at and around the tile and
    not a multiple of it) puts rows start .. start + width of x into the buffer's columns and
    touches nothing else; store_scaled_rows stores row b as u[:, b] * scale_b, and with factors
    (decode_rows' fused last pass) as (u[:, b] * factors) * scale_b, numpy's two roundings in
    the dtype bit for bit, and leaves the other rows of the output alone."""
    from kvasym._kernels_numba import BLOCK, load_rows, store_scaled_rows

    dtype = np.float64 if f64 else np.float32
    rng = np.random.default_rng(seed)
    rows = start + width + 2
    x = rng.standard_normal((rows, dim)).astype(dtype)
    u = np.full((dim + 3, BLOCK), -7.0, dtype=dtype)
    load_rows(x, u, start, width, dim)
    assert np.array_equal(u[:dim, :width], x[start:start + width].T)
    assert (u[dim:] == -7.0).all() and (u[:, width:] == -7.0).all()
    factors = (rng.choice([-1.0, 1.0], dim) / np.sqrt(dim)).astype(dtype)
    scales = rng.lognormal(0.0, 2.0, rows).astype(dtype)
    for fac in (factors, None):
        out = np.full((rows, dim), 5.0, dtype=dtype)
        store_scaled_rows(u, fac, scales, out, start, width, dim)
        block = u[:dim, :width].T if fac is None else u[:dim, :width].T * fac
        want = np.ascontiguousarray(block * scales[start:start + width, None])
        assert want.dtype == dtype
        assert np.array_equal(out[start:start + width].view(np.uint8), want.view(np.uint8))
        assert (out[:start] == 5.0).all() and (out[start + width:] == 5.0).all()


@settings(max_examples=80, deadline=None)
@given(n_thresholds=st.sampled_from([7, 15]), f64=st.booleans(), repeats=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_the_halved_threshold_counts_are_the_plain_counts(n_thresholds: int, f64: bool, repeats: bool,
                                                          seed: int) -> None:
    """threshold_codes' 7- and 15-threshold paths pick a half (and for 15 a quarter) with the
    middle thresholds, then count in it: that must be #{t : t <= x}, counted plainly, for any
    non-decreasing thresholds (repeated ones too) and any value: ties, their float neighbours,
    +-0, +-inf and NaN (no threshold is at or below NaN: code 0)."""
    from kvasym._kernels_numba import BLOCK, threshold_codes

    dtype = np.float64 if f64 else np.float32
    rng = np.random.default_rng(seed)
    pool = rng.standard_normal(4 if repeats else n_thresholds)
    thresholds = np.sort(rng.choice(pool, n_thresholds, replace=repeats)).astype(dtype)
    at = rng.choice(thresholds, 2 * BLOCK)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan] * 4)
    values = np.concatenate([at, np.nextafter(at, -np.inf), np.nextafter(at, np.inf), special,
                             2 * rng.standard_normal(BLOCK * 8 - special.size)]).astype(dtype)
    rng.shuffle(values)
    u = values.reshape(-1, BLOCK)
    codes = np.full(u.shape, 255, dtype=np.uint8)
    threshold_codes(u, codes, np.zeros(BLOCK, dtype=np.int32), thresholds, BLOCK, u.shape[0])
    expected = (thresholds[None, None, :] <= u[:, :, None]).sum(axis=2)
    assert np.array_equal(codes, expected)


@settings(max_examples=40, deadline=None)
@given(log_dim=st.integers(0, 8), rows=st.integers(1, 70), f64=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_the_hadamard_sketch_decode_is_the_radix_2_passes_bit_for_bit(log_dim: int, rows: int, f64: bool,
                                                                      seed: int) -> None:
    """hadamard_sketch_decode and decode_batch's fused sketch term (which apply the last sign and
    1/sqrt(D) factor in the pass that scales the row by rho / sqrt(D)) against numpy with the
    textbook butterfly: +-1 from the bits, H, times signs2 / sqrt(D), H, times signs1 /
    sqrt(D), times rho / sqrt(D), each product rounded to the dtype in that order; bit for bit,
    for D = 1 .. 256 (the byte path below 32, the 32-bit word path from 32) and partial blocks."""
    from kvasym.packing import pack_signs

    dtype = np.float64 if f64 else np.float32
    work = 1 << log_dim
    rng = np.random.default_rng(seed)
    negative = rng.random((rows, work)) < 0.5
    bits = pack_signs(negative)
    rho = rng.lognormal(0.0, 1.0, rows).astype(np.float32).astype(np.float64)
    s1, s2 = (rng.choice([-1.0, 1.0], work) for _ in range(2))
    f2, f1, row = kernels._sketch_decode_scales(rho, s1, s2, np.dtype(dtype))
    w = np.where(negative, -1.0, 1.0).astype(dtype).T
    w = _radix2_wht_columns(w) * f2[:, None]
    w = _radix2_wht_columns(w) * f1[:, None]
    want = np.ascontiguousarray((w * row[None, :]).T)
    assert want.dtype == dtype
    got = kernels.hadamard_sketch_decode(bits, rho, s1, s2, dtype)
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
    # the fused term: with zero codes of a 1-bit codebook whose centroids are 0 and norms 1, the
    # unrotated decode returns exactly 0 + the sketch term (so -0.0 comes back as +0.0)
    codes = np.zeros((rows, -(-work // 8)), dtype=np.uint8)
    fused = kernels.decode_batch(codes, 1, np.zeros(2), None, np.ones(rows), work, np.dtype(dtype).name,
                                 hadamard_sketch=(bits, rho, s1, s2))
    assert np.array_equal(fused.view(np.uint8), (dtype(0) + want).view(np.uint8))
