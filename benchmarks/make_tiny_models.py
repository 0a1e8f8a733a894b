"""Tiny random-weight LLaMA-family GGUF files, and transformers' logits for them.

``kvasym.real.gguf_model.GGUFLlama`` reads any GGUF whose ``general.architecture`` is ``llama``,
``qwen2`` or ``gemma3``. The gemma3 case follows ``Gemma3Model`` (norm weights stored as
``1 + w``, ``key_length``/``value_length``, ``sliding_window``, no Q/K permutation); its
reference is transformers' ``Gemma3ForCausalLM`` with ``query_pre_attn_scalar`` set to the key
length, as llama.cpp scales (transformers' GGUF mapping leaves it at 256).

This script writes one small file per case (random weights, d_model 64, 4 heads,
2 KV heads, 2 layers, FFN 96, a 300-token byte-level BPE vocabulary the smollm pre-tokenizer
accepts) following llama.cpp's converter exactly (``convert_hf_to_gguf.py``: the tensor names of
``gguf.TensorNameMap``, the ``{arch}.*`` metadata keys, ``LlamaModel.permute`` of the Q/K rows
for ``llama`` and none for ``qwen2``, ``rope_freqs.weight`` for llama3 RoPE scaling as
``LlamaModel.generate_extra_tensors`` computes it, the qwen2 Q/K/V biases), and the logits of
Hugging Face transformers for them, which ``tests/test_gguf_families.py`` compares with ours.

Two steps, as in ``benchmarks/validate_forward.py`` (the reference runs in its own environment)::

    # 1. the files, in the project's environment (numpy and gguf only)
    python3 benchmarks/make_tiny_models.py models --out tests/fixtures/tiny_gguf
    # 2. the reference, in a virtual environment with torch, transformers, gguf and numpy
    /work/venv-ref/bin/python benchmarks/make_tiny_models.py reference \\
        --models tests/fixtures/tiny_gguf --fixture tests/expected/tiny_models_reference.json

The reference loads each file with ``AutoModelForCausalLM.from_pretrained(folder, gguf_file=...,
dtype=torch.float32)``: transformers' own GGUF reader, its own un-permutation of the Q/K rows
(``LlamaTensorProcessor``) and its own model classes (``LlamaForCausalLM``,
``Qwen2ForCausalLM``, ``MistralForCausalLM`` for a ``llama`` file named ``mistral``). Only the
dequantization is shared (transformers calls the same ``gguf.quants.dequantize``).

Where transformers' GGUF loader cannot express a feature, the reference keeps its weights (as it
read and un-permuted them) and rebuilds the model from an HF config that states the feature:
RoPE scaling (``llama.rope.scaling.*`` and the ``rope_freqs.weight`` tensor are not in its
GGUF config mapping, so it would run unscaled). The llama3 case is then checked against HF's
``_compute_llama3_parameters`` (config ``rope_parameters`` with ``rope_type='llama3'``), an
implementation independent of the divisors llama.cpp's converter writes and we read, and the
fixture records how far the unscaled model lies from it (``unscaled_max_abs_delta_logit``), which
must be far above the tolerance for the check to mean anything.

:func:`write_tiny_gguf` is reusable by other tests (any spec of :class:`TinySpec`).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: Token ids every case is run on (all below the 300-token vocabulary).
TOKEN_IDS = [17, 290, 71, 100, 5, 256, 33, 299, 142, 66, 201, 88]
#: The text the byte-level BPE merges are learnt from (deterministic, greedy, ties by string).
MERGE_TEXT = ("the cat sat on the mat and the dog ate the bone; then the rain came in the night "
              "and there was a tiny model that read the whole thing")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 300
TOKEN_TYPE_NORMAL, TOKEN_TYPE_CONTROL = 1, 3


@dataclass(frozen=True)
class TinySpec:
    """One tiny model: its file name, architecture, shapes and the GGML type of each matrix."""

    name: str
    arch: str = "llama"  # general.architecture
    general_name: str = "tiny"
    d_model: int = 64
    n_heads: int = 4
    n_kv_heads: int = 2
    n_layers: int = 2
    ffn_dim: int = 96
    context_length: int = 256
    rope_base: float = 10000.0
    rms_eps: float = 1e-5
    tied: bool = True
    attn_type: str = "F32"  # Q/K/V/O
    ffn_type: str = "F32"  # gate/up/down
    embd_type: str = "F32"  # token_embd (and output when untied)
    biases: bool = False  # blk.N.attn_{q,k,v}.bias
    rope_scaling: dict[str, Any] = field(default_factory=dict)  # HF rope_parameters beyond rope_theta
    extra_kv: dict[str, Any] = field(default_factory=dict)  # additional metadata (refusal tests)
    drop: tuple[str, ...] = ()  # GGUF tensor names left out (refusal tests)
    hf_model_type: str = ""  # reference: rebuild as this HF model type (e.g. "mistral") from the read weights
    head_dim: int = 0  # gemma3: {arch}.attention.key_length (0: d_model / n_heads)
    sliding_window: int = 0  # gemma3: {arch}.attention.sliding_window
    seed: int = 0

    @property
    def hd(self) -> int:
        """The head dimension: ``head_dim`` when set, else ``d_model / n_heads``."""
        return self.head_dim or self.d_model // self.n_heads


SPECS = [
    TinySpec("llama_tied_f32.gguf", seed=1),
    TinySpec("llama3_untied_f16_q8_0.gguf", general_name="tiny-llama3", tied=False, attn_type="F16",
             ffn_type="Q8_0", embd_type="Q8_0", seed=2,
             rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    TinySpec("llama_linear_q4_1.gguf", general_name="tiny-linear", attn_type="Q4_1", ffn_type="Q5_0",
             embd_type="F16", seed=3, rope_scaling={"rope_type": "linear", "factor": 4.0}),
    TinySpec("qwen2_biases_q8_0.gguf", arch="qwen2", general_name="tiny-qwen2", attn_type="Q8_0",
             ffn_type="Q8_0", embd_type="F16", biases=True, rope_base=1e6, rms_eps=1e-6, seed=4),
    TinySpec("mistral_untied_bf16.gguf", general_name="tiny-mistral", n_kv_heads=1, tied=False,
             attn_type="BF16", ffn_type="F16", embd_type="F32", hf_model_type="mistral", seed=5),
    # Gemma 3's shape in small: one KV head, head_dim (32) apart from d_model / n_heads (16), six
    # layers (five sliding, one global: the pattern of 6), a 4-token window that binds in the
    # 12-token sequence, RoPE base 1e6 on the global layer; Q5_0 attention and Q8_0 MLP as in
    # the real file's mix.
    TinySpec("gemma3_swa_q5_0.gguf", arch="gemma3", general_name="tiny-gemma3", n_kv_heads=1, n_layers=6,
             head_dim=32, sliding_window=4, rope_base=1e6, rms_eps=1e-6, attn_type="Q5_0", ffn_type="Q8_0",
             embd_type="F16", seed=6),
]


# --------------------------------------------------------------------------- vocabulary


def _byte_tokens() -> list[str]:
    """GPT-2's ``bytes_to_unicode``: the printable stand-in of each of the 256 bytes, in byte order."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return [mapping[b] for b in range(256)]


def vocabulary() -> tuple[list[str], list[str], list[int]]:
    """(tokens, merges, token types): 256 byte tokens, greedy BPE merges of MERGE_TEXT, specials."""
    byte_tok = _byte_tokens()
    words = [[byte_tok[b] for b in (("" if i == 0 else " ") + w).encode("utf-8")]
             for i, w in enumerate(MERGE_TEXT.split(" "))]
    tokens = list(byte_tok)
    merges: list[str] = []
    n_merges = VOCAB_SIZE - 256 - len(SPECIALS)
    while len(merges) < n_merges:
        pairs = Counter((w[i], w[i + 1]) for w in words for i in range(len(w) - 1))
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merged = best[0] + best[1]
        merges.append(f"{best[0]} {best[1]}")
        tokens.append(merged)
        for w in words:
            i = 0
            while i < len(w) - 1:
                if (w[i], w[i + 1]) == best:
                    w[i:i + 2] = [merged]
                i += 1
    tokens += SPECIALS
    types = [TOKEN_TYPE_NORMAL] * (len(tokens) - len(SPECIALS)) + [TOKEN_TYPE_CONTROL] * len(SPECIALS)
    if len(tokens) != VOCAB_SIZE or len(set(tokens)) != len(tokens):
        raise SystemExit(f"vocabulary has {len(tokens)} tokens ({len(set(tokens))} distinct), expected {VOCAB_SIZE}")
    return tokens, merges, types


# --------------------------------------------------------------------------- weights


def hf_weights(spec: TinySpec) -> dict[str, Any]:
    """Random weights in HF's layout (rotate-half Q/K rows), keyed by HF parameter name."""
    import numpy as np

    rng = np.random.default_rng(spec.seed)
    hd = spec.hd
    q_rows, kv_rows = spec.n_heads * hd, spec.n_kv_heads * hd
    gemma = spec.arch == "gemma3"

    def mat(rows: int, cols: int, std: float) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * std).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        # Gemma's RMSNorm multiplies by (1 + w): its weights lie around 0, the others' around 1.
        return ((0.0 if gemma else 1.0) + 0.2 * rng.standard_normal(n)).astype(np.float32)

    d = spec.d_model
    w: dict[str, Any] = {"model.embed_tokens.weight": mat(VOCAB_SIZE, d, 1.0), "model.norm.weight": norm(d)}
    if not spec.tied:
        w["lm_head.weight"] = mat(VOCAB_SIZE, d, 0.5)
    for i in range(spec.n_layers):
        p = f"model.layers.{i}."
        # Q and K large enough that attention is far from uniform, so RoPE decides the output.
        w[p + "self_attn.q_proj.weight"] = mat(q_rows, d, 0.6)
        w[p + "self_attn.k_proj.weight"] = mat(kv_rows, d, 0.6)
        w[p + "self_attn.v_proj.weight"] = mat(kv_rows, d, 0.3)
        w[p + "self_attn.o_proj.weight"] = mat(d, q_rows, 0.15)
        w[p + "mlp.gate_proj.weight"] = mat(spec.ffn_dim, d, 0.2)
        w[p + "mlp.up_proj.weight"] = mat(spec.ffn_dim, d, 0.2)
        w[p + "mlp.down_proj.weight"] = mat(d, spec.ffn_dim, 0.15)
        w[p + "input_layernorm.weight"] = norm(d)
        w[p + "post_attention_layernorm.weight"] = norm(d)
        if gemma:  # QK-norm and the sandwich's other two norms
            w[p + "self_attn.q_norm.weight"] = norm(hd)
            w[p + "self_attn.k_norm.weight"] = norm(hd)
            w[p + "pre_feedforward_layernorm.weight"] = norm(d)
            w[p + "post_feedforward_layernorm.weight"] = norm(d)
        if spec.biases:
            w[p + "self_attn.q_proj.bias"] = (rng.standard_normal(q_rows) * 0.5).astype(np.float32)
            w[p + "self_attn.k_proj.bias"] = (rng.standard_normal(kv_rows) * 0.5).astype(np.float32)
            w[p + "self_attn.v_proj.bias"] = (rng.standard_normal(kv_rows) * 0.2).astype(np.float32)
    return w


def converter_permute(weights: Any, n_head: int, n_head_kv: int | None) -> Any:
    """llama.cpp's ``LlamaModel.permute`` (``conversion/llama.py``), verbatim on numpy arrays."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2)
            .reshape(weights.shape))


def llama3_rope_factors(spec: TinySpec) -> Any:
    """``rope_freqs.weight`` as llama.cpp's ``LlamaModel.generate_extra_tensors`` computes it."""
    import math

    import numpy as np

    rope = spec.rope_scaling
    dim = spec.d_model // spec.n_heads
    freqs = 1.0 / (spec.rope_base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old_context_len = rope["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_context_len / low, old_context_len / high
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            factors.append(1)
        elif wavelen > low_freq_wavelen:
            factors.append(factor)
        else:
            smooth = (old_context_len / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(factors, dtype=np.float32)


def write_tiny_gguf(spec: TinySpec, path: Path) -> Path:
    """Write ``spec`` as a GGUF file at ``path`` the way llama.cpp's converter would.

    HF tensor names map to GGUF names through ``gguf.get_tensor_name_map`` (the converter's own
    table); ``llama`` files get the converter's Q/K row permutation (biases too), ``qwen2`` files
    none. Matrices are stored as ``attn_type`` / ``ffn_type`` / ``embd_type`` (written with
    ``gguf.quants.quantize``); norms, biases and ``rope_freqs`` are F32, as the converter keeps
    1-D tensors.
    """
    import gguf
    import numpy as np

    # Tensor names of llama for any architecture but qwen2 and gemma3 (other names: refusal tests).
    arch = {"qwen2": gguf.MODEL_ARCH.QWEN2, "gemma3": gguf.MODEL_ARCH.GEMMA3}.get(spec.arch, gguf.MODEL_ARCH.LLAMA)
    name_map = gguf.get_tensor_name_map(arch, spec.n_layers)
    tokens, merges, types = vocabulary()
    hd = spec.hd
    gemma = spec.arch == "gemma3"
    writer = gguf.GGUFWriter(str(path), spec.arch)
    writer.add_name(spec.general_name)
    writer.add_context_length(spec.context_length)
    writer.add_embedding_length(spec.d_model)
    writer.add_block_count(spec.n_layers)
    writer.add_feed_forward_length(spec.ffn_dim)
    writer.add_head_count(spec.n_heads)
    writer.add_head_count_kv(spec.n_kv_heads)
    writer.add_rope_freq_base(spec.rope_base)
    writer.add_layer_norm_rms_eps(spec.rms_eps)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_vocab_size(VOCAB_SIZE)
    if spec.arch == "llama":
        writer.add_rope_dimension_count(hd)
    if gemma:  # Gemma3Model.set_gguf_parameters
        writer.add_key_length(hd)
        writer.add_value_length(hd)
        writer.add_sliding_window(spec.sliding_window)
    if spec.rope_scaling.get("rope_type") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(spec.rope_scaling["factor"])
    for key, value in spec.extra_kv.items():
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, int(value))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(VOCAB_SIZE - 3)
    writer.add_eos_token_id(VOCAB_SIZE - 3)
    writer.add_add_bos_token(False)

    def add(name: str, array: Any, type_name: str) -> None:
        if name in spec.drop:
            return
        qtype = gguf.GGMLQuantizationType[type_name]
        if type_name == "F64":  # a type gguf cannot dequantize: for refusal tests
            writer.add_tensor(name, np.ascontiguousarray(array, dtype=np.float64))
        elif type_name == "F32" or array.ndim == 1:
            writer.add_tensor(name, np.ascontiguousarray(array, dtype=np.float32))
        elif type_name == "F16":
            writer.add_tensor(name, np.ascontiguousarray(array, dtype=np.float16))
        else:
            writer.add_tensor(name, gguf.quants.quantize(np.ascontiguousarray(array, dtype=np.float32), qtype),
                              raw_dtype=qtype)

    if spec.rope_scaling.get("rope_type") == "llama3":
        add(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", llama3_rope_factors(spec), "F32")
    for hf_name, array in hf_weights(spec).items():
        base, suffix = hf_name.rsplit(".", 1)
        gguf_name = name_map.get_name(base)
        if gguf_name is None:
            raise SystemExit(f"no GGUF name for {hf_name}")
        if gemma and hf_name.endswith("norm.weight"):
            array = array + 1  # Gemma3Model.modify_tensors: the (1 + w) of Gemma's RMSNorm stored whole
        if spec.arch == "llama" and base.endswith("q_proj"):
            array = converter_permute(array, spec.n_heads, spec.n_heads)
        elif spec.arch == "llama" and base.endswith("k_proj"):
            array = converter_permute(array, spec.n_heads, spec.n_kv_heads)
        if "embed_tokens" in base or "lm_head" in base:
            kind = spec.embd_type
        elif "self_attn" in base:
            kind = spec.attn_type
        elif "mlp" in base:
            kind = spec.ffn_type
        else:
            kind = "F32"
        add(f"{gguf_name}.{suffix}", array, kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def models(out: Path) -> None:
    """Write every case of SPECS to ``out`` and ``out/models.json`` (the specs and token ids)."""
    out.mkdir(parents=True, exist_ok=True)
    index = {"_about": "Tiny random-weight GGUF files written by benchmarks/make_tiny_models.py (models step); "
                       "tests/test_gguf_families.py reads them.",
             "token_ids": TOKEN_IDS, "models": {}}
    for spec in SPECS:
        path = write_tiny_gguf(spec, out / spec.name)
        index["models"][spec.name] = asdict(spec)
        print(f"{path}: {path.stat().st_size} bytes")
    (out / "models.json").write_text(json.dumps(index, indent=1) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------- reference


def reference(folder: Path, fixture: Path) -> None:
    """transformers' float32 logits of TOKEN_IDS for every file listed in ``folder/models.json``."""
    import gguf
    import numpy as np
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    index = json.loads((folder / "models.json").read_text(encoding="utf-8"))
    ids = index["token_ids"]
    cases = {}
    for name, spec in index["models"].items():
        model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=name, dtype=torch.float32)
        model.eval()
        with torch.no_grad():
            plain = model(torch.tensor([ids])).logits[0].numpy().astype(np.float64)
        how = (f"AutoModelForCausalLM.from_pretrained(gguf_file=...) -> {type(model).__name__} "
               f"(transformers reads, de-permutes and runs the file itself)")
        case: dict[str, Any] = {}
        if spec["arch"] == "gemma3" and spec.get("head_dim") and spec["head_dim"] != 256:
            # transformers' GGUF mapping leaves query_pre_attn_scalar at Gemma3TextConfig's 256;
            # llama.cpp scales by 1/sqrt(key_length) (every size but 27B), as the 270M's 256 does.
            config = copy.deepcopy(model.config)
            config.query_pre_attn_scalar = spec["head_dim"]
            rebuilt = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
            missing, unexpected = rebuilt.load_state_dict(model.state_dict(), strict=False)
            if [m for m in missing if "rotary" not in m] or unexpected:
                sys.exit(f"{name}: state dict mismatch: missing {missing}, unexpected {unexpected}")
            model = rebuilt.eval()
            with torch.no_grad():
                plain = model(torch.tensor([ids])).logits[0].numpy().astype(np.float64)
            how = (f"{type(model).__name__} from the HF config transformers read from the GGUF file (layer_types "
                   f"{config.layer_types}, sliding_window {config.sliding_window}) with query_pre_attn_scalar set to "
                   f"the key length {spec['head_dim']} (its GGUF mapping leaves Gemma3TextConfig's 256), and the "
                   "weights transformers read (norms minus 1) from the file")
        logits = plain
        if spec["rope_scaling"] or spec["hf_model_type"]:
            # transformers' GGUF mapping drops llama.rope.scaling.* and rope_freqs.weight: same
            # weights, a config that states the scaling, HF's own RoPE parameter functions.
            # A Mistral file: llama.cpp writes it as 'llama'; transformers maps a 'llama' file to
            # Mistral only when general.name is exactly 'mistral' and then fails on gguf >= 0.17
            # (no 'mistral' in gguf.MODEL_ARCH_NAMES), so the weights go into MistralForCausalLM.
            config = copy.deepcopy(model.config)
            if spec["hf_model_type"]:
                keep = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                        "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps",
                        "tie_word_embeddings")
                config = AutoConfig.for_model(spec["hf_model_type"], sliding_window=None,
                                              **{k: getattr(model.config, k) for k in keep})
            config.rope_parameters = {"rope_type": "default", "rope_theta": spec["rope_base"], **spec["rope_scaling"]}
            scaled = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
            missing, unexpected = scaled.load_state_dict(model.state_dict(), strict=False)
            if [m for m in missing if "rotary" not in m] or unexpected:
                sys.exit(f"{name}: state dict mismatch: missing {missing}, unexpected {unexpected}")
            scaled.eval()
            with torch.no_grad():
                logits = scaled(torch.tensor([ids])).logits[0].numpy().astype(np.float64)
            how = (f"{type(scaled).__name__} from an HF config with rope_parameters={config.rope_parameters} "
                   f"and the weights transformers read (and de-permuted) from the GGUF file as "
                   f"{type(model).__name__}: " + ("its GGUF loader ignores RoPE scaling" if spec["rope_scaling"] else
                                                  "its GGUF loader cannot build Mistral with gguf 0.19"))
            if spec["rope_scaling"]:
                case["unscaled_max_abs_delta_logit"] = float(np.abs(plain - logits).max())
        used = scaled if logits is not plain else model
        case.update({"how": how, "model_class": type(used).__name__, "logit_scale": float(np.abs(logits).max()),
                     "logits": logits.astype(np.float32).round(6).tolist()})
        cases[name] = case
        extra = f", unscaled differs by {case['unscaled_max_abs_delta_logit']:.3g}" if spec["rope_scaling"] else ""
        print(f"{name}: {case['model_class']}, logits up to {case['logit_scale']:.3g}{extra}")
    payload = {
        "_about": "Logits (float32, every position and vocabulary entry) of Hugging Face transformers for the "
                  "tiny GGUF files of tests/fixtures/tiny_gguf, regenerated with benchmarks/make_tiny_models.py "
                  "(reference step). transformers reads, de-permutes and runs each file with its own code; for "
                  "RoPE scaling, which its GGUF loader ignores, the model is rebuilt from an HF config stating the "
                  "scaling (rope_parameters) with the weights transformers read (see each case's 'how'). "
                  "tests/test_gguf_families.py checks kvasym's numpy forward pass against it.",
        "reference": f"transformers {transformers.__version__}, torch {torch.__version__}, "
                     f"gguf {getattr(gguf, '__version__', None) or _version('gguf')}, numpy {np.__version__}",
        "token_ids": ids,
        "cases": cases,
    }
    fixture.write_text(json.dumps(payload) + "\n", encoding="utf-8")
    print(f"-> {fixture}")


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="step", required=True)
    a = sub.add_parser("models", help="write the tiny GGUF files (project environment)")
    a.add_argument("--out", type=Path, default=Path("tests/fixtures/tiny_gguf"))
    b = sub.add_parser("reference", help="transformers' logits and the fixture (reference environment)")
    b.add_argument("--models", type=Path, default=Path("tests/fixtures/tiny_gguf"))
    b.add_argument("--fixture", type=Path, default=Path("tests/expected/tiny_models_reference.json"))
    args = parser.parse_args(argv)
    if args.step == "models":
        models(args.out)
    else:
        reference(args.models, args.fixture)


if __name__ == "__main__":
    main()
