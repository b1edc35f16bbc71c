"""Chunked large-vocabulary logprobs and entropy (models/vocab.py) against float64 NumPy, values and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import transformer, vocab
from models.config import ModelConfig

jax.config.update("jax_default_matmul_precision", "highest")


# ---- float64 NumPy reference --------------------------------------------------------------------------------------
def np_logprobs_entropy(h, w, targets, layout, scale, temp):
    """Full logits in float64: z = scale * h @ w / temp; (log softmax(z)[target], entropy of softmax(z))."""
    h, w = np.asarray(h, np.float64), np.asarray(w, np.float64)
    w_DV = w if layout == "DV" else w.T
    z = scale * np.einsum("btd,dv->btv", h, w_DV) / np.asarray(temp, np.float64).reshape(-1, 1, 1)
    z = z - z.max(-1, keepdims=True)
    logp_all = z - np.log(np.exp(z).sum(-1, keepdims=True))
    logp = np.take_along_axis(logp_all, np.asarray(targets)[..., None], -1)[..., 0]
    ent = -(np.exp(logp_all) * logp_all).sum(-1)
    return logp, ent


def np_objective(h, w, targets, layout, scale, temp, a, b):
    logp, ent = np_logprobs_entropy(h, w, targets, layout, scale, temp)
    return float((a * logp).sum() + (b * ent).sum())


def np_grad_fd(f, x, eps=1e-6):
    """Central finite differences of a float64 scalar function, coordinate by coordinate."""
    x = np.array(x, np.float64)
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[i] += eps
        down[i] -= eps
        g[i] = (f(up) - f(down)) / (2 * eps)
    return g


B, T, D, V = 2, 7, 5, 11


def _case(layout, seed=0):
    rng = np.random.default_rng(seed)
    h = rng.normal(size=(B, T, D))
    w = rng.normal(size=(D, V) if layout == "DV" else (V, D))
    targets = rng.integers(0, V, size=(B, T))
    temp = np.array([1.0, 0.7])
    a, b = rng.normal(size=(B, T)), rng.normal(size=(B, T))  # random cotangents for logp and entropy
    return h, w, targets, temp, a, b


@pytest.mark.parametrize("layout, scale, chunk_len", [("DV", 1.0, 3), ("VD", 0.5, 4), ("DV", 2.0, 64)])
def test_values_and_gradients_match_float64(layout, scale, chunk_len):
    h, w, targets, temp, a, b = _case(layout)
    f32 = lambda x: jnp.asarray(x, jnp.float32)

    def objective(h_, w_):
        logp, ent = vocab.chunked_logprobs(h_, w_, jnp.asarray(targets), layout=layout, scale=scale,
                                           temperature=f32(temp), chunk_len=chunk_len)
        return jnp.sum(f32(a) * logp) + jnp.sum(f32(b) * ent), (logp, ent)

    (_, (logp, ent)), (gh, gw) = jax.jit(jax.value_and_grad(objective, argnums=(0, 1), has_aux=True))(f32(h), f32(w))
    ref_logp, ref_ent = np_logprobs_entropy(h, w, targets, layout, scale, temp)
    assert logp.dtype == jnp.float32 and logp.shape == (B, T)
    np.testing.assert_allclose(logp, ref_logp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent, ref_ent, rtol=1e-5, atol=1e-5)
    ref_gh = np_grad_fd(lambda x: np_objective(x, w, targets, layout, scale, temp, a, b), h)
    ref_gw = np_grad_fd(lambda x: np_objective(h, x, targets, layout, scale, temp, a, b), w)
    np.testing.assert_allclose(gh, ref_gh, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gw, ref_gw, rtol=1e-4, atol=1e-5)


def test_scalar_temperature_and_no_padding_needed():
    h, w, targets, _, _, _ = _case("DV", seed=1)
    logp, ent = vocab.chunked_logprobs(jnp.asarray(h, jnp.float32), jnp.asarray(w, jnp.float32),
                                       jnp.asarray(targets), temperature=1.3, chunk_len=T)
    ref_logp, ref_ent = np_logprobs_entropy(h, w, targets, "DV", 1.0, np.full(B, 1.3))
    np.testing.assert_allclose(logp, ref_logp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent, ref_ent, rtol=1e-5, atol=1e-5)


def test_bfloat16_inputs_give_float32_outputs_and_input_dtype_gradients():
    h, w, targets, temp, a, b = _case("VD", seed=2)
    h16, w16 = jnp.asarray(h, jnp.bfloat16), jnp.asarray(w, jnp.bfloat16)

    def objective(h_, w_):
        logp, ent = vocab.chunked_logprobs(h_, w_, jnp.asarray(targets), layout="VD", temperature=temp, chunk_len=3)
        return jnp.sum(a * logp) + jnp.sum(b * ent), (logp, ent)

    (_, (logp, ent)), (gh, gw) = jax.value_and_grad(objective, argnums=(0, 1), has_aux=True)(h16, w16)
    assert logp.dtype == ent.dtype == jnp.float32 and gh.dtype == gw.dtype == jnp.bfloat16
    # the same bf16-rounded inputs in float64: only the bf16 matmul inputs differ, the rest is float32
    ref_logp, ref_ent = np_logprobs_entropy(np.asarray(h16, np.float64), np.asarray(w16, np.float64), targets, "VD",
                                            1.0, temp)
    np.testing.assert_allclose(logp, ref_logp, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ent, ref_ent, rtol=1e-4, atol=1e-4)
    ref_gw = np_grad_fd(lambda x: np_objective(np.asarray(h16, np.float64), x, targets, "VD", 1.0, temp, a, b),
                        np.asarray(w16, np.float64))
    np.testing.assert_allclose(np.asarray(gw, np.float64), ref_gw, rtol=2e-2, atol=2e-2)


def test_sequence_logprobs_follow_the_shifted_alignment_of_the_model():
    cfg = ModelConfig(vocab_size=23, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=16,
                      n_experts=0, tie_embeddings=True)  # tied and scaled: the "VD" path with scale d_model**-0.5
    params = transformer.init(cfg, jax.random.key(0))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 23, size=(2, 6)), jnp.int32)
    temp = jnp.array([1.0, 0.5])
    logits, _ = transformer.forward(params, tokens, cfg)
    _, aux = transformer.forward(params, tokens, cfg, return_logits=False)
    logp, ent = vocab.sequence_logprobs(params, cfg, aux["hidden"], tokens, temp, chunk_len=2)
    z = np.asarray(logits, np.float64)[:, :-1] / np.asarray(temp, np.float64)[:, None, None]
    z = z - z.max(-1, keepdims=True)
    logp_all = z - np.log(np.exp(z).sum(-1, keepdims=True))
    ref_logp = np.take_along_axis(logp_all, np.asarray(tokens)[:, 1:, None], -1)[..., 0]
    ref_ent = -(np.exp(logp_all) * logp_all).sum(-1)
    assert logp.shape == ent.shape == (2, 6) and np.all(logp[:, 0] == 0) and np.all(ent[:, 0] == 0)
    np.testing.assert_allclose(logp[:, 1:], ref_logp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent[:, 1:], ref_ent, rtol=1e-5, atol=1e-5)


def test_invalid_arguments_name_the_parameter():
    h = jnp.zeros((1, 2, 3))
    with pytest.raises(ValueError, match="layout"):
        vocab.chunked_logprobs(h, jnp.zeros((3, 4)), jnp.zeros((1, 2), jnp.int32), layout="VV")
    with pytest.raises(ValueError, match="chunk_len"):
        vocab.chunked_logprobs(h, jnp.zeros((3, 4)), jnp.zeros((1, 2), jnp.int32), chunk_len=0)


def _temp_bytes(fn, *args):
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def test_loss_and_grad_never_hold_full_logits():
    """XLA's compiled temporaries for loss + grad stay below one [B, T, V] float32 array (the naive path needs
    several of them)."""
    b, t, d, v, chunk = 2, 256, 32, 4096, 16
    h = jnp.zeros((b, t, d), jnp.float32)
    w = jnp.zeros((d, v), jnp.float32)
    tgt = jnp.zeros((b, t), jnp.int32)

    def chunked(h_, w_):
        logp, ent = vocab.chunked_logprobs(h_, w_, tgt, chunk_len=chunk)
        return jnp.sum(logp) + jnp.sum(ent)

    def naive(h_, w_):
        logp_all = jax.nn.log_softmax(jnp.einsum("btd,dv->btv", h_, w_), axis=-1)
        logp = jnp.take_along_axis(logp_all, tgt[..., None], -1)[..., 0]
        return jnp.sum(logp) - jnp.sum(jnp.exp(logp_all) * logp_all)

    full_logits = b * t * v * 4
    grad = lambda f: jax.grad(f, argnums=(0, 1))
    assert _temp_bytes(grad(naive), h, w) > 2 * full_logits
    assert _temp_bytes(grad(chunked), h, w) < full_logits / 2
