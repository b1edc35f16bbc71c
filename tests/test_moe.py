"""MoE layer: both dispatch paths against a float64 loop-over-experts reference, drops, router losses, gradients."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import models.cpu  # noqa: F401 - registers the CPU wing's kernels ("native", "windowed")
from models import kernels, moe, moe_kernels
from models.config import ModelConfig
from models.cpu import native_kernels, windowed

jax.config.update("jax_default_matmul_precision", "highest")

F64 = np.float64
D, F, E, K = 8, 12, 4, 2
CFG = ModelConfig(d_model=D, d_ff=F, n_experts=E, experts_per_token=K, moe_every=1)


def make_params(seed=0, n_shared=0, d=D, f=F, e=E):
    rng = np.random.default_rng(seed)
    p = {"router": rng.normal(size=(d, e)), "w_gate": rng.normal(size=(e, d, f)) / 3,
         "w_up": rng.normal(size=(e, d, f)) / 3, "w_down": rng.normal(size=(e, f, d)) / 3}
    if n_shared:
        p["shared"] = {"w_gate": rng.normal(size=(d, n_shared * f)) / 3, "w_up": rng.normal(size=(d, n_shared * f)) / 3,
                       "w_down": rng.normal(size=(n_shared * f, d)) / 3}
    return p


def to_jax(tree):
    return jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), tree)


# ---- float64 NumPy reference: a plain loop over tokens, their top-k experts, and capacity slots ----------------------
def np_swiglu(w_gate, w_up, w_down, x):
    g, u = x @ w_gate, x @ w_up
    return (g / (1 + np.exp(-g)) * u) @ w_down


def np_moe(p, x, k, mask=None, capacity_factor=None):
    """Returns (y [N, D], stats). Capacity priority: all first choices (token order), then all second choices."""
    p = jax.tree.map(lambda a: np.asarray(a, F64), p)
    x = np.asarray(x, F64)
    N, n_exp = x.shape[0], p["router"].shape[1]
    mask = np.ones(N, bool) if mask is None else np.asarray(mask, bool)
    logits = x @ p["router"]
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    top = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
    cap = None if capacity_factor is None else max(1, min(N, math.ceil(capacity_factor * N * k / n_exp)))
    taken = np.zeros(n_exp, int)
    y = np.zeros_like(x)
    routed = dropped = 0
    for slot in range(k):
        for n in range(N):
            if not mask[n]:
                continue
            e = top[n, slot]
            routed += 1
            if cap is not None and taken[e] >= cap:
                dropped += 1
                continue
            taken[e] += 1
            weight = probs[n, e] / probs[n, top[n]].sum()
            y[n] += weight * np_swiglu(p["w_gate"][e], p["w_up"][e], p["w_down"][e], x[n])
    if "shared" in p:
        s = p["shared"]
        y += np_swiglu(s["w_gate"], s["w_up"], s["w_down"], x)
    real = mask.sum()
    load = np.array([(top[mask] == e).sum() for e in range(n_exp)]) / (real * k)
    mean_prob = probs[mask].mean(0)
    lse = np.log(np.exp(logits).sum(-1))
    stats = {"router_aux_loss": n_exp * np.sum(load * mean_prob), "router_z_loss": np.mean(lse[mask] ** 2),
             "expert_load": load, "dropped_fraction": dropped / routed}
    return y, stats


MOE = jax.jit(moe.moe_layer, static_argnames=("cfg", "impl", "block_size"))


def run(p, x, cfg, mask=None, **kw):
    B = 1
    token_mask = None if mask is None else jnp.asarray(mask, bool)[None]
    y, stats = MOE(to_jax(p), jnp.asarray(x, jnp.float32)[None], cfg=cfg, token_mask_BT=token_mask, **kw)
    assert y.shape == (B, *x.shape)
    return np.asarray(y[0]), stats


def check_stats(stats, ref):
    for name in ("router_aux_loss", "router_z_loss", "expert_load", "dropped_fraction"):
        np.testing.assert_allclose(stats[name], ref[name], rtol=1e-5, atol=1e-6, err_msg=name)


X = np.random.default_rng(1).normal(size=(24, D))


def skip_without_native(impl):
    if impl == "native" and not native_kernels.available():
        pytest.skip("no C++ compiler to build the native expert kernel")


@pytest.mark.parametrize("impl, block_size", [("native", None), ("blocked", None), ("blocked", 4), ("windowed", None),
                                             ("windowed", 2), ("windowed", 64), ("ragged_dot", None)])
def test_dropless_paths_match_loop_reference(impl, block_size):
    skip_without_native(impl)
    p = make_params()
    y, stats = run(p, X, CFG, impl=impl, block_size=block_size)
    y_ref, ref = np_moe(p, X, K)
    np.testing.assert_allclose(y, y_ref, rtol=1e-4, atol=1e-4)
    check_stats(stats, ref)
    assert float(stats["dropped_fraction"]) == 0.0


@pytest.mark.parametrize("cf", [0.5, 4.0])
def test_capacity_path_matches_loop_reference(cf):
    p = make_params(seed=2)
    cfg = CFG.replace(capacity_factor=cf)
    y, stats = run(p, X, cfg)
    y_ref, ref = np_moe(p, X, K, capacity_factor=cf)
    np.testing.assert_allclose(y, y_ref, rtol=1e-4, atol=1e-4)
    check_stats(stats, ref)
    if cf == 4.0:
        assert float(stats["dropped_fraction"]) == 0.0
    if cf == 0.5:
        assert float(stats["dropped_fraction"]) > 0.0


def test_capacity_drops_and_counts_in_constructed_case():
    # Every token's router logit for expert 0 is huge, so all 8 tokens pick expert 0 with k = 1.
    # Capacity = ceil(1.0 * 8 * 1 / 4) = 2: tokens 0 and 1 are processed, tokens 2..7 dropped -> 6/8 dropped.
    p = make_params(seed=3)
    p["router"] = np.zeros((D, E))
    p["router"][:, 0] = 100.0
    x = np.abs(np.random.default_rng(4).normal(size=(8, D))) + 0.1  # positive, so x @ router favours expert 0
    cfg = CFG.replace(experts_per_token=1, capacity_factor=1.0)
    assert moe_kernels.capacity(8, 1, E, 1.0) == 2
    y, stats = run(p, x, cfg)
    assert float(stats["dropped_fraction"]) == pytest.approx(0.75)
    np.testing.assert_allclose(stats["expert_load"], [1.0, 0.0, 0.0, 0.0])
    assert np.all(np.abs(y[:2]).sum(-1) > 0) and np.all(y[2:] == 0)
    expected = np.stack([np_swiglu(p["w_gate"][0], p["w_up"][0], p["w_down"][0], x[n]) for n in range(2)])
    np.testing.assert_allclose(y[:2], expected, rtol=1e-4, atol=1e-4)
    # masked tokens take no capacity: masking tokens 0 and 1 lets tokens 2 and 3 through
    mask = np.array([0, 0, 1, 1, 1, 1, 1, 1])
    y, stats = run(p, x, cfg, mask=mask)
    assert np.all(y[:2] == 0) and np.all(np.abs(y[2:4]).sum(-1) > 0) and np.all(y[4:] == 0)
    assert float(stats["dropped_fraction"]) == pytest.approx(4 / 6)


@pytest.mark.parametrize("capacity_factor", [None, 1.0])
def test_padding_tokens_are_excluded(capacity_factor):
    p = make_params(seed=5)
    mask = np.random.default_rng(6).random(len(X)) < 0.6
    cfg = CFG.replace(capacity_factor=capacity_factor)
    y, stats = run(p, X, cfg, mask=mask)
    y_ref, ref = np_moe(p, X, K, mask=mask, capacity_factor=capacity_factor)
    check_stats(stats, ref)
    np.testing.assert_allclose(y, y_ref, rtol=1e-4, atol=1e-4)
    assert np.all(y[~mask] == 0)  # padding is not dispatched at all


def test_shared_experts_are_added():
    p = make_params(seed=7, n_shared=2)
    cfg = CFG.replace(n_shared_experts=2)
    y, stats = run(p, X, cfg)
    y_ref, ref = np_moe(p, X, K)
    np.testing.assert_allclose(y, y_ref, rtol=1e-4, atol=1e-4)
    check_stats(stats, ref)


def dense_moe(p, x_ND, k):
    """Every expert on every token, combined with the routing weights: an autodiff reference for the fast paths."""
    logits = x_ND @ p["router"]
    w, idx = jax.lax.top_k(jax.nn.softmax(logits), k)
    combine_NE = jnp.sum(jax.nn.one_hot(idx, p["router"].shape[1]) * (w / w.sum(-1, keepdims=True))[..., None], 1)
    g = jnp.einsum("ND,EDF->NEF", x_ND, p["w_gate"])
    u = jnp.einsum("ND,EDF->NEF", x_ND, p["w_up"])
    y = jnp.einsum("NEF,EFD->NED", jax.nn.silu(g) * u, p["w_down"])
    return jnp.einsum("NED,NE->ND", y, combine_NE)


@pytest.mark.parametrize("impl, block_size", [("blocked", 4), ("windowed", 3), ("ragged_dot", None),
                                             ("native", None)])
def test_dropless_gradients_match_dense_reference(impl, block_size):
    skip_without_native(impl)
    p = to_jax(make_params(seed=8))
    x = jnp.asarray(X, jnp.float32)
    target = jnp.asarray(np.random.default_rng(9).normal(size=X.shape), jnp.float32)

    def loss(p, x, fast):
        y = moe.moe_layer(p, x[None], CFG, impl=impl, block_size=block_size)[0][0] if fast else dense_moe(p, x, K)
        return jnp.sum((y - target) ** 2)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)
    (gp, gx), (rp, rx) = grad(p, x, True), grad(p, x, False)
    np.testing.assert_allclose(gx, rx, rtol=1e-4, atol=1e-4)
    for name in ("router", "w_gate", "w_up", "w_down"):
        np.testing.assert_allclose(gp[name], rp[name], rtol=1e-4, atol=1e-4, err_msg=name)


def test_windowed_overflow_when_every_token_picks_one_expert():
    # All 24 tokens route to expert 0 first: its 24 rows need every overflow window (w = 5: windows 0..4, the last
    # partly past the end), and masked tokens must stay out of them.
    p = make_params(seed=12)
    p["router"] = np.zeros((D, E))
    p["router"][:, 0] = 50.0
    x = np.abs(np.random.default_rng(13).normal(size=(24, D))) + 0.1
    mask = np.ones(24, bool)
    mask[[3, 17]] = False
    y_ref, ref = np_moe(p, x, K, mask=mask)
    for impl, window in (("windowed", 5), ("windowed", 24), ("windowed", None), ("native", None)):
        if impl == "native" and not native_kernels.available():
            continue
        y, stats = run(p, x, CFG, mask=mask, impl=impl, block_size=window)
        np.testing.assert_allclose(y, y_ref, rtol=1e-4, atol=1e-4, err_msg=f"{impl} window {window}")
        check_stats(stats, ref)


def _picked(fn):
    """The expert kernels "auto" resolved to while tracing fn() (models/kernels.py counts them)."""
    before = kernels.traced()
    fn()
    return {k[4:]: v - before.get(k, 0) for k, v in kernels.traced().items() if k.startswith("moe/")
            and v != before.get(k, 0)}


def test_auto_picks_native_for_float32_on_cpu():
    # One "auto" for forward passes and gradients: the native kernel on CPU in float32; bfloat16 activations keep
    # XLA's dispatch (windowed for few tokens).
    skip_without_native("native")
    p = to_jax(make_params())
    x = jnp.ones((1, 6, D))
    assert _picked(lambda: moe.moe_layer(p, x, CFG)) == {"native": 1}
    assert _picked(lambda: jax.grad(lambda x: jnp.sum(moe.moe_layer(p, x, CFG)[0]))(x)) == {"native": 1}
    assert _picked(lambda: moe.moe_layer(p, x.astype(jnp.bfloat16), CFG)) == {"windowed": 1}


def test_auto_picks_windowed_for_few_tokens_on_cpu(monkeypatch):
    # Without the native kernel: auto = windowed up to WINDOWED_MAX_LOAD assignments per expert (decode steps),
    # blocked above.
    monkeypatch.setattr(native_kernels, "applies", lambda *a: False)
    p = to_jax(make_params())
    small = windowed.WINDOWED_MAX_LOAD * E // K          # tokens at the threshold
    assert _picked(lambda: moe.moe_layer(p, jnp.ones((1, small, D)), CFG)) == {"windowed": 1}
    assert _picked(lambda: moe.moe_layer(p, jnp.ones((1, small + 1, D)), CFG)) == {"blocked": 1}


def test_auto_without_a_wing_takes_the_portable_kernel(monkeypatch):
    # The core alone (no models/cpu registered): "blocked" on CPU; names only a wing registers are refused with
    # a message saying where they come from.
    monkeypatch.setattr(kernels, "_MOE", {n: e for n, e in kernels._MOE.items() if n in ("blocked", "ragged_dot")})
    p = to_jax(make_params())
    assert _picked(lambda: moe.moe_layer(p, jnp.ones((1, 6, D)), CFG)) == {"blocked": 1}
    with pytest.raises(ValueError, match="models.cpu"):
        moe.moe_layer(p, jnp.ones((1, 6, D)), CFG, impl="native")


def test_windowed_gradient_is_the_blocked_kernels():
    # The windowed kernel's custom VJP differentiates the blocked kernel: same gradients (float32 rounding aside)
    # on a routing with overflow windows.
    p = to_jax(make_params(seed=21))
    x = jnp.asarray(np.random.default_rng(22).normal(size=(1, 24, D)), jnp.float32)

    def grads(impl):
        return jax.grad(lambda p, x: jnp.sum(jnp.sin(moe.moe_layer(p, x, CFG, impl=impl, block_size=3)[0])),
                        argnums=(0, 1))(p, x)

    for got, want in zip(jax.tree.leaves(grads("windowed")), jax.tree.leaves(grads("blocked"))):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_block_size_heuristic_and_bad_impl():
    assert moe_kernels.default_block_size(128, 8) == 32 and moe_kernels.default_block_size(12288, 8) == 128
    assert windowed.default_window(128, 8) == 24 and windowed.default_window(3, 8) == 8
    with pytest.raises(ValueError, match="impl"):
        run(make_params(), X, CFG, impl="dense")
    with pytest.raises(ValueError, match="impl"):
        run(make_params(), X, CFG, impl="hybrid")  # deleted: its speed-up did not reproduce


def test_expert_ffn_blocks_and_gradients_match_float64_reference():
    # The fused per-block kernel on its own: blocks past n_used give 0 and no gradient; the rest are SwiGLU experts.
    rng = np.random.default_rng(11)
    G, b, n_used = 5, 3, 3
    x, dy = rng.normal(size=(G, b, D)), rng.normal(size=(G, b, D))
    w_gate, w_up, w_down = rng.normal(size=(E, D, F)) / 3, rng.normal(size=(E, D, F)) / 3, rng.normal(size=(E, F, D)) / 3
    expert = np.array([2, 0, 3, 1, 1])

    def ref_loss(x, wg, wu, wd):  # float64 NumPy reference of sum(y * dy), differentiated numerically below
        return sum(np.sum(np_swiglu(wg[expert[g]], wu[expert[g]], wd[expert[g]], x[g]) * dy[g]) for g in range(n_used))

    def loss(x, wg, wu, wd):
        w_gu = jnp.concatenate([wg, wu], axis=2)
        return jnp.sum(moe_kernels.expert_ffn(x, w_gu, wd, jnp.asarray(expert, jnp.int32), jnp.int32(n_used)) * dy)

    args = [jnp.asarray(a, jnp.float32) for a in (x, w_gate, w_up, w_down)]
    y = moe_kernels.expert_ffn(args[0], jnp.concatenate(args[1:3], axis=2), args[3], jnp.asarray(expert, jnp.int32),
                       jnp.int32(n_used))
    for g in range(G):
        want = np_swiglu(w_gate[expert[g]], w_up[expert[g]], w_down[expert[g]], x[g]) if g < n_used else 0 * x[g]
        np.testing.assert_allclose(y[g], want, rtol=1e-5, atol=1e-5)
    grads = jax.grad(loss, argnums=(0, 1, 2, 3))(*args)
    ref_args = [x, w_gate, w_up, w_down]
    eps = 1e-6
    for i, (g_fast, a) in enumerate(zip(grads, ref_args)):
        flat = a.reshape(-1)
        num = np.zeros_like(flat)
        for j in range(flat.size):  # central differences in float64
            plus, minus = flat.copy(), flat.copy()
            plus[j] += eps
            minus[j] -= eps
            num[j] = (ref_loss(*[plus.reshape(a.shape) if k == i else r for k, r in enumerate(ref_args)])
                      - ref_loss(*[minus.reshape(a.shape) if k == i else r for k, r in enumerate(ref_args)])) / (2 * eps)
        np.testing.assert_allclose(g_fast, num.reshape(a.shape), rtol=1e-4, atol=1e-4, err_msg=f"argument {i}")
