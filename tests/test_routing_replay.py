"""Routing replay (R3): the sampler records each token's experts per MoE layer, the forward / train step replays them
with gate weights from the current router. Exactness with unchanged parameters, router gradients, layer indices
with dense blocks, the sampler's records, the expert-parallel path, the train-step metric and the config rules."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from models import layer_stack, moe, sampling, sharding, transformer
from models.config import ModelConfig

SMALL = dict(vocab_size=32, d_model=32, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=32, n_experts=4,
             experts_per_token=2, max_seq_len=32)


def _cfg(**kw):
    return ModelConfig(**{**SMALL, "n_layers": 2, "moe_every": 1, **kw})


def _tokens(cfg, B=3, T=10, seed=0):
    rng = np.random.default_rng(seed)
    tok = rng.integers(3, cfg.vocab_size, size=(B, T)).astype(np.int32)
    mask = np.ones((B, T), np.int32)
    mask[1, -3:] = 0
    return jnp.asarray(tok), jnp.asarray(mask)


def test_replaying_the_own_routes_is_exact_and_keeps_router_gradients():
    """Unchanged parameters: replaying the forward's own routes gives bit-identical logits and identical gradients,
    the router's included (gates recomputed from the current router, not frozen probabilities)."""
    cfg = _cfg()
    params = transformer.init(cfg, jax.random.key(0))
    tok, mask = _tokens(cfg)
    fwd = jax.jit(lambda p, r: transformer.forward(p, tok, cfg, attn_mask=mask, routes=r, return_routes=True))
    logits, aux = fwd(params, None)
    routes = aux["routes"]
    assert routes.shape == (3, 10, 2, 2) and routes.dtype == jnp.int32
    replayed, aux_r = fwd(params, routes)
    np.testing.assert_array_equal(np.asarray(replayed), np.asarray(logits))
    assert float(jnp.sum(aux_r["replay_differ"])) == 0 and float(jnp.sum(aux_r["replay_compared"])) == 2 * mask.sum()

    w = jax.random.normal(jax.random.key(1), logits.shape)

    def loss(p, r):
        out, a = transformer.forward(p, tok, cfg, attn_mask=mask, routes=r)
        return jnp.sum(out * w) + jnp.sum(a["router_aux_loss"])

    grad = jax.jit(jax.grad(loss))  # jitted: the MoE's scans run eagerly op by op otherwise (minutes)
    g_own, g_rep = grad(params, None), grad(params, routes)
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(g_own)[0], jax.tree.leaves(g_rep)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-6, atol=1e-7, err_msg=jax.tree_util.keystr(path))
    g_rep = layer_stack.per_layer(g_rep, cfg)
    for i in range(cfg.n_layers):
        assert float(jnp.abs(g_rep[f"block_{i}"]["moe"]["router"]).max()) > 0


def test_replayed_experts_are_used_and_gates_follow_the_router():
    """Forced routes are what the layer runs (vs a float64 loop over tokens); gate weights are the current router's
    probabilities at those experts, renormalised; tokens without a record (-1) route themselves."""
    rng = np.random.default_rng(2)
    D, E, F, N = 8, 4, 6, 5
    cfg = ModelConfig(d_model=D, d_ff=F, n_experts=E, experts_per_token=2, moe_every=1)
    p = {"router": rng.normal(size=(D, E)), "w_gate": rng.normal(size=(E, D, F)) / 3,
         "w_up": rng.normal(size=(E, D, F)) / 3, "w_down": rng.normal(size=(E, F, D)) / 3}
    x = rng.normal(size=(1, N, D))
    forced = np.array([[0, 1], [3, 2], [-1, -1], [1, 3], [2, 0]], np.int32)
    pj = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), p)
    y, st = moe.moe_layer(pj, jnp.asarray(x, jnp.float32), cfg, routes_BTK=jnp.asarray(forced)[None])

    logits = x[0] @ p["router"]
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    own = np.argsort(-probs, axis=-1)[:, :2]
    want = np.zeros((N, D))
    for n in range(N):
        ex = forced[n] if forced[n, 0] >= 0 else own[n]
        g = probs[n, ex] / probs[n, ex].sum()
        for e, gw in zip(ex, g):
            h = x[0, n] @ p["w_gate"][e]
            want[n] += gw * ((h / (1 + np.exp(-h)) * (x[0, n] @ p["w_up"][e])) @ p["w_down"][e])
    np.testing.assert_allclose(np.asarray(y)[0], want, rtol=1e-5, atol=1e-5)
    used = np.asarray(st["experts"])
    np.testing.assert_array_equal(used[[0, 1, 3, 4]], forced[[0, 1, 3, 4]])
    np.testing.assert_array_equal(used[2], own[2])
    differ = sum(set(own[n]) != set(forced[n]) for n in (0, 1, 3, 4))
    assert float(st["replay_differ"]) == differ and float(st["replay_compared"]) == 4
    # replay=False: the same record is only compared, the router's own experts run
    _, st_off = moe.moe_layer(pj, jnp.asarray(x, jnp.float32), cfg, routes_BTK=jnp.asarray(forced)[None], replay=False)
    np.testing.assert_array_equal(np.asarray(st_off["experts"]), own)
    assert float(st_off["replay_differ"]) == differ


@pytest.mark.parametrize("kw,moe_layers", [(dict(n_layers=4, moe_every=2), (1, 3)),
                                           pytest.param(dict(n_layers=4, moe_every=1, dense_layers=(1,)), (0, 2, 3),
                                                        marks=pytest.mark.slow)])
def test_route_slots_follow_the_moe_blocks_when_some_are_dense(kw, moe_layers):
    """routes[..., j, :] belongs to MoE block cfg.moe_layers[j]: forcing slot j changes block j's experts only from
    that block on (blocks before it route as before), whatever dense blocks sit in between."""
    cfg = _cfg(**kw)
    assert cfg.moe_layers == moe_layers
    params = transformer.init(cfg, jax.random.key(3))
    tok, mask = _tokens(cfg, seed=4)
    _, aux = transformer.forward(params, tok, cfg, attn_mask=mask, return_routes=True)
    own = np.asarray(aux["routes"])
    assert own.shape[2] == len(moe_layers)
    for j in range(len(moe_layers)):
        forced = np.full_like(own, -1)
        forced[:, :, j] = (own[:, :, j] + 1) % cfg.n_experts  # a different expert pair for every token
        _, aux_j = transformer.forward(params, tok, cfg, attn_mask=mask, routes=jnp.asarray(forced),
                                       return_routes=True)
        got = np.asarray(aux_j["routes"])
        np.testing.assert_array_equal(got[:, :, j], forced[:, :, j])
        np.testing.assert_array_equal(got[:, :, :j], own[:, :, :j])
        differ = np.asarray(aux_j["replay_differ"])
        assert differ[j] > 0 and np.all(np.delete(differ, j) == 0)  # only slot j had records
    with pytest.raises(ValueError, match="routes must be"):
        transformer.forward(params, tok, cfg, routes=jnp.zeros((3, 10, len(moe_layers) + 1, 2), jnp.int32))


@pytest.mark.slow  # default-suite budget (make test-slow runs it)
def test_sampler_records_the_routes_the_trainer_replays():
    """float32: the sampler's recorded experts (prefill + decode, by cache slot) are those a full forward over prompt
    + response chooses, and replaying them reproduces the sampler's logprobs; padding and each row's last token have
    no record."""
    from rl.logprobs import make_logprob_fn

    cfg = _cfg(n_layers=3, moe_every=1, dense_layers=(1,), max_seq_len=32)
    params = transformer.init(cfg, jax.random.key(5))
    prompts = jnp.array([[0, 0, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14]], jnp.int32)
    pmask = jnp.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], jnp.int32)
    K, N, Pw = 2, 8, 6
    out = sampling.generate(params, cfg, prompts, jax.random.key(6), prompt_mask=pmask, num_samples=K,
                            max_new_tokens=N, eos_id=-1, return_routes=True)
    routes = np.asarray(out.routes)
    assert routes.shape == (4, Pw + N, 2, 2)
    assert np.all(routes[:2, :2] == -1) and np.all(routes[:, -1] == -1) and np.all(routes[2:, :Pw] >= 0)
    # The same rows as the train step sees them: prompt + response, left padding kept, positions from the mask.
    toks = jnp.concatenate([jnp.repeat(prompts, K, 0), out.tokens], 1)
    am = jnp.concatenate([jnp.repeat(pmask, K, 0), jnp.ones_like(out.tokens)], 1)
    pos = jnp.maximum(jnp.cumsum(am, 1) - 1, 0)
    _, aux = transformer.forward(params, toks, cfg, attn_mask=am, positions=pos, return_routes=True)
    has = routes[..., 0] >= 0
    np.testing.assert_array_equal(np.sort(np.asarray(aux["routes"]), -1)[has], np.sort(routes, -1)[has])
    # replay in the trainer's logprob function matches the sampler: rows as the train step holds them (the left
    # padding moved to the end, so positions start at 0 on the first real token)
    shift = [2, 2, 0, 0]
    roll = lambda a: np.stack([np.roll(np.asarray(a)[r], -shift[r], axis=0) for r in range(4)])
    logp = np.asarray(make_logprob_fn(cfg)(params, jnp.asarray(roll(toks)), jnp.asarray(roll(am)), 1.0,
                                           jnp.asarray(roll(routes))))
    got = np.stack([logp[r, Pw - shift[r] : Pw - shift[r] + N] for r in range(4)])
    np.testing.assert_allclose(got, np.asarray(out.logprobs), atol=1e-4)


def test_build_batch_places_the_sampler_routes_at_row_positions():
    from rl.rollout import Samples, build_batch, pad_rows

    W, M = 4, 3  # sampler prompt width, max new tokens
    routes = np.arange(2 * (W + M) * 1 * 2).reshape(2, W + M, 1, 2).astype(np.int32)
    routes[0, :2] = -1  # row 0's prompt has 2 real tokens, left-padded in the sampler
    s = Samples(prompt_index=np.array([0, 1]), tokens=np.array([[7, 8, 2], [9, 2, 0]], np.int32),
                logprobs=np.zeros((2, M), np.float32), lengths=np.array([3, 2], np.int32), texts=["", ""],
                group_sizes=np.array([1, 1]), routes=routes)
    b = build_batch([[1, 5], [1, 5, 6, 4]], s, length=9)
    r = b["routes"]
    np.testing.assert_array_equal(r[0, :2], routes[0, 2:4])
    np.testing.assert_array_equal(r[0, 2:5], routes[0, 4:7])
    np.testing.assert_array_equal(r[1, :4], routes[1, :4])
    np.testing.assert_array_equal(r[1, 4:6], routes[1, 4:6])
    assert np.all(r[0, 5:] == -1) and np.all(r[1, 6:] == -1)
    assert np.all(pad_rows(b, 4)["routes"][2:] == -1)  # padding rows carry no record


def test_expert_parallel_path_replays_the_same_routes():
    """With a mesh whose expert axis is 2 (data 4 x expert 2), replay happens before the all-to-all dispatch: same
    outputs and gradients as the single-device replay."""
    assert jax.device_count() == 8, "tests/conftest.py must force 8 CPU devices"
    mesh = sharding.make_mesh({"data": 4, "expert": 2})
    rng = np.random.default_rng(7)
    D, E, F = 16, 4, 8
    cfg = ModelConfig(d_model=D, d_ff=F, n_experts=E, experts_per_token=2, moe_every=1)
    p = {"router": rng.normal(size=(D, E)), "w_gate": rng.normal(size=(E, D, F)) / 3,
         "w_up": rng.normal(size=(E, D, F)) / 3, "w_down": rng.normal(size=(E, F, D)) / 3}
    p = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), p)
    x = jnp.asarray(rng.normal(size=(4, 6, D)), jnp.float32)
    routes = jnp.asarray(np.stack([rng.permutation(E)[:2] for _ in range(24)]).reshape(4, 6, 2), jnp.int32)

    def loss(p, x, mesh):
        y, st = moe.moe_layer(p, x, cfg, mesh=mesh, routes_BTK=routes)
        return jnp.sum(jnp.sin(y) * x), (y, st["experts"])

    grad = jax.grad(loss, has_aux=True)
    g1, (y1, e1) = jax.jit(grad, static_argnums=2)(p, x, None)
    spec = {"router": P(), "w_gate": P("expert"), "w_up": P("expert"), "w_down": P("expert")}
    p8 = {k: jax.device_put(v, NamedSharding(mesh, spec[k])) for k, v in p.items()}
    g8, (y8, e8) = jax.jit(grad, static_argnums=2)(p8, jax.device_put(x, NamedSharding(mesh, P("data"))), mesh)
    np.testing.assert_array_equal(np.asarray(e8), np.asarray(routes).reshape(-1, 2))
    np.testing.assert_allclose(np.asarray(y8), np.asarray(y1), rtol=1e-5, atol=1e-5)
    for k in p:
        np.testing.assert_allclose(np.asarray(g8[k]), np.asarray(g1[k]), rtol=1e-4, atol=1e-5, err_msg=k)
    assert float(jnp.abs(g8["router"]).max()) > 0


@pytest.mark.slow  # default-suite budget (make test-slow runs it)
def test_train_step_replays_logs_disagreement_and_needs_routes():
    from rl.train_step import LossConfig, OptimConfig, init_train_state, make_loss_fn, make_train_step

    cfg = _cfg(n_layers=1)
    tok, mask = _tokens(cfg, B=4, T=8, seed=8)
    loss_mask = np.asarray(mask).copy()
    loss_mask[:, :3] = 0
    params = transformer.init(cfg, jax.random.key(9))
    _, aux = transformer.forward(params, tok, cfg, attn_mask=mask, return_routes=True)
    flipped = np.asarray(aux["routes"]).copy()
    flipped[0, :4, 0] = (flipped[0, :4, 0] + 1) % cfg.n_experts  # 4 token routes recorded differently
    batch = {"tokens": tok, "attn_mask": mask, "loss_mask": jnp.asarray(loss_mask),
             "advantages": jnp.asarray(np.linspace(-1, 1, 4), jnp.float32), "routes": jnp.asarray(flipped)}
    replay = LossConfig(mode="grpo", routing_replay=True)
    fn = make_loss_fn(cfg, replay, None, None)
    (_, met), grads = jax.value_and_grad(fn, has_aux=True)(params, batch, 0.0)
    assert float(met["router/replay_disagreement"]) == pytest.approx(4 / float(mask.sum()))
    assert float(jnp.abs(layer_stack.per_layer(grads, cfg)["block_0"]["moe"]["router"]).max()) > 0
    # the replayed forward is the one trained: its loss differs from the recomputed one's
    (_, met_own), _ = jax.value_and_grad(make_loss_fn(cfg, LossConfig(mode="grpo"), None, None), has_aux=True)(
        params, batch, 0.0)
    assert float(met_own["router/replay_disagreement"]) == float(met["router/replay_disagreement"])
    assert float(met_own["loss/policy"]) != float(met["loss/policy"]) or float(met_own["entropy"]) != float(met["entropy"])
    state = init_train_state(cfg, replay, OptimConfig(), jax.random.key(0), params=params)
    with pytest.raises(ValueError, match="routing_replay needs"):
        make_train_step(cfg, replay, OptimConfig())(state, {k: v for k, v in batch.items() if k != "routes"},
                                                    {"lr": 1e-3, "kl_coef": 0.0})


def test_config_refuses_routing_replay_without_moe_layers():
    from experiments.configs.common import base_config, stage
    from rl import config_validation as cv

    c = base_config({})
    c.model.update(dict(n_experts=0))
    c.stages = [stage("grpo", "grpo", routing_replay=True)]
    with pytest.raises(cv.ConfigError, match=r"stages\[0\].routing_replay needs an MoE model"):
        cv.validate(c)
    c.model.update(dict(n_experts=4, moe_every=1))
    cv.validate(c)
