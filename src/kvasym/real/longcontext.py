"""End-to-end damage of a quantized KV cache on long windows of the offline long text.

A thin loop over :func:`kvasym.real.endtoend.evaluate_text`: for each window length ``L`` the
first ``count_per_length`` disjoint windows of the long text's token stream
(:func:`kvasym.real.longtext.windows`) are evaluated with every scheme and budget (every layer
quantized, one RoPE mode, no single-layer sensitivity passes). Window ``i`` of length ``L``
has the text identity ``f"pydoc/{L}/{i}"``, so each window draws its own rotations and
sketches (seeds ``(base seed, text, layer, KV head, side)``): windows are independent units for
a statistic over them, not one draw seen through several texts.

Query bases at long context (:func:`window_bases`): the query-aware variants' bases
(:mod:`kvasym.real.querybases`) are calibrated on the shipped 512-token texts, so they describe
post-RoPE queries of positions below 512 only; at 4K tokens the top calibration directions hold
far less of the late queries' energy (``benchmarks/bench_queryaware_positions.py``). With
``calibration_windows = N`` the variants also run with bases calibrated on the last ``N``
windows of the same length of the long text (disjoint from the evaluated windows, which are the
first ones), scheme column ``f"{variant}+W"`` (:data:`~kvasym.real.endtoend.WINDOW_BASES_TAG`),
on the same seeds as the variant's own passes, so the two are paired by window.

A model whose tokenizer begins every sequence with BOS (Gemma 3: BOS required) reads each window
as a fresh sequence: the window's first token is replaced by BOS (:func:`sequence_windows`),
so window ``i`` reads BOS and stream tokens ``i L + 1 .. (i + 1) L - 1``. A model without BOS
(SmolLM2) reads the stream's tokens as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import KvasymError
from ..schemes import Scheme
from .endtoend import evaluate_text
from .jobparts import select_round_robin
from .longtext import n_windows, windows

__all__ = ["bos_id", "calibration_window_indices", "evaluate_windows", "sequence_windows", "window_bases",
           "window_text"]


def bos_id(model: Any) -> int | None:
    """The BOS id the model's tokenizer starts every sequence with, or None when it adds none
    (GGUF key ``tokenizer.ggml.add_bos_token``; :class:`kvasym.real.gguf_tokenizer` policy)."""
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None or not getattr(tokenizer, "add_bos", False):
        return None
    return int(tokenizer.bos_token_id)


def sequence_windows(model: Any, tokens: np.ndarray) -> np.ndarray:
    """``tokens`` (count, L) as the sequences the model reads: with a BOS model, each window's
    first token replaced by BOS (a window is a fresh sequence, and Gemma 3 needs BOS at its
    start); without one, ``tokens`` itself."""
    bos = bos_id(model)
    if bos is None:
        return tokens
    out = np.array(tokens, dtype=np.int64, copy=True)
    out[:, 0] = bos
    return out


def window_text(length: int, index: int) -> str:
    """The text identity of window ``index`` of length ``length``: ``f"pydoc/{length}/{index}"``."""
    return f"pydoc/{int(length)}/{int(index)}"


def calibration_window_indices(n_tokens: int, length: int, evaluated: int, count: int) -> list[int]:
    """The windows of length ``length`` the window bases are calibrated on: the last ``count`` of
    the stream's ``n_tokens // length``, refused when they would meet the ``evaluated`` first
    ones (the evaluation windows).

    Raises
    ------
    KvasymError
        If ``count < 1`` or the stream holds fewer than ``evaluated + count`` windows.
    """
    available = n_windows(int(n_tokens), int(length))
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
        raise KvasymError(f"calibration windows must be an integer >= 1, got {count!r}")
    if evaluated + count > available:
        raise KvasymError(f"calibration_windows: {count} calibration and {evaluated} evaluation windows of "
                          f"{length} tokens do not fit disjointly in the long text's {available} windows")
    return list(range(available - count, available))


def window_bases(model: Any, ids: np.ndarray, length: int, evaluated: int, count: int,
                 context_length: int | None = None) -> Any:
    """The query bases calibrated on long-text windows (:func:`kvasym.real.querybases.calibrate`).

    Parameters
    ----------
    model : GGUFLlama
        The model.
    ids : numpy.ndarray
        The long text's token stream.
    length : int
        Window length in tokens: the bases see queries at every position ``0..length-1``.
    evaluated : int
        How many windows are evaluated (windows ``0..evaluated-1``); the calibration windows
        must not meet them (:func:`calibration_window_indices` refuses a split where they would).
    count : int
        Calibration windows: the stream's last ``count`` (:func:`calibration_window_indices`).
    context_length : int, optional
        The longest window allowed (default ``model.config.context_length``).

    Returns
    -------
    QueryBases
        With ``calibration_texts`` the windows' :func:`window_text` names.
    """
    from .querybases import calibrate

    limit = int(model.config.context_length) if context_length is None else int(context_length)
    indices = calibration_window_indices(len(ids), length, int(evaluated), count)
    tokens = sequence_windows(model, windows(ids, length, limit, len(indices), first=indices[0])[0])
    return calibrate(model, {window_text(length, i): row for i, row in zip(indices, tokens)})


def evaluate_windows(model: Any, ids: np.ndarray, lengths: Sequence[int], count_per_length: int,
                     schemes: Sequence[Scheme], budgets: Sequence[int], *, base_seed: int, rope: str = "post",
                     own: str = "exact", norm_dtype: str = "float32",
                     context_length: int | None = None, calibration_windows: int = 0,
                     part: Sequence[int] = (0, 1), workers: int = 1,
                     **pass_options: Any) -> dict[str, np.ndarray]:
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
    calibration_windows : int
        With query-aware variants (``pass_options["query_variants"]``): ``N >= 1`` also runs
        every variant with bases calibrated on the last ``N`` windows of each length
        (:func:`window_bases`; scheme column ``f"{variant}+W"``); 0 (default): not.
    part : pair of int
        ``(p, P)``: run windows ``p, p + P, ...`` of the (length, window) order only
        (:func:`kvasym.real.jobparts.select_round_robin`; a length none of whose windows the
        part runs computes no calibration bases). A window's rows depend on its identity only
        (its tokens, its seeds, the length's bases), so the parts' columns joined
        (:func:`kvasym.real.jobparts.join_by_units` on ``context, window``) are the whole
        job's row for row. Default ``(0, 1)``: every window.
    workers : int
        Processes each window's quantized passes run on, after its reference pass
        (:func:`kvasym.real.endtoend.execute_passes`); the columns do not depend on it.
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
    cut = [(int(length), sequence_windows(model, windows(ids, length, limit, int(count_per_length))[0]))
           for length in lengths]
    calibrating = bool(calibration_windows) and bool(pass_options.get("query_variants"))
    if calibrating:  # refused before any pass too
        for length in lengths:
            calibration_window_indices(len(ids), int(length), int(count_per_length), calibration_windows)
    units = select_round_robin([(length, index, window_ids) for length, tokens in cut
                                for index, window_ids in enumerate(tokens)], part, "long-context windows")
    parts: list[dict[str, np.ndarray]] = []
    for length in [length for length, _ in cut]:
        mine = [(index, window_ids) for at, index, window_ids in units if at == length]
        if not mine:
            continue
        options = dict(pass_options)
        if calibrating:
            options["window_query_bases"] = window_bases(model, ids, length, int(count_per_length),
                                                         calibration_windows, limit)
        for index, window_ids in mine:
            columns = evaluate_text(model, window_ids, schemes, budgets, text=window_text(length, index),
                                    base_seed=base_seed, ropes=(rope,), own=own, norm_dtype=norm_dtype,
                                    workers=workers, **options)
            n = len(columns["position"])
            columns["context"] = np.full(n, length, dtype=np.int32)
            columns["window"] = np.full(n, index, dtype=np.int32)
            parts.append(columns)
    return {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}
