"""Mixture-of-Experts feed-forward block: float32 top-k router, dispatch to SwiGLU experts, combine, router losses.

`moe_layer(p, x_BTD, cfg, token_mask_BT=None)` is what models/transformer.py calls. Two dispatch paths:

* dropless (cfg.capacity_factor is None): every routed assignment is computed, grouped by expert and multiplied
  with its expert's weights only, so the cost is that of the active parameters, not all experts. The kernel comes
  from the registry in models/kernels.py: `impl` names one, or "auto" (the default, for forward passes and
  gradients alike) takes the best registered claim, else "ragged_dot" off CPU and "blocked" on CPU (both portable
  JAX, models/moe_kernels.py). A backend wing adds its own: models/cpu/ registers the compiled "native" kernel
  (CPU, float32, no mesh) and the "windowed" decode dispatch (CPU, few tokens), docs/model.md.
* capacity (cfg.capacity_factor = cf): each expert takes at most ceil(cf * tokens * k / E) assignments in priority
  order (every token's first choice before any second choice, then token order); the rest are dropped (contribute 0)
  and counted. Dispatch is a scatter into an [E, capacity, D] buffer and one batched einsum per weight.

Given a mesh whose "expert" axis is > 1, moe_layer instead exchanges tokens with the devices holding their experts
(all-to-all in a shard_map, models/moe_ep.py), with the same dropless / capacity semantics and the same registry.

Tokens with token_mask 0 (padding) are not dispatched at all (they take no capacity and cost nothing) and are excluded
from the router statistics. Statistics: load-balancing loss E * sum_e f_e p_e (f_e fraction of routed assignments to
expert e, p_e mean router probability), z-loss mean(logsumexp(logits)^2), expert load f_e, dropped fraction.

Routing replay (R3): given recorded expert ids (the sampler's, models/sampling.py), the layer uses those experts and
recomputes their gate weights from the current router probabilities, so the forward follows the sampler's routes
while the router still gets gradients; it also counts how many token routes its own top-k would have chosen
differently (router/replay_disagreement in the train step).

Suffixes: N tokens, A = N*k assignments, E experts, D d_model, F expert width.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from models import kernels, moe_ep, moe_kernels
from models.layers import swiglu


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



# ---- the layer -------------------------------------------------------------------------------------------------------
def moe_layer(p, x_BTD, cfg, *, token_mask_BT=None, impl: str = "auto", block_size: int | None = None,
              mesh=None, rules=None, routes_BTK=None, replay: bool = True):
    """Routed (+ shared) SwiGLU experts. p: router [D,E], w_gate/w_up [E,D,F], w_down [E,F,D], optional "shared".

    impl: the dropless path's expert kernel, a name registered in models/kernels.py ("blocked", "ragged_dot", and
    a wing's, e.g. "native" / "windowed" from models/cpu) or "auto" (see the module docstring); ignored when
    cfg.capacity_factor is set. block_size: the blocked kernel's row block and the windowed kernel's window (None:
    their heuristics).
    mesh / rules: with a mesh whose "expert" axis is > 1, tokens are exchanged with the devices holding their experts
    by all-to-all (models/moe_ep.py); otherwise the dispatch below runs under XLA's automatic partitioning.
    routes_BTK: recorded expert ids [B, T, k] (-1 = no record), e.g. the sampler's. With replay (routing replay,
    R3) the recorded tokens use them (see `route`); either way stats gain replay_differ / replay_compared, the
    counts of `replay_disagreement`. Replay happens before dispatch, so every dispatch path (capacity, expert
    parallel) runs the replayed experts unchanged.
    Returns (y_BTD, stats) with stats router_aux_loss, router_z_loss, expert_load [E], router_prob [E],
    dropped_fraction (f32) and experts [N, k] (the ids used).
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
        y_NKD, stats["dropped_fraction"] = moe_kernels.experts_capacity(p, x_ND, experts_NK, valid_NK,
                                                                         cfg.capacity_factor)
    else:
        name = kernels.resolve_moe(impl, x_ND, p, cfg.experts_per_token, mesh)
        y_NKD = kernels.moe_kernel(name)(p, x_ND, experts_NK, valid_NK, block_size)
        stats["dropped_fraction"] = jnp.zeros((), jnp.float32)
    if y_ND is None:
        y_ND = jnp.einsum("NKD,NK->ND", y_NKD, weights_NK.astype(x_ND.dtype))
    if "shared" in p:
        y_ND = y_ND + swiglu(p["shared"], x_ND[None])[0]
    stats["experts"] = experts_NK
    return y_ND.reshape(B, T, D), stats

