"""model.scan_layers over the stacked blocks (models/layer_stack.py, models/transformer.py _run_blocks): each group
of stacks as one lax.scan gives the unrolled model's logits, router statistics, recorded routes, KV cache, gradients
and sampler outputs, for dense, all-MoE and interleaved (dense / MoE every other block) models, with and without
remat, in the flat and the grouped (shared-prompt) layout; and the scanned program holds one period of blocks where
the unrolled one holds n_layers. (tests/test_model.py checks the scanned forward against a float64 NumPy model.)"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import sampling, shared_prompt, sharding, transformer
from models.config import ModelConfig

BASE = dict(vocab_size=48, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48, max_seq_len=32,
            capacity_factor=None)
KINDS = {"dense": dict(n_experts=0), "moe": dict(n_experts=4, experts_per_token=2, moe_every=1),
         "mixed": dict(n_experts=4, experts_per_token=2, moe_every=2, n_layers=6)}


def cfgs(kind, **kw):
    """(unrolled, scanned) configs of one model."""
    cfg = ModelConfig(**{**BASE, **KINDS[kind], **kw, "scan_layers": False})
    return cfg, cfg.replace(scan_layers=True)


def tokens_and_mask(B=3, T=10, seed=0):
    rng = np.random.default_rng(seed)
    toks = rng.integers(1, BASE["vocab_size"], size=(B, T)).astype(np.int32)
    mask = np.ones((B, T), np.int32)
    mask[1, 7:] = 0
    return jnp.asarray(toks), jnp.asarray(mask)


def close(a, b, tol=2e-5):
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=tol, atol=tol)


@pytest.mark.parametrize("kind", ["dense", "moe", "mixed"])
def test_forward_logits_stats_and_routes_match_the_unrolled_model(kind):
    cfg, scan = cfgs(kind)
    params = transformer.init(cfg, jax.random.key(0))
    toks, mask = tokens_and_mask()
    want, aux_w = transformer.forward(params, toks, cfg, attn_mask=mask, return_routes=True)
    got, aux_g = transformer.forward(params, toks, scan, attn_mask=mask, return_routes=True)
    close(got, want)
    assert set(aux_g) == set(aux_w)
    for k in aux_w:
        if k == "routes":
            np.testing.assert_array_equal(np.asarray(aux_g[k]), np.asarray(aux_w[k]))
        else:
            close(aux_g[k], aux_w[k])
    if kind == "moe":  # routing replay of recorded routes through the scan
        routes = aux_w["routes"][:, :, ::-1]  # another layer's choices: replay must follow them
        w, _ = transformer.forward(params, toks, cfg, attn_mask=mask, routes=routes)
        g, _ = transformer.forward(params, toks, scan, attn_mask=mask, routes=routes)
        close(g, w)


@pytest.mark.parametrize("kind,remat", [pytest.param("dense", False, marks=pytest.mark.slow), ("dense", True),
                                        ("moe", True), ("mixed", False)])  # dense / no remat: slow (suite time)
def test_gradients_match_the_unrolled_model(kind, remat):
    cfg, scan = cfgs(kind, remat=remat)
    params = transformer.init(cfg, jax.random.key(1))
    toks, mask = tokens_and_mask(seed=1)

    def loss(p, c):
        logits, aux = transformer.forward(p, toks, c, attn_mask=mask)
        logp = jax.nn.log_softmax(logits[:, :-1], -1)
        nll = -jnp.take_along_axis(logp, toks[:, 1:, None], -1)[..., 0] * mask[:, 1:]
        return nll.sum() / mask.sum() + 0.01 * aux["router_aux_loss"].sum()

    gw = jax.grad(loss)(params, cfg)
    gg = jax.grad(loss)(params, scan)
    jax.tree.map(lambda a, b: close(a, b, 5e-5), gg, gw)


@pytest.mark.parametrize("kind", ["dense", "moe", "mixed"])
def test_cache_path_and_grouped_layout_match(kind):
    """The cache path (a prefill into per-layer buffers, then the shared-prompt answers) scans too."""
    cfg, scan = cfgs(kind)
    params = transformer.init(cfg, jax.random.key(2))
    rng = np.random.default_rng(2)
    G, K, P, C = 2, 3, 5, 4
    prompts = jnp.asarray(rng.integers(1, 48, size=(G, P)), jnp.int32)
    pmask = jnp.asarray([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]], jnp.int32)
    answers = jnp.asarray(rng.integers(1, 48, size=(G * K, C)), jnp.int32)
    amask = jnp.ones((G * K, C), jnp.int32).at[2, 3:].set(0)
    want, aux_w = shared_prompt.forward(params, prompts, pmask, answers, amask, cfg)
    got, aux_g = shared_prompt.forward(params, prompts, pmask, answers, amask, scan)
    close(got, want)
    cache = transformer.init_cache(cfg, G, P + C)
    _, a_w = transformer.forward(params, prompts, cfg, attn_mask=pmask, cache=cache, cache_index=jnp.int32(0))
    _, a_g = transformer.forward(params, prompts, scan, attn_mask=pmask, cache=cache, cache_index=jnp.int32(0))
    assert isinstance(a_g["cache"]["k"], tuple) and len(a_g["cache"]["k"]) == cfg.n_layers
    jax.tree.map(close, a_g["cache"], a_w["cache"])


def test_sampler_output_is_unchanged():
    cfg, scan = cfgs("dense")
    params = transformer.init(cfg, jax.random.key(3))
    prompts = jnp.asarray(np.random.default_rng(3).integers(1, 48, size=(2, 6)), jnp.int32)
    mask = jnp.ones_like(prompts)
    kw = dict(max_new_tokens=6, temperature=1.0, eos_id=0, pad_id=0, prompt_mask=mask, num_samples=2)
    a = sampling.generate(params, cfg, prompts, jax.random.key(4), **kw)
    b = sampling.generate(params, scan, prompts, jax.random.key(4), **kw)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    close(a.logprobs, b.logprobs)


@pytest.mark.parametrize("kind, fewer", [("dense", 3), ("mixed", 2)])
def test_the_scan_compiles_one_period_of_blocks(kind, fewer):
    cfg, scan = cfgs(kind, n_layers=6)
    params = transformer.init(cfg, jax.random.key(6))
    toks, mask = tokens_and_mask()

    def n_dots(c):
        text = jax.jit(lambda p: transformer.forward(p, toks, c, attn_mask=mask)[0]).lower(params).as_text()
        return text.count("dot_general")

    # one block's projections instead of six blocks' (dense); one dense + one MoE block instead of six (mixed)
    assert n_dots(scan) < n_dots(cfg) / fewer


@pytest.mark.parametrize("kind", ["dense", "moe", "mixed"])
def test_sharded_scan_matches_unsharded(kind):
    """Weights in transformer.param_shardings over a data x fsdp x expert x tensor mesh of 8 CPU devices: the
    scanned forward and its gradient equal the unsharded unrolled ones."""
    assert jax.device_count() == 8, "tests/conftest.py must force 8 CPU devices before JAX starts"
    mesh = sharding.make_mesh({"data": 2, "fsdp": 1, "expert": 2, "tensor": 2})
    cfg, scan = cfgs(kind)
    params = transformer.init(cfg, jax.random.key(7))
    toks, mask = tokens_and_mask(B=4, seed=7)

    def loss(p, c, **kw):
        logits, _ = transformer.forward(p, toks, c, attn_mask=mask, **kw)
        return (jax.nn.logsumexp(logits, -1) * mask).sum()

    want_l, want_g = jax.value_and_grad(loss)(params, cfg)
    sharded = jax.device_put(params, transformer.param_shardings(scan, mesh))
    got_l, got_g = jax.jit(jax.value_and_grad(lambda p: loss(p, scan, mesh=mesh)))(sharded)
    close(got_l, want_l, 1e-4)
    jax.tree.map(lambda a, b: close(a, b, 1e-4), got_g, want_g)
