"""Gemma 3 (``general.architecture = gemma3``) in the numpy forward pass (issue 47, point 1).

The tiny random-weight fixture is checked against transformers in ``test_gguf_families.py``
with the other families; here: that each Gemma feature is what makes that match (removing one
moves the logits far beyond the tolerance), the sliding-window attention against a brute-force
masked softmax (plain, own-position and banded reads), the refusals, the chunked model file's
assembly, and the real Gemma 3 270M file against transformers' logits and tokenizer on a text
longer than its 512-token window (``tests/expected/gemma3_270m_reference.json``, made by
``benchmarks/make_gemma_reference.py``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from kvasym.errors import KvasymError  # noqa: E402
from kvasym.real import RealExtraMissing, TEXTS_DIR  # noqa: E402
from kvasym.real import model_files  # noqa: E402
from kvasym.real.gguf_model import (  # noqa: E402
    GGUFLlama,
    ModelConfig,
    gelu_tanh,
    file_sha256,
    gemma3_sliding_layers,
    logit_block_rows,
)

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "tiny_gguf" / "gemma3_swa_q5_0.gguf"
TINY_REFERENCE = json.loads((ROOT / "tests" / "expected" / "tiny_models_reference.json").read_text(encoding="utf-8"))
REAL_REFERENCE = json.loads((ROOT / "tests" / "expected" / "gemma3_270m_reference.json").read_text(encoding="utf-8"))
_spec = importlib.util.spec_from_file_location("make_tiny_models", ROOT / "benchmarks" / "make_tiny_models.py")
make_tiny_models = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = make_tiny_models
_spec.loader.exec_module(make_tiny_models)

# The tiny case's tolerance in test_gguf_families (5e-5 of its largest logit, 70.4): 3.5e-3.
TINY_TOLERANCE = 5e-5 * TINY_REFERENCE["cases"]["gemma3_swa_q5_0.gguf"]["logit_scale"]


@pytest.fixture(scope="module")
def tiny() -> GGUFLlama:
    return GGUFLlama.load(FIXTURE)


def _tiny_delta(model: GGUFLlama) -> float:
    ids = np.asarray(TINY_REFERENCE["token_ids"], dtype=np.int64)
    ours = model.logits(model.forward(ids).hidden).astype(np.float64)
    return float(np.abs(ours - np.asarray(TINY_REFERENCE["cases"]["gemma3_swa_q5_0.gguf"]["logits"])).max())


def test_tiny_gemma3_reads_as_gemma3(tiny) -> None:
    c = tiny.config
    assert c.architecture == "gemma3" and c.head_dim == 32 and c.d_model // c.n_heads == 16
    assert c.sliding_layers == (0, 1, 2, 3, 4) and c.sliding_window == 4
    assert c.embedding_scale == 8.0 and c.qk_norm and c.sandwich_norms and c.ffn_activation == "gelu_tanh"
    assert c.scale == pytest.approx(1 / np.sqrt(32)) and c.rope_base == 1e6 and c.rope_base_sliding == 1e4
    assert [c.layer_rope_base(i) for i in (4, 5)] == [1e4, 1e6]
    assert tiny.tied_output and tiny.layers[0].q_norm.shape == (32,)
    assert _tiny_delta(tiny) <= TINY_TOLERANCE


@pytest.mark.parametrize("changes", [
    {"sliding_window": 0, "sliding_layers": ()},  # full attention on every layer
    {"sliding_layers": (0, 1, 2, 3, 4, 5)},  # the global layer windowed too
    {"rope_base_sliding": None},  # the global base on the sliding layers
    {"embedding_scale": 1.0},
    {"ffn_activation": "silu"},
    {"attention_scale": 1 / 16},  # HF's default query_pre_attn_scalar 256, not the key length
])
def test_each_gemma_feature_makes_the_match(tiny, changes) -> None:
    """Without any one feature the tiny model is far (over 100x the tolerance) from transformers."""
    assert _tiny_delta(tiny.with_config(**changes)) > 100 * TINY_TOLERANCE


@pytest.mark.parametrize("drop", ["q_norm", "post_attn_norm", "post_ffn_norm"])
def test_each_gemma_norm_makes_the_match(tiny, drop) -> None:
    clone = object.__new__(GGUFLlama)
    clone.__dict__.update(tiny.__dict__)
    clone.layers = [dataclasses.replace(layer, **{drop: None}, **({"k_norm": None} if drop == "q_norm" else {}))
                    for layer in tiny.layers]
    assert _tiny_delta(clone) > 100 * TINY_TOLERANCE


def test_gelu_tanh_against_its_closed_form() -> None:
    x = np.linspace(-6, 6, 101)
    from math import erf, sqrt

    exact = np.array([0.5 * v * (1 + erf(v / sqrt(2))) for v in x])
    assert np.abs(gelu_tanh(x) - exact).max() < 1e-3  # the tanh form's known error, ~3e-4 at most
    assert gelu_tanh(np.array([0.0]))[0] == 0.0 and gelu_tanh(np.array([10.0]))[0] == pytest.approx(10.0)


def test_sliding_layers_follow_the_pattern_of_six() -> None:
    assert [i for i in range(18) if i not in gemma3_sliding_layers(18)] == [5, 11, 17]


def test_logit_blocks_shrink_with_the_vocabulary() -> None:
    assert logit_block_rows(49152) == 512 and logit_block_rows(300) == 512
    assert logit_block_rows(262144) == 96 and logit_block_rows(10**9) == 1


# --------------------------------------------------------------------------- sliding windows


def _brute(q, k, v, scale, window, k_exact=None, v_exact=None, starts=None):
    """Causal GQA softmax attention, one query at a time, float64: query ``i`` reads keys
    ``max(0, i - window + 1)..i`` (every earlier key when window is 0); keys ``starts[i]..i``
    from the exact arrays."""
    n_heads, n, hd = q.shape
    group = n_heads // k.shape[0]
    out = np.zeros_like(q, dtype=np.float64)
    for h in range(n_heads):
        kv = h // group
        for i in range(n):
            lo = max(0, i - window + 1) if window else 0
            keys = k[kv, lo:i + 1].astype(np.float64).copy()
            values = v[kv, lo:i + 1].astype(np.float64).copy()
            if starts is not None:
                for j in range(max(lo, starts[i]), i + 1):
                    keys[j - lo], values[j - lo] = k_exact[kv, j], v_exact[kv, j]
            logits = keys @ q[h, i] * scale
            p = np.exp(logits - logits.max())
            out[h, i] = (p / p.sum()) @ values
    return out


def _attention_model(n_kv: int, group: int, hd: int) -> GGUFLlama:
    model = object.__new__(GGUFLlama)
    model.config = ModelConfig(n_layers=1, d_model=n_kv * group * hd, n_heads=n_kv * group, n_kv_heads=n_kv,
                               head_dim=hd, ffn_dim=8, vocab_size=8, context_length=4096, rope_base=1e4,
                               rms_eps=1e-6)
    return model


@pytest.mark.parametrize("n, window", [(40, 7), (1100, 512), (600, 512), (9, 20)])
def test_windowed_attention_against_brute_force(monkeypatch, n, window) -> None:
    """Plain, own-position and banded reads with a sliding window (several query blocks: 1100
    tokens in blocks of 512 read keys from 512 - 511 on) equal the brute-force masked softmax."""
    from kvasym.real import gguf_model

    if n < 100:  # small blocks so that the window crosses block boundaries
        monkeypatch.setattr(gguf_model, "QUERY_BLOCK_ROWS", 8)
    rng = np.random.default_rng(n + window)
    model = _attention_model(1, 2, 8)
    q = rng.standard_normal((2, n, 8))
    k, v, k_exact, v_exact = (rng.standard_normal((1, n, 8)) for _ in range(4))
    future = np.arange(n)[None, :] > np.arange(n)[:, None]
    scale = np.asarray(0.4)
    plain = model._attention(q, k, v, future, scale, window=window)
    np.testing.assert_allclose(plain, _brute(q, k, v, 0.4, window), rtol=1e-10, atol=1e-12)
    own = model._attention(q, k, v, future, scale, (k_exact, v_exact), window=window)
    np.testing.assert_allclose(own, _brute(q, k, v, 0.4, window, k_exact, v_exact, np.arange(n)),
                               rtol=1e-10, atol=1e-12)
    for recent in (3, window + 5):  # a band inside the window, and one the window cuts
        starts = np.maximum(0, np.arange(n) - recent + 1)
        banded = model._attention(q, k, v, future, scale, (k_exact, v_exact), starts, window=window)
        np.testing.assert_allclose(banded, _brute(q, k, v, 0.4, window, k_exact, v_exact, starts),
                                   rtol=1e-10, atol=1e-12)


def test_window_wider_than_the_text_is_full_attention() -> None:
    rng = np.random.default_rng(3)
    model = _attention_model(2, 2, 4)
    q, k, v = rng.standard_normal((4, 30, 4)), rng.standard_normal((2, 30, 4)), rng.standard_normal((2, 30, 4))
    future = np.arange(30)[None, :] > np.arange(30)[:, None]
    np.testing.assert_array_equal(model._attention(q, k, v, future, np.asarray(0.5), window=30),
                                  model._attention(q, k, v, future, np.asarray(0.5)))


def test_an_unresolved_frame_is_refused(tiny) -> None:
    """A caller that forgets frame.at(layer) would give sliding layers full attention: refused."""
    ids = np.arange(6)
    frame = tiny.sequence_frame(ids)
    acts = tiny.attention_inputs(0, tiny.embed(ids), frame)
    with pytest.raises(KvasymError, match=r"frame\.at\(layer\)"):
        tiny.attention(acts.q, acts.k, acts.v, frame)
    assert frame.at(0).window == 4 and frame.at(5).window == 0
    assert not np.array_equal(frame.at(0).cos, frame.at(5).cos)  # 1e4 and 1e6 bases


# --------------------------------------------------------------------------- refusals


def _write_gemma(tmp_path: Path, **spec) -> Path:
    base = dict(arch="gemma3", n_kv_heads=1, n_layers=6, head_dim=32, sliding_window=4, rope_base=1e6,
                rms_eps=1e-6)
    tiny = make_tiny_models.TinySpec(name="case.gguf", **{**base, **spec})
    return make_tiny_models.write_tiny_gguf(tiny, tmp_path / tiny.name)


@pytest.mark.parametrize("spec, fragments", [
    ({"extra_kv": {"gemma3.final_logit_softcapping": 30.0}}, ("gemma3.final_logit_softcapping = 30.0",)),
    ({"sliding_window": 0}, ("gemma3.attention.sliding_window = 0",)),
    ({"extra_kv": {"gemma3.attention.sliding_window_pattern": 4}}, ("gemma3.attention.sliding_window_pattern = 4",)),
    ({"drop": ("blk.2.attn_k_norm.weight",)}, ("tensor 'blk.2.attn_k_norm.weight' is missing",)),
    ({"drop": ("blk.0.post_ffw_norm.weight",)}, ("tensor 'blk.0.post_ffw_norm.weight' is missing",)),
])
def test_gemma3_refusals_are_one_line(tmp_path, spec, fragments) -> None:
    with pytest.raises(KvasymError) as info:
        GGUFLlama.load(_write_gemma(tmp_path, **spec))
    message = str(info.value)
    assert "\n" not in message and all(f in message for f in fragments), message


def test_the_pattern_of_six_when_stated_is_accepted(tmp_path) -> None:
    model = GGUFLlama.load(_write_gemma(tmp_path, extra_kv={"gemma3.attention.sliding_window_pattern": 6}))
    assert model.config.sliding_layers == (0, 1, 2, 3, 4)


# --------------------------------------------------------------------------- the chunked file


@pytest.fixture
def chunked(tmp_path, monkeypatch) -> model_files.ChunkedModel:
    """A three-chunk model in three throw-away packages on sys.path."""
    payload = bytes(range(256)) * 1000 + b"tail"
    pieces = [payload[:100_000], payload[100_000:200_003], payload[200_003:]]
    chunks = []
    for i, piece in enumerate(pieces):
        package = tmp_path / "site" / f"kvasym_test_chunk{i}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("raise RuntimeError('chunk packages are not imported')\n")
        (package / "data" / f"m.gguf.part{i}").write_bytes(piece)
        chunks.append((package.name, f"m.gguf.part{i}"))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return model_files.ChunkedModel(name="Test", filename="m.gguf", size_bytes=len(payload),
                                    sha256=hashlib.sha256(payload).hexdigest(), chunks=tuple(chunks),
                                    install="pip install test", licence="none")


def test_chunks_assemble_into_the_published_file(tmp_path, chunked) -> None:
    out = tmp_path / "results" / "models"
    path = model_files.assemble(out, chunked)
    assert path == out / "m.gguf" and file_sha256(path) == chunked.sha256
    assert sorted(p.name for p in out.iterdir()) == ["m.gguf"]  # no partial file left
    mtime = path.stat().st_mtime_ns
    assert model_files.assemble(out, chunked) == path and path.stat().st_mtime_ns == mtime  # reused, not rewritten


def test_wrong_chunks_leave_nothing_behind(tmp_path, chunked) -> None:
    wrong = dataclasses.replace(chunked, sha256="0" * 64)
    out = tmp_path / "models"
    with pytest.raises(KvasymError, match="not the published"):
        model_files.assemble(out, wrong)
    assert list(out.iterdir()) == []


def test_a_users_file_in_the_way_is_refused_and_kept(tmp_path, chunked) -> None:
    out = tmp_path / "models"
    out.mkdir()
    (out / "m.gguf").write_bytes(b"my own file")
    with pytest.raises(KvasymError, match="exists but is not"):
        model_files.assemble(out, chunked)
    assert (out / "m.gguf").read_bytes() == b"my own file"


def test_a_missing_chunk_package_names_it(chunked) -> None:
    gone = dataclasses.replace(chunked, chunks=(*chunked.chunks, ("kvasym_no_such_chunk", "x")))
    with pytest.raises(RealExtraMissing, match="kvasym_no_such_chunk.*pip install test"):
        model_files.chunk_paths(gone)
    assert not model_files.is_installed(gone) and model_files.is_installed(chunked)


# --------------------------------------------------------------------------- the real file

SKIP_REASON = ("GEMMA 3 270M NOT INSTALLED: the real-file checks of the gemma3 forward pass are skipped ({why})")


@pytest.fixture(scope="module")
def gemma(tmp_path_factory) -> GGUFLlama:
    """Gemma 3 270M, assembled from its chunk packages into a temporary folder and loaded (~7 s)."""
    try:
        path = model_files.assemble(tmp_path_factory.mktemp("models"))
    except RealExtraMissing as exc:
        message = SKIP_REASON.format(why=exc)
        print(f"\n*** {message} ***", file=sys.stderr)
        pytest.skip(message)
    return GGUFLlama.load(path)


def test_real_file_is_gemma3_270m(gemma) -> None:
    c = gemma.config
    assert (c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim, c.vocab_size) == \
        (18, 640, 4, 1, 256, 2048, 262144)
    assert c.sliding_window == 512 and [i for i in range(18) if not c.is_sliding(i)] == [5, 11, 17]
    assert c.scale == 1 / 16 and c.rope_base == 1e6 and gemma.tied_output
    assert set(gemma.metadata["tensor_types"]) == {"F32", "Q5_0", "Q8_0", "Q4_K", "Q6_K"}
    assert gemma.model_sha256 == model_files.GEMMA3_270M.sha256


def test_real_tokenizer_matches_transformers(gemma) -> None:
    """The SentencePiece tokenizer rebuilt from the file gives transformers' ids, BOS included."""
    text = "\n\n".join((TEXTS_DIR / f"{t}.txt").read_text(encoding="utf-8") for t in REAL_REFERENCE["texts"])
    ids = gemma.encode(text)
    ref = REAL_REFERENCE["token_ids"]
    assert ids[0] == 2 and ids[: len(ref)].tolist() == ref


def test_real_logits_match_transformers_past_the_window(gemma) -> None:
    """Logits of 1,100 positions (past the 512-token window of 15 of 18 layers): log-partition
    and checked logits within 2e-4 of the logit scale of transformers', argmax equal wherever
    transformers' top two logits are further apart than that."""
    ids = np.asarray(REAL_REFERENCE["token_ids"], dtype=np.int64)
    hidden = gemma.forward(ids).hidden
    tolerance = 2e-4 * REAL_REFERENCE["logit_scale"]
    lse = np.empty(ids.size)
    top = np.empty(ids.size, dtype=np.int64)
    rows = logit_block_rows(gemma.config.vocab_size)
    checked = {c["position"]: c for c in REAL_REFERENCE["checked"]}
    worst = 0.0
    for start in range(0, ids.size, rows):
        logits = gemma.logits(hidden[start:start + rows]).astype(np.float64)
        peak = logits.max(axis=1)
        lse[start:start + rows] = peak + np.log(np.exp(logits - peak[:, None]).sum(axis=1))
        top[start:start + rows] = logits.argmax(axis=1)
        for p in range(start, min(start + rows, ids.size)):
            if p in checked:
                got = logits[p - start, checked[p]["vocab"]]
                worst = max(worst, float(np.abs(got - np.asarray(checked[p]["logits"])).max()))
    assert worst <= tolerance, f"checked logits off by {worst:.3g} > {tolerance:.3g}"
    assert np.abs(lse - np.asarray(REAL_REFERENCE["lse"])).max() <= tolerance
    clear = np.asarray(REAL_REFERENCE["top_gap"]) > 2 * tolerance
    assert clear.sum() > 0.9 * ids.size
    np.testing.assert_array_equal(top[clear], np.asarray(REAL_REFERENCE["argmax"])[clear])


def test_the_window_is_what_makes_the_real_match_past_512(gemma) -> None:
    """With the window opened (local RoPE kept), positions before 512 are unchanged and later
    ones move far beyond the tolerance: the 1,100-token check does test the sliding window.
    (Measured: ours within 5.3e-5 of the checked logits and 7.7e-5 of the log-partition, logit
    scale 37.8, transformers 5.25 / torch 2.13 CPU.)"""
    ids = np.asarray(REAL_REFERENCE["token_ids"], dtype=np.int64)
    opened = gemma.with_config(sliding_window=10**6)
    windowed, full = gemma.forward(ids).hidden, opened.forward(ids).hidden
    np.testing.assert_array_equal(windowed[:512], full[:512])
    late = [c for c in REAL_REFERENCE["checked"] if c["position"] >= 600]
    positions = [c["position"] for c in late]
    logits = opened.logits(full[positions]).astype(np.float64)
    delta = max(float(np.abs(logits[i, c["vocab"]] - np.asarray(c["logits"])).max()) for i, c in enumerate(late))
    assert delta > 100 * 2e-4 * REAL_REFERENCE["logit_scale"], delta


# --------------------------------------------------------------------------- chunked next-token measures


@pytest.mark.parametrize("held", [True, False])
@pytest.mark.parametrize("block_rows", [1, 5, 10**9])
def test_chunked_next_token_measures_equal_the_whole_matrix(tiny, monkeypatch, block_rows, held) -> None:
    """KL(p || p_hat), NLL and top-1 formed in blocks of 1, 5 and all positions, with the
    reference's probabilities held or formed per block, equal a direct float64 evaluation over
    the whole (T - 1, vocab) matrices (scipy's log_softmax)."""
    from scipy.special import log_softmax

    from kvasym.real import endtoend

    monkeypatch.setattr(endtoend, "METRIC_BLOCK_ROWS", block_rows)
    monkeypatch.setattr(endtoend, "PROBS_HELD_BYTES", 2**40 if held else 0)
    ids = np.asarray(TINY_REFERENCE["token_ids"], dtype=np.int64)
    ref = endtoend.reference_pass(tiny, ids)
    assert (ref.probs is not None) == held
    hidden = tiny.forward(ids).hidden
    noisy = hidden + np.random.default_rng(5).standard_normal(hidden.shape).astype(hidden.dtype) * 4.0
    got = endtoend.next_token_metrics(tiny, ref, noisy[:-1])
    log_p = log_softmax(tiny.logits(hidden[:-1]).astype(np.float64), axis=1)
    log_q = log_softmax(tiny.logits(noisy[:-1]).astype(np.float64), axis=1)
    kl = (np.exp(log_p) * (log_p - log_q)).sum(axis=1)
    assert np.median(kl) > 1e-3  # the perturbation moves most positions (some are peaked at one token)
    # lse comes from float32 exponentials summed in float64 (endtoend.log_partition): absolute
    # error ~1e-7 of the logit scale (70 here), which KL's "- lse + lse_hat" carries.
    np.testing.assert_allclose(got["kl"], kl, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(got["nll"], -log_q[np.arange(ids.size - 1), ids[1:]], rtol=1e-6)
    np.testing.assert_array_equal(got["top1"], log_p.argmax(axis=1) == log_q.argmax(axis=1))
    if held:  # the held probabilities and the per-block ones are the same numbers
        np.testing.assert_array_equal(ref.probs[2:7], endtoend._probabilities(ref.logits[2:7], ref.lse[2:7]))


def test_a_sliding_layers_float16_rows_are_a_share_of_its_window(tiny) -> None:
    """With a 2-token float16 window, a sliding layer (window 4) holds 4 rows of which 2 are float16,
    a global layer 12 of which 2: the side bits gain 2 (16 - b) / 4 and 2 (16 - b) / 12."""
    from kvasym.real.endtoend import CacheQuantization, quantized_cache
    from kvasym.schemes import get_scheme

    ids = np.asarray(TINY_REFERENCE["token_ids"], dtype=np.int64)
    frame = tiny.sequence_frame(ids)
    x = tiny.embed(ids)
    gained = {}
    for layer in range(6):
        acts = tiny.attention_inputs(layer, x, frame)
        if layer in (0, 5):
            plain, windowed = [], []
            for recent, out in ((0, plain), (2, windowed)):
                quant = CacheQuantization(scheme=get_scheme("RKV"), budget=3, base_seed=7, text="t",
                                          recent_tokens=recent)
                quantized_cache(tiny, layer, acts.k, acts.k_pre_rope, acts.v, quant, out)
            b = plain[0]["k_bits_payload"] + plain[0]["k_bits_side"]
            gained[layer] = (windowed[0]["k_bits_side"] - plain[0]["k_bits_side"]) / (16 - b)
        x = tiny.finish_layer(layer, x, tiny.attention(acts.q, acts.k, acts.v, frame.at(layer)))
    assert gained[0] == pytest.approx(2 / 4) and gained[5] == pytest.approx(2 / 12)


# --------------------------------------------------------------------------- captures of a windowed model


def test_a_capture_masks_each_layer_as_the_model_attends(tiny) -> None:
    """The capture's per-layer mask reproduces the model's windowed attention on a sliding layer
    and its full causal attention on the global one; pre-RoPE keys re-rotate with each layer's
    base; the per-head evaluation runs on both kinds of layer."""
    from kvasym.real.capture import capture_text
    from kvasym.real.evaluate import evaluate_capture
    from kvasym.real.gguf_model import apply_rope, rope_tables
    from kvasym.schemes import get_scheme

    cap = capture_text(tiny, tiny.decode(TINY_REFERENCE["token_ids"]), name="t")
    n = cap.positions.size
    assert n > tiny.config.sliding_window
    for layer in (0, 5):
        mask = cap.causal_mask(layer)
        window = 4 if layer == 0 else n
        assert mask.sum(axis=1).tolist() == [min(i + 1, window) for i in range(n)]
        q = cap.q_post_rope[layer].astype(np.float64)
        k, v = cap.k_post_rope[layer].astype(np.float64), cap.v[layer].astype(np.float64)
        logits = np.where(mask, q @ k[0].T * tiny.config.scale, -np.inf)  # one KV head
        p = np.exp(logits - logits.max(axis=-1, keepdims=True))
        brute = (p / p.sum(axis=-1, keepdims=True)) @ v[0]
        future = np.arange(n)[None, :] > np.arange(n)[:, None]
        model_out = tiny._attention(q, k, v, future, np.asarray(tiny.config.scale), window=4 if layer == 0 else 0)
        np.testing.assert_allclose(brute, model_out, rtol=1e-10, atol=1e-12)
        cos, sin = rope_tables(cap.positions, 32, cap.rope_base(layer), np.float64)
        np.testing.assert_allclose(apply_rope(cap.k_pre_rope[layer].astype(np.float64), cos, sin),
                                   cap.k_post_rope[layer], rtol=1e-5, atol=1e-5)
    assert cap.rope_base(0) == 1e4 and cap.rope_base(5) == 1e6
    assert cap.causal_mask().sum() == n * (n + 1) // 2  # no layer: the plain causal mask
    for rope in ("post", "pre"):
        columns = evaluate_capture(cap, [get_scheme("RKV")], [3], name="t", base_seed=7, layers=[0, 5], rope=rope)
        assert set(columns["layer"]) == {0, 5} and np.isfinite(columns["kl"]).all()


def test_card_cli_on_the_tiny_gemma3(tmp_path) -> None:
    """The whole card on the tiny Gemma 3 file (one KV head, sliding layers): written, with the
    window in its model entry and one allocation unit per layer and side."""
    import pandas as pd

    from kvasym.cli import main

    out = tmp_path / "card"
    assert main(["card", str(FIXTURE), "--out", str(out), "--tokens", "16", "--budgets", "2", "--widths", "1", "2",
                 "3", "--frontier-schemes", "KV"]) == 0
    card = json.loads((out / "card.json").read_text())
    assert card["model"]["architecture"] == "gemma3" and card["model"]["sliding_layers"] == [0, 1, 2, 3, 4]
    allocation = pd.read_parquet(out / "allocation.parquet")
    assert len(allocation) == 6 * 2 and allocation["mean_bits"].iloc[0] <= allocation["target_bits"].iloc[0] + 1e-12


# --------------------------------------------------------------------------- BOS in built sequences


@pytest.fixture
def tiny_with_bos(tiny, monkeypatch) -> GGUFLlama:
    """The tiny fixture with its tokenizer told to start every sequence with BOS (Gemma 3's policy,
    GGUF key tokenizer.ggml.add_bos_token = true)."""
    monkeypatch.setattr(tiny.tokenizer, "add_bos", True)
    return tiny


def test_a_passkey_prompt_has_one_bos_at_its_start(tiny, tiny_with_bos) -> None:
    """Each piece of the prompt is tokenized alone: BOS only before the first, none before the
    answer's digits (a BOS model's key was refused as six tokens, BOS among them, before)."""
    from kvasym.real.passkey import ANSWER_DIGITS, make_trial

    bos = tiny_with_bos.tokenizer.bos_token_id
    trial = make_trial(tiny_with_bos, 250, 0.5, 3, base_seed=7)
    assert trial.prompt_ids[0] == bos and int((trial.prompt_ids == bos).sum()) == 1
    assert trial.prompt_ids.size == 250 - ANSWER_DIGITS and bos not in trial.answer_ids
    assert tiny_with_bos.decode(trial.answer_ids) == str(trial.key)
    # the same trial without BOS is the BOS model's with its first token dropped and one more filler token
    tiny_with_bos.tokenizer.add_bos = False
    plain = make_trial(tiny, 250, 0.5, 3, base_seed=7)
    assert plain.key == trial.key and np.array_equal(plain.answer_ids, trial.answer_ids)
    assert plain.filler_tokens == trial.filler_tokens + 1


def test_long_context_windows_start_with_bos_on_a_bos_model(tiny, tiny_with_bos) -> None:
    from kvasym.real.longcontext import bos_id, sequence_windows

    tokens = np.arange(12, dtype=np.int64).reshape(3, 4) + 10
    with_bos = sequence_windows(tiny_with_bos, tokens)
    assert bos_id(tiny_with_bos) == tiny_with_bos.tokenizer.bos_token_id
    assert (with_bos[:, 0] == bos_id(tiny_with_bos)).all() and np.array_equal(with_bos[:, 1:], tokens[:, 1:])
    assert tokens[0, 0] == 10  # the caller's array is not changed
    tiny_with_bos.tokenizer.add_bos = False
    assert bos_id(tiny) is None and sequence_windows(tiny, tokens) is tokens


def test_real_gemma_passkey_prompt(gemma) -> None:
    """On the real file (BOS required): one BOS, the key's five digits one token each."""
    from kvasym.real.passkey import make_trial

    trial = make_trial(gemma, 1024, 0.5, 0, base_seed=20261130)
    bos = gemma.tokenizer.bos_token_id
    assert gemma.tokenizer.add_bos and trial.prompt_ids[0] == bos and int((trial.prompt_ids == bos).sum()) == 1
    assert trial.prompt_ids.size == 1019 and gemma.decode(trial.answer_ids) == str(trial.key)
