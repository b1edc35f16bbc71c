"""Token logprobs and entropy for large vocabularies without materialising [batch, length, vocab] logits.

With a 151,936-entry vocabulary (Qwen), float32 logits for a batch of 8 x 1024 tokens take 5 GB, and the log-softmax,
its exp and their gradients several times that. Here the logits exist one chunk of positions at a time:

    _, aux = transformer.forward(params, tokens, cfg, attn_mask=mask, return_logits=False)
    logp_BT, entropy_BT = sequence_logprobs(params, cfg, aux["hidden"], tokens, temperature=temp_B)

`sequence_logprobs` uses the repository's alignment (rl.losses.token_logprobs): column t scores tokens[:, t] from the
hidden state at t - 1 and column 0 is 0, for both the logprobs and the entropy. `chunked_logprobs` is the aligned core:
for hidden states h [B, T, D], the output matrix w and targets [B, T] it returns, per position, log softmax(z)[target]
and the entropy of softmax(z), where z = scale * h @ w / temperature.

The forward pass is a lax.scan over chunks of `chunk_len` positions (all rows of the batch at once: the batch axis
keeps its sharding) that keeps only logsumexp and E[z] per position. The gradient is a custom VJP that recomputes each
chunk's logits, so the largest temporaries are a few [B, chunk_len, vocab] float32 arrays whatever the length:

    d logp / dz_j = onehot_j - p_j          d entropy / dz_j = -p_j (z_j - E[z])

The weight gradient accumulates in float32 across chunks; hidden and weight gradients are returned in the inputs'
dtypes (bf16 parameters get bf16 gradients). Everything from the logits on is float32; the three matmuls take their
inputs in the compute dtype (hidden's) and accumulate in float32. Given a mesh, each chunk's logits are laid out as
forward's are (("batch", "length", "vocab") through the rules: rows over the batch axes, the vocabulary over tensor),
so a sharded vocabulary stays sharded and logsumexp / E[z] reduce across its shards.

The train step uses this path when ModelConfig.logits_chunk > 0 (rl/train_step.py).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from models import sharding
from models.transformer import unembedding

_EINSUM = {"DV": ("BCD,DV->BCV", "BCV,DV->BCD", "BCD,BCV->DV"),
           "VD": ("BCD,VD->BCV", "BCV,VD->BCD", "BCD,BCV->VD")}


def _chunks(x, n: int, c: int):
    """[B, n*c, ...] -> [n, B, c, ...] (the scan axis first)."""
    return jnp.moveaxis(x.reshape(x.shape[0], n, c, *x.shape[2:]), 1, 0)


def _unchunk(x):
    """[n, B, c, ...] -> [B, n*c, ...]."""
    x = jnp.moveaxis(x, 0, 1)
    return x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])


def _chunk_logits(h_BCD, w, s_B, layout, z_sharding):
    z_BCV = jnp.einsum(_EINSUM[layout][0], h_BCD, w.astype(h_BCD.dtype), preferred_element_type=jnp.float32)
    if z_sharding is not None:
        z_BCV = jax.lax.with_sharding_constraint(z_BCV, z_sharding)
    return z_BCV * s_B[:, None, None]


def _forward(h_nBCD, w, tgt_nBC, s_B, layout, z_sharding):
    def chunk(_, xs):
        h_BCD, tgt_BC = xs
        z_BCV = _chunk_logits(h_BCD, w, s_B, layout, z_sharding)
        # One exp pass feeds both statistics: with u = z - max z and e = exp(u), logsumexp = max + log sum e and
        # E[z] = max + sum(e u) / sum e (a separate p = exp(z - lse) took a second pass over the [B, chunk, vocab]
        # logits: 452 -> 352 ms per 1,024 x 49,152 chunk on a 2-core CPU). No stop_gradient: the VJP is _bwd's.
        m_BC = jnp.max(z_BCV, axis=-1)
        u_BCV = z_BCV - m_BC[..., None]
        e_BCV = jnp.exp(u_BCV)
        sum_BC = jnp.sum(e_BCV, axis=-1)
        log_sum_BC, mean_u_BC = jnp.log(sum_BC), jnp.sum(e_BCV * u_BCV, axis=-1) / sum_BC
        lse_BC, ez_BC = m_BC + log_sum_BC, m_BC + mean_u_BC
        z_tgt_BC = jnp.take_along_axis(z_BCV, tgt_BC[..., None], axis=-1)[..., 0]
        # entropy = lse - E[z] taken before adding the max back (no cancellation of two large numbers)
        return None, (z_tgt_BC - lse_BC, log_sum_BC - mean_u_BC, lse_BC, ez_BC)

    return jax.lax.scan(chunk, None, (h_nBCD, tgt_nBC))[1]


@partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _logprobs_entropy(h_nBCD, w, tgt_nBC, s_B, layout, z_sharding):
    logp, ent, _, _ = _forward(h_nBCD, w, tgt_nBC, s_B, layout, z_sharding)
    return logp, ent


def _fwd(h_nBCD, w, tgt_nBC, s_B, layout, z_sharding):
    logp, ent, lse, ez = _forward(h_nBCD, w, tgt_nBC, s_B, layout, z_sharding)
    return (logp, ent), (h_nBCD, w, tgt_nBC, s_B, lse, ez)


def _bwd(layout, z_sharding, residuals, cotangents):
    h_nBCD, w, tgt_nBC, s_B, lse_nBC, ez_nBC = residuals
    g_logp_nBC, g_ent_nBC = cotangents
    _, to_h, to_w = _EINSUM[layout]

    def chunk(dw, xs):
        h_BCD, tgt_BC, lse_BC, ez_BC, g_logp_BC, g_ent_BC = xs
        z_BCV = _chunk_logits(h_BCD, w, s_B, layout, z_sharding)
        p_BCV = jnp.exp(z_BCV - lse_BC[..., None])
        dz_BCV = -p_BCV * (g_logp_BC[..., None] + g_ent_BC[..., None] * (z_BCV - ez_BC[..., None]))
        onehot_BCV = jax.nn.one_hot(tgt_BC, z_BCV.shape[-1], dtype=jnp.float32)
        dz_BCV = (dz_BCV + onehot_BCV * g_logp_BC[..., None]) * s_B[:, None, None]  # through z = s * (h @ w)
        # The two gradient matmuls take their inputs in the compute dtype and accumulate in float32, like the
        # forward matmul (a float32 copy of a bf16 [V, D] table would cost more than the chunks themselves).
        dz_c = dz_BCV.astype(h_BCD.dtype)
        dh_BCD = jnp.einsum(to_h, dz_c, w.astype(h_BCD.dtype), preferred_element_type=jnp.float32)
        dw = dw + jnp.einsum(to_w, h_BCD, dz_c, preferred_element_type=jnp.float32)
        return dw, dh_BCD.astype(h_BCD.dtype)

    dw, dh_nBCD = jax.lax.scan(chunk, jnp.zeros(w.shape, jnp.float32),
                               (h_nBCD, tgt_nBC, lse_nBC, ez_nBC, g_logp_nBC, g_ent_nBC))
    return dh_nBCD, dw.astype(w.dtype), None, jnp.zeros_like(s_B)


_logprobs_entropy.defvjp(_fwd, _bwd)


def chunked_logprobs(hidden_BTD, w, targets_BT, *, layout: str = "DV", scale: float = 1.0, temperature=1.0,
                     chunk_len: int = 128, mesh=None, rules=None):
    """(logp [B, T], entropy [B, T]) float32 of softmax(z), z = scale * hidden @ w / temperature, position by position.

    w: [D, V] for layout "DV" or [V, D] for "VD" (a tied embedding table, used without a transpose copy).
    temperature: a scalar or one value per row [B]. chunk_len: positions per chunk (the last chunk is padded); the
    largest temporaries are about three [B, chunk_len, V] float32 arrays in the backward pass. Differentiable in
    hidden and w (custom VJP, see the module docstring); targets and temperature get no gradient. mesh / rules
    (models/sharding.py; rules default to DEFAULT_RULES): lay each chunk's logits out as forward's logits are.
    """
    if layout not in _EINSUM:
        raise ValueError(f"layout must be 'DV' or 'VD', got {layout!r}")
    if int(chunk_len) < 1:
        raise ValueError(f"chunk_len must be >= 1, got {chunk_len}")
    B, T, _ = hidden_BTD.shape
    if T == 0:
        return jnp.zeros((B, 0), jnp.float32), jnp.zeros((B, 0), jnp.float32)
    c = min(int(chunk_len), T)
    n = -(-T // c)
    pad = n * c - T
    targets_BT = targets_BT.astype(jnp.int32)
    if pad:
        hidden_BTD = jnp.pad(hidden_BTD, ((0, 0), (0, pad), (0, 0)))
        targets_BT = jnp.pad(targets_BT, ((0, 0), (0, pad)))
    temp_B = jnp.broadcast_to(jnp.asarray(temperature, jnp.float32), (B,))
    s_B = jnp.float32(scale) / temp_B
    z_sharding = None
    if mesh is not None:
        rules = sharding.DEFAULT_RULES if rules is None else rules
        V = w.shape[1] if layout == "DV" else w.shape[0]
        spec = sharding.logical_to_spec(("batch", "length", "vocab"), rules, shape=(B, c, V), mesh=mesh)
        z_sharding = jax.sharding.NamedSharding(mesh, spec)  # hashable: a static argument of the custom VJP
    logp, ent = _logprobs_entropy(_chunks(hidden_BTD, n, c), w, _chunks(targets_BT, n, c), s_B, layout, z_sharding)
    return _unchunk(logp)[:, :T], _unchunk(ent)[:, :T]


def sequence_logprobs(params, cfg, hidden_BTD, tokens_BT, temperature=1.0, *, chunk_len: int = 128, mesh=None,
                      rules=None):
    """Next-token (logp [B, T], entropy [B, T]) of a sequence from forward(..., return_logits=False)'s aux["hidden"].

    Column t: log p(tokens[:, t] | tokens[:, :t]) and the entropy of that predictive distribution, both from the
    hidden state at t - 1, under softmax(logits / temperature); column 0 is 0 (rl.losses.token_logprobs' alignment).
    temperature: a scalar or one value per row [B]; mesh / rules as in chunked_logprobs.
    """
    w, layout, scale = unembedding(params, cfg)
    logp, ent = chunked_logprobs(hidden_BTD[:, :-1], w, tokens_BT[:, 1:], layout=layout, scale=scale,
                                 temperature=temperature, chunk_len=chunk_len, mesh=mesh, rules=rules)
    return jnp.pad(logp, ((0, 0), (1, 0))), jnp.pad(ent, ((0, 0), (1, 0)))
