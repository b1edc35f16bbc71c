"""bf16: parameters and activations in bf16 (or float32 master weights with bf16 compute), router, softmax,
logprobs and losses in float32; the train step and the sampler agree with float32 within bf16 tolerance.

Tolerances: bf16 keeps 8 bits of mantissa (relative rounding 2**-9), so a 2-block model's logits differ from
float32 by about 1% of their scale; losses (means over many tokens) and gradient directions agree more closely.
Every train-step compile costs ~10-20 CPU seconds here, so the default tests use a one-block dense model (the
router's dtype is checked on its own) and the MoE / pure-bf16 / sampler comparisons are marked slow (the
bf16 sampler is also compared with float32 on the checkpoint fixtures in tests/test_hf.py)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import layer_stack, sampling, transformer
from models.config import ModelConfig
from models.moe import route
from rl.logprobs import make_logprob_fn
from rl.train_step import LossConfig, OptimConfig, init_train_state, make_loss_fn, make_train_step

MOE32 = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64, n_experts=4,
                    experts_per_token=2, moe_every=1, qk_norm=True, max_seq_len=32)
F32 = MOE32.replace(n_layers=1, n_experts=0, moe_every=0)         # the default tests' model: one dense block
MASTER = F32.replace(dtype="bfloat16")                          # float32 master weights, bf16 compute
BF16 = F32.replace(dtype="bfloat16", param_dtype="bfloat16")    # everything stored and computed in bf16
LOSS = LossConfig(mode="grpo", clip_high=0.28, kl_kind="k3")
slow = pytest.mark.slow


@pytest.fixture(scope="module")
def params32():
    return transformer.init(F32, jax.random.key(0))


def _cast(params, dtype):
    """A copy in dtype (the train step donates its state, so tests never hand it the shared fixture)."""
    return jax.tree.map(lambda x: jnp.array(x, dtype=dtype, copy=True), params)


def _batch(B=4, T=16, seed=1):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(3, F32.vocab_size, (B, T)).astype(np.int32)
    attn = np.ones((B, T), np.int32)
    attn[1, -3:] = 0  # a padded row
    loss = attn.copy()
    loss[:, :6] = 0  # prompt
    return {"tokens": tokens, "attn_mask": attn, "loss_mask": loss, "temperature": np.full((B,), 0.9, np.float32),
            "advantages": rng.normal(size=(B,)).astype(np.float32),
            "old_logp": -rng.uniform(1, 5, (B, T)).astype(np.float32),
            "ref_logp": -rng.uniform(1, 5, (B, T)).astype(np.float32)}


def _flat(tree):
    return np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(tree)])


@pytest.mark.parametrize("base,cfg,dtype", [pytest.param(F32, MASTER, jnp.float32, marks=slow),
                                            pytest.param(F32, BF16, jnp.bfloat16, marks=slow),
                                            pytest.param(MOE32, MOE32.replace(dtype="bfloat16"), jnp.float32, marks=slow)])
def test_loss_and_gradient_match_float32(base, cfg, dtype):
    params = transformer.init(base, jax.random.key(0))
    batch = {k: jnp.asarray(v) for k, v in _batch().items()}
    kl = jnp.float32(0.04)
    grad = lambda c, p: jax.jit(jax.value_and_grad(make_loss_fn(c, LOSS, None, None), has_aux=True))(p, batch, kl)
    (l32, m32), g32 = grad(base, params)
    (l16, m16), g16 = grad(cfg, _cast(params, dtype))
    assert l16.dtype == jnp.float32 and all(v.dtype == jnp.float32 for v in jax.tree.leaves(m16))
    assert all(g.dtype == dtype for g in jax.tree.leaves(g16))  # gradients in the parameters' dtype
    for k in ("loss/total", "loss/policy", "loss/kl", "entropy", "kl", "loss/router_aux", "loss/router_z"):
        np.testing.assert_allclose(float(m16[k]), float(m32[k]), rtol=3e-2, atol=3e-3, err_msg=k)
    a, b = _flat(g32), _flat(g16)
    cos = a @ b / (np.linalg.norm(a) * np.linalg.norm(b))
    assert cos > 0.99 and abs(np.linalg.norm(b) / np.linalg.norm(a) - 1) < 0.05, (cos, np.linalg.norm(b) / np.linalg.norm(a))


@slow
@pytest.mark.parametrize("cfg,dtype", [(MASTER, jnp.float32), (BF16, jnp.bfloat16)])
def test_train_step_tracks_float32(params32, cfg, dtype):
    optim = OptimConfig(grad_clip=1.0)
    batch = {k: jnp.asarray(v) for k, v in _batch().items()}
    hp = {"lr": jnp.float32(1e-2), "kl_coef": jnp.float32(0.04)}
    out = {}
    for name, c, p in (("f32", F32, _cast(params32, jnp.float32)), ("test", cfg, _cast(params32, dtype))):
        state = init_train_state(c, LOSS, optim, jax.random.key(1), params=p)
        state, met = make_train_step(c, LOSS, optim)(state, batch, hp)
        out[name] = (state, met)
    state, met = out["test"]
    np.testing.assert_allclose(float(met["grad_norm"]), float(out["f32"][1]["grad_norm"]), rtol=0.05)
    # the updates (Adam's first step is about lr * sign(grad)) point the same way as float32's
    d32 = _flat(out["f32"][0]["params"]) - _flat(params32)
    d16 = _flat(state["params"]) - _flat(_cast(params32, dtype))
    assert d32 @ d16 / (np.linalg.norm(d32) * np.linalg.norm(d16)) > (0.9 if dtype == jnp.float32 else 0.6)


def test_train_step_dtypes_and_master_weights(params32):
    """The state keeps its dtypes (float32 master weights and Adam moments with bf16 compute; everything bf16 with
    bf16 storage), metrics are float32 and no step is skipped. And why the real-model config stores float32
    weights: at lr 1e-6 almost no bf16 weight can move (their spacing is ~2**-8 of their size), while float32 master
    weights take every update."""
    optim = OptimConfig(grad_clip=None)
    batch = {k: jnp.asarray(v) for k, v in _batch().items()}
    hp = {"lr": jnp.float32(1e-6), "kl_coef": jnp.float32(0.04)}
    moved = {}
    for name, c, dtype in (("master", MASTER, jnp.float32), ("bf16", BF16, jnp.bfloat16)):
        state = init_train_state(c, LOSS, optim, jax.random.key(1), params=_cast(params32, dtype))
        before = _flat(state["params"])
        state, met = make_train_step(c, LOSS, optim)(state, batch, hp)
        assert all(x.dtype == dtype for x in jax.tree.leaves(state["params"]))
        assert all(x.dtype == dtype for x in jax.tree.leaves(state["opt_state"]) if jnp.issubdtype(x.dtype, jnp.floating))
        assert int(state["n_skipped"]) == 0
        assert all(v.dtype == jnp.float32 for v in jax.tree.leaves(met) if jnp.issubdtype(v.dtype, jnp.floating))
        moved[name] = np.mean(_flat(state["params"]) != before)
    assert moved["master"] > 0.9 and moved["bf16"] < 0.05, moved


def test_router_logits_and_statistics_are_float32():
    cfg = MOE32.replace(dtype="bfloat16", param_dtype="bfloat16")
    p16 = transformer.init(cfg, jax.random.key(0))
    router = layer_stack.per_layer(p16, cfg)["block_0"]["moe"]["router"]
    x = jax.random.normal(jax.random.key(2), (6, cfg.d_model), jnp.bfloat16)
    logits, weights, experts = route(router, x, 2)
    assert logits.dtype == weights.dtype == jnp.float32 and experts.dtype == jnp.int32
    # the same logits as a float32 router on the same (bf16-valued) inputs
    ref = np.asarray(x, np.float64) @ np.asarray(router, np.float64)
    np.testing.assert_allclose(np.asarray(logits), ref, rtol=1e-5, atol=1e-5)
    out, aux = jax.jit(transformer.forward, static_argnums=2)(p16, jnp.asarray(_batch()["tokens"]), cfg)
    assert out.dtype == jnp.float32
    assert aux["router_aux_loss"].dtype == aux["router_z_loss"].dtype == aux["expert_load"].dtype == jnp.float32


@slow
@pytest.mark.parametrize("cfg,dtype", [(MASTER, jnp.float32), (BF16, jnp.bfloat16)])
def test_sampling_matches_float32(params32, cfg, dtype):
    """Temperature sampling with one key: bf16 draws the float32 tokens almost everywhere, and its logprobs agree with
    float32's of the same tokens; against the bf16 train-side logprobs (what the trainer recomputes) they agree far
    closer (the sampler/trainer mismatch the RL stages log)."""
    p = _cast(params32, dtype)
    prompts = jnp.asarray(np.random.default_rng(3).integers(3, F32.vocab_size, (4, 6)), jnp.int32)
    kw = dict(num_samples=4, max_new_tokens=12, temperature=1.0, eos_id=-1)
    s32 = sampling.generate(params32, F32, prompts, jax.random.key(5), **kw)
    s16 = sampling.generate(p, cfg, prompts, jax.random.key(5), **kw)
    assert s16.logprobs.dtype == jnp.float32 and make_logprob_fn(cfg)(p, prompts, jnp.ones_like(prompts)).dtype == jnp.float32
    assert np.mean(np.asarray(s16.tokens) == np.asarray(s32.tokens)[:, :]) > 0.5  # identical until a near-tie flips
    assert np.array_equal(np.asarray(s16.tokens)[:, 0], np.asarray(s32.tokens)[:, 0])
    seq = jnp.concatenate([jnp.repeat(prompts, 4, axis=0), s16.tokens], axis=1)
    ones = jnp.ones_like(seq)
    lp32 = make_logprob_fn(F32)(params32, seq, ones, 1.0)[:, 6:]
    lp16 = make_logprob_fn(cfg)(p, seq, ones, 1.0)[:, 6:]
    err32 = float(jnp.max(jnp.abs(s16.logprobs - lp32)))
    err16 = float(jnp.max(jnp.abs(s16.logprobs - lp16)))
    assert err32 < 0.15 and err16 < 0.1, (err32, err16)
