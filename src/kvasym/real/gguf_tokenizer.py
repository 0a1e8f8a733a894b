"""The tokenizer embedded in a LLaMA-family GGUF file, rebuilt with the ``tokenizers`` package.

A GGUF file carries its tokenizer as metadata under llama.cpp's key names
(``tokenizer.ggml.model``, ``.pre``, ``.tokens``, ``.scores``, ``.token_type``, ``.merges``,
``.bos_token_id``, ``.add_bos_token``, ...). :func:`build_tokenizer` reads them and builds a
:class:`GGUFTokenizer` that encodes the way llama.cpp does (the runtime these files are made for):

``tokenizer.ggml.model == 'gpt2'`` (byte-level BPE; the merges are in the file)
    The text is first cut by the pre-tokenizer named by ``tokenizer.ggml.pre``:

    ``smollm``     one digit per piece, then GPT-2's regex (SmolLM2; byte-identical to the
                   builder this module replaced);
    ``gpt-2``      GPT-2's regex (``'s|'t|... | ?\\p{L}+| ?\\p{N}+|...``);
    ``llama-bpe``  Llama-3's regex (contractions in either case, digits in groups of 1-3, a
                   non-letter glued before a word, newlines kept apart); like llama.cpp (and the
                   ``ignore_merges`` of Meta's ``tokenizer.json``) a piece that is itself a token
                   is taken whole before any merge. ``llama3`` and ``llama-v3`` are the same;
    ``qwen2``      Qwen2's regex: Llama-3's with one digit per piece.

``tokenizer.ggml.model == 'llama'`` (SentencePiece BPE with byte fallback: Llama-2, Mistral v0.1,
TinyLlama)
    Spaces become ``▁`` and, when ``tokenizer.ggml.add_space_prefix`` is true (llama.cpp's default
    for this model), a ``▁`` is put in front of the text and after every control token (llama.cpp
    does so whatever the text starts with). The file has no merges: they are recovered from the
    vocabulary, every split of a token into two tokens ranked by the whole token's score (highest
    first), which is the order in which llama.cpp's SentencePiece merger joins pairs. Characters
    no token spells fall back to ``<0xXX>`` byte tokens. ``tokenizer.ggml.pre`` is not used by
    llama.cpp for this model; it must be absent or ``default``.

Control tokens (``tokenizer.ggml.token_type`` 3) are matched whole in the text; user-defined ones
(type 4) too, as llama.cpp does. BOS is prepended (EOS appended) when
``tokenizer.ggml.add_bos_token`` (``add_eos_token``) says so, or, without the key, by llama.cpp's
defaults: BOS for ``llama`` and for ``llama-bpe``, none otherwise; EOS never. Anything else
(``bert``, ``t5``, ``rwkv``, an unknown ``pre``) is refused with a :class:`~kvasym.errors.KvasymError`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import KvasymError
from . import INSTALL_COMMANDS, RealExtraMissing

#: GGUF ``tokenizer.ggml.token_type`` values (llama.cpp's ``llama_token_type``).
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_BYTE = 6

#: GPT-2's split, as in the ``tokenizers`` ByteLevel pre-tokenizer and llama.cpp.
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
#: Llama-3's split as llama.cpp writes it (the case-insensitive group spelled out per letter).
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
LLAMA3_SPLIT = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
#: Qwen2's split: Llama-3's with single digits.
QWEN2_SPLIT = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")

#: ``tokenizer.ggml.pre`` values of byte-level BPE files: (split regex or None for the smollm
#: digit + GPT-2 chain, llama.cpp's ignore_merges, llama.cpp's default add_bos).
_BYTE_LEVEL_PRE: dict[str, tuple[str | None, bool, bool]] = {
    "smollm": (None, False, False),
    "gpt-2": (GPT2_SPLIT, False, False),
    "llama-bpe": (LLAMA3_SPLIT, True, True),
    "llama3": (LLAMA3_SPLIT, True, True),
    "llama-v3": (LLAMA3_SPLIT, True, True),
    "qwen2": (QWEN2_SPLIT, False, False),
}
#: ``tokenizer.ggml.pre`` values accepted for the SentencePiece model (None: key absent).
_SPM_PRE = (None, "default")
SUPPORTED_MODELS = ("gpt2", "llama")
SUPPORTED_PRE = {"gpt2": tuple(_BYTE_LEVEL_PRE), "llama": ("default", "(absent)")}


def _missing_tokenizers() -> RealExtraMissing:
    return RealExtraMissing(
        f"the real-model extra is missing (Python package 'tokenizers' not found); "
        f"install it with: {INSTALL_COMMANDS}"
    )


class _Fields:
    """``tokenizer.ggml.*`` values of one GGUF reader, with errors naming the file and key."""

    def __init__(self, reader: Any, path: Path) -> None:
        self.reader = reader
        self.path = path

    def get(self, key: str, default: Any = None) -> Any:
        found = self.reader.fields.get(key)
        return default if found is None else found.contents()

    def need(self, key: str) -> Any:
        found = self.reader.fields.get(key)
        if found is None:
            raise KvasymError(f"{self.path}: GGUF metadata key {key!r} is missing")
        return found.contents()

    def need_list(self, key: str, kinds: tuple[type, ...], what: str) -> list:
        """Array ``key`` (required), every item of one of ``kinds`` (a bool is not an int)."""
        value = self.need(key)
        if not isinstance(value, list) or not all(type(item) in kinds for item in value):
            shown = value if not isinstance(value, list) else next(v for v in value if type(v) not in kinds)
            raise KvasymError(f"{self.path}: {key} is not an array of {what} (holds {shown!r})")
        return value

    def flag(self, key: str, default: bool) -> bool:
        """Boolean ``key`` (``default`` when absent); another type is refused, as llama.cpp does."""
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise KvasymError(f"{self.path}: {key}={value!r} is not a boolean")
        return value

    def token_id(self, key: str, n_tokens: int) -> int | None:
        """Token id ``key`` (None when absent), an integer inside the vocabulary."""
        value = self.get(key)
        if value is not None and type(value) is not int:
            raise KvasymError(f"{self.path}: {key}={value!r} is not an integer token id")
        if value is not None and not 0 <= value < n_tokens:
            raise KvasymError(f"{self.path}: {key}={value} is outside the vocabulary of {n_tokens} tokens")
        return value


class GGUFTokenizer:
    """A GGUF file's tokenizer: :meth:`encode` / :meth:`decode` as llama.cpp would.

    ``backend`` is the ``tokenizers.Tokenizer`` doing the work; ``add_bos`` / ``add_eos`` the
    policy :meth:`encode` applies; ``bos_token_id`` / ``eos_token_id`` the ids (or None).
    """

    def __init__(self, backend: Any, *, model: str, pre: str | None, vocab_size: int, n_merges: int,
                 merges_from_scores: bool, add_bos: bool, add_eos: bool,
                 bos_token_id: int | None, eos_token_id: int | None) -> None:
        self.backend = backend
        self.model = model
        self.pre = pre
        self.vocab_size = vocab_size
        self.n_merges = n_merges
        self.merges_from_scores = merges_from_scores
        self.add_bos = add_bos
        self.add_eos = add_eos
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id

    def encode(self, text: str) -> np.ndarray:
        """Token ids (int64) of ``text``, with BOS / EOS when the file asks for them."""
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if self.add_bos:
            ids = [self.bos_token_id, *ids]
        if self.add_eos:
            ids = [*ids, self.eos_token_id]
        return np.asarray(ids, dtype=np.int64)

    def decode(self, token_ids: Iterable[int]) -> str:
        """Text of ``token_ids``; the BOS / EOS that :meth:`encode` adds are dropped, other
        control tokens are kept as text (``decode(encode(s)) == s`` for a text ``s``)."""
        ids = [int(t) for t in token_ids]
        if self.add_bos and ids and ids[0] == self.bos_token_id:
            ids = ids[1:]
        if self.add_eos and ids and ids[-1] == self.eos_token_id:
            ids = ids[:-1]
        return self.backend.decode(ids, skip_special_tokens=False)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary's spelling of one id."""
        return self.backend.id_to_token(int(token_id))

    def token_to_id(self, token: str) -> int | None:
        """The id of one vocabulary entry (None when absent)."""
        return self.backend.token_to_id(token)

    def description(self) -> str:
        """One line naming the tokenizer, for capture metadata."""
        import tokenizers

        if self.add_bos:
            policy = f"BOS {self.bos_token_id} prepended"
        else:
            policy = "no BOS"
        if self.add_eos:
            policy += f", EOS {self.eos_token_id} appended"
        if self.model == "gpt2":
            kind = "byte-level BPE"
            merges = f"{self.n_merges} merges"
        else:
            kind = "SentencePiece BPE with byte fallback"
            merges = f"{self.n_merges} merges from scores"
        return (
            f"GGUF-embedded {kind} (tokenizer.ggml.model={self.model}, pre={self.pre}, vocab "
            f"{self.vocab_size}, {merges}) built with tokenizers {tokenizers.__version__}; {policy}"
        )


def _refuse(path: Path, key: str, value: Any, supported: Iterable[str]) -> KvasymError:
    return KvasymError(f"{path}: {key}={value!r} is not supported (supported: {', '.join(supported)})")


def _special_tokens(tokens: list[str], token_types: list[int]) -> tuple[list[str], list[str]]:
    control = [t for t, k in zip(tokens, token_types) if k == TOKEN_TYPE_CONTROL]
    user = [t for t, k in zip(tokens, token_types) if k == TOKEN_TYPE_USER_DEFINED]
    return control, user


def merges_from_scores(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """Pairs ``(left, right)`` of tokens whose concatenation is a token, best first.

    The rank of a pair is the score of the token it makes (higher first), which is the order in
    which llama.cpp's SentencePiece merger joins adjacent symbols; pairs making one token keep
    the token's id order, and splits of one token go left-piece-shortest first. Tokens of one
    score never compete at one position in a real vocabulary (their splits overlap).
    """
    index = {t: i for i, t in enumerate(tokens)}
    ranked: list[tuple[float, int, int, str, str]] = []
    for i, token in enumerate(tokens):
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in index and right in index:
                ranked.append((-float(scores[i]), i, cut, left, right))
    ranked.sort(key=lambda r: (r[0], r[1], r[2]))
    return [(left, right) for _, _, _, left, right in ranked]


def build_tokenizer(reader: Any, path: Path) -> GGUFTokenizer:
    """The :class:`GGUFTokenizer` of a GGUF reader opened on ``path``
    (:func:`kvasym.real.gguf_file.open_gguf` or ``gguf.GGUFReader``).

    Raises :class:`~kvasym.errors.KvasymError` (one line naming the key and its value) for a
    tokenizer model or pre-tokenizer it does not implement, or a missing key.
    """
    try:
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    except ImportError:
        raise _missing_tokenizers() from None
    path = Path(path)
    f = _Fields(reader, path)
    kind = f.need("tokenizer.ggml.model")
    if kind not in SUPPORTED_MODELS:
        raise _refuse(path, "tokenizer.ggml.model", kind, SUPPORTED_MODELS)
    pre = f.get("tokenizer.ggml.pre")
    tokens: list[str] = f.need_list("tokenizer.ggml.tokens", (str,), "strings")
    token_types: list[int] = f.need_list("tokenizer.ggml.token_type", (int,), "integers")
    if len(token_types) != len(tokens):
        raise KvasymError(f"{path}: tokenizer.ggml.token_type has {len(token_types)} entries for "
                          f"{len(tokens)} tokens")
    vocab = {token: index for index, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise KvasymError(f"{path}: tokenizer.ggml.tokens holds duplicate tokens")

    if kind == "gpt2":
        if pre is None:
            raise KvasymError(f"{path}: GGUF metadata key 'tokenizer.ggml.pre' is missing "
                              f"(supported: {', '.join(_BYTE_LEVEL_PRE)})")
        if not isinstance(pre, str) or pre not in _BYTE_LEVEL_PRE:
            raise _refuse(path, "tokenizer.ggml.pre", pre, _BYTE_LEVEL_PRE)
        split, ignore_merges, default_bos = _BYTE_LEVEL_PRE[pre]
        merges_text: list[str] = f.need_list("tokenizer.ggml.merges", (str,), "strings")
        # Byte-level tokens spell a space 'Ġ', so the single ASCII space separates the pair.
        merges = [tuple(m.split(" ", 1)) for m in merges_text]
        for index, pair in enumerate(merges):  # what tokenizers' BPE requires, named
            if len(pair) != 2 or pair[0] not in vocab or pair[1] not in vocab or pair[0] + pair[1] not in vocab:
                raise KvasymError(f"{path}: tokenizer.ggml.merges entry {index}, {merges_text[index]!r}, is not two "
                                  "tokens of tokenizer.ggml.tokens separated by a space whose join is a token")
        if ignore_merges:
            backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, ignore_merges=True))
        else:
            backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
        if split is None:  # smollm: exactly the chain the paper's results were made with
            backend.pre_tokenizer = pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Digits(individual_digits=True),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
                ]
            )
        else:
            backend.pre_tokenizer = pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(Regex(split), behavior="isolated"),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                ]
            )
        backend.decoder = decoders.ByteLevel()
        n_merges = len(merges)
        from_scores = False
    else:
        if pre not in _SPM_PRE:
            raise _refuse(path, "tokenizer.ggml.pre", pre, ["default", "(absent) for tokenizer.ggml.model='llama'"])
        default_bos = True
        scores: list[float] = f.need_list("tokenizer.ggml.scores", (float, int), "numbers")
        if len(scores) != len(tokens):
            raise KvasymError(f"{path}: tokenizer.ggml.scores has {len(scores)} entries for {len(tokens)} tokens")
        missing_bytes = [b for b in range(256) if f"<0x{b:02X}>" not in vocab]
        if missing_bytes:
            raise KvasymError(f"{path}: tokenizer.ggml.tokens lacks {len(missing_bytes)} byte-fallback tokens "
                              f"(<0x{missing_bytes[0]:02X}>, ...)")
        merges = merges_from_scores(tokens, scores)
        unk_id = f.get("tokenizer.ggml.unknown_token_id")
        unk = tokens[unk_id] if type(unk_id) is int and 0 <= unk_id < len(tokens) else None
        backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
        add_space_prefix = f.flag("tokenizer.ggml.add_space_prefix", True)
        # A normalizer runs on each stretch of text between added tokens: the prefix lands at the
        # start and after every control token, whatever the stretch starts with (llama.cpp).
        steps = [normalizers.Prepend("\u2581")] if add_space_prefix else []
        backend.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", "\u2581")])
        backend.pre_tokenizer = None
        chain = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
        if add_space_prefix:
            chain.append(decoders.Strip(content=" ", left=1))
        backend.decoder = decoders.Sequence(chain)
        n_merges = len(merges)
        from_scores = True

    control, user = _special_tokens(tokens, token_types)
    # Control tokens (<|im_start|>, <s>, ...) are matched whole, never BPE-split.
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    if user:
        backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])

    add_bos = f.flag("tokenizer.ggml.add_bos_token", default_bos)
    add_eos = f.flag("tokenizer.ggml.add_eos_token", False)
    ids = {}
    for name, needed in (("bos", add_bos), ("eos", add_eos)):
        key = f"tokenizer.ggml.{name}_token_id"
        value = f.token_id(key, len(tokens))
        if needed and value is None:
            said = "true" if f.get(f"tokenizer.ggml.add_{name}_token") else "absent (llama.cpp's default: true)"
            raise KvasymError(f"{path}: tokenizer.ggml.add_{name}_token is {said} but {key} is missing")
        ids[name] = value
    return GGUFTokenizer(
        backend, model=kind, pre=pre if pre is not None else "default", vocab_size=len(tokens),
        n_merges=n_merges, merges_from_scores=from_scores, add_bos=add_bos, add_eos=add_eos,
        bos_token_id=ids["bos"], eos_token_id=ids["eos"],
    )
