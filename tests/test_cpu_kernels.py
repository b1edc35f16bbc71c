"""The native CPU kernels (models/cpu/native_kernels.py): expert FFN and decode attention against float64 references,
every tile tail, the build cache, the fallback without a compiler (the cache's failure cases: test_native_cache.py)."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import models.cpu  # noqa: F401 - registers the CPU wing's kernels
from models import layers, moe, transformer
from models.config import ModelConfig
from models.cpu import native_kernels as cpu_kernels

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="no C++ compiler to build the native kernel")


def np_expert_ffn(x, experts, valid, w_gate, w_up, w_down):
    """float64 loop: each valid (token, slot)'s SwiGLU expert output, zeros elsewhere."""
    x, w_gate, w_up, w_down = (np.asarray(a, np.float64) for a in (x, w_gate, w_up, w_down))
    N, k = experts.shape
    y = np.zeros((N, k, x.shape[1]))
    for n in range(N):
        for j in range(k):
            if valid[n, j]:
                e = experts[n, j]
                g, u = x[n] @ w_gate[e], x[n] @ w_up[e]
                y[n, j] = (g / (1 + np.exp(-g)) * u) @ w_down[e]
    return y


def case(seed, N, D, F, E, k, p_valid=0.9):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(N, D)).astype(np.float32)
    experts = np.stack([rng.permutation(E)[:k] for _ in range(N)]).astype(np.int32)
    valid = rng.random((N, k)) < p_valid
    w = {"w_gate": rng.normal(size=(E, D, F)) / np.sqrt(D), "w_up": rng.normal(size=(E, D, F)) / np.sqrt(D),
         "w_down": rng.normal(size=(E, F, D)) / np.sqrt(F)}
    return x, experts, valid, {n: a.astype(np.float32) for n, a in w.items()}


# D and F cover the 64-wide column panels, the 16-wide ones and the scalar tail; N x k / E covers every row tile
# (6 rows and the 1..5 tails) and experts with no rows.
@pytest.mark.parametrize("N, D, F, E, k", [(64, 256, 512, 8, 2), (13, 80, 144, 4, 2), (7, 24, 40, 6, 1),
                                           (1, 16, 16, 8, 2), (40, 33, 70, 3, 3)])
def test_matches_float64_reference(N, D, F, E, k):
    x, experts, valid, w = case(N * 7 + D, N, D, F, E, k)
    y = jax.jit(cpu_kernels.expert_ffn)(w, jnp.asarray(x), jnp.asarray(experts), jnp.asarray(valid))
    ref = np_expert_ffn(x, experts, valid, w["w_gate"], w["w_up"], w["w_down"])
    assert y.shape == ref.shape and y.dtype == jnp.float32
    np.testing.assert_allclose(y, ref, rtol=2e-5, atol=2e-5 * np.abs(ref).max())
    assert not np.any(np.asarray(y)[~valid])  # masked assignments are exactly zero


def np_expert_ffn_grads(x, experts, valid, w_gate, w_up, w_down, dy):
    """float64 gradients of sum(y * dy) by the chain rule, one assignment at a time."""
    x, w_gate, w_up, w_down, dy = (np.asarray(a, np.float64) for a in (x, w_gate, w_up, w_down, dy))
    dx, dwg, dwu, dwd = (np.zeros_like(a) for a in (x, w_gate, w_up, w_down))
    for n, j in zip(*np.nonzero(valid)):
        e = experts[n, j]
        g, u = x[n] @ w_gate[e], x[n] @ w_up[e]
        s = 1 / (1 + np.exp(-g))
        h = g * s * u
        dwd[e] += np.outer(h, dy[n, j])
        dh = w_down[e] @ dy[n, j]
        du, dg = dh * g * s, dh * u * s * (1 + g * (1 - s))
        dwg[e] += np.outer(x[n], dg)
        dwu[e] += np.outer(x[n], du)
        dx[n] += w_gate[e] @ dg + w_up[e] @ du
    return dx, dwg, dwu, dwd


@pytest.mark.parametrize("N, D, F, E, k", [(40, 80, 144, 4, 2), (9, 33, 70, 3, 3), (30, 64, 128, 8, 2)])
def test_gradients_match_float64_reference(N, D, F, E, k):
    x, experts, valid, w = case(N + F, N, D, F, E, k)
    experts[experts == E - 1] = 0  # expert E-1 gets no rows (a token may now take expert 0 twice: still valid)
    dy = np.random.default_rng(N).normal(size=(N, k, D)).astype(np.float32)

    def loss(w, x):
        return jnp.sum(cpu_kernels.expert_ffn(w, x, jnp.asarray(experts), jnp.asarray(valid)) * dy)

    gw, gx = jax.jit(jax.grad(loss, argnums=(0, 1)))(w, jnp.asarray(x))
    ref = np_expert_ffn_grads(x, experts, valid, w["w_gate"], w["w_up"], w["w_down"], dy)
    for name, got, want in zip(("x", "w_gate", "w_up", "w_down"), (gx, gw["w_gate"], gw["w_up"], gw["w_down"]), ref):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max(), err_msg=name)
    for name in ("w_gate", "w_up", "w_down"):  # the expert without rows: exactly zero, not stale memory
        assert not np.any(np.asarray(gw[name])[E - 1]), name


def test_saturated_gates_match_float64_reference():
    """Gate pre-activations far into both tails (|g| up to ~150): the vectorised exp's clamped range keeps the
    sigmoid, the output and the gradients finite and equal to the float64 ones."""
    N, D, F, E, k = 24, 32, 48, 4, 2  # F = 48: three full vectors, no scalar tail
    x, experts, valid, w = case(5, N, D, F, E, k)
    x = 40.0 * x
    g = np.einsum("nd,edf->nef", x, w["w_gate"])
    assert np.abs(g).max() > 100
    dy = np.random.default_rng(1).normal(size=(N, k, D)).astype(np.float32)

    def loss(w, x):
        return jnp.sum(cpu_kernels.expert_ffn(w, x, jnp.asarray(experts), jnp.asarray(valid)) * dy)

    y = jax.jit(cpu_kernels.expert_ffn)(w, jnp.asarray(x), jnp.asarray(experts), jnp.asarray(valid))
    ref = np_expert_ffn(x, experts, valid, w["w_gate"], w["w_up"], w["w_down"])
    np.testing.assert_allclose(y, ref, rtol=2e-5, atol=2e-5 * np.abs(ref).max())
    gw, gx = jax.jit(jax.grad(loss, argnums=(0, 1)))(w, jnp.asarray(x))
    want = np_expert_ffn_grads(x, experts, valid, w["w_gate"], w["w_up"], w["w_down"], dy)
    for name, got, ref in zip(("x", "w_gate", "w_up", "w_down"), (gx, gw["w_gate"], gw["w_up"], gw["w_down"]), want):
        assert np.all(np.isfinite(got)), name
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max(), err_msg=name)


def test_every_row_on_one_expert_and_ids_out_of_range():
    x, experts, valid, w = case(3, 50, 32, 48, 4, 2, p_valid=1.0)
    experts[:, 0] = 2  # all 50 first choices on expert 2
    y = cpu_kernels.expert_ffn(w, jnp.asarray(x), jnp.asarray(experts), jnp.asarray(valid))
    np.testing.assert_allclose(y, np_expert_ffn(x, experts, valid, *w.values()), rtol=2e-5, atol=2e-5)
    # An id outside [0, E) that slipped past the mask computes nothing rather than reading out of bounds.
    bad = experts.copy()
    bad[0, 1], bad[1, 1] = 4, -3
    y_bad = cpu_kernels._call(jnp.asarray(x), jnp.asarray(bad), jnp.ones(bad.shape, bool), *map(jnp.asarray, w.values()))
    assert not np.any(np.asarray(y_bad)[[0, 1], 1])
    np.testing.assert_allclose(np.asarray(y_bad)[2:], np.asarray(y)[2:], rtol=1e-6, atol=1e-6)


def test_deterministic_and_under_vmap():
    x, experts, valid, w = case(5, 24, 64, 96, 8, 2)
    f = jax.jit(cpu_kernels.expert_ffn)
    a, b = f(w, jnp.asarray(x), jnp.asarray(experts), jnp.asarray(valid)), f(w, x, experts, valid)
    assert np.array_equal(np.asarray(a), np.asarray(b))  # threads split by expert: no reduction order to vary
    xs = jnp.stack([jnp.asarray(x), 2 * jnp.asarray(x)])
    ys = jax.vmap(lambda xx: cpu_kernels.expert_ffn(w, xx, experts, valid))(xs)
    np.testing.assert_allclose(ys[1], np.asarray(f(w, 2 * x, experts, valid)), rtol=1e-6, atol=1e-6)


def test_model_forward_equals_blocked_dispatch():
    cfg = ModelConfig(vocab_size=64, d_model=32, n_heads=2, n_kv_heads=1, d_ff=48, n_layers=2, n_experts=4,
                      experts_per_token=2, moe_every=1)
    params = transformer.init(cfg, jax.random.PRNGKey(0))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (3, 10), 0, 64)
    native, _ = jax.jit(lambda p, t: transformer.forward(p, t, cfg))(params, tokens)
    blocked, _ = jax.jit(lambda p, t: transformer.forward(p, t, cfg, moe_impl="blocked"))(params, tokens)
    np.testing.assert_allclose(native, blocked, rtol=1e-5, atol=1e-5)


def np_decode_attention(q, keys, values, mask):
    """float64 loop: q [B, K, M, H] (scaled), keys [B, K, H, S], values [B, K, S, H], mask [B, T, S] for row m % T."""
    q, keys, values = (np.asarray(a, np.float64) for a in (q, keys, values))
    B, K, M, H = q.shape
    T = mask.shape[1]
    out = np.zeros_like(q)
    for b in range(B):
        for k in range(K):
            for m in range(M):
                score = np.where(mask[b, m % T], q[b, k, m] @ keys[b, k], -1e30)
                w = np.exp(score - score.max())
                out[b, k, m] = (w / w.sum()) @ values[b, k]
    return out


# S covers the 16-wide vectors and their scalar tail; T > 1 (a prefill-like chunk) checks the row-to-mask mapping;
# H = 20 a head size that is no multiple of 16.
@pytest.mark.parametrize("B, K, G, T, H, S", [(3, 2, 2, 1, 64, 96), (2, 1, 4, 3, 16, 37), (1, 3, 1, 5, 20, 7),
                                              (4, 2, 3, 2, 32, 130)])
def test_decode_attention_matches_float64_reference(B, K, G, T, H, S):
    rng = np.random.default_rng(B * 100 + S)
    q = rng.normal(size=(B, K, G * T, H)).astype(np.float32) * H ** -0.5
    keys = rng.normal(size=(B, K, H, S)).astype(np.float32)
    values = rng.normal(size=(B, K, S, H)).astype(np.float32)
    mask = rng.random((B, T, S)) < 0.6
    mask[0, 0] = False  # a fully masked row (a padding query): uniform over all slots, as XLA's softmax gives
    out = jax.jit(cpu_kernels.decode_attention)(q, keys, values, mask)
    ref = np_decode_attention(q, keys, values, mask)
    assert out.shape == ref.shape and out.dtype == jnp.float32
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out)[0, :, :: T], np.broadcast_to(values[0].mean(1)[:, None], (K, G, H)),
                               rtol=1e-5, atol=1e-5)
    shared = jax.jit(cpu_kernels.decode_attention)(q, keys, values, mask[-1:])  # [1, T, S]: one mask for the batch
    np.testing.assert_allclose(shared, np_decode_attention(q, keys, values, np.repeat(mask[-1:], B, 0)), rtol=1e-5,
                               atol=1e-5)


def test_decode_attention_equals_xla_inside_the_layer():
    # models/layers.py's cached attention with and without the kernel, T = 1 (decode) and T = 4 (a cached prefill).
    rng = np.random.default_rng(0)
    for T in (1, 4):
        q = jnp.asarray(rng.normal(size=(2, T, 4, 16)), jnp.float32)
        k = jnp.asarray(rng.normal(size=(2, 2, 16, 24)), jnp.float32)
        v = jnp.asarray(rng.normal(size=(2, 2, 24, 16)), jnp.float32)
        mask = jnp.asarray(rng.random((2, T, 24)) < 0.5)
        f = lambda native: jax.jit(lambda *a: layers.dot_product_attention(*a, keys_slots_last=True,  # noqa: E731
                                                                             use_kernel=native))(q, k, v, mask)
        np.testing.assert_allclose(f(True), f(False), rtol=1e-5, atol=1e-6)
        # Differentiable (a shared-prompt train step may run a short cached completion): XLA's gradient.
        loss = lambda native: lambda q, k, v: jnp.sum(jnp.sin(layers.dot_product_attention(  # noqa: E731
            q, k, v, mask, keys_slots_last=True, use_kernel=native)))
        for got, want in zip(jax.grad(loss(True), (0, 1, 2))(q, k, v), jax.grad(loss(False), (0, 1, 2))(q, k, v)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_cached_decoding_with_the_kernel_equals_the_full_forward():
    # Greedy cached steps (kernel attention, kernel experts) reproduce the no-cache forward's logits.
    cfg = ModelConfig(vocab_size=64, d_model=32, n_heads=4, n_kv_heads=2, d_ff=48, n_layers=2, n_experts=4,
                      experts_per_token=2, moe_every=1)
    params = transformer.init(cfg, jax.random.PRNGKey(0))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 9), 0, 64)
    full, _ = jax.jit(lambda p, t: transformer.forward(p, t, cfg))(params, tokens)
    cache = transformer.init_cache(cfg, 2, 16)
    step = jax.jit(lambda p, t, c, i: transformer.forward(p, t, cfg, cache=c, cache_index=i))
    logits, aux = step(params, tokens[:, :5], cache, 0)
    got = [logits]
    for i in range(5, 9):
        logits, aux = step(params, tokens[:, i:i + 1], aux["cache"], i)
        got.append(logits)
    np.testing.assert_allclose(jnp.concatenate(got, axis=1), full, rtol=2e-5, atol=2e-5)


def test_library_is_built_once_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("MATHRL_NATIVE_DIR", str(tmp_path))
    path = cpu_kernels.library_path()
    assert path.parent == tmp_path and not path.exists()
    assert cpu_kernels.build() == path and path.exists() and cpu_kernels.verified(path)
    stamp = path.stat().st_mtime_ns
    assert cpu_kernels.build() == path and path.stat().st_mtime_ns == stamp  # a second build is a lookup
    assert cpu_kernels.library_path() == path  # the key is stable


def test_disabled_or_unbuildable_kernel_falls_back_to_xla(tmp_path):
    # A fresh process: MATHRL_NATIVE=0, or a compiler that fails, leaves "auto" on XLA's dispatch (with one warning
    # for the failure), and asking for impl="native" explicitly is a clear error.
    prog = ("import warnings, jax.numpy as jnp, models.cpu; from models import moe; from models.cpu import "
            "native_kernels as cpu_kernels; from models.config import "
            "ModelConfig; cfg = ModelConfig(d_model=8, d_ff=12, n_experts=4, experts_per_token=2, moe_every=1); "
            "p = {'router': jnp.ones((8, 4)), 'w_gate': jnp.ones((4, 8, 12)), 'w_up': jnp.ones((4, 8, 12)), "
            "'w_down': jnp.ones((4, 12, 8))}\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always'); y, _ = moe.moe_layer(p, jnp.ones((1, 3, 8)), cfg)\n"
            "try:\n"
            "    moe.moe_layer(p, jnp.ones((1, 3, 8)), cfg, impl='native'); err = 'none'\n"
            "except ValueError as e:\n"
            "    err = 'native' if 'native expert kernel' in str(e) else 'other'\n"
            "print(cpu_kernels.available(), len(w), float(y.sum()), err)")
    base = {"PATH": "/usr/bin:/bin", "MATHRL_NATIVE_DIR": str(tmp_path), "JAX_PLATFORMS": "cpu"}
    outs = {}
    for name, env in {"off": {"MATHRL_NATIVE": "0"}, "broken": {"CXX": "/bin/false"}}.items():
        done = subprocess.run([sys.executable, "-c", prog], env={**base, **env}, capture_output=True, text=True,
                              cwd=str(cpu_kernels.NATIVE_DIR.parents[2]), timeout=120)
        assert done.returncode == 0, done.stderr
        outs[name] = done.stdout.split()
    assert outs["off"][:2] == ["False", "0"] and outs["broken"][:2] == ["False", "1"]
    assert outs["off"][3] == outs["broken"][3] == "native"
    native_y, _ = moe.moe_layer(jax.tree.map(jnp.ones_like, {"router": jnp.ones((8, 4)), "w_gate": jnp.ones((4, 8, 12)),
                                                               "w_up": jnp.ones((4, 8, 12)),
                                                               "w_down": jnp.ones((4, 12, 8))}),
                                jnp.ones((1, 3, 8)), ModelConfig(d_model=8, d_ff=12, n_experts=4, experts_per_token=2,
                                                                 moe_every=1))
    assert float(outs["off"][2]) == float(outs["broken"][2])
    np.testing.assert_allclose(float(native_y.sum()), float(outs["off"][2]), rtol=1e-5)
