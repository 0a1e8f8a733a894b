"""The six-dimensional error framework, KL divergence and routing recall.

Error coordinates of an estimate ``x_hat`` of a vector ``x`` (spec part B):

- scale: ``SNR = ||x||^2 / ||x - x_hat||^2`` (unitless power ratio), reported as
  ``snr_db = 10 log10 SNR`` (decibels) and ``eff_bits = 0.5 log2 SNR`` (Shannon effective bits);
- direction: ``phi = angle(x, x_hat)`` in radians, in [0, pi], and ``eps_dir = 1 - cos(phi)``
  (unitless, in [0, 2]).

At three sites, K (key cache), V (value cache) and T (attention output), these give the six
numbers per sample (scale and direction at each site).

Conventions (documented constants, chosen so results hold no NaN and no infinity):

- SNR cap: the SNR is clipped to ``[2**-SNR_CAP_LOG2, 2**SNR_CAP_LOG2]`` with
  ``SNR_CAP_LOG2 = 104``. An error below float64 resolution (relative error
  ``||x - x_hat|| / ||x|| < 2**-52``, the float64 machine epsilon) is indistinguishable from
  rounding, so it is reported as ``eff_bits = 52`` (the float64 mantissa width),
  ``snr_db = 313.07``; this includes exact reconstruction (zero error, SNR = inf) and the
  0/0 case ``x = x_hat = 0``. Symmetrically ``x = 0`` with a non-zero estimate (SNR = 0) is
  reported as ``eff_bits = -52``, ``snr_db = -313.07``.
- Angle with a zero vector: ``phi = 0`` if both are zero (perfect), ``phi = pi/2``
  (``eps_dir = 1``, no directional information) if exactly one is zero.
- phi is computed by Kahan's formula ``2 atan2(||u - v||, ||u + v||)`` on the unit vectors,
  accurate at every angle (``arccos`` of a clipped cosine loses half the digits near 0), and
  ``eps_dir = 2 sin^2(phi / 2)`` for the same reason.
- Per-trial aggregates for the cache sites K and V: the scale is the SNR of the whole matrix,
  ``sum_i ||x_i||^2 / sum_i ||x_i - x_hat_i||^2`` (an energy-weighted pooling), while ``phi``
  and ``eps_dir`` are the MEAN over rows of the per-row angle and per-row ``eps_dir`` (note
  ``mean eps_dir != 1 - cos(mean phi)``; both are means of per-vector errors). The T site is
  reported per query.
- KL(p || p_hat) per query in nats with ``0 log 0 = 0``; masked entries are ignored. Rounding
  can make a true zero KL come out as a tiny negative number: values in ``[-1e-12, 0)`` are
  set to 0, anything more negative is left as is (it would reveal a bug).
- Top-k recall ``|topk(p) & topk(p_hat)| / k``; ties are broken by key index (the lower index
  ranks first); with fewer than ``k`` allowed keys, ``k`` becomes the number of allowed keys.
- Bounded measures beside KL (issue 14, point 7: KL reaches 1e3-1e5 nats on near-one-hot
  attention, where it stops describing how much attention moved): total variation
  ``TV = 1/2 sum_j |p_j - p_hat_j|`` in [0, 1], Jensen-Shannon divergence
  ``JS = 1/2 KL(p || m) + 1/2 KL(p_hat || m)``, ``m = (p + p_hat) / 2``, in nats, in [0, ln 2],
  and top-1 agreement (1 if ``argmax p = argmax p_hat``, ties to the lower index, else 0). A
  *catastrophic* query is one whose top-1 key flips while more than half the attention mass
  moves: ``top1 = 0`` and ``TV > CATASTROPHIC_TV = 0.5`` (the spec's argmax-shift failure).

References
----------
.. [1] Kullback, S., Leibler, R. A. (1951) "On information and sufficiency", Ann. Math. Statist.
   22(1):79-86.
.. [2] Lin, J. (1991) "Divergence measures based on the Shannon entropy", IEEE Trans. Inf.
   Theory 37(1):145-151.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from kvasym.attention import AttentionResult, attend_logits, attention_logits, check_mask
from kvasym.errors import KvasymError
from kvasym.kernels import compiled_loops, compiled_metric_loops

__all__ = [
    "SNR_CAP_LOG2",
    "eps_dir_from_phi",
    "snr_db_from_eff_bits",
    "EFF_BITS_CAP",
    "SNR_DB_CAP",
    "KL_ROUNDING_TOL",
    "ROUTING_TOPK",
    "LOGIT_LIMIT",
    "CATASTROPHIC_TV",
    "error_coordinates",
    "matrix_coordinates",
    "kl_divergence",
    "topk_recall",
    "distribution_distances",
    "catastrophic",
    "trial_metrics",
    "trial_metrics_multi",
    "trial_reference",
    "TrialReference",
    "METRIC_KERNELS",
]

SNR_CAP_LOG2 = 104.0
"""log2 of the SNR cap: SNR is clipped to [2**-104, 2**104] (eff_bits in [-52, 52])."""
EFF_BITS_CAP = 0.5 * SNR_CAP_LOG2
"""Largest reported effective bits, 52 (float64 mantissa width)."""
SNR_DB_CAP = 10.0 * math.log10(2.0) * SNR_CAP_LOG2
"""Largest reported SNR in decibels, about 313.07 dB."""
KL_ROUNDING_TOL = 1e-12
"""Negative KL values no smaller than -KL_ROUNDING_TOL are rounding noise and set to 0."""
ROUTING_TOPK = 5
"""k of the routing recall reported by :func:`trial_metrics` (column ``recall_top5``)."""
LOGIT_LIMIT = 1e150
"""Largest |logit| :func:`trial_metrics` accepts. Past it the per-key logit-error variance (a
square) overflows float64 and attention is one-hot to the last bit anyway; with the query rule
of :mod:`kvasym.distributions` logits are O(sharpness), so only foreign caches get here."""

CATASTROPHIC_TV = 0.5
"""A query is catastrophic when its top-1 key flips AND its total variation exceeds this: more
than half of the attention mass lands elsewhere (the argmax-shift failure of spec part A)."""

_DB_PER_LOG2 = 10.0 * math.log10(2.0)


def snr_db_from_eff_bits(eff_bits: np.ndarray) -> np.ndarray:
    """``snr_db = 20 log10(2) eff_bits``: both are the same ``log2 SNR`` in other units
    (``snr_db = 10 log10 SNR``, ``eff_bits = 0.5 log2 SNR``), so this equals the ``snr_db`` of
    :func:`error_coordinates` to the rounding of ``eff_bits`` (exactly, for float64 input: the
    factor 2 is exact). The per-query tables store ``t_eff_bits`` only and derive ``t_snr_db``
    with it (:data:`kvasym.dataset.DERIVED_COLUMNS`).
    """
    return (2.0 * _DB_PER_LOG2) * np.asarray(eff_bits, dtype=np.float64)


def eps_dir_from_phi(phi: np.ndarray) -> np.ndarray:
    """``eps_dir = 1 - cos(phi) = 2 sin^2(phi / 2)`` of an angle ``phi`` in radians, in the
    second form, as :func:`error_coordinates` computes it: no cancellation at small angles, and
    a relative error of at most about twice that of ``phi`` (the condition number
    ``(phi / 2) cot(phi / 2)`` is at most 1 on [0, pi]). The per-query tables store ``t_phi``
    only and derive ``t_eps_dir`` with it (:data:`kvasym.dataset.DERIVED_COLUMNS`); a per-trial
    ``eps_dir`` of the K or V site is a mean over rows and is no function of the mean angle.
    """
    return 2.0 * np.sin(0.5 * np.asarray(phi, dtype=np.float64)) ** 2


def _checked(x: np.ndarray, what: str) -> np.ndarray:
    """``x`` as float64, with a coordinate per row and finite."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 0 or a.shape[-1] == 0:
        raise KvasymError(f"{what} must have at least one coordinate per row, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise KvasymError(f"{what} contains non-finite values")
    return a


def _hat_of(reference: np.ndarray, x_hat: np.ndarray, what: str) -> np.ndarray:
    """``x_hat`` as float64, of ``reference``'s shape and finite (``reference`` already checked)."""
    b = np.asarray(x_hat, dtype=np.float64)
    if b.shape != reference.shape:
        raise KvasymError(f"{what} has shape {reference.shape} but {what}_hat has shape {b.shape}")
    if not np.all(np.isfinite(b)):
        raise KvasymError(f"{what}_hat contains non-finite values")
    return b


def _pair(x: np.ndarray, x_hat: np.ndarray, what: str = "x") -> tuple[np.ndarray, np.ndarray]:
    a = _checked(x, what)
    return a, _hat_of(a, x_hat, what)


def _norms(a: np.ndarray) -> np.ndarray:
    """Euclidean norms over the last axis, without overflow or underflow of the squares.

    Plain sums of squares where they are safely inside float64's range; rows outside it (huge
    heavy-tailed entries, or tiny ones whose squares underflow) are rescaled by their max |entry|.
    """
    squares = np.asarray(np.einsum("...i,...i->...", a, a))
    risky = ~((squares > 1e-290) & (squares < 1e290))
    norms = np.array(np.sqrt(squares))
    if np.any(risky):
        rows = a[risky]
        scale = np.max(np.abs(rows), axis=-1)
        safe = np.where(scale > 0, scale, 1.0)
        norms[risky] = scale * np.sqrt(np.sum((rows / safe[..., None]) ** 2, axis=-1))
    return norms


def _log2_snr(signal_norm: np.ndarray, error_norm: np.ndarray) -> np.ndarray:
    """Clipped log2 SNR from norms (log domain: no overflow of the ratio)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        log2_snr = 2.0 * (np.log2(signal_norm) - np.log2(error_norm))
    # 0/0 (x = x_hat = 0) is a perfect reconstruction: report the cap.
    log2_snr = np.where(np.isnan(log2_snr), SNR_CAP_LOG2, log2_snr)
    return np.clip(log2_snr, -SNR_CAP_LOG2, SNR_CAP_LOG2)


def _angle(a: np.ndarray, b: np.ndarray, na: np.ndarray) -> np.ndarray:
    """Angle between rows (last axis) of a and b in radians, Kahan's formula (``na``: the
    norms of a, which its one caller has already)."""
    nb = _norms(b)
    ua = a / np.where(na > 0, na, 1.0)[..., None]
    ub = b / np.where(nb > 0, nb, 1.0)[..., None]
    phi = 2.0 * np.arctan2(_norms(ua - ub), _norms(ua + ub))
    one_zero = (na > 0) != (nb > 0)
    both_zero = (na == 0) & (nb == 0)
    return np.where(one_zero, math.pi / 2, np.where(both_zero, 0.0, phi))


def error_coordinates(x: np.ndarray, x_hat: np.ndarray) -> dict[str, np.ndarray]:
    """Scale and direction error of each row (last axis) of ``x_hat`` as an estimate of ``x``.

    Returns float64 arrays of shape ``x.shape[:-1]``: ``snr`` (power ratio, capped),
    ``snr_db`` (dB), ``eff_bits`` (bits), ``phi`` (radians), ``eps_dir`` (unitless).
    Inputs must be finite and of equal shape.

    Parameters
    ----------
    x : array_like
        Reference vectors along the last axis.
    x_hat : array_like
        Estimates, same shape as ``x``.

    Returns
    -------
    dict of str to numpy.ndarray
        ``snr = clip(||x||^2 / ||x - x_hat||^2, 2**-104, 2**104)``,
        ``snr_db = 10 log10 snr``, ``eff_bits = 0.5 log2 snr``,
        ``phi = 2 atan2(||u - v||, ||u + v||)`` for the unit vectors ``u, v`` of ``x, x_hat``
        (0 if both are zero, pi/2 if exactly one is), ``eps_dir = 2 sin^2(phi / 2)``
        ``= 1 - cos(phi)``.

    Raises
    ------
    KvasymError
        If the shapes differ, there is no coordinate, or a value is not finite.
    """
    a, b = _pair(x, x_hat)
    return _error_coordinates(a, b, a - b)


def _error_coordinates(a: np.ndarray, b: np.ndarray, diff: np.ndarray, loops=None) -> dict[str, np.ndarray]:
    """:func:`error_coordinates` of checked float64 inputs and their difference ``a - b``. With
    ``loops`` (:mod:`kvasym._metrics_numba`) and 2-D inputs the norms and angles come from its
    row pass (equal to rounding: sums in row order), unless a row needs the reference's
    rescaling."""
    fast = loops is not None and a.ndim == 2
    if fast:
        na, nd, phi = np.empty(a.shape[0]), np.empty(a.shape[0]), np.empty(a.shape[0])
        fast = loops.row_errors(np.ascontiguousarray(a), np.ascontiguousarray(b), na, nd, phi)
    if not fast:
        na, nd = _norms(a), _norms(diff)
        phi = _angle(a, b, na)
    log2_snr = _log2_snr(na, nd)
    return {
        "snr": np.exp2(log2_snr),
        "snr_db": _DB_PER_LOG2 * log2_snr,
        "eff_bits": 0.5 * log2_snr,
        "phi": phi,
        "eps_dir": eps_dir_from_phi(phi),
    }


def matrix_coordinates(x: np.ndarray, x_hat: np.ndarray) -> dict[str, float]:
    """Per-trial aggregate of a cache matrix (rows = vectors), see the module conventions.

    ``snr``, ``snr_db``, ``eff_bits``: whole-matrix SNR ``sum ||x_i||^2 / sum ||x_i - x_hat_i||^2``;
    ``phi``, ``eps_dir``: mean over rows of the per-row angle (radians) and ``eps_dir``.

    Parameters
    ----------
    x : array_like
        ``(rows, dim)`` reference matrix.
    x_hat : array_like
        Its estimate, same shape.

    Returns
    -------
    dict of str to float
        ``snr``, ``snr_db``, ``eff_bits`` (capped as in :func:`error_coordinates`), ``phi``,
        ``eps_dir``.

    Raises
    ------
    KvasymError
        If the inputs are not finite 2-D matrices of equal shape.
    """
    a, b = _pair(x, x_hat)
    return _matrix_coordinates(a, b)[0]


def _matrix_coordinates(a: np.ndarray, b: np.ndarray, loops=None) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """:func:`matrix_coordinates` of checked float64 inputs, and the per-row
    :func:`error_coordinates` it averages (a caller that needs both computes them once);
    ``loops`` as :func:`_error_coordinates`."""
    if a.ndim != 2:
        raise KvasymError(f"x must be a 2-D matrix (rows, dim), got shape {a.shape}")
    diff = a - b
    rows = _error_coordinates(a, b, diff, loops)
    log2_snr = float(_log2_snr(_norms(a.reshape(-1)), _norms(diff.reshape(-1))))
    return {
        "snr": float(np.exp2(log2_snr)),
        "snr_db": _DB_PER_LOG2 * log2_snr,
        "eff_bits": 0.5 * log2_snr,
        "phi": float(np.mean(rows["phi"])),
        "eps_dir": float(np.mean(rows["eps_dir"])),
    }, rows


def kl_divergence(
    log_p: np.ndarray, log_q: np.ndarray, mask: np.ndarray | None = None, *, p: np.ndarray | None = None
) -> np.ndarray:
    """KL(p || q) in nats per row (last axis) from log-probabilities, float64 (n_rows,).

    ``0 log 0 = 0``: entries with ``p = 0`` (including masked ones, log p = -inf) contribute
    nothing; an optional boolean ``mask`` (True = allowed) excludes entries explicitly. An
    entry with ``p > 0`` and ``q = 0`` gives +inf, the true value.

    Parameters
    ----------
    log_p : array_like
        Log-probabilities of the reference ``p``.
    log_q : array_like
        Log-probabilities of the approximation ``q``, same shape.
    mask : array_like, optional
        Boolean, same shape, True = allowed.
    p : numpy.ndarray, optional
        ``np.exp(log_p)`` when the caller has it already (float64, same shape; the attention's
        weights are exactly that), saving one exponential pass.

    Returns
    -------
    numpy.ndarray
        ``KL(p || q) = sum_j p_j (log p_j - log q_j)`` over the support of ``p`` (and the
        mask), per row; values in ``[-KL_ROUNDING_TOL, 0)`` are set to 0.

    Raises
    ------
    KvasymError
        If the shapes differ or the mask is not boolean of the same shape.

    References
    ----------
    .. [1] Kullback, S., Leibler, R. A. (1951) "On information and sufficiency", Ann. Math.
       Statist. 22(1):79-86.
    """
    lp = np.asarray(log_p, dtype=np.float64)
    lq = np.asarray(log_q, dtype=np.float64)
    if lp.shape != lq.shape:
        raise KvasymError(f"log_p has shape {lp.shape} but log_q has shape {lq.shape}")
    if p is None or p.shape != lp.shape or p.dtype != np.float64:
        p = np.exp(lp)
    support = p > 0
    if mask is not None:
        m = np.asarray(mask)
        if m.dtype != np.bool_ or m.shape != lp.shape:
            raise KvasymError(
                f"mask must be a boolean array of shape {lp.shape}, got {m.dtype} {m.shape}"
            )
        support &= m
    with np.errstate(invalid="ignore"):
        # lp - lq is inf - inf = NaN only off the support, which np.where discards.
        terms = np.where(support, p * (lp - lq), 0.0)
    kl = np.sum(terms, axis=-1)
    return np.where((kl < 0) & (kl >= -KL_ROUNDING_TOL), 0.0, kl)


def _topk_members(p: np.ndarray, k_row: np.ndarray) -> np.ndarray:
    """Boolean (n_rows, n_keys): the k_row[i] largest entries of each row, ties to lower index.

    The same set as the first k of a stable descending sort, in O(n) per row: every entry above
    the k-th largest value, then tied entries in index order. The k-th largest value comes from
    ``np.partition`` (introselect, O(n)), one call per distinct k; it is an element of the row,
    so the set is exactly the one a full sort gives.
    """
    n_keys = p.shape[-1]
    kth = np.empty((p.shape[0], 1))
    for k in np.unique(k_row):
        rows = np.flatnonzero(k_row == k)
        kth[rows, 0] = np.partition(p[rows], n_keys - k, axis=-1)[:, n_keys - k]
    above = p > kth
    ties = p == kth
    need = k_row - above.sum(axis=-1)
    members = above | ties
    # only rows with more ties at the k-th value than places left need the index order (the
    # cumulative count); in the others every tied entry is in the set
    over = np.flatnonzero(ties.sum(axis=-1) > need)
    if over.size:
        members[over] = above[over] | (ties[over] & (np.cumsum(ties[over], axis=-1) <= need[over, None]))
    return members


#: Smallest (rows x keys) matrix :func:`topk_recall` sends to the compiled scan
#: (:func:`kvasym._stats_numba.topk_overlap`) when numba imports: a real-model trial (1,536 x 512)
#: goes there, the synthetic trials (64 x 1,024) stay on numpy, whose metrics jobs last ~2 s and
#: would pay numba's import (~0.5 s) for little.
TOPK_KERNEL_MIN = 1 << 19


def topk_recall(
    p: np.ndarray, p_hat: np.ndarray, k: int = ROUTING_TOPK, mask: np.ndarray | None = None
) -> np.ndarray:
    """``|topk(p) & topk(p_hat)| / k`` per row (n_rows,), in [0, 1].

    Ties are broken by index (lower first). ``k`` is reduced to the number of keys, or per
    row to the number of allowed keys under ``mask`` (bool, True = allowed).

    Parameters
    ----------
    p : array_like
        ``(n_rows, n_keys)`` reference attention weights.
    p_hat : array_like
        Approximate weights, same shape.
    k : int, optional
        Size of the top set (default :data:`ROUTING_TOPK`).
    mask : array_like, optional
        Boolean ``(n_rows, n_keys)``, True = allowed; masked keys never enter a top set.

    Returns
    -------
    numpy.ndarray
        ``|topk(p) & topk(p_hat)| / k_row`` per row, ``k_row = min(k, allowed keys)``.

    Raises
    ------
    KvasymError
        If ``p`` and ``p_hat`` are not 2-D of equal shape, ``k`` is not an integer >= 1, or
        the mask is invalid.
    """
    a = np.asarray(p, dtype=np.float64)
    b = np.asarray(p_hat, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 2:
        raise KvasymError(f"p and p_hat must be 2-D of equal shape, got {a.shape} and {b.shape}")
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) or k < 1:
        raise KvasymError(f"k must be an integer >= 1, got {k!r}")
    n_rows, n_keys = a.shape
    if a.size >= TOPK_KERNEL_MIN and np.isfinite(a).all() and np.isfinite(b).all():
        compiled = compiled_loops()
        if compiled is not None:
            m = np.ones(a.shape, dtype=bool) if mask is None else check_mask(mask, n_rows, n_keys)
            k_row = np.minimum(int(k), m.sum(axis=1))
            return compiled.topk_overlap(a, b, m, k_row) / k_row
    if mask is None:
        k_row = np.full(n_rows, min(int(k), n_keys))
    else:
        m = check_mask(mask, n_rows, n_keys)
        # Masked keys rank below every allowed key (their weight is 0 but ties must not pick them).
        a = np.where(m, a, -np.inf)
        b = np.where(m, b, -np.inf)
        k_row = np.minimum(int(k), m.sum(axis=1))
    same = _topk_members(a, k_row) & _topk_members(b, k_row)
    return same.sum(axis=-1) / k_row


#: Share of live (allowed, not both-zero) entries below which :func:`distribution_distances`
#: evaluates its terms on the live entries only (a causal mask leaves about half).
LIVE_SHARE_COMPRESSED = 0.75


def _js_g(r: np.ndarray) -> np.ndarray:
    """``g(r) = (1 + r) log(1 + r) + (1 - r) log(1 - r)`` elementwise, r in [-1, 1]: ``2 r atanh(r)
    + log1p(-r^2)`` below |r| = 1/2 (no cancellation of the terms linear in r), the defining
    form from 1/2 to 1 (where ``log1p(-r^2)`` would round ``r^2`` next to 1: a relative error of
    1e-7 at ``1 - r = 1e-9``), ``2 ln 2`` at |r| = 1."""
    abs_r = np.abs(r)
    g = np.full(r.shape, 2.0 * math.log(2.0))
    small = abs_r < 0.5
    rs = r[small]
    g[small] = 2.0 * rs * np.arctanh(rs) + np.log1p(-rs * rs)
    middle = (abs_r >= 0.5) & (abs_r < 1.0)
    rm = r[middle]
    g[middle] = (1.0 + rm) * np.log1p(rm) + (1.0 - rm) * np.log1p(-rm)
    return g


def _distance_terms(lp: np.ndarray, lq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The TV and JS terms ``m |r|`` and ``m g(r)`` of live entries (1-D log-probabilities), by
    :func:`distribution_distances`'s formulas, element for element."""
    with np.errstate(invalid="ignore", divide="ignore"):
        m = np.exp(np.logaddexp(lp, lq) - math.log(2.0))
        r = np.tanh(0.5 * (lp - lq))
    return m * np.abs(r), m * _js_g(r)


def distribution_distances(
    log_p: np.ndarray, log_q: np.ndarray, mask: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """Total variation, Jensen-Shannon divergence and top-1 agreement per row (last axis).

    Parameters
    ----------
    log_p : array_like
        ``(n_rows, n_keys)`` log-probabilities of the reference ``p`` (rows sum to 1 in
        probability; ``-inf`` for impossible entries).
    log_q : array_like
        Log-probabilities of the approximation ``q``, same shape.
    mask : array_like, optional
        Boolean, same shape, True = allowed; masked entries are ignored (they never win the
        argmax and contribute nothing).

    Returns
    -------
    dict of str to numpy.ndarray
        Float64 arrays of shape ``(n_rows,)``:

        - ``tv = 1/2 sum_j |p_j - q_j|`` in [0, 1];
        - ``js = 1/2 sum_j [p_j log(p_j / m_j) + q_j log(q_j / m_j)]``, ``m = (p + q) / 2``,
          in nats, in [0, ln 2] (Lin 1991; ``0 log 0 = 0``); scipy's
          ``jensenshannon(p, q) ** 2`` (which returns the square root of this);
        - ``top1``: 1.0 if ``argmax_j p_j = argmax_j q_j`` (ties to the lower index), else 0.0.

    Raises
    ------
    KvasymError
        If the shapes differ, the inputs are not 2-D, or the mask is invalid.

    Notes
    -----
    Both distances are computed from ``m_j`` and ``r_j = (p_j - q_j) / (p_j + q_j)
    = tanh((log p_j - log q_j) / 2)`` in [-1, 1], taken from the log-probabilities (accurate
    however small the weights):

    - ``tv = sum_j m_j |r_j|``;
    - ``js = 1/2 sum_j m_j g(r_j)`` with ``g(r) = (1 + r) log(1 + r) + (1 - r) log(1 - r)
      = 2 r atanh(r) + log1p(-r^2)``, ``g(+-1) = 2 ln 2``. The second form, used below
      ``|r| = 1/2``, has no cancellation of the terms linear in ``r`` (``g(r) ~ r^2`` for small
      ``r``), so ``js >= 0`` holds to rounding even when ``p`` and ``q`` agree to 1e-8; the
      first, used above, keeps ``1 - r^2`` exact near ``|r| = 1``.

    Disjoint supports give ``tv = 1`` and ``js = ln 2``; ``q = p`` gives 0 for both. The
    two are tied by ``tv^2 / 2 <= js <= ln 2 * tv`` (the upper bound: ``g(r) / 2`` is convex
    with ``g(0) = 0`` and ``g(+-1) / 2 = ln 2``, so ``g(r) / 2 <= ln 2 |r|``; the lower: Pinsker's
    inequality on each half, ``KL(p || m) >= 2 TV(p, m)^2 = tv^2 / 2``).

    References
    ----------
    .. [1] Lin, J. (1991) "Divergence measures based on the Shannon entropy", IEEE Trans. Inf.
       Theory 37(1):145-151.
    """
    lp = np.asarray(log_p, dtype=np.float64)
    lq = np.asarray(log_q, dtype=np.float64)
    if lp.shape != lq.shape or lp.ndim != 2:
        raise KvasymError(f"log_p and log_q must be 2-D of equal shape, got {lp.shape} and {lq.shape}")
    allowed = np.ones(lp.shape, dtype=bool) if mask is None else check_mask(mask, *lp.shape)
    both_zero = (lp == -np.inf) & (lq == -np.inf)
    live = allowed & ~both_zero
    if np.count_nonzero(live) < LIVE_SHARE_COMPRESSED * live.size:
        # mostly dead (a causal mask hides half the keys): the transcendental functions run on
        # the live entries only (36% less time measured at 1536 x 512) and the terms are
        # scattered back into zeros, so each row is summed over the same full-length array in
        # the same pairwise order as below: bit-identical (numpy's elementwise functions do not
        # depend on an element's position; tests/test_metrics.py compares the two paths)
        tv_terms = np.zeros(lp.shape)
        js_terms = np.zeros(lp.shape)
        tv_terms[live], js_terms[live] = _distance_terms(lp[live], lq[live])
    else:
        with np.errstate(invalid="ignore", divide="ignore"):
            log_m = np.logaddexp(lp, lq) - math.log(2.0)
            m = np.where(live, np.exp(log_m), 0.0)
            r = np.where(live, np.tanh(0.5 * (lp - lq)), 0.0)  # +-inf differences give +-1
            g = _js_g(r)
        tv_terms = m * np.abs(r)
        js_terms = m * np.where(live, g, 0.0)
    tv = np.sum(tv_terms, axis=-1)
    js = 0.5 * np.sum(js_terms, axis=-1)
    a = np.where(allowed, lp, -np.inf)
    b = np.where(allowed, lq, -np.inf)
    top1 = (np.argmax(a, axis=-1) == np.argmax(b, axis=-1)).astype(np.float64)
    return {"tv": np.minimum(tv, 1.0), "js": np.clip(js, 0.0, math.log(2.0)), "top1": top1}


def catastrophic(top1: np.ndarray, tv: np.ndarray) -> np.ndarray:
    """1.0 where the top-1 key flipped (``top1 == 0``) and ``tv > CATASTROPHIC_TV``, else 0.0.

    Parameters
    ----------
    top1 : array_like
        Top-1 agreement per query (1.0 or 0.0), from :func:`distribution_distances`.
    tv : array_like
        Total variation per query, same shape.

    Returns
    -------
    numpy.ndarray
        Float64 indicator, same shape (a mean over queries is the catastrophic share).
    """
    t1 = np.asarray(top1, dtype=np.float64)
    d = np.asarray(tv, dtype=np.float64)
    if t1.shape != d.shape:
        raise KvasymError(f"top1 has shape {t1.shape} but tv has shape {d.shape}")
    return ((t1 == 0.0) & (d > CATASTROPHIC_TV)).astype(np.float64)


def _check_logit_range(q: np.ndarray, named_scores: dict[str, np.ndarray], sharpness: Sequence[float]) -> None:
    """Refuse logits that are not finite or beyond LOGIT_LIMIT, naming the inputs at fault.

    Finite inputs can still give an infinite q.k (entries near 1e300), which would surface as
    NaN deep inside the softmax; this says so up front instead."""
    if not np.all(np.isfinite(q)):
        raise KvasymError("queries contain non-finite values")
    s_max = max((abs(float(s)) for s in sharpness), default=1.0)
    if not math.isfinite(s_max):
        raise KvasymError(f"sharpness must be finite, got {list(sharpness)}")
    for what, x in named_scores.items():
        # one pass in the usual case: a finite max |x| means every entry is finite (a NaN or
        # an inf would make it NaN or inf), and it is then the peak the full check computes
        peak = float(np.max(np.abs(x), initial=0.0))
        if math.isfinite(peak) and s_max * peak <= LOGIT_LIMIT:
            continue
        finite = np.isfinite(x)
        peak = float(np.max(np.abs(np.where(finite, x, 0.0)), initial=0.0))
        if not finite.all() or s_max * peak > LOGIT_LIMIT:
            shown = "inf (float64 overflow)" if not finite.all() else f"{s_max * peak:.3g}"
            raise KvasymError(
                f"attention logits of the {what} reach {shown}, beyond {LOGIT_LIMIT:g}: "
                "rescale the queries or keys (attention would be one-hot and the logit-error variance overflow)"
            )


def trial_metrics(
    queries: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    keys_hat: np.ndarray,
    values_hat: np.ndarray,
    sharpness: float,
    mask: np.ndarray | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """All metrics of one trial: reference (K, V) versus quantized (K_hat, V_hat) attention.

    Returns ``(per_query, per_key)``, dicts of equal-length 1-D arrays (Parquet-ready columns).

    per_query (n_queries rows): ``query`` (index); ``kl`` (KL(p || p_hat), nats);
    ``recall_top5``; ``tv``, ``js`` (nats), ``top1`` and ``catastrophic`` (0/1) of
    :func:`distribution_distances` and :func:`catastrophic`; ``t_snr_db``, ``t_eff_bits``,
    ``t_phi``, ``t_eps_dir`` of the attention output of that query; ``{k,v}_snr_db``, ``{k,v}_eff_bits``, ``{k,v}_phi``,
    ``{k,v}_eps_dir``: the per-trial cache aggregates (:func:`matrix_coordinates`) repeated on
    every row.

    per_key (n_keys rows), for the Jensen-bias claim: ``key`` (index); ``n_queries`` (queries
    allowed to see the key); ``logit_err_mean`` and ``logit_err_var`` (mean and population
    variance over those queries of ``e_ij = logit_hat_ij - logit_ij``, sharpness included);
    ``weight_ref_mean`` and ``weight_hat_mean`` (mean over them of ``p_ij`` and ``p_hat_ij``);
    ``log_weight_excess`` (mean of ``log p_hat_ij - log p_ij`` over entries where both are
    finite); ``k_eps_dir`` and ``k_snr_db`` of the key itself; ``key_norm``, the reference key's
    Euclidean norm ``||k_j||`` (a key's norm sets both its logits' spread and its quantization
    error's scale, so the Jensen slope is also fitted holding it fixed). A key no query sees gets NaN
    in the averaged columns (impossible without a mask). For small errors
    ``log p_hat - log p ~= e - E_p[e]``; Jensen predicts larger weight for keys with larger
    logit-error variance.

    Parameters
    ----------
    queries : array_like
        ``(n_queries, dim)``.
    keys, values : array_like
        Reference caches, ``(n_keys, dim)`` and ``(n_keys, value_dim)``.
    keys_hat, values_hat : array_like
        Quantized caches, same shapes.
    sharpness : float
        Logit multiplier (see :func:`kvasym.attention.attention_logits`).
    mask : array_like, optional
        Boolean ``(n_queries, n_keys)``, True = allowed.

    Returns
    -------
    per_query : dict of str to numpy.ndarray
        Columns listed above, ``n_queries`` rows.
    per_key : dict of str to numpy.ndarray
        Columns listed above, ``n_keys`` rows.

    Raises
    ------
    KvasymError
        On shape mismatches, non-finite inputs, logits beyond :data:`LOGIT_LIMIT`, or an
        invalid mask.

    References
    ----------
    .. [1] Kullback, S., Leibler, R. A. (1951) "On information and sufficiency", Ann. Math.
       Statist. 22(1):79-86.
    """
    ((per_query, per_key),) = trial_metrics_multi(
        queries, keys, values, keys_hat, values_hat, [sharpness], mask
    )
    return per_query, per_key


class TrialReference:
    """The reference side of one trial, shared by every scheme and budget that quantizes it.

    Built by :func:`trial_reference`; :func:`trial_metrics_multi` takes it (``reference=``) in
    place of recomputing, for each (scheme, budget) of a unit, what depends on the reference
    cache alone: the checked inputs, the raw scores ``Q K^T / sqrt(d)``, the mask, and the
    reference attention at each sharpness (the log-softmax, its weights and ``p V``). The
    reference was half of the attention work of a cells or real_metrics job.

    Attributes
    ----------
    sources : tuple
        The ``(queries, keys, values, mask)`` objects it was built from (a caller must pass the
        same objects to :func:`trial_metrics_multi`; anything else is refused).
    queries, keys, values : numpy.ndarray
        Checked float64 copies (or views) of the inputs.
    scores : numpy.ndarray
        ``(n_queries, n_keys)`` logits at sharpness 1.
    mask, allowed : numpy.ndarray
        The checked mask (None when none was given) and the boolean matrix it allows (all True
        without a mask); ``count``: allowed queries per key.
    attention : dict of float to AttentionResult
        The reference attention at each sharpness.
    kernel : str
        ``"numpy"`` or ``"numba"``: the loops that computed it, and that
        :func:`trial_metrics_multi` uses for the quantized side.
    top_sets : dict of float to numpy.ndarray
        With the numba kernel, each sharpness's top-:data:`ROUTING_TOPK` key indices per query
        (``k_row``: the set sizes, ``min(k, allowed keys)``); empty with numpy.
    """

    def __init__(self, sources: tuple, queries: np.ndarray, keys: np.ndarray, values: np.ndarray,
                 scores: np.ndarray, mask: np.ndarray | None, allowed: np.ndarray,
                 attention: dict[float, AttentionResult], kernel: str, top_sets: dict[float, np.ndarray],
                 k_row: np.ndarray) -> None:
        self.sources = sources
        self.top_sets, self.k_row = top_sets, k_row
        self.queries, self.keys, self.values = queries, keys, values
        self.scores, self.mask, self.allowed = scores, mask, allowed
        self.count = allowed.sum(axis=0)
        self.attention = attention
        self.kernel = kernel


#: Kernels of :func:`trial_metrics_multi`: the numpy reference, the compiled row pass
#: (:mod:`kvasym._metrics_numba`), or ``"auto"`` (compiled when numba imports).
METRIC_KERNELS = ("numpy", "numba", "auto")


def _metric_loops(kernel: str):
    """The compiled row pass for ``kernel``, or None for the numpy reference."""
    if kernel not in METRIC_KERNELS:
        raise KvasymError(f"metrics kernel must be one of {list(METRIC_KERNELS)}, got {kernel!r}")
    if kernel == "numpy":
        return None
    loops = compiled_metric_loops()
    if loops is None and kernel == "numba":
        raise KvasymError("the numba metrics kernel needs numba: pip install -e '.[fast]' (or use kernel numpy)")
    return loops


def trial_reference(
    queries: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    sharpness: Sequence[float],
    mask: np.ndarray | None = None,
    *,
    kernel: str = "numpy",
) -> TrialReference:
    """The reference attention of one trial at every sharpness, for :func:`trial_metrics_multi`.

    Parameters
    ----------
    queries, keys, values, mask
        As in :func:`trial_metrics`.
    sharpness : sequence of float
        The logit multipliers the trial is measured at.
    kernel : {"numpy", "numba", "auto"}
        The numpy reference loops, the compiled row pass of :mod:`kvasym._metrics_numba` (equal
        to rounding, several times faster on real-model trials), or the compiled one when numba
        imports.

    Returns
    -------
    TrialReference

    Raises
    ------
    KvasymError
        On shape mismatches, non-finite inputs, logits beyond :data:`LOGIT_LIMIT`, an invalid
        mask, or ``kernel="numba"`` without numba.
    """
    loops = _metric_loops(kernel)
    k = _checked(keys, "keys")
    v = _checked(values, "values")
    if k.ndim != 2 or v.ndim != 2:
        raise KvasymError(f"keys and values must be 2-D matrices, got shapes {k.shape} and {v.shape}")
    q = np.asarray(queries, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):  # overflow (inf, inf - inf) is reported below
        scores = attention_logits(q, k, 1.0)
    n_q, n_k = scores.shape
    if n_k == 0:
        raise KvasymError("keys must have at least one row")
    _check_logit_range(q, {"keys": scores}, sharpness)
    checked = check_mask(mask, n_q, n_k)
    allowed = np.ones((n_q, n_k), dtype=bool) if checked is None else checked
    attention = {}
    top_sets: dict[float, np.ndarray] = {}
    k_row = np.minimum(ROUTING_TOPK, allowed.sum(axis=1))
    for s in sharpness:
        s = float(s)
        if s in attention:
            continue
        if loops is None:
            attention[s] = attend_logits(s * scores, v, checked)
        else:
            if v.shape[0] != n_k:
                raise KvasymError(f"values have {v.shape[0]} rows but keys have {n_k}")
            log_w = np.empty((n_q, n_k))
            w = np.empty((n_q, n_k))
            loops.log_softmax_rows(scores, s, allowed, log_w, w)
            attention[s] = AttentionResult(log_weights=log_w, weights=w, output=w @ v)
            top = np.empty((n_q, ROUTING_TOPK), dtype=np.int64)
            loops.topk_rows(w, allowed, k_row, top)
            top_sets[s] = top
    return TrialReference((queries, keys, values, mask), q, k, v, scores, checked, allowed, attention,
                          "numpy" if loops is None else "numba", top_sets, k_row)


def trial_metrics_multi(
    queries: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    keys_hat: np.ndarray,
    values_hat: np.ndarray,
    sharpness: Sequence[float],
    mask: np.ndarray | None = None,
    *,
    per_key: bool = True,
    kernel: str = "numpy",
    reference: TrialReference | None = None,
) -> list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """:func:`trial_metrics` at several sharpness values, one ``(per_query, per_key)`` each.

    The cache errors (K and V aggregates, per-key coordinates) and the raw scores
    ``Q K^T / sqrt(d)`` do not depend on the sharpness: they are computed once.

    Parameters
    ----------
    queries, keys, values, mask
        As in :func:`trial_metrics`.
    sharpness : sequence of float
        Logit multipliers, one result each.
    per_key : bool, optional
        Compute the per-key table (default True). Callers that keep only the per-query columns
        (the real-model rows) pass False and get an empty dict in its place: its five column
        means over the (queries, keys) matrix were a fifth of a real metrics job.
    kernel : {"numpy", "numba", "auto"}, optional
        As :func:`trial_reference` (ignored when ``reference`` is given: its kernel is used).
        The compiled row pass gives the same columns to rounding (KL, TV and JS within about
        1e-13 relative; top-1, top-5 recall and the catastrophic share can differ only where two
        weights tie to the last bit; the K and V error coordinates, whose norms and angles it sums
        in row order, to about 1e-15; the output site's are the reference's on both kernels).
    reference : TrialReference, optional
        The reference side, built by :func:`trial_reference` from these same ``queries``,
        ``keys``, ``values`` and ``mask`` objects and every sharpness asked for; a unit that
        measures one trial with many (scheme, budget) cells builds it once.

    Returns
    -------
    list of tuple
        ``[(per_query, per_key), ...]`` in the order of ``sharpness``.

    Raises
    ------
    KvasymError
        As :func:`trial_metrics`; also if a sharpness is not finite, or ``reference`` was built
        from other inputs or lacks a sharpness.
    """
    if reference is None:
        reference = trial_reference(queries, keys, values, sharpness, mask, kernel=kernel)
    elif any(a is not b for a, b in zip(reference.sources, (queries, keys, values, mask))):
        raise KvasymError("reference was built from other queries, keys, values or mask than these")
    missing = [s for s in sharpness if float(s) not in reference.attention]
    if missing:
        raise KvasymError(f"reference has no attention at sharpness {missing} (it has {sorted(reference.attention)})")
    loops = None if reference.kernel == "numpy" else _metric_loops("numba")
    q, k, v = reference.queries, reference.keys, reference.values
    k_hat = _hat_of(k, keys_hat, "keys")
    v_hat = _hat_of(v, values_hat, "values")
    with np.errstate(over="ignore", invalid="ignore"):  # overflow (inf, inf - inf) is reported below
        scores_hat = attention_logits(q, k_hat, 1.0)
    scores = reference.scores
    n_q, n_k = scores.shape
    _check_logit_range(q, {"quantized keys": scores_hat}, sharpness)
    mask, allowed, count = reference.mask, reference.allowed, reference.count
    cache_columns = {}
    # the keys' per-row coordinates serve both their matrix aggregate and the per-key table
    k_matrix, key_coords = _matrix_coordinates(k, k_hat, loops)
    for site, coords in (("k", k_matrix), ("v", _matrix_coordinates(v, v_hat, loops)[0])):
        for name in ("snr_db", "eff_bits", "phi", "eps_dir"):
            cache_columns[f"{site}_{name}"] = np.full(n_q, coords[name])
    if per_key:
        key_norm = np.sqrt(np.einsum("ij,ij->i", k, k))

    def column_mean(a: np.ndarray, where: np.ndarray, n: np.ndarray) -> np.ndarray:
        total = np.sum(np.where(where, a, 0.0), axis=0)
        return np.divide(total, n, out=np.full(n_k, np.nan), where=n > 0)

    out = []
    for s in sharpness:
        s = float(s)
        ref = reference.attention[s]
        if loops is None:
            hat = attend_logits(s * scores_hat, v_hat, mask)
            distances = distribution_distances(ref.log_weights, hat.log_weights, mask)
            kl = kl_divergence(ref.log_weights, hat.log_weights, allowed, p=ref.weights)
            recall = topk_recall(ref.weights, hat.weights, ROUTING_TOPK, mask)
        else:
            log_q = np.empty((n_q, n_k) if per_key else (1, 1))  # the per-key table's log-ratios only
            weights_hat = np.empty((n_q, n_k))
            kl, tv, js, top1 = (np.empty(n_q) for _ in range(4))
            overlap = np.empty(n_q, dtype=np.int64)
            loops.hat_row_measures(scores_hat, s, allowed, ref.log_weights, ref.weights, log_q, weights_hat,
                                   kl, tv, js, top1, reference.top_sets[s], reference.k_row, overlap, per_key)
            recall = overlap / reference.k_row
            hat = AttentionResult(log_weights=log_q, weights=weights_hat, output=weights_hat @ v_hat)
            distances = {"tv": np.minimum(tv, 1.0), "js": np.clip(js, 0.0, math.log(2.0)), "top1": top1}
            kl = np.where((kl < 0) & (kl >= -KL_ROUNDING_TOL), 0.0, kl)
        per_query: dict[str, np.ndarray] = {
            "query": np.arange(n_q, dtype=np.int64),
            "kl": kl,
            "recall_top5": recall,
            **distances,
            "catastrophic": catastrophic(distances["top1"], distances["tv"]),
            **cache_columns,
        }
        # the output site stays on the reference path on both kernels: its (queries, d) rows are
        # cheap, and where a heavy tail makes both outputs equal to rounding (t1.05) its angles
        # are rounding noise that another summation order would reshuffle in the rank tests
        site_t = error_coordinates(ref.output, hat.output)
        for name in ("snr_db", "eff_bits", "phi", "eps_dir"):
            per_query[f"t_{name}"] = site_t[name]
        if not per_key:
            out.append((per_query, {}))
            continue
        # Logit errors from the logits (not log weights): they include the sharpness and are
        # free of the per-query normalisation shift.
        err = s * (scores_hat - scores)
        err_mean = column_mean(err, allowed, count)
        err_var = column_mean((err - err_mean) ** 2, allowed, count)
        with np.errstate(invalid="ignore"):
            log_ratio = hat.log_weights - ref.log_weights
        finite = allowed & np.isfinite(log_ratio)
        keyed: dict[str, np.ndarray] = {
            "key": np.arange(n_k, dtype=np.int64),
            "n_queries": count.astype(np.int64),
            "logit_err_mean": err_mean,
            "logit_err_var": err_var,
            "weight_ref_mean": column_mean(ref.weights, allowed, count),
            "weight_hat_mean": column_mean(hat.weights, allowed, count),
            "log_weight_excess": column_mean(log_ratio, finite, finite.sum(axis=0)),
            "k_eps_dir": key_coords["eps_dir"],
            "k_snr_db": key_coords["snr_db"],
            "key_norm": key_norm,
        }
        out.append((per_query, keyed))
    return out
