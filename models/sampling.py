"""Jitted generation with a KV cache: greedy / temperature / top-k / top-p, K samples per prompt.

    out = generate(params, cfg, prompts, key, prompt_mask=mask, num_samples=8,
                   max_new_tokens=64, temperature=1.0, top_p=0.95)
    out.tokens [B*K, N] int32, out.logprobs [B*K, N] float32, out.lengths [B*K] int32

Layout. Prompts are LEFT-padded ([B, P], prompt_mask 1 = real token), so every prompt ends
in the same cache slot P-1 and generated token i of every row lands in slot P+i. Rotary
positions come from the mask (cumsum(mask) - 1), so a padded prompt sees exactly the
positions it would see alone, and padded slots are hidden from attention by `kv_valid`.

Cost. The prompts are prefilled once ([B, P] forward), then the cache and the last logits
are repeated K times; decoding is a `lax.while_loop` of one-token forwards over [B*K, 1]
that stops as soon as every row has emitted EOS. Row b*K + k is sample k of prompt b; its
random stream is fold_in(fold_in(key, row), step), independent of the other rows.

Logprobs are those of the sampled token under softmax(logits / T) (T = 1 when greedy),
before any top-k/top-p truncation: the quantity the train step recomputes from the
full sequence. After a row's EOS its tokens are `pad_id` and its logprobs 0; `lengths`
counts generated tokens including the EOS.

Everything that changes shapes (cfg, num_samples, max_new_tokens) is a static argument of
one `jax.jit`; temperature, top_p, top_k and the eos/pad ids are traced, so a temperature
schedule or a different filter does not recompile. eos_id is one id or a list of ids (chat
checkpoints end a turn with any of several); eos_id=-1 disables stopping (benchmarks).
The prefill computes logits for the last prompt position only (no [B, P, vocab] array).

Routes (return_routes=True, MoE): the experts each prompt and generated token used in each MoE block, by cache slot,
for routing replay in the train step (rl/train_step.py). A generated token's route is recorded when it is fed back
(the next step), so the last token of each row has none (-1); it predicts nothing the loss uses.

Exactness of cached decoding against a full forward needs a dropless MoE
(capacity_factor=None): with a capacity, which tokens drop depends on the batch, and a
one-token decode batch differs from a full-sequence batch.
"""
from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from models import transformer


class SampleOutput(NamedTuple):
    tokens: jax.Array    # [B*K, max_new_tokens] int32, pad_id after the EOS (the EOS is kept)
    logprobs: jax.Array  # [B*K, max_new_tokens] float32, 0 after the end
    lengths: jax.Array   # [B*K] int32, generated tokens including the EOS
    routes: jax.Array | None = None  # with return_routes: [B*K, P + max_new_tokens, n_moe_layers, k] int32 per slot


# ----------------------------------------------------------------------------------------
# Per-step token choice
# ----------------------------------------------------------------------------------------
def _filter_logits(logits_BV, top_k, top_p):
    """Top-k then top-p (nucleus) truncation; removed logits become -inf.

    top-k keeps the k largest logits (ties at the k-th value are all kept); top-p then keeps
    the smallest prefix of those, by decreasing probability, whose mass reaches top_p (a
    token is kept when the mass strictly before it is < top_p, so the best token always
    survives). Both are traced: one sort per step serves any k and p, and the whole filter is
    skipped at run time when top_k == 0 and top_p >= 1.
    """
    V = logits_BV.shape[-1]

    def truncate(x_BV):
        sorted_BV = jnp.sort(x_BV, axis=-1)[:, ::-1]
        k = jnp.where((top_k > 0) & (top_k < V), top_k, V)
        in_k_V = jnp.arange(V) < k
        probs_BV = jax.nn.softmax(jnp.where(in_k_V, sorted_BV, -jnp.inf), axis=-1)
        mass_before_BV = jnp.cumsum(probs_BV, axis=-1) - probs_BV
        keep_BV = in_k_V & ((mass_before_BV < top_p) | (top_p >= 1.0))
        n_keep_B = jnp.maximum(jnp.sum(keep_BV, axis=-1), 1)
        threshold_B1 = jnp.take_along_axis(sorted_BV, (n_keep_B - 1)[:, None], axis=-1)
        return jnp.where(x_BV < threshold_B1, -jnp.inf, x_BV)

    return jax.lax.cond((top_k > 0) | (top_p < 1.0), truncate, lambda x: x, logits_BV)


SAMPLE_BLOCK = 256  # tokens per block of the two-level draw in sample_rows


def sample_rows(keys_B, z_BV):
    """One token per row drawn from softmax(z_BV) (z may hold -inf), exactly, with V / 256 + 256 random numbers per
    row instead of V: first a block of SAMPLE_BLOCK consecutive ids by its probability mass (Gumbel-max over the
    log block masses), then a token inside that block (Gumbel-max over its logits). P(token) = P(block) x P(token |
    block) = softmax(z)[token]. Why: at a 49k-150k vocabulary a Gumbel draw over every logit (jax.random.categorical)
    costs more on CPU than the model's whole decode step (random bits and two logs per entry); the masses come from
    one exp pass."""
    B, V = z_BV.shape
    S = SAMPLE_BLOCK
    nb = -(-V // S)
    if nb * S != V:
        z_BV = jnp.pad(z_BV, ((0, 0), (0, nb * S - V)), constant_values=-jnp.inf)
    z_BNS = z_BV.reshape(B, nb, S)
    m_B11 = jnp.max(z_BNS, axis=(1, 2), keepdims=True)
    mass_BN = jnp.sum(jnp.exp(z_BNS - m_B11), axis=-1)
    g_BG = jax.vmap(lambda k: jax.random.gumbel(k, (nb + S,), jnp.float32))(keys_B)
    block_B = jnp.argmax(jnp.log(mass_BN) + g_BG[:, :nb], axis=-1)
    inner_BS = jnp.take_along_axis(z_BNS, block_B[:, None, None], axis=1)[:, 0]
    return (block_B * S + jnp.argmax(inner_BS + g_BG[:, nb:], axis=-1)).astype(jnp.int32)


def argmax_rows(x_BV):
    """jnp.argmax(x, axis=-1) (the first index of the maximum) as two plain reductions, a max and a min over the
    indices holding it: XLA's CPU argmax is one reduction over (value, index) pairs that does not vectorise and
    took longer than the model's decode step at a 49k vocabulary. A row of NaN (a diverged policy) matches no
    maximum: it gets the last id, never V, so whatever decodes it sees a valid token."""
    V = x_BV.shape[-1]
    hit_BV = x_BV == jnp.max(x_BV, axis=-1, keepdims=True)
    first_B = jnp.min(jnp.where(hit_BV, jnp.arange(V, dtype=jnp.int32), V), axis=-1)
    return jnp.minimum(first_B, V - 1).astype(jnp.int32)


def choose_tokens(logits_BV, keys_B, temperature, top_p, top_k):
    """One token per row and its logprob under softmax(logits / T).

    temperature: one for every row, or one per row [B]. A row at T == 0 takes the argmax (its logprob under T = 1);
    the others draw from the top-k / top-p truncated, renormalised softmax(logits / T) (sample_rows). Only the
    branches the rows ask for run (lax.cond on the traced temperatures), and the logprob is the chosen logit minus
    one logsumexp, so no [rows, vocab] log-softmax is written.
    """
    logits_BV = logits_BV.astype(jnp.float32)
    t_B = jnp.broadcast_to(jnp.asarray(temperature, jnp.float32), logits_BV.shape[:1])
    greedy_B = t_B <= 0.0
    scaled_BV = logits_BV / jnp.where(greedy_B, 1.0, t_B)[:, None]
    draw = lambda x: sample_rows(keys_B, _filter_logits(x, top_k, top_p))  # noqa: E731
    tokens_B = jax.lax.cond(
        jnp.all(greedy_B), argmax_rows,
        lambda x: jax.lax.cond(jnp.any(greedy_B), lambda y: jnp.where(greedy_B, argmax_rows(y), draw(y)), draw, x),
        scaled_BV)
    chosen_B = jnp.take_along_axis(scaled_BV, tokens_B[:, None], axis=-1)[:, 0]
    return tokens_B, chosen_B - jax.nn.logsumexp(scaled_BV, axis=-1)


# ----------------------------------------------------------------------------------------
# Prefill + decode loop (one jit)
# ----------------------------------------------------------------------------------------
def prefill(params, prompts_BP, mask_BP, n_slots, *, cfg, mesh, rules, return_routes=False):
    """LEFT-padded prompts [B, P] into a fresh KV cache of n_slots >= P slots (prompt in slots 0..P-1; real tokens
    keep the rotary positions they would have without padding). Returns (last_logits_B1V float32 of each prompt's
    last slot, kv_valid_BS bool [B, n_slots], aux of the forward with "cache" (and "routes")). Shared with
    models/tool_sampling.py."""
    B, P = prompts_BP.shape
    mask_BP = mask_BP.astype(bool)
    positions_BP = jnp.maximum(jnp.cumsum(mask_BP, axis=1, dtype=jnp.int32) - 1, 0)
    kv_valid_BS = jnp.concatenate([mask_BP, jnp.zeros((B, n_slots - P), bool)], axis=1)
    cache = transformer.init_cache(cfg, B, n_slots)
    # attn_mask keeps padding out of the experts and router statistics. Only the last prompt position's logits are
    # needed: [B, P, vocab] float32 logits would dominate memory at a 150k vocabulary.
    _, aux = transformer.forward(params, prompts_BP, cfg, positions=positions_BP, attn_mask=mask_BP, cache=cache,
                                 cache_index=jnp.int32(0), kv_valid=kv_valid_BS, return_logits=False, mesh=mesh,
                                 rules=rules, return_routes=return_routes)
    last_logits_B1V = transformer.logits_from_hidden(params, aux["hidden"][:, -1:], cfg, mesh=mesh, rules=rules)
    return last_logits_B1V, kv_valid_BS, aux


@partial(
    jax.jit,
    static_argnames=("cfg", "num_samples", "max_new_tokens", "mesh", "rules", "return_routes"),
)
def _generate(params, prompts_BP, mask_BP, key, temperature, top_p, top_k, eos_id, pad_id, *, cfg,
              num_samples, max_new_tokens, mesh, rules, return_routes=False):
    B, P = prompts_BP.shape
    K, N = num_samples, max_new_tokens
    R = B * K  # rows after repeating each prompt K times
    fwd = partial(transformer.forward, cfg=cfg, mesh=mesh, rules=rules, return_routes=return_routes)

    mask_BP = mask_BP.astype(bool)
    prompt_len_B = jnp.sum(mask_BP, axis=1, dtype=jnp.int32)
    last_logits_B1V, kv_valid_BL, aux = prefill(params, prompts_BP, mask_BP, P + N, cfg=cfg, mesh=mesh, rules=rules,
                                                return_routes=return_routes)
    # Routes per cache slot (-1 = none): the prompt's from the prefill, token t's from the step that feeds it back.
    routes_RLMK = None
    if return_routes:
        routes_RLMK = jnp.full((R, P + N, *aux["routes"].shape[2:]), -1, jnp.int32)
        prompt_routes = jnp.where(mask_BP[:, :, None, None], aux["routes"], -1)
        routes_RLMK = routes_RLMK.at[:, :P].set(jnp.repeat(prompt_routes, K, axis=0))

    # Decode runs unrolled over the per-layer view, sliced from the stacks once per call: a scan over the layers
    # would stack and unstack the whole KV cache per token, and slices taken inside the loop are taken per token
    # (SmolLM2, 32 rows: 345 decode tokens/s this way, 264 slicing per step). The prefill scans the stacks.
    params = transformer.decode_params(params, cfg)
    # K copies of each prompt's state: row b*K + k <- prompt b.
    cache = jax.tree.map(lambda c: jnp.repeat(c, K, axis=0), aux["cache"])  # per-layer arrays, batch first
    last_logits_RV = jnp.repeat(last_logits_B1V[:, 0], K, axis=0)
    kv_valid_RL = jnp.repeat(kv_valid_BL, K, axis=0)
    prompt_len_R = jnp.repeat(prompt_len_B, K, axis=0)

    row_keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(R))
    step_keys = lambda t: jax.vmap(jax.random.fold_in, in_axes=(0, None))(row_keys, t)

    tok_R, logp_R = choose_tokens(last_logits_RV, step_keys(0), temperature, top_p, top_k)
    tokens_RN = jnp.full((R, N), pad_id, jnp.int32).at[:, 0].set(tok_R)
    logprobs_RN = jnp.zeros((R, N), jnp.float32).at[:, 0].set(logp_R)
    lengths_R = jnp.ones((R,), jnp.int32)
    is_eos = lambda tok_R: jnp.any(tok_R[:, None] == eos_id[None, :], axis=-1)  # eos_id: [n_eos] ids
    done_R = is_eos(tok_R)

    def cond(carry):
        t, done_R = carry[0], carry[4]
        return (t < N) & ~jnp.all(done_R)

    def body(carry):
        t, cache, kv_valid_RL, prev_R, done_R, tokens_RN, logprobs_RN, lengths_R, routes_RLMK = carry
        slot = P + t - 1  # where the previous token goes
        kv_valid_RL = kv_valid_RL.at[:, slot].set(True)
        positions_R1 = (prompt_len_R + t - 1)[:, None]
        logits_R1V, aux = fwd(params, prev_R[:, None], positions=positions_R1, attn_mask=~done_R[:, None],
                              cache=cache, cache_index=slot, kv_valid=kv_valid_RL)
        tok_R, logp_R = choose_tokens(logits_R1V[:, 0], step_keys(t), temperature, top_p, top_k)
        tok_R = jnp.where(done_R, pad_id, tok_R)
        logp_R = jnp.where(done_R, 0.0, logp_R)
        tokens_RN = tokens_RN.at[:, t].set(tok_R)
        logprobs_RN = logprobs_RN.at[:, t].set(logp_R)
        lengths_R = lengths_R + (~done_R).astype(jnp.int32)
        if return_routes:  # the previous token's experts; none for a finished row (its token is an EOS or padding)
            step_routes = jnp.where(done_R[:, None, None], -1, aux["routes"][:, 0])
            routes_RLMK = routes_RLMK.at[:, slot].set(step_routes)
        done_R = done_R | is_eos(tok_R)
        return (t + 1, aux["cache"], kv_valid_RL, tok_R, done_R, tokens_RN, logprobs_RN, lengths_R, routes_RLMK)

    carry = (jnp.int32(1), cache, kv_valid_RL, tok_R, done_R, tokens_RN, logprobs_RN, lengths_R, routes_RLMK)
    carry = jax.lax.while_loop(cond, body, carry)
    return SampleOutput(tokens=carry[5], logprobs=carry[6], lengths=carry[7], routes=carry[8])


def _host_value(x):
    """x as a NumPy array when it is concrete and fully addressable here, else None (traced or
    multi-host sharded values are not validated on the host)."""
    try:
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return None
        return np.asarray(x)
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
        return None


def _check_scalar(name, value, low, high, low_open=False):
    """Raise ValueError naming `name` if a concrete scalar is outside its range."""
    v = _host_value(value)
    if v is None:
        return
    v = float(v)
    if not (low < v if low_open else low <= v) or v > high:
        bracket = "(" if low_open else "["
        raise ValueError(f"{name} must be in {bracket}{low}, {high}], got {value}")


def generate(params, cfg, prompts, key, *, prompt_mask=None, num_samples=1, max_new_tokens=64,
             temperature=1.0, top_p=1.0, top_k=0, eos_id=2, pad_id=0, mesh=None, rules=None, return_routes=False):
    """Sample `num_samples` continuations of each LEFT-padded prompt (see the module docstring).

    prompts [B, P] int32; prompt_mask [B, P] (1 = real token; None = no padding). Returns a
    SampleOutput(tokens [B*K, N], logprobs [B*K, N], lengths [B*K]); row b*K + k is sample k
    of prompt b. temperature 0 is greedy (one value, or one per row [B*K]); top_k 0 and top_p 1 disable those
    filters. eos_id: one id or a list
    (chat checkpoints stop at any of several, e.g. Qwen's <|im_end|> and <|endoftext|>); -1 never stops.
    mesh/rules are passed through to transformer.forward for sharded models.
    return_routes (MoE, for routing replay): also return `routes` [B*K, P + N, n_moe_layers, k], the experts every
    token used in every MoE block, by cache slot: slots < P the (left-padded) prompt, slot P + i generated token i;
    -1 for padding and for tokens never fed back (each row's last token).
    """
    prompts, prompt_mask, eos_ids = check_args(cfg, prompts, prompt_mask, num_samples, max_new_tokens, temperature,
                                               top_p, top_k, eos_id)
    return _generate(params, prompts, prompt_mask, key, jnp.asarray(temperature, jnp.float32),
                     jnp.asarray(top_p, jnp.float32), jnp.asarray(top_k, jnp.int32),
                     eos_ids, jnp.asarray(pad_id, jnp.int32), cfg=cfg,
                     num_samples=int(num_samples), max_new_tokens=int(max_new_tokens), mesh=mesh,
                     rules=rules, return_routes=bool(return_routes))


def check_args(cfg, prompts, prompt_mask, num_samples, max_new_tokens, temperature, top_p, top_k, eos_id):
    """generate's argument checks (ValueError naming the argument); returns (prompts int32, prompt_mask, eos ids
    [n_eos] int32). Shared with models/tool_sampling.py."""
    prompts = jnp.asarray(prompts, jnp.int32)
    if prompts.ndim != 2 or prompts.shape[1] < 1:
        raise ValueError(f"prompts must be [batch, prompt_len>=1], got shape {prompts.shape}")
    if prompt_mask is None:
        prompt_mask = jnp.ones_like(prompts)
    if tuple(np.shape(prompt_mask)) != tuple(prompts.shape):
        raise ValueError(f"prompt_mask shape {np.shape(prompt_mask)} != prompts shape {prompts.shape}")
    m = _host_value(prompt_mask)
    if m is not None:
        m = m.astype(bool)
        if not m.any(axis=1).all():
            raise ValueError("prompt_mask: every prompt needs at least one real token")
        if not (m[:, 1:] >= m[:, :-1]).all():
            raise ValueError("prompt_mask: prompts must be LEFT-padded (no padding after a real token)")
    if int(num_samples) < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    if int(max_new_tokens) < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    _check_scalar("top_k (0 = off)", top_k, 0, float("inf"))
    if prompts.shape[1] + int(max_new_tokens) > cfg.max_seq_len:
        raise ValueError(
            f"max_new_tokens: prompt length {prompts.shape[1]} + max_new_tokens {max_new_tokens} "
            f"exceeds cfg.max_seq_len {cfg.max_seq_len}")
    t = _host_value(temperature)
    if t is not None and (np.ndim(t) > 1 or (np.ndim(t) == 1 and len(t) != prompts.shape[0] * int(num_samples))):
        raise ValueError(f"temperature must be one value or one per row ({prompts.shape[0] * int(num_samples)}), "
                         f"got shape {np.shape(t)}")
    if t is not None and (np.any(~np.isfinite(t)) or np.any(np.asarray(t) < 0)):
        raise ValueError(f"temperature must be in [0, inf), got {temperature}")
    _check_scalar("top_p", top_p, 0.0, 1.0, low_open=True)
    eos_ids = jnp.atleast_1d(jnp.asarray(eos_id, jnp.int32))
    if eos_ids.ndim != 1 or eos_ids.shape[0] < 1:
        raise ValueError(f"eos_id must be an id or a non-empty list of ids, got {eos_id!r}")
    return prompts, jnp.asarray(prompt_mask), eos_ids
