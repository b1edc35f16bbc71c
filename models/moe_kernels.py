"""The portable routed-expert kernels every backend has, and the pieces MoE dispatch shares.

models/moe.py's `moe_layer` and models/moe_ep.py's expert-parallel exchange both run their experts through the
kernels registered in models/kernels.py; this module registers the two that need nothing but JAX:

  - "blocked": each expert's assignments in fixed-size row blocks (each expert's rows padded to a multiple of the
    block), the whole SwiGLU expert per block in one lax.scan (gate and up fused into one [D, 2F] matmul), with a
    custom VJP whose backward is one scan too and accumulates the expert-weight gradients in place. XLA's CPU
    ragged_dot lowers to a dense masked matmul over all groups (every expert on every token), which this avoids:
    it is the CPU's portable kernel.
  - "ragged_dot": sort assignments by expert and call jax.lax.ragged_dot with the group sizes (GPU/TPU kernels).

and the capacity dispatch (`experts_capacity`: each expert takes at most `capacity(...)` assignments, first choices
before second choices, then token order; moe_ep.capacity_keep applies the same rule before its exchange).
`rank_within_expert` / `sort_by_expert` are the assignment bookkeeping the kernels (and a wing's) share.

Suffixes: N tokens, A = N*k assignments, E experts, D d_model, F expert width, H = 2F (gate and up side by side),
G row blocks, b rows per block, C capacity.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from models import kernels


def rank_within_expert(experts_A, valid_A, n_experts: int):
    """For each assignment, how many earlier valid assignments chose the same expert; and per-expert counts."""
    onehot_AE = jax.nn.one_hot(experts_A, n_experts, dtype=jnp.int32) * valid_A[:, None].astype(jnp.int32)
    rank_A = jnp.sum((jnp.cumsum(onehot_AE, axis=0) - 1) * onehot_AE, axis=1)
    return rank_A, jnp.sum(onehot_AE, axis=0)


# ---- blocked expert FFN (dropless; CPU) --------------------------------------------------------------------------
# One lax.scan over row blocks computes a whole SwiGLU expert per block (gate and up fused into one [D, 2F] matmul),
# and one scan computes its backward: 2 loops per layer instead of 6, and the [b, 2F] / [b, F] intermediates of a
# block stay in cache between the matmuls that use them. Blocks past n_used (padding) are skipped by a cond.
def _silu_and_sigmoid(gate):
    sig = jax.nn.sigmoid(gate)
    return gate * sig, sig


def _ffn_forward(x_GbD, w_gu_EDH, w_down_EFD, expert_G, n_used, with_residuals: bool):
    F, D = w_down_EFD.shape[1], w_down_EFD.shape[2]
    b, dtype = x_GbD.shape[1], x_GbD.dtype

    def block(_, inputs):
        g, xb_bD, e = inputs

        def used():
            h_bH = xb_bD @ w_gu_EDH[e]
            act_bF = _silu_and_sigmoid(h_bH[:, :F])[0] * h_bH[:, F:]
            y_bD = act_bF @ w_down_EFD[e]
            return (y_bD, h_bH) if with_residuals else (y_bD,)

        def unused():
            zeros = (jnp.zeros((b, D), dtype), jnp.zeros((b, 2 * F), dtype))
            return zeros if with_residuals else zeros[:1]

        return None, jax.lax.cond(g < n_used, used, unused)

    return jax.lax.scan(block, None, (jnp.arange(x_GbD.shape[0]), x_GbD, expert_G))[1]


@jax.custom_vjp
def expert_ffn(x_GbD, w_gu_EDH, w_down_EFD, expert_G, n_used):
    """SwiGLU expert per row block: y[g] = (silu(x[g] Wg) * x[g] Wu) Wd with W = expert[g]'s weights, for the first
    n_used blocks (0 for the rest). w_gu_EDH is [E, D, 2F]: gate columns first, then up."""
    return _ffn_forward(x_GbD, w_gu_EDH, w_down_EFD, expert_G, n_used, False)[0]


def _ffn_fwd(x_GbD, w_gu_EDH, w_down_EFD, expert_G, n_used):
    y_GbD, h_GbH = _ffn_forward(x_GbD, w_gu_EDH, w_down_EFD, expert_G, n_used, True)
    return y_GbD, (x_GbD, h_GbH, w_gu_EDH, w_down_EFD, expert_G, n_used)


def _ffn_bwd(residuals, dy_GbD):
    x_GbD, h_GbH, w_gu_EDH, w_down_EFD, expert_G, n_used = residuals
    F = w_down_EFD.shape[1]

    def block(carry, inputs):
        g, xb_bD, hb_bH, dyb_bD, e = inputs

        def used(carry):
            dw_gu, dw_down = carry
            gate, up = hb_bH[:, :F], hb_bH[:, F:]
            silu, sig = _silu_and_sigmoid(gate)
            d_act = dyb_bD @ w_down_EFD[e].T
            # d silu(z)/dz = sig(z) (1 + z (1 - sig(z)))
            dh_bH = jnp.concatenate([d_act * up * (sig * (1 + gate * (1 - sig))), d_act * silu], axis=1)
            # In-place accumulation into the carried (float32) gradients: no [E, ...] temporary per block.
            dw_down = jax.lax.dynamic_update_index_in_dim(
                dw_down, dw_down[e] + jnp.matmul((silu * up).T, dyb_bD, preferred_element_type=jnp.float32), e, 0)
            dw_gu = jax.lax.dynamic_update_index_in_dim(
                dw_gu, dw_gu[e] + jnp.matmul(xb_bD.T, dh_bH, preferred_element_type=jnp.float32), e, 0)
            return (dw_gu, dw_down), dh_bH @ w_gu_EDH[e].T

        return jax.lax.cond(g < n_used, used, lambda c: (c, jnp.zeros_like(xb_bD)), carry)

    zeros = (jnp.zeros(w_gu_EDH.shape, jnp.float32), jnp.zeros(w_down_EFD.shape, jnp.float32))
    (dw_gu, dw_down), dx_GbD = jax.lax.scan(block, zeros, (jnp.arange(x_GbD.shape[0]), x_GbD, h_GbH, dy_GbD, expert_G))
    return dx_GbD, dw_gu.astype(w_gu_EDH.dtype), dw_down.astype(w_down_EFD.dtype), None, None


expert_ffn.defvjp(_ffn_fwd, _ffn_bwd)


def default_block_size(n_assignments: int, n_experts: int) -> int:
    # About one block per expert when loads are even, within [32, 128] rows (large enough for efficient matmuls,
    # small enough that padding each expert to a whole block wastes little).
    per_expert = max(1, n_assignments // n_experts)
    return min(128, max(32, 1 << (per_expert - 1).bit_length()))


def experts_blocked(p, x_ND, experts_NK, valid_NK, block_size: int | None):
    """y [N, k, D]: each valid assignment's expert output through `expert_ffn` over row blocks of block_size
    (None: default_block_size) rows."""
    N, D = x_ND.shape
    E, k = p["w_gate"].shape[0], experts_NK.shape[1]
    A = N * k
    b = block_size or default_block_size(A, E)
    experts_A, valid_A = experts_NK.reshape(A), valid_NK.reshape(A)
    rank_A, sizes_E = rank_within_expert(experts_A, valid_A, E)
    blocks_E = (sizes_E + b - 1) // b
    block_end_E = jnp.cumsum(blocks_E)
    G = (A + E * (b - 1)) // b  # most blocks any routing can need
    dummy_row = G * b
    row_A = jnp.where(valid_A, (block_end_E - blocks_E)[experts_A] * b + rank_A, dummy_row)
    token_of_row = jnp.full((G * b,), N, jnp.int32).at[row_A].set(jnp.arange(A, dtype=jnp.int32) // k, mode="drop")
    x_padded = jnp.concatenate([x_ND, jnp.zeros((1, D), x_ND.dtype)])
    x_GbD = x_padded[token_of_row].reshape(G, b, D)
    expert_G = jnp.minimum(jnp.searchsorted(block_end_E, jnp.arange(G), side="right"), E - 1)
    n_used = block_end_E[-1]
    dtype = x_ND.dtype
    w_gu_EDH = jnp.concatenate([p["w_gate"].astype(dtype), p["w_up"].astype(dtype)], axis=2)
    y_GbD = expert_ffn(x_GbD, w_gu_EDH, p["w_down"].astype(dtype), expert_G, n_used)
    y_rows = jnp.concatenate([y_GbD.reshape(G * b, D), jnp.zeros((1, D), dtype)])
    return y_rows[row_A].reshape(N, k, D)


def sort_by_expert(experts_NK, valid_NK, n_experts: int):
    """(expert_A, order_A, sizes_E): each assignment's expert (n_experts for padding, so it sorts last, in no
    expert's range), the stable order that sorts assignments by expert, and each expert's number of rows."""
    A = experts_NK.size
    expert_A = jnp.where(valid_NK.reshape(A), experts_NK.reshape(A), n_experts)
    order_A = jnp.argsort(expert_A, stable=True)
    return expert_A, order_A, jnp.bincount(expert_A, length=n_experts + 1)[:n_experts].astype(jnp.int32)


def experts_ragged(p, x_ND, experts_NK, valid_NK):
    """y [N, k, D] through jax.lax.ragged_dot over the expert-sorted assignments."""
    N, D = x_ND.shape
    E, k = p["w_gate"].shape[0], experts_NK.shape[1]
    A = N * k
    expert_A, order_A, sizes_E = sort_by_expert(experts_NK, valid_NK, E)
    x_AD = x_ND[order_A // k]
    dtype = x_ND.dtype
    gate_AF = jax.lax.ragged_dot(x_AD, p["w_gate"].astype(dtype), sizes_E)
    up_AF = jax.lax.ragged_dot(x_AD, p["w_up"].astype(dtype), sizes_E)
    y_AD = jax.lax.ragged_dot(jax.nn.silu(gate_AF) * up_AF, p["w_down"].astype(dtype), sizes_E)
    y_AD = jnp.where((jnp.arange(A) < jnp.sum(sizes_E))[:, None], y_AD, 0)
    return jnp.zeros_like(y_AD).at[order_A].set(y_AD).reshape(N, k, D)


def capacity(n_tokens: int, k: int, n_experts: int, capacity_factor: float) -> int:
    """Assignments each expert accepts: ceil(cf * tokens * k / E), at least 1, at most the number of tokens."""
    return max(1, min(n_tokens, math.ceil(capacity_factor * n_tokens * k / n_experts)))


def experts_capacity(p, x_ND, experts_NK, valid_NK, capacity_factor: float):
    """(y [N, k, D] with dropped assignments 0, dropped fraction f32): the capacity dispatch, a scatter into an
    [E, capacity, D] buffer and one batched einsum per weight."""
    N, D = x_ND.shape
    E, k = p["w_gate"].shape[0], experts_NK.shape[1]
    C = capacity(N, k, E, capacity_factor)
    # Slot-major priority: every token's first choice is placed before any token's second choice.
    experts_A, valid_A = experts_NK.T.reshape(N * k), valid_NK.T.reshape(N * k)
    token_A = jnp.tile(jnp.arange(N), k)
    pos_A, _ = rank_within_expert(experts_A, valid_A, E)
    keep_A = valid_A & (pos_A < C)
    dtype = x_ND.dtype
    buffer_ECD = jnp.zeros((E, C, D), dtype).at[jnp.where(keep_A, experts_A, E), pos_A].set(
        x_ND[token_A], mode="drop")
    gate_ECF = jnp.einsum("ECD,EDF->ECF", buffer_ECD, p["w_gate"].astype(dtype))
    up_ECF = jnp.einsum("ECD,EDF->ECF", buffer_ECD, p["w_up"].astype(dtype))
    y_ECD = jnp.einsum("ECF,EFD->ECD", jax.nn.silu(gate_ECF) * up_ECF, p["w_down"].astype(dtype))
    y_AD = y_ECD[experts_A, jnp.minimum(pos_A, C - 1)] * keep_A[:, None].astype(dtype)
    dropped = jnp.sum(valid_A & ~keep_A) / jnp.maximum(jnp.sum(valid_A), 1)
    return y_AD.reshape(k, N, D).transpose(1, 0, 2), dropped.astype(jnp.float32)


def _ragged(p, x_ND, experts_NK, valid_NK, block_size):
    return experts_ragged(p, x_ND, experts_NK, valid_NK)


kernels.register_moe("blocked", experts_blocked, in_shard_map=True)
kernels.register_moe("ragged_dot", _ragged, in_shard_map=True)
