"""ModelConfig validation, layer kernels and the full forward against float64 NumPy references, KV-cache decoding."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import layer_stack, layers, transformer
from models.config import ModelConfig, active_params_per_token, flops_per_token, num_params

jax.config.update("jax_default_matmul_precision", "highest")

F64 = np.float64


# ---- float64 NumPy references ----------------------------------------------------------------------------------------
def np_rms_norm(x, scale, eps=1e-6):
    x = np.asarray(x, F64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * np.asarray(scale, F64)


def np_rope(x, positions, theta):
    x = np.asarray(x, F64)
    out = np.empty_like(x)
    half = x.shape[-1] // 2
    for i in range(half):
        angle = np.asarray(positions, F64)[..., None] * theta ** (-i / half)  # [B, T, 1]
        a, b = x[..., i], x[..., i + half]
        out[..., i] = a * np.cos(angle) - b * np.sin(angle)
        out[..., i + half] = b * np.cos(angle) + a * np.sin(angle)
    return out


def np_attention(p, x, positions, allowed, theta, eps=1e-6):
    """Loop over batch and heads; allowed[b, t, s] says query t may see key s. Optional q/k/v biases and q/k norm."""
    x = np.asarray(x, F64)
    wq, wk, wv, wo = (np.asarray(p[n], F64) for n in ("wq", "wk", "wv", "wo"))
    q, k, v = np.einsum("btd,dnh->btnh", x, wq), np.einsum("btd,dkh->btkh", x, wk), np.einsum("btd,dkh->btkh", x, wv)
    if "bq" in p:
        q, k, v = q + np.asarray(p["bq"], F64), k + np.asarray(p["bk"], F64), v + np.asarray(p["bv"], F64)
    if "q_norm" in p:
        q, k = np_rms_norm(q, p["q_norm"], eps), np_rms_norm(k, p["k_norm"], eps)
    q, k = np_rope(q, positions, theta), np_rope(k, positions, theta)
    B, T, N, H = q.shape
    group = N // k.shape[2]
    out = np.zeros_like(q)
    for b in range(B):
        for n in range(N):
            for t in range(T):
                keys = [s for s in range(T) if allowed[b, t, s]]
                if not keys:
                    continue
                scores = np.array([q[b, t, n] @ k[b, s, n // group] for s in keys]) / math.sqrt(H)
                w = np.exp(scores - scores.max())
                w /= w.sum()
                out[b, t, n] = sum(wi * v[b, s, n // group] for wi, s in zip(w, keys))
    return np.einsum("btnh,nhd->btd", out, wo)


def np_silu(x):
    return x / (1 + np.exp(-x))


def np_swiglu(p, x):
    x = np.asarray(x, F64)
    g, u = x @ np.asarray(p["w_gate"], F64), x @ np.asarray(p["w_up"], F64)
    return (np_silu(g) * u) @ np.asarray(p["w_down"], F64)


def np_moe(p, x, k, norm_topk_prob=True):
    """Dropless MoE on [..., D] by looping over tokens and their chosen experts."""
    shape = x.shape
    x = np.asarray(x, F64).reshape(-1, shape[-1])
    logits = x @ np.asarray(p["router"], F64)
    out = np.zeros_like(x)
    for n in range(x.shape[0]):
        probs = np.exp(logits[n] - logits[n].max())
        probs /= probs.sum()
        top = np.argsort(-probs, kind="stable")[:k]
        for e in top:
            expert = {name: np.asarray(p[name][e], F64) for name in ("w_gate", "w_up", "w_down")}
            weight = probs[e] / probs[top].sum() if norm_topk_prob else probs[e]
            out[n] += weight * np_swiglu(expert, x[n])
    return out.reshape(shape)


def np_forward(params, tokens, cfg, positions, allowed):
    params = layer_stack.per_layer(params, cfg)  # the reference runs block by block
    x = np.asarray(params["embed"], F64)[np.asarray(tokens)]
    for i in range(cfg.n_layers):
        p = params[f"block_{i}"]
        eps = cfg.norm_eps
        x = x + np_attention(p["attn"], np_rms_norm(x, p["attn_norm"], eps), positions, allowed, cfg.rope_theta, eps)
        h = np_rms_norm(x, p["mlp_norm"], eps)
        x = x + (np_moe(p["moe"], h, cfg.experts_per_token, cfg.norm_topk_prob) if "moe" in p
                 else np_swiglu(p["mlp"], h))
    h = np_rms_norm(x, params["final_norm"], cfg.norm_eps)
    if cfg.tie_embeddings:
        scale = 1 / math.sqrt(cfg.d_model) if cfg.scale_tied_unembed else 1.0
        return h @ np.asarray(params["embed"], F64).T * scale
    return h @ np.asarray(params["unembed"], F64)


# ---- config ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("changes, field", [
    (dict(n_experts=4, experts_per_token=5), "experts_per_token"),
    (dict(n_heads=4, n_kv_heads=3), "n_heads"),
    (dict(d_model=0), "d_model"),
    (dict(vocab_size=2.5), "vocab_size"),
    (dict(head_dim=15), "head_dim"),
    (dict(capacity_factor=0.0), "capacity_factor"),
    (dict(dtype="float64"), "dtype"),
    (dict(param_dtype="int8"), "param_dtype"),
    (dict(moe_every=-1), "moe_every"),
    (dict(router_aux_coef=-0.1), "router_aux_coef"),
    (dict(rope_theta=0), "rope_theta"),
    (dict(tie_embeddings=1), "tie_embeddings"),
    (dict(attn_bias="yes"), "attn_bias"),
    (dict(qk_norm=1), "qk_norm"),
    (dict(scale_tied_unembed=None), "scale_tied_unembed"),
    (dict(norm_topk_prob=0), "norm_topk_prob"),
    (dict(n_layers=2, dense_layers=(2,)), "dense_layers"),
    (dict(dense_layers=("0",)), "dense_layers"),
    (dict(dense_layers=3), "dense_layers"),
])
def test_config_validation_names_the_field(changes, field):
    with pytest.raises(ValueError, match=field):
        ModelConfig(**changes)


def test_config_is_frozen_and_replaceable():
    cfg = ModelConfig()
    assert cfg.vocab_size == 259 and cfg.capacity_factor is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.d_model = 8
    assert dataclasses.replace(cfg, d_model=32).d_model == 32 and cfg.replace(n_layers=3).n_layers == 3
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="bogus"):
        ModelConfig.from_dict({"bogus": 1})
    with pytest.raises(ValueError, match="experts_per_token"):
        cfg.replace(experts_per_token=9)
    # block i is MoE iff (i + 1) % moe_every == 0; n_experts = 0 or moe_every = 0 means all dense
    assert ModelConfig(n_layers=4, moe_every=2).moe_layers == (1, 3)
    assert ModelConfig(n_layers=4, n_experts=0).moe_layers == ()
    assert ModelConfig(n_layers=4, moe_every=0).moe_layers == ()
    # dense_layers (HF mlp_only_layers) removes blocks from the pattern; a list becomes a sorted, hashable tuple
    mixed = ModelConfig(n_layers=4, moe_every=1, dense_layers=[2, 0])
    assert mixed.moe_layers == (1, 3) and mixed.dense_layers == (0, 2) and hash(mixed)
    assert ModelConfig.from_dict(mixed.to_dict()) == mixed


@pytest.mark.parametrize("cfg", [
    ModelConfig(),
    ModelConfig(tie_embeddings=False, n_shared_experts=2, expert_d_ff=24, moe_every=1),
    ModelConfig(n_experts=0),
    ModelConfig(attn_bias=True, qk_norm=True, n_layers=3, moe_every=1, dense_layers=(1,)),
])
def test_param_counts_match_init(cfg):
    shapes = jax.eval_shape(lambda k: transformer.init(cfg, k), jax.random.key(0))
    assert num_params(cfg) == sum(math.prod(s.shape) for s in jax.tree.leaves(shapes))
    unused_experts = (cfg.n_experts - cfg.experts_per_token) * 3 * cfg.d_model * cfg.expert_ff * len(cfg.moe_layers)
    assert active_params_per_token(cfg) == num_params(cfg) - unused_experts
    # axes tree mirrors the params tree, one name per dimension
    axes = transformer.param_axes(cfg)
    for s, a in zip(jax.tree.leaves(shapes), jax.tree.leaves(axes, is_leaf=lambda x: isinstance(x, tuple))):
        assert len(s.shape) == len(a)


def test_flops_per_token_formula():
    cfg = ModelConfig(vocab_size=512, d_model=256, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=64, d_ff=512,
                      n_experts=8, experts_per_token=2, moe_every=1, tie_embeddings=False)
    # the peers' W1 model: 13.6 M parameters, 4.2 M active per token
    assert round(num_params(cfg) / 1e6, 1) == 13.6 and round(active_params_per_token(cfg) / 1e6, 1) == 4.2
    # models/flops.py's convention: matmul weights only (no norms; the input embedding is a lookup), the LM head on
    # every position, causal attention (a token at position t sees t + 1 keys: (T + 1) / 2 on average)
    matmul = 4 * (256 * 64 * (2 * 4 + 2 * 2) + 256 * 8 + 2 * 3 * 256 * cfg.expert_ff) + 256 * 512
    attn = 12 * 4 * 4 * 64 * (96 + 1) / 2
    assert flops_per_token(cfg, 96) == pytest.approx(6 * matmul + attn, rel=1e-12)
    assert flops_per_token(cfg, 96, training=False) == pytest.approx((6 * matmul + attn) / 3, rel=1e-12)


# ---- layers ----------------------------------------------------------------------------------------------------------
def test_rms_norm_matches_numpy():
    x = np.random.default_rng(0).normal(size=(2, 3, 8)).astype(np.float32) * 3
    scale = np.random.default_rng(1).normal(size=(8,)).astype(np.float32)
    np.testing.assert_allclose(layers.rms_norm(jnp.asarray(x), jnp.asarray(scale)), np_rms_norm(x, scale),
                               rtol=1e-5, atol=1e-6)


def test_rope_matches_numpy_and_is_relative():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 5, 3, 8)).astype(np.float32)
    pos = np.array([[0, 1, 2, 3, 4], [7, 3, 100, 5, 0]])
    np.testing.assert_allclose(layers.apply_rope(jnp.asarray(x), jnp.asarray(pos), 500.0), np_rope(x, pos, 500.0),
                               rtol=1e-5, atol=1e-5)
    # a dot product of rotated vectors depends only on the position difference
    q, k = rng.normal(size=(1, 1, 1, 8)), rng.normal(size=(1, 1, 1, 8))
    dot = lambda pq, pk: float(np.sum(layers.apply_rope(jnp.asarray(q, jnp.float32), jnp.array([[pq]]), 1e4)
                                      * layers.apply_rope(jnp.asarray(k, jnp.float32), jnp.array([[pk]]), 1e4)))
    assert dot(3, 1) == pytest.approx(dot(12, 10), abs=1e-5)


def _attn_params(rng, D=16, N=4, K=2, H=8):
    return {"wq": rng.normal(size=(D, N, H)) / 4, "wk": rng.normal(size=(D, K, H)) / 4,
            "wv": rng.normal(size=(D, K, H)) / 4, "wo": rng.normal(size=(N, H, D)) / 4}


def test_grouped_query_attention_matches_numpy():
    rng = np.random.default_rng(0)
    p = _attn_params(rng)
    x = rng.normal(size=(2, 6, 16))
    pos = np.stack([np.arange(6), np.maximum(np.arange(6) - 2, 0)])
    key_mask = np.array([[1] * 6, [0, 0, 1, 1, 1, 1]], bool)  # second row left-padded
    allowed = np.tril(np.ones((6, 6), bool))[None] & key_mask[:, None, :]
    out, _ = layers.attention(jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), p), jnp.asarray(x, jnp.float32),
                              jnp.asarray(pos), jnp.asarray(allowed), rope_theta=1e4)
    ref = np_attention(p, x, pos, allowed, 1e4)
    np.testing.assert_allclose(out[0], ref[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out[1, 2:], ref[1, 2:], rtol=1e-4, atol=1e-5)  # padding queries are don't-care
    assert np.all(np.isfinite(out))


def test_swiglu_matches_numpy():
    rng = np.random.default_rng(0)
    p = {"w_gate": rng.normal(size=(8, 12)), "w_up": rng.normal(size=(8, 12)), "w_down": rng.normal(size=(12, 8))}
    x = rng.normal(size=(2, 3, 8))
    out = layers.swiglu(jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), p), jnp.asarray(x, jnp.float32))
    np.testing.assert_allclose(out, np_swiglu(p, x), rtol=1e-4, atol=1e-4)


# ---- forward ---------------------------------------------------------------------------------------------------------
# One jitted forward reused across tests (compiles once per shape and config): compilation dominates test time.
FWD = jax.jit(transformer.forward, static_argnames=("cfg", "return_hidden"))
CFG = ModelConfig(vocab_size=37, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=24, n_experts=4,
                  experts_per_token=2, moe_every=2, tie_embeddings=False)
B, T = 2, 9
# row 0 is right-padded (6 real tokens), row 1 left-padded (2 pads, then 7 real tokens)
MASK = np.array([[1] * 6 + [0] * 3, [0, 0] + [1] * 7], np.int32)
POSITIONS = np.maximum(np.cumsum(MASK, axis=1) - 1, 0)


@pytest.fixture(scope="module")
def params():
    return transformer.init(CFG, jax.random.key(0))


def _tokens(seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(3, CFG.vocab_size, size=(B, T)), jnp.int32)


@pytest.mark.parametrize("cfg", [
    CFG, CFG.replace(tie_embeddings=True, moe_every=1),
    # the options pretrained checkpoints use: q/k/v bias, q/k norm, unscaled tied output, raw top-k weights,
    # a dense first block in an otherwise all-MoE stack, another norm epsilon and rotary base
    CFG.replace(attn_bias=True, qk_norm=True, tie_embeddings=True, scale_tied_unembed=False, norm_topk_prob=False,
                moe_every=1, dense_layers=(0,), norm_eps=1e-5, rope_theta=1e6),
])
def test_forward_with_padding_matches_numpy_reference(cfg):
    params = transformer.init(cfg, jax.random.key(1))
    if cfg.attn_bias or cfg.qk_norm:  # zero biases and unit norm scales at init would hide mistakes: randomise them
        rng = np.random.default_rng(3)
        params = layer_stack.per_layer(params, cfg)
        for i in range(cfg.n_layers):
            attn = params[f"block_{i}"]["attn"]
            for name in ("bq", "bk", "bv", "q_norm", "k_norm"):
                attn[name] = jnp.asarray(rng.normal(size=attn[name].shape) * 0.5 + (name.endswith("norm")),
                                         jnp.float32)
        params = layer_stack.stacked(params, cfg)
    tokens = _tokens()
    logits, aux = FWD(params, tokens, cfg=cfg, positions=jnp.asarray(POSITIONS), attn_mask=jnp.asarray(MASK))
    allowed = np.tril(np.ones((T, T), bool))[None] & MASK.astype(bool)[:, None, :]
    ref = np_forward(params, tokens, cfg, POSITIONS, allowed)
    assert logits.dtype == jnp.float32 and logits.shape == (B, T, cfg.vocab_size)
    real = MASK.astype(bool)  # padded positions are don't-care
    np.testing.assert_allclose(np.asarray(logits)[real], ref[real], rtol=1e-4, atol=1e-4)
    n_moe = len(cfg.moe_layers)
    assert aux["router_aux_loss"].shape == (n_moe,) and aux["expert_load"].shape == (n_moe, cfg.n_experts)
    assert aux["dropped_fraction"].shape == (n_moe,) and aux["router_z_loss"].shape == (n_moe,)
    np.testing.assert_allclose(aux["expert_load"].sum(-1), 1.0, rtol=1e-6)


@pytest.mark.parametrize("layout", ["keys_slots_last", "keys_like_values"])
def test_cached_decoding_matches_full_forward(params, layout, monkeypatch):
    # Both KV-cache layouts (a per-backend choice, models/layers.py CACHE_LAYOUTS) give the full forward's logits.
    monkeypatch.setitem(layers.CACHE_LAYOUTS, jax.default_backend(), layout)
    P, S = 5, 12  # prefill 5 slots, then decode one token at a time into a 12-slot cache
    tokens = _tokens()
    positions = jnp.asarray(POSITIONS)
    full, _ = FWD(params, tokens, cfg=CFG, positions=positions, attn_mask=jnp.asarray(MASK))

    kv_valid = np.zeros((B, S), bool)
    kv_valid[:, :P] = MASK[:, :P]
    logits, aux = FWD(params, tokens[:, :P], cfg=CFG, positions=positions[:, :P],
                      cache=transformer.init_cache(CFG, B, S), cache_index=jnp.int32(0), kv_valid=jnp.asarray(kv_valid))
    outs = [logits]
    for t in range(P, T):
        kv_valid[:, t] = MASK[:, t]
        logits, aux = FWD(params, tokens[:, t:t + 1], cfg=CFG, positions=positions[:, t:t + 1], cache=aux["cache"],
                          cache_index=jnp.int32(t), kv_valid=jnp.asarray(kv_valid))
        outs.append(logits)
    cached = np.concatenate(outs, axis=1)
    real = MASK.astype(bool)
    np.testing.assert_allclose(cached[real], np.asarray(full)[real], rtol=1e-5, atol=1e-5)
    assert len(aux["cache"]["k"]) == len(aux["cache"]["v"]) == CFG.n_layers
    k_shape = (B, CFG.n_kv_heads) + ((CFG.head_dim, S) if layout == "keys_slots_last" else (S, CFG.head_dim))
    assert aux["cache"]["k"][0].shape == k_shape
    assert aux["cache"]["v"][0].shape == (B, CFG.n_kv_heads, S, CFG.head_dim)


def test_deterministic_under_fixed_seed(params):
    again = transformer.init(CFG, jax.random.key(0))
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(again)))
    assert not np.array_equal(params["embed"], transformer.init(CFG, jax.random.key(1))["embed"])
    run = lambda: FWD(params, _tokens(1), cfg=CFG, positions=jnp.asarray(POSITIONS), attn_mask=jnp.asarray(MASK))
    np.testing.assert_array_equal(run()[0], run()[0])


def _loss(p, tokens, cfg):
    logits, aux = transformer.forward(p, tokens, cfg)
    logp = jax.nn.log_softmax(logits[:, :-1])
    nll = -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))
    return nll + 0.01 * aux["router_aux_loss"].sum() + 1e-3 * aux["router_z_loss"].sum()


def test_gradients_finite(params):
    grads = jax.jit(jax.grad(_loss), static_argnums=2)(params, _tokens(), CFG)
    assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
    grads = layer_stack.per_layer(grads, CFG)
    for name in ("router", "w_gate", "w_up", "w_down"):
        assert np.abs(grads["block_1"]["moe"][name]).sum() > 0
    assert np.abs(grads["block_0"]["attn"]["wq"]).sum() > 0


def test_remat_gives_identical_gradients():
    cfg = CFG.replace(n_layers=1, n_experts=0)  # remat wraps every block the same way; a small model suffices
    p = transformer.init(cfg, jax.random.key(2))
    tokens = _tokens()
    grad = jax.jit(jax.grad(_loss), static_argnums=2)
    plain, remat = grad(p, tokens, cfg), grad(p, tokens, cfg.replace(remat=True))
    for g, r in zip(jax.tree.leaves(plain), jax.tree.leaves(remat)):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


def test_hidden_states_and_bfloat16(params):
    tokens = _tokens()
    logits, aux = FWD(params, tokens, cfg=CFG, return_hidden=True)
    assert aux["hidden"].shape == (B, T, CFG.d_model) and aux["hidden"].dtype == jnp.float32
    np.testing.assert_allclose(aux["hidden"] @ params["unembed"], logits, rtol=1e-5, atol=1e-5)
    logits16, aux16 = FWD(params, tokens, cfg=CFG.replace(dtype="bfloat16"), return_hidden=True)
    assert logits16.dtype == jnp.float32 and aux16["hidden"].dtype == jnp.bfloat16
    assert np.all(np.isfinite(logits16)) and np.abs(logits16 - logits).max() < 0.5


@pytest.mark.slow  # default-suite budget (make test-slow runs it)
def test_return_logits_false_gives_hidden_only(params):
    tokens = _tokens()
    logits, aux = FWD(params, tokens, cfg=CFG)
    none, aux_h = transformer.forward(params, tokens, CFG, return_logits=False)
    assert none is None
    w, layout, scale = transformer.unembedding(params, CFG)
    assert layout == "DV" and scale == 1.0
    np.testing.assert_allclose(aux_h["hidden"] @ w, logits, rtol=1e-5, atol=1e-5)
    tied = CFG.replace(tie_embeddings=True)
    assert transformer.unembedding(transformer.init(tied, jax.random.key(0)), tied)[1:] == ("VD", 16 ** -0.5)


def test_shared_rope_tables_match_per_call_rotation():
    # forward computes rope_tables once and passes them to every layer; the result must equal apply_rope's own tables.
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.normal(size=(2, 7, 3, 8)), jnp.float32)
    pos = jnp.asarray(rng.integers(0, 50, size=(2, 7)), jnp.int32)
    tables = layers.rope_tables(pos, 8, 1e4)
    np.testing.assert_allclose(layers.apply_rope(x, pos, 1e4, tables), np_rope(np.asarray(x, np.float64),
                               np.asarray(pos), 1e4), rtol=1e-5, atol=1e-5)
