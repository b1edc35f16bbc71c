"""Sharding on 8 forced CPU devices (tests/conftest.py): mesh construction, rules, sharded == single-device numerics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from models import sharding, transformer
from models.config import ModelConfig

jax.config.update("jax_default_matmul_precision", "highest")

CFG = ModelConfig(vocab_size=64, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=24, n_experts=4,
                  experts_per_token=2, moe_every=2, n_shared_experts=1, tie_embeddings=False)
MESH_SIZES = {"data": 2, "fsdp": 1, "expert": 2, "tensor": 2}


def test_eight_devices_available():
    assert jax.device_count() == 8, "tests/conftest.py must force 8 CPU devices before JAX starts"


def test_make_mesh_sizes_and_errors():
    mesh = sharding.make_mesh(MESH_SIZES)
    assert mesh.axis_names == sharding.MESH_AXES and dict(mesh.shape) == MESH_SIZES
    assert dict(sharding.make_mesh({"data": -1, "tensor": 2}).shape) == {"data": 4, "fsdp": 1, "expert": 1,
                                                                        "tensor": 2}
    assert dict(sharding.make_mesh({"expert": 2}, devices=jax.devices()[:2]).shape)["expert"] == 2
    with pytest.raises(ValueError, match=r"multiply to 4 but there are 8 devices"):
        sharding.make_mesh({"data": 2, "tensor": 2})
    with pytest.raises(ValueError, match=r"fixed sizes multiply to 3"):
        sharding.make_mesh({"data": -1, "tensor": 3})
    with pytest.raises(ValueError, match="at most one"):
        sharding.make_mesh({"data": -1, "tensor": -1})
    with pytest.raises(ValueError, match="'model'"):
        sharding.make_mesh({"model": 8})
    with pytest.raises(ValueError, match="'tensor' has size 0"):
        sharding.make_mesh({"data": 8, "tensor": 0})


def test_logical_to_spec_rules():
    rules = sharding.DEFAULT_RULES
    assert sharding.logical_to_spec(("expert", "embed", "mlp"), rules) == P("expert", "fsdp", "tensor")
    assert sharding.logical_to_spec(("batch", "length", None), rules) == P(("data", "fsdp"), None, None)
    # a mesh axis is used once per array: embed cannot reuse fsdp after batch took it
    assert sharding.logical_to_spec(("batch", "embed"), rules) == P(("data", "fsdp"), None)
    mesh = sharding.make_mesh(MESH_SIZES)
    # with a shape, dimensions the mesh axes do not divide stay replicated (vocab 259 is odd)
    assert sharding.logical_to_spec(("vocab", "embed"), rules, shape=(259, 16), mesh=mesh) == P(None, "fsdp")
    assert sharding.logical_to_spec(("vocab", "embed"), rules, shape=(64, 16), mesh=mesh) == P("tensor", "fsdp")
    # a rules table from an experiment config may be a dict and may replicate everything
    assert sharding.logical_to_spec(("expert", "mlp"), {"expert": None, "mlp": ["tensor"]}) == P(None, "tensor")
    with pytest.raises(ValueError, match="'mystery'"):
        sharding.logical_to_spec(("mystery",), rules)
    with pytest.raises(ValueError, match="'model'"):
        sharding.logical_to_spec(("embed",), (("embed", "model"),))
    assert sharding.batch_sharding(mesh, rules, ndim=3).spec == P(("data", "fsdp"), None, None)
    assert sharding.replicated(mesh).spec == P()


@pytest.fixture(scope="module")
def setup():
    mesh = sharding.make_mesh(MESH_SIZES)
    params = transformer.init(CFG, jax.random.key(0))
    sharded = transformer.init_sharded(CFG, jax.random.key(0), mesh, sharding.DEFAULT_RULES)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(3, CFG.vocab_size, size=(4, 8)), jnp.int32)
    mask = jnp.asarray(np.concatenate([np.ones((4, 6)), rng.integers(0, 2, size=(4, 2))], axis=1), jnp.int32)
    return mesh, params, sharded, tokens, mask


def test_init_sharded_matches_init_and_splits_experts(setup):
    mesh, params, sharded, _, _ = setup
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(sharded)):
        np.testing.assert_array_equal(a, b)
    # block 1 is the MoE block, stack_1 (models/layer_stack.py): [1 layer, E=4, D=16, F=24], the layer axis
    # replicated, experts over expert 2, mlp over tensor 2
    w_gate = sharded["stack_1"]["moe"]["w_gate"]
    assert w_gate.sharding.spec == P(None, "expert", "fsdp", "tensor")
    assert {s.data.shape for s in w_gate.addressable_shards} == {(1, 2, 16, 12)}
    expert_halves = {(s.index[1].start, s.index[1].stop) for s in w_gate.addressable_shards}
    assert expert_halves == {(0, 2), (2, 4)}
    assert {s.data.shape for s in sharded["stack_0"]["attn"]["wq"].addressable_shards} == {(1, 16, 2, 8)}
    assert {s.data.shape for s in sharded["unembed"].addressable_shards} == {(16, 32)}


def _loss(params, tokens, mask, mesh):
    logits, aux = transformer.forward(params, tokens, CFG, attn_mask=mask, mesh=mesh, rules=sharding.DEFAULT_RULES)
    logp = jax.nn.log_softmax(logits[:, :-1])
    nll = -jnp.sum(jnp.take_along_axis(logp, tokens[:, 1:, None], -1)[..., 0] * mask[:, 1:]) / jnp.sum(mask[:, 1:])
    return nll + 0.01 * aux["router_aux_loss"].sum() + 1e-3 * aux["router_z_loss"].sum(), (logits, aux)


def test_sharded_forward_and_gradients_match_single_device(setup):
    mesh, params, sharded, tokens, mask = setup
    grad_fn = jax.value_and_grad(_loss, has_aux=True)
    (loss, (logits, aux)), grads = jax.jit(grad_fn, static_argnums=3)(params, tokens, mask, None)

    batch = sharding.batch_sharding(mesh, sharding.DEFAULT_RULES)
    tokens_s, mask_s = jax.device_put(tokens, batch), jax.device_put(mask, batch)
    (loss_s, (logits_s, aux_s)), grads_s = jax.jit(grad_fn, static_argnums=3)(sharded, tokens_s, mask_s, mesh)

    # the batch stays split over the data axis (4 -> 2 per shard), the vocabulary over tensor (64 -> 32)
    assert {s.data.shape for s in logits_s.addressable_shards} == {(2, 8, 32)}
    np.testing.assert_allclose(loss_s, loss, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(logits_s, logits, rtol=1e-5, atol=1e-5)
    for name in ("router_aux_loss", "router_z_loss", "expert_load"):
        np.testing.assert_allclose(aux_s[name], aux[name], rtol=1e-5, atol=1e-5)
    flat, flat_s = jax.tree_util.tree_flatten_with_path(grads)[0], jax.tree.leaves(grads_s)
    for (path, g), g_s in zip(flat, flat_s):
        np.testing.assert_allclose(g_s, g, rtol=1e-5, atol=1e-5, err_msg=jax.tree_util.keystr(path))
