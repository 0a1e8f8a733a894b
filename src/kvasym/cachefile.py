"""Bring-your-own KV caches: the file layout the study reads, its loader and its checks.

A cache file holds the keys and values (and optionally the queries) of one model, dumped by the
user. Formats: ``.npz`` (``numpy.savez``), ``.safetensors`` (named tensors), or ``.npy`` (one
array stacking K and V). Arrays, by name (one name per role; anything else is refused):

``k`` (or ``keys``)
    float16/32/64 (or integer), shape ``(T, d)``, ``(H_kv, T, d)`` or ``(L, H_kv, T, d)``: T cached
    positions of H_kv KV heads of L layers, head dimension d. Keys as the cache stores them
    (after RoPE for a RoPE model).
``v`` (or ``values``)
    the same rank and leading shape ``(L, H_kv, T)`` as the keys; its head dimension may differ.
``q`` (or ``queries``), optional
    the same rank as the keys, shape ``(L, H_q, T_q, d)`` (d equal to the keys'), H_q a
    multiple of H_kv, T_q <= T: the queries of the LAST T_q positions (a prefill dump has
    T_q = T). Query head g reads KV head ``g // (H_q // H_kv)`` (grouped-query attention, the
    HuggingFace/llama.cpp convention) unless ``kv_head_of_query_head`` says otherwise.
``kv_head_of_query_head``, optional
    int, shape ``(H_q,)``: the KV head each query head reads (needs ``q``).
``layers``, optional
    int, shape ``(L,)``, distinct and >= 0: the model's layer numbers (default 0..L-1).

A ``.npy`` file is one float array of shape ``(2, ...)`` (K then V along the first axis, each of
a shape above); it cannot carry queries.

Every array must be finite (no NaN/Inf) and non-empty, with T >= 2 and d >= 3. Float and
integer arrays are read (integers as float64, like ``kvasym evaluate``'s matrices); boolean,
complex and bfloat16 tensors are refused (convert bfloat16 to float32 before saving).

Queries. With ``q``, the model's own queries are used at sharpness 1 (its own attention scale
``q.k / sqrt(d)``), each under the causal mask (query i of T_q sits at position T - T_q + i and
sees keys 0..that position) unless the distribution sets ``causal: false``. Without ``q``, the
documented query rule of file caches applies: for every (layer, KV head), ``n_queries`` queries
are drawn from the Gaussian with the keys' empirical mean and covariance, ``q = mean(K) +
(K - mean(K))^T g / sqrt(T)`` with ``g ~ N(0, I_T)`` (the synthetic study's rule, "queries from
the keys' own family", for an unknown family), then rescaled by the study's query rule
(:func:`kvasym.distributions.rescale_queries`: logit standard deviation 1 before sharpness), and
see every key (no mask; they have no position). Seeds derive from (base seed, name, layer, KV
head), never from execution order.
"""

from __future__ import annotations

import json
import math
import os
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import KvasymError

SUFFIXES = (".npz", ".safetensors", ".npy")
#: Accepted array names per role (one per role).
ROLE_NAMES: dict[str, tuple[str, ...]] = {
    "keys": ("k", "keys"),
    "values": ("v", "values"),
    "queries": ("q", "queries"),
    "kv_head_of_query_head": ("kv_head_of_query_head",),
    "layers": ("layers",),
}
#: safetensors dtype names -> numpy (BF16 and F8 have no numpy dtype: refused with a hint).
_SAFETENSORS_DTYPES = {"F16": "float16", "F32": "float32", "F64": "float64", "I8": "int8", "I16": "int16",
                       "I32": "int32", "I64": "int64", "U8": "uint8", "U16": "uint16", "U32": "uint32",
                       "U64": "uint64", "BOOL": "bool"}
MIN_POSITIONS = 2
MIN_HEAD_DIM = 3


@dataclass(frozen=True)
class CacheLayout:
    """The shape of a cache file, read from its headers (no data loaded)."""

    n_layers: int
    n_kv_heads: int
    n_positions: int
    head_dim: int
    value_dim: int
    n_query_heads: int | None  # None: no queries in the file
    n_query_positions: int | None


@dataclass(frozen=True)
class CacheFile:
    """A loaded, checked cache file, normalized to 4-D ``(L, H, T, d)`` arrays."""

    path: str
    keys: np.ndarray  # (L, H_kv, T, d) float
    values: np.ndarray  # (L, H_kv, T, d_v) float
    queries: np.ndarray | None  # (L, H_q, T_q, d) float
    kv_head_of_query_head: np.ndarray | None  # (H_q,) int
    layers: np.ndarray  # (L,) int

    @property
    def head_dim(self) -> int:
        return int(self.keys.shape[-1])


# --------------------------------------------------------------------------- headers


def _suffix(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise KvasymError(f"cache file {path}: unsupported suffix {path.suffix!r}; use one of {', '.join(SUFFIXES)}")
    return suffix


def _existing(path: str | Path) -> Path:
    p = Path(path)
    if p.is_dir():
        raise KvasymError(f"cache file {p} is a directory, not a {'/'.join(SUFFIXES)} file")
    if not p.is_file():
        raise KvasymError(f"cache file {p}: no such file")
    return p


def _npy_header(fh: Any) -> tuple[tuple[int, ...], np.dtype]:
    version = np.lib.format.read_magic(fh)
    reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _fortran, dtype = reader(fh)
    return tuple(int(s) for s in shape), np.dtype(dtype)


def inspect_arrays(path: str | Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """``{name: (shape, dtype name)}`` of every array of a cache file, from headers only (a
    multi-gigabyte dump is not read). A ``.npy`` file's single array is named ``"kv"``."""
    p = _existing(path)
    suffix = _suffix(p)
    try:
        if suffix == ".npy":
            with p.open("rb") as fh:
                shape, dtype = _npy_header(fh)
            return {"kv": (shape, dtype.name)}
        if suffix == ".npz":
            out = {}
            with zipfile.ZipFile(p) as archive:
                for member in archive.namelist():
                    name = member[:-4] if member.endswith(".npy") else member
                    with archive.open(member) as fh:
                        shape, dtype = _npy_header(fh)
                    out[name] = (shape, dtype.name)
            return out
        from safetensors import safe_open

        out = {}
        with safe_open(str(p), framework="numpy") as handle:
            for name in handle.keys():
                sliced = handle.get_slice(name)
                raw = str(sliced.get_dtype())
                out[name] = (tuple(int(s) for s in sliced.get_shape()), _SAFETENSORS_DTYPES.get(raw, raw))
        return out
    except KvasymError:
        raise
    except Exception as exc:  # noqa: BLE001 - zipfile, numpy and safetensors raise many types for a bad file
        raise KvasymError(f"cache file {p} is not a readable {suffix} file ({type(exc).__name__}: {exc})") from None


def _roles(names: Sequence[str], path: Path) -> dict[str, str]:
    """Map each role to the file's array name, refusing unknown, ambiguous or missing names."""
    known = {alias: role for role, aliases in ROLE_NAMES.items() for alias in aliases}
    unknown = sorted(set(names) - set(known))
    if unknown:
        allowed = ", ".join(alias for aliases in ROLE_NAMES.values() for alias in aliases)
        raise KvasymError(f"cache file {path}: unknown array name(s) {unknown}; allowed: {allowed}")
    roles: dict[str, str] = {}
    for name in names:
        role = known[name]
        if role in roles:
            raise KvasymError(f"cache file {path}: arrays {roles[role]!r} and {name!r} both give the {role}; keep one")
        roles[role] = name
    for role in ("keys", "values"):
        if role not in roles:
            raise KvasymError(f"cache file {path}: no {role} array (name it {' or '.join(ROLE_NAMES[role])})")
    return roles


def layout_of(arrays: Mapping[str, tuple[tuple[int, ...], str]],
              path: str | Path) -> tuple[CacheLayout, dict[str, str]]:
    """Check shapes and dtypes (from :func:`inspect_arrays` or loaded arrays) against the
    documented layout; return the layout and the role -> array-name map."""
    path = Path(path)
    if set(arrays) == {"kv"}:
        shape, dtype = arrays["kv"]
        if len(shape) not in (3, 4, 5) or shape[0] != 2:
            raise KvasymError(
                f"cache file {path}: a .npy cache is one array of shape (2, [L,] [H,] T, d) stacking K and V, "
                f"got shape {shape}"
            )
        arrays = {"k": (shape[1:], dtype), "v": (shape[1:], dtype)}
    roles = _roles(list(arrays), path)
    shapes = {role: arrays[name][0] for role, name in roles.items()}
    for role in ("keys", "values", "queries"):
        if role in roles:
            _check_numeric(arrays[roles[role]][1], roles[role], path)
    k, v = shapes["keys"], shapes["values"]
    if len(k) not in (2, 3, 4):
        raise KvasymError(f"cache file {path}: keys {roles['keys']!r} must have rank 2, 3 or 4 "
                          f"((T, d), (H_kv, T, d) or (L, H_kv, T, d)), got shape {k}")
    if len(v) != len(k) or v[:-1] != k[:-1]:
        raise KvasymError(f"cache file {path}: values {roles['values']!r} shape {v} does not match keys shape {k} "
                          "(same rank and leading (L, H_kv, T) dimensions expected)")
    k4 = (1,) * (4 - len(k)) + tuple(k)
    v4 = (1,) * (4 - len(v)) + tuple(v)
    if 0 in k4 or 0 in v4:
        raise KvasymError(f"cache file {path}: empty cache (keys shape {k}, values shape {v})")
    n_layers, n_kv, n_pos, dim = k4
    if n_pos < MIN_POSITIONS:
        raise KvasymError(f"cache file {path}: {n_pos} cached position(s); at least {MIN_POSITIONS} are needed")
    if dim < MIN_HEAD_DIM or v4[-1] < MIN_HEAD_DIM:
        raise KvasymError(f"cache file {path}: head_dim {dim} (keys) / {v4[-1]} (values); "
                          f"at least {MIN_HEAD_DIM} are needed")
    n_q_heads = n_q_pos = None
    if "queries" in roles:
        q = shapes["queries"]
        if len(q) != len(k):
            raise KvasymError(f"cache file {path}: queries {roles['queries']!r} have rank {len(q)} (shape {q}) "
                              f"but keys have rank {len(k)} (shape {k})")
        q4 = (1,) * (4 - len(q)) + tuple(q)
        if 0 in q4:
            raise KvasymError(f"cache file {path}: empty queries (shape {q})")
        if q4[-1] != dim:
            raise KvasymError(f"cache file {path}: queries have head_dim {q4[-1]} but keys have head_dim {dim}")
        if q4[0] != n_layers:
            raise KvasymError(f"cache file {path}: queries have {q4[0]} layers but keys have {n_layers}")
        if q4[1] % n_kv:
            raise KvasymError(f"cache file {path}: {q4[1]} query heads are not a multiple of {n_kv} KV heads "
                              "(give kv_head_of_query_head for another grouping)"
                              if "kv_head_of_query_head" not in roles
                              else f"cache file {path}: {q4[1]} query heads for {n_kv} KV heads")
        if q4[2] > n_pos:
            raise KvasymError(f"cache file {path}: {q4[2]} query positions but only {n_pos} cached positions "
                              "(queries are the last T_q <= T positions)")
        n_q_heads, n_q_pos = q4[1], q4[2]
    if "kv_head_of_query_head" in roles:
        if n_q_heads is None:
            raise KvasymError(f"cache file {path}: kv_head_of_query_head without queries")
        if shapes["kv_head_of_query_head"] != (n_q_heads,):
            raise KvasymError(f"cache file {path}: kv_head_of_query_head has shape {shapes['kv_head_of_query_head']}, "
                              f"expected ({n_q_heads},)")
    if "layers" in roles and shapes["layers"] != (n_layers,):
        raise KvasymError(f"cache file {path}: layers has shape {shapes['layers']}, expected ({n_layers},)")
    layout = CacheLayout(n_layers, n_kv, n_pos, dim, v4[-1], n_q_heads, n_q_pos)
    return layout, roles


def _check_numeric(dtype: str, name: str, path: Path) -> None:
    """Floats and integers (converted to float64, as ``kvasym evaluate`` does for matrices)."""
    try:
        kind = np.dtype(dtype).kind
    except TypeError:
        kind = "?"
    if kind not in "fiu" or dtype == "bool":
        hint = (" (convert bfloat16 to float32 before saving)" if "bf16" in dtype.lower() or "bfloat" in dtype.lower()
                else "")
        raise KvasymError(f"cache file {path}: array {name!r} has dtype {dtype}; "
                          f"expected a float or integer type{hint}")


def file_content_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a cache file's bytes (read in 1 MiB blocks): what the DAG keys a file
    cell's jobs on, so that a file replaced by another keeping its mtime is measured again."""
    import hashlib

    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        raise KvasymError(f"cache file {path} cannot be read ({exc.strerror or exc})") from None
    return digest.hexdigest()


def inspect_cache_file(path: str | Path) -> CacheLayout:
    """The checked layout of a cache file from its headers (cheap: used when the DAG is built)."""
    return layout_of(inspect_arrays(path), path)[0]


# --------------------------------------------------------------------------- loading


def _read_arrays(p: Path, suffix: str) -> dict[str, np.ndarray]:
    try:
        if suffix == ".safetensors":
            from safetensors.numpy import load_file

            return dict(load_file(str(p)))
        loaded = np.load(p, allow_pickle=False)
        if isinstance(loaded, np.lib.npyio.NpzFile):
            with loaded as npz:
                return {name: npz[name] for name in npz.files}
        return {"kv": loaded}
    except Exception as exc:  # noqa: BLE001 - a failure to parse the file is the file's fault
        raise KvasymError(f"cache file {p} is not a readable {suffix} file ({type(exc).__name__}: {exc})") from None


def _finite(array: np.ndarray, name: str, path: Path) -> None:
    bad = ~np.isfinite(array)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise KvasymError(f"cache file {path}: array {name!r} has {int(bad.sum())} non-finite values (NaN/Inf), "
                          f"first at index {first}")


def _int_vector(array: np.ndarray, name: str, path: Path, low: int, high: int | None) -> np.ndarray:
    if array.dtype.kind not in "iu":
        raise KvasymError(f"cache file {path}: {name!r} must hold integers, got dtype {array.dtype}")
    values = array.astype(np.int64)
    bad = (values < low) | (values >= high if high is not None else False)
    if bad.any():
        shown = f"in 0..{high - 1}" if high is not None else ">= 0"
        raise KvasymError(f"cache file {path}: {name!r} must be {shown}, got {values.tolist()}")
    return values


def load_cache_file(path: str | Path) -> CacheFile:
    """Read and check a cache file (see the module docstring); every failure is a KvasymError
    naming the file and the offending array."""
    p = _existing(path)
    suffix = _suffix(p)
    raw = _read_arrays(p, suffix)
    layout, roles = layout_of({name: (tuple(a.shape), a.dtype.name) for name, a in raw.items()}, p)
    if set(raw) == {"kv"}:
        raw = {"k": raw["kv"][0], "v": raw["kv"][1]}
    out: dict[str, np.ndarray | None] = {}
    for role in ("keys", "values", "queries"):
        if role not in roles:
            out[role] = None
            continue
        array = raw[roles[role]]
        _finite(array, roles[role], p)
        out[role] = array.reshape((1,) * (4 - array.ndim) + array.shape)
    groups = None
    if layout.n_query_heads is not None:
        if "kv_head_of_query_head" in roles:
            groups = _int_vector(raw[roles["kv_head_of_query_head"]], "kv_head_of_query_head", p, 0, layout.n_kv_heads)
        else:
            groups = np.arange(layout.n_query_heads) // (layout.n_query_heads // layout.n_kv_heads)
        unread = sorted(set(range(layout.n_kv_heads)) - set(groups.tolist()))
        if unread:
            raise KvasymError(f"cache file {p}: no query head reads KV head(s) {unread}")
    if "layers" in roles:
        layers = _int_vector(raw[roles["layers"]], "layers", p, 0, None)
        if len(set(layers.tolist())) != layers.size:
            raise KvasymError(f"cache file {p}: 'layers' has duplicates: {layers.tolist()}")
    else:
        layers = np.arange(layout.n_layers)
    return CacheFile(path=str(p), keys=out["keys"], values=out["values"], queries=out["queries"],
                     kv_head_of_query_head=groups, layers=layers)


# --------------------------------------------------------------------------- queries


def keys_family_queries(keys: np.ndarray, n_queries: int, gen: np.random.Generator) -> np.ndarray:
    """The query rule of a cache without queries (module docstring): ``n_queries`` draws from
    the Gaussian with the keys' empirical mean and (population) covariance, rescaled by the
    study's query rule. float64, shape (n_queries, d)."""
    from .distributions import rescale_queries

    keys = np.asarray(keys, dtype=np.float64)
    mean = keys.mean(axis=0)
    centred = keys - mean
    draws = mean + gen.standard_normal((n_queries, keys.shape[0])) @ centred / math.sqrt(keys.shape[0])
    return rescale_queries(draws, keys)


def query_mask(n_query_positions: int, n_positions: int, causal: bool) -> np.ndarray | None:
    """The (T_q, T) mask of the file's own queries: the last T_q positions, causal or not."""
    if not causal:
        return None
    from .evaluate import causal_mask

    return causal_mask(n_query_positions, n_positions)


def describe(layout: CacheLayout) -> str:
    """One line for logs and errors."""
    queries = (f"{layout.n_query_heads} query heads x {layout.n_query_positions} positions"
               if layout.n_query_heads is not None else "no queries (the keys-family query rule)")
    return (f"{layout.n_layers} layer(s) x {layout.n_kv_heads} KV head(s) x {layout.n_positions} positions, "
            f"head_dim {layout.head_dim} (values {layout.value_dim}), {queries}")


def layout_json(layout: CacheLayout) -> str:
    return json.dumps(layout.__dict__, sort_keys=True)


# --------------------------------------------------------------------------- evaluation


def evaluate_cache_file(
    cache: CacheFile,
    scheme: Any,
    budget: int,
    *,
    name: str,
    base_seed: int,
    n_queries: int,
    sharpness: Sequence[float],
    causal: bool = True,
    norm_dtype: str = "float32",
) -> tuple[dict[str, np.ndarray], list[dict[str, Any]]]:
    """Per-query metrics of ``scheme`` at ``budget`` on every (layer, KV head) of ``cache``.

    Returns the columns of :data:`kvasym.dataset.PER_QUERY_SCHEMA` that do not name the cell
    (``trial`` = index of the (layer, KV head) in file order, ``query``, ``sharpness``, metrics,
    bits) and the trial map ``[{trial, text, layer, kv_head}]``. With the file's own queries the
    sharpness is 1 (the model's attention); without them, the study's ``sharpness`` values and
    ``n_queries`` queries per head (module docstring).
    """
    from .evaluate import head_metrics
    from .seeds import rng

    own_queries = cache.queries is not None
    levels = [1.0] if own_queries else [float(s) for s in sharpness]
    mask = None
    if own_queries:
        n_q_pos = cache.queries.shape[2]
        single = query_mask(n_q_pos, cache.keys.shape[2], causal)
    columns: dict[str, list[np.ndarray]] = {}
    trial_map: list[dict[str, Any]] = []
    for li, layer in enumerate(cache.layers.tolist()):
        for kv_head in range(cache.keys.shape[1]):
            trial = len(trial_map)
            trial_map.append({"trial": trial, "text": name, "layer": int(layer), "kv_head": kv_head})
            keys = np.asarray(cache.keys[li, kv_head], dtype=np.float64)
            values = np.asarray(cache.values[li, kv_head], dtype=np.float64)
            if own_queries:
                heads = np.flatnonzero(cache.kv_head_of_query_head == kv_head)
                queries = np.asarray(cache.queries[li, heads], dtype=np.float64).reshape(-1, keys.shape[1])
                mask = None if single is None else np.tile(single, (heads.size, 1))
            else:
                queries = keys_family_queries(keys, n_queries,
                                              rng(base_seed, "file-queries", name, int(layer), kv_head))
            try:
                results = head_metrics(keys, keys, values, queries, scheme, budget, base_seed=base_seed,
                                       identity=(name, int(layer), kv_head), sharpness=levels, mask=mask,
                                       norm_dtype=norm_dtype)
            except KvasymError as exc:
                raise KvasymError(f"cache {name}, layer {layer}, KV head {kv_head}: {exc}") from None
            n = queries.shape[0]
            for level, (per_query, bits) in zip(levels, results):
                parts = {"trial": np.full(n, trial, dtype=np.int32), "sharpness": np.full(n, level),
                         **{key: np.full(n, value) for key, value in bits.items()},
                         **{key: np.asarray(column) for key, column in per_query.items()}}
                for key, value in parts.items():
                    columns.setdefault(key, []).append(value)
    return {key: np.concatenate(parts) for key, parts in columns.items()}, trial_map
