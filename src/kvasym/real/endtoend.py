"""End-to-end damage: SmolLM2-135M run with every layer's KV cache quantized.

The study's other quality measures are proxies at one attention head (KL between attention
distributions, routing recall, head output error). This module measures what a user of the
model sees: the next-token distribution of the whole model when its KV cache is quantized.

The quantized pass (teacher forcing over one text, positions ``0..T-1``)
    Layer by layer, as a deployed cache is filled and read: layer ``l``'s keys and values are
    computed from the residual stream *of the quantized pass* (so they carry the damage of
    layers ``< l``), each KV head's ``K`` (T, head_dim) and ``V`` are quantized with the
    scheme at budget ``n`` (:func:`kvasym.evaluate.quantize_pair`), and every query head of
    the group reads the dequantized ``K_hat``, ``V_hat`` under the causal mask. Quantization
    is row-wise (norm, rotation, codes and sketch of each position depend on that position's
    vector only), so quantizing the whole ``(T, head_dim)`` matrix at once stores exactly the
    rows a cache filled one token at a time would hold.

Own position (``own``)
    ``"exact"`` (default): position ``i`` reads the *quantized* keys and values of positions
    ``j < i`` and its own key and value exactly, as a decoder step does (the new token's K
    and V are computed in full precision in the step that appends them to the cache); the
    logit of its own key is ``q_i . k_i / sqrt(d)`` and its output gains
    ``p_ii (v_i - v_hat_i)`` (:meth:`~kvasym.real.gguf_model.GGUFLlama.attention`). Position 0
    is then exactly the reference. ``"quantized"``: every key and value read is quantized
    (a cache written before it is read, e.g. prefill into a quantized cache).

Full-precision recent window (``recent_tokens = R``, KIVI's residual as its authors define it [3]_)
    The most recent ``R`` tokens (``R >= 1``, counting the own position) are held in full
    precision: query ``i`` reads ``j < s_i`` quantized and ``s_i <= j <= i`` exactly with
    ``s_i = max(0, i - R + 1)`` (:func:`exact_read_starts`); ``R = 1`` is ``own="exact"``, and
    ``R >= T`` reads everything exactly (the reference). The cache is quantized as in prefill
    (every row from the whole block); the window only changes which rows are read.

Causal (streaming) chunks (``causal_chunk = C``)
    A cache filled token by token cannot use statistics of tokens it has not seen. Schemes with
    block statistics (:func:`uses_block_statistics`: centring, SKLT's KLT basis and water-filling
    variances, KIVI's per-channel key groups along the token axis) otherwise let early queries
    read keys quantized with statistics of later tokens. With ``C > 0`` the rows are quantized
    in chunks ``[cC, (c + 1)C)``, each from its own rows only, and a chunk is read in its
    quantized form only once complete: query ``i`` reads the rows of its own, incomplete chunk
    exactly, ``s_i = min(s_i^own/window, floor(i / C) C)``. This is KIVI's residual: tokens wait
    in full precision until a group of ``C`` is full. Every chunk uses the same random maps (the
    identity ``(seed_text, layer, kv_head)`` of the prefill pass): a deployed cache draws its
    rotation and sketch once per layer and head, not per chunk, and so a row-wise scheme's
    quantized rows are the prefill rows (its causal pass differs from prefill only by the
    full-precision rows of the incomplete chunk, a KIVI-style residual).

Bits of full-precision rows
    At a context of ``L`` tokens (the text's token count) a cache holds ``F`` rows in float16
    (16 bits per value) and ``L - F`` rows quantized at the measured ``b`` bits per value
    (payload + side of that cache side), so a side spends ``((L - F) b + 16 F) / L``:
    the bits columns keep the measured payload and add the excess to the side part,
    ``*_bits_side += F (16 - b) / L`` (:func:`add_full_precision_rows`). ``F = min(L, max(R,
    r_C))`` (:func:`full_precision_rows`: the window, and the incomplete chunk charged at its
    mean over a chunk cycle, ``r_C = (C - 1) / 2`` once ``L >= C``, not at ``L mod C``, which
    depends on where the text ends); with chunks ``b`` is measured over the complete chunks'
    packed caches, their side arrays (means, bases, scales per chunk) included. The own
    position of ``own="exact"`` alone (``R = 0``) is not counted, as before: a decoder step
    computes it.

Query-aware keys (``query_variant``)
    ``QRKV`` and ``QWF`` (:mod:`kvasym.real.queryaware`) quantize keys in the eigenbasis of
    the calibrated post-RoPE queries' second moment (``query_bases``), values by RKV's V side,
    with the pass's seed identity: so only ``rope="post"`` (the bases are of post-RoPE
    queries). The pass's scheme column is the variant's name (:attr:`CacheQuantization.name`).
    QWF centres and water-fills over the block: it uses block statistics.

Keys before or after RoPE (``rope``)
    ``"post"``: the cache stores RoPE-rotated keys (what deployed caches store; distribution
    ``smollm2`` of the per-head study). ``"pre"``: the cache stores keys before RoPE and
    rotates the dequantized keys (float64 tables) when read (``smollm2-prerope``). Every
    scheme allows both: RoPE acts on the dequantized rows.

Seeds and draws
    Rotation and QJL seeds derive from (base seed, text, draw, layer, KV head, side) only
    (:func:`kvasym.seeds.derived_seed` through ``quantize_pair``): every scheme, budget, RoPE
    mode and sensitivity pass of one draw sees the same random maps. Draw 0's identity is the
    one the per-head real metrics use, ``(text, layer, kv_head)``, so layer 0 (whose K and V the
    quantized pass does not change) is quantized exactly as in :mod:`kvasym.real.evaluate`;
    draw ``s > 0`` replaces the text by ``"<text>/draw<s>"`` (:attr:`CacheQuantization.seed_text`).
    Every position of a text shares its draw, so the draw-to-draw spread is part of the
    end-to-end error: the unit of every interval and paired test is a (text, draw) pair
    (:mod:`kvasym.real.endtoend_stats`). A scheme that draws nothing (no seeded transform and
    no sketch on either side: KV, SKLT, KIVI; :func:`draws_random_maps`) gives the same cache in
    every draw, so it runs in draw 0 only; the statistics read its one pass per text as the
    value of every draw of that text.

Next-token measures (position ``i`` predicts token ``i + 1``, ``i = 0..T-2``)
    With reference logits ``z`` and quantized logits ``z_hat`` (float32, as the forward pass),
    ``lse(z) = log sum_v exp z_v`` formed in float64, ``p = softmax(z)``:

    - ``nll_i = lse(z_hat) - z_hat[t_{i+1}]`` (nats); perplexity ``exp(mean nll)``;
    - ``kl_i = KL(p || p_hat) = sum_v p_v (z_v - z_hat_v) - lse(z) + lse(z_hat)`` (the
      differences ``z - z_hat`` formed in float64, so a logit shift common to the whole
      vocabulary cancels exactly);
    - ``top1_i = [argmax z == argmax z_hat]``;
    - the change of the probability of the observed next token, llama.cpp's ``Δp``, is
      ``dp_i = exp(-nll_i) - exp(-nll_ref_i)``: a function of the stored columns, formed by the
      statistics (:mod:`kvasym.real.endtoend_stats`), not stored.

References
----------
.. [1] Zandieh, A., Daliri, M., Hadian, M., Mirrokni, V. (2025) "TurboQuant: Online Vector
   Quantization with Near-optimal Distortion Rate", arXiv:2504.19874 (end-to-end evaluation
   of a quantized KV cache on a language model).
.. [2] Kullback, S., Leibler, R. A. (1951) "On information and sufficiency", Ann. Math.
   Statist. 22(1):79-86.
.. [3] Liu, Z., Yuan, J., Jin, H., Zhong, S., Xu, Z., Braverman, V., Chen, B., Hu, X. (2024)
   "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache", ICML, arXiv:2402.02750
   (per-channel key groups, full-precision residual of the most recent tokens).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import KvasymError
from ..evaluate import dequantize_with, quantize_pair
from ..schemes import GROUPED_SCALARS, SIDES, Scheme
from .gguf_model import GGUFLlama, SequenceFrame, apply_rope
from .queryaware import VARIANTS, QueryBases, quantize_pair_query_aware, variant_scheme

ROPE_MODES = ("post", "pre")
OWN_MODES = ("exact", "quantized")
#: ``layer`` of the rows whose pass quantized every layer (a single layer's pass gives its number).
ALL_LAYERS = -1
#: The scheme-column suffix of a query-aware variant whose bases were calibrated on long-text
#: windows of the pass's own length (:func:`kvasym.real.longcontext.window_bases`): ``QWF+W``.
WINDOW_BASES_TAG = "+W"
#: Rows of the (rows, vocab) logits handled at once: 128 x 49152 float64 is ~50 MB, 128 x 262,144
#: (Gemma 3) ~270 MB. Not fewer for a larger vocabulary: each block streams the whole (vocab,
#: d_model) output matrix from memory (0.67 GB for Gemma), so Gemma's measures of a 512-token pass
#: took 5.1 CPU-s of logits in blocks of 24 rows against 1.9 in one product. The reference
#: keeps its float32 logits whole (T x vocab: 100 MB at 512 SmolLM2 tokens, 1.07 GB at 1,024 Gemma
#: tokens) and its float64 probabilities too while they take at most :data:`PROBS_HELD_BYTES`
#: (every quantized pass of the text reuses them: 200 MB at 512 SmolLM2 tokens, 1.6 GB at 4,096);
#: beyond that (Gemma: 2.1 GB at 1,024 tokens) it forms them one block at a time for each pass.
METRIC_BLOCK_ROWS = 128
PROBS_HELD_BYTES = 2 * 2**30
BITS_COLUMNS = tuple(f"{side.lower()}_bits_{part}" for side in SIDES for part in ("payload", "side"))
#: Scheme-column tag of a pass that quantizes the model's global (full-attention) layers only, its
#: sliding-window layers left in float16 (as engines that quantize only global layers run Gemma 3).
GLOBAL_TAG = "+G"
#: Bits per value of a row held in full precision (float16, as KIVI keeps its residual).
FULL_PRECISION_BITS = 16


@dataclass(frozen=True)
class CacheQuantization:
    """How one quantized pass reads its cache.

    Parameters
    ----------
    scheme : Scheme
        The scheme (KV, KQV, QKQV, RKV, or a user scheme).
    budget : int
        Bits per coordinate ``n``.
    base_seed : int
        The study's base seed.
    text : str
        The text's name: part of every seed's identity ``(text, layer, kv_head, side)``.
    rope : {"post", "pre"}
        Keys quantized after RoPE (stored rotated) or before it (rotated when read).
    own : {"exact", "quantized"}
        Whether a position reads its own key and value exactly or from the quantized cache.
    layers : frozenset of int, optional
        The layers whose cache is quantized (None: every layer).
    norm_dtype : str
        Storage dtype of the norms (``"float16"`` or ``"float32"``).
    draw : int
        The draw of random maps (rotations, sketches) of this text: 0 is the per-head study's
        identity, ``s > 0`` an independent draw (module docstring, "Seeds and draws").
    recent_tokens : int
        ``R``: 0 (default) reads as ``own`` says; ``R >= 1`` reads the most recent ``R``
        positions (the own one included) exactly (module docstring; needs ``own="exact"``).
    causal_chunk : int
        ``C``: 0 (default) quantizes the whole block at once (prefill); ``C >= 1`` quantizes
        chunks of ``C`` rows separately and reads the incomplete chunk exactly (streaming).
    query_variant : {"QRKV", "QWF"} or None
        A query-aware key quantizer (``scheme`` must then be ``variant_scheme(query_variant)``,
        ``rope`` ``"post"``, and ``query_bases`` given).
    query_bases : QueryBases or None
        The calibrated bases the variant reads (held by reference, not compared or hashed).
    bases_tag : str
        Appended to the variant's name in :attr:`name` when its bases are not the study's
        calibration (e.g. :data:`WINDOW_BASES_TAG`: calibrated on long-text windows); the seeds
        do not depend on it, so two passes that differ only in their bases are paired.
    scope_tag : str
        Appended to :attr:`name` for a pass whose ``layers`` are a named scope (e.g.
        :data:`GLOBAL_TAG`: the global layers only); the seeds do not depend on it, so the scope's
        layers draw the maps of the all-layer pass and the two are paired.
    """

    scheme: Scheme
    budget: int
    base_seed: int
    text: str
    rope: str = "post"
    own: str = "exact"
    layers: frozenset[int] | None = None
    norm_dtype: str = "float32"
    draw: int = 0
    recent_tokens: int = 0
    causal_chunk: int = 0
    query_variant: str | None = None
    query_bases: QueryBases | None = field(default=None, compare=False, repr=False)
    bases_tag: str = ""
    scope_tag: str = ""

    def __post_init__(self) -> None:
        if self.rope not in ROPE_MODES:
            raise KvasymError(f"rope must be one of {ROPE_MODES}, got {self.rope!r}")
        if self.own not in OWN_MODES:
            raise KvasymError(f"own must be one of {OWN_MODES}, got {self.own!r}")
        if isinstance(self.draw, bool) or not isinstance(self.draw, (int, np.integer)) or self.draw < 0:
            raise KvasymError(f"draw must be a non-negative integer, got {self.draw!r}")
        for key in ("recent_tokens", "causal_chunk"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise KvasymError(f"{key} must be a non-negative integer, got {value!r}")
        if self.recent_tokens and self.own == "quantized":
            raise KvasymError(f"recent_tokens={self.recent_tokens} reads the own position exactly; it cannot "
                              "be combined with own='quantized'")
        if self.query_variant is not None:
            if self.query_variant not in VARIANTS:
                raise KvasymError(f"query_variant must be one of {VARIANTS}, got {self.query_variant!r}")
            if self.rope != "post":
                raise KvasymError(f"query_variant {self.query_variant} needs rope='post' (the query bases are of "
                                  f"post-RoPE queries), got rope={self.rope!r}")
            if self.query_bases is None:
                raise KvasymError(f"query_variant {self.query_variant} needs query_bases")
            if self.scheme != variant_scheme(self.query_variant):
                raise KvasymError(f"query_variant {self.query_variant} stores its rows with scheme "
                                  f"{variant_scheme(self.query_variant).name}, got scheme {self.scheme.name!r}")
        elif self.query_bases is not None or self.bases_tag:
            raise KvasymError("query_bases or bases_tag given without a query_variant")
        if self.scope_tag and self.layers is None:
            raise KvasymError(f"scope_tag {self.scope_tag!r} names a set of layers; give layers")
        self.scheme.validate_budget(int(self.budget))

    @property
    def name(self) -> str:
        """The pass's scheme column: the scheme's name or the query variant's (with its
        :attr:`bases_tag`), then ``+R<R>`` for a recent window and ``+C<C>`` for causal chunks,
        then :attr:`scope_tag` (e.g. ``KIVI128+C32``, ``QWF+W``, ``RKV+G``)."""
        name = f"{self.query_variant}{self.bases_tag}" if self.query_variant else self.scheme.name
        if self.recent_tokens:
            name += f"+R{int(self.recent_tokens)}"
        if self.causal_chunk:
            name += f"+C{int(self.causal_chunk)}"
        return name + self.scope_tag

    @property
    def reads_a_band(self) -> bool:
        """Whether some position reads more than its own row exactly (a window or chunks)."""
        return bool(self.recent_tokens or self.causal_chunk)

    @property
    def seed_text(self) -> str:
        """The text part of every seed's identity (:func:`draw_seed_text`)."""
        return draw_seed_text(self.text, self.draw)

    def quantizes(self, layer: int) -> bool:
        """Whether layer ``layer``'s cache is quantized in this pass."""
        return self.layers is None or layer in self.layers


def draw_seed_text(text: str, draw: int) -> str:
    """The text part of every seed's identity in draw ``draw`` of ``text``: the text itself in
    draw 0 (the per-head study's identity), ``"<text>/draw<s>"`` in draw ``s > 0``."""
    return text if int(draw) == 0 else f"{text}/draw{int(draw)}"


def draws_random_maps(scheme: Scheme) -> bool:
    """Whether ``scheme``'s caches depend on the draw: a side with a seeded transform (WHT or
    Haar rotation) or a sketch. Otherwise every draw would repeat draw 0's passes exactly."""
    return any(scheme.side(side).seeded_transform or scheme.side(side).qjl for side in SIDES)


def uses_block_statistics(scheme: Scheme) -> bool:
    """Whether a side of ``scheme`` stores statistics of the whole block of rows it quantizes:
    a centre (block mean), a KLT basis, water-filling variances, or KIVI's per-channel minmax
    groups of tokens (``scalar: minmax, axis: channel``). Such a scheme's prefill cache lets
    early queries read rows quantized with statistics of later tokens; a row-wise scheme's
    rows depend on their own vector only (module docstring, "Causal (streaming) chunks")."""
    return any(spec.center or spec.transform == "klt" or spec.allocation == "waterfill"
               or (spec.scalar in GROUPED_SCALARS and spec.axis == "channel")
               for spec in (scheme.side(side) for side in SIDES))


def exact_read_starts(n_tokens: int, own: str = "exact", recent_tokens: int = 0,
                      causal_chunk: int = 0) -> np.ndarray:
    """``s_i`` for ``i = 0..T-1``: query ``i`` reads positions ``j < s_i`` from the quantized
    cache and ``s_i <= j <= i`` exactly.

    ``own="exact"``: ``s_i = i``; ``"quantized"``: ``s_i = i + 1``; a recent window of
    ``R >= 1`` tokens: ``s_i = max(0, i - R + 1)``; causal chunks of ``C`` rows: the smaller of
    that and ``floor(i / C) C`` (the start of ``i``'s incomplete chunk).
    """
    positions = np.arange(int(n_tokens))
    starts = positions if own == "exact" else positions + 1
    if recent_tokens:
        starts = np.maximum(0, positions - int(recent_tokens) + 1)
    if causal_chunk:
        starts = np.minimum(starts, positions // int(causal_chunk) * int(causal_chunk))
    return starts


def full_precision_rows(n_tokens: int, recent_tokens: int = 0, causal_chunk: int = 0) -> float:
    """``F``: rows a cache of ``L = n_tokens`` tokens holds in float16, ``min(L, max(R, r_C))``:
    the recent window ``R`` and the incomplete chunk's rows ``r_C``, charged at their mean over a
    chunk cycle, ``(C - 1) / 2``, once the context holds a complete chunk (``L >= C``; else
    ``r_C = L``: nothing is quantized yet), not at ``L mod C`` (where the text happens to end:
    0 when ``C`` divides ``L``, although every position before read up to ``C - 1`` such rows)."""
    length, chunk = int(n_tokens), int(causal_chunk)
    residual = 0.0 if not chunk else (length if length < chunk else (chunk - 1) / 2.0)
    return float(min(length, max(int(recent_tokens), residual)))


def add_full_precision_rows(bits: Mapping[str, float], n_full_precision: float, n_tokens: int) -> dict[str, float]:
    """Bits per value of a cache with ``F = n_full_precision`` of its ``L = n_tokens`` rows in
    float16 and the rest at the measured ``bits`` (:data:`BITS_COLUMNS`): per side, with
    ``b = payload + side``, the side part gains ``F (16 - b) / L``, so the side's total is
    ``((L - F) b + 16 F) / L``; the payload part is kept as measured."""
    out = dict(bits)
    for side in SIDES:
        prefix = side.lower()
        measured = bits[f"{prefix}_bits_payload"] + bits[f"{prefix}_bits_side"]
        out[f"{prefix}_bits_side"] = (bits[f"{prefix}_bits_side"]
                                      + n_full_precision * (FULL_PRECISION_BITS - measured) / n_tokens)
    return out


def _quantize_block(stored: np.ndarray, values: np.ndarray, quant: CacheQuantization, index: int,
                    head: int) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """One block of rows (float64) quantized and dequantized by ``quant``'s scheme or query
    variant with identity ``(seed_text, index, head)``, and its measured bits per coordinate."""
    identity = (quant.seed_text, int(index), head)
    if quant.query_variant is not None:
        return quantize_pair_query_aware(stored, values, quant.query_variant, int(quant.budget), quant.query_bases,
                                         int(index), head, base_seed=quant.base_seed, identity=identity,
                                         norm_dtype=quant.norm_dtype, kernel="auto")
    packed = quantize_pair(stored, values, quant.scheme, int(quant.budget), base_seed=quant.base_seed,
                           identity=identity, norm_dtype=quant.norm_dtype, kernel="auto")
    bits = {f"{side.lower()}_bits_{part}": packed[side].bits_per_coordinate()[part]
            for side in SIDES for part in ("payload", "side")}
    return dequantize_with(packed["K"], "auto"), dequantize_with(packed["V"], "auto"), bits


def quantize_rows(stored: np.ndarray, values: np.ndarray, quant: CacheQuantization, index: int,
                  head: int) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """``(K_hat, V_hat, bits)`` of one KV head's stored rows (T, head_dim), float64.

    Prefill (``causal_chunk = 0``): the whole block at once. Chunks of ``C``: each complete
    chunk ``[cC, (c + 1)C)`` quantized alone with the same identity (module docstring), the
    incomplete last chunk (``T mod C`` rows) returned exactly (it is only ever read exactly);
    ``bits`` is the mean over the complete chunks (equal sizes: the measured total over them),
    zeros when there is none. Full-precision rows are not in ``bits`` (:func:`quantized_cache`).
    """
    stored = np.asarray(stored, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    chunk = int(quant.causal_chunk)
    if not chunk:
        return _quantize_block(stored, values, quant, index, head)
    k_hat, v_hat = stored.copy(), values.copy()
    measured = []
    for first in range(0, stored.shape[0] - chunk + 1, chunk):
        rows = slice(first, first + chunk)
        k_hat[rows], v_hat[rows], chunk_bits = _quantize_block(stored[rows], values[rows], quant, index, head)
        measured.append(chunk_bits)
    return k_hat, v_hat, {key: float(np.mean([b[key] for b in measured])) if measured else 0.0
                          for key in BITS_COLUMNS}


def quantized_cache(model: GGUFLlama, index: int, keys: np.ndarray, keys_pre_rope: np.ndarray,
                    values: np.ndarray, quant: CacheQuantization,
                    bits: list[dict[str, float]] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(K_hat, V_hat)`` of layer ``index``, each (n_kv_heads, T, head_dim) in the model dtype.

    Each KV head's rows are quantized by :func:`kvasym.evaluate.quantize_pair` (or, with a
    ``query_variant``, :func:`kvasym.real.queryaware.quantize_pair_query_aware`) with identity
    ``(seed_text, index, kv_head)`` (the compiled kernels where they implement the side, as in every
    stage of the DAG: byte-identical caches, reconstructions equal to float rounding), whole or in
    causal chunks (:func:`quantize_rows`); with
    ``rope="pre"`` the stored keys are ``keys_pre_rope`` and the dequantized keys are rotated by
    RoPE (float64 tables) before they are read. The
    measured bits per coordinate of each head are appended to ``bits`` when given, with the
    full-precision rows of a window or incomplete chunk counted (:func:`add_full_precision_rows`).
    """
    n_kv, n_tokens, head_dim = keys.shape
    k_hat = np.empty_like(keys)
    v_hat = np.empty_like(values)
    if quant.rope == "pre":
        cos, sin = model.config.rope_tables(np.arange(n_tokens), np.float64, sliding=model.config.is_sliding(index))
    # A sliding-window layer's cache holds only its window's rows (Gemma 3): its float16 rows are
    # a share of those, not of the whole text (for a full-attention layer rows_held == n_tokens).
    rows_held = model.config.stored_rows(index, n_tokens)
    n_full_precision = full_precision_rows(rows_held, quant.recent_tokens, quant.causal_chunk)
    for head in range(n_kv):
        stored = keys[head] if quant.rope == "post" else keys_pre_rope[head]
        keys_read, v_hat[head], head_bits = quantize_rows(stored, values[head], quant, index, head)
        if quant.rope == "pre":
            keys_read = apply_rope(keys_read, cos, sin)
        k_hat[head] = keys_read
        if bits is not None:
            bits.append(add_full_precision_rows(head_bits, n_full_precision, rows_held) if n_full_precision
                        else head_bits)
    return k_hat, v_hat


def run_layers(model: GGUFLlama, frame: SequenceFrame, x: np.ndarray, start: int,
               quant: CacheQuantization | None, bits: list[dict[str, float]] | None = None,
               residuals: list[np.ndarray] | None = None) -> np.ndarray:
    """Final hidden states (T, d_model) of the pass that enters layer ``start`` with residual
    stream ``x``, every layer ``quant`` names reading its quantized cache.

    ``quant=None`` (or a layer it does not quantize) runs the model's own attention: with no
    quantized layer this is :meth:`GGUFLlama.forward` operation for operation (bit-identical).
    ``residuals``, when given, receives the residual stream entering each layer.
    """
    for index in range(start, len(model.layers)):
        if residuals is not None:
            residuals.append(x)
        acts = model.attention_inputs(index, x, frame)
        layer_frame = frame.at(index)  # a sliding-window layer's own mask and RoPE (Gemma 3)
        if quant is None or not quant.quantizes(index):
            attended = model.attention(acts.q, acts.k, acts.v, layer_frame)
        else:
            k_hat, v_hat = quantized_cache(model, index, acts.k, acts.k_pre_rope, acts.v, quant, bits)
            if quant.reads_a_band:
                starts = exact_read_starts(frame.ids.size, quant.own, quant.recent_tokens, quant.causal_chunk)
                attended = model.attention(acts.q, k_hat, v_hat, layer_frame, own=(acts.k, acts.v),
                                           exact_from=starts)
            else:
                own = (acts.k, acts.v) if quant.own == "exact" else None
                attended = model.attention(acts.q, k_hat, v_hat, layer_frame, own=own)
        x = model.finish_layer(index, x, attended)
    return model.final_hidden(x)


def quantized_forward(model: GGUFLlama, token_ids: np.ndarray, quant: CacheQuantization | None,
                      bits: list[dict[str, float]] | None = None) -> np.ndarray:
    """Final hidden states (T, d_model) of the whole pass over ``token_ids`` with ``quant``'s
    cache (None: the reference, equal to ``model.forward(token_ids).hidden``)."""
    frame = model.sequence_frame(token_ids)
    return run_layers(model, frame, model.embed(frame.ids), 0, quant, bits)


@dataclass
class Reference:
    """The reference pass of one text: what every quantized pass is compared with."""

    ids: np.ndarray  # (T,) token ids
    frame: SequenceFrame
    residuals: list[np.ndarray]  # residual stream entering each layer, (T, d_model) each
    logits: np.ndarray  # (T - 1, vocab) float32
    lse: np.ndarray  # (T - 1,) float64 log-partition
    top1: np.ndarray  # (T - 1,) argmax
    nll: np.ndarray  # (T - 1,) float64
    probs: np.ndarray | None = None  # (T - 1, vocab) float64 when held (PROBS_HELD_BYTES)

    def probabilities(self, start: int, stop: int) -> np.ndarray:
        """(stop - start, vocab) float64 next-token probabilities of positions ``start..stop-1``,
        each row summing to 1: ``exp(z - lse(z))`` renormalized; a slice of :attr:`probs` when
        held, else formed for the block (row by row the same operations, so the same values)."""
        if self.probs is not None:
            return self.probs[start:stop]
        return _probabilities(self.logits[start:stop], self.lse[start:stop])


def _probabilities(logits: np.ndarray, lse: np.ndarray) -> np.ndarray:
    probs = np.exp(logits.astype(np.float64) - lse[:, None])
    probs /= probs.sum(axis=-1, keepdims=True)
    return probs


def log_partition(logits: np.ndarray) -> np.ndarray:
    """``log sum_v exp z_v`` per row: float32 exponentials of ``z - max z``, summed in float64."""
    top = logits.max(axis=-1)
    total = np.exp(logits - top[:, None]).sum(axis=-1, dtype=np.float64)
    return top.astype(np.float64) + np.log(total)


def reference_pass(model: GGUFLlama, token_ids: np.ndarray) -> Reference:
    """The fp pass over ``token_ids`` with the residual stream entering every layer kept (a
    single-layer pass restarts from it) and the next-token logits of positions ``0..T-2``."""
    frame = model.sequence_frame(token_ids)
    if frame.ids.size < 2:
        raise KvasymError("an end-to-end pass needs at least 2 tokens (one next-token prediction)")
    residuals: list[np.ndarray] = []
    hidden = run_layers(model, frame, model.embed(frame.ids), 0, None, residuals=residuals)
    logits = model.logits(hidden[:-1])
    lse = log_partition(logits)
    targets = frame.ids[1:]
    nll = lse - logits[np.arange(targets.size), targets].astype(np.float64)
    held = logits.size * 8 <= PROBS_HELD_BYTES  # formed once per text when they fit
    return Reference(ids=frame.ids, frame=frame, residuals=residuals, logits=logits, lse=lse,
                     top1=np.argmax(logits, axis=-1), nll=nll, probs=_probabilities(logits, lse) if held else None)


def next_token_metrics(model: GGUFLlama, ref: Reference, hidden: np.ndarray) -> dict[str, np.ndarray]:
    """Per position ``i = 0..T-2``: ``nll`` (of token ``i + 1``), ``kl`` = KL(reference ||
    quantized) of the next-token distributions and ``top1`` (1 when the argmaxes agree), from
    the final hidden states of a quantized pass (formulas in the module docstring)."""
    n = ref.nll.size
    targets = ref.ids[1:]
    nll = np.empty(n)
    kl = np.empty(n)
    top1 = np.empty(n, dtype=np.int8)
    for start in range(0, n, METRIC_BLOCK_ROWS):
        stop = min(start + METRIC_BLOCK_ROWS, n)
        rows = np.arange(stop - start)
        z_hat = model.logits(hidden[start:stop])
        lse_hat = log_partition(z_hat)
        diff = np.subtract(ref.logits[start:stop], z_hat, dtype=np.float64)  # exact: float32 inputs
        kl[start:stop] = np.einsum("rv,rv->r", ref.probabilities(start, stop), diff) - ref.lse[start:stop] + lse_hat
        nll[start:stop] = lse_hat - z_hat[rows, targets[start:stop]].astype(np.float64)
        top1[start:stop] = np.argmax(z_hat, axis=-1) == ref.top1[start:stop]
    return {"nll": nll, "kl": kl, "top1": top1}


def _mean_bits(bits: list[dict[str, float]]) -> dict[str, float]:
    return {key: float(np.mean([b[key] for b in bits])) if bits else 0.0 for key in BITS_COLUMNS}


def evaluate_text(
    model: GGUFLlama,
    token_ids: np.ndarray,
    schemes: Sequence[Scheme],
    budgets: Sequence[int],
    *,
    text: str,
    base_seed: int,
    part: tuple[int, int] = (0, 1),
    workers: int = 1,
    **options: Any,
) -> dict[str, np.ndarray]:
    """Per-position next-token measures of every pass over one text.

    Passes: for every RoPE mode, draw ``0..draws-1``, scheme (of ``rope_schemes[rope]`` when
    given, else all; in draw 0 only unless it :func:`draws_random_maps`) and budget
    (``budgets`` plus the scheme's ``extra_budgets``), every layer quantized (``layer`` =
    :data:`ALL_LAYERS`); then, with ``sensitivity_budget``, every scheme of
    ``sensitivity_schemes`` (default all) with one layer at a time (``sensitivity_layers``,
    default every layer) quantized at that budget in draw 0 (``layer`` = its number; RoPE mode
    ``sensitivity_rope``), restarted from the reference's residual stream at that layer (the
    layers before it are the reference's). Returns equal-length columns ``text, draw, position,
    scheme, budget, rope, own, layer, nll, nll_ref, kl, top1`` and the pass's mean measured bits
    per coordinate (:data:`BITS_COLUMNS`, over the quantized layers and KV heads).

    Extra all-layer passes (none by default):

    - ``query_variants`` (names of :data:`kvasym.real.queryaware.VARIANTS`, with
      ``query_bases`` of the model's shape): in RoPE mode ``"post"`` only, every draw and
      budget of ``budgets`` plus the variant's ``extra_budgets``, one pass per variant, scheme
      column the variant's name;
    - ``window_query_bases`` (with ``query_variants``): every variant pass again with these
      bases (calibrated on long-text windows, :func:`kvasym.real.longcontext.window_bases`),
      scheme column ``f"{variant}{WINDOW_BASES_TAG}"`` (``QWF+W``), same seeds;
    - ``recent_windows[S] = [R, ...]``: scheme (or variant) ``S`` with a full-precision window of
      ``R`` tokens, scheme column ``f"{S}+R{R}"``, in every RoPE mode, draw and budget of ``S``;
    - ``causal_chunks[S] = [C, ...]`` (or one ``C``): ``S`` quantized in causal chunks of ``C``
      rows, scheme column ``f"{S}+C{C}"``, likewise;
    - ``global_only = [S, ...]`` (a model with sliding-window layers): scheme ``S`` with only the
      global layers' caches quantized, the sliding layers' in float16, in every RoPE mode, draw
      and budget of ``S``, scheme column ``f"{S}+G"`` (:data:`GLOBAL_TAG`; ``layer`` stays
      :data:`ALL_LAYERS`: the pass's scope is in its name); restarted from the reference's
      residual stream at the first global layer. Its bits columns are over the quantized (global)
      layers only; the whole cache's are :func:`kvasym.real.cache_memory.cache_memory`'s. These
      passes come after the other all-layer passes and before the one-layer ones.

    Each follows its base pass (module docstring for both kinds of read and their bits).

    ``options`` are :func:`plan_text_passes`'s keywords (``ropes``, ``own``, ``draws``,
    ``rope_schemes``, ``extra_budgets``, the ``sensitivity_*`` ones, ``norm_dtype``, the
    query-aware ``query_bases``, ``query_variants`` and ``window_query_bases``,
    ``recent_windows``, ``causal_chunks``, ``global_only``), an unknown one refused.

    The passes are planned first (:class:`PlannedPass`), then run after the reference pass
    (:func:`execute_passes`); ``part = (p, P)`` runs part ``p`` of ``P`` of the plan
    (:func:`select_part`, round robin), so that one text's passes can run as ``P`` jobs side by side,
    each with its own reference pass; :func:`join_parts` puts their rows back in the plan's order,
    row for row the frame of ``part = (0, 1)`` (each pass's seeds come from its identity, not from
    its place in the plan). ``workers`` processes run the passes after the one reference pass
    (:func:`execute_passes`), with the same rows whatever their number.
    """
    plan = plan_text_passes(model, schemes, budgets, text=text, base_seed=base_seed, **options)
    return execute_passes(model, token_ids, select_part(plan, part), text, workers=workers)


def plan_text_passes(
    model: GGUFLlama,
    schemes: Sequence[Scheme],
    budgets: Sequence[int],
    *,
    text: str,
    base_seed: int,
    ropes: Iterable[str] = ROPE_MODES,
    own: str = "exact",
    draws: int = 1,
    rope_schemes: Mapping[str, Sequence[str]] | None = None,
    extra_budgets: Mapping[str, Sequence[int]] | None = None,
    sensitivity_budget: int | None = None,
    sensitivity_layers: Sequence[int] | None = None,
    sensitivity_rope: str = "post",
    sensitivity_schemes: Sequence[str] | None = None,
    norm_dtype: str = "float32",
    query_bases: QueryBases | None = None,
    query_variants: Sequence[str] = (),
    window_query_bases: QueryBases | None = None,
    recent_windows: Mapping[str, Sequence[int]] | None = None,
    causal_chunks: Mapping[str, Sequence[int] | int] | None = None,
    global_only: Sequence[str] = (),
) -> list[PlannedPass]:
    """Every pass :func:`evaluate_text` runs over one text, in its order, the options checked first
    (its parameters, but ``token_ids`` and ``part``): the all-layer passes, then the global-only
    ones, then the one-layer ones. The plan depends on the model's shape only (its layers, KV heads,
    head width and sliding layers), not on the text's tokens.

    Raises
    ------
    KvasymError
        Naming the option and the value, for every inconsistency :func:`evaluate_text` refuses.
    """
    if not schemes or not budgets:
        raise KvasymError("evaluate_text needs at least one scheme and one budget")
    if isinstance(draws, bool) or not isinstance(draws, (int, np.integer)) or draws < 1:
        raise KvasymError(f"draws must be a positive integer, got {draws!r}")
    names = [scheme.name for scheme in schemes]
    ropes = list(ropes)
    query_variants = list(query_variants)
    _check_query_options(model, ropes, query_variants, query_bases, window_query_bases)
    bases_sets = [("", query_bases)]  # (scheme-column tag, bases) of the variants' passes
    if window_query_bases is not None:
        bases_sets.append((WINDOW_BASES_TAG, window_query_bases))
    reads = _read_settings(names + query_variants, recent_windows, causal_chunks)
    _check_named_schemes(names, query_variants, rope_schemes, sensitivity_schemes, extra_budgets)
    global_layers = _global_only_layers(model, names, list(global_only))

    def budgets_of(name: str) -> list[int]:
        """The all-layer budgets of scheme or variant ``name``: ``budgets``, then its extra ones."""
        return [*budgets, *(extra_budgets or {}).get(name, ())]

    def pass_of(scheme: Scheme, budget: int, rope: str, draw: int, **options: Any) -> PlannedPass:
        start = options.pop("start", 0)
        layer = options.pop("layer", ALL_LAYERS)
        return PlannedPass(CacheQuantization(scheme, int(budget), base_seed, text, rope=rope, own=own,
                                             norm_dtype=norm_dtype, draw=draw, **options), layer=layer, start=start)

    def drawn(rope: str) -> Iterable[tuple[int, Scheme]]:
        """(draw, scheme) of the all-layer passes of RoPE mode ``rope``, draws outermost."""
        chosen = names if rope_schemes is None else list(rope_schemes.get(rope, ()))
        for draw in range(int(draws)):
            yield from ((draw, scheme) for scheme in schemes
                        if scheme.name in chosen and (draw == 0 or draws_random_maps(scheme)))

    plan: list[PlannedPass] = []
    for rope in ropes:
        for draw in range(int(draws)):
            for scheme in (s for d, s in drawn(rope) if d == draw):
                plan.extend(pass_of(scheme, budget, rope, draw, recent_tokens=recent, causal_chunk=chunk)
                            for budget in budgets_of(scheme.name) for recent, chunk in reads[scheme.name])
            # the query-aware variants draw RKV's value rotations: every draw
            for variant in query_variants if rope == "post" else ():
                plan.extend(pass_of(variant_scheme(variant), budget, rope, draw, recent_tokens=recent,
                                    causal_chunk=chunk, query_variant=variant, query_bases=bases, bases_tag=tag)
                            for tag, bases in bases_sets for budget in budgets_of(variant)
                            for recent, chunk in reads[variant])
    for rope in ropes if global_layers else ():
        plan.extend(pass_of(scheme, budget, rope, draw, layers=frozenset(global_layers), scope_tag=GLOBAL_TAG,
                            start=global_layers[0])
                    for draw, scheme in drawn(rope) if scheme.name in global_only
                    for budget in budgets_of(scheme.name))
    if sensitivity_budget is not None:
        plan.extend(pass_of(scheme, sensitivity_budget, sensitivity_rope, 0, layers=frozenset({layer}),
                            layer=layer, start=layer)
                    for scheme in schemes if sensitivity_schemes is None or scheme.name in sensitivity_schemes
                    for layer in _sensitivity_layers(model, sensitivity_layers))
    return plan


def _check_query_options(model: GGUFLlama, ropes: list[str], query_variants: list[str],
                         query_bases: QueryBases | None, window_query_bases: QueryBases | None) -> None:
    """The query-aware variants' names, bases and RoPE mode (:func:`plan_text_passes`)."""
    bad_variants = sorted(set(query_variants) - set(VARIANTS))
    if bad_variants or len(set(query_variants)) != len(query_variants):
        raise KvasymError(f"query_variants must be distinct names of {VARIANTS}, got {query_variants}")
    if not query_variants:
        if window_query_bases is not None:
            raise KvasymError("window_query_bases given without query_variants")
        return
    expected = (len(model.layers), model.config.n_kv_heads, model.config.head_dim)
    if query_bases is None:
        raise KvasymError(f"query_variants {query_variants} need query_bases (kvasym.real.querybases.calibrate)")
    if tuple(query_bases.shape) != expected:
        raise KvasymError(f"query_bases have shape (layers, kv_heads, head_dim) = {tuple(query_bases.shape)}, "
                          f"the model's is {expected}")
    if "post" not in ropes:
        raise KvasymError(f"query_variants {query_variants} run with rope 'post' only (their bases are of "
                          f"post-RoPE queries), and ropes is {ropes}")
    if window_query_bases is not None and tuple(window_query_bases.shape) != expected:
        raise KvasymError(f"window_query_bases have shape (layers, kv_heads, head_dim) = "
                          f"{tuple(window_query_bases.shape)}, the model's is {expected}")


def _read_settings(names: list[str], recent_windows: Mapping[str, Sequence[int]] | None,
                   causal_chunks: Mapping[str, Sequence[int] | int] | None) -> dict[str, list[tuple[int, int]]]:
    """``(recent_tokens, causal_chunk)`` of the passes of each scheme or variant: plain first, then
    its recent windows, then its causal chunks (each list checked: distinct sizes >= 1)."""
    windows = {key: [int(r) for r in value] for key, value in (recent_windows or {}).items()}
    chunks = {key: [int(value)] if isinstance(value, (int, np.integer)) else [int(c) for c in value]
              for key, value in (causal_chunks or {}).items()}
    for what, settings in (("recent_windows", windows), ("causal_chunks", chunks)):
        unknown = sorted(set(settings) - set(names))
        if unknown:
            raise KvasymError(f"{what} names schemes {unknown} that are not among the passes' schemes {names}")
        for key, sizes in settings.items():
            if not sizes or min(sizes) < 1 or len(set(sizes)) != len(sizes):
                raise KvasymError(f"{what}[{key!r}] must be distinct integers >= 1, got {sizes}")
    return {name: [(0, 0), *((r, 0) for r in windows.get(name, ())), *((0, c) for c in chunks.get(name, ()))]
            for name in names}


def _check_named_schemes(names: list[str], query_variants: list[str],
                         rope_schemes: Mapping[str, Sequence[str]] | None,
                         sensitivity_schemes: Sequence[str] | None,
                         extra_budgets: Mapping[str, Sequence[int]] | None) -> None:
    """Every scheme the per-RoPE lists, the one-layer list and the extra budgets name is a pass's."""
    named = {"rope_schemes": [n for v in (rope_schemes or {}).values() for n in v],
             "sensitivity_schemes": list(sensitivity_schemes or [])}
    for what, chosen in named.items():
        unknown = sorted(set(chosen) - set(names))
        if unknown:
            raise KvasymError(f"{what} names schemes {unknown} that are not among the passes' schemes {names}")
    unknown = sorted(set(extra_budgets or {}) - set(names) - set(query_variants))
    if unknown:
        raise KvasymError(f"extra_budgets names schemes {unknown} that are not among the passes' schemes "
                          f"{names + query_variants}")


def _global_only_layers(model: GGUFLlama, names: list[str], global_only: list[str]) -> tuple[int, ...]:
    """The model's global (not sliding-window) layers when ``global_only`` names schemes, else ()."""
    unknown = sorted(set(global_only) - set(names))
    if unknown or len(set(global_only)) != len(global_only):
        raise KvasymError(f"global_only must name distinct schemes among the passes' schemes {names}, got "
                          f"{global_only}")
    if not global_only:
        return ()
    global_layers = tuple(i for i in range(len(model.layers)) if not model.config.is_sliding(i))
    if len(global_layers) == len(model.layers):
        raise KvasymError(f"global_only {global_only}: the model has no sliding-window layer (every layer is "
                          "global), so the scope would be every layer")
    if not global_layers:
        raise KvasymError(f"global_only {global_only}: every layer of the model is a sliding-window layer, so "
                          "the scope would be no layer")
    return global_layers


def _sensitivity_layers(model: GGUFLlama, layers: Sequence[int] | None) -> list[int]:
    """The one-layer passes' layers: ``layers`` checked against the model, or every layer."""
    chosen = [int(layer) for layer in (range(len(model.layers)) if layers is None else layers)]
    for layer in chosen:
        if not 0 <= layer < len(model.layers):
            raise KvasymError(f"sensitivity layer {layer} out of range 0..{len(model.layers) - 1}")
    return chosen


def select_part(plan: Sequence[PlannedPass], part: tuple[int, int]) -> list[PlannedPass]:
    """Part ``p`` of ``P`` of a text's planned passes: passes ``p, p + P, p + 2P, ...`` (round
    robin, so that the parts' costs are about equal); :func:`join_parts` puts the parts' rows back
    in the plan's order.

    Parameters
    ----------
    plan : sequence of PlannedPass
        Every pass of the text, in order.
    part : tuple of int
        ``(p, P)`` with ``0 <= p < P <= len(plan)``.

    Returns
    -------
    list of PlannedPass
    """
    p, total = (int(v) for v in part)
    if not 0 <= p < total:
        raise KvasymError(f"part must be (p, P) with 0 <= p < P, got {tuple(part)}")
    if total > len(plan):
        raise KvasymError(f"part ({p}, {total}): the text has {len(plan)} passes, fewer than the {total} parts; "
                          "give fewer parts (real.e2e.parts)")
    return list(plan[p::total])


def join_parts(frames: Sequence[Any], n_positions: int) -> Any:
    """The per-position frame of a whole text from its ``P`` parts' frames (:func:`select_part`):
    pass ``i`` is the ``i // P``-th block of ``n_positions`` rows of part ``i % P``.

    Parameters
    ----------
    frames : sequence of pandas.DataFrame
        Part ``0..P-1``'s frames, in order.
    n_positions : int
        Rows per pass (the text's scored positions).

    Returns
    -------
    pandas.DataFrame
        Row for row the frame of one job running every pass (index reset).
    """
    import pandas as pd

    total = len(frames)
    blocks = []
    counts = [len(frame) // n_positions for frame in frames]
    if any(len(frame) != c * n_positions for frame, c in zip(frames, counts)) or \
            any(counts[i] < counts[i + 1] or counts[0] - counts[i] > 1 for i in range(total - 1)):
        raise KvasymError(f"the parts' row counts {[len(f) for f in frames]} are not round-robin parts of passes "
                          f"of {n_positions} positions")
    for i in range(sum(counts)):
        frame = frames[i % total]
        start = (i // total) * n_positions
        blocks.append(frame.iloc[start:start + n_positions])
    return pd.concat(blocks, ignore_index=True)


@dataclass(frozen=True)
class PlannedPass:
    """One quantized pass of a text: its cache quantization, the ``layer`` column it is filed
    under (:data:`ALL_LAYERS` or the one quantized layer) and the layer it restarts from (the
    reference's residual stream before it)."""

    quant: CacheQuantization
    layer: int = ALL_LAYERS
    start: int = 0


def execute_passes(model: GGUFLlama, token_ids: np.ndarray, passes: Sequence[PlannedPass],
                   text: str, workers: int = 1) -> dict[str, np.ndarray]:
    """The reference pass of ``token_ids``, then each planned pass from its restart layer: the
    columns :func:`evaluate_text` returns, one block of positions per pass, in ``passes``' order.

    The planned passes run on ``workers`` processes forked after the reference pass
    (:func:`kvasym.workers.map_ordered`: each reads the reference, none the others' results),
    so the columns are the same, bit for bit, whatever ``workers`` is."""
    from ..workers import map_ordered

    ref = reference_pass(model, token_ids)
    n = ref.nll.size

    def run_pass(planned: PlannedPass) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        quant = planned.quant
        bits: list[dict[str, float]] = []
        hidden = run_layers(model, ref.frame, ref.residuals[planned.start], planned.start, quant, bits)
        fixed: dict[str, Any] = {"text": text, "draw": int(quant.draw), "scheme": quant.name,
                                 "budget": int(quant.budget), "rope": quant.rope, "own": quant.own,
                                 "layer": planned.layer, **_mean_bits(bits)}
        return fixed, next_token_metrics(model, ref, hidden)

    columns: dict[str, list[np.ndarray]] = {}
    for fixed, measured in map_ordered(run_pass, list(passes), workers):
        for key, value in fixed.items():
            columns.setdefault(key, []).append(np.full(n, value, dtype=object if isinstance(value, str) else None))
        columns.setdefault("position", []).append(np.arange(n, dtype=np.int32))
        columns.setdefault("nll_ref", []).append(ref.nll)
        for key, value in measured.items():
            columns.setdefault(key, []).append(value)
    out = {key: np.concatenate(parts) for key, parts in columns.items()}
    for key in ("layer", "budget", "draw"):
        out[key] = out[key].astype(np.int32)
    out["top1"] = out["top1"].astype(np.int8)
    return out
