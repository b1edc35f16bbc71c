"""Building blocks of the decoder: RMSNorm, rotary embeddings, grouped-query attention with a KV cache, SwiGLU MLP.

Pure functions over small parameter dicts; models/transformer.py composes them. Shape suffixes name the axes:
B batch, T query length, S key length (cache slots), D d_model, N query heads, K kv heads, G query heads per kv head,
H head_dim, F feed-forward width. Normalisation, softmax and rotary maths run in float32 whatever the compute dtype.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from models import kernels

# A large finite negative instead of -inf: a query whose keys are all masked (a padding row) gets a uniform
# distribution rather than NaNs, and NaN-free rows keep gradients finite.
_MASK_VALUE = -1e30


class LowRank(NamedTuple):
    """A weight W with a low-rank update kept apart: W + scale * A @ B (A [*in, r], B [r, *out]), e.g. a LoRA
    adapter (models/lora.py). `project` multiplies by it without forming W + scale * A @ B: the backward pass then
    needs no gradient of W's size (dA and dB come through the rank-r products)."""

    w: jax.Array
    a: jax.Array
    b: jax.Array
    scale: float


def project(spec: str, x, w):
    """jnp.einsum(spec, x, w) in x's dtype, w a weight array or a LowRank. A LowRank's update is never rounded into
    a narrow W: x @ A, then @ B, scaled, in float32, added to x @ W accumulated in float32, and the sum cast to x's
    dtype once (with bfloat16 activations, a bfloat16 x @ W plus a bfloat16 update smaller than half its last place
    would leave every output as it was, so a small adapter update changed nothing). spec: "<x dims>,<w dims>-><out
    dims>" with w's dims its contracted ("in") dims first, then its "out" dims."""
    dtype = x.dtype
    if not isinstance(w, LowRank):
        return jnp.einsum(spec, x, w.astype(dtype))
    ins, rest = spec.split(",")
    w_dims, out = rest.split("->")
    contracted = "".join(d for d in w_dims if d in ins)
    kept = "".join(d for d in ins if d not in contracted)
    f32 = jnp.float32
    xa = jnp.einsum(f"{ins},{contracted}R->{kept}R", x.astype(f32), w.a.astype(f32))
    update = jnp.einsum(f"{kept}R,R{w_dims[len(contracted):]}->{out}", xa, w.b.astype(f32))
    base = jnp.einsum(spec, x, w.w.astype(dtype), preferred_element_type=f32)
    return (base + update * jnp.asarray(w.scale, f32)).astype(dtype)


def flatten_in(w, n_in: int):
    """w with its first n_in ("in") dims merged into one (a LowRank: its W and A alike)."""
    def flat(x, lead):
        return x.reshape(math.prod(x.shape[:lead]), *x.shape[lead:])
    if isinstance(w, LowRank):
        return w._replace(w=flat(w.w, n_in), a=flat(w.a, n_in))
    return flat(w, n_in)


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


# The KV cache's layout, a per-backend choice (docs/model.md, "KV-cache layout"). Both keep one buffer per layer and
# the kv heads before the slots, so each (batch, head) block is contiguous; they differ in the keys:
#   "keys_slots_last":   keys [B, K, H, S], values [B, K, S, H]: a decode step's score product q [M, H] x k [H, S]
#                        is a plain product (on CPU a transposed operand ran ~3x slower at W1's decode shapes);
#   "keys_like_values":  keys and values [B, K, S, H].
# Backends not listed take DEFAULT_CACHE_LAYOUT; GPU and TPU have not been measured yet.
CACHE_LAYOUTS = {"cpu": "keys_slots_last"}
DEFAULT_CACHE_LAYOUT = "keys_slots_last"


def cache_layout() -> str:
    """This process's KV-cache layout: CACHE_LAYOUTS of JAX's default backend, else DEFAULT_CACHE_LAYOUT."""
    return CACHE_LAYOUTS.get(jax.default_backend(), DEFAULT_CACHE_LAYOUT)


def causal_mask(positions_T, key_slots_S):
    """[T, S] bool: query at slot t may see key slot s iff s <= t."""
    return key_slots_S[None, :] <= positions_T[:, None]


def grouped_attention(q_BKMH, k, v_BKSH, mask_BTS, keys_slots_last: bool):
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


def dot_product_attention(q_BTNH, k, v_BKSH, mask_BTS, keys_slots_last: bool = False, use_kernel: bool = False):
    """Grouped-query softmax attention; mask_BTS True = may attend. Scores and softmax in float32.

    Keys/values are laid out [B, K, S, H] and the G*T query rows of each kv head are batched together as M, so both
    matmuls are batched products without a transpose of the keys or values: on CPU a head-minor layout such as
    [B, S, K, H] costs a transpose of the whole cache per layer and decode step. keys_slots_last: k is [B, K, H, S]
    (the cache's layout), so the score product is a plain [M, H] x [H, S]. use_kernel (with keys_slots_last): a
    cached-attention kernel registered in models/kernels.py may take the call when it applies (the CPU wing's
    native decode-attention kernel: CPU, float32, a decode step), else XLA's ops below.
    """
    B, T, N, H = q_BTNH.shape
    K = k.shape[1]
    G = N // K
    q_BKMH = (q_BTNH * jnp.asarray(H ** -0.5, q_BTNH.dtype)).reshape(B, T, K, G, H).transpose(0, 2, 3, 1, 4)
    q_BKMH = q_BKMH.reshape(B, K, G * T, H)
    out_BKMH = kernels.cached_attention(q_BKMH, k, v_BKSH, mask_BTS) if use_kernel and keys_slots_last else None
    if out_BKMH is None:
        out_BKMH = grouped_attention(q_BKMH, k, v_BKSH, mask_BTS, keys_slots_last)
    return out_BKMH.reshape(B, K, G, T, H).transpose(0, 3, 1, 2, 4).reshape(B, T, N, H)


def attention(p, x_BTD, positions_BT, mask_BTS, *, rope_theta: float, cache=None, layer: int = 0, cache_index=None,
              rope=None, norm_eps: float = 1e-6, use_kernel: bool = False):
    """Self-attention block (without its norm). p: wq [D,N,H], wk/wv [D,K,H], wo [N,H,D]; optional biases
    bq [N,H], bk/bv [K,H] (Qwen2) and per-head RMSNorm scales q_norm/k_norm [H] applied before the rotary
    embedding (Qwen3), used when present.

    Without a cache, keys are this call's tokens. With a cache (transformer.init_cache: per layer, values
    [B, K, S, H] and keys in `cache_layout()`'s layout) the new keys/values are written into layer `layer`'s arrays at
    slots cache_index .. cache_index + T - 1 (cache_index may be traced) and the queries attend over all S slots under
    mask_BTS.
    rope: rope_tables(positions_BT, H, rope_theta) if precomputed. use_kernel: the cached path may use a registered
    cached-attention kernel (callers pass True only without a mesh: such kernels have no partitioning rule).
    Returns (out_BTD, cache).
    """
    dtype = x_BTD.dtype
    q_BTNH = project("BTD,DNH->BTNH", x_BTD, p["wq"])
    k_BTKH = project("BTD,DKH->BTKH", x_BTD, p["wk"])
    v_BTKH = project("BTD,DKH->BTKH", x_BTD, p["wv"])
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
        slots_last = cache_layout() == "keys_slots_last"
        if slots_last:
            k_new = jax.lax.dynamic_update_slice(k_old, k_BKTH.transpose(0, 1, 3, 2).astype(k_old.dtype),
                                                 (zero, zero, zero, index))
        else:
            k_new = jax.lax.dynamic_update_slice(k_old, k_BKTH.astype(k_old.dtype), (zero, zero, index, zero))
        v_new = jax.lax.dynamic_update_slice(v_old, v_BKTH.astype(v_old.dtype), (zero, zero, index, zero))
        replace = lambda arrays, new: arrays[:layer] + (new,) + arrays[layer + 1:]  # noqa: E731
        cache = {**cache, "k": replace(tuple(cache["k"]), k_new), "v": replace(tuple(cache["v"]), v_new)}
        out_BTNH = dot_product_attention(q_BTNH, k_new.astype(dtype), v_new.astype(dtype), mask_BTS,
                                         keys_slots_last=slots_last, use_kernel=use_kernel)
    # Heads merged into one contraction axis on both sides (free reshapes of row-major arrays): contracting (N, H)
    # as two axes let XLA transpose wo to the activation's order on every call, a copy of the weight per layer and
    # decode step (SmolLM2 sampling, docs/model.md).
    B, T, N, H = out_BTNH.shape
    return project("BTE,ED->BTD", out_BTNH.reshape(B, T, N * H), flatten_in(p["wo"], 2)), cache


def swiglu(p, x_BTD):
    """SwiGLU feed-forward: (silu(x W_gate) * x W_up) W_down. p: w_gate/w_up [D,F], w_down [F,D]."""
    dtype = x_BTD.dtype
    gate_BTF = project("BTD,DF->BTF", x_BTD, p["w_gate"])
    up_BTF = project("BTD,DF->BTF", x_BTD, p["w_up"])
    return project("BTF,FD->BTD", jax.nn.silu(gate_BTF) * up_BTF, p["w_down"])
