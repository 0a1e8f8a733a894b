"""Lloyd-Max codebooks for the coordinate law of a unit vector in R^d.

A coordinate ``x`` of a vector uniform on the sphere S^{d-1} has density

    f_d(x) = c_d (1 - x^2)^((d-3)/2)  on [-1, 1],   c_d = Gamma(d/2) / (sqrt(pi) Gamma((d-1)/2)),

i.e. ``(x + 1)/2 ~ Beta(a, a)`` with ``a = (d-1)/2``; it tends to N(0, 1/d) as d grows. The
Lloyd-Max quantizer with ``L = 2^b`` levels alternates the two optimality conditions until the
centroids move less than :data:`TOLERANCE` (in units of the coordinate's standard deviation
``1/sqrt(d)``):

- nearest neighbour: each threshold is the midpoint of its two centroids;
- centroid: each centroid is the conditional mean of its cell.

Every integral is exact, not sampled. With ``S(t) = P(x > t)`` (the regularized incomplete beta
function, ``betaincc`` for accuracy in the tail) and ``g(t) = (1 - t^2) f_d(t) / (d - 1)``
(because ``d/dx (1-x^2)^((d-1)/2) = -(d-1) x (1-x^2)^((d-3)/2)``):

    P[t0 < x < t1]       = S_d(t0) - S_d(t1)
    E[x ; t0 < x < t1]   = g(t0) - g(t1)
    E[x^2; t0 < x < t1]  = t0 g(t0) - t1 g(t1) + (S_{d+2}(t0) - S_{d+2}(t1)) / d

(the last by parts, with ``c_d / c_{d+2} = (d-1)/d``). ``c_d`` goes through ``gammaln`` because
``gamma(d/2)`` overflows for d > 343. The mean squared error per coordinate is
``C = sum_cells E[(x - c_i)^2; cell]`` and the per-vector MSE of a unit vector is ``d * C``; for
large d it tends to Max's (1960) Gaussian values 0.3634, 0.1175, 0.03454, 0.009497 (1-4 bits).

Codebooks are cached in memory and on disk (JSON keyed by d, bits and
:data:`CODEBOOK_FORMAT`), in ``$KVASYM_CACHE_DIR`` or ``~/.cache/kvasym``, so a pipeline computes
each one once.

References
----------
.. [1] Max, J. (1960) "Quantizing for minimum distortion", IRE Trans. Inf. Theory 6(1):7-12.
.. [2] Lloyd, S. (1982) "Least squares quantization in PCM", IEEE Trans. Inf. Theory
   28(2):129-137.
.. [3] Zandieh, A., Daliri, M., Hadian, M., Mirrokni, V. (2025) "TurboQuant: Online Vector
   Quantization with Near-optimal Distortion Rate", arXiv:2504.19874 (scalar codebooks for
   this Beta coordinate law after a random rotation).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

# scipy is imported inside the functions that need it: a cached codebook is read from JSON,
# and pipeline jobs that only read codebooks should not pay scipy's ~0.4 s import.

from .errors import KvasymError

__all__ = [
    "TOLERANCE",
    "VERIFY_TOLERANCE",
    "centroid_defects",
    "MAX_ITERATIONS",
    "CODEBOOK_FORMAT",
    "MIN_DIM",
    "MAX_DIM",
    "MAX_BITS",
    "Codebook",
    "validate_dim_bits",
    "log_normalizer",
    "coordinate_pdf",
    "coordinate_sf",
    "coordinate_cdf",
    "lloyd_max_codebook",
    "cache_dir",
    "write_cache_entry",
    "compute_codebook",
]

#: Convergence tolerance: the centroid condition holds to within this, i.e.
#: max_i |c_i - E[x | cell_i]| < TOLERANCE / sqrt(d) (float64 evaluation noise is ~1e-12).
TOLERANCE = 1e-10
#: Newton iterations allowed before giving up loudly.
MAX_ITERATIONS = 200
#: Bump when the computation changes so stale on-disk caches are ignored.
CODEBOOK_FORMAT = 1
MIN_DIM = 3
#: Beyond 2^14 the float64 evaluation of the Beta law's cell moments is too coarse for the
#: 8-bit Newton solve to reach TOLERANCE (measured: 2^15 and 2^16 fail at 8 bits, 2^18 at 6).
MAX_DIM = 16384
MAX_BITS = 8


@dataclass(frozen=True)
class Codebook:
    """A scalar quantizer for unit-vector coordinates in dimension ``dim``.

    ``centroids`` (length 2^bits, increasing) and ``thresholds`` (length 2^bits - 1) are in
    unit-vector coordinate units; ``mse_per_coordinate`` is ``C(f, b)`` and
    ``mse_per_vector = dim * C`` is the expected ||u - Q(u)||^2 of a uniform unit vector u.

    Parameters
    ----------
    dim : int
        Dimension ``d`` of the unit vectors whose coordinates are quantized.
    bits : int
        Bits per coordinate ``b``; the codebook has ``L = 2**b`` levels.
    centroids : numpy.ndarray
        Reconstruction levels ``c_0 < ... < c_{L-1}`` (read-only, symmetric: ``c_i = -c_{L-1-i}``).
    thresholds : numpy.ndarray
        Cell edges ``t_i = (c_i + c_{i+1}) / 2`` (read-only); code ``j`` is the number of
        thresholds ``<= x``.
    mse_per_coordinate : float
        ``C = sum_i E[(x - c_i)^2; t_{i-1} < x < t_i]`` under the coordinate law ``f_d``.
    iterations : int
        Newton iterations the solver used.

    See Also
    --------
    lloyd_max_codebook : the cached constructor.

    References
    ----------
    .. [1] Max, J. (1960) "Quantizing for minimum distortion", IRE Trans. Inf. Theory 6(1):7-12.
    .. [2] Lloyd, S. (1982) "Least squares quantization in PCM", IEEE Trans. Inf. Theory
       28(2):129-137.
    """

    dim: int
    bits: int
    centroids: np.ndarray
    thresholds: np.ndarray
    mse_per_coordinate: float
    iterations: int

    @property
    def levels(self) -> int:
        """Number of reconstruction levels, ``2**bits``."""
        return 1 << self.bits

    @property
    def mse_per_vector(self) -> float:
        """``dim * mse_per_coordinate``: E||u - Q(u)||^2 for u uniform on the unit sphere."""
        return self.dim * self.mse_per_coordinate

    def to_json(self) -> dict:
        """The codebook as a JSON-ready dict (the on-disk cache format).

        Returns
        -------
        dict
            ``format`` (:data:`CODEBOOK_FORMAT`), ``dim``, ``bits``, ``centroids`` and
            ``thresholds`` (lists), ``mse`` (per vector), ``mse_per_coordinate``,
            ``iterations`` and ``tolerance`` (:data:`TOLERANCE`).
        """
        return {
            "format": CODEBOOK_FORMAT,
            "dim": self.dim,
            "bits": self.bits,
            "centroids": self.centroids.tolist(),
            "thresholds": self.thresholds.tolist(),
            "mse": self.mse_per_vector,
            "mse_per_coordinate": self.mse_per_coordinate,
            "iterations": self.iterations,
            "tolerance": TOLERANCE,
        }

    @classmethod
    def from_json(cls, data: dict) -> Codebook:
        """Rebuild a codebook from :meth:`to_json` output (arrays read-only).

        Parameters
        ----------
        data : dict
            A mapping with at least ``dim``, ``bits``, ``centroids``, ``thresholds``,
            ``mse_per_coordinate`` and ``iterations``.

        Returns
        -------
        Codebook

        Raises
        ------
        KeyError, TypeError, ValueError
            If a field is missing or not convertible (the disk cache treats this as a corrupt
            entry and recomputes it).
        """
        centroids = np.asarray(data["centroids"], dtype=np.float64)
        thresholds = np.asarray(data["thresholds"], dtype=np.float64)
        centroids.setflags(write=False)
        thresholds.setflags(write=False)
        return cls(
            dim=int(data["dim"]),
            bits=int(data["bits"]),
            centroids=centroids,
            thresholds=thresholds,
            mse_per_coordinate=float(data["mse_per_coordinate"]),
            iterations=int(data["iterations"]),
        )


def validate_dim_bits(dim: int, bits: int) -> None:
    """Check that a codebook of ``dim`` dimensions and ``bits`` bits can be computed.

    Parameters
    ----------
    dim : int
        Dimension, an integer (Python or numpy, not bool) in ``MIN_DIM..MAX_DIM``.
    bits : int
        Bits, an integer (not bool) in ``1..MAX_BITS``.

    Raises
    ------
    KvasymError
        If either is out of range or not an integer.
    """
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or not MIN_DIM <= dim <= MAX_DIM:
        raise KvasymError(
            f"codebook dimension must be an integer in {MIN_DIM}..{MAX_DIM}, got {dim!r}"
        )
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 1 <= bits <= MAX_BITS:
        raise KvasymError(f"codebook bits must be an integer in 1..{MAX_BITS}, got {bits!r}")


def log_normalizer(dim: int) -> float:
    """log c_d, the log of the density's normalizing constant (via gammaln: no overflow).

    Parameters
    ----------
    dim : int
        Dimension ``d >= 2``.

    Returns
    -------
    float
        ``log c_d = lgamma(d/2) - log(pi)/2 - lgamma((d-1)/2)``, so that
        ``c_d = Gamma(d/2) / (sqrt(pi) Gamma((d-1)/2))``.
    """
    from scipy import special

    return special.gammaln(dim / 2) - 0.5 * np.log(np.pi) - special.gammaln((dim - 1) / 2)


def coordinate_pdf(x: np.ndarray, dim: int) -> np.ndarray:
    """Density f_d of one coordinate of a uniform unit vector in R^dim (zero outside [-1, 1]).

    Parameters
    ----------
    x : array_like
        Points (any shape).
    dim : int
        Dimension ``d``.

    Returns
    -------
    numpy.ndarray
        ``f_d(x) = c_d (1 - x^2)^((d-3)/2)`` for ``|x| < 1``, else 0 (float64, shape of ``x``).

    Notes
    -----
    ``(x + 1)/2 ~ Beta(a, a)`` with ``a = (d-1)/2``; ``f_d`` tends to the N(0, 1/d) density as
    ``d`` grows. At ``d = 3`` it is uniform on [-1, 1].
    """
    x = np.asarray(x, dtype=np.float64)
    inside = np.abs(x) < 1
    one_minus = np.where(inside, 1 - x * x, 1.0)
    with np.errstate(divide="ignore"):
        logf = log_normalizer(dim) + 0.5 * (dim - 3) * np.log(one_minus)
    return np.where(inside, np.exp(logf), 0.0)


def coordinate_sf(t: np.ndarray, dim: int) -> np.ndarray:
    """P(x > t) for the coordinate law in dimension dim (accurate in the upper tail).

    Parameters
    ----------
    t : array_like
        Points (values outside [-1, 1] are clipped).
    dim : int
        Dimension ``d``.

    Returns
    -------
    numpy.ndarray
        ``S_d(t) = 1 - I_u(a, a)`` with ``u = (t + 1)/2``, ``a = (d-1)/2``, computed by
        ``scipy.special.betaincc`` (no cancellation in the upper tail).
    """
    from scipy import special

    a = 0.5 * (dim - 1)
    u = np.clip((np.asarray(t, dtype=np.float64) + 1) / 2, 0.0, 1.0)
    return special.betaincc(a, a, u)


def coordinate_cdf(t: np.ndarray, dim: int) -> np.ndarray:
    """P(x <= t) for the coordinate law in dimension dim.

    Parameters
    ----------
    t : array_like
        Points (values outside [-1, 1] are clipped).
    dim : int
        Dimension ``d``.

    Returns
    -------
    numpy.ndarray
        ``F_d(t) = I_u(a, a)`` (regularized incomplete beta function) with ``u = (t + 1)/2``
        and ``a = (d-1)/2``.
    """
    from scipy import special

    a = 0.5 * (dim - 1)
    u = np.clip((np.asarray(t, dtype=np.float64) + 1) / 2, 0.0, 1.0)
    return special.betainc(a, a, u)


def _g(t: np.ndarray, dim: int) -> np.ndarray:
    """(1 - t^2) f_d(t) / (d - 1), an antiderivative of -x f_d(x); 0 at +-1 and +-inf."""
    t = np.asarray(t, dtype=np.float64)
    inside = np.abs(t) < 1
    one_minus = np.where(inside, 1 - t * t, 1.0)
    logg = log_normalizer(dim) + 0.5 * (dim - 1) * np.log(one_minus) - np.log(dim - 1)
    return np.where(inside, np.exp(logg), 0.0)


def _cell_moments(lo: np.ndarray, hi: np.ndarray, dim: int) -> tuple[np.ndarray, ...]:
    """Mass, first and second partial moments of the law on cells (lo, hi)."""
    mass = _interval_mass(lo, hi, dim)
    g_lo, g_hi = _g(lo, dim), _g(hi, dim)
    first = g_lo - g_hi
    lo_c = np.clip(lo, -1.0, 1.0)
    hi_c = np.clip(hi, -1.0, 1.0)
    second = lo_c * g_lo - hi_c * g_hi + _interval_mass(lo, hi, dim + 2) / dim
    return mass, first, second


def _interval_mass(lo: np.ndarray, hi: np.ndarray, dim: int) -> np.ndarray:
    """P(lo < x < hi), from whichever tail is accurate (the law is symmetric)."""
    upper = coordinate_sf(lo, dim) - coordinate_sf(hi, dim)
    lower = coordinate_cdf(hi, dim) - coordinate_cdf(lo, dim)
    return np.where(lo >= 0, upper, np.where(hi <= 0, lower, 1.0 - coordinate_sf(hi, dim) - coordinate_cdf(lo, dim)))


def _centroids_of(thresholds: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    edges = np.concatenate(([-1.0], thresholds, [1.0]))
    mass, first, second = _cell_moments(edges[:-1], edges[1:], dim)
    centroids = first / mass
    return centroids, mass, second


def lloyd_max_codebook(dim: int, bits: int, *, use_disk_cache: bool = True) -> Codebook:
    """The Lloyd-Max codebook for unit-vector coordinates in dimension ``dim`` with ``bits`` bits.

    Cached in memory and (unless ``use_disk_cache`` is false) on disk.

    Parameters
    ----------
    dim : int
        Dimension ``d`` (``MIN_DIM..MAX_DIM``).
    bits : int
        Bits per coordinate (``1..MAX_BITS``).
    use_disk_cache : bool, optional
        Read and write the JSON cache in :func:`cache_dir` and memoize in memory (default);
        if false, compute afresh with :func:`compute_codebook`.

    Returns
    -------
    Codebook
        The quantizer satisfying both Lloyd-Max conditions for the law ``f_d``.

    Raises
    ------
    KvasymError
        If ``dim`` or ``bits`` is out of range, or the solver does not converge.

    References
    ----------
    .. [1] Max, J. (1960) "Quantizing for minimum distortion", IRE Trans. Inf. Theory 6(1):7-12.
    .. [2] Lloyd, S. (1982) "Least squares quantization in PCM", IEEE Trans. Inf. Theory
       28(2):129-137.
    .. [3] Zandieh, A., Daliri, M., Hadian, M., Mirrokni, V. (2025) "TurboQuant: Online Vector
       Quantization with Near-optimal Distortion Rate", arXiv:2504.19874.
    """
    validate_dim_bits(dim, bits)
    dim, bits = int(dim), int(bits)
    if use_disk_cache:
        return _cached_codebook(dim, bits)
    return compute_codebook(dim, bits)


#: A cached codebook is used only if every centroid is within this many sigma (1/sqrt(d)) of its
#: cell's mean, as :func:`centroid_defects` measures it: far above its quadrature error (~1e-12)
#: and the solver's TOLERANCE (1e-10), far below any edit that moves a result.
VERIFY_TOLERANCE = 1e-7
#: Gauss-Legendre nodes per cell for :func:`centroid_defects`.
_VERIFY_NODES = 96


def centroid_defects(centroids: np.ndarray, thresholds: np.ndarray, dim: int) -> np.ndarray:
    """|c_i - E[x | t_{i-1} < x < t_i]| / sigma for each cell, with sigma = 1/sqrt(d), by
    Gauss-Legendre quadrature in numpy alone (no scipy: jobs that only read codebooks stay light).

    Notes
    -----
    With x = sin(theta) the law's density (1 - x^2)^((d-3)/2) dx becomes cos(theta)^(d-2)
    dtheta, smooth on every cell for every d >= 3 (no endpoint singularity), so the quadrature
    converges fast. Each cell is clipped to |x| <= min(1, 40 sigma) (the law's mass beyond is
    below 1e-300 for large d) and integrated in log space, so the normalizing constant cancels.
    """
    levels = centroids.size
    sigma = 1.0 / np.sqrt(dim)
    edge = min(1.0, 40.0 * sigma)
    lo = np.clip(np.concatenate(([-1.0], thresholds)), -edge, edge)
    hi = np.clip(np.concatenate((thresholds, [1.0])), -edge, edge)
    nodes, weights = np.polynomial.legendre.leggauss(_VERIFY_NODES)
    a, b = np.arcsin(lo)[:, None], np.arcsin(hi)[:, None]
    theta = 0.5 * (b - a) * nodes[None, :] + 0.5 * (a + b)
    log_density = (dim - 2) * np.log(np.maximum(np.cos(theta), 1e-300))
    w = np.exp(log_density - log_density.max()) * weights[None, :] * 0.5 * (b - a)
    mass = w.sum(axis=1)
    means = (w * np.sin(theta)).sum(axis=1) / np.where(mass > 0, mass, 1.0)
    defects = np.where(mass > 0, np.abs(centroids - means) / sigma, 0.0)
    return defects if defects.size == levels else np.full(levels, np.inf)


def _verified(book: Codebook, path: Path) -> Codebook:
    """``book`` read from ``path`` if it is a Lloyd-Max codebook of its dim and bits, else a
    KvasymError naming the file and what is wrong with it."""
    c, t = np.asarray(book.centroids), np.asarray(book.thresholds)
    if c.size != 1 << book.bits or t.size != c.size - 1 or not np.all(np.isfinite(c)):
        raise KvasymError(f"{path}: {c.size} centroids and {t.size} thresholds for {book.bits} bits")
    if not (np.all(np.diff(c) > 0) and np.array_equal(t, 0.5 * (c[:-1] + c[1:])) and np.array_equal(c, -c[::-1])):
        raise KvasymError(f"{path}: centroids not increasing and symmetric, or thresholds not their midpoints")
    defects = centroid_defects(c, t, book.dim)
    worst = int(np.argmax(defects))
    if not defects[worst] <= VERIFY_TOLERANCE:
        raise KvasymError(f"{path}: centroid {worst} is {defects[worst]:.3g} sigma from its cell's mean "
                          f"(allowed {VERIFY_TOLERANCE:g}): not the Lloyd-Max codebook of d={book.dim}, "
                          f"{book.bits} bits")
    return book


@lru_cache(maxsize=None)
def _cached_codebook(dim: int, bits: int) -> Codebook:
    path = cache_dir() / f"beta_lloyd_max_v{CODEBOOK_FORMAT}_d{dim}_b{bits}.json"
    if path.exists():
        book = None  # an entry of another format, dim or bits is recomputed and overwritten below
        try:
            data = json.loads(path.read_text())
            if data.get("format") == CODEBOOK_FORMAT and data["dim"] == dim and data["bits"] == bits:
                book = Codebook.from_json(data)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            book = None  # a corrupt cache entry likewise
        if book is not None:
            try:
                return _verified(book, path)
            except KvasymError as exc:
                # a well-formed entry that is not the codebook (edited, or from a buggy version):
                # say so, then recompute and overwrite it rather than quantize with it
                import sys

                print(f"kvasym: codebook cache: {exc}; recomputing it", file=sys.stderr)
    book = compute_codebook(dim, bits)
    write_cache_entry(path, book.to_json())
    return book


def cache_dir() -> Path:
    """Where codebooks are cached: $KVASYM_CACHE_DIR, else ~/.cache/kvasym/codebooks.

    Returns
    -------
    pathlib.Path
        ``$KVASYM_CACHE_DIR/codebooks`` if the variable is set and non-empty, else
        ``~/.cache/kvasym/codebooks`` (not created here).
    """
    root = os.environ.get("KVASYM_CACHE_DIR")
    base = Path(root) if root else Path.home() / ".cache" / "kvasym"
    return base / "codebooks"


def write_cache_entry(path: Path, data: dict) -> None:
    """Write a codebook cache entry as JSON via a temporary name and a rename; an unwritable
    cache directory is ignored (the cache only saves recomputation)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh)
        os.replace(tmp, path)
    except OSError:
        # The cache is an optimisation: an unwritable cache directory must not fail a run.
        pass


def compute_codebook(dim: int, bits: int) -> Codebook:
    """Solve the Lloyd-Max conditions to :data:`TOLERANCE` (no caching).

    Plain Lloyd iteration converges linearly and needs ~1e5 sweeps at 8 bits, so the fixed
    point ``centroid(midpoints(c)) = c`` is solved by Newton's method on its tridiagonal
    Jacobian (each centroid depends on its two neighbours through the two cell edges),
    started from the high-resolution (Panter-Dite) compander, whose point density
    ``f^(1/3)`` is again this family of laws, in dimension ``(d + 6) / 3``. A step that would
    break the ordering of the centroids is halved; the result satisfies both Lloyd conditions
    (the tests check them independently).

    Parameters
    ----------
    dim : int
        Dimension ``d`` (``MIN_DIM..MAX_DIM``).
    bits : int
        Bits per coordinate (``1..MAX_BITS``).

    Returns
    -------
    Codebook
        Centroids with ``max_i |c_i - E[x | cell_i]| < TOLERANCE / sqrt(d)``, thresholds at the
        midpoints, and the exact MSE ``C = sum_i (E[x^2; cell_i] - P(cell_i) c_i^2)``.

    Raises
    ------
    KvasymError
        If ``dim`` or ``bits`` is out of range, or Newton's method does not converge within
        :data:`MAX_ITERATIONS` iterations.

    Notes
    -----
    Lloyd-Max conditions (Max 1960; Lloyd 1982): ``t_i = (c_i + c_{i+1}) / 2`` and
    ``c_i = E[x | t_{i-1} < x < t_i]``. Newton solves ``F(c) = centroid(midpoints(c)) - c = 0``;
    the start is the compander ``c_i = 2 I^{-1}_{p_i}(a', a') - 1`` with ``p_i = (i + 1/2)/L``
    and ``a' = ((d + 6)/3 - 1)/2`` (the law in dimension ``(d + 6)/3``, proportional to
    ``f_d^(1/3)``).

    References
    ----------
    .. [1] Max, J. (1960) "Quantizing for minimum distortion", IRE Trans. Inf. Theory 6(1):7-12.
    .. [2] Lloyd, S. (1982) "Least squares quantization in PCM", IEEE Trans. Inf. Theory
       28(2):129-137.
    """
    from scipy import special

    from scipy import linalg

    validate_dim_bits(dim, bits)
    levels = 1 << bits
    sigma = 1.0 / np.sqrt(dim)
    a_compander = 0.5 * ((dim + 6) / 3 - 1)
    probs = (np.arange(levels) + 0.5) / levels
    centroids = 2 * special.betaincinv(a_compander, a_compander, probs) - 1
    centroids = 0.5 * (centroids - centroids[::-1])
    for iteration in range(1, MAX_ITERATIONS + 1):
        residual, jacobian = _lloyd_residual(centroids, dim)
        if np.max(np.abs(residual)) < TOLERANCE * sigma:
            break
        step = -linalg.solve_banded((1, 1), jacobian, residual)
        scale = 1.0
        while True:
            trial = centroids + scale * step
            if np.all(np.diff(trial) > 0) and trial[0] > -1 and trial[-1] < 1:
                break
            scale *= 0.5
            if scale < 1e-6:
                # Newton is lost: take a plain Lloyd step, which always keeps the ordering.
                trial = centroids + residual
                break
        # the law is symmetric; keep c_i = -c_{L-1-i} exact
        centroids = 0.5 * (trial - trial[::-1])
    else:
        raise KvasymError(
            f"Lloyd-Max did not converge for dim={dim}, bits={bits} in {MAX_ITERATIONS} iterations"
        )
    thresholds = 0.5 * (centroids[:-1] + centroids[1:])
    _, mass, second = _centroids_of(thresholds, dim)
    # E[(x - c)^2; cell] = E[x^2; cell] - m c^2 when c is the cell's conditional mean.
    mse = float(np.sum(second - mass * centroids**2))
    centroids.setflags(write=False)
    thresholds.setflags(write=False)
    return Codebook(dim, bits, centroids, thresholds, mse, iteration)


def _lloyd_residual(centroids: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """F(c) = centroid(midpoints(c)) - c and its tridiagonal Jacobian in banded form."""
    levels = centroids.size
    thresholds = 0.5 * (centroids[:-1] + centroids[1:])
    means, mass, _ = _centroids_of(thresholds, dim)
    residual = means - centroids
    density = coordinate_pdf(thresholds, dim)
    # d mean_i / d upper edge = f(b)(b - mean_i)/m_i ; d mean_i / d lower edge = f(a)(mean_i - a)/m_i
    d_upper = np.zeros(levels)
    d_lower = np.zeros(levels)
    d_upper[:-1] = density * (thresholds - means[:-1]) / mass[:-1]
    d_lower[1:] = density * (means[1:] - thresholds) / mass[1:]
    # Each edge t_i = (c_i + c_{i+1}) / 2 moves by half of each neighbouring centroid.
    diag = 0.5 * (d_upper + d_lower) - 1.0
    upper = 0.5 * d_upper[:-1]  # d F_i / d c_{i+1}
    lower = 0.5 * d_lower[1:]  # d F_i / d c_{i-1}
    banded = np.zeros((3, levels))
    banded[0, 1:] = upper
    banded[1] = diag
    banded[2, :-1] = lower
    return residual, banded
