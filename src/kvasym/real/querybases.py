"""Query bases of SmolLM2's attention: the eigenbasis of each KV head's query second moment.

What attention reads of a key error
    A query ``q`` scores key ``k`` by ``q . k / sqrt(d)``; a quantized key ``k_hat = k - e``
    shifts that logit by ``-q . e / sqrt(d)``. Over the queries that read the head,
    ``E[(q . e)^2] = e^T M e`` with ``M = E[q q^T]`` (d x d): the key error matters only
    through the quadratic form of the queries' *second moment*. OSCAR [1]_ calibrates ``M`` per
    (layer, KV head) offline and rotates keys by its eigenbasis ``M = U diag(lam) U^T``;
    :mod:`kvasym.real.queryaware` quantizes keys in that basis.

Calibration (:func:`query_second_moments`, :func:`calibrate`)
    ``M[l, h] = (1/N) sum_t sum_{g in G(h)} q_{l,g,t} q_{l,g,t}^T``: the sum runs over the
    calibration positions ``t`` of every text and over the query heads ``g`` of KV head ``h``'s
    group (query head ``g`` reads KV head ``g // group``, GQA as
    :meth:`~kvasym.real.gguf_model.GGUFLlama.attention`); ``q`` is the post-RoPE query the
    layer's attention reads in the full-precision pass; ``N = group * sum_texts T``, so texts
    are weighted by their positions. Sums are formed in float64.

Basis (:func:`bases_from_moments`)
    Columns of ``U[l, h]`` are the eigenvectors of ``M[l, h]`` in decreasing eigenvalue order,
    each with its largest-magnitude entry positive (the sign rule of :mod:`kvasym.klt`, so the
    stored basis does not depend on the LAPACK build); eigenvalues below 0 (round-off of a
    positive semi-definite matrix) are clipped to 0.

Calibration texts are never evaluation texts (:func:`check_disjoint`): a basis fitted on the
queries it is scored with would overstate the gain by its own overfit.

Per head, cross-fitted (:func:`capture_moment_sums`, :func:`leave_one_text_out_bases`)
    The per-head real rows (stage ``real_metrics``) score every shipped text, so no fixed split
    leaves calibration texts over. Each text ``i`` is scored with the bases of the moments of
    every *other* text's captured queries, ``M_{-i} = sum_{j != i} S_j / (group sum_{j != i}
    T_j)`` (``S_j`` the text's ``sum q q^T``): leave-one-text-out cross-fitting, the
    calibration of text ``i`` disjoint from it by construction. The captures hold the same
    post-RoPE queries the full-precision pass reads (float32), so ``M_{-i}`` is what
    :func:`calibrate` gives on the other texts at the captured layers.

References
----------
.. [1] Zhou et al. (2026) "OSCAR", arXiv:2605.17757 (query-covariance rotation of keys,
   calibrated offline per layer and KV head, Hadamard mixing, low-bit quantizer).
.. [2] Golub, G. H., Van Loan, C. F. (2013) "Matrix Computations", 4th ed., section 8.1
   (symmetric eigendecomposition).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import atomic_target
from ..cache import read_npz_arrays
from ..errors import KvasymError
from . import TEXTS_DIR, shipped_texts

__all__ = ["QUERY_BASES_FORMAT", "QueryBases", "query_second_moments", "bases_from_moments", "calibrate",
           "capture_moment_sums", "leave_one_text_out_bases", "save_query_bases", "load_query_bases",
           "check_disjoint", "default_calibration_texts", "text_token_ids"]

#: Tag stored in every query-bases file (a foreign .npz is refused by it).
QUERY_BASES_FORMAT = "kvasym-query-bases-1"
#: Largest |U^T U - I| a loaded basis may show (float64 eigenvectors are orthogonal to ~1e-15;
#: anything near this bound is a damaged or hand-edited file).
ORTHOGONALITY_TOLERANCE = 1e-9


@dataclass(frozen=True)
class QueryBases:
    """Per (layer, KV head) eigenbases of the queries' second moment.

    Parameters
    ----------
    bases : numpy.ndarray
        ``(n_layers, n_kv_heads, head_dim, head_dim)`` float64; ``bases[l, h]`` is orthogonal,
        column ``i`` the eigenvector of the ``i``-th largest eigenvalue.
    eigenvalues : numpy.ndarray
        ``(n_layers, n_kv_heads, head_dim)`` float64, decreasing along the last axis, ``>= 0``
        (squared query components along each column, averaged over the calibration positions).
    calibration_texts : tuple of str
        Names of the texts calibrated on.
    n_positions : int
        Calibration positions (token positions summed over the texts; each counts once per
        query head of a group).
    model_sha256 : str
        SHA-256 of the model file the queries came from.
    """

    bases: np.ndarray
    eigenvalues: np.ndarray
    calibration_texts: tuple[str, ...]
    n_positions: int
    model_sha256: str

    def __post_init__(self) -> None:
        b, lam = np.asarray(self.bases), np.asarray(self.eigenvalues)
        if b.ndim != 4 or b.shape[2] != b.shape[3] or lam.shape != b.shape[:3]:
            raise KvasymError(f"QueryBases: bases {b.shape} must be (layers, kv_heads, d, d) and eigenvalues "
                              f"{lam.shape} (layers, kv_heads, d)")

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(n_layers, n_kv_heads, head_dim)``."""
        return tuple(int(n) for n in self.eigenvalues.shape)  # type: ignore[return-value]

    def energy_share(self, top: int) -> np.ndarray:
        """``(n_layers, n_kv_heads)`` share of query energy ``sum_{i<top} lam_i / sum_i lam_i``
        along the ``top`` leading directions (``trace M = E|q|^2`` is the total)."""
        total = self.eigenvalues.sum(axis=-1)
        return np.divide(self.eigenvalues[..., :top].sum(axis=-1), total, out=np.zeros_like(total),
                         where=total > 0)


def _group_queries(q: np.ndarray, n_kv_heads: int) -> np.ndarray:
    """(n_heads, T, d) queries as (n_kv_heads, group * T, d) float64: query head ``g`` reads KV
    head ``g // group`` (HF's repeat_kv order, as GGUFLlama.attention groups them)."""
    n_heads, n_tokens, head_dim = q.shape
    return np.asarray(q, dtype=np.float64).reshape(n_kv_heads, (n_heads // n_kv_heads) * n_tokens, head_dim)


def _moment_sums(model: Any, token_id_lists: Iterable[np.ndarray]) -> tuple[np.ndarray, int]:
    """``sum q q^T`` per (layer, KV head) over every position and group head, and the count of
    positions (per group head) summed."""
    c = model.config
    sums = np.zeros((c.n_layers, c.n_kv_heads, c.head_dim, c.head_dim))
    n_positions = 0
    for ids in token_id_lists:
        frame = model.sequence_frame(np.asarray(ids))
        x = model.embed(frame.ids)
        # the full-precision pass of endtoend.run_layers with quant=None, reading q on the way
        for index in range(c.n_layers):
            acts = model.attention_inputs(index, x, frame)
            grouped = _group_queries(acts.q, c.n_kv_heads)
            sums[index] += grouped.transpose(0, 2, 1) @ grouped  # BLAS, one (d, d) product per KV head
            x = model.finish_layer(index, x, model.attention(acts.q, acts.k, acts.v, frame.at(index)))
        n_positions += int(frame.ids.size)
    return sums, n_positions


def query_second_moments(model: Any, token_id_lists: Sequence[np.ndarray]) -> np.ndarray:
    """Uncentred second moment of the post-RoPE queries per (layer, KV head).

    ``M[l, h] = (1/N) sum_t sum_{g in G(h)} q_{l,g,t} q_{l,g,t}^T`` with ``N = group * sum T``
    (module docstring). Uncentred, not the covariance: the logit error a key error ``e`` causes
    is ``q . e`` with no mean term to remove. Its mean square over the queries is
    ``E[(q . e)^2] = e^T E[q q^T] e = e^T (C + qbar qbar^T) e``, and the mean query's share
    ``(qbar . e)^2`` moves key ``j``'s logit by ``qbar . e_j``, different for every key, so
    softmax does not cancel it; the covariance ``C`` would drop it.

    Parameters
    ----------
    model : GGUFLlama
        The model (its ``sequence_frame``, ``attention_inputs``, ``attention``, ``finish_layer``).
    token_id_lists : sequence of numpy.ndarray
        Token ids of each calibration text (1-D integer arrays).

    Returns
    -------
    numpy.ndarray
        ``(n_layers, n_kv_heads, head_dim, head_dim)`` float64, symmetric.
    """
    if not token_id_lists:
        raise KvasymError("query_second_moments: token_id_lists is empty (no calibration text)")
    sums, n_positions = _moment_sums(model, token_id_lists)
    return sums / (n_positions * model.config.group)


def bases_from_moments(moments: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenbases and eigenvalues of second-moment matrices (module docstring, sign rule of
    :mod:`kvasym.klt`).

    Parameters
    ----------
    moments : numpy.ndarray
        ``(..., d, d)`` symmetric positive semi-definite matrices.

    Returns
    -------
    bases : numpy.ndarray
        ``(..., d, d)`` float64 orthogonal, columns in decreasing eigenvalue order.
    eigenvalues : numpy.ndarray
        ``(..., d)`` float64, decreasing, clipped at 0.
    """
    m = np.asarray(moments, dtype=np.float64)
    if m.ndim < 2 or m.shape[-1] != m.shape[-2] or not np.all(np.isfinite(m)):
        raise KvasymError(f"moments must be finite square matrices (..., d, d), got shape {m.shape}")
    # symmetrize: eigh reads one triangle, and float64 sums are symmetric only to rounding
    values, vectors = np.linalg.eigh(0.5 * (m + np.swapaxes(m, -1, -2)))
    values, vectors = values[..., ::-1], vectors[..., ::-1]
    rows = np.argmax(np.abs(vectors), axis=-2)  # (..., d): row of each column's largest entry
    peak = np.take_along_axis(vectors, rows[..., None, :], axis=-2)
    vectors = vectors * np.where(peak < 0, -1.0, 1.0)
    return np.ascontiguousarray(vectors), np.ascontiguousarray(np.maximum(values, 0.0))


def calibrate(model: Any, texts: Mapping[str, np.ndarray]) -> QueryBases:
    """The :class:`QueryBases` of ``model`` calibrated on ``texts`` (name -> token ids).

    Parameters
    ----------
    model : GGUFLlama
        The model.
    texts : mapping of str to numpy.ndarray
        Calibration texts: name -> 1-D token ids (e.g. :func:`text_token_ids`).

    Returns
    -------
    QueryBases
    """
    if not texts:
        raise KvasymError("calibrate: no calibration text given")
    sums, n_positions = _moment_sums(model, list(texts.values()))
    bases, eigenvalues = bases_from_moments(sums / (n_positions * model.config.group))
    return QueryBases(bases=bases, eigenvalues=eigenvalues, calibration_texts=tuple(texts),
                      n_positions=n_positions, model_sha256=str(model.model_sha256))


def capture_moment_sums(capture: Any) -> tuple[np.ndarray, int]:
    """``sum q q^T`` per (captured layer, KV head) of one capture's post-RoPE queries, and its
    positions.

    Parameters
    ----------
    capture : kvasym.real.capture.Capture
        A captured text (``q_post_rope`` of shape ``(L, Hq, T, d)``, ``kv_head_of_query_head``).

    Returns
    -------
    sums : numpy.ndarray
        ``(L, n_kv_heads, d, d)`` float64, indexed by the capture's layer order
        (``capture.layers``): the sums :func:`calibrate` forms for those layers, summed the same
        way (query head ``g`` in KV head ``g // group``'s group).
    n_positions : int
        The text's positions ``T`` (per group head).
    """
    q = np.asarray(capture.q_post_rope)
    heads = np.asarray(capture.kv_head_of_query_head)
    n_kv = int(heads.max()) + 1
    group = q.shape[1] // n_kv
    if q.shape[1] != n_kv * group or not np.array_equal(heads, np.arange(q.shape[1]) // group):
        raise KvasymError(f"capture: kv_head_of_query_head {heads.tolist()} is not the contiguous grouping "
                          "query head g -> KV head g // group that the query bases assume")
    sums = np.empty((q.shape[0], n_kv, q.shape[-1], q.shape[-1]))
    for i in range(q.shape[0]):
        grouped = _group_queries(q[i], n_kv)
        sums[i] = grouped.transpose(0, 2, 1) @ grouped
    return sums, int(q.shape[2])


def leave_one_text_out_bases(sums: Mapping[str, tuple[np.ndarray, int]], group: int,
                             model_sha256: str) -> dict[str, QueryBases]:
    """Each text's :class:`QueryBases` calibrated on every OTHER text (module docstring).

    Parameters
    ----------
    sums : mapping of str to (numpy.ndarray, int)
        Text name -> :func:`capture_moment_sums` of its capture (all of one model and layers).
    group : int
        Query heads per KV head.
    model_sha256 : str
        SHA-256 of the model the captures came from.

    Returns
    -------
    dict of str to QueryBases
        Text -> bases of ``M_{-i} = sum_{j != i} S_j / (group sum_{j != i} T_j)``, indexed by
        the captures' layer order, ``calibration_texts`` the other texts (never the text itself).
        The other texts' sums are added in the order of ``sums``, as :func:`calibrate` adds texts.
    """
    names = list(sums)
    if len(names) < 2:
        raise KvasymError(f"leave-one-text-out calibration needs at least 2 texts, got {names}")
    shapes = {np.shape(s) for s, _ in sums.values()}
    if len(shapes) != 1:
        raise KvasymError(f"leave-one-text-out calibration: the texts' moment sums differ in shape {sorted(shapes)}")
    out = {}
    for name in names:
        others = [other for other in names if other != name]
        total = np.zeros(next(iter(shapes)))
        for other in others:
            total += sums[other][0]
        n_positions = sum(int(sums[other][1]) for other in others)
        bases, eigenvalues = bases_from_moments(total / (n_positions * int(group)))
        out[name] = QueryBases(bases=bases, eigenvalues=eigenvalues, calibration_texts=tuple(others),
                               n_positions=n_positions, model_sha256=str(model_sha256))
    return out


# --------------------------------------------------------------------------- files


def save_query_bases(bases: QueryBases, path: str | os.PathLike) -> Path:
    """Write ``bases`` as an uncompressed ``.npz`` atomically (:func:`kvasym.atomic.atomic_target`).

    Returns the path. Arrays: ``format``, ``bases``, ``eigenvalues``, ``calibration_texts``
    (strings), ``n_positions``, ``model_sha256``.
    """
    path = Path(path)
    if path.suffix != ".npz":
        raise KvasymError(f"{path}: a query-bases file must end in .npz")
    arrays = {"format": np.asarray(QUERY_BASES_FORMAT), "bases": np.asarray(bases.bases, dtype=np.float64),
              "eigenvalues": np.asarray(bases.eigenvalues, dtype=np.float64),
              "calibration_texts": np.asarray(bases.calibration_texts, dtype=str),
              "n_positions": np.asarray(bases.n_positions, dtype=np.int64),
              "model_sha256": np.asarray(bases.model_sha256)}
    with atomic_target(path) as tmp, open(tmp, "wb") as fh:
        np.savez(fh, **arrays)
    return path


def load_query_bases(path: str | os.PathLike, model_sha256: str,
                     shape: tuple[int, int, int] | None = None) -> QueryBases:
    """Read a file of :func:`save_query_bases`, refusing one of another model or shape.

    Parameters
    ----------
    path : str or os.PathLike
        The ``.npz`` file.
    model_sha256 : str
        SHA-256 of the model the bases will be used with (``GGUFLlama.model_sha256``).
    shape : tuple of int, optional
        Expected ``(n_layers, n_kv_heads, head_dim)`` (e.g. from the model's config).

    Raises
    ------
    KvasymError
        Naming the file: not a query-bases file, an array missing or of the wrong shape, a
        basis not orthogonal, or a model hash or shape other than expected.
    """
    path = Path(path)
    arrays = read_npz_arrays(path, "query-bases file")
    missing = [k for k in ("format", "bases", "eigenvalues", "calibration_texts", "n_positions", "model_sha256")
               if k not in arrays]
    if missing or str(arrays.get("format", "")) != QUERY_BASES_FORMAT:
        raise KvasymError(f"{path}: not a query-bases file ({QUERY_BASES_FORMAT}); missing {missing or 'format tag'}")
    stored_sha = str(arrays["model_sha256"])
    if stored_sha != model_sha256:
        raise KvasymError(f"{path}: calibrated on model sha256 {stored_sha}, not the model in use ({model_sha256})")
    try:
        out = QueryBases(bases=arrays["bases"].astype(np.float64), eigenvalues=arrays["eigenvalues"].astype(np.float64),
                         calibration_texts=tuple(str(t) for t in arrays["calibration_texts"].ravel()),
                         n_positions=int(arrays["n_positions"]), model_sha256=stored_sha)
    except KvasymError as exc:
        raise KvasymError(f"{path}: {exc}") from None
    if shape is not None and out.shape != tuple(shape):
        raise KvasymError(f"{path}: bases of shape (layers, kv_heads, head_dim) = {out.shape}, expected {tuple(shape)}")
    gram = np.einsum("lhij,lhik->lhjk", out.bases, out.bases)
    if not np.all(np.isfinite(gram)) or np.max(np.abs(gram - np.eye(out.shape[2]))) > ORTHOGONALITY_TOLERANCE:
        raise KvasymError(f"{path}: array 'bases' holds a matrix that is not orthogonal (damaged file)")
    return out


# --------------------------------------------------------------------------- texts


def check_disjoint(calibration_texts: Iterable[str], evaluation_texts: Iterable[str],
                   purpose: str = "a query basis must be calibrated") -> None:
    """Refuse calibration texts that are also evaluation texts (module docstring); ``purpose``
    says in the error what is fitted on the calibration texts.

    Raises
    ------
    KvasymError
        Naming the text(s) in both.
    """
    shared = sorted(set(calibration_texts) & set(evaluation_texts))
    if shared:
        raise KvasymError(f"calibration texts {shared} are also evaluation texts: {purpose} on texts it is not "
                          "evaluated on")


def default_calibration_texts(evaluation_texts: Iterable[str]) -> list[str]:
    """Every shipped text (:func:`kvasym.real.shipped_texts`) not among ``evaluation_texts``, sorted.

    An evaluation name that is not a shipped text is refused: a misspelt name would otherwise
    leave the text it meant among the calibration texts, silently.
    """
    evaluation = set(evaluation_texts)
    known = shipped_texts()
    unknown = sorted(evaluation - set(known))
    if unknown:
        raise KvasymError(f"evaluation texts {unknown} are not among the shipped texts {known}")
    return [name for name in known if name not in evaluation]


def text_token_ids(model: Any, names: Iterable[str], max_tokens: int = 512) -> dict[str, np.ndarray]:
    """Token ids (the first ``max_tokens``) of shipped texts, by name, in the order given."""
    if max_tokens < 1:
        raise KvasymError(f"max_tokens must be >= 1, got {max_tokens}")
    known = shipped_texts()
    out = {}
    for name in names:
        if name not in known:
            raise KvasymError(f"text {name!r} is not among the shipped texts {known}")
        out[name] = model.encode((TEXTS_DIR / f"{name}.txt").read_text(encoding="utf-8"))[:max_tokens]
    return out
