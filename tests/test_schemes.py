"""Schemes as declarative data: the built-ins, the strict budget rule and config validation."""

from __future__ import annotations

import copy

import pytest

from kvasym.errors import KvasymError
from kvasym.schemes import (
    BUILTIN_SCHEMES,
    MAX_BUDGET,
    MIN_BUDGET,
    SIDES,
    Scheme,
    SideSpec,
    get_scheme,
    scheme_from_dict,
    scheme_registry,
)

BUDGETS = range(MIN_BUDGET, MAX_BUDGET + 1)

# What the study (spec part A/B and C10) says each built-in is: (rotate, scalar bits at n, qjl)
EXPECTED = {
    "KV": {"K": (False, 0, False), "V": (False, 0, False)},
    "KQV": {"K": (True, 0, False), "V": (True, 1, True)},
    "QKQV": {"K": (True, 1, True), "V": (True, 1, True)},
    "RKV": {"K": (True, 0, False), "V": (True, 0, False)},
}


def side(rotate=True, scalar_bits="n", qjl=False) -> dict:
    return {"rotate": rotate, "scalar_bits": scalar_bits, "qjl": qjl}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_builtin_specs(name: str) -> None:
    scheme = get_scheme(name)
    assert scheme.name == name
    assert scheme.description
    for s in ("K", "V"):
        rotate, offset, qjl = EXPECTED[name][s]
        assert scheme.side(s) == SideSpec(rotate=rotate, scalar_offset=offset, qjl=qjl)
        for n in BUDGETS:
            assert scheme.side(s).scalar_bits(n) == n - offset
            # every built-in spends exactly n bits per coordinate on each side
            assert scheme.side(s).scalar_bits(n) + int(scheme.side(s).qjl) == n


# Built-ins made of the composable primitives (kvasym.composed): not in the paper's grid
PRIMITIVE_BUILTINS = {
    "KQV-H": {"K": {}, "V": {}},
    "QKQV-H": {"K": {}, "V": {}},
    "CRKV": {"K": {"center": True}, "V": {"center": True}},
    "SKLT": {side: {"center": True, "transform": "klt", "transform_dtype": "float16", "allocation": "waterfill"}
             for side in SIDES},
    "KIVI32": {"K": {"scalar": "minmax", "axis": "channel", "group": 32},
               "V": {"scalar": "minmax", "axis": "token", "group": 32}},
    "KIVI128": {"K": {"scalar": "minmax", "axis": "channel", "group": 128},
                "V": {"scalar": "minmax", "axis": "token", "group": 128}},
    "KVarN": {side: {"scalar": "minmax", "axis": "channel", "group": 128, "normalize": "dual"} for side in SIDES},
    "GGML-Q0": {side: {"scalar": "q_0", "axis": "token", "group": 32} for side in SIDES},
    "GGML-Q8": {side: {"scalar": "q8_0", "axis": "token", "group": 32} for side in SIDES},
    "RKV-EDEN": {"K": {"rescale": "eden"}, "V": {"rescale": "eden"}},
    "HRKV": {"K": {"transform": "haar"}, "V": {"transform": "haar"}},
    "HKQV": {"K": {"transform": "haar"}, "V": {"transform": "haar"}},
}
#: Built-ins of issue 14's ablations that spend fewer bits than n on purpose (tests/test_ablations.py).
ABLATION_BUILTINS = {"KQV-NS"}


def test_registry_holds_exactly_the_builtins() -> None:
    assert set(scheme_registry()) == set(EXPECTED) | set(PRIMITIVE_BUILTINS) | ABLATION_BUILTINS == set(BUILTIN_SCHEMES)


@pytest.mark.parametrize("name", sorted(PRIMITIVE_BUILTINS))
@pytest.mark.parametrize("n", BUDGETS)
def test_primitive_builtins_record_their_primitives_and_spend_n(name: str, n: int) -> None:
    scheme = get_scheme(name)
    if name == "GGML-Q8" and n == 1:  # llama.cpp's symmetric rule has the one level 0 at 1 bit
        with pytest.raises(KvasymError, match="1-bit q8_0 scalar .its one level is 0. and no QJL stores nothing"):
            scheme.validate_budget(n)
        return
    scheme.validate_budget(n)
    for s in SIDES:
        assert scheme.side(s).primitives() == PRIMITIVE_BUILTINS[name][s]
        assert scheme.side(s).scalar_bits(n) + scheme.side(s).sketch_bits == n
    assert {scheme.K.sketch, scheme.V.sketch} <= ({"hadamard", "gaussian"} if name.endswith("-H") else {"gaussian"})


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("n", BUDGETS)
def test_builtins_valid_at_every_budget(name: str, n: int) -> None:
    get_scheme(name).validate_budget(n)


def test_pure_qjl_at_budget_one_allowed() -> None:
    scheme = get_scheme("QKQV")
    scheme.validate_budget(1)
    assert scheme.K.scalar_bits(1) == 0 and scheme.K.qjl
    assert get_scheme("KQV").V.scalar_bits(1) == 0


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("n", [0, -1, 9, 2.0, True, "4", None])
def test_bad_budget_values(name: str, n: object) -> None:
    with pytest.raises(KvasymError, match="budget"):
        get_scheme(name).validate_budget(n)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("k_side", "v_side", "bad_side", "bad_budgets"),
    [
        (side(scalar_bits="n-2", qjl=True), side(), "K", BUDGETS),  # spends n-1
        (side(), side(scalar_bits="n", qjl=True), "V", BUDGETS),  # spends n+1
        (side(scalar_bits="n-1"), side(), "K", BUDGETS),  # spends n-1, no QJL
        (side(), side(scalar_bits="n - 3", qjl=True), "V", BUDGETS),
    ],
)
def test_budget_breaking_user_schemes(k_side, v_side, bad_side, bad_budgets) -> None:
    scheme = scheme_from_dict("Mine", {"K": k_side, "V": v_side})
    for n in bad_budgets:
        with pytest.raises(KvasymError) as info:
            scheme.validate_budget(n)
        message = str(info.value)
        assert "Mine" in message and f"side {bad_side}" in message and f"n={n}" in message


def test_negative_scalar_bits_names_scheme_side_budget() -> None:
    scheme = scheme_from_dict("Neg", {"K": side(), "V": side(scalar_bits="n-3", qjl=True)})
    with pytest.raises(KvasymError, match=r"Neg.*side V.*n=2"):
        scheme.validate_budget(2)


def test_nothing_stored_is_rejected() -> None:
    # "n-1" without QJL at n=1 stores nothing; also breaks the budget
    scheme = scheme_from_dict("Empty", {"K": side(scalar_bits="n-1"), "V": side()})
    with pytest.raises(KvasymError, match="Empty"):
        scheme.validate_budget(1)


def test_spaces_and_n_minus_zero_accepted() -> None:
    scheme = scheme_from_dict("Sp", {"K": side(scalar_bits=" n - 1 ", qjl=True), "V": side(scalar_bits="n-0")})
    assert scheme.K.scalar_offset == 1 and scheme.V.scalar_offset == 0
    scheme.validate_budget(3)


@pytest.mark.parametrize("expr", ["n+1", "2", 2, "m", "n-", "n-1.5", "n - -1", "", None, "n*2", "nn"])
def test_bad_scalar_bits_expression(expr: object) -> None:
    with pytest.raises(KvasymError, match=r"schemes\.X\.K\.scalar_bits"):
        scheme_from_dict("X", {"K": side(scalar_bits=expr), "V": side()})


@pytest.mark.parametrize("key", ["rotate", "qjl"])
@pytest.mark.parametrize("value", [1, 0, "true", None, "yes"])
def test_bad_bool_types(key: str, value: object) -> None:
    spec = side()
    spec[key] = value
    with pytest.raises(KvasymError, match=rf"schemes\.X\.V\.{key}"):
        scheme_from_dict("X", {"K": side(), "V": spec})


@pytest.mark.parametrize("key", ["rotate", "scalar_bits", "qjl"])
def test_missing_side_key(key: str) -> None:
    spec = side()
    del spec[key]
    with pytest.raises(KvasymError, match=rf"schemes\.X\.K\.{key}"):
        scheme_from_dict("X", {"K": spec, "V": side()})


def test_unknown_side_key() -> None:
    spec = side()
    spec["bits"] = 3
    with pytest.raises(KvasymError, match="bits"):
        scheme_from_dict("X", {"K": spec, "V": side()})


def test_unknown_and_missing_top_level_keys() -> None:
    with pytest.raises(KvasymError, match="Q"):
        scheme_from_dict("X", {"K": side(), "V": side(), "Q": side()})
    with pytest.raises(KvasymError, match=r"schemes\.X\.V"):
        scheme_from_dict("X", {"K": side()})
    with pytest.raises(KvasymError, match=r"schemes\.X\.K"):
        scheme_from_dict("X", {"V": side()})
    with pytest.raises(KvasymError, match="description"):
        scheme_from_dict("X", {"K": side(), "V": side(), "description": 3})
    with pytest.raises(KvasymError, match=r"schemes\.X"):
        scheme_from_dict("X", ["K", "V"])
    with pytest.raises(KvasymError, match=r"schemes\.X\.K"):
        scheme_from_dict("X", {"K": "n", "V": side()})


@pytest.mark.parametrize("name", ["", "1abc", "a b", "a/b", "x" * 41, None, 3, "é"])
def test_bad_scheme_names(name: object) -> None:
    with pytest.raises(KvasymError, match="name"):
        scheme_from_dict(name, {"K": side(), "V": side()})  # type: ignore[arg-type]


def test_good_scheme_names() -> None:
    for name in ("A", "x" * 40, "K4.v2+qjl", "my_scheme-1"):
        assert scheme_from_dict(name, {"K": side(), "V": side()}).name == name


def test_user_scheme_added_via_registry() -> None:
    user = {
        "VQ": {
            "description": "QJL on values only, raw",
            "K": side(rotate=False),
            "V": side(scalar_bits="n-1", qjl=True),
        }
    }
    registry = scheme_registry(user)
    assert set(registry) == set(EXPECTED) | set(PRIMITIVE_BUILTINS) | ABLATION_BUILTINS | {"VQ"}
    vq = get_scheme("VQ", user)
    assert vq.K == SideSpec(False, 0, False) and vq.V == SideSpec(True, 1, True)
    assert vq.description == "QJL on values only, raw"
    for n in BUDGETS:
        vq.validate_budget(n)
    with pytest.raises(KvasymError, match="VQ"):
        get_scheme("VQ")  # not known without the user config
    with pytest.raises(KvasymError, match="KQV"):
        get_scheme("nope")  # the message lists the known schemes


def test_user_scheme_errors_surface_through_registry() -> None:
    with pytest.raises(KvasymError, match=r"schemes\.Bad\.V\.qjl"):
        scheme_registry({"Bad": {"K": side(), "V": {"rotate": True, "scalar_bits": "n"}}})


def test_redefining_a_builtin() -> None:
    # an identical restatement is harmless
    same = copy.deepcopy(BUILTIN_SCHEMES["KQV"])
    assert scheme_registry({"KQV": same})["KQV"] == get_scheme("KQV")
    # a different one is an error naming the scheme
    changed = copy.deepcopy(BUILTIN_SCHEMES["KQV"])
    changed["K"]["rotate"] = False
    with pytest.raises(KvasymError, match="KQV"):
        scheme_registry({"KQV": changed})
    with pytest.raises(KvasymError, match="RKV"):
        scheme_registry({"RKV": {"K": side(), "V": side(scalar_bits="n-1", qjl=True)}})


def test_side_accessor_and_round_trip_dict() -> None:
    for name in EXPECTED:
        scheme = get_scheme(name)
        assert scheme.side("K") is scheme.K and scheme.side("V") is scheme.V
        again = scheme_from_dict(name, scheme.to_dict())
        assert again == scheme
    with pytest.raises(KvasymError, match="side"):
        get_scheme("KV").side("Q")


def test_scheme_is_frozen() -> None:
    scheme = get_scheme("KV")
    with pytest.raises(AttributeError):
        scheme.K = SideSpec(True, 0, False)  # type: ignore[misc]
    assert isinstance(scheme, Scheme)


def test_too_many_scalar_bits_rejected() -> None:
    # offset 0 at n = 8 is 8 scalar bits (fine); budget 9 is out of range anyway
    get_scheme("KV").validate_budget(8)
    with pytest.raises(KvasymError):
        get_scheme("KV").validate_budget(9)


def test_sketch_kind_parsed_checked_and_round_tripped() -> None:
    hadamard = {"rotate": True, "scalar_bits": "n-1", "qjl": True, "sketch": "hadamard"}
    scheme = scheme_from_dict("H", {"K": side(), "V": hadamard})
    assert scheme.V.sketch == "hadamard" and scheme.K.sketch == "gaussian"
    assert scheme.V.to_dict() == hadamard
    assert "sketch" not in scheme.K.to_dict()  # the default is not written: built-ins' dicts are unchanged
    assert scheme_from_dict("H", scheme.to_dict()) == scheme
    gaussian = dict(hadamard, sketch="gaussian")
    assert scheme_from_dict("G", {"K": side(), "V": gaussian}).V == scheme_from_dict(
        "G", {"K": side(), "V": {k: v for k, v in gaussian.items() if k != "sketch"}}).V
    with pytest.raises(KvasymError, match=r"schemes\.X\.V\.sketch must be one of gaussian, hadamard, got 'haar'"):
        scheme_from_dict("X", {"K": side(), "V": dict(hadamard, sketch="haar")})
    with pytest.raises(KvasymError, match=r"schemes\.X\.V\.sketch is set but qjl is false"):
        scheme_from_dict("X", {"K": side(), "V": dict(hadamard, qjl=False, scalar_bits="n")})
    with pytest.raises(KvasymError, match="needs qjl: true"):
        SideSpec(rotate=True, scalar_offset=0, qjl=False, sketch="hadamard")
    with pytest.raises(KvasymError, match="sketch must be one of"):
        SideSpec(rotate=True, scalar_offset=1, qjl=True, sketch="orthogonal")


def test_stores_nothing_at_is_what_quantize_refuses() -> None:
    """SideSpec.stores_nothing_at(n) holds exactly where quantize refuses the side as storing
    nothing, for every built-in side at n = 1..3 (KQV-NS's values spend n-1: nothing at n = 1)."""
    import numpy as np

    from kvasym.cache import quantize
    from kvasym.schemes import scheme_registry

    x = np.random.default_rng(0).standard_normal((4, 16))
    seen = set()
    for scheme in scheme_registry().values():
        for spec in (scheme.K, scheme.V):
            for budget in (1, 2, 3):
                if spec.scalar_bits(budget) < 0:
                    continue
                nothing = spec.stores_nothing_at(budget)
                seen.add(nothing)
                if nothing:
                    with pytest.raises(KvasymError, match="stores nothing|impossible at budget"):
                        quantize(x, spec, budget, rotation_seed=1, qjl_seed=2)
                else:
                    assert quantize(x, spec, budget, rotation_seed=1, qjl_seed=2).rows == 4
    assert seen == {True, False}
