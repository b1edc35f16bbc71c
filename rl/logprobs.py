"""The policy's per-token logprobs, entropy and value-head readings, from one forward pass.

The train step's objectives (rl/objectives.py, prm/objective.py) read a forward's logits or hidden states through
these functions, and the stages' reference and old-policy passes call make_logprob_fn, so the sampler's
distribution (softmax(logits / temperature)), the two batch layouts and the chunked path (ModelConfig.logits_chunk
> 0: models/vocab.py, never holding [B, T, vocab] logits) are written once:

    fn = make_logprob_fn(model_cfg, mesh=mesh)            # jitted: fn(params, tokens, attn_mask, temperature) -> logp
    logp, values = make_logprob_fn(model_cfg, with_values=True)(params, tokens, attn_mask)   # PPO's old values
    logp, ent = logprobs_entropy(params, logits, aux, tokens, temp, model_cfg, mesh, rules, grouped)  # in a loss

Layouts: the flat one, [rows, T] prompt + answer per row, where column t is token t predicted from position t - 1
(column 0 is 0); the grouped one (models/shared_prompt.py: prompts [G, P] left-padded, computed once, and their K
answers per row [G*K, C]), where column t is answer token t, the sampler's alignment. Values follow logprobs:
values[:, t] is the head applied to the hidden state before token t (flat: values[:, 0] = 0).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from models import shared_prompt, sharding, transformer, vocab
from models.transformer import unembedding
from rl import losses

__all__ = ["make_logprob_fn", "compute_logprobs", "logprobs_entropy", "token_logprobs", "head", "shifted_values",
           "model_params", "is_grouped", "batch_sharding"]


def model_params(params: dict) -> dict:
    """The model's parameters of a train state's params (without "value_head")."""
    return {k: v for k, v in params.items() if k != "value_head"}


def head(params: dict, hidden: jax.Array) -> jax.Array:
    """The linear value head params["value_head"] on each position's hidden state, float32 [B, T]."""
    h = params["value_head"]
    return jnp.einsum("btd,d->bt", hidden.astype(jnp.float32), h["w"]) + h["b"]


def shifted_values(params: dict, hidden: jax.Array) -> jax.Array:
    """The flat layout's values: column t reads the hidden state before token t, column 0 is 0."""
    return jnp.pad(head(params, hidden[:, :-1]), ((0, 0), (1, 0)))


def is_grouped(batch: dict) -> bool:
    """The grouped layout: prompts once ([G, P] prompt_tokens / prompt_mask, left-padded) and their K answers per
    row ([G*K, C] tokens, attn_mask, loss_mask, ... with column t = answer token t), as the sampler returns them
    (models/shared_prompt.py); otherwise the flat layout, [rows, T] prompt + answer per row."""
    return "prompt_tokens" in batch


def _chunked_logprobs(params, aux, tokens, temperature, model_cfg, mesh, rules):
    """(logp, entropy) [B, T] from forward(..., return_logits=False)'s hidden states, model_cfg.logits_chunk positions
    at a time (models/vocab.py): the full-logits path's numbers without [B, T, vocab] float32 logits."""
    return vocab.sequence_logprobs(model_params(params), model_cfg, aux["hidden"], tokens, temperature,
                                   chunk_len=model_cfg.logits_chunk, mesh=mesh, rules=rules)


def token_logprobs(params, logits, aux, tokens, temperature, model_cfg, mesh, rules):
    """Per-token logprobs [B, T] (flat layout) from forward's full logits, or chunk by chunk when
    model_cfg.logits_chunk > 0."""
    if model_cfg.logits_chunk > 0:
        return _chunked_logprobs(params, aux, tokens, temperature, model_cfg, mesh, rules)[0]
    return losses.token_logprobs(logits, tokens, temperature)


def logprobs_entropy(params, logits, aux, tokens, temp, model_cfg, mesh, rules, grouped: bool):
    """(logp, entropy) [B, T] of `tokens` under softmax(logits / temp). Flat layout: column t from position t - 1,
    column 0 is 0; grouped layout: column t from column t (shared_prompt.forward's alignment)."""
    if model_cfg.logits_chunk > 0:
        if not grouped:
            return _chunked_logprobs(params, aux, tokens, temp, model_cfg, mesh, rules)
        w, layout, scale = unembedding(model_params(params), model_cfg)
        return vocab.chunked_logprobs(aux["hidden"], w, tokens, layout=layout, scale=scale, temperature=temp,
                                      chunk_len=model_cfg.logits_chunk, mesh=mesh, rules=rules)
    # One log-softmax at the sampling temperature feeds both the sampled-token logprobs and the entropy.
    pred, tgt = (logits, tokens) if grouped else (logits[:, :-1], tokens[:, 1:])
    logp_all = jax.nn.log_softmax(pred.astype(jnp.float32) / temp[:, None, None], axis=-1)
    logp = jnp.take_along_axis(logp_all, tgt[..., None], axis=-1)[..., 0]
    ent = -(jnp.exp(logp_all) * logp_all).sum(-1)
    if grouped:
        return logp, ent
    return jnp.pad(logp, ((0, 0), (1, 0))), jnp.pad(ent, ((0, 0), (1, 0)))


def batch_sharding(mesh, rules) -> NamedSharding:
    """Rows over the mesh's batch axes: one spec for [B], [B, T] and [B, T, ...] leaves (only the leading axis is
    sharded)."""
    rules = sharding.DEFAULT_RULES if rules is None else rules
    lead = sharding.batch_sharding(mesh, rules, ndim=2).spec[0]
    return NamedSharding(mesh, PartitionSpec(lead))


def _logprobs(params, tokens, attn_mask, temperature, model_cfg, mesh, rules, with_values, routes=None,
              prompt_tokens=None, prompt_mask=None):
    chunked = model_cfg.logits_chunk > 0
    grouped = prompt_tokens is not None
    if grouped:
        if routes is not None:
            raise ValueError("routes (routing replay) need the flat layout, not prompt_tokens / prompt_mask")
        logits, aux = shared_prompt.forward(model_params(params), prompt_tokens, prompt_mask, tokens, attn_mask,
                                            model_cfg, return_logits=not chunked, mesh=mesh, rules=rules)
    else:
        logits, aux = transformer.forward(model_params(params), tokens, model_cfg, attn_mask=attn_mask,
                                          return_hidden=with_values, return_logits=not chunked, mesh=mesh,
                                          rules=rules, routes=routes)
    real = attn_mask.astype(jnp.float32)
    if grouped:
        temp = jnp.broadcast_to(jnp.asarray(temperature, jnp.float32), (tokens.shape[0],))
        logp = logprobs_entropy(params, logits, aux, tokens, temp, model_cfg, mesh, rules, True)[0] * real
    else:
        logp = token_logprobs(params, logits, aux, tokens, temperature, model_cfg, mesh, rules) * real
    if not with_values:
        return logp
    values = head(params, aux["hidden"]) if grouped else shifted_values(params, aux["hidden"])
    return logp, values * real


def make_logprob_fn(model_cfg, mesh=None, rules=None, with_values: bool = False):
    """Jitted `fn(params, tokens, attn_mask, temperature=1.0, routes=None, prompt_tokens=None, prompt_mask=None)
    -> logp [B, T]` (and values [B, T] for PPO).

    Flat layout: logp[:, t] = log softmax(logits[:, t-1] / temperature)[tokens[:, t]], logp[:, 0] = 0, and 0 on
    padding. Grouped layout (prompt_tokens / prompt_mask [G, P] given, tokens the [G*K, C] answers): logp[:, t] is
    answer token t's, the sampler's alignment, each prompt computed once (models/shared_prompt.py). temperature is
    a scalar or one per row, traced (no recompiles). Use it for reference logprobs at the sampling temperature (the
    behaviour logprobs are the sampler's own). routes: recorded experts [B, T, n_moe_layers, k] to replay (routing
    replay, flat layout only), as in the train step.
    """

    def fn(params, tokens, attn_mask, temperature=1.0, routes=None, prompt_tokens=None, prompt_mask=None):
        return _logprobs(params, tokens, attn_mask, temperature, model_cfg, mesh, rules, with_values, routes,
                         prompt_tokens, prompt_mask)

    if mesh is None:
        return jax.jit(fn)
    out = batch_sharding(mesh, rules)
    return jax.jit(fn, out_shardings=(out, out) if with_values else out)


@functools.partial(jax.jit, static_argnames=("cfg",))
def compute_logprobs(params, tokens, attn_mask, cfg, temperature=1.0):
    """Unsharded convenience form of make_logprob_fn: `[B, T]` per-token logprobs."""
    return _logprobs(params, tokens, attn_mask, temperature, cfg, None, None, False)
