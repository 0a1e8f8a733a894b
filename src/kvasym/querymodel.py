"""Query models: how the queries of a synthetic trial are aligned with its keys' covariance.

The *alignment* of a query ``q`` with keys of covariance ``C_K`` is

    a(q) = q^T C_K q / (||q||^2 tr(C_K) / d),

the logit variance ``Var_k(q . k)`` the query gets from its direction, relative to a query of
the same norm in a random direction (``E_u[u^T C u] = tr(C) / d`` for ``u`` uniform on the
sphere). ``a = 1`` is isotropic-like; ``a`` up to ``lambda_max / (tr C / d)`` means the query
lives in the keys' dominant directions. After the study's logit rule (every query rescaled so
that ``q . k / sqrt(d)`` has standard deviation 1 over the keys,
:func:`kvasym.distributions.rescale_queries`) a query of alignment ``a`` has
``||q||^2 = d^2 / (a tr C)``: the smaller ``a``, the longer the query, and a key quantization
error spread over all ``d`` rotated coordinates (``E[(q . e)^2] = ||q||^2 ||e||^2 / d``) weighs
on its logits ``1 / a`` times more. For rank-``r`` keys the study's default rule imposes
``a = d / r``; real SmolLM2 queries measure about 1 (issue 14).

Models (:func:`parse_query_model`; each draws directions, the logit rule then sets the norm, so
the sharpness of study.md part B keeps its meaning: the standard deviation of a query's logits
over the trial's keys):

``subspace`` (the default: the study's original rule, bit for bit)
    Queries drawn from the keys' own family (for ``low_rank`` in the keys' subspace, for
    ``concentrated`` with the keys' outlier channels). For ``low_rank`` without noise,
    ``C_K = (d / r) P`` with ``P = W W^T`` the projector on the subspace and ``q = P q``, so
    ``a = d / r`` exactly for every query.
``isotropic``
    ``q ~ N(0, I_d)``, whatever the keys. For ``low_rank`` the subspace share
    ``f = ||P q||^2 / ||q||^2`` is Beta(r/2, (d - r)/2) distributed, ``E f = r / d``; with noise
    ``sigma``, ``C_K = (d / r) P + sigma^2 I``, ``tr C_K = d (1 + sigma^2)`` and
    ``a = ((d / r) f + sigma^2) / (1 + sigma^2)``, so ``E[a] = 1`` exactly for every rank and
    noise (for any covariance: ``E[q^T C q / ||q||^2] = tr C / d`` by rotation invariance).
``a<x>`` (e.g. ``a2``, ``a8``; ``low_rank`` only): calibrated alignment ``x``
    ``q = sqrt(d) (sqrt(f) u_in + sqrt(1 - f) u_out)`` with ``u_in`` uniform on the unit sphere
    of the subspace, ``u_out`` uniform on the unit sphere of its orthogonal complement (both
    from Gaussian draws, projected and normalised) and the fixed subspace share
    ``f = (x (1 + sigma^2) - sigma^2) r / d``: a mixture of an in-subspace and an orthogonal
    component whose alignment against the population covariance is exactly ``x`` for every
    query (so ``E[a] = x``, with zero variance). ``x`` must lie in
    ``[sigma^2 / (1 + sigma^2), (d / r + sigma^2) / (1 + sigma^2)]`` (``f`` in [0, 1]); ``x = d / r``
    without noise is the subspace rule's alignment (in law: then ``u_out`` has weight 0).

To second order the KL of a query is proportional to its logit error variance, hence to ``1 / a``
(see above), so a model's mean KL follows ``E[1 / a]`` (:func:`expected_inverse_alignment`):
``1 / x`` for ``a<x>`` and ``r / d`` for ``subspace``, but for ``isotropic`` queries on rank-``r``
keys without noise ``E[1 / a] = (r / d) E[1 / f] = r (d - 2) / (d (r - 2))`` for ``r > 2`` (the
Beta(alpha, beta) law has ``E[1 / f] = (alpha + beta - 1) / (alpha - 1)``), about ``r / (r - 2)``
times that of a fixed ``a = 1``, and infinite for ``r <= 2``: an isotropic query almost
orthogonal to a rank-2 subspace has almost no logit spread, and the logit rule stretches it
until its quantization error dominates (its mean KL is then driven by a few such queries).

Measured against the trial's *sample* covariance (:func:`query_alignment`, what the manifests
and the real-cache statistics report) ``a`` fluctuates around these values by
``O(sqrt(r / n))`` for ``n`` keys.

References
----------
.. [1] Zandieh, A., Daliri, M., Hadian, M., Mirrokni, V. (2025) "TurboQuant: online vector
   quantization with near-optimal distortion rate", arXiv:2504.19874 (the rotation whose error
   spreads over all coordinates).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from .errors import KvasymError

__all__ = ["DEFAULT_QUERY_MODEL", "QueryModel", "check_query_model", "draw_model_queries", "expected_alignment",
           "expected_inverse_alignment",
           "parse_query_model", "query_alignment"]

#: The study's original rule (queries from the keys' family): the default of every distribution.
DEFAULT_QUERY_MODEL = "subspace"
_ALIGNMENT = re.compile(r"^a(?P<x>[0-9]+(\.[0-9]+)?)$")


@dataclass(frozen=True)
class QueryModel:
    """A parsed query model: ``name`` as written (``subspace``, ``isotropic``, ``a<x>``) and, for
    a calibrated model, its target ``alignment`` x (None otherwise)."""

    name: str
    alignment: float | None = None

    @property
    def is_default(self) -> bool:
        return self.name == DEFAULT_QUERY_MODEL


def parse_query_model(text: object, where: str = "query model") -> QueryModel:
    """``subspace``, ``isotropic`` or ``a<x>`` (x a positive decimal, e.g. ``a2``, ``a8``, ``a1.5``).

    Raises
    ------
    KvasymError
        Naming ``where`` and the value, for anything else (x must be > 0).
    """
    if text in (DEFAULT_QUERY_MODEL, "isotropic"):
        return QueryModel(str(text))
    match = _ALIGNMENT.match(text) if isinstance(text, str) else None
    if match is None or float(match["x"]) <= 0:
        raise KvasymError(f"{where} must be 'subspace', 'isotropic' or 'a<x>' with x > 0 a decimal alignment "
                          f"(e.g. a2), got {text!r}")
    return QueryModel(str(text), float(match["x"]))


def _low_rank_share(model: QueryModel, dim: int, rank: int, noise: float, where: str) -> float:
    """The fixed subspace share f of a calibrated model (module docstring), checked in [0, 1]."""
    assert model.alignment is not None
    s2 = noise * noise
    share = (model.alignment * (1.0 + s2) - s2) * rank / dim
    if not (0.0 <= share <= 1.0 + 1e-12):
        low, high = s2 / (1.0 + s2), (dim / rank + s2) / (1.0 + s2)
        raise KvasymError(f"{where}: alignment {model.alignment:g} is outside what rank {rank} keys allow at "
                          f"d = {dim} (noise {noise:g}): [{low:.4g}, {high:.4g}]")
    return min(share, 1.0)


def check_query_model(model: QueryModel, kind: str, dim: int, rank: int | None, noise: float,
                      where: str = "query model") -> None:
    """Refuse, naming ``where``, a calibrated alignment on keys other than ``low_rank`` or one
    outside the range the keys' rank allows at ``dim`` (module docstring)."""
    if model.alignment is None:
        return
    if kind != "low_rank" or rank is None:
        raise KvasymError(f"{where}: a calibrated alignment ({model.name}) needs low_rank keys, got kind {kind!r}")
    _low_rank_share(model, dim, rank, noise, where)


def expected_alignment(model: QueryModel, kind: str, dim: int, rank: int | None = None,
                       noise: float = 0.0) -> float:
    """``E[a]`` of a model's queries against the keys' population covariance (closed forms of the
    module docstring): ``isotropic`` 1, ``a<x>`` x, ``subspace`` on ``low_rank`` keys
    ``((d / r) E f + sigma^2) / (1 + sigma^2)``: d / r without noise. With noise the subspace
    rule's query is ``sqrt(d / r) W z + sigma e``, so ``||P q||^2 = c_A X`` and
    ``||(I - P) q||^2 = c_B Y`` with ``X ~ chi^2_r``, ``Y ~ chi^2_(d - r)`` independent,
    ``c_A = d / r + sigma^2``, ``c_B = sigma^2``, and

        E f = E[A / (A + B)] = int_0^inf E[A e^(-tA)] E[e^(-tB)] dt
            = int_0^inf c_A r (1 + 2 c_A t)^(-r/2 - 1) (1 + 2 c_B t)^(-(d - r)/2) dt

    (from ``1 / s = int_0^inf e^(-ts) dt``), computed by quadrature. NaN where the study gives
    no closed form (``subspace`` on ``student_t`` or ``concentrated`` keys); gaussian keys give 1."""
    if model.name == "isotropic":
        return 1.0
    if model.alignment is not None:
        return float(model.alignment)
    if kind == "gaussian":
        return 1.0
    if kind != "low_rank" or rank is None:
        return math.nan
    s2 = noise * noise
    if s2 == 0.0 or rank == dim:
        return dim / rank if s2 == 0.0 else 1.0
    from scipy.integrate import quad

    c_a, c_b = dim / rank + s2, s2

    def integrand(t: float) -> float:
        return c_a * rank * (1 + 2 * c_a * t) ** (-rank / 2 - 1) * (1 + 2 * c_b * t) ** (-(dim - rank) / 2)

    share = quad(integrand, 0.0, math.inf, limit=200)[0]
    return ((dim / rank) * share + s2) / (1.0 + s2)


def expected_inverse_alignment(model: QueryModel, dim: int, rank: int) -> float:
    """``E[1 / a]`` of a model's queries on noise-free rank-``rank`` keys at ``dim`` (module
    docstring): ``subspace`` r / d, ``a<x>`` 1 / x, ``isotropic`` ``r (d - 2) / (d (r - 2))`` for
    ``2 < r < d`` (1 at r = d), ``inf`` for r <= 2. The second-order KL of a query scales as
    ``1 / a``, so ratios of these predict ratios of mean KL between query models."""
    if model.name == "isotropic":
        if rank >= dim:
            return 1.0
        return rank * (dim - 2) / (dim * (rank - 2)) if rank > 2 else math.inf
    if model.alignment is not None:
        return 1.0 / float(model.alignment)
    return rank / dim


def draw_model_queries(model: QueryModel, kind: str, n: int, dim: int, basis: np.ndarray | None, noise: float,
                       gen: np.random.Generator, where: str = "query model") -> np.ndarray:
    """``n`` query directions (float64, (n, dim), norm of order sqrt(d)) of a non-default model;
    the logit rule rescales them afterwards. ``basis``: the keys' orthonormal (dim, rank) subspace
    basis for ``low_rank`` keys (needed by ``a<x>``)."""
    if model.is_default:
        raise KvasymError("the subspace model draws from the keys' family (kvasym.distributions), not here")
    if model.name == "isotropic":
        return gen.standard_normal((n, dim))
    if kind != "low_rank" or basis is None:
        raise KvasymError(f"{where}: a calibrated alignment ({model.name}) needs low_rank keys, got kind {kind!r}")
    rank = basis.shape[1]
    share = _low_rank_share(model, dim, rank, noise, where)
    inside = gen.standard_normal((n, rank)) @ basis.T
    g = gen.standard_normal((n, dim))
    outside = g - (g @ basis) @ basis.T
    u_in = inside / np.linalg.norm(inside, axis=1, keepdims=True)
    out_norm = np.linalg.norm(outside, axis=1, keepdims=True)
    u_out = np.divide(outside, out_norm, out=np.zeros_like(outside), where=out_norm > 0)
    return math.sqrt(dim) * (math.sqrt(share) * u_in + math.sqrt(1.0 - share) * u_out)


def query_alignment(queries: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Measured alignment ``a_i = q_i^T C q_i / (||q_i||^2 tr C / d)`` of each query (rows of
    ``queries``, (n_q, d)) with the centred sample covariance ``C`` (ddof = 0) of ``keys`` (n, d),
    float64 (n_q,). The centring matches the logits' spread: ``Var_k(q . k) = q^T C q``. NaN for
    a zero query or keys without spread.

    Computed as ``mean_k ((q . (k - kbar))^2) d / (||q||^2 sum_k ||k - kbar||^2 / n)``, without
    forming C (O(n_q n d))."""
    q = np.asarray(queries, dtype=np.float64)
    k = np.asarray(keys, dtype=np.float64)
    if q.ndim != 2 or k.ndim != 2 or q.shape[1] != k.shape[1]:
        raise KvasymError(f"query_alignment needs (n_q, d) queries and (n, d) keys, got {q.shape} and {k.shape}")
    centred = k - k.mean(axis=0)
    scale = float(np.max(np.abs(centred))) if centred.size else 0.0
    if scale == 0.0 or not math.isfinite(scale):
        return np.full(q.shape[0], np.nan)
    centred = centred / scale
    qn = q / np.where(np.linalg.norm(q, axis=1, keepdims=True) > 0, np.linalg.norm(q, axis=1, keepdims=True), 1.0)
    spread = np.mean((qn @ centred.T) ** 2, axis=1)
    trace = float(np.sum(centred * centred)) / k.shape[0]
    out = spread * q.shape[1] / trace
    out[np.linalg.norm(q, axis=1) == 0] = np.nan
    return out
