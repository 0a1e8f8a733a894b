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
    """KQV-NOQJL's keys are KQV's bit for bit; its values are exactly RKV's values at n - 1 (the
    same rotation seed, codebook and norms), so its measured V payload is n - 1 bits."""
    rng = np.random.default_rng(3)
    keys, values = rng.standard_normal((64, 32)), rng.standard_normal((64, 32))
    for n in (2, 4):
        ablated, kqv, rkv_lower = _pair("KQV-NOQJL", n, keys, values), _pair("KQV", n, keys, values), \
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
    (pi/2 - 1/d) |r|^2, the bare residual |r|^2, so KQV's value error over KQV-NOQJL's is
    pi/2 - 1/d (averaged over rows and over independent sketches: 8 identities)."""
    from kvasym.theory import sketch_error_energy

    d, rows = 64, 512
    rng = np.random.default_rng(5)
    ratios = []
    for trial in range(8):
        keys, values = rng.standard_normal((rows, d)), rng.standard_normal((rows, d))
        err = {}
        for name in ("KQV", "KQV-NOQJL"):
            pair = quantize_pair(keys, values, get_scheme(name), 3, base_seed=2, identity=("abl", d, trial))
            err[name] = float(np.sum((pair["V"].dequantize("float64") - values) ** 2))
        ratios.append(err["KQV"] / err["KQV-NOQJL"])
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
        get_scheme("KQV-NOQJL").validate_budget(1)


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
    bad = {**tiny, "frontier": {**tiny["frontier"], "distributions_of": {"KQV-NOQJL": ["nope"]}}}
    with pytest.raises(KvasymError, match=r"frontier\.distributions_of\.KQV-NOQJL\[0\]"):
        load_study(bad)
    bad = {**tiny, "frontier": {**tiny["frontier"], "distributions_of": {"KQV": ["gaussian"]}}}
    with pytest.raises(KvasymError, match=r"frontier\.distributions_of\.KQV: 'KQV' is not one of frontier"):
        load_study(bad)
