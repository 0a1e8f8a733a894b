"""Passkey retrieval: a random number hidden at a given depth in filler text, asked for at the end.

The task (Mohtashami & Jaggi 2023 [1]_, as used by LongLoRA [2]_ and others)
    A prompt of exactly ``length - 5`` tokens (so that prompt and answer fill ``length``
    tokens, the context the model must hold) made of, in order:

    1. the instruction :data:`INTRO`;
    2. filler: the five sentences of :data:`FILLER_SENTENCES` repeated, each tokenized on its
       own with its leading space, cut to the exact number of tokens that makes up the length
       (only the last filler sentence may be cut, at the end of the filler);
    3. the key sentence ``" The pass key is NNNNN. Remember it. NNNNN is the pass key."``
       inserted into the filler at the sentence boundary nearest to ``depth * F`` tokens into
       the filler (``F`` filler tokens in all, ``0 <= depth <= 1``; depth 0 is just after the
       instruction, depth 1 just before the question); so its first token sits at
       ``len(INTRO) + b`` with ``|b - depth F|`` at most half a filler sentence (<= 3 tokens);
    4. the question :data:`QUESTION` ``" What is the pass key? The pass key is "`` (its last
       token is the space that the tokenizer splits before a number).

    The answer is the number's five digits, one token each (SmolLM2's tokenizer splits digits
    individually). ``NNNNN`` is drawn uniformly from 10000..99999 by
    :func:`kvasym.seeds.rng` with identity ``("passkey", length, depth, trial)`` (depth as
    ``repr(float(depth))``): the trial's identity, never the order trials run in.

Scoring (one teacher-forced pass per trial)
    The model reads the prompt followed by the answer's first four digits (``length - 1``
    tokens); the logits at the prompt's last position and the four after it are the
    next-token distributions of the five answer positions. The trial is *correct* when every
    answer token is the argmax of its position's logits (``numpy.argmax``: the lowest token id
    wins a tie). This equals greedy decoding of the answer: if the first ``j`` greedy tokens
    are the answer's, greedy step ``j + 1`` sees exactly the teacher-forced prefix, so it
    produces answer token ``j + 1`` iff that token is the argmax there; by induction the greedy
    continuation starts with the whole answer iff every teacher-forced position's argmax is
    its answer token. (With no exact match, greedy decoding diverges at the first wrong
    position, which :func:`score_answer` reports as ``n_correct_prefix``.)

References
----------
.. [1] Mohtashami, A., Jaggi, M. (2023) "Landmark Attention: Random-Access Infinite Context
   Length for Transformers", arXiv:2305.16300 (the passkey retrieval task, its filler and
   key sentences).
.. [2] Chen, Y. et al. (2024) "LongLoRA: Efficient Fine-tuning of Long-Context Large Language
   Models", ICLR 2024, arXiv:2309.12307 (passkey retrieval at several depths and lengths).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import KvasymError
from ..seeds import rng

__all__ = [
    "ANSWER_DIGITS",
    "DEPTHS",
    "FILLER_SENTENCES",
    "INTRO",
    "QUESTION",
    "PasskeyScore",
    "PasskeyTrial",
    "answer_logits",
    "make_trial",
    "passkey_number",
    "run_trial",
    "score_answer",
]

#: The instruction that opens every prompt (Mohtashami & Jaggi's wording).
INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
         "I will quiz you about the important information there.")
#: The filler sentences, repeated in this order (Mohtashami & Jaggi's filler).
FILLER_SENTENCES = (" The grass is green.", " The sky is blue.", " The sun is yellow.", " Here we go.",
                    " There and back again.")
#: The key sentence; ``{key}`` is the number.
KEY_SENTENCE = " The pass key is {key}. Remember it. {key} is the pass key."
#: The question that closes every prompt (its final space is the token before the digits).
QUESTION = " What is the pass key? The pass key is "
#: Digits in a pass key (one token each).
ANSWER_DIGITS = 5
#: The default relative depths of the key in the filler.
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


def passkey_number(base_seed: int, length: int, depth: float, trial: int) -> int:
    """The five-digit pass key of one trial, from the trial's identity.

    Parameters
    ----------
    base_seed : int
        The study's base seed.
    length : int
        The trial's length in tokens (prompt and answer).
    depth : float
        The key's relative depth in the filler.
    trial : int
        The trial's number at this (length, depth).

    Returns
    -------
    int
        Uniform on 10000..99999: ``rng(base_seed, "passkey", length, repr(float(depth)), trial)
        .integers(10000, 100000)``.
    """
    generator = rng(base_seed, "passkey", int(length), repr(float(depth)), int(trial))
    return int(generator.integers(10**(ANSWER_DIGITS - 1), 10**ANSWER_DIGITS))


@dataclass(frozen=True)
class PasskeyTrial:
    """One passkey trial.

    Attributes
    ----------
    length, depth, trial : int, float, int
        The trial's identity.
    key : int
        The pass key.
    prompt_ids : numpy.ndarray
        (length - 5,) int64: instruction, filler with the key sentence, question.
    answer_ids : numpy.ndarray
        (5,) int64: the key's digits.
    key_position : int
        Index in ``prompt_ids`` of the key sentence's first token.
    key_tokens : int
        Tokens of the key sentence.
    filler_tokens : int
        Filler tokens in the prompt (``F``).
    filler_start : int
        Index of the first filler token (the instruction's length).
    """

    length: int
    depth: float
    trial: int
    key: int
    prompt_ids: np.ndarray
    answer_ids: np.ndarray
    key_position: int
    key_tokens: int
    filler_tokens: int
    filler_start: int

    @property
    def scored_ids(self) -> np.ndarray:
        """The teacher-forced input: the prompt and every answer token but the last (length - 1 tokens)."""
        return np.concatenate([self.prompt_ids, self.answer_ids[:-1]])


def _encode(model: Any, text: str, *, first: bool = False) -> list[int]:
    """Token ids of one piece of the prompt: a tokenizer's BOS (Gemma 3's) only on the ``first``
    piece, where the sequence starts, and no EOS (the pieces are concatenated)."""
    ids = [int(t) for t in model.encode(text)]
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is not None and getattr(tokenizer, "add_eos", False) and ids and ids[-1] == tokenizer.eos_token_id:
        ids = ids[:-1]
    if (not first and tokenizer is not None and getattr(tokenizer, "add_bos", False) and ids
            and ids[0] == tokenizer.bos_token_id):
        ids = ids[1:]
    return ids


def make_trial(model: Any, length: int, depth: float, trial: int, *, base_seed: int,
               context_length: int | None = None) -> PasskeyTrial:
    """The passkey trial of identity ``(length, depth, trial)`` (layout in the module docstring).

    Parameters
    ----------
    model : GGUFLlama
        Anything with ``encode(text) -> ndarray`` of token ids; its ``config.context_length``
        (GGUF key ``llama.context_length``) bounds ``length`` unless ``context_length`` is given.
    length : int
        Tokens of prompt and answer together.
    depth : float
        Relative depth of the key sentence in the filler, in [0, 1].
    trial : int
        The trial's number at this (length, depth), >= 0.
    base_seed : int
        The study's base seed.
    context_length : int, optional
        The longest allowed ``length`` (default ``model.config.context_length``).

    Returns
    -------
    PasskeyTrial
        Prompt of exactly ``length - 5`` tokens and the five answer tokens.

    Raises
    ------
    KvasymError
        If the depth is outside [0, 1], the trial negative, the length beyond the context or too
        short to hold the instruction, key sentence and question, or the number does not
        tokenize to one token per digit.
    """
    if isinstance(trial, bool) or not isinstance(trial, (int, np.integer)) or trial < 0:
        raise KvasymError(f"passkey trial must be a non-negative integer, got {trial!r}")
    if not 0.0 <= float(depth) <= 1.0:
        raise KvasymError(f"passkey depth must be in [0, 1], got {depth!r}")
    limit = int(model.config.context_length) if context_length is None else int(context_length)
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or not 0 < length <= limit:
        raise KvasymError(f"passkey length must be an integer in 1..{limit} (the model's context, GGUF key "
                          f"llama.context_length), got {length!r}")
    key = passkey_number(base_seed, int(length), depth, int(trial))
    answer = _encode(model, str(key))
    if len(answer) != ANSWER_DIGITS:
        raise KvasymError(f"pass key {key} tokenizes to {len(answer)} tokens, expected one per digit")
    intro = _encode(model, INTRO, first=True)
    key_ids = _encode(model, KEY_SENTENCE.format(key=key))
    question = _encode(model, QUESTION)
    n_filler = int(length) - ANSWER_DIGITS - len(intro) - len(key_ids) - len(question)
    if n_filler < 0:
        raise KvasymError(f"passkey length {length} is too short: instruction, key sentence, question and "
                          f"answer take {int(length) - n_filler} tokens")
    # Whole filler sentences until n_filler tokens are reached, the last one cut; the key goes
    # in at the sentence boundary nearest depth * n_filler (0 and n_filler are boundaries).
    sentences = [_encode(model, s) for s in FILLER_SENTENCES]
    filler: list[int] = []
    boundaries = [0]
    index = 0
    while len(filler) < n_filler:
        filler.extend(sentences[index % len(sentences)])
        boundaries.append(min(len(filler), n_filler))
        index += 1
    filler = filler[:n_filler]
    target = float(depth) * n_filler
    split = min(boundaries, key=lambda b: (abs(b - target), b))
    prompt = intro + filler[:split] + key_ids + filler[split:] + question
    return PasskeyTrial(length=int(length), depth=float(depth), trial=int(trial), key=key,
                        prompt_ids=np.asarray(prompt, dtype=np.int64), answer_ids=np.asarray(answer, dtype=np.int64),
                        key_position=len(intro) + split, key_tokens=len(key_ids), filler_tokens=n_filler,
                        filler_start=len(intro))


@dataclass(frozen=True)
class PasskeyScore:
    """The score of one trial.

    Attributes
    ----------
    correct : bool
        Every answer token is the argmax of its position's logits (greedy decoding gives the key).
    n_correct_prefix : int
        Answer tokens greedy decoding reproduces before its first wrong token (5 when correct).
    greedy_ids : numpy.ndarray
        (5,) int64: the argmax at each teacher-forced answer position.
    """

    correct: bool
    n_correct_prefix: int
    greedy_ids: np.ndarray


def score_answer(logits: np.ndarray, answer_ids: Sequence[int] | np.ndarray) -> PasskeyScore:
    """Score a trial from the logits of the positions that predict its answer tokens.

    Parameters
    ----------
    logits : numpy.ndarray
        (n_answer, vocab): row ``j`` is the next-token logits at the position that predicts
        answer token ``j`` (the prompt's last position for ``j = 0``, answer token ``j - 1``'s
        after that), from one teacher-forced pass (:func:`answer_logits`).
    answer_ids : sequence of int
        (n_answer,) the answer's token ids.

    Returns
    -------
    PasskeyScore
        ``correct`` iff ``argmax(logits[j]) == answer_ids[j]`` for every ``j`` (equal to greedy
        decoding of the answer; see the module docstring); ``n_correct_prefix`` the first ``j``
        where they differ.
    """
    logits = np.asarray(logits)
    answer = np.asarray(answer_ids, dtype=np.int64)
    if logits.ndim != 2 or answer.ndim != 1 or logits.shape[0] != answer.size or answer.size == 0:
        raise KvasymError(f"passkey scoring needs (n_answer, vocab) logits for n_answer answer tokens, got "
                          f"logits {logits.shape} and {answer.shape} answer ids")
    greedy = np.argmax(logits, axis=-1).astype(np.int64)
    hits = greedy == answer
    prefix = int(answer.size if hits.all() else np.argmin(hits))
    return PasskeyScore(correct=bool(hits.all()), n_correct_prefix=prefix, greedy_ids=greedy)


def answer_logits(model: Any, trial: PasskeyTrial, quant: Any = None) -> np.ndarray:
    """The (5, vocab) logits of a trial's answer positions from one teacher-forced pass.

    Parameters
    ----------
    model : GGUFLlama
        The model.
    trial : PasskeyTrial
        The trial (:func:`make_trial`).
    quant : CacheQuantization, optional
        The quantized cache the pass reads (:func:`kvasym.real.endtoend.quantized_forward`);
        None: full precision.

    Returns
    -------
    numpy.ndarray
        Logits of positions ``len(prompt) - 1 .. len(prompt) + 3`` of the pass over
        :attr:`PasskeyTrial.scored_ids`; only these five rows meet the output matrix.
    """
    from .endtoend import quantized_forward

    hidden = quantized_forward(model, trial.scored_ids, quant)
    start = trial.prompt_ids.size - 1
    return model.logits(hidden[start:start + trial.answer_ids.size])


def run_trial(model: Any, trial: PasskeyTrial, quant: Any = None) -> PasskeyScore:
    """Run and score one trial: :func:`score_answer` of :func:`answer_logits`.

    Parameters
    ----------
    model : GGUFLlama
        The model.
    trial : PasskeyTrial
        The trial.
    quant : CacheQuantization, optional
        The quantized cache (None: full precision).

    Returns
    -------
    PasskeyScore
        The trial's score.
    """
    return score_answer(answer_logits(model, trial, quant), trial.answer_ids)
