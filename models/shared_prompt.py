"""Forward pass over K completions of each prompt that computes every prompt once (the "grouped" layout).

    out, aux = forward(params, prompts_GP, prompt_mask_GP, tokens_RC, attn_mask_RC, cfg)
    # out: logits [R, C, vocab] (or None with return_logits=False); aux["hidden"] [R, C, d_model]

GRPO samples K answers per prompt, so a flat [G*K, P + C] training batch runs each prompt's P tokens through the
model K times, although their hidden states are the same in every copy (causal attention: a prompt position never
sees the answer). Here the G prompts (LEFT-padded, as the sampler takes them) fill a KV cache once; its K copies
then serve the R = G*K completions (row r answers prompt r // K, the sampler's row order), which attend to it
exactly as decoding did. Autodiff sums the K copies' gradients back into the one prompt pass. At W1's shapes
(32 prompt + 64 answer tokens, K = 8) that is 29% fewer token-passes; the numbers are the flat layout's up to
float rounding (tests/test_shared_prompt.py).

Alignment is the sampler's: hidden / logits column t predicts tokens[:, t] (column 0 from the prompt's last
position), so logp[:, t] is the log-probability of answer token t, the column of `generate`'s logprobs. Tokens
after a row's end (attn_mask 0) are still computed but never attended to.

Router statistics are those of the flat batch: each prompt token is counted K times (each pass's means are
combined by token counts). Exact for the dropless MoE; with cfg.capacity_factor each pass drops by its own
capacity. Routing replay (recorded routes) is not supported here.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from models import transformer
from models.config import ModelConfig


def _combined_stats(aux_p: dict, aux_c: dict, n_p: jax.Array, n_c: jax.Array, n_experts: int) -> dict:
    """The two passes' per-layer router statistics as one batch's: means weighted by token counts."""
    w_p = n_p / jnp.maximum(n_p + n_c, 1.0)
    mix = lambda a, b: w_p * a + (1.0 - w_p) * b
    out = {k: mix(aux_p[k], aux_c[k]) for k in ("router_z_loss", "expert_load", "router_prob", "dropped_fraction")}
    out["router_aux_loss"] = n_experts * jnp.sum(out["expert_load"] * out["router_prob"], axis=-1)
    return out


def forward(params, prompts_GP, prompt_mask_GP, tokens_RC, attn_mask_RC, cfg: ModelConfig, *,
            return_logits: bool = True, mesh=None, rules=None, moe_impl: str = "auto"):
    """(logits [R, C, V] float32 or None, aux) for R = G*K completions of G left-padded prompts.

    aux: "hidden" [R, C, D] (final-normed; column t predicts tokens[:, t]) and the router statistics of
    transformer.forward, stacked per MoE layer, as the flat [R, P + C] batch would give them. moe_impl: as in
    transformer.forward.
    """
    G, P = prompts_GP.shape
    R, C = tokens_RC.shape
    if G == 0 or R % G:
        raise ValueError(f"completions ({R} rows) must be a multiple of the prompts ({G} rows)")
    K = R // G
    fwd = lambda *a, **kw: transformer.forward(params, *a, cfg=cfg, return_logits=False, mesh=mesh, rules=rules,
                                               moe_impl=moe_impl, **kw)
    mask_GP = prompt_mask_GP.astype(bool)
    real_RC = attn_mask_RC.astype(bool)
    prompt_len_G = jnp.sum(mask_GP, axis=1, dtype=jnp.int32)
    # The prompt pass: a padded prompt keeps the positions it would have alone (the sampler's prefill).
    positions_GP = jnp.maximum(jnp.cumsum(mask_GP, axis=1, dtype=jnp.int32) - 1, 0)
    kv_valid_GL = jnp.concatenate([mask_GP, jnp.zeros((G, C), bool)], axis=1)
    _, aux_p = fwd(prompts_GP, positions=positions_GP, attn_mask=mask_GP, cache=transformer.init_cache(cfg, G, P + C),
                   cache_index=jnp.int32(0), kv_valid=kv_valid_GL)
    # K copies of each prompt's keys and values; completion token t sits in slot P + t at position len + t.
    cache = jax.tree.map(lambda c: jnp.repeat(c, K, axis=0), aux_p["cache"])
    kv_valid_RL = jnp.concatenate([jnp.repeat(mask_GP, K, axis=0), real_RC], axis=1)
    positions_RC = jnp.repeat(prompt_len_G, K)[:, None] + jnp.arange(C, dtype=jnp.int32)[None]
    _, aux_c = fwd(tokens_RC, positions=positions_RC, attn_mask=real_RC, cache=cache, cache_index=jnp.int32(P),
                   kv_valid=kv_valid_RL)
    last_RD = jnp.repeat(aux_p["hidden"][:, -1], K, axis=0)  # left padding: the last column is the prompt's end
    hidden_RCD = jnp.concatenate([last_RD[:, None], aux_c["hidden"][:, :-1]], axis=1)

    n_p = K * jnp.sum(mask_GP, dtype=jnp.float32)
    n_c = jnp.sum(real_RC, dtype=jnp.float32)
    aux = {"hidden": hidden_RCD}
    if aux_p["expert_load"].shape[0]:  # MoE layers present
        aux.update(_combined_stats(aux_p, aux_c, n_p, n_c, cfg.n_experts))
    else:
        aux.update({k: v for k, v in aux_c.items() if k not in ("hidden", "cache")})
    if not return_logits:
        return None, aux
    return transformer.logits_from_hidden(params, hidden_RCD, cfg, mesh=mesh, rules=rules), aux
