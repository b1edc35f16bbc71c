"""models/lora.py: LoRA adapters on a tiny model and on the llama fixture of tests/data/hf.

At init the adapted model's logits are the base's bit for bit; gradients and optimizer state exist for the adapters
only; the merged weight of one projection and the unmerged projection x W + s (x A) B agree with a float64 NumPy
reference; hf.save(..., lora=adapters) reloads to the merged model's logits; the config section validates.
"""

from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from models import hf, layer_stack, layers, lora, sampling, sharding, transformer
from models.config import ModelConfig

jax.config.update("jax_default_matmul_precision", "highest")

LLAMA = Path(__file__).parent / "data" / "hf" / "llama"
FWD = jax.jit(transformer.forward, static_argnames=("cfg",))
ALL_TARGETS = ("attn/wq", "attn/wk", "attn/wv", "attn/wo", "mlp/w_gate", "mlp/w_up", "mlp/w_down", "moe/w_gate",
               "moe/w_up", "moe/w_down")
# Block 0 dense (stack_0), block 1 MoE (stack_1): every target kind, the experts' included.
CFG = ModelConfig(vocab_size=40, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=24, n_experts=4,
                  experts_per_token=2, moe_every=2, max_seq_len=16, lora=dict(rank=3, alpha=6.0, targets=ALL_TARGETS))


def _tokens(cfg, shape=(2, 7), seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(0, cfg.vocab_size, shape), jnp.int32)


@partial(jax.jit, static_argnames=("seed", "scale"))  # one compiled program (eagerly: one per leaf shape)
def _perturbed(adapters, seed=1, scale=0.3):
    """Adapters with B != 0 (a trained state), so the merge changes the weights."""
    leaves, treedef = jax.tree.flatten(adapters)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(treedef, [x + scale * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)])


@pytest.fixture(scope="module")
def base():
    return transformer.init(CFG, jax.random.key(0))


def test_adapters_at_init_leave_logits_unchanged(base):
    adapters = lora.init(base, CFG, jax.random.key(1))
    assert not any(np.any(np.asarray(ad["b"])) for ad in _pairs(adapters))  # B = 0, A random
    assert all(np.std(np.asarray(ad["a"])) > 0 for ad in _pairs(adapters))
    tokens = _tokens(CFG)
    ref, _ = FWD(base, tokens, cfg=CFG)
    got, _ = FWD(lora.merge(base, adapters, CFG), tokens, cfg=CFG)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))
    assert lora.is_identity(adapters)  # what tells a stage its reference is the base itself
    one_b = jax.tree_util.tree_map_with_path(
        lambda path, x: x.at[(0,) * x.ndim].set(1e-3) if path[-1].key == "b" and path[0].key == "stack_1" else x,
        adapters)
    assert not lora.is_identity(one_b)


def _pl(tree, cfg=CFG):
    """The per-layer view ("block_i") of stacked params or adapters (models/layer_stack.py)."""
    return layer_stack.per_layer(tree, cfg)


def _pairs(adapters):
    return [node for node in jax.tree.leaves(adapters, is_leaf=lambda x: isinstance(x, dict) and "a" in x)]


def test_adapter_shapes_follow_the_weights(base):
    adapters = lora.init(base, CFG, jax.random.key(1))
    r, E = 3, CFG.n_experts
    D, N, K, H, F = CFG.d_model, CFG.n_heads, CFG.n_kv_heads, CFG.head_dim, CFG.d_ff
    b0, b1 = _pl(adapters)["block_0"], _pl(adapters)["block_1"]
    assert adapters["stack_0"]["attn"]["wq"]["a"].shape == (1, D, r)  # stacked: the stack's layer axis first
    assert b0["attn"]["wq"]["a"].shape == (D, r) and b0["attn"]["wq"]["b"].shape == (r, N, H)
    assert b0["attn"]["wk"]["b"].shape == (r, K, H)
    assert b0["attn"]["wo"]["a"].shape == (N, H, r) and b0["attn"]["wo"]["b"].shape == (r, D)
    assert b0["mlp"]["w_down"]["a"].shape == (F, r) and "moe" not in b0
    assert b1["moe"]["w_gate"]["a"].shape == (E, D, r) and b1["moe"]["w_gate"]["b"].shape == (E, r, F)
    assert "mlp" not in b1 and "router" not in b1["moe"]


def test_merged_projection_matches_float64_reference(base):
    """wo (two contracted dims) and a routed expert's w_down: merge against NumPy float64, and x @ merged against
    the unmerged x W + s (x A) B."""
    stacked_base = base
    adapters_s = _perturbed(lora.init(base, CFG, jax.random.key(1)))
    merged_s = lora.merge(base, adapters_s, CFG)
    base, adapters, merged = _pl(base), _pl(adapters_s), _pl(merged_s)  # the reference works layer by layer
    s = 6.0 / 3
    x = np.random.default_rng(2).normal(size=(5, CFG.n_heads * CFG.head_dim))
    w = np.asarray(base["block_0"]["attn"]["wo"], np.float64).reshape(-1, CFG.d_model)
    a = np.asarray(adapters["block_0"]["attn"]["wo"]["a"], np.float64).reshape(-1, 3)
    b = np.asarray(adapters["block_0"]["attn"]["wo"]["b"], np.float64)
    got = np.asarray(merged["block_0"]["attn"]["wo"], np.float64).reshape(-1, CFG.d_model)
    np.testing.assert_allclose(got, w + s * a @ b, rtol=0, atol=1e-6)
    unmerged = x @ w + s * (x @ a) @ b
    np.testing.assert_allclose(np.asarray(jnp.asarray(x, jnp.float32) @ jnp.asarray(got, jnp.float32)), unmerged,
                               rtol=0, atol=1e-5)
    e = 2
    w_e = np.asarray(base["block_1"]["moe"]["w_down"][e], np.float64)
    a_e = np.asarray(adapters["block_1"]["moe"]["w_down"]["a"][e], np.float64)
    b_e = np.asarray(adapters["block_1"]["moe"]["w_down"]["b"][e], np.float64)
    np.testing.assert_allclose(np.asarray(merged["block_1"]["moe"]["w_down"][e]), w_e + s * a_e @ b_e, atol=1e-6)
    # The merged model's logits differ from the base's (the adapters do something), untargeted arrays are the base's.
    assert merged_s["embed"] is stacked_base["embed"]
    assert merged_s["stack_1"]["moe"]["router"] is stacked_base["stack_1"]["moe"]["router"]
    tokens = _tokens(CFG)
    assert not np.allclose(np.asarray(FWD(merged_s, tokens, cfg=CFG)[0]),
                           np.asarray(FWD(stacked_base, tokens, cfg=CFG)[0]))


def _nll(params, tokens):
    logits, _ = transformer.forward(params, tokens, CFG)
    logp = jax.nn.log_softmax(logits[:, :-1])
    return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))


VALUE_AND_GRAD = jax.jit(lambda trainable, frozen, tokens: lora.value_and_grad(_nll, trainable, frozen, CFG, tokens))


def test_gradients_and_optimizer_state_reach_only_adapters(base):
    params = {**base, "lora": lora.init(base, CFG, jax.random.key(1))}
    trainable, frozen = lora.split(params, CFG)
    assert set(trainable) == {"lora"} and set(frozen) == set(base)
    assert lora.combine(trainable, frozen).keys() == params.keys()
    tokens = _tokens(CFG, (3, 9))
    loss, grads = VALUE_AND_GRAD(trainable, frozen, tokens)
    assert jax.tree.structure(grads) == jax.tree.structure(trainable)  # no gradient of the base exists
    # At init (B = 0) the gradient reaches B and not yet A (dA = s dW B^T): the chain rule, checked both ways.
    assert all(np.any(np.asarray(g["b"])) and not np.any(np.asarray(g["a"])) for g in _pairs(grads["lora"]))
    opt = optax.adam(1e-2)
    state = opt.init(trainable)
    n_adapter = sum(x.size for x in jax.tree.leaves(trainable))
    assert sum(x.size for x in jax.tree.leaves(state) if x.ndim) == 2 * n_adapter  # mu and nu of the adapters only
    updates, state = opt.update(grads, state, trainable)
    trainable = optax.apply_updates(trainable, updates)
    loss2, grads2 = VALUE_AND_GRAD(trainable, frozen, tokens)
    assert float(loss2) < float(loss)
    assert all(np.any(np.asarray(g["a"])) for g in _pairs(grads2["lora"]))  # B != 0 now: A learns too
    # A finite-difference check of one B entry: the gradient is that of the merged model's loss.
    ad = trainable["lora"]["stack_0"]["attn"]["wv"]["b"]  # [layer, r, K, H]
    eps = 1e-3
    bump = lambda d: {"lora": {**trainable["lora"], "stack_0": {**trainable["lora"]["stack_0"], "attn": {  # noqa: E731
        **trainable["lora"]["stack_0"]["attn"], "wv": {"a": trainable["lora"]["stack_0"]["attn"]["wv"]["a"],
                                                         "b": ad.at[0, 0, 1, 2].add(d)}}}}}
    fd = (float(VALUE_AND_GRAD(bump(eps), frozen, tokens)[0])
          - float(VALUE_AND_GRAD(bump(-eps), frozen, tokens)[0])) / (2 * eps)
    np.testing.assert_allclose(float(grads2["lora"]["stack_0"]["attn"]["wv"]["b"][0, 0, 1, 2]), fd, rtol=2e-2,
                               atol=1e-5)


def test_value_head_stays_trainable_next_to_adapters(base):
    params = {**base, "lora": lora.init(base, CFG, jax.random.key(1)), "value_head": {"w": jnp.zeros(16), "b": 0.0}}
    trainable, frozen = lora.split(params, CFG)
    assert set(trainable) == {"lora", "value_head"}
    assert lora.model_params(trainable, frozen, CFG)["value_head"] is params["value_head"]


def test_hf_save_merges_adapters_and_reloads_the_merged_logits(tmp_path):
    cfg, base = hf.load(LLAMA)
    cfg = cfg.replace(lora=dict(rank=2, alpha=4.0))
    adapters = _perturbed(lora.init(base, cfg, jax.random.key(3)), scale=0.2)
    merged = lora.merge(base, adapters, cfg)
    hf.save(tmp_path / "merged", cfg, base, lora=adapters)
    cfg2, reloaded = hf.load(tmp_path / "merged")
    tokens = _tokens(cfg, (2, 11), seed=4)
    assert cfg2 == cfg.replace(lora=None)
    want, _ = FWD(merged, tokens, cfg=cfg2)  # forward does not read cfg.lora: one compiled program for the three
    got, _ = FWD(reloaded, tokens, cfg=cfg2)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=1e-5)
    base_logits, _ = FWD(base, tokens, cfg=cfg2)
    assert np.max(np.abs(np.asarray(want) - np.asarray(base_logits))) > 1e-2  # the merge is in the file


def test_checkpoint_item_round_trip_and_mismatch(base):
    trainable = {"lora": _perturbed(lora.init(base, CFG, jax.random.key(1)))}
    tree, meta = lora.checkpoint_item(trainable, CFG)
    assert set(tree) == {"lora"} and meta == {"lora": {"rank": 3, "alpha": 6.0, "targets": list(ALL_TARGETS)}}
    restored = lora.restore_item(jax.tree.map(np.asarray, tree), meta, base, CFG)
    assert jax.tree.structure(restored) == jax.tree.structure(trainable)
    with pytest.raises(ValueError, match="lora=LoraConfig"):
        lora.restore_item(tree, {"lora": {**meta["lora"], "rank": 4}}, base, CFG)
    wrong = {**tree["lora"], "stack_0": {**tree["lora"]["stack_0"], "attn": {
        **tree["lora"]["stack_0"]["attn"], "wq": {"a": jnp.zeros((1, 16, 2)), "b": jnp.zeros((1, 2, 4, 8))}}}}
    with pytest.raises(ValueError, match="stack_0/attn/wq has shapes"):
        lora.restore_item({"lora": wrong}, meta, base, CFG)


def test_param_axes_mirror_the_adapters(base):
    axes = lora.param_axes(transformer.param_axes(CFG), CFG)
    adapters = lora.init(base, CFG, jax.random.key(1))
    is_axes = lambda x: isinstance(x, tuple)  # noqa: E731
    assert jax.tree.structure(axes, is_leaf=is_axes) == jax.tree.structure(adapters)
    # the stack's layer axis first (replicated), then the weight's own
    assert axes["stack_1"]["moe"]["w_gate"] == {"a": (None, "expert", "embed", None),
                                                "b": (None, "expert", None, "mlp")}
    assert axes["stack_0"]["attn"]["wo"] == {"a": (None, "heads", "head_dim", None), "b": (None, None, "embed")}


@pytest.mark.parametrize("section, message", [
    (dict(rank=0), "lora.rank"), (dict(alpha=0.0), "lora.alpha"), (dict(alpha=float("nan")), "lora.alpha"),
    (dict(alpha=1e300), r"lora.alpha must be a finite number in \(0, 65536\]"),  # accepted once: every step skipped
    (dict(targets=("attn/wz",)), "lora.targets"), (dict(targets=()), "lora.targets"),
    (dict(ranks=2), "lora.ranks is not a known field"),
])
def test_config_section_errors_name_the_field(section, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(lora=section)


def test_target_absent_from_the_model_is_an_error():
    cfg = ModelConfig(n_experts=0, lora=dict(targets=("moe/w_up",)))
    with pytest.raises(ValueError, match="match no parameter"):
        lora.init(transformer.init(cfg, jax.random.key(0)), cfg, jax.random.key(1))


# ---- the sampler on merged weights against an unmerged float64 NumPy forward -----------------------------------------
DENSE = ModelConfig(vocab_size=40, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=24, n_experts=0,
                    max_seq_len=24, lora=dict(rank=2, alpha=3.0))


def _np_forward_unmerged(params, adapters, tokens, cfg):
    """float64 logits [T, V] of one sequence, every targeted projection computed unmerged: x W + s (x A) B."""
    f = lambda x: np.asarray(x, np.float64)  # noqa: E731
    s = cfg.lora.alpha / cfg.lora.rank
    T, H, G = len(tokens), cfg.head_dim, cfg.n_heads // cfg.n_kv_heads

    def proj(x, w, ad, n_in=1):  # x [T, *in] -> [T, *out]
        w, a, b = f(w), f(ad["a"]), f(ad["b"])
        x2 = x.reshape(T, -1)
        out = x2 @ w.reshape(x2.shape[1], -1) + s * (x2 @ a.reshape(x2.shape[1], -1)) @ b.reshape(b.shape[0], -1)
        return out.reshape(T, *w.shape[n_in:])

    def norm(x, scale):
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + cfg.norm_eps) * f(scale)

    def rope(x):  # [T, heads, H], half-split pairs (i, i + H/2)
        inv = cfg.rope_theta ** (-np.arange(H // 2) / (H // 2))
        ang = np.arange(T)[:, None] * inv[None]
        cos, sin = np.cos(ang)[:, None], np.sin(ang)[:, None]
        x1, x2 = x[..., :H // 2], x[..., H // 2:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    params, adapters = layer_stack.per_layer(params, cfg), layer_stack.per_layer(adapters, cfg)
    x = f(params["embed"])[tokens]
    for i in range(cfg.n_layers):
        p, ad = params[f"block_{i}"], adapters[f"block_{i}"]
        h = norm(x, p["attn_norm"])
        q = rope(proj(h, p["attn"]["wq"], ad["attn"]["wq"]))
        k = rope(proj(h, p["attn"]["wk"], ad["attn"]["wk"]))
        v = proj(h, p["attn"]["wv"], ad["attn"]["wv"])
        k, v = np.repeat(k, G, axis=1), np.repeat(v, G, axis=1)  # query head n reads kv head n // G
        scores = np.einsum("tnh,snh->nts", q, k) * H ** -0.5
        scores = np.where(np.tril(np.ones((T, T), bool))[None], scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        x = x + proj(np.einsum("nts,snh->tnh", probs, v), p["attn"]["wo"], ad["attn"]["wo"], n_in=2)
        h = norm(x, p["mlp_norm"])
        g, u = proj(h, p["mlp"]["w_gate"], ad["mlp"]["w_gate"]), proj(h, p["mlp"]["w_up"], ad["mlp"]["w_up"])
        x = x + proj(g / (1 + np.exp(-g)) * u, p["mlp"]["w_down"], ad["mlp"]["w_down"])
    h = norm(x, params["final_norm"])
    return h @ f(params["embed"]).T * cfg.d_model ** -0.5  # tied, scaled unembedding (the defaults)


def test_sampling_merged_weights_equals_the_unmerged_float64_forward():
    base = transformer.init(DENSE, jax.random.key(5))
    adapters = _perturbed(lora.init(base, DENSE, jax.random.key(6)), scale=0.3)
    merged = lora.merge(base, adapters, DENSE)
    prompt = np.asarray([[3, 17, 5, 29, 11]], np.int32)
    out = sampling.generate(merged, DENSE, prompt, jax.random.key(7), temperature=1.0, max_new_tokens=6, eos_id=-1)
    new = np.asarray(out.tokens)[0]
    logits = _np_forward_unmerged(base, adapters, np.concatenate([prompt[0], new[:-1]]), DENSE)
    logp = logits - np.log(np.sum(np.exp(logits - logits.max(-1, keepdims=True)), -1, keepdims=True)) - logits.max(
        -1, keepdims=True)
    want = logp[prompt.shape[1] - 1:][np.arange(len(new)), new]
    np.testing.assert_allclose(np.asarray(out.logprobs)[0], want, rtol=0, atol=1e-4)
    # The adapters matter at this scale: the base model's logprobs of the same tokens differ.
    base_logits = _np_forward_unmerged(base, jax.tree.map(jnp.zeros_like, adapters),
                                       np.concatenate([prompt[0], new[:-1]]), DENSE)
    assert np.max(np.abs(base_logits - logits)) > 1e-2


def test_sharded_adapters_merge_into_the_base_layout(base):
    """Base in transformer.param_shardings, adapters in lora.shardings: the jitted merge runs sharded, writes the
    base's layout and equals the unsharded merge."""
    assert jax.device_count() == 8, "tests/conftest.py must force 8 CPU devices before JAX starts"
    mesh = sharding.make_mesh({"data": 2, "expert": 2, "tensor": 2})
    adapters = _perturbed(lora.init(base, CFG, jax.random.key(1)))
    base_sh = transformer.param_shardings(CFG, mesh)
    ad_sh = lora.shardings(adapters, transformer.param_axes(CFG), CFG, mesh)
    assert ad_sh["stack_1"]["moe"]["w_up"]["a"].spec[1] == "expert"  # experts' adapters live with their experts
    merge = jax.jit(lambda b, a: lora.merge(b, a, CFG), out_shardings=base_sh)
    got = merge(jax.device_put(base, base_sh), jax.device_put(adapters, ad_sh))
    want = lora.merge(base, adapters, CFG)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=0, atol=1e-6)


def test_bf16_base_keeps_its_dtype_and_float32_adapters(base):
    cfg = CFG.replace(dtype="bfloat16", param_dtype="bfloat16")
    base = jax.tree.map(lambda x: x.astype(jnp.bfloat16), base)
    adapters = lora.init(base, cfg, jax.random.key(1))
    assert {x.dtype for x in jax.tree.leaves(adapters)} == {jnp.dtype(jnp.float32)}
    merged = lora.merge(base, adapters, cfg)
    for m, b in zip(jax.tree.leaves(merged), jax.tree.leaves(base)):
        assert m.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(m, np.float32), np.asarray(b, np.float32))  # B = 0: exact
    adapters = _perturbed(adapters)
    w, got = _pl(base)["block_0"]["attn"]["wq"], _pl(lora.merge(base, adapters, cfg))["block_0"]["attn"]["wq"]
    a, b = (np.asarray(_pl(adapters)["block_0"]["attn"]["wq"][k], np.float64) for k in ("a", "b"))
    want = np.asarray(w, np.float64) + 2.0 * (a @ b.reshape(3, -1)).reshape(w.shape)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2 ** -8, atol=1e-6)  # one bf16 rounding


@pytest.mark.parametrize("spec, x_shape, w_shape", [
    ("BTD,DF->BTF", (2, 3, 5), (5, 7)),  # w_gate / w_up / w_down
    ("BTD,DNH->BTNH", (2, 3, 5), (5, 2, 4)),  # wq / wk / wv: two out dims
    ("BTE,ED->BTD", (2, 3, 6), (6, 5)),  # wo after flatten_in
])
def test_low_rank_projection_gradients_match_float64_reference(spec, x_shape, w_shape):
    """layers.project over a LowRank (the low-rank term x A, then @ B): value and gradients with respect to x, A
    and B against NumPy float64 of y = x W + s (x A) B under the loss sum(y * G)."""
    rng = np.random.default_rng(3)
    r, s = 3, 1.7
    n_in = x_shape[-1]
    x, w = rng.normal(size=x_shape), rng.normal(size=w_shape)
    a, b = rng.normal(size=(n_in, r)), rng.normal(size=(r, *w_shape[1:]))
    out_shape = (*x_shape[:-1], *w_shape[1:])
    g = rng.normal(size=out_shape)
    f32 = lambda v: jnp.asarray(v, jnp.float32)  # noqa: E731

    def loss(x, a, b):
        y = layers.project(spec, x, layers.LowRank(w=f32(w), a=a, b=b, scale=s))
        return jnp.sum(y * f32(g)), y

    (_, y), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(f32(x), f32(a), f32(b))
    X, W, B = x.reshape(-1, n_in), w.reshape(n_in, -1), b.reshape(r, -1)  # the reference in 2-D
    G = g.reshape(X.shape[0], -1)
    np.testing.assert_allclose(np.asarray(y).reshape(G.shape), X @ W + s * (X @ a) @ B, rtol=1e-5, atol=1e-5)
    dU = s * G
    want = (G @ W.T + dU @ B.T @ a.T, X.T @ (dU @ B.T), (X @ a).T @ dU)
    for got, ref in zip(grads, want):
        np.testing.assert_allclose(np.asarray(got).reshape(ref.shape), ref, rtol=1e-5, atol=1e-4)
