"""End-to-end damage of a quantized KV cache on long windows of the offline long text.

A thin loop over :func:`kvasym.real.endtoend.evaluate_text`: for each window length ``L`` the
first ``count_per_length`` disjoint windows of the long text's token stream
(:func:`kvasym.real.longtext.windows`) are evaluated with every scheme and budget (every layer
quantized, one RoPE mode, no single-layer sensitivity passes). Window ``i`` of length ``L``
has the text identity ``f"pydoc/{L}/{i}"``, so each window draws its own rotations and
sketches (seeds ``(base seed, text, layer, KV head, side)``): windows are independent units for
a statistic over them, not one draw seen through several texts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import KvasymError
from ..schemes import Scheme
from .endtoend import evaluate_text
from .longtext import windows

__all__ = ["evaluate_windows", "window_text"]


def window_text(length: int, index: int) -> str:
    """The text identity of window ``index`` of length ``length``: ``f"pydoc/{length}/{index}"``."""
    return f"pydoc/{int(length)}/{int(index)}"


def evaluate_windows(model: Any, ids: np.ndarray, lengths: Sequence[int], count_per_length: int,
                     schemes: Sequence[Scheme], budgets: Sequence[int], *, base_seed: int, rope: str = "post",
                     own: str = "exact", norm_dtype: str = "float32",
                     context_length: int | None = None, **pass_options: Any) -> dict[str, np.ndarray]:
    """Per-position next-token measures of every scheme and budget on long-text windows.

    Parameters
    ----------
    model : GGUFLlama
        The model.
    ids : numpy.ndarray
        (n_tokens,) the long text's token stream (:func:`kvasym.real.longtext.long_text_ids`).
    lengths : sequence of int
        Window lengths in tokens, each at most ``context_length``.
    count_per_length : int
        Windows per length: windows ``0..count_per_length - 1`` (tokens ``[i L, (i + 1) L)``).
    schemes : sequence of Scheme
        The schemes.
    budgets : sequence of int
        Bits per coordinate.
    base_seed : int
        The study's base seed.
    rope : {"post", "pre"}
        Keys quantized after or before RoPE.
    own : {"exact", "quantized"}
        Whether a position reads its own key and value exactly.
    norm_dtype : str
        Storage dtype of the norms.
    context_length : int, optional
        The longest window allowed (default ``model.config.context_length``, GGUF key
        ``llama.context_length``).
    **pass_options
        Further keywords of :func:`~kvasym.real.endtoend.evaluate_text` (e.g. the query-aware
        variants and their bases), passed to every window's passes.

    Returns
    -------
    dict of str to numpy.ndarray
        :func:`~kvasym.real.endtoend.evaluate_text`'s columns of every window concatenated
        (``text`` is :func:`window_text`), plus ``context`` (int32, the window's length) and
        ``window`` (int32, its index).

    Raises
    ------
    KvasymError
        If ``lengths`` is empty, ``count_per_length < 1``, a length exceeds the context or the
        text holds fewer windows than asked.
    """
    lengths = list(lengths)
    if not lengths:
        raise KvasymError("evaluate_windows: lengths is empty")
    if isinstance(count_per_length, bool) or not isinstance(count_per_length, (int, np.integer)) \
            or count_per_length < 1:
        raise KvasymError(f"evaluate_windows: count_per_length must be an integer >= 1, got {count_per_length!r}")
    limit = int(model.config.context_length) if context_length is None else int(context_length)
    # every window cut before the first pass, so a bad length is refused before any cost
    cut = [(int(length), windows(ids, length, limit, int(count_per_length))[0]) for length in lengths]
    parts: list[dict[str, np.ndarray]] = []
    for length, tokens in cut:
        for index, window_ids in enumerate(tokens):
            columns = evaluate_text(model, window_ids, schemes, budgets, text=window_text(length, index),
                                    base_seed=base_seed, ropes=(rope,), own=own, norm_dtype=norm_dtype,
                                    **pass_options)
            n = len(columns["position"])
            columns["context"] = np.full(n, length, dtype=np.int32)
            columns["window"] = np.full(n, index, dtype=np.int32)
            parts.append(columns)
    return {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}
