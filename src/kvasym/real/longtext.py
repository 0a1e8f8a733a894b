"""A long real text available offline, cut into disjoint windows of the model's tokens.

The text
    The Python interpreter's own reference documentation, ``pydoc_data.topics.topics``: the
    help topics ``help("assert")`` and friends print (79 topics, ~65,500 words, ~465,000
    characters under CPython 3.11). It ships with every CPython installation, so nothing is
    downloaded, and it is covered by the Python Software Foundation License (PSF License
    Agreement, version 2), which permits copying, use and derived works with the copyright
    notice retained; this module stores none of the text, it reads it from the running
    interpreter. The topics are concatenated in sorted key order, each topic's text as stored,
    joined by :data:`TOPIC_SEPARATOR` (one blank line), and the whole string is tokenized once by
    the model's tokenizer (no BOS; :meth:`~kvasym.real.gguf_model.GGUFLlama.encode`): under CPython
    3.11.7 and SmolLM2-135M's tokenizer that is 112,955 tokens.

    The text is the *running interpreter's*: another CPython minor version ships other topics,
    so :func:`long_text_source` returns the interpreter version and the SHA-256 of the
    concatenated text, for a stage to record beside what it measures.

Windows
    A window of length ``L`` is a slice of that one token stream (not a re-tokenization of a
    piece of text): window ``i`` holds tokens ``[i L, (i + 1) L)``. Windows of one length tile
    the stream from token 0 and never overlap; there are ``floor(n_tokens / L)`` of them
    (:func:`n_windows`; 110, 55, 27 and 13 for L = 1024, 2048, 4096 and 8192 tokens of the text
    above). A window longer than the model's trained context (the GGUF key
    ``llama.context_length``, 8192 for SmolLM2-135M) is refused. Windows of *different* lengths
    overlap (window 0 of 1024 is inside window 0 of 2048), so a calibration set and an evaluation
    set are compared as token spans: :func:`disjoint_from` says which candidate windows share no
    token with a given set.

References
----------
.. [1] Python Software Foundation, "PSF License Agreement for Python", version 2,
   https://docs.python.org/3/license.html (the licence of ``pydoc_data``).
.. [2] Allal, L. B. et al. (2025) "SmolLM2: When Smol Goes Big -- Data-Centric Training of a
   Small Language Model", arXiv:2502.02737 (the model, trained with an 8192-token context).
"""

from __future__ import annotations

import hashlib
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import KvasymError

__all__ = [
    "CONTEXT_LENGTH_KEY",
    "TOPIC_SEPARATOR",
    "WINDOW_LENGTHS",
    "LongTextSource",
    "Span",
    "check_window_length",
    "disjoint_from",
    "long_text",
    "long_text_ids",
    "long_text_source",
    "n_windows",
    "window",
    "window_span",
    "windows",
]

#: What joins two consecutive topics: one blank line.
TOPIC_SEPARATOR = "\n\n"
#: The window lengths of the long-context measures, tokens.
WINDOW_LENGTHS = (1024, 2048, 4096, 8192)
#: The GGUF metadata key holding the model's trained context (read into ``LlamaConfig.context_length``).
CONTEXT_LENGTH_KEY = "llama.context_length"

#: A half-open token span ``(start, stop)`` of the long text's token stream.
Span = tuple[int, int]


def _topics() -> Mapping[str, str]:
    from pydoc_data import topics

    return topics.topics


def long_text(topics: Mapping[str, str] | None = None) -> str:
    """The long text: every topic's text in sorted key order, joined by :data:`TOPIC_SEPARATOR`.

    Parameters
    ----------
    topics : mapping of str to str, optional
        Topic name to text (default: the running interpreter's ``pydoc_data.topics.topics``,
        PSF License, see the module docstring).

    Returns
    -------
    str
        ``TOPIC_SEPARATOR.join(topics[k] for k in sorted(topics))``.

    Raises
    ------
    KvasymError
        If there are no topics.
    """
    topics = _topics() if topics is None else topics
    if not topics:
        raise KvasymError("long text: no pydoc_data topics to concatenate")
    return TOPIC_SEPARATOR.join(topics[key] for key in sorted(topics))


@dataclass(frozen=True)
class LongTextSource:
    """Where the long text came from, for a stage to record beside its numbers.

    Attributes
    ----------
    python_version : str
        The interpreter whose ``pydoc_data`` was read (``platform.python_version()``).
    n_topics : int
        Topics concatenated.
    n_words : int
        Whitespace-separated words of the concatenated text.
    sha256 : str
        Hex SHA-256 of the concatenated text's UTF-8 bytes.
    licence : str
        The text's licence.
    """

    python_version: str
    n_topics: int
    n_words: int
    sha256: str
    licence: str = "PSF License Agreement (Python Software Foundation), version 2"


def long_text_source(topics: Mapping[str, str] | None = None) -> LongTextSource:
    """The :class:`LongTextSource` of :func:`long_text` ``(topics)``.

    Parameters
    ----------
    topics : mapping of str to str, optional
        As for :func:`long_text`.

    Returns
    -------
    LongTextSource
        The interpreter version, topic and word counts and the text's SHA-256.
    """
    topics = _topics() if topics is None else topics
    text = long_text(topics)
    return LongTextSource(python_version=platform.python_version(), n_topics=len(topics),
                          n_words=len(text.split()), sha256=hashlib.sha256(text.encode("utf-8")).hexdigest())


def long_text_ids(model: Any, topics: Mapping[str, str] | None = None) -> np.ndarray:
    """The long text's token ids under ``model``'s tokenizer (with its BOS first when the
    tokenizer adds one; :func:`kvasym.real.longcontext.sequence_windows` starts every window with
    it).

    Parameters
    ----------
    model : GGUFLlama
        Anything with ``encode(text) -> ndarray`` (:meth:`kvasym.real.gguf_model.GGUFLlama.encode`).
    topics : mapping of str to str, optional
        As for :func:`long_text`.

    Returns
    -------
    numpy.ndarray
        (n_tokens,) int64: the one token stream every window is a slice of.
    """
    return np.asarray(model.encode(long_text(topics)), dtype=np.int64)


def check_window_length(length: int, context_length: int) -> int:
    """``length`` as an int, if it is a positive window length within the model's context.

    Parameters
    ----------
    length : int
        Tokens per window.
    context_length : int
        The model's trained context (GGUF key :data:`CONTEXT_LENGTH_KEY`,
        ``model.config.context_length``).

    Returns
    -------
    int
        ``length``.

    Raises
    ------
    KvasymError
        If ``length`` is not a positive integer or exceeds ``context_length``.
    """
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
        raise KvasymError(f"window length must be a positive integer, got {length!r}")
    if length > context_length:
        raise KvasymError(f"window length {length} exceeds the model's trained context {context_length} "
                          f"(GGUF key {CONTEXT_LENGTH_KEY})")
    return int(length)


def n_windows(n_tokens: int, length: int) -> int:
    """How many disjoint windows of ``length`` tokens a stream of ``n_tokens`` holds: ``n_tokens // length``.

    Parameters
    ----------
    n_tokens : int
        Tokens in the stream.
    length : int
        Tokens per window (positive).

    Returns
    -------
    int
        ``floor(n_tokens / length)``.
    """
    if length < 1:
        raise KvasymError(f"window length must be a positive integer, got {length!r}")
    return int(n_tokens) // int(length)


def window_span(length: int, index: int) -> Span:
    """The token span of window ``index`` of length ``length``: ``(index L, (index + 1) L)``.

    Parameters
    ----------
    length : int
        Tokens per window.
    index : int
        The window's number (0-based).

    Returns
    -------
    tuple of int
        Half-open ``(start, stop)``.
    """
    if index < 0:
        raise KvasymError(f"window index must be >= 0, got {index!r}")
    return int(index) * int(length), (int(index) + 1) * int(length)


def window(ids: np.ndarray, length: int, index: int, context_length: int) -> np.ndarray:
    """Tokens of window ``index`` of length ``length`` of the stream ``ids``.

    Parameters
    ----------
    ids : numpy.ndarray
        (n_tokens,) the token stream (:func:`long_text_ids`).
    length : int
        Tokens per window (at most ``context_length``).
    index : int
        The window's number, ``0 <= index < n_windows(len(ids), length)``.
    context_length : int
        The model's trained context (GGUF key :data:`CONTEXT_LENGTH_KEY`).

    Returns
    -------
    numpy.ndarray
        (length,) int64, a copy of ``ids[index L : (index + 1) L]``.

    Raises
    ------
    KvasymError
        If the length exceeds the context or the window does not lie within the stream.
    """
    length = check_window_length(length, context_length)
    available = n_windows(len(ids), length)
    if not 0 <= index < available:
        raise KvasymError(f"window {index} of length {length}: the long text ({len(ids)} tokens) holds "
                          f"windows 0..{available - 1}")
    start, stop = window_span(length, index)
    return np.array(ids[start:stop], dtype=np.int64)


def windows(ids: np.ndarray, length: int, context_length: int, count: int | None = None,
            first: int = 0) -> tuple[np.ndarray, list[Span]]:
    """``count`` consecutive disjoint windows of ``length`` tokens, from window ``first``.

    Parameters
    ----------
    ids : numpy.ndarray
        (n_tokens,) the token stream.
    length : int
        Tokens per window (at most ``context_length``).
    context_length : int
        The model's trained context (GGUF key :data:`CONTEXT_LENGTH_KEY`).
    count : int, optional
        Windows wanted (default: every window from ``first`` on).
    first : int
        The first window's number.

    Returns
    -------
    tokens : numpy.ndarray
        (count, length) int64.
    spans : list of tuple of int
        Each window's half-open token span.

    Raises
    ------
    KvasymError
        If the length exceeds the context or the stream holds fewer windows than asked.
    """
    length = check_window_length(length, context_length)
    available = n_windows(len(ids), length)
    count = available - first if count is None else int(count)
    if first < 0 or count < 0 or first + count > available:
        raise KvasymError(f"windows {first}..{first + count - 1} of length {length}: the long text "
                          f"({len(ids)} tokens) holds windows 0..{available - 1}")
    spans = [window_span(length, i) for i in range(first, first + count)]
    tokens = np.array(ids[first * length:(first + count) * length], dtype=np.int64).reshape(count, length)
    return tokens, spans


def disjoint_from(candidates: Sequence[Span], taken: Sequence[Span]) -> np.ndarray:
    """Which candidate spans share no token with any span of ``taken``.

    Parameters
    ----------
    candidates : sequence of (int, int)
        Half-open token spans ``(start, stop)``, e.g. evaluation windows.
    taken : sequence of (int, int)
        Half-open token spans, e.g. the calibration windows.

    Returns
    -------
    numpy.ndarray
        (len(candidates),) bool: True where ``[start, stop)`` meets no ``taken`` span, i.e. for
        every taken ``(a, b)``: ``stop <= a or b <= start``. (Empty spans meet nothing.)
    """
    cand = np.asarray(candidates, dtype=np.int64).reshape(-1, 2)
    used = np.asarray(taken, dtype=np.int64).reshape(-1, 2)
    if (cand[:, 1] < cand[:, 0]).any() or (used[:, 1] < used[:, 0]).any():
        raise KvasymError("a span (start, stop) has stop < start")
    if not used.size:
        return np.ones(len(cand), dtype=bool)
    overlap = (cand[:, None, 0] < used[None, :, 1]) & (used[None, :, 0] < cand[:, None, 1])
    overlap &= (cand[:, None, 1] > cand[:, None, 0]) & (used[None, :, 1] > used[None, :, 0])
    return ~overlap.any(axis=1)
