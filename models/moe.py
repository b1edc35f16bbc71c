"""Mixture-of-Experts feed-forward block: float32 top-k router, dispatch to SwiGLU experts, combine, router losses.

`moe_layer(p, x_BTD, cfg, token_mask_BT=None)` is what models/transformer.py calls. Two dispatch paths:

* dropless (cfg.capacity_factor is None): every routed assignment is computed. Assignments are grouped by expert and
  multiplied with their expert's weights only, so the cost is that of the active parameters, not all experts:
  - "ragged_dot": sort assignments by expert and call jax.lax.ragged_dot with the group sizes (GPU/TPU kernels).
  - "blocked": place each expert's assignments in fixed-size row blocks (each expert's rows padded to a multiple of
    the block) and run the whole SwiGLU expert per block in one lax.scan (gate and up projections fused into one
    [D, 2F] matmul), with a custom VJP whose backward is one scan too and accumulates the expert-weight gradients
    in place. XLA's CPU ragged_dot lowers to a dense masked matmul
    over all groups (every expert on every token), which this path avoids.
  - "hybrid": each expert's first C rows (C = HYBRID_DENSE_SHARE x the mean load) in one batched einsum per weight,
    the stacked weights read in place; only the rows past them (the routing's imbalance) take the blocked path.
  - "windowed" (few tokens, e.g. a decode step): each expert's first w sorted rows as one window, all windows through
    one batched einsum per weight (the stacked weights read in place), overflow windows under conds.
  - "native" (CPU, float32): models/cpu_kernels.py's compiled kernel, which streams each expert's weights once in
    column panels against every row routed to it (W1's decode loop: 1.7x the windowed path; 4352 tokens: 1.5x the
    blocked one; forward + backward of 2,176 tokens: 1.3x blocked). It has its own backward kernel.
  "auto" and "auto_grad" on CPU take native for float32 without a mesh whenever the kernel is built (the sampler,
  the reference pass, the train step), else "auto" takes windowed while the mean load is at most WINDOWED_MAX_LOAD rows per expert, else
  blocked (W1's decode step: 0.8 vs 1.9 ms per layer; at 512 tokens they tie, at 1024 blocked wins, BENCHMARKS.md).
* capacity (cfg.capacity_factor = cf): each expert takes at most ceil(cf * tokens * k / E) assignments in priority
  order (every token's first choice before any second choice, then token order); the rest are dropped (contribute 0)
  and counted. Dispatch is a scatter into an [E, capacity, D] buffer and one batched einsum per weight.

Given a mesh whose "expert" axis is > 1, moe_layer instead exchanges tokens with the devices holding their experts
(all-to-all in a shard_map, models/moe_ep.py), with the same dropless / capacity semantics.

Tokens with token_mask 0 (padding) are not dispatched at all (they take no capacity and cost nothing) and are excluded
from the router statistics. Statistics: load-balancing loss E * sum_e f_e p_e (f_e fraction of routed assignments to
expert e, p_e mean router probability), z-loss mean(logsumexp(logits)^2), expert load f_e, dropped fraction.

Routing replay (R3): given recorded expert ids (the sampler's, models/sampling.py), the layer uses those experts and
recomputes their gate weights from the current router probabilities, so the forward follows the sampler's routes
while the router still gets gradients; it also counts how many token routes its own top-k would have chosen
differently (router/replay_disagreement in the train step).

Suffixes: N tokens, A = N*k assignments, E experts, D d_model, F expert width, H = 2F (gate and up side by side),
G row blocks, b rows per block, w rows per window, C capacity.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from models import moe_ep, cpu_kernels
from models.layers import swiglu

# "auto" on CPU uses the windowed dispatch up to this mean number of assignments per expert (64 tokens x top-2 of 8
# is 16; W1's prefill of 8 x 32 tokens is 64), the blocked one above it.
WINDOWED_MAX_LOAD = 64


# ---- router --------------------------------------------------------------------------------------------------------
def _router_probs(w_router_DE, x_ND):
    """float32 router logits [N, E] and softmax probabilities [N, E]."""
    logits_NE = jnp.einsum("ND,DE->NE", x_ND.astype(jnp.float32), w_router_DE.astype(jnp.float32))
    return logits_NE, jax.nn.softmax(logits_NE, axis=-1)


def gate_weights(probs_NE, experts_NK, norm_topk_prob: bool = True):
    """Gate weights [N, k] of the given experts: their router probabilities, renormalised to sum to 1 when
    norm_topk_prob. Differentiable in the probabilities, so a replayed route still trains the router."""
    p_NK = jnp.take_along_axis(probs_NE, experts_NK, axis=-1)
    return p_NK / jnp.sum(p_NK, axis=-1, keepdims=True) if norm_topk_prob else p_NK


def replayed_experts(own_NK, recorded_NK):
    """The recorded experts where a token has a record (every entry >= 0), the router's own choice elsewhere."""
    has_N = jnp.all(recorded_NK >= 0, axis=-1)
    return jnp.where(has_N[:, None], recorded_NK.astype(jnp.int32), own_NK)


def replay_disagreement(own_NK, recorded_NK, mask_N):
    """(routes that differ, routes compared) over tokens with mask_N = 1 and a record: a route differs when the
    router's own top-k set is not the recorded set (order within the k ignored). float32 counts, to sum over
    layers and microbatches."""
    has_N = jnp.all(recorded_NK >= 0, axis=-1) & mask_N
    same_N = jnp.all(jnp.any(own_NK[:, :, None] == recorded_NK[:, None, :], axis=-1), axis=-1)
    return (jnp.sum(has_N & ~same_N).astype(jnp.float32), jnp.sum(has_N).astype(jnp.float32))


def route(w_router_DE, x_ND, k: int, norm_topk_prob: bool = True, replay_NK=None):
    """float32 router: logits [N,E], top-k weights [N,k] (f32) and expert ids [N,k] (int32).

    The weights are the softmax probabilities of the k chosen experts, renormalised to sum to 1 when norm_topk_prob
    (equal to a softmax over the top-k logits: Mixtral, Qwen3-MoE's usual setting, the from-scratch model), else the
    raw probabilities (Qwen3-MoE / OLMoE with norm_topk_prob false).

    replay_NK (routing replay, R3): recorded expert ids [N, k], -1 where a token has no record. Recorded tokens use
    those experts, with gate weights recomputed from the current router probabilities at them (so the router keeps
    its gradient); the others route as usual."""
    logits_NE, weights_NK, experts_NK, _ = _route(w_router_DE, x_ND, k, norm_topk_prob, replay_NK, True, None)
    return logits_NE, weights_NK, experts_NK


def _route(w_router_DE, x_ND, k, norm_topk_prob, recorded_NK, replay, mask_N):
    """route(), plus the counts of replay_disagreement (own top-k against the record) when recorded_NK is given;
    replay=False only compares."""
    logits_NE, probs_NE = _router_probs(w_router_DE, x_ND)
    experts_NK = jax.lax.top_k(probs_NE, k)[1].astype(jnp.int32)
    counts = {}
    if recorded_NK is not None:
        recorded_NK = recorded_NK.astype(jnp.int32)
        if mask_N is not None:
            counts["replay_differ"], counts["replay_compared"] = replay_disagreement(experts_NK, recorded_NK, mask_N)
        if replay:
            experts_NK = replayed_experts(experts_NK, recorded_NK)
    return logits_NE, gate_weights(probs_NE, experts_NK, norm_topk_prob), experts_NK, counts


def router_stats(logits_NE, experts_NK, mask_N):
    """Load-balancing loss, z-loss, expert load and mean router probability over the tokens with mask_N = 1.

    load and router_prob are means over the masked tokens, so statistics of disjoint token sets combine exactly
    (models/shared_prompt.py weights its two passes' by their token counts)."""
    n_experts, k = logits_NE.shape[1], experts_NK.shape[1]
    m_N = mask_N.astype(jnp.float32)
    n_real = jnp.maximum(jnp.sum(m_N), 1.0)
    counts_NE = jnp.sum(jax.nn.one_hot(experts_NK, n_experts, dtype=jnp.float32), axis=1)
    load_E = jnp.einsum("N,NE->E", m_N, counts_NE) / (n_real * k)
    mean_prob_E = jnp.einsum("N,NE->E", m_N, jax.nn.softmax(logits_NE, axis=-1)) / n_real
    z_N = jax.nn.logsumexp(logits_NE, axis=-1) ** 2
    return {
        "router_aux_loss": n_experts * jnp.sum(load_E * mean_prob_E),
        "router_z_loss": jnp.sum(m_N * z_N) / n_real,
        "expert_load": load_E,
        "router_prob": mean_prob_E,
    }


def _rank_within_expert(experts_A, valid_A, n_experts: int):
    """For each assignment, how many earlier valid assignments chose the same expert; and per-expert counts."""
    onehot_AE = jax.nn.one_hot(experts_A, n_experts, dtype=jnp.int32) * valid_A[:, None].astype(jnp.int32)
    rank_A = jnp.sum((jnp.cumsum(onehot_AE, axis=0) - 1) * onehot_AE, axis=1)
    return rank_A, jnp.sum(onehot_AE, axis=0)


# ---- blocked expert FFN (dropless, CPU) --------------------------------------------------------------------------
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


def _default_block_size(n_assignments: int, n_experts: int) -> int:
    # About one block per expert when loads are even, within [32, 128] rows (large enough for efficient matmuls,
    # small enough that padding each expert to a whole block wastes little).
    per_expert = max(1, n_assignments // n_experts)
    return min(128, max(32, 1 << (per_expert - 1).bit_length()))


def _experts_blocked(p, x_ND, experts_NK, valid_NK, block_size: int | None, ranks=None):
    """ranks: (rank_A, sizes_E) of the valid assignments, when the caller has them (else computed here)."""
    N, D = x_ND.shape
    E, k = p["w_gate"].shape[0], experts_NK.shape[1]
    A = N * k
    b = block_size or _default_block_size(A, E)
    experts_A, valid_A = experts_NK.reshape(A), valid_NK.reshape(A)
    rank_A, sizes_E = _rank_within_expert(experts_A, valid_A, E) if ranks is None else ranks
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


# ---- hybrid expert FFN (dropless, many tokens: training, prefill, reference pass) ------------------------------------
# The blocked path multiplies one 128-row block at a time; at such sizes XLA's CPU matmul runs at ~half its large-
# matrix rate, and each block copies its expert's weights out of the stacked arrays (and, in the backward, adds its
# weight gradient back in place). Here each expert's first C rows of the expert-sorted assignments (C = a share of the
# mean load, HYBRID_DENSE_SHARE) go through one batched einsum per weight, the stacked weights read in place and the
# weight gradients one batched einsum each; only the rows past an expert's first C (its overflow, the imbalance of the
# routing) take the blocked path. Dropless like blocked, with no capacity to choose: a share below 1 keeps the dense
# buffer nearly full for every expert (an expert with fewer than C rows pads the rest), the blocked part stays small.
HYBRID_DENSE_SHARE = 0.75


def _hybrid_capacity(n_tokens: int, n_assignments: int, n_experts: int, share: float) -> int:
    """Dense rows per expert: share x the mean load, in multiples of 8, at most n_tokens (an expert's most rows)."""
    return min(n_tokens, max(8, -(-math.ceil(share * n_assignments / n_experts) // 8) * 8))


def _experts_hybrid(p, x_ND, experts_NK, valid_NK, block_size: int | None, share: float = HYBRID_DENSE_SHARE):
    N, D = x_ND.shape
    E, k = p["w_gate"].shape[0], experts_NK.shape[1]
    A = N * k
    C = _hybrid_capacity(N, A, E, share)
    experts_A, valid_A = experts_NK.reshape(A), valid_NK.reshape(A)
    rank_A, sizes_E = _rank_within_expert(experts_A, valid_A, E)
    dense_A = valid_A & (rank_A < C)
    slot_A = jnp.where(dense_A, experts_A * C + rank_A, E * C)  # E * C: a zero row past the buffer
    token_of_slot = jnp.full((E * C,), N, jnp.int32).at[slot_A].set(jnp.arange(A, dtype=jnp.int32) // k, mode="drop")
    dtype = x_ND.dtype
    x_ECD = jnp.concatenate([x_ND, jnp.zeros((1, D), dtype)])[token_of_slot].reshape(E, C, D)
    # Three einsums, not one on concatenated gate|up weights: the concatenation's copy (and its gradient's split)
    # cost more than the wider matmul saved (BENCHMARKS.md).
    gate_ECF = jnp.einsum("ECD,EDF->ECF", x_ECD, p["w_gate"].astype(dtype))
    up_ECF = jnp.einsum("ECD,EDF->ECF", x_ECD, p["w_up"].astype(dtype))
    y_ECD = jnp.einsum("ECF,EFD->ECD", jax.nn.silu(gate_ECF) * up_ECF, p["w_down"].astype(dtype))
    y_rows = jnp.concatenate([y_ECD.reshape(E * C, D), jnp.zeros((1, D), dtype)])
    y_NKD = y_rows[slot_A].reshape(N, k, D)
    if C >= N:  # every expert's rows fit (an expert takes each token at most once)
        return y_NKD
    # The overflow's ranks and sizes follow from the whole routing's: no second one-hot cumsum.
    overflow_A = valid_A & ~dense_A
    overflow_ranks = (jnp.where(overflow_A, rank_A - C, 0), jnp.maximum(sizes_E - C, 0))
    return y_NKD + _experts_blocked(p, x_ND, experts_NK, overflow_A.reshape(N, k), block_size, overflow_ranks)


def _sort_by_expert(experts_NK, valid_NK, n_experts: int):
    """(expert_A, order_A, sizes_E): each assignment's expert (n_experts for padding, so it sorts last, in no
    expert's range), the stable order that sorts assignments by expert, and each expert's number of rows."""
    A = experts_NK.size
    expert_A = jnp.where(valid_NK.reshape(A), experts_NK.reshape(A), n_experts)
    order_A = jnp.argsort(expert_A, stable=True)
    return expert_A, order_A, jnp.bincount(expert_A, length=n_experts + 1)[:n_experts].astype(jnp.int32)


# ---- windowed expert FFN (dropless, few tokens: decode) -------------------------------------------------------------
# At a decode step each expert gets a handful of rows and the layer is bound by streaming the experts' weights from
# memory (W1: 50 MB for 4 layers per step, more than the L3). The blocked path's scan multiplies one block at a time,
# copying its expert's weights out of the stacked arrays. Here every expert takes a window of its first w rows of
# the expert-sorted assignments and all windows go through one batched einsum per weight: the stacked weights are
# read in place, once, by one threaded kernel. Dropless: rows past an expert's first w (an expert holds at most
# min(A, N) rows) go through further w-row windows, each under a cond that skips it when that expert has no rows
# there; window rows past an expert's own belong to the next expert and are masked out.
def _default_window(n_assignments: int, n_experts: int) -> int:
    # 1.5x the mean load per expert, in multiples of 8: most routings need no overflow window.
    mean = -(-n_assignments // n_experts)
    return max(8, -(-3 * mean // 16) * 8)


def _experts_windowed(p, x_ND, experts_NK, valid_NK, window: int | None):
    N, D = x_ND.shape
    E, k = p["w_gate"].shape[0], experts_NK.shape[1]
    A = N * k
    w = window or _default_window(A, E)
    dtype = x_ND.dtype
    w_gate, w_up, w_down = (p[n].astype(dtype) for n in ("w_gate", "w_up", "w_down"))
    _, order_A, sizes_E = _sort_by_expert(experts_NK, valid_NK, E)
    starts_E = jnp.cumsum(sizes_E) - sizes_E
    x_AD = jnp.concatenate([x_ND[order_A // k], jnp.zeros((w, D), dtype)])  # w spare rows: every window in bounds

    # models.layers.swiglu under jax.vmap over the experts took 2.3 instead of 0.8 ms per decode layer (XLA relaid
    # out the stacked weights every call), hence the einsums written here with the expert axis leading.
    def swiglu_rows(x, w_g, w_u, w_d, spec):
        g = jnp.einsum(f"{spec}D,{spec[:-1]}DF->{spec}F", x, w_g)
        u = jnp.einsum(f"{spec}D,{spec[:-1]}DF->{spec}F", x, w_u)
        return jnp.einsum(f"{spec}F,{spec[:-1]}FD->{spec}D", jax.nn.silu(g) * u, w_d)

    rows_Ew = starts_E[:, None] + jnp.arange(w)
    y_EwD = swiglu_rows(x_AD[rows_Ew], w_gate, w_up, w_down, "Ew")
    mine_Ew = jnp.arange(w)[None, :] < sizes_E[:, None]
    y_AD = jnp.zeros_like(x_AD).at[rows_Ew].add(jnp.where(mine_Ew[..., None], y_EwD, 0))
    n_windows = -(-min(A, N) // w)
    for e in range(E):
        for j in range(1, n_windows):
            def overflow(y_AD, e=e, j=j):
                start = starts_E[e] + j * w
                y_wD = swiglu_rows(jax.lax.dynamic_slice_in_dim(x_AD, start, w), w_gate[e], w_up[e], w_down[e], "w")
                mine_w = j * w + jnp.arange(w) < sizes_E[e]
                y_wD = jnp.where(mine_w[:, None], y_wD, 0) + jax.lax.dynamic_slice_in_dim(y_AD, start, w)
                return jax.lax.dynamic_update_slice_in_dim(y_AD, y_wD, start, 0)
            y_AD = jax.lax.cond(sizes_E[e] > j * w, overflow, lambda y: y, y_AD)
    return jnp.zeros((A, D), dtype).at[order_A].set(y_AD[:A]).reshape(N, k, D)


def _experts_ragged(p, x_ND, experts_NK, valid_NK):
    N, D = x_ND.shape
    E, k = p["w_gate"].shape[0], experts_NK.shape[1]
    A = N * k
    expert_A, order_A, sizes_E = _sort_by_expert(experts_NK, valid_NK, E)
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


def _experts_capacity(p, x_ND, experts_NK, valid_NK, capacity_factor: float):
    N, D = x_ND.shape
    E, k = p["w_gate"].shape[0], experts_NK.shape[1]
    C = capacity(N, k, E, capacity_factor)
    # Slot-major priority: every token's first choice is placed before any token's second choice.
    experts_A, valid_A = experts_NK.T.reshape(N * k), valid_NK.T.reshape(N * k)
    token_A = jnp.tile(jnp.arange(N), k)
    pos_A, _ = _rank_within_expert(experts_A, valid_A, E)
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


# ---- the layer -------------------------------------------------------------------------------------------------------
def moe_layer(p, x_BTD, cfg, *, token_mask_BT=None, impl: str = "auto", block_size: int | None = None,
              mesh=None, rules=None, routes_BTK=None, replay: bool = True):
    """Routed (+ shared) SwiGLU experts. p: router [D,E], w_gate/w_up [E,D,F], w_down [E,F,D], optional "shared".

    impl: "auto" | "auto_grad" | "native" | "hybrid" | "blocked" | "windowed" | "ragged_dot" for the dropless path
    (ignored when cfg.capacity_factor is set); block_size is the blocked path's row block and the windowed path's
    window (None: their heuristics). "auto": ragged_dot off CPU; on CPU the native kernel (models/cpu_kernels.py)
    for float32 without a mesh when it is built, else windowed for few tokens, else blocked. "auto_grad" (what
    the train step asks for): the same but never windowed, whose backward (a cond per overflow window) made a
    64-token prompt pass's fwd+bwd ~1.5x slower than blocked (BENCHMARKS.md).
    mesh / rules: with a mesh whose "expert" axis is > 1, tokens are exchanged with the devices holding their experts
    by all-to-all (models/moe_ep.py); otherwise the dispatch below runs under XLA's automatic partitioning.
    routes_BTK: recorded expert ids [B, T, k] (-1 = no record), e.g. the sampler's. With replay (routing replay,
    R3) the recorded tokens use them (see `route`); either way stats gain replay_differ / replay_compared, the
    counts of `replay_disagreement`. Replay happens before dispatch, so every dispatch path (capacity, expert
    parallel) runs the replayed experts unchanged.
    Returns (y_BTD, stats) with stats router_aux_loss, router_z_loss, expert_load [E], router_prob [E],
    dropped_fraction (f32) and
    experts [N, k] (the ids used).
    """
    B, T, D = x_BTD.shape
    x_ND = x_BTD.reshape(B * T, D)
    mask_N = jnp.ones((B * T,), bool) if token_mask_BT is None else token_mask_BT.reshape(B * T).astype(bool)
    recorded_NK = None if routes_BTK is None else routes_BTK.reshape(B * T, cfg.experts_per_token)
    logits_NE, weights_NK, experts_NK, counts = _route(p["router"], x_ND, cfg.experts_per_token, cfg.norm_topk_prob,
                                                       recorded_NK, replay, mask_N)
    # Router statistics of the experts really used (the replayed ones under replay).
    stats = {**router_stats(logits_NE, experts_NK, mask_N), **counts}
    valid_NK = jnp.broadcast_to(mask_N[:, None], experts_NK.shape)
    y_ND = None
    if moe_ep.uses_expert_parallelism(mesh):
        y_ND, stats["dropped_fraction"] = moe_ep.dispatch(p, x_BTD, weights_NK, experts_NK, valid_NK, cfg, mesh=mesh,
                                                          rules=rules, impl=impl, block_size=block_size)
    elif cfg.capacity_factor is not None:
        y_NKD, stats["dropped_fraction"] = _experts_capacity(p, x_ND, experts_NK, valid_NK, cfg.capacity_factor)
    else:
        if impl in ("auto", "auto_grad") and cpu_kernels.applies(x_ND, p, mesh):
            impl = "native"
        elif impl in ("auto", "auto_grad"):
            few = x_ND.shape[0] * cfg.experts_per_token <= WINDOWED_MAX_LOAD * cfg.n_experts
            impl = "ragged_dot" if jax.default_backend() != "cpu" else (
                "windowed" if few and impl == "auto" else "blocked")
        if impl == "native":
            if not cpu_kernels.available():
                raise ValueError("impl='native' needs the native expert kernel, which could not be built here "
                                 "(see the warning above, or MATHRL_NATIVE=0)")
            y_NKD = cpu_kernels.expert_ffn(p, x_ND.astype(jnp.float32), experts_NK, valid_NK).astype(x_ND.dtype)
        elif impl == "hybrid":
            y_NKD = _experts_hybrid(p, x_ND, experts_NK, valid_NK, block_size)
        elif impl == "blocked":
            y_NKD = _experts_blocked(p, x_ND, experts_NK, valid_NK, block_size)
        elif impl == "windowed":
            y_NKD = _experts_windowed(p, x_ND, experts_NK, valid_NK, block_size)
        elif impl == "ragged_dot":
            y_NKD = _experts_ragged(p, x_ND, experts_NK, valid_NK)
        else:
            raise ValueError(f"impl must be 'auto', 'auto_grad', 'native', 'hybrid', 'blocked', 'windowed' or "
                             f"'ragged_dot', got {impl!r}")
        stats["dropped_fraction"] = jnp.zeros((), jnp.float32)
    if y_ND is None:
        y_ND = jnp.einsum("NKD,NK->ND", y_NKD, weights_NK.astype(x_ND.dtype))
    if "shared" in p:
        y_ND = y_ND + swiglu(p["shared"], x_ND[None])[0]
    stats["experts"] = experts_NK
    return y_ND.reshape(B, T, D), stats
