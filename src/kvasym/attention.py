"""Float64 single-head attention, the reference against which quantized caches are judged.

``logits = sharpness * Q K^T / sqrt(dim)``, ``p = softmax(logits)`` row-wise (over keys) and
``T = p V``. With the query rule of :mod:`kvasym.distributions` the raw scores have unit
standard deviation over keys, so ``sharpness`` is the logit standard deviation (unitless).
The same function serves the reference (K, V) and the quantized side (K_hat, V_hat); all
arithmetic is float64 and the softmax goes through log-sum-exp.

An optional boolean mask (n_queries, n_keys), True = allowed, supports causal real caches:
masked entries get logit -inf, log weight exactly -inf and weight exactly 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvasym.errors import KvasymError

__all__ = [
    "attention_logits",
    "log_softmax",
    "AttentionResult",
    "check_mask",
    "attend",
    "attend_logits",
]


def _as_matrix(a: np.ndarray, what: str) -> np.ndarray:
    arr = np.asarray(a, dtype=np.float64)
    if arr.ndim != 2:
        raise KvasymError(f"{what} must be a 2-D array (rows, dim), got shape {arr.shape}")
    return arr


def _check_sharpness(sharpness: float) -> float:
    if isinstance(sharpness, (bool, np.bool_)) or not isinstance(
        sharpness, (int, float, np.integer, np.floating)
    ):
        raise KvasymError(f"sharpness must be a finite number, got {sharpness!r}")
    value = float(sharpness)
    if not math.isfinite(value):
        raise KvasymError(f"sharpness must be a finite number, got {sharpness!r}")
    return value


def attention_logits(queries: np.ndarray, keys: np.ndarray, sharpness: float) -> np.ndarray:
    """Logits ``sharpness * Q K^T / sqrt(dim)``, float64 (n_queries, n_keys).

    ``queries`` (n_queries, dim) and ``keys`` (n_keys, dim) must share ``dim``.

    Parameters
    ----------
    queries : array_like
        ``(n_queries, dim)``.
    keys : array_like
        ``(n_keys, dim)``.
    sharpness : float
        Finite multiplier of the scaled scores (the logit standard deviation under the query
        rule of :mod:`kvasym.distributions`).

    Returns
    -------
    numpy.ndarray
        ``(n_queries, n_keys)`` float64 logits.

    Raises
    ------
    KvasymError
        If an input is not 2-D, the dimensions differ or are 0, or ``sharpness`` is not a
        finite real number (bool refused).
    """
    q = _as_matrix(queries, "queries")
    k = _as_matrix(keys, "keys")
    if q.shape[1] != k.shape[1]:
        raise KvasymError(f"queries have dim {q.shape[1]} but keys have dim {k.shape[1]}")
    if q.shape[1] == 0:
        raise KvasymError("queries and keys must have dim >= 1")
    return (_check_sharpness(sharpness) / math.sqrt(q.shape[1])) * (q @ k.T)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax over the last axis by log-sum-exp, float64, same shape.

    Stable for finite logits of any magnitude (e.g. +-1e30): the row max is subtracted
    before exponentiating. Entries equal to -inf (masked) come out as exactly -inf. NaN
    appears only if the input has NaN or +inf, or a row is entirely -inf (no allowed entry).

    Parameters
    ----------
    logits : array_like
        Logits, normalized over the last axis.

    Returns
    -------
    numpy.ndarray
        ``l_j - log sum_k exp(l_k)``, computed as ``(l_j - M) - log sum_k exp(l_k - M)`` with
        ``M`` the row max (0 when the max is not finite).
    """
    x = np.asarray(logits, dtype=np.float64)
    peak = np.max(x, axis=-1, keepdims=True)
    # A row whose max is not finite (all -inf, or +inf present) cannot be shifted by it.
    shift = np.where(np.isfinite(peak), peak, 0.0)
    shifted = x - shift
    with np.errstate(divide="ignore"):
        lse = np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))
    with np.errstate(invalid="ignore"):
        return shifted - lse


@dataclass
class AttentionResult:
    """Attention of one head, float64.

    ``log_weights`` and ``weights``: (n_queries, n_keys), rows of ``weights`` sum to 1;
    ``output``: (n_queries, value_dim) = weights @ values.

    Parameters
    ----------
    log_weights : numpy.ndarray
        Row-wise log-softmax of the logits (``-inf`` where masked).
    weights : numpy.ndarray
        ``exp(log_weights)`` (exactly 0 where masked).
    output : numpy.ndarray
        ``weights @ values``.
    """

    log_weights: np.ndarray
    weights: np.ndarray
    output: np.ndarray


def check_mask(mask: np.ndarray | None, n_queries: int, n_keys: int) -> np.ndarray | None:
    """Validate an optional boolean mask (n_queries, n_keys); every row needs an allowed key.

    Parameters
    ----------
    mask : array_like or None
        Boolean mask, True = allowed.
    n_queries, n_keys : int
        Expected shape.

    Returns
    -------
    numpy.ndarray or None
        The mask as an array, or None if none was given.

    Raises
    ------
    KvasymError
        If the mask is not boolean, has the wrong shape, or a row allows no key.
    """
    if mask is None:
        return None
    m = np.asarray(mask)
    if m.dtype != np.bool_:
        raise KvasymError(f"mask must be a boolean array (True = allowed), got dtype {m.dtype}")
    if m.shape != (n_queries, n_keys):
        raise KvasymError(
            f"mask has shape {m.shape}, expected (n_queries, n_keys) = {(n_queries, n_keys)}"
        )
    empty = np.flatnonzero(~m.any(axis=1))
    if empty.size:
        raise KvasymError(
            f"mask row {int(empty[0])} allows no key: attention of that query is undefined"
        )
    return m


def attend(
    queries: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    sharpness: float,
    mask: np.ndarray | None = None,
) -> AttentionResult:
    """Softmax attention of ``queries`` over (``keys``, ``values``), float64.

    ``queries`` (n_q, dim), ``keys`` (n_k, dim), ``values`` (n_k, value_dim); ``sharpness``
    multiplies the logits; ``mask`` optional bool (n_q, n_k), True = allowed.

    Parameters
    ----------
    queries : array_like
        ``(n_q, dim)``.
    keys : array_like
        ``(n_k, dim)``.
    values : array_like
        ``(n_k, value_dim)``.
    sharpness : float
        Finite logit multiplier.
    mask : array_like, optional
        Boolean ``(n_q, n_k)``, True = allowed.

    Returns
    -------
    AttentionResult
        ``p = softmax(sharpness * Q K^T / sqrt(dim))`` row-wise and ``T = p V``.

    Raises
    ------
    KvasymError
        On shape mismatches, a non-finite sharpness, or an invalid mask.
    """
    return attend_logits(attention_logits(queries, keys, sharpness), values, mask)


def attend_logits(logits: np.ndarray, values: np.ndarray, mask: np.ndarray | None = None) -> AttentionResult:
    """Softmax attention from precomputed logits (n_q, n_k) over ``values`` (n_k, value_dim).

    Parameters
    ----------
    logits : numpy.ndarray
        ``(n_q, n_k)`` logits.
    values : array_like
        ``(n_k, value_dim)``.
    mask : array_like, optional
        Boolean ``(n_q, n_k)``, True = allowed; masked logits become ``-inf``.

    Returns
    -------
    AttentionResult
        Log weights by log-sum-exp, weights and ``weights @ values``, float64.

    Raises
    ------
    KvasymError
        If ``values`` is not 2-D or its rows do not match the keys, there is no key, or the
        mask is invalid.
    """
    v = _as_matrix(values, "values")
    if v.shape[0] != logits.shape[1]:
        raise KvasymError(f"values have {v.shape[0]} rows but keys have {logits.shape[1]}")
    if logits.shape[1] == 0:
        raise KvasymError("keys must have at least one row")
    m = check_mask(mask, *logits.shape)
    if m is not None:
        logits = np.where(m, logits, -np.inf)
    log_weights = log_softmax(logits)
    weights = np.exp(log_weights)  # exp(-inf) = 0 exactly for masked entries
    return AttentionResult(log_weights=log_weights, weights=weights, output=weights @ v)
