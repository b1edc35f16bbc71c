"""Building blocks of the decoder: RMSNorm, rotary embeddings, grouped-query attention with a KV cache, SwiGLU MLP.

Pure functions over small parameter dicts; models/transformer.py composes them. Shape suffixes name the axes:
B batch, T query length, S key length (cache slots), D d_model, N query heads, K kv heads, G query heads per kv head,
H head_dim, F feed-forward width. Normalisation, softmax and rotary maths run in float32 whatever the compute dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from models import cpu_kernels

# A large finite negative instead of -inf: a query whose keys are all masked (a padding row) gets a uniform
# distribution rather than NaNs, and NaN-free rows keep gradients finite.
_MASK_VALUE = -1e30


def rms_norm(x_BTD, scale_D, eps: float = 1e-6):
    x32 = x_BTD.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (normed * scale_D.astype(jnp.float32)).astype(x_BTD.dtype)


def rope_tables(positions_BT, head_dim: int, theta: float):
    """float32 (cos, signed sin) tables [B, T, 1, head_dim] for apply_rope.

    Computed once per forward and shared by every layer's queries and keys (sin/cos are the costly part of rotary
    embeddings on CPU). Full width: cos repeated over both halves, sin negated on the first half, so the rotation is
    one elementwise pass x * cos + swap_halves(x) * sin.
    """
    half = head_dim // 2
    inv_freq_h = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angle_BTh = positions_BT.astype(jnp.float32)[..., None] * inv_freq_h
    cos_BTh, sin_BTh = jnp.cos(angle_BTh), jnp.sin(angle_BTh)
    cos_BTH = jnp.concatenate([cos_BTh, cos_BTh], axis=-1)[:, :, None, :]
    sin_BTH = jnp.concatenate([-sin_BTh, sin_BTh], axis=-1)[:, :, None, :]
    return cos_BTH, sin_BTH


def apply_rope(x_BTNH, positions_BT, theta: float, tables=None):
    """Rotary embedding, 'half split' convention: dims i and i + H/2 form the rotated pair i.

    tables: rope_tables(positions_BT, H, theta), when the caller shares them across layers.
    """
    half = x_BTNH.shape[-1] // 2
    cos_BTH, sin_BTH = rope_tables(positions_BT, x_BTNH.shape[-1], theta) if tables is None else tables
    x32 = x_BTNH.astype(jnp.float32)
    swapped = jnp.concatenate([x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos_BTH + swapped * sin_BTH).astype(x_BTNH.dtype)


def causal_mask(positions_T, key_slots_S):
    """[T, S] bool: query at slot t may see key slot s iff s <= t."""
    return key_slots_S[None, :] <= positions_T[:, None]


# The native decode-attention kernel is a loop over query rows: it beats XLA's batched tiny products at a decode
# step (M = G query rows per kv head) but not a prefill or a training forward, where XLA's products are real GEMMs.
NATIVE_ATTENTION_MAX_T = 4


def _grouped_attention(q_BKMH, k, v_BKSH, mask_BTS, keys_slots_last: bool):
    """out [B, K, M, H] of the scaled queries q_BKMH (M = G * T rows, g-major) through XLA's batched products."""
    B, K, M, _ = q_BKMH.shape
    T = mask_BTS.shape[1]
    S = k.shape[3] if keys_slots_last else k.shape[2]
    if keys_slots_last:
        scores_BKMS = jnp.einsum("BKMH,BKHS->BKMS", q_BKMH, k, preferred_element_type=jnp.float32)
    else:
        scores_BKMS = jnp.einsum("BKSH,BKMH->BKMS", k, q_BKMH, preferred_element_type=jnp.float32)
    scores_BKGTS = jnp.where(mask_BTS[:, None, None], scores_BKMS.reshape(B, K, M // T, T, S), _MASK_VALUE)
    probs_BKMS = jax.nn.softmax(scores_BKGTS, axis=-1).astype(v_BKSH.dtype).reshape(B, K, M, S)
    return jnp.einsum("BKMS,BKSH->BKMH", probs_BKMS, v_BKSH)


@jax.custom_vjp
def _native_attention(q_BKMH, k_BKHS, v_BKSH, mask_BTS):
    return cpu_kernels.decode_attention(q_BKMH, k_BKHS, v_BKSH, mask_BTS)


def _native_attention_fwd(q_BKMH, k_BKHS, v_BKSH, mask_BTS):
    return _native_attention(q_BKMH, k_BKHS, v_BKSH, mask_BTS), (q_BKMH, k_BKHS, v_BKSH, mask_BTS)


def _native_attention_bwd(res, d_out):
    # The kernel is forward-only; a differentiated cached step (rare: a short shared-prompt completion) takes
    # XLA's gradient of the same maths.
    q_BKMH, k_BKHS, v_BKSH, mask_BTS = res
    _, vjp = jax.vjp(lambda q, k, v: _grouped_attention(q, k, v, mask_BTS, True), q_BKMH, k_BKHS, v_BKSH)
    return (*vjp(d_out), None)


_native_attention.defvjp(_native_attention_fwd, _native_attention_bwd)


def dot_product_attention(q_BTNH, k, v_BKSH, mask_BTS, keys_slots_last: bool = False, native: bool = False):
    """Grouped-query softmax attention; mask_BTS True = may attend. Scores and softmax in float32.

    Keys/values are laid out [B, K, S, H] and the G*T query rows of each kv head are batched together as M, so both
    matmuls are batched products without a transpose of the keys or values: on CPU a head-minor layout such as
    [B, S, K, H] costs a transpose of the whole cache per layer and decode step. keys_slots_last: k is [B, K, H, S]
    (the cache's layout), so the score product is a plain [M, H] x [H, S]. native (with keys_slots_last): for
    T <= NATIVE_ATTENTION_MAX_T take models/cpu_kernels.py's decode-attention kernel when it applies (CPU, float32,
    built): the same maths in one custom call, faster than XLA's batched tiny products at a decode step
    (BENCHMARKS.md); differentiable through XLA's gradient.
    """
    B, T, N, H = q_BTNH.shape
    K = k.shape[1]
    G = N // K
    q_BKMH = (q_BTNH * jnp.asarray(H ** -0.5, q_BTNH.dtype)).reshape(B, T, K, G, H).transpose(0, 2, 3, 1, 4)
    q_BKMH = q_BKMH.reshape(B, K, G * T, H)
    if (native and keys_slots_last and T <= NATIVE_ATTENTION_MAX_T
            and cpu_kernels.attention_applies(q_BKMH, k, v_BKSH)):
        out_BKMH = _native_attention(q_BKMH, k, v_BKSH, mask_BTS)
    else:
        out_BKMH = _grouped_attention(q_BKMH, k, v_BKSH, mask_BTS, keys_slots_last)
    return out_BKMH.reshape(B, K, G, T, H).transpose(0, 3, 1, 2, 4).reshape(B, T, N, H)


def attention(p, x_BTD, positions_BT, mask_BTS, *, rope_theta: float, cache=None, layer: int = 0, cache_index=None,
              rope=None, norm_eps: float = 1e-6, native: bool = False):
    """Self-attention block (without its norm). p: wq [D,N,H], wk/wv [D,K,H], wo [N,H,D]; optional biases
    bq [N,H], bk/bv [K,H] (Qwen2) and per-head RMSNorm scales q_norm/k_norm [H] applied before the rotary
    embedding (Qwen3), used when present.

    Without a cache, keys are this call's tokens. With a cache (transformer.init_cache: per layer, keys [B, K, H, S],
    values [B, K, S, H]) the new keys/values are written into layer `layer`'s arrays at slots cache_index ..
    cache_index + T - 1 (cache_index may be traced) and the queries attend over all S slots under mask_BTS.
    rope: rope_tables(positions_BT, H, rope_theta) if precomputed. native: the cached path may use the CPU
    decode-attention kernel (callers pass True only without a mesh: the kernel has no partitioning rule).
    Returns (out_BTD, cache).
    """
    dtype = x_BTD.dtype
    q_BTNH = jnp.einsum("BTD,DNH->BTNH", x_BTD, p["wq"].astype(dtype))
    k_BTKH = jnp.einsum("BTD,DKH->BTKH", x_BTD, p["wk"].astype(dtype))
    v_BTKH = jnp.einsum("BTD,DKH->BTKH", x_BTD, p["wv"].astype(dtype))
    if "bq" in p:
        q_BTNH = q_BTNH + p["bq"].astype(dtype)
        k_BTKH = k_BTKH + p["bk"].astype(dtype)
        v_BTKH = v_BTKH + p["bv"].astype(dtype)
    if "q_norm" in p:
        q_BTNH = rms_norm(q_BTNH, p["q_norm"], norm_eps)
        k_BTKH = rms_norm(k_BTKH, p["k_norm"], norm_eps)
    if rope is None:
        rope = rope_tables(positions_BT, q_BTNH.shape[-1], rope_theta)
    q_BTNH = apply_rope(q_BTNH, positions_BT, rope_theta, rope)
    k_BKTH = apply_rope(k_BTKH, positions_BT, rope_theta, rope).transpose(0, 2, 1, 3)
    v_BKTH = v_BTKH.transpose(0, 2, 1, 3)
    if cache is None:
        out_BTNH = dot_product_attention(q_BTNH, k_BKTH, v_BKTH, mask_BTS)
    else:
        # Written in place into the layer's own buffers (XLA updates a loop-carried buffer in place).
        zero, index = jnp.int32(0), jnp.asarray(cache_index, jnp.int32)
        k_old, v_old = cache["k"][layer], cache["v"][layer]
        k_new = jax.lax.dynamic_update_slice(k_old, k_BKTH.transpose(0, 1, 3, 2).astype(k_old.dtype),
                                             (zero, zero, zero, index))
        v_new = jax.lax.dynamic_update_slice(v_old, v_BKTH.astype(v_old.dtype), (zero, zero, index, zero))
        replace = lambda arrays, new: arrays[:layer] + (new,) + arrays[layer + 1:]  # noqa: E731
        cache = {**cache, "k": replace(tuple(cache["k"]), k_new), "v": replace(tuple(cache["v"]), v_new)}
        out_BTNH = dot_product_attention(q_BTNH, k_new.astype(dtype), v_new.astype(dtype), mask_BTS,
                                         keys_slots_last=True, native=native)
    # Heads merged into one contraction axis on both sides (free reshapes of row-major arrays): contracting (N, H)
    # as two axes let XLA transpose wo to the activation's order on every call, a copy of the weight per layer and
    # decode step (SmolLM2 sampling, BENCHMARKS.md).
    B, T, N, H = out_BTNH.shape
    wo_ED = p["wo"].astype(dtype).reshape(N * H, -1)
    return jnp.einsum("BTE,ED->BTD", out_BTNH.reshape(B, T, N * H), wo_ED), cache


def swiglu(p, x_BTD):
    """SwiGLU feed-forward: (silu(x W_gate) * x W_up) W_down. p: w_gate/w_up [D,F], w_down [F,D]."""
    dtype = x_BTD.dtype
    gate_BTF = jnp.einsum("BTD,DF->BTF", x_BTD, p["w_gate"].astype(dtype))
    up_BTF = jnp.einsum("BTD,DF->BTF", x_BTD, p["w_up"].astype(dtype))
    return jnp.einsum("BTF,FD->BTD", jax.nn.silu(gate_BTF) * up_BTF, p["w_down"].astype(dtype))
