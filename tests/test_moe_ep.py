"""Expert parallelism (models/moe_ep.py) on 8 forced CPU devices, data 2 x expert 4: float64 references, the
single-device model, all-to-all in the compiled program, 2 of 8 experts per device, overflow rounds, capacity."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from models import moe, moe_ep, sharding, transformer
from models.config import ModelConfig

jax.config.update("jax_default_matmul_precision", "highest")

F64 = np.float64
D, F, E, K = 16, 24, 8, 2
CFG = ModelConfig(d_model=D, d_ff=F, n_experts=E, experts_per_token=K, moe_every=1)
EP_SIZES = {"data": 2, "expert": 4}


@pytest.fixture(scope="module")
def mesh():
    assert jax.device_count() == 8, "tests/conftest.py must force 8 CPU devices before JAX starts"
    return sharding.make_mesh(EP_SIZES)


def make_params(seed=0, n_shared=0):
    rng = np.random.default_rng(seed)
    p = {"router": rng.normal(size=(D, E)), "w_gate": rng.normal(size=(E, D, F)) / 3,
         "w_up": rng.normal(size=(E, D, F)) / 3, "w_down": rng.normal(size=(E, F, D)) / 3}
    if n_shared:
        p["shared"] = {"w_gate": rng.normal(size=(D, F)) / 3, "w_up": rng.normal(size=(D, F)) / 3,
                       "w_down": rng.normal(size=(F, D)) / 3}
    return p


def to_jax(tree):
    return jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), tree)


def shard_moe_params(p, mesh):
    """Experts split over the expert axis (as models/sharding.py's rules do), the rest replicated."""
    spec = {"router": P(), "w_gate": P("expert"), "w_up": P("expert"), "w_down": P("expert")}
    return {k: jax.device_put(v, NamedSharding(mesh, spec.get(k, P()))) for k, v in p.items()}


# ---- float64 NumPy reference: loop over tokens and their experts ------------------------------------------------------
def np_swiglu(w_gate, w_up, w_down, x):
    g, u = x @ w_gate, x @ w_up
    return (g / (1 + np.exp(-g)) * u) @ w_down


def np_experts(p, x_ND, experts_NK, weights_NK, keep_NK):
    """sum over kept assignments of weight * expert(x)."""
    p = jax.tree.map(lambda a: np.asarray(a, F64), p)
    x_ND = np.asarray(x_ND, F64)
    y = np.zeros_like(x_ND)
    for n in range(x_ND.shape[0]):
        for j in range(experts_NK.shape[1]):
            if keep_NK[n, j]:
                e = experts_NK[n, j]
                y[n] += weights_NK[n, j] * np_swiglu(p["w_gate"][e], p["w_up"][e], p["w_down"][e], x_ND[n])
    return y


def np_moe(p, x_ND, mask_N, capacity_factor=None):
    """The MoE layer: float64 router, top-k renormalised, capacity in slot-major priority, shared expert."""
    x64 = np.asarray(x_ND, F64)
    logits = x64 @ np.asarray(p["router"], F64)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    top = np.argsort(-probs, axis=-1, kind="stable")[:, :K]
    weights = np.take_along_axis(probs, top, -1)
    weights /= weights.sum(-1, keepdims=True)
    keep = np.broadcast_to(np.asarray(mask_N, bool)[:, None], top.shape).copy()
    dropped = 0.0
    if capacity_factor is not None:
        N = x64.shape[0]
        cap = max(1, min(N, math.ceil(capacity_factor * N * K / E)))
        taken = np.zeros(E, int)
        for j in range(K):
            for n in range(N):
                if keep[n, j]:
                    if taken[top[n, j]] >= cap:
                        keep[n, j] = False
                    else:
                        taken[top[n, j]] += 1
        dropped = 1 - keep.sum() / max(np.sum(mask_N) * K, 1)
    y = np_experts(p, x64, top, weights, keep)
    if "shared" in p:
        s = jax.tree.map(lambda a: np.asarray(a, F64), p["shared"])
        y += np_swiglu(s["w_gate"], s["w_up"], s["w_down"], x64)
    return y, dropped


def _batch(seed, B=4, T=6, pad=True):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(B, T, D)).astype(np.float32)
    mask = np.ones((B, T), bool)
    if pad:
        mask[:, -2:] = rng.integers(0, 2, size=(B, 2)).astype(bool)
    return x, mask


# ---- the layer ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("capacity_factor", [None, 1.0])
@pytest.mark.parametrize("B,T", [(4, 6), (2, 5)])  # (2, 5): 5 local tokens over 4 expert devices -> padding
def test_layer_matches_float64_reference(mesh, capacity_factor, B, T):
    cfg = CFG.replace(capacity_factor=capacity_factor)
    p = to_jax(make_params(1, n_shared=1))
    x, mask = _batch(2, B, T)
    fn = jax.jit(lambda p, x, m: moe.moe_layer(p, x, cfg, token_mask_BT=m, mesh=mesh))
    y, stats = fn(shard_moe_params(p, mesh), jax.device_put(x, NamedSharding(mesh, P("data"))), mask)
    y_ref, dropped_ref = np_moe(p, x.reshape(B * T, D), mask.reshape(-1), capacity_factor)
    np.testing.assert_allclose(np.asarray(y).reshape(B * T, D), y_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(float(stats["dropped_fraction"]), dropped_ref, atol=1e-7)
    if capacity_factor is not None:
        assert dropped_ref > 0, "the capacity case should drop something, or it tests nothing"
    y1, stats1 = jax.jit(lambda p, x, m: moe.moe_layer(p, x, cfg, token_mask_BT=m))(p, x, mask)
    np.testing.assert_allclose(y, y1, rtol=1e-5, atol=1e-5)
    for name in ("router_aux_loss", "router_z_loss", "expert_load", "dropped_fraction"):
        np.testing.assert_allclose(stats[name], stats1[name], rtol=1e-6, atol=1e-7)


def test_layer_gradients_match_single_device(mesh):
    p = to_jax(make_params(3, n_shared=1))
    x, mask = _batch(4)

    def loss(p, x, mesh):
        y, st = moe.moe_layer(p, x, CFG, token_mask_BT=mask, mesh=mesh)
        return jnp.sum(jnp.sin(y) * x) + st["router_aux_loss"] + st["router_z_loss"]

    grad = jax.grad(loss, argnums=(0, 1))
    g1 = jax.jit(grad, static_argnums=2)(p, jnp.asarray(x), None)
    g8 = jax.jit(grad, static_argnums=2)(shard_moe_params(p, mesh), jax.device_put(x, NamedSharding(mesh, P("data"))),
                                         mesh)
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(g1)[0], jax.tree.leaves(g8)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5, err_msg=jax.tree_util.keystr(path))


# ---- overflow: skewed routing, small buffers ----------------------------------------------------------------------------
def _skewed_routing(seed, B, T):
    """Every token's two experts on the first expert device (experts 0 and 1): the worst case for one destination."""
    rng = np.random.default_rng(seed)
    experts = np.stack([rng.integers(0, 2, size=(B, T))] * 2, -1)
    experts[..., 1] = 1 - experts[..., 0]
    w = rng.uniform(0.1, 1.0, size=(B, T, K))
    return experts.astype(np.int32), (w / w.sum(-1, keepdims=True)).astype(np.float32)


def test_buffer_slots():
    # c = 3 tokens, k = 2, 8 experts over 4 devices (2 each): even share 3 * 2 / 4 = 1.5 assignments per destination
    assert moe_ep.buffer_slots(3, 2, 8, 4, 2.0) == (3, 2)  # worst case 3 * min(2, 2) = 6 -> 2 rounds of 3
    assert moe_ep.buffer_slots(3, 2, 8, 4, 100.0) == (6, 1)  # never more than the worst case
    assert moe_ep.buffer_slots(3, 2, 8, 4, 0.01) == (1, 6)
    assert moe_ep.buffer_slots(5, 2, 8, 8, 1.0) == (2, 3)  # one expert per device: a token sends it at most 1
    with pytest.raises(ValueError, match="buffer_factor"):
        moe_ep.buffer_slots(3, 2, 8, 4, 0.0)


@pytest.mark.parametrize("buffer_factor,expected_rounds", [(0.25, 6), pytest.param(2.0, 2, marks=pytest.mark.slow),
                                                           pytest.param(None, 1, marks=pytest.mark.slow)])
def test_overflow_takes_more_rounds_and_drops_nothing(mesh, buffer_factor, expected_rounds):
    """Data shard: 2 x 6 = 12 tokens, 3 per expert device, 6 assignments all for device 0. Slots per destination:
    ceil(f * 3 * 2 / 4) -> 1 (f = 0.25) or 3 (f = 2), so 6 or 2 rounds; None here means worst-case slots (6): 1."""
    B, T = 4, 6
    p = to_jax(make_params(5))
    x, mask = _batch(6, B, T)
    experts, w = _skewed_routing(7, B, T)
    factor = 1e9 if buffer_factor is None else buffer_factor

    def ep(p, x, w):
        return moe_ep.expert_parallel(p, x, w, experts, mask[..., None].repeat(K, -1), mesh=mesh,
                                      buffer_factor=factor, return_rounds=True)

    xs = jax.device_put(x, NamedSharding(mesh, P("data")))
    y, rounds = jax.jit(ep)(shard_moe_params(p, mesh), xs, w)
    assert int(rounds) == expected_rounds
    keep = np.broadcast_to(mask.reshape(-1)[:, None], (B * T, K))
    y_ref = np_experts(p, x.reshape(-1, D), experts.reshape(-1, K), w.reshape(-1, K), keep)
    np.testing.assert_allclose(np.asarray(y).reshape(-1, D), y_ref, rtol=1e-5, atol=1e-5)

    # gradients through the overflow rounds' hand-written backward, against a plain gather-per-assignment JAX form
    def plain(p, x, w):
        xa = x.reshape(-1, D)
        e_a, w_a = experts.reshape(-1, K), w.reshape(-1, K) * mask.reshape(-1, 1)
        out = 0
        for j in range(K):
            g = jnp.einsum("ND,NDF->NF", xa, p["w_gate"][e_a[:, j]])
            u = jnp.einsum("ND,NDF->NF", xa, p["w_up"][e_a[:, j]])
            out = out + w_a[:, j:j + 1] * jnp.einsum("NF,NFD->ND", jax.nn.silu(g) * u, p["w_down"][e_a[:, j]])
        return out.reshape(x.shape)

    loss = lambda f: lambda p, x, w: jnp.sum(jnp.cos(f(p, x, w)) * x)
    p_e = {k: v for k, v in p.items() if k != "router"}
    g_ref = jax.jit(jax.grad(loss(plain), argnums=(0, 1, 2)))(p_e, jnp.asarray(x), jnp.asarray(w))
    g_ep = jax.jit(jax.grad(loss(lambda p, x, w: ep(p, x, w)[0]), argnums=(0, 1, 2)))(
        shard_moe_params(p_e, mesh), xs, w)
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(g_ref)[0], jax.tree.leaves(g_ep)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5, err_msg=jax.tree_util.keystr(path))


# ---- the whole model ------------------------------------------------------------------------------------------------------
MODEL_CFG = ModelConfig(vocab_size=64, d_model=D, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=F,
                        n_experts=E, experts_per_token=K, moe_every=1, tie_embeddings=False)


def _model_loss(params, tokens, mask, mesh):
    logits, aux = transformer.forward(params, tokens, MODEL_CFG, attn_mask=mask, mesh=mesh,
                                      rules=sharding.DEFAULT_RULES)
    logp = jax.nn.log_softmax(logits[:, :-1])
    nll = -jnp.sum(jnp.take_along_axis(logp, tokens[:, 1:, None], -1)[..., 0] * mask[:, 1:]) / jnp.sum(mask[:, 1:])
    return nll + 0.01 * aux["router_aux_loss"].sum() + 1e-3 * aux["router_z_loss"].sum(), logits


def test_model_on_expert_mesh(mesh):
    """Logits and gradients equal the single-device model's; the compiled forward exchanges tokens with all-to-all;
    each device holds 2 of the 8 experts, and the experts are never gathered whole."""
    params = transformer.init(MODEL_CFG, jax.random.key(0))
    sharded = transformer.init_sharded(MODEL_CFG, jax.random.key(0), mesh, sharding.DEFAULT_RULES)
    w_gate = sharded["stack_0"]["moe"]["w_gate"]  # both blocks stacked: [2 layers, E, D, F], experts over 4
    assert {s.data.shape for s in w_gate.addressable_shards} == {(2, 2, D, F)}
    assert {(s.index[1].start, s.index[1].stop) for s in w_gate.addressable_shards} == {(0, 2), (2, 4), (4, 6), (6, 8)}

    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(3, 64, size=(4, 8)), jnp.int32)
    mask = jnp.asarray(np.concatenate([np.ones((4, 6)), rng.integers(0, 2, size=(4, 2))], axis=1), jnp.int32)
    grad_fn = jax.jit(jax.value_and_grad(_model_loss, has_aux=True), static_argnums=3)
    (loss, logits), grads = grad_fn(params, tokens, mask, None)
    batch = sharding.batch_sharding(mesh, sharding.DEFAULT_RULES)
    args = (sharded, jax.device_put(tokens, batch), jax.device_put(mask, batch), mesh)
    (loss_s, logits_s), grads_s = grad_fn(*args)
    np.testing.assert_allclose(loss_s, loss, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(logits_s, logits, rtol=1e-5, atol=1e-5)
    for (path, g), g_s in zip(jax.tree_util.tree_flatten_with_path(grads)[0], jax.tree.leaves(grads_s)):
        np.testing.assert_allclose(g_s, g, rtol=1e-5, atol=1e-5, err_msg=jax.tree_util.keystr(path))

    forward = jax.jit(lambda p, t, m: transformer.forward(p, t, MODEL_CFG, attn_mask=m, mesh=mesh)[0])
    hlo = forward.lower(*args[:3]).compile().as_text()
    assert "all-to-all" in hlo
    gathers = [line for line in hlo.splitlines() if "all-gather" in line]
    assert not [line for line in gathers if f"[{E},{D},{F}]" in line or f"[{E},{F},{D}]" in line], gathers
    # the expert-parallel shard_map is chosen exactly when the mesh has an expert axis > 1
    tokens8 = jnp.tile(tokens, (2, 1))
    for sizes, expected in (({"data": 8}, False), ({"data": 4, "tensor": 2}, False), ({"expert": 2, "data": 4}, True)):
        m = sharding.make_mesh(sizes)
        jaxpr = str(jax.make_jaxpr(lambda p, t: transformer.forward(p, t, MODEL_CFG, mesh=m)[0])(params, tokens8))
        assert moe_ep.uses_expert_parallelism(m) == expected and ("shard_map" in jaxpr) == expected, sizes
    assert not moe_ep.uses_expert_parallelism(None)


def test_experts_must_divide_the_expert_axis():
    cfg = CFG.replace(n_experts=6)
    rng = np.random.default_rng(0)
    p = to_jax({"router": rng.normal(size=(D, 6)), "w_gate": rng.normal(size=(6, D, F)),
                "w_up": rng.normal(size=(6, D, F)), "w_down": rng.normal(size=(6, F, D))})
    mesh4 = sharding.make_mesh({"data": 2, "expert": 4})
    with pytest.raises(ValueError, match=r"n_experts \(6\).*expert axis \(4\)"):
        moe.moe_layer(p, jnp.zeros((2, 3, D)), cfg, mesh=mesh4)
