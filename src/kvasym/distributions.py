"""Seeded synthetic keys, values and queries.

A distribution is declarative data (:class:`DistributionSpec`); :func:`generate_trial` turns
one (spec, dim, trial) into a :class:`TrialData` of float64 keys ``K`` (seq_len, dim), values
``V`` (seq_len, dim) and queries ``Q`` (n_queries, dim).

Kinds (:data:`DISTRIBUTION_KINDS`), every coordinate of order 1:

``gaussian``
    i.i.d. N(0, 1) coordinates.
``student_t`` (``nu`` > 1)
    i.i.d. Student-t coordinates with ``nu`` degrees of freedom, unit scale (the variance is
    infinite for ``nu`` <= 2; the scale parameter, not the variance, is 1). Works down to
    ``nu`` = 1.05 in float64.
``low_rank`` (``rank`` in 1..dim, optional ``noise`` >= 0, default 0)
    ``X = sqrt(dim / rank) * Z W^T + noise * E`` with ``W`` (dim, rank) an orthonormal basis of a
    uniformly random (Haar) subspace, ``Z`` (n, rank) and ``E`` (n, dim) i.i.d. N(0, 1). The
    ``sqrt(dim / rank)`` factor makes the average coordinate variance of the low-rank part
    exactly 1 in expectation (``E||Z W^T||^2 = rank`` per row); the noise floor adds
    ``noise**2`` on top. With ``noise = 0`` the matrix has rank exactly ``rank``.
    Keys and queries of one trial SHARE the subspace (queries live where keys live, as in real
    attention, so the scores are not trivially zero); values get their own independent
    subspace of the same rank.
``concentrated`` (``n_outliers`` >= 1 channels, ``outlier_scale`` > 0)
    i.i.d. N(0, 1) coordinates except ``n_outliers`` channels, fixed per trial and chosen
    uniformly without replacement, which are N(0, outlier_scale**2): with e.g. 4 channels of
    scale 20 in dim 128 the outlier channels carry about 93 % of the energy. Keys and queries
    share the outlier channels; values draw their own channels.

Query rule (a definition of the study): by default (query model ``subspace``) query directions
are drawn independently from the same family as the keys, with the same parameters (for
``low_rank`` in the keys' subspace, for ``concentrated`` with the keys' outlier channels). A
spec's ``query`` names another query model (:mod:`kvasym.querymodel`: ``isotropic``, or a
calibrated alignment ``a<x>`` for ``low_rank``), which only changes the directions. Each query
is then rescaled so that the standard deviation (population, ddof = 0), over the trial's keys, of its raw scores
``q . k / sqrt(dim)`` equals exactly 1. Attention uses ``logits = sharpness * q . k / sqrt(dim)``
(:mod:`kvasym.attention`), so ``sharpness`` is the standard deviation of a query's logits over
the keys: attention is neither uniform nor one-hot for sharpness in roughly 1..8. If that
standard deviation is zero or not finite (e.g. all-zero keys, or a single key) the query is
instead left at norm ``sqrt(dim)`` (the norm of a typical N(0, I) query), never divided by zero.

Seeds: every draw comes from :func:`kvasym.seeds.rng` with identity
``("data", name, kind, canonical_params, dim, trial, role)``, where ``role`` is one of
``"kq_structure"`` (shared key/query subspace or outlier channels), ``"v_structure"``,
``"keys"``, ``"values"``, ``"queries"``. A spec with another query model draws its queries from
``(..., "queries", "query_model", <model>)`` instead, and a spec with ``keys_of`` (a query-model
variant of another distribution, :func:`kvasym.study.load_study`) uses that distribution's name
in the identity: its keys, values and structure are the other's, bit for bit, and only its
queries differ. The default model's identity is the original one, so the data of every
distribution without ``query`` are unchanged. The data of a cell is therefore identical for every
scheme and budget (a paired design) and independent of execution order; ``seq_len`` and
``n_queries`` are not part of the identity.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from kvasym.cache import row_norms
from kvasym.errors import KvasymError
from kvasym.querymodel import DEFAULT_QUERY_MODEL, draw_model_queries, parse_query_model
from kvasym.seeds import rng


@dataclass(frozen=True)
class _Param:
    """Schema of one distribution parameter."""

    kind: type  # int or float: the canonical Python type the value is stored as
    check: Callable[[float], bool]
    rule: str  # human-readable form of ``check`` for error messages
    default: float | int | None = None  # None: the parameter is required


DISTRIBUTION_KINDS: Mapping[str, Mapping[str, _Param]] = MappingProxyType(
    {
        "gaussian": MappingProxyType({}),
        "student_t": MappingProxyType({"nu": _Param(float, lambda v: v > 1.0, "a number > 1")}),
        "low_rank": MappingProxyType(
            {
                "rank": _Param(int, lambda v: v >= 1, "an integer >= 1"),
                "noise": _Param(float, lambda v: v >= 0.0, "a number >= 0", default=0.0),
            }
        ),
        "concentrated": MappingProxyType(
            {
                "n_outliers": _Param(int, lambda v: v >= 1, "an integer >= 1"),
                "outlier_scale": _Param(float, lambda v: v > 0.0, "a number > 0"),
            }
        ),
    }
)
"""Distribution kinds and their parameter schemas (name -> {param: schema})."""

# Names end up in file paths, Snakemake wildcards and LaTeX (escaped), so keep them to a safe
# ASCII alphabet. The first character must be a letter or digit: "." and ".." would resolve to
# results/ itself or its parent, and pyarrow's dataset discovery silently skips folders starting
# with "." or "_", so such a distribution would vanish from read_table without an error. 64
# characters keep every results path far below the file-name limit of common filesystems.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")


def _coerce(value: Any, param: _Param, where: str) -> int | float:
    """Validate one parameter value and return it as its canonical Python type."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, (int, float, np.integer, np.floating)
    ):
        raise KvasymError(f"{where} must be {param.rule}, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise KvasymError(f"{where} must be {param.rule}, got {value!r}")
    if param.kind is int:
        # YAML may hand us 4.0 for 4; accept integral floats, reject 4.5.
        if not number.is_integer():
            raise KvasymError(f"{where} must be {param.rule}, got {value!r}")
        canonical: int | float = int(number)
    else:
        canonical = number
    if not param.check(canonical):
        raise KvasymError(f"{where} must be {param.rule}, got {value!r}")
    return canonical


@dataclass(frozen=True)
class DistributionSpec:
    """One named synthetic distribution: ``kind`` plus validated, default-filled ``params``.

    Construction validates (directly or through :meth:`from_dict`, which also parses config
    entries); afterwards ``params`` is read-only and holds every parameter of the kind
    (defaults filled in), as int or float. ``query`` is the query model
    (:mod:`kvasym.querymodel`, default ``subspace``: the original rule); ``keys_of`` names the
    distribution whose keys, values and seeds this one shares (a query-model variant), None for
    its own.
    """

    name: str
    kind: str
    params: Mapping[str, int | float] = field(default_factory=dict)
    query: str = DEFAULT_QUERY_MODEL
    keys_of: str | None = None

    def __post_init__(self) -> None:
        # Validate here (not only in from_dict) so a directly constructed spec is checked too.
        if not isinstance(self.name, str) or not NAME_PATTERN.match(self.name):
            raise KvasymError(
                f"distributions[{self.name}].name must be 1 to 64 ASCII letters, digits and _.+-, "
                f"starting with a letter or digit (it becomes a folder name), got {self.name!r}"
            )
        where = f"distributions[{self.name}]"
        if self.kind is None:
            raise KvasymError(
                f"{where}.kind is missing; expected one of {sorted(DISTRIBUTION_KINDS)}"
            )
        if not isinstance(self.kind, str) or self.kind not in DISTRIBUTION_KINDS:
            raise KvasymError(
                f"{where}.kind must be one of {sorted(DISTRIBUTION_KINDS)}, got {self.kind!r}"
            )
        raw = self.params if self.params is not None else {}
        if not isinstance(raw, Mapping):
            raise KvasymError(f"{where}.params must be a mapping, got {raw!r}")
        schema = DISTRIBUTION_KINDS[self.kind]
        unknown = sorted(str(k) for k in raw if k not in schema)
        if unknown:
            allowed = sorted(schema) or "none"
            raise KvasymError(
                f"{where}.{unknown[0]} is not a parameter of kind {self.kind!r} (allowed: {allowed})"
            )
        params: dict[str, int | float] = {}
        for key, param in schema.items():
            if key in raw:
                params[key] = _coerce(raw[key], param, f"{where}.{key}")
            elif param.default is not None:
                params[key] = param.default
            else:
                raise KvasymError(
                    f"{where}.{key} is missing; kind {self.kind!r} requires it ({param.rule})"
                )
        # Frozen dataclass: replace the caller's mapping by a validated read-only copy.
        object.__setattr__(self, "params", MappingProxyType(params))
        model = parse_query_model(self.query, f"{where}.query")
        if model.alignment is not None and self.kind != "low_rank":
            raise KvasymError(f"{where}.query = {self.query!r}: a calibrated alignment needs kind low_rank "
                              f"(a subspace to align with), got kind {self.kind!r}")
        if self.keys_of is not None and (not isinstance(self.keys_of, str) or not NAME_PATTERN.match(self.keys_of)):
            raise KvasymError(f"{where}.keys_of must be a distribution name, got {self.keys_of!r}")

    @property
    def data_name(self) -> str:
        """The name in the seed identity of the keys and values: ``keys_of`` if set, else ``name``."""
        return self.keys_of if self.keys_of is not None else self.name

    def __hash__(self) -> int:
        # params is a read-only mapping (unhashable), so hash the canonical form instead.
        return hash((self.name, self.kind, self.canonical_params(), self.query, self.keys_of))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], name: str | None = None) -> DistributionSpec:
        """Validate a config entry and build the spec.

        Accepted forms: ``{"name": ..., "kind": ..., "params": {...}}`` or the flat
        ``{"name": ..., "kind": ..., <param>: <value>, ...}``. ``name`` may instead be given as
        the keyword (for a config mapping ``distributions: {heavy: {kind: student_t, nu: 2}}``).
        Errors raise :class:`KvasymError` naming the key, e.g. ``distributions[heavy].nu``.
        """
        if not isinstance(d, Mapping):
            raise KvasymError(f"distributions[{name or '?'}] must be a mapping, got {d!r}")
        if name is not None and "name" in d and d["name"] != name:
            raise KvasymError(
                f"distributions[{name}].name is {d['name']!r}, which contradicts the entry's key {name!r}"
            )
        spec_name = name if name is not None else d.get("name")
        where = f"distributions[{spec_name if spec_name is not None else '?'}]"
        if spec_name is None:
            raise KvasymError(f"{where}.name is missing")
        own = ("name", "kind", "query", "keys_of")
        if "params" in d:
            extra = sorted(str(k) for k in set(d) - {*own, "params"})
            if extra:
                raise KvasymError(f"{where}.{extra[0]} is not allowed next to {where}.params")
            params = d["params"]
        else:
            params = {k: v for k, v in d.items() if k not in own}
        return cls(name=spec_name, kind=d.get("kind"), params=params, query=d.get("query", DEFAULT_QUERY_MODEL),
                   keys_of=d.get("keys_of"))

    def canonical_params(self) -> str:
        """Stable text of the parameters (sorted, floats by ``repr``), used in seed identities."""
        return ";".join(f"{k}={self.params[k]!r}" for k in sorted(self.params))

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (round-trips through :meth:`from_dict`); ``query`` and ``keys_of`` only
        when not the defaults, so a default spec's form (and every slice holding it) is unchanged."""
        out: dict[str, Any] = {"name": self.name, "kind": self.kind, "params": dict(self.params)}
        if self.query != DEFAULT_QUERY_MODEL:
            out["query"] = self.query
        if self.keys_of is not None:
            out["keys_of"] = self.keys_of
        return out


@dataclass
class TrialData:
    """One trial's float64 data: keys (seq_len, dim), values (seq_len, dim), queries (n_queries, dim)."""

    keys: np.ndarray
    values: np.ndarray
    queries: np.ndarray


def _check_positive_int(value: Any, what: str, minimum: int = 1) -> int:
    if (
        isinstance(value, (bool, np.bool_))
        or not isinstance(value, (int, np.integer))
        or value < minimum
    ):
        raise KvasymError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _structure(spec: DistributionSpec, dim: int, gen: np.random.Generator) -> np.ndarray | None:
    """Per-trial structure shared by the vectors drawn with it.

    low_rank: orthonormal basis (dim, rank) of a Haar-random subspace (QR of a Gaussian
    matrix; the basis choice within the subspace is irrelevant because Z is isotropic).
    concentrated: per-channel standard deviations (dim,), outlier_scale on the chosen channels.
    Other kinds: None.
    """
    if spec.kind == "low_rank":
        rank = int(spec.params["rank"])
        basis, _ = np.linalg.qr(gen.standard_normal((dim, rank)))
        return basis
    if spec.kind == "concentrated":
        channels = gen.choice(dim, size=int(spec.params["n_outliers"]), replace=False)
        scale = np.ones(dim)
        scale[channels] = float(spec.params["outlier_scale"])
        return scale
    return None


def _draw(
    spec: DistributionSpec, dim: int, n: int, structure: np.ndarray | None, gen: np.random.Generator
) -> np.ndarray:
    """``n`` vectors of the spec's family, float64 (n, dim)."""
    if spec.kind == "gaussian":
        return gen.standard_normal((n, dim))
    if spec.kind == "student_t":
        return gen.standard_t(float(spec.params["nu"]), size=(n, dim))
    if spec.kind == "low_rank":
        assert structure is not None
        rank = structure.shape[1]
        x = gen.standard_normal((n, rank)) @ structure.T * math.sqrt(dim / rank)
        noise = float(spec.params["noise"])
        if noise > 0.0:
            # Drawn only when used, so noise=0 specs do not consume an extra (n, dim) block.
            x += noise * gen.standard_normal((n, dim))
        return x
    if spec.kind == "concentrated":
        assert structure is not None
        return gen.standard_normal((n, dim)) * structure
    raise KvasymError(
        f"distributions[{spec.name}].kind {spec.kind!r} is not implemented"
    )  # pragma: no cover


def rescale_queries(queries: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Apply the query rule: scale each query so std over keys of ``q . k / sqrt(dim)`` is 1.

    Queries whose score std is zero or not finite are set to norm ``sqrt(dim)`` instead (left
    at zero if they are the zero vector). Returns a new float64 array (n_queries, dim).
    """
    queries = np.asarray(queries, dtype=np.float64)
    keys = np.asarray(keys, dtype=np.float64)
    dim = queries.shape[1]
    scores = queries @ keys.T / math.sqrt(dim)
    # std = m * std(scores / m) with m the row's max |score|: no overflow for heavy tails.
    peak = np.max(np.abs(scores), axis=1)
    ok_peak = np.isfinite(peak) & (peak > 0)
    safe_peak = np.where(ok_peak, peak, 1.0)
    std = safe_peak * np.std(scores / safe_peak[:, None], axis=1)
    ok = ok_peak & np.isfinite(std) & (std > 0)
    factor = np.ones(queries.shape[0])
    factor[ok] = 1.0 / std[ok]
    degenerate = ~ok
    if np.any(degenerate):
        norms = row_norms(queries[degenerate])
        factor[degenerate] = np.where(
            norms > 0, math.sqrt(dim) / np.where(norms > 0, norms, 1.0), 1.0
        )
    return queries * factor[:, None]


def generate_trial(
    spec: DistributionSpec, dim: int, seq_len: int, n_queries: int, base_seed: int, trial: int
) -> TrialData:
    """Draw one trial of keys, values and queries (all float64), following the module's rules.

    ``dim``: head dimension; ``seq_len``: number of cached keys/values; ``n_queries``: number
    of queries; ``trial``: trial index (>= 0), part of the seed identity.
    """
    if not isinstance(spec, DistributionSpec):
        raise KvasymError(f"spec must be a DistributionSpec, got {type(spec).__name__}")
    dim = _check_positive_int(dim, "dim")
    seq_len = _check_positive_int(seq_len, "seq_len")
    n_queries = _check_positive_int(n_queries, "n_queries")
    trial = _check_positive_int(trial, "trial", minimum=0)
    where = f"distributions[{spec.name}]"
    if spec.kind == "low_rank" and int(spec.params["rank"]) > dim:
        raise KvasymError(f"{where}.rank = {spec.params['rank']} exceeds dim = {dim}")
    if spec.kind == "concentrated" and int(spec.params["n_outliers"]) > dim:
        raise KvasymError(f"{where}.n_outliers = {spec.params['n_outliers']} exceeds dim = {dim}")

    identity = ("data", spec.data_name, spec.kind, spec.canonical_params(), dim, trial)

    def stream(*role: str) -> np.random.Generator:
        return rng(base_seed, *identity, *role)

    kq_structure = _structure(spec, dim, stream("kq_structure"))
    v_structure = _structure(spec, dim, stream("v_structure"))
    keys = _draw(spec, dim, seq_len, kq_structure, stream("keys"))
    values = _draw(spec, dim, seq_len, v_structure, stream("values"))
    model = parse_query_model(spec.query, f"{where}.query")
    if model.is_default:
        directions = _draw(spec, dim, n_queries, kq_structure, stream("queries"))
    else:
        directions = draw_model_queries(
            model, spec.kind, n_queries, dim, kq_structure if spec.kind == "low_rank" else None,
            float(spec.params.get("noise", 0.0)), stream("queries", "query_model", model.name), f"{where}.query")
    queries = rescale_queries(directions, keys)

    for role, arr in (("keys", keys), ("values", values), ("queries", queries)):
        # Student-t at nu near 1 is the only way to get here; it would need a ~1e-150 event.
        if not np.all(np.isfinite(arr)):
            raise KvasymError(f"{where}: non-finite {role} drawn for dim={dim}, trial={trial}")
    return TrialData(keys=keys, values=values, queries=queries)
