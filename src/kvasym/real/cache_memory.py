"""What a model's KV cache holds at a given length, in bytes: payload, side information and the
full-precision rows, on every layer, sliding windows included.

A cache of ``L`` tokens stores, on layer ``l`` and each of its ``n_kv`` KV heads, ``S_l`` rows of
``head_dim`` keys and as many values: ``S_l = min(L, W)`` on a sliding-window layer of window
``W`` (an engine evicts what the window no longer reads; Gemma 3: 15 of 18 layers, ``W = 512``)
and ``S_l = L`` elsewhere. On a quantized layer ``F_l`` of those rows are float16
(:func:`kvasym.real.endtoend.full_precision_rows` of ``S_l``: a recent window ``R``, an incomplete
causal chunk) and the others cost the scheme's measured bits per coordinate ``b_K``, ``b_V``
(payload plus side information); a layer left unquantized holds float16 rows. So

``bits = n_kv * head_dim * sum_l [ (S_l - F_l) (b_K + b_V) + 2 * 16 F_l ]`` (quantized ``l``)
``       + n_kv * head_dim * sum_l 2 * 16 S_l`` (the others),

``bytes = bits / 8``, ``bytes per token = bytes / L`` and bits per stored value
``bits / (2 n_kv head_dim sum_l S_l)``. Bytes per token is the column the field reports for a
cache's memory (llama.cpp's ``--cache-type`` tables, NVIDIA Model-Optimizer's KV formats): at 4K
tokens, SmolLM2-135M's float16 cache is 23,040 bytes per token (30 layers, 3 KV heads of 64),
Gemma 3 270M's 4,992 (its sliding layers hold 512 of the 4,096 rows).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from ..errors import KvasymError
from ..schemes import SIDES
from .endtoend import FULL_PRECISION_BITS, full_precision_rows
from .gguf_model import ModelConfig


def global_layers(config: ModelConfig) -> tuple[int, ...]:
    """The layers that attend to every earlier key (every layer of a full-attention model)."""
    return tuple(i for i in range(config.n_layers) if not config.is_sliding(i))


@dataclass(frozen=True)
class CacheMemory:
    """A cache's size at one length (module docstring for the formula).

    Attributes
    ----------
    length : int
        Tokens in the context, ``L``.
    bits : float
        Every stored bit: payload, side information and float16 rows, over all layers.
    values : int
        Stored values (keys and values, every layer, KV head and coordinate).
    rows : tuple of int
        ``S_l`` per layer (:meth:`ModelConfig.stored_rows`).
    """

    length: int
    bits: float
    values: int
    rows: tuple[int, ...]

    @property
    def bytes(self) -> float:
        """The cache's bytes."""
        return self.bits / 8.0

    @property
    def bytes_per_token(self) -> float:
        """Bytes divided by the context's tokens."""
        return self.bytes / self.length

    @property
    def bits_per_value(self) -> float:
        """Bits per stored value (0 when nothing is stored)."""
        return self.bits / self.values if self.values else 0.0


def cache_memory(config: ModelConfig, length: int, bits_per_coordinate: Mapping[str, float] | None = None,
                 quantized_layers: Collection[int] | None = None, recent_tokens: int = 0,
                 causal_chunk: int = 0) -> CacheMemory:
    """The cache of ``config``'s model after ``length`` tokens.

    Parameters
    ----------
    config : ModelConfig
        The model (layers, KV heads, head_dim, sliding windows).
    length : int
        Tokens in the context (``L >= 1``).
    bits_per_coordinate : mapping of {"K", "V"} to float, optional
        ``b_K``, ``b_V``: a quantized row's measured bits per coordinate, payload plus side
        (the pass's ``k_bits_payload + k_bits_side`` before any full-precision rows). None: the
        float16 cache (every layer unquantized).
    quantized_layers : collection of int, optional
        The layers whose cache is quantized (None: every layer; ignored without
        ``bits_per_coordinate``).
    recent_tokens, causal_chunk : int
        ``R`` and ``C`` of :func:`kvasym.real.endtoend.full_precision_rows`, applied to each
        quantized layer's ``S_l``.

    Returns
    -------
    CacheMemory

    References
    ----------
    .. [1] Liu, Z. et al. (2024) "KIVI", ICML, arXiv:2402.02750 (a float16 window of recent
       tokens beside the quantized cache).
    """
    length = int(length)
    if length < 1:
        raise KvasymError(f"length must be >= 1, got {length}")
    layers = range(config.n_layers)
    if bits_per_coordinate is None:
        quantized: set[int] = set()
        per_row = 0.0
    else:
        missing = [side for side in SIDES if side not in bits_per_coordinate]
        if missing:
            raise KvasymError(f"bits_per_coordinate needs {list(SIDES)}, missing {missing}")
        per_row = float(sum(bits_per_coordinate[side] for side in SIDES))
        quantized = set(layers) if quantized_layers is None else {int(i) for i in quantized_layers}
        bad = sorted(i for i in quantized if not 0 <= i < config.n_layers)
        if bad:
            raise KvasymError(f"quantized_layers {bad} out of range 0..{config.n_layers - 1}")
    width = config.n_kv_heads * config.head_dim
    rows = tuple(config.stored_rows(i, length) for i in layers)
    bits = 0.0
    for i, s in zip(layers, rows):
        if i in quantized:
            f = full_precision_rows(s, recent_tokens, causal_chunk)
            bits += width * ((s - f) * per_row + 2 * FULL_PRECISION_BITS * f)
        else:
            bits += width * 2 * FULL_PRECISION_BITS * s
    return CacheMemory(length=length, bits=bits, values=2 * width * sum(rows), rows=rows)
