"""The resolved quantization plan (kvasym.plan) and the backends that execute it (kvasym.backends).

References: the plan's fields are checked against values worked out by hand from the spec
(working dimension = the next power of two under the WHT, scalar bits = n - k, sketch rows =
sketch_m x working dimension, the stored seeds); the backends against each other (the numpy
reference and the numba row passes write the same arrays on float64 data) and against
kvasym.cache.quantize (which must be exactly: resolve, execute, pack).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kvasym.backends import NumbaBackend, ReferenceBackend, backend_for, execute
from kvasym.cache import quantize
from kvasym.codebook import lloyd_max_codebook
from kvasym.errors import KvasymError
from kvasym.plan import QuantizePlan, resolve_plan
from kvasym.schemes import SideSpec

# name -> (spec, budget, dim, the plan's fields worked out by hand)
KINDS = {
    "rotated": (SideSpec(rotate=True, scalar_offset=0, qjl=False), 3, 40,
                {"path": "plain", "work_dim": 64, "scalar_bits": 3, "sketch": None, "sketch_rows": 0,
                 "rotation_seed": 11, "qjl_seed": 0}),
    "unrotated": (SideSpec(rotate=False, scalar_offset=0, qjl=False), 2, 40,
                  {"path": "plain", "work_dim": 40, "scalar_bits": 2, "sketch": None, "sketch_rows": 0,
                   "rotation_seed": 0, "qjl_seed": 0}),
    "qjl": (SideSpec(rotate=True, scalar_offset=1, qjl=True), 4, 64,
            {"path": "plain", "work_dim": 64, "scalar_bits": 3, "sketch": "gaussian", "sketch_rows": 64,
             "rotation_seed": 11, "qjl_seed": 12}),
    "qjl-hadamard": (SideSpec(rotate=True, scalar_offset=1, qjl=True, sketch="hadamard"), 2, 40,
                     {"path": "plain", "work_dim": 64, "scalar_bits": 1, "sketch": "hadamard", "sketch_rows": 64,
                      "rotation_seed": 11, "qjl_seed": 12}),
    "pure-qjl": (SideSpec(rotate=True, scalar_offset=1, qjl=True), 1, 64,
                 {"path": "plain", "work_dim": 64, "scalar_bits": 0, "sketch": "gaussian", "sketch_rows": 64,
                  "rotation_seed": 11, "qjl_seed": 12}),
    "spend-n-1": (SideSpec(rotate=True, scalar_offset=1, qjl=False, spend_offset=1), 4, 64,
                  {"path": "plain", "budget": 3, "work_dim": 64, "scalar_bits": 3, "sketch": None,
                   "sketch_rows": 0, "rotation_seed": 11, "qjl_seed": 0}),
    "centred": (SideSpec(rotate=True, scalar_offset=0, qjl=False, center=True), 3, 40,
                {"path": "composed", "work_dim": 64, "scalar_bits": 3, "sketch": None, "sketch_rows": 0,
                 "rotation_seed": 11, "qjl_seed": 0}),
    "klt": (SideSpec(rotate=False, scalar_offset=0, qjl=False, transform="klt"), 3, 40,
            {"path": "composed", "work_dim": 40, "scalar_bits": 3, "sketch": None, "sketch_rows": 0,
             "rotation_seed": 0, "qjl_seed": 0}),
    "haar-eden": (SideSpec(rotate=False, scalar_offset=0, qjl=False, transform="haar", rescale="eden"), 2, 40,
                  {"path": "composed", "work_dim": 40, "scalar_bits": 2, "sketch": None, "sketch_rows": 0,
                   "rotation_seed": 11, "qjl_seed": 0}),
    "waterfill": (SideSpec(rotate=True, scalar_offset=1, qjl=True, allocation="waterfill"), 3, 40,
                  {"path": "composed", "work_dim": 64, "scalar_bits": 2, "sketch": "gaussian", "sketch_rows": 64,
                   "rotation_seed": 11, "qjl_seed": 12}),
    "kivi": (SideSpec(rotate=False, scalar_offset=0, qjl=False, scalar="minmax", axis="token", group=16), 2, 40,
             {"path": "composed", "work_dim": 40, "scalar_bits": 2, "sketch": None, "sketch_rows": 0,
              "rotation_seed": 0, "qjl_seed": 0}),
    "sketch-2d": (SideSpec(rotate=True, scalar_offset=2, qjl=True, sketch_m=2, center=True), 4, 40,
                  {"path": "composed", "work_dim": 64, "scalar_bits": 2, "sketch": "gaussian", "sketch_rows": 128,
                   "rotation_seed": 11, "qjl_seed": 12}),
}


def _plan(name: str, **kwargs) -> QuantizePlan:
    spec, budget, dim, _ = KINDS[name]
    return resolve_plan(spec, budget, dim, rotation_seed=11, qjl_seed=12, **kwargs)


@pytest.mark.parametrize("name", sorted(KINDS))
def test_each_plan_kind_resolves_to_its_documented_fields(name: str) -> None:
    spec, budget, dim, expected = KINDS[name]
    plan = _plan(name)
    assert {key: getattr(plan, key) for key in expected} == expected
    assert plan.budget == expected.get("budget", budget) and plan.dim == dim
    assert plan.kernel == "numpy" and plan.threads == 1 and plan.norm_dtype == "float32" and not plan.fused
    assert plan.spec.spend_offset == 0 and plan.spec.scalar_bits(plan.budget) == plan.scalar_bits
    assert plan.primitives == ({} if plan.path == "plain" else spec.primitives())
    lloyd = plan.scalar_bits > 0 and spec.scalar == "lloyd_max" and spec.allocation == "uniform"
    if lloyd:  # the Beta codebook of the working dimension, nothing else
        book = lloyd_max_codebook(plan.work_dim, plan.scalar_bits)
        assert np.array_equal(plan.codebook.centroids, book.centroids)
    else:
        assert plan.codebook is None
    # the numba backend tries its fused pass exactly on float32-norm Lloyd-Max uniform sides
    assert _plan(name, kernel="numba").fused == lloyd
    assert not _plan(name, kernel="numba", norm_dtype="float16").fused
    assert _plan(name) == _plan(name) and dataclasses.replace(plan, threads=2) != plan
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.scalar_bits = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("spec", "budget", "dim", "kwargs", "match"),
    [
        (SideSpec(rotate=True, scalar_offset=0, qjl=False), 4, 64, {"norm_dtype": "float64"},
         "norm_dtype must be one of float16, float32, got 'float64'"),
        (SideSpec(rotate=True, scalar_offset=0, qjl=False), 4, 64, {"kernel": "fast"},
         "kernel must be one of numpy, numba, got 'fast'"),
        (SideSpec(rotate=True, scalar_offset=0, qjl=False), 4, 64, {"threads": 0},
         "threads must be an integer in 1..1024, got 0"),
        (SideSpec(rotate=True, scalar_offset=0, qjl=False), 9, 64, {}, r"side spec .* is impossible at budget 9"),
        (SideSpec(rotate=True, scalar_offset=1, qjl=False), 1, 64, {}, r"side spec .* is impossible at budget 1"),
        (SideSpec(rotate=False, scalar_offset=1, qjl=True, scalar="minmax"), 1, 64, {},
         r"impossible at budget 1: no scalar bits \(scalar minmax needs at least one\)"),
        (SideSpec(rotate=True, scalar_offset=1, qjl=True, allocation="waterfill"), 1, 64, {},
         r"impossible at budget 1: no scalar bits \(allocation waterfill needs at least one\)"),
        (SideSpec(rotate=False, scalar_offset=1, qjl=True, sketch="hadamard", center=True), 3, 40, {},
         "the hadamard sketch needs a power-of-two working dimension, not 40"),
        (SideSpec(rotate=False, scalar_offset=0, qjl=False), 4, 2, {}, "at least 3 coordinates, got 2"),
        (SideSpec(rotate=True, scalar_offset=0, qjl=False), 4, 16385, {},
         "rows of 16385 coordinates, which the Hadamard rotation pads to 32768,"),
        (SideSpec(rotate=False, scalar_offset=0, qjl=False), 4, 16385, {},
         "rows of 16385 coordinates exceed the largest working dimension 16384"),
    ],
    ids=["norm_dtype", "kernel", "threads", "scalar-above-8", "stores-nothing", "minmax-no-bits",
         "waterfill-no-bits", "hadamard-dim", "dim-below-3", "padded-dim", "dim-above-max"],
)
def test_a_bad_request_is_refused_naming_the_key(spec, budget, dim, kwargs, match) -> None:
    with pytest.raises(KvasymError, match=match):
        resolve_plan(spec, budget, dim, rotation_seed=1, qjl_seed=2, **kwargs)


def test_a_padded_dim_within_the_limit_resolves() -> None:
    plan = resolve_plan(SideSpec(rotate=True, scalar_offset=0, qjl=False), 1, 8193, rotation_seed=1, qjl_seed=2)
    assert plan.work_dim == 16384


@pytest.mark.parametrize("name", sorted(KINDS))
def test_cache_quantize_is_the_plan_run_by_its_backend(name: str) -> None:
    """quantize = resolve_plan + execute + the plan's header fields: the same arrays and header."""
    spec, budget, dim, _ = KINDS[name]
    x = np.random.default_rng(5).standard_normal((90, dim)) + 0.5
    plan = _plan(name)
    encoded = execute(plan, x)
    cache = quantize(x, spec, budget, rotation_seed=11, qjl_seed=12)
    for key, value in plan.header_fields().items():
        assert getattr(cache, key) == value, key
    assert cache.rows == 90
    for key in ("codes", "norms", "qjl_signs", "residual_norms"):
        assert np.array_equal(getattr(cache, key), getattr(encoded, key)), key
    assert cache.extras.keys() == encoded.extras.keys()
    assert all(np.array_equal(cache.extras[k], encoded.extras[k]) for k in encoded.extras)


@pytest.mark.parametrize("name", sorted(KINDS))
def test_numpy_and_numba_backends_write_the_same_arrays_on_float64_data(name: str, monkeypatch) -> None:
    """Each plan kind, on float64 rows with a spread of norms: the reference and the compiled
    row passes give identical codes, norms, sketch bits and side arrays (no near-tie on these
    rows; the float32 near-ties are tests/test_kernels.py's), and the numba backend runs its
    fused pass where the plan says so."""
    pytest.importorskip("numba")
    from kvasym import kernels

    ran: list[str] = []
    real = kernels.encode_batch_with_norms
    monkeypatch.setattr(kernels, "encode_batch_with_norms", lambda *a, **k: ran.append("fused") or real(*a, **k))
    spec, budget, dim, _ = KINDS[name]
    rng = np.random.default_rng(dim + budget)
    x = rng.standard_normal((257, dim)) * np.linspace(0.05, 20.0, 257)[:, None] + rng.standard_normal(dim)
    ref_plan, fast_plan = _plan(name), _plan(name, kernel="numba", threads=3)
    assert isinstance(backend_for(ref_plan), ReferenceBackend) and not isinstance(backend_for(ref_plan),
                                                                                  NumbaBackend)
    assert isinstance(backend_for(fast_plan), NumbaBackend)
    ref, fast = execute(ref_plan, x), execute(fast_plan, x)
    assert ran == (["fused"] if fast_plan.fused else [])
    for key in ("codes", "norms", "qjl_signs", "residual_norms"):
        a, b = getattr(ref, key), getattr(fast, key)
        assert a.dtype == b.dtype and np.array_equal(a, b), key
    assert ref.extras.keys() == fast.extras.keys()
    assert all(np.array_equal(ref.extras[k], fast.extras[k]) for k in ref.extras)


def test_the_numba_backend_scans_rows_its_fused_pass_does_not_see() -> None:
    """cache.quantize defers the finiteness scan to the numba backend: a non-finite value is
    still refused, naming its position, on the fused, the composed and the float16 paths."""
    pytest.importorskip("numba")
    x = np.ones((6, 64))
    x[4, 9] = np.nan
    for name, norm_dtype in (("rotated", "float32"), ("rotated", "float16"), ("centred", "float32")):
        spec, budget, _, _ = KINDS[name]
        with pytest.raises(KvasymError, match=r"input has 1 non-finite values \(first at row 4, column 9\)"):
            quantize(x, spec, budget, rotation_seed=1, qjl_seed=2, kernel="numba", norm_dtype=norm_dtype)
