"""Tiny tokenizer-only GGUF files and transformers' token ids for them: the fixtures of
``tests/test_gguf_tokenizer.py``.

:mod:`kvasym.real.gguf_tokenizer` rebuilds the tokenizer a GGUF file embeds. This script checks it
against an independent implementation, Hugging Face ``transformers``' own GGUF tokenizer builder
(``AutoTokenizer.from_pretrained(folder, gguf_file=name)``). Neither transformers nor torch is a
dependency of kvasym or of CI, so, as for ``validate_forward.py``, there are two steps::

    # 1. the files, in the project's environment: one small vocabulary per family, trained with
    #    the tokenizers trainers on the repository's texts, written as metadata-only GGUF files
    python3 benchmarks/make_tokenizer_fixtures.py files --out tests/fixtures/tiny_tokenizers
    # 2. the reference, in a virtual environment with transformers (5.25 was used: step 2 calls
    #    its transformers.integrations.gguf builders), gguf and numpy
    /work/venv-ref/bin/python benchmarks/make_tokenizer_fixtures.py reference \\
        --folder tests/fixtures/tiny_tokenizers --fixture tests/expected/tokenizer_reference.json

Families (file name: ``tokenizer.ggml.model`` / ``tokenizer.ggml.pre``, BOS policy):

``smollm.gguf``     gpt2 / smollm (SmolLM2), no BOS;
``gpt2.gguf``       gpt2 / gpt-2, no BOS;
``llama-bpe.gguf``  gpt2 / llama-bpe (Llama-3), BOS ``<|begin_of_text|>``; one token,
                    ``Ġzyzzyva``, has no merges leading to it (Llama-3's ``ignore_merges``);
``qwen2.gguf``      gpt2 / qwen2, no BOS, one user-defined token ``<think>``;
``llama.gguf``      llama (SentencePiece BPE, byte fallback, scores, no merges), BOS ``<s>``.

Where transformers' builder is known to differ from llama.cpp (the runtime the files are made
for, and the behaviour kvasym follows), step 2 also records ``llama_cpp`` ids computed with
transformers' own pieces and the one llama.cpp rule it lacks, said in the fixture's ``_about``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

#: Probe strings: prose, digit runs, contractions, whitespace runs, tabs, leading spaces,
#: unicode, code, control tokens, edge cases.
PROBES = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world",
    "12345 2026 3.14159 and 1,000,000 people (12345) #12345678",
    "I'm sure they'LL say we'd've WON'T, you're IT's; THEY'LLAMA SHE'SHELL",
    "two  spaces,   three spaces\n\nand a blank line\n",
    "tab\tseparated\tvalues\r\nwindows line",
    " leading space",
    "   three leading spaces",
    "trailing spaces   ",
    "naïve café — 東京 🙂",
    "def f(x):\n    return [x[i] ** 2 for i in range(10)]  # {ok}\n",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "a zyzzyva <think>hmm</think> ok",
    "",
    "\n",
    " ",
    "a",
]
#: Also probed: the first characters of each shipped text (long prose with numbers).
TEXT_PREFIX_CHARS = 400

#: Added to the training texts of the byte-level vocabularies (see _byte_level).
EXTRA_TRAINING_TEXT = ("In 2024, 2025 and 2026 we counted 12345 and 1,000,000 birds at 3.14159 per hour. "
                       "I'm sure THEY'LL go; we'd've WON'T. you're IT's. ( x ) (x) [x] .\n\n\t"
                       "end.\n\n  next\n\n\n  more.\n\n(12345) [2026] #12345678\n"
                       " (LLAMA) (SHELL) [LLAMA] [SHELL] LLAMA SHELL\n")

FAMILIES = ("smollm", "gpt2", "llama-bpe", "qwen2", "llama")
VOCAB_SIZE = 600


def _texts() -> list[str]:
    root = Path(__file__).resolve().parents[1] / "src" / "kvasym" / "real" / "texts"
    return [p.read_text(encoding="utf-8") for p in sorted(root.glob("*.txt"))]


def probes() -> list[str]:
    return PROBES + [t[:TEXT_PREFIX_CHARS] for t in _texts()]


# --------------------------------------------------------------------------- step 1: files


def _byte_level(family: str) -> dict:
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    from kvasym.real import gguf_tokenizer as gt

    specials = {
        "smollm": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "gpt2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "llama-bpe": ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"],
        "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    }[family]
    # Each vocabulary is trained with ANOTHER family's split, on the texts plus a few digit runs
    # and contractions, so that it holds tokens (multi-digit runs, "'LL", ".\n", ...) that only
    # the right pre-tokenizer keeps apart: a builder using the wrong split gives other ids.
    tok = Tokenizer(models.BPE())
    if family in ("smollm", "llama-bpe"):
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(gt.LLAMA3_SPLIT), behavior="isolated"),
             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_texts() + [EXTRA_TRAINING_TEXT] * 8, trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = model["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    types = [gt.TOKEN_TYPE_CONTROL if t in specials else gt.TOKEN_TYPE_NORMAL for t in tokens]
    if family == "llama-bpe":  # a token no merge leads to: only ignore_merges produces it
        tokens.append("Ġzyzzyva")
        types.append(gt.TOKEN_TYPE_NORMAL)
    if family == "qwen2":
        for extra in ("<think>", "</think>"):
            tokens.append(extra)
            types.append(gt.TOKEN_TYPE_USER_DEFINED)
    meta = {
        "smollm": dict(arch="llama", bos=1, eos=2, add_bos=False),
        "gpt2": dict(arch="gpt2", bos=0, eos=0, add_bos=False),
        "llama-bpe": dict(arch="llama", bos=0, eos=1, add_bos=True),
        "qwen2": dict(arch="qwen2", bos=0, eos=0, add_bos=False),
    }[family]
    return dict(model="gpt2", pre="gpt-2" if family == "gpt2" else family, tokens=tokens, types=types,
                merges=merges, scores=None, **meta)


def _sentencepiece() -> dict:
    """A SentencePiece-style BPE vocabulary laid out as Llama-2's: <unk>, <s>, </s>, the 256
    byte tokens, then pieces by merge order with score -rank, then single characters."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    from kvasym.real import gguf_tokenizer as gt

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, show_progress=False)
    # Newlines and tabs are left to byte fallback, as in Llama-2's vocabulary.
    tok.train_from_iterator([re.sub(r"[\n\t]", " ", t) for t in _texts()], trainer)
    model = json.loads(tok.to_str())["model"]
    merged = ["".join(m if isinstance(m, list) else m.split(" ")) for m in model["merges"]]
    chars = sorted(t for t in model["vocab"] if len(t) == 1)
    pieces: list[str] = []
    for piece in merged:
        if piece not in pieces:
            pieces.append(piece)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["<|im_start|>", "<|im_end|>"]
    types = [gt.TOKEN_TYPE_UNKNOWN, gt.TOKEN_TYPE_CONTROL, gt.TOKEN_TYPE_CONTROL] + [gt.TOKEN_TYPE_BYTE] * 256
    types += [gt.TOKEN_TYPE_CONTROL] * 2
    scores = [0.0] * len(tokens)
    # whitespace runs (Llama-2 has them; a whitespace-split trainer cannot learn them)
    for rank, piece in enumerate(["\u2581\u2581", "\u2581\u2581\u2581\u2581"] + pieces):
        if piece in tokens:
            continue
        tokens.append(piece)
        types.append(gt.TOKEN_TYPE_NORMAL)
        scores.append(-float(rank))
    for k, ch in enumerate(c for c in chars if c not in tokens):
        tokens.append(ch)
        types.append(gt.TOKEN_TYPE_NORMAL)
        scores.append(-float(len(pieces) + 10 + k))
    return dict(model="llama", pre=None, tokens=tokens, types=types, merges=None, scores=scores,
                arch="llama", bos=1, eos=2, add_bos=True, unk=0)


def write_gguf(path: Path, spec: dict) -> None:
    """A metadata-only GGUF (no tensors) with llama.cpp's tokenizer keys and the architecture's
    hyper-parameters (tiny values) that readers look up."""
    import gguf

    arch = spec["arch"]
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"kvasym tiny tokenizer {path.stem}")
    writer.add_context_length(256)
    writer.add_embedding_length(64)
    writer.add_block_count(1)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(4)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(len(spec["tokens"]))
    writer.add_tokenizer_model(spec["model"])
    if spec["pre"] is not None:
        writer.add_tokenizer_pre(spec["pre"])
    writer.add_token_list(spec["tokens"])
    writer.add_token_types(spec["types"])
    if spec["scores"] is not None:
        writer.add_token_scores(spec["scores"])
    if spec["merges"] is not None:
        writer.add_token_merges(spec["merges"])
    writer.add_bos_token_id(spec["bos"])
    writer.add_eos_token_id(spec["eos"])
    if "unk" in spec:
        writer.add_unk_token_id(spec["unk"])
    writer.add_add_bos_token(spec["add_bos"])
    writer.add_add_eos_token(False)
    if spec["model"] == "llama":
        writer.add_add_space_prefix(True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def files(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for family in FAMILIES:
        spec = _sentencepiece() if family == "llama" else _byte_level(family)
        path = out / f"{family}.gguf"
        write_gguf(path, spec)
        print(f"{path}: {len(spec['tokens'])} tokens, {path.stat().st_size} bytes")


# --------------------------------------------------------------------------- step 2: reference


def _llama_cpp_ids(family: str, path: Path, texts: list[str]) -> tuple[list[list[int]], str] | None:
    """Ids under llama.cpp's rule where transformers' builder departs from it, or None.

    Built from transformers' own GGUF builders and tokenizers objects, changed only by the rule
    named in the returned note.
    """
    from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer

    architecture, tokenizer_dict, config = get_gguf_tokenizer(str(path))
    if family == "llama":
        # llama.cpp puts " " before every stretch of text that follows the start or a control
        # token, whatever it starts with; transformers' Llama tokenizer (Metaspace,
        # prepend_scheme="first") adds the prefix only at the start and only when the text does
        # not already start with a space. transformers' own phi3 builder prepends the way
        # llama.cpp does (normalizer Prepend + Replace), on the same vocabulary and merges.
        backend, _ = convert_gguf_tokenizer("phi3", tokenizer_dict)
        bos = tokenizer_dict["tokens"].index(config["bos_token"])
        ids = [[bos] + backend.encode(t, add_special_tokens=False).ids for t in texts]
        return ids, ("llama.cpp prefixes a space to every stretch of text after the start or a control token "
                     "even when it already starts with one; transformers' Llama tokenizer (Metaspace, "
                     "prepend_scheme='first') only at the start and only if absent. llama_cpp ids: transformers' "
                     "phi3 GGUF builder (normalizer Prepend('▁') + Replace), which prepends like llama.cpp")
    if family == "smollm":
        # llama.cpp's smollm pre-tokenizer first cuts one digit per piece (regex \p{N}), then
        # GPT-2's regex; transformers' GGUF builder knows no 'smollm' and uses GPT-2's regex only.
        backend, _ = convert_gguf_tokenizer(architecture, tokenizer_dict)
        control = [t for t, k in zip(tokenizer_dict["tokens"], tokenizer_dict["token_type"]) if k == 3]
        cut = re.compile("(" + "|".join(re.escape(c) for c in control) + r"|[0-9])")
        ids = []
        for text in texts:
            row: list[int] = []
            for piece in cut.split(text):
                if piece:
                    row += backend.encode(piece, add_special_tokens=False).ids
            ids.append(row)
        return ids, ("llama.cpp's 'smollm' pre-tokenizer cuts one digit per piece before GPT-2's regex "
                     "(SmolLM2's tokenizer.json: Digits(individual_digits) then ByteLevel); transformers' GGUF "
                     "builder has no 'smollm' entry and applies GPT-2's regex only, so digit runs merge. "
                     "llama_cpp ids: transformers' tokenizer applied to each digit and each stretch between "
                     "digits and control tokens separately")
    if family == "llama-bpe":
        # llama.cpp (and Meta's tokenizer.json) take a pre-token whole when it is a token
        # (ignore_merges); transformers' GGUF builder does not set it.
        backend, _ = convert_gguf_tokenizer(architecture, tokenizer_dict)
        backend.model.ignore_merges = True
        bos = tokenizer_dict["tokens"].index(config["bos_token"])
        ids = [[bos] + backend.encode(t, add_special_tokens=False).ids for t in texts]
        return ids, ("llama.cpp sets ignore_merges for llama-bpe (as Meta's tokenizer.json does): a pre-token "
                     "that is itself a token is taken whole; transformers' GGUF builder leaves it off, which "
                     "shows on the fixture's merge-less token 'Ġzyzzyva'. llama_cpp ids: transformers' "
                     "tokenizer with backend model.ignore_merges = True")
    return None


def reference(folder: Path, fixture: Path) -> None:
    import importlib.metadata

    import tokenizers
    import transformers
    from transformers import AutoTokenizer

    try:  # the builders _llama_cpp_ids calls; the 'validate' extra's floor (4.46) lacks this module
        import transformers.integrations.gguf  # noqa: F401
    except ImportError:
        sys.exit(f"make_tokenizer_fixtures.py reference: transformers {transformers.__version__} has no "
                 "transformers.integrations.gguf; install transformers>=5 (5.25 made the fixture) in the "
                 "reference environment")
    texts = probes()
    families = {}
    for family in FAMILIES:
        path = folder / f"{family}.gguf"
        tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=path.name)
        hf = [list(tok(t)["input_ids"]) for t in texts]
        entry = {"file": path.name, "transformers": hf,
                 "transformers_decode": [tok.decode(ids, skip_special_tokens=True) for ids in hf]}
        variant = _llama_cpp_ids(family, path, texts)
        if variant is not None:
            entry["llama_cpp"], entry["llama_cpp_note"] = variant
            entry["differs_at"] = [i for i, (a, b) in enumerate(zip(hf, variant[0])) if a != b]
        families[family] = entry
        print(f"{family}: {len(texts)} probes; llama.cpp rule differs at "
              f"{entry.get('differs_at', 'n/a')}", file=sys.stderr)
    payload = {
        "_about": "Token ids of tests/fixtures/tiny_tokenizers/*.gguf (tokenizer-only GGUF files written by "
                  "benchmarks/make_tokenizer_fixtures.py files) from Hugging Face transformers' own GGUF tokenizer "
                  "builder (AutoTokenizer.from_pretrained(folder, gguf_file=name); input_ids with its default "
                  "special tokens, i.e. BOS when the file says add_bos_token). Where transformers departs from "
                  "llama.cpp (smollm digits, llama space prefix, llama-bpe ignore_merges) the family also has "
                  "'llama_cpp' ids made with transformers' pieces plus the llama.cpp rule, its 'llama_cpp_note' and "
                  "'differs_at' (probe indices); kvasym follows llama.cpp (the runtime GGUF files are made for) and "
                  "is tested against 'llama_cpp' when present, else 'transformers'.",
        "versions": {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                     "gguf": importlib.metadata.version("gguf"), "python": sys.version.split()[0]},
        "probes": texts,
        "families": families,
    }
    fixture.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(payload, ensure_ascii=False, indent=1)
    # one line per id list
    text = re.sub(r"\[[-\d,\s]*\]", lambda m: json.dumps(json.loads(m.group(0)), separators=(",", ":")), text)
    fixture.write_text(text + "\n", encoding="utf-8")
    print(f"wrote {fixture}", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("files")
    p.add_argument("--out", type=Path, default=Path("tests/fixtures/tiny_tokenizers"))
    p = sub.add_parser("reference")
    p.add_argument("--folder", type=Path, default=Path("tests/fixtures/tiny_tokenizers"))
    p.add_argument("--fixture", type=Path, default=Path("tests/expected/tokenizer_reference.json"))
    args = parser.parse_args(argv)
    if args.step == "files":
        files(args.out)
    else:
        reference(args.folder, args.fixture)


if __name__ == "__main__":
    main()
