"""models/upcycle.py: a dense model upcycled into an MoE computes the dense model's function at init.

Checked on a tiny random dense model and on the llama fixture of tests/data/hf (against the dense forward and
transformers' logits), one upcycled MoE layer against a float64 NumPy SwiGLU, the capacity path at the smallest
capacity factor that drops nothing, sharded over an expert mesh against unsharded, and the config conversion and
its errors.
"""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import hf, layer_stack, moe, sharding, transformer, upcycle
from models.config import ModelConfig

jax.config.update("jax_default_matmul_precision", "highest")

LLAMA = Path(__file__).parent / "data" / "hf" / "llama"
FWD = jax.jit(transformer.forward, static_argnames=("cfg", "mesh", "rules"))
DENSE = ModelConfig(vocab_size=40, d_model=16, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=24, n_experts=0,
                    max_seq_len=16, upcycle=dict(n_experts=4, top_k=2, moe_every=1))


def _tokens(cfg, shape=(2, 9), seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(0, cfg.vocab_size, shape), jnp.int32)


@pytest.fixture(scope="module")
def dense_params():
    return transformer.init(DENSE, jax.random.key(0))


def test_config_conversion():
    moe_cfg = upcycle.moe_config(DENSE)
    assert (moe_cfg.n_experts, moe_cfg.experts_per_token, moe_cfg.moe_every, moe_cfg.expert_ff) == (4, 2, 1, 24)
    assert moe_cfg.norm_topk_prob and moe_cfg.capacity_factor is None and moe_cfg.n_shared_experts == 0
    assert moe_cfg.upcycle is None and moe_cfg.moe_layers == (0, 1, 2)
    assert moe_cfg.replace(n_experts=0, experts_per_token=2, moe_every=2, expert_d_ff=None,
                           upcycle=DENSE.upcycle) == DENSE
    every_other = upcycle.moe_config(DENSE.replace(upcycle=dict(n_experts=4, top_k=2)))  # the paper's default
    assert every_other.moe_layers == (1,)


def test_upcycled_logits_equal_the_dense_logits(dense_params):
    moe_cfg = upcycle.moe_config(DENSE)
    params = upcycle.upcycle_params(dense_params, DENSE, jax.random.key(1))
    # The upcycled tree is exactly the one the MoE config initialises, every expert a copy of the dense MLP.
    want = jax.eval_shape(lambda: transformer.init(moe_cfg, jax.random.key(0)))
    assert jax.tree.map(lambda a: (a.shape, a.dtype), params) == jax.tree.map(lambda a: (a.shape, a.dtype), want)
    blocks, dense_blocks = layer_stack.per_layer(params, moe_cfg), layer_stack.per_layer(dense_params, DENSE)
    for i in range(3):
        for name, w in dense_blocks[f"block_{i}"]["mlp"].items():
            np.testing.assert_array_equal(np.asarray(blocks[f"block_{i}"]["moe"][name]),
                                          np.broadcast_to(np.asarray(w), (4, *w.shape)))
        for name, w in dense_blocks[f"block_{i}"]["attn"].items():
            np.testing.assert_array_equal(np.asarray(blocks[f"block_{i}"]["attn"][name]), np.asarray(w))
    tokens = _tokens(DENSE)
    dense_logits, _ = FWD(dense_params, tokens, cfg=DENSE.replace(upcycle=None))
    logits, aux = FWD(params, tokens, cfg=moe_cfg)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(dense_logits), rtol=0, atol=2e-5)
    spread = upcycle.expert_spread(params, moe_cfg)
    assert set(spread) == {f"block_{i}/{n}" for i in range(3) for n in ("w_gate", "w_up", "w_down")}
    assert max(spread.values()) == 0.0  # exact copies
    # The router really routes: tokens go to different experts (the equality is not a degenerate single route).
    assert np.all(np.asarray(aux["expert_load"]).max(axis=-1) < 1.0)
    assert np.count_nonzero(np.asarray(aux["expert_load"])) > 3 * 2


def test_one_upcycled_layer_matches_a_float64_dense_swiglu(dense_params):
    moe_cfg = upcycle.moe_config(DENSE)
    params = upcycle.upcycle_params(dense_params, DENSE, jax.random.key(1))
    x = np.random.default_rng(3).normal(size=(2, 5, 16))
    layer = jax.jit(lambda p, x: moe.moe_layer(p, x, moe_cfg)[0])
    block_1 = layer_stack.per_layer(params, moe_cfg)["block_1"]
    y = layer(block_1["moe"], jnp.asarray(x, jnp.float32))
    mlp = {k: np.asarray(v, np.float64) for k, v in layer_stack.per_layer(dense_params, DENSE)["block_1"]["mlp"].items()}
    g, u = x @ mlp["w_gate"], x @ mlp["w_up"]
    want = (g / (1 + np.exp(-g)) * u) @ mlp["w_down"]
    np.testing.assert_allclose(np.asarray(y), want, rtol=0, atol=1e-5)
    _, weights, _ = moe.route(block_1["moe"]["router"], jnp.asarray(x.reshape(10, 16), jnp.float32), 2)
    np.testing.assert_allclose(np.asarray(weights).sum(-1), 1.0, rtol=0, atol=1e-6)  # gates sum to one


def test_capacity_at_n_experts_over_top_k_drops_nothing(dense_params):
    cfg = DENSE.replace(upcycle=dict(n_experts=4, top_k=2, moe_every=1, capacity_factor=2.0))
    moe_cfg = upcycle.moe_config(cfg)
    assert moe_cfg.capacity_factor == 2.0
    params = upcycle.upcycle_params(dense_params, cfg, jax.random.key(1))
    tokens = _tokens(cfg)
    logits, aux = FWD(params, tokens, cfg=moe_cfg)
    dense_logits, _ = FWD(dense_params, tokens, cfg=DENSE.replace(upcycle=None))
    assert float(np.max(np.asarray(aux["dropped_fraction"]))) == 0.0
    np.testing.assert_allclose(np.asarray(logits), np.asarray(dense_logits), rtol=0, atol=2e-5)


def test_llama_fixture_upcycled_matches_dense_and_transformers():
    cfg, dense = hf.load(LLAMA)
    exp = dict(np.load(LLAMA / "expected.npz"))
    cfg = cfg.replace(upcycle=dict(n_experts=4, top_k=2, moe_every=1))
    moe_cfg = upcycle.moe_config(cfg)
    params = upcycle.upcycle_params(dense, cfg, jax.random.key(2))
    tokens = jnp.asarray(exp["input_ids"])
    dense_logits, _ = FWD(dense, tokens, cfg=cfg.replace(upcycle=None))
    logits, aux = FWD(params, tokens, cfg=moe_cfg)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(dense_logits), rtol=0, atol=2e-5)
    np.testing.assert_allclose(np.asarray(logits), exp["logits"], rtol=0, atol=1e-4)
    assert aux["expert_load"].shape == (cfg.n_layers, 4)


def test_sharded_over_an_expert_mesh_equals_unsharded(dense_params):
    assert jax.device_count() == 8, "tests/conftest.py must force 8 CPU devices before JAX starts"
    mesh = sharding.make_mesh({"data": 2, "expert": 2, "tensor": 2})
    moe_cfg = upcycle.moe_config(DENSE)
    params = upcycle.upcycle_params(dense_params, DENSE, jax.random.key(1))
    sharded = jax.device_put(params, transformer.param_shardings(moe_cfg, mesh))
    tokens = _tokens(DENSE, (4, 9))
    plain, _ = FWD(params, tokens, cfg=moe_cfg)
    dist, _ = FWD(sharded, jax.device_put(tokens, sharding.batch_sharding(mesh, sharding.DEFAULT_RULES)),
                  cfg=moe_cfg, mesh=mesh, rules=sharding.DEFAULT_RULES)
    np.testing.assert_allclose(np.asarray(dist), np.asarray(plain), rtol=0, atol=2e-5)


@pytest.mark.parametrize("section, message", [
    (dict(n_experts=1), "upcycle.n_experts"), (dict(top_k=3, n_experts=2), "upcycle.top_k"),
    (dict(capacity_factor=1.5), "upcycle.capacity_factor"), (dict(router_init_std=0.0), "upcycle.router_init_std"),
    (dict(experts=4), "upcycle.experts is not a known field"),
])
def test_config_section_errors_name_the_field(section, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(n_experts=0, upcycle=section)


def test_upcycle_needs_a_dense_model_with_an_moe_block():
    with pytest.raises(ValueError, match="upcycle needs a dense model"):
        ModelConfig(n_experts=4, moe_every=2, upcycle=dict())
    with pytest.raises(ValueError, match="makes no block"):
        upcycle.moe_config(DENSE.replace(upcycle=dict(moe_every=5)))
    with pytest.raises(ValueError, match="model.upcycle is not set"):
        upcycle.moe_config(DENSE.replace(upcycle=None))


def test_expert_spread_against_float64(dense_params):
    moe_cfg = upcycle.moe_config(DENSE)
    params = layer_stack.per_layer(upcycle.upcycle_params(dense_params, DENSE, jax.random.key(1)), moe_cfg)
    w = np.asarray(params["block_1"]["moe"]["w_up"], np.float64)
    w = w + 0.01 * np.random.default_rng(0).standard_normal(w.shape)
    moe_1 = {**params["block_1"]["moe"], "w_up": jnp.asarray(w, jnp.float32)}
    params = layer_stack.stacked({**params, "block_1": {**params["block_1"], "moe": moe_1}}, moe_cfg)
    mean = w.mean(0)
    want = np.sqrt(((w - mean) ** 2).sum()) / np.sqrt(w.shape[0] * (mean ** 2).sum())
    got = upcycle.expert_spread(params, moe_cfg)
    np.testing.assert_allclose(got["block_1/w_up"], want, rtol=1e-4)
    assert got["block_1/w_gate"] == 0.0 and got["block_0/w_up"] == 0.0
